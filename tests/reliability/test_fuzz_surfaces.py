"""Fuzzed inputs of the newer surfaces (reliability suite; see conftest.py):

- **feature caches**: a real cache (EAGLE-1's, offline, on the tiny pair) with shards deleted, truncated or garbled,
  its manifest edited, truncated or removed, its shard sums damaged; then the recipe that reads it. A run that
  succeeds must have trained on a cache that verifies whole and holds the original features (rebuilt or untouched);
- **engine interpreters**: scripts that print garbage, nothing, JSON of every shape or the right versions, exit with
  any code, lack the exec bit or the shebang, or are no file at all, given to ``engine check``, ``eval --engine`` and
  ``data generate --engine``;
- **memory plans**: the pair's config.json edited at random, and ``draftsmith memory``'s arguments;
- **export directories**: whatever is at ``--out`` (nothing, an empty or user's directory, an earlier export of this
  or another format, damaged records, a file, a link), with and without ``--overwrite``. A file the user put there
  is never changed or deleted, and a refused export changes nothing.

Every outcome is exit 2 with one ``error:`` line, or a correct success."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from draftsmith_reliability_harness import junk
from hypothesis import given
from hypothesis import strategies as st

# ------------------------------------------------------------------------------------------ feature caches


def eagle_cache_argv(harness, pair, out: Path, cache: Path) -> list:
    return ["train", "eagle", *harness.recipe_argv(pair, out, "eagle"), "max_steps=1", "save_steps=1",
            "eval_strategy=no", "report_to=none", "evaluate=false", "tune=false", "calibrate_tree=false",
            "features=offline", "data_mode=fixed", f"feature_cache_dir={cache}", "feature_cache_dtype=bfloat16"]


@pytest.fixture(scope="module")
def feature_cache(harness, pair) -> Path:
    """The cache root a one-step EAGLE-1 run builds (a cache of the training rows and one of the held-out rows)."""
    case = harness.fresh("cache-source")
    outcome = harness.cli(eagle_cache_argv(harness, pair, case / "out", case / "cache"))
    assert outcome.code == 0, outcome.stderr[-2000:]
    return case / "cache"


def cache_contents(root: Path) -> dict[str, str]:
    """Every shard's sha256 by ``<cache>/<shard>``, as the manifests record them."""
    out = {}
    for manifest in sorted(root.glob("*/manifest.json")):
        out.update({f"{manifest.parent.name}/{s['file']}": s["sha256"]
                    for s in json.loads(manifest.read_text())["shards"]})
    return out


@st.composite
def cache_damage(draw, shards: list[str]) -> list[tuple]:
    """1-3 damages: a shard deleted, truncated or garbled; the manifest edited (a field replaced by junk, its rows or
    layers changed), truncated, emptied or deleted; a shard's sum deleted or garbled."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["delete", "truncate", "garble", "manifest field", "manifest text", "sum"]))
        shard = draw(st.sampled_from(shards))
        if kind == "truncate":
            out.append((kind, shard, draw(st.integers(0, 4096))))
        elif kind == "garble":
            out.append((kind, shard, draw(st.integers(0, 10**6)), draw(st.binary(min_size=1, max_size=4))))
        elif kind == "manifest field":
            out.append((kind, shard, draw(st.sampled_from(["rows", "layers", "dtype", "shards", "complete", "format", "key",
                                                    "manifest_sha256", "tokens"])), draw(junk())))
        elif kind == "manifest text":
            out.append((kind, shard, draw(st.sampled_from(["truncate", "empty", "delete", "not json"]))))
        else:
            out.append((kind, shard, draw(st.sampled_from(["delete", "junk"]))))
    return out


def damage_cache(root: Path, cuts: list[tuple]) -> None:
    """``cuts`` of :func:`cache_damage` on the caches under ``root`` (a manifest damage hits its shard's cache)."""
    for cut in cuts:
        kind, manifest = cut[0], (root / cut[1]).parent / "manifest.json"
        if kind in ("delete", "truncate", "garble"):
            path = root / cut[1]
            data = path.read_bytes() if path.exists() else b""
            if not data:
                continue
            if kind == "delete":
                path.unlink()
            elif kind == "truncate":
                path.write_bytes(data[: min(cut[2], len(data) - 1)])
            else:
                at = cut[2] % len(data)
                path.write_bytes(data[:at] + bytes(b ^ 0x5A for b in cut[3]) + data[at + len(cut[3]):])
        elif kind == "manifest field" and manifest.exists():
            try:
                tree = json.loads(manifest.read_text())
                tree[cut[2]] = cut[3]
                manifest.write_text(json.dumps(tree))
            except (ValueError, TypeError):
                continue
        elif kind == "manifest text" and manifest.exists():
            text = manifest.read_bytes()
            if cut[2] == "delete":
                manifest.unlink()
            else:
                manifest.write_bytes({"truncate": text[: len(text) // 2], "empty": b"", "not json": b"\xff{"}[cut[2]])
        elif kind == "sum":
            path = root / cut[1].replace(".safetensors", ".sha256")
            if path.exists():
                path.unlink() if cut[2] == "delete" else path.write_text('{"sha256": "0", "bytes": 1}')


@pytest.mark.fuzz(4, 80)
def test_feature_caches(harness, pair, feature_cache, examples):
    from draftsmith.data.feature_cache import FeatureDataset

    pristine = cache_contents(feature_cache)

    @given(cuts=cache_damage(sorted(pristine)))
    def one(cuts):
        case = harness.fresh("cache")
        cache = case / "cache"
        shutil.copytree(feature_cache, cache)
        damage_cache(cache, cuts)
        argv = eagle_cache_argv(harness, pair, case / "out", cache)
        repro = (f"(copy $CACHE, then damage it: {cuts}) && "
                 + harness.command_line(argv).replace(str(pair["target"].parent), "$PAIR").replace(str(case), "."))
        outcome = harness.cli(argv)
        found = harness.check("feature cache", outcome, case / "out", repro)
        if outcome.code == 0 and not found:  # trained: on the original features, from a cache that verifies whole
            try:
                for directory in {(cache / name).parent for name in pristine}:
                    data = FeatureDataset(directory)
                    for i in range(len(data)):
                        data[i]
                same = cache_contents(cache) == pristine
            except Exception as err:  # noqa: BLE001 - any failure here is the finding
                same = f"{type(err).__name__}: {err}"
            if same is not True:
                harness.report("feature cache", [("trained on a damaged cache", str(same)[:300])], repro, outcome)

    harness.explore(one, examples)


# ------------------------------------------------------------------------------------- engine interpreters

VERSIONS = {"vllm": "0.32.0", "torch": "2.9.0", "transformers": "5.1.0", "python": "3.11.9"}


@st.composite
def interpreters(draw) -> dict:
    """A script standing in for the engine's python: what it prints, its exit code, its shebang and mode."""
    printed = draw(st.one_of(
        st.sampled_from(["", "hello there", "[1, 2]", "{}", "null", "\x00\xff", json.dumps(VERSIONS),
                         json.dumps(VERSIONS | {"vllm": "0.31.0"}), json.dumps(VERSIONS | {"vllm": ""}),
                         json.dumps(VERSIONS)[:20], "x" * 5000]),
        junk().map(json.dumps), st.dictionaries(st.sampled_from(sorted(VERSIONS)), junk()).map(json.dumps)))
    return {"printed": printed, "stderr": draw(st.sampled_from(["", "Traceback (most recent call last):\nBoom",
                                                                "ModuleNotFoundError: No module named 'vllm'"])),
            "code": draw(st.sampled_from([0, 0, 0, 1, 2, 137])),
            "shebang": draw(st.sampled_from(["#!/bin/sh\n", "#!/bin/sh\n", "", "#!/nonexistent/python\n"])),
            "mode": draw(st.sampled_from([0o755, 0o755, 0o644, 0o000])),
            "shape": draw(st.sampled_from(["file", "file", "file", "directory", "missing", "relative"]))}


def write_interpreter(case: Path, spec: dict) -> str:
    path = case / "bin" / "python"
    path.parent.mkdir()
    if spec["shape"] == "directory":
        path.mkdir()
        return str(path)
    if spec["shape"] == "missing":
        return str(path)
    quoted = spec["printed"].replace("'", "'\\''")
    err = spec["stderr"].replace("'", "'\\''")
    path.write_text(f"{spec['shebang']}printf '%s' '{quoted}'\nprintf '%s' '{err}' >&2\nexit {spec['code']}\n",
                    errors="surrogateescape")
    path.chmod(spec["mode"])
    return os.path.relpath(path) if spec["shape"] == "relative" else str(path)


@pytest.mark.fuzz(30, 300)
def test_engine_interpreters(harness, pair, examples):
    from draftsmith.inference.evaluation.evaluator import evaluate

    @given(spec=interpreters(), command=st.sampled_from(["engine check"] * 4 + ["eval", "data generate"]))
    def one(spec, command):
        case = harness.fresh("interpreter")
        python = write_interpreter(case, spec)
        out = case / "out"
        argv = {"engine check": ["engine", "check", "--engine-python", python],
                "eval": ["eval", "--target", pair["target"], "--method", "ar", "--engine", "vllm", "--engine-python",
                         python, "--limit", "1", "--max-new-tokens", "2", "--out", out / "report.json", "--no-progress"],
                "data generate": ["data", "generate", "--target", pair["target"], "--prompts", pair["dataset"],
                                  "--engine", "vllm", "--engine-python", python, "--limit", "1", "--max-new-tokens",
                                  "2", "--out", out / "answers.jsonl", "--no-progress"]}[command]
        repro = f"(bin/python: {spec}) && " + harness.command_line(argv).replace(str(case), ".").replace(
            str(pair["target"].parent), "$PAIR")
        harness.check("engine interpreter", harness.cli(argv), out, repro)

    with harness.swapped(evaluate, harness.accept):
        harness.explore(one, examples)


# -------------------------------------------------------------------------------------------- memory plans

CONFIG_FIELDS = ("model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
                 "intermediate_size", "vocab_size", "tie_word_embeddings", "head_dim")


@pytest.mark.fuzz(40, 400)
def test_memory_plans(harness, pair, examples):
    config = json.loads((pair["target"] / "config.json").read_text())
    semantic = st.sampled_from([0, -1, 1, 3, 7, 10**9, 2.5, "64", None, "llama", "qwen3", "nope", True])

    @given(edits=st.lists(st.tuples(st.sampled_from(CONFIG_FIELDS), st.one_of(semantic, junk())), max_size=3),
           shape=st.sampled_from(["edited"] * 5 + ["list", "empty", "garbled", "directory"]),
           layers=st.sampled_from([None, "2", "0", "-3", "x", "1e9"]),
           modes=st.sampled_from([None, "ddp", "", ",", "zero9", "ddp,zero3", "fsdp2,fsdp2"]),
           method=st.sampled_from([None, "all", "eagle3", "nope", ""]),
           counts=st.tuples(st.sampled_from([None, "8", "0", "-1"]), st.sampled_from([None, "4096", "0", "-5"])))
    def one(edits, shape, layers, modes, method, counts):
        case = harness.fresh("memory")
        tree = dict(config)
        for key, value in edits:
            tree[key] = value
        text = {"list": "[1, 2]", "empty": "", "garbled": json.dumps(tree)[:-7]}.get(shape, json.dumps(tree))
        target = case / "model"
        target.mkdir()
        (target / "config.json").write_text(text)
        argv = ["memory", "--target", target if shape == "directory" else target / "config.json"]
        for flag, value in (("--draft-layers", layers), ("--modes", modes), ("--method", method),
                            ("--gpus", counts[0]), ("--tokens", counts[1])):
            argv += [flag, value] if value is not None else []
        repro = f"{harness.file_recipe(Path('model/config.json'), text.encode(), 300)} && " + \
            harness.command_line(argv).replace(str(case), ".")
        harness.check("memory", harness.cli(argv), None, repro)

    harness.explore(one, examples)


# ---------------------------------------------------------------------------------------- export directories


@pytest.fixture(scope="module")
def medusa_artefact(harness, pair) -> Path:
    from draftsmith.launch.recipe import run_recipe

    out = harness.fresh("medusa-artefact") / "out"
    argv = harness.recipe_argv(pair, out, "medusa") + ["max_steps=2", "save_steps=2", "eval_strategy=no",
                                                       "report_to=none", "evaluate=false", "calibrate_tree=false"]
    return run_recipe("medusa", argv, None).artefact


USER_FILES = {"notes.txt": b"precious\n", "config.json": b'{"mine": 1}', "model.safetensors": b"my weights",
              "sub/deep.bin": b"\x00\x01"}


def lay_out(out: Path, state: str, record: str, user: list[str], export_of) -> dict[str, bytes]:
    """Put ``state`` at ``out`` (its export record per ``record``, plus the user's files ``user``); returns every file
    that was there (relative name -> bytes)."""
    if state == "file":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"a file")
        return {}
    if state == "link":
        elsewhere = out.parent / "elsewhere"
        elsewhere.mkdir(parents=True)
        (elsewhere / "notes.txt").write_bytes(b"precious\n")
        out.symlink_to(elsewhere)
        return {}
    if state == "missing":
        return {}
    out.mkdir(parents=True)
    if state == "export":
        export_of(out)
        path = out / "draftsmith-export.json"
        if record == "other format":
            path.write_text(json.dumps(json.loads(path.read_text()) | {"export_format": "vllm-eagle"}))
        elif record == "garbled":
            path.write_bytes(path.read_bytes()[:10])
        elif record == "deleted":
            path.unlink()
    for name in user:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(USER_FILES[name])
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.mark.fuzz(10, 150)
def test_export_directories(harness, medusa_artefact, examples):
    from draftsmith.launch.cli import main

    def export_of(out: Path) -> None:
        assert main(["export", "--artefact", str(medusa_artefact), "--format", "vllm-medusa", "--out", str(out),
                     "--overwrite"]) == 0

    @given(state=st.sampled_from(["missing", "empty", "export", "export", "user", "file", "link"]),
           record=st.sampled_from(["same", "same", "other format", "garbled", "deleted"]),
           user=st.lists(st.sampled_from(sorted(USER_FILES)), unique=True, max_size=2),
           overwrite=st.booleans(), nested=st.booleans())
    def one(state, record, user, overwrite, nested):
        case = harness.fresh("export")
        out = case / "a" / "b" / "export" if nested else case / "export"
        before = lay_out(out, state, record, user if state in ("user", "export") else [], export_of)
        mine = {n: b for n, b in before.items() if not (state == "export" and record == "same" and n in
                                                         ("model.safetensors", "config.json", "draftsmith-export.json")
                                                         and n not in user)}
        argv = ["export", "--artefact", medusa_artefact, "--format", "vllm-medusa", "--out", out,
                *(["--overwrite"] if overwrite else [])]
        repro = f"(--out: {state}, record {record}, user files {user}) && " + harness.command_line(argv).replace(
            str(case), ".").replace(str(medusa_artefact), "$MEDUSA_ARTEFACT")
        outcome = harness.cli(argv)
        found = harness.check("export directory", outcome, None, repro)
        after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} \
            if out.is_dir() and not out.is_symlink() else {}
        lost = [n for n, b in mine.items() if after.get(n) != b]
        if outcome.code != 0 and out.is_dir() and not out.is_symlink() and after != before:
            found.append(("refused export changed --out", f"{sorted(before)} -> {sorted(after)}"))
        if lost:
            found.append(("a user's file changed or deleted", ", ".join(lost)))
        if outcome.code == 0 and not (out / "draftsmith-export.json").is_file():
            found.append(("export reported success without its record", str(out)))
        if state == "link" and (out.parent / "elsewhere" / "notes.txt").read_bytes() != b"precious\n":
            found.append(("a user's file changed or deleted", "elsewhere/notes.txt (behind the link)"))
        harness.report("export directory", found, repro, outcome)

    harness.explore(one, examples)
