"""Fuzzed model files (reliability suite; see conftest.py): a real artefact (two DistillSpec steps on the tiny pair)
with its manifest mutated (fields dropped, mistyped, renamed, unknown; the file truncated or garbled) or its weights
damaged, given to ``draftsmith eval --artefact``, ``export`` and ``tune``; and a tiny GGUF file truncated or garbled,
given to ``eval --target`` and ``data generate --target``. Every outcome is exit 2 with one ``error:`` line, or an
accepted file; the evaluation and the generation themselves are stubbed away."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from draftsmith_reliability_harness import junk  # noqa: F401 - conftest.py loaded it
from hypothesis import given
from hypothesis import strategies as st

KINDS = ("draft_model", "heads", "lora_adapter", "adapted_target", "embeddings", "none", "", "model")
METHOD_NAMES = ("distillspec", "medusa", "eagle", "dflash", "bita", "layerskip", "cllm", "draft-verify", "ar", "nope", "")


def paths_of(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from paths_of(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from paths_of(v, (*prefix, i))


def edit(tree, path, action, value):
    if not path:
        return value if action == "replace" else tree
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    if action == "delete":
        del parent[path[-1]]
    elif action == "add" and isinstance(parent[path[-1]], dict):
        parent[path[-1]]["unknown_" + str(len(parent[path[-1]]))] = value
    else:
        parent[path[-1]] = value
    return tree


SEMANTIC = {("format",): st.sampled_from(["draftsmith-artefact/2", "draftsmith-artefact/0", "", "DRAFTSMITH-ARTEFACT/1"]),
            ("method",): st.sampled_from(METHOD_NAMES), ("kind",): st.sampled_from(KINDS),
            ("target", "name_or_path"): st.sampled_from(["/nonexistent/target", "smollm2-135m", "", "tiny"]),
            ("target", "vocab_size"): st.sampled_from([0, -1, 127, 129, 10**12, "128"]),
            ("target", "config_sha256"): st.sampled_from(["", "0" * 64, None]),
            ("proposer", "draft_length"): st.sampled_from([0, -1, 1.5, "3", 10**9, None]),
            ("proposer", "model_dir"): st.sampled_from(["", "../draft", "/tmp", "missing", "draft/model.safetensors"])}


@st.composite
def manifests(draw, manifest: dict) -> tuple[dict | None, bytes | None, str]:
    """``(manifest, raw bytes or None, weights damage)``: a manifest with 1-3 edits or a file gone wrong, and what
    happens to the weight file (nothing, garbled, truncated; with or without its digest updated)."""
    tree = json.loads(json.dumps(manifest))
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            path, strategy = draw(st.sampled_from(sorted(SEMANTIC.items())))
            tree = edit(tree, path, "replace", draw(strategy)) if _has(tree, path[:-1]) else tree
        else:
            path = draw(st.sampled_from(list(paths_of(tree))))
            tree = edit(tree, path, draw(st.sampled_from(["delete", "replace", "add"])) if path else "replace",
                        draw(junk()))
    raw = None
    shape = draw(st.sampled_from(["edited"] * 6 + ["truncated", "garbled", "empty", "not utf-8", "deep"]))
    text = json.dumps(tree, indent=1).encode()
    if shape == "truncated":
        raw = text[: draw(st.integers(0, len(text) - 1))]
    elif shape == "garbled":
        at = draw(st.integers(0, len(text) - 1))
        raw = text[:at] + draw(st.binary(min_size=1, max_size=4)) + text[at + 1:]
    elif shape == "empty":
        raw = b""
    elif shape == "not utf-8":
        raw = b"\xff\xfe" + text
    elif shape == "deep":
        raw = b"[" * 100_000 + b"]" * 100_000
    damage = draw(st.sampled_from(["none"] * 5 + ["garbled", "truncated", "garbled+digest", "truncated+digest",
                                                   "pickle", "config"]))
    return tree, raw, damage


def _has(tree, path) -> bool:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return isinstance(tree, dict)


def damage_weights(artefact: Path, tree, damage: str) -> None:
    weights = artefact / "draft" / "model.safetensors"
    if damage == "none":
        return
    if damage == "pickle":
        (artefact / "draft" / "pytorch_model.bin").write_bytes(b"\x80\x04N.")
        return
    if damage == "config":
        (artefact / "draft" / "config.json").write_text('{"model_type": "llama", "hidden_size": "x"}')
        return
    data = weights.read_bytes()
    weights.unlink()  # a hard link to the shared artefact: write a new file instead
    data = data[: len(data) // 3] if damage.startswith("truncated") else data[:40] + b"\x00garbage\xff" + data[52:]
    weights.write_bytes(data)
    if damage.endswith("+digest") and isinstance(tree, dict) and isinstance(tree.get("weights"), dict):
        tree["weights"]["draft/model.safetensors"] = hashlib.sha256(data).hexdigest()


def copy_artefact(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest, copy_function=os.link)
    (dest / "manifest.json").unlink()
    return dest


def artefact_argv(command: str, artefact: Path, out: Path, fmt: str) -> list:
    if command == "eval":
        return ["eval", "--artefact", artefact, "--limit", "1", "--max-new-tokens", "2", "--warmup", "0", "--out",
                out / "report.json", "--no-progress"]
    if command == "export":
        return ["export", "--artefact", artefact, "--format", fmt, "--out", out / "export"]
    return ["tune", "--artefact", artefact, "--prompts", "1", "--max-new-tokens", "2", "--max-length", "2",
            "--measure-top", "0"]


@pytest.mark.fuzz(30, 250)
def test_artefact_manifests_and_weights(harness, artefact, examples):
    from draftsmith.common.registry import export_formats
    from draftsmith.inference.evaluation.evaluator import evaluate

    manifest = json.loads((artefact / "manifest.json").read_text())
    commands = ["eval", "eval", "export"] + (["tune"] if examples > 100 else [])

    @given(case_spec=manifests(manifest), command=st.sampled_from(commands),
           fmt=st.sampled_from(sorted(export_formats())))
    def one(case_spec, command, fmt):
        tree, raw, damage = case_spec
        case = harness.fresh("artefact")
        copy = copy_artefact(artefact, case / "artefact")
        damage_weights(copy, tree, damage)
        data = raw if raw is not None else json.dumps(tree, indent=1).encode()
        (copy / "manifest.json").write_bytes(data)
        argv = artefact_argv(command, copy, case / "out", fmt)
        line = harness.command_line(argv).replace(f"{case}/", "")
        repro = (f"cp -r $ARTEFACT artefact && {harness.file_recipe(Path('artefact/manifest.json'), data, 300)}"
                 f"{'' if damage == 'none' else f' && (damage the weights: {damage})'} && {line}"
                 "   # $ARTEFACT: 2 distillspec steps on tests/common/tiny_pair.py")
        harness.check("artefact", harness.cli(argv), case / "out", repro)
        rewritten = (copy / "manifest.json").exists() and (copy / "manifest.json").read_bytes() != data
        leftovers = harness.half_written(copy, parse=rewritten)
        harness.report("artefact", [("half-written file", f"artefact/{d}") for d in leftovers], repro)

    with harness.swapped(evaluate, harness.accept):
        harness.explore(one, examples)


# ------------------------------------------------------------------------------------------------------- GGUF

GGUF_FIELDS = {"magic": (0, "<4s"), "version": (4, "<I"), "tensor_count": (8, "<Q"), "kv_count": (16, "<Q")}


@st.composite
def gguf_damage(draw, size: int) -> list[tuple]:
    """1-3 cuts: truncate (mostly in the header), overwrite a header field, or garble bytes."""
    cuts = []
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["truncate", "field", "garble", "garble"]))
        if how == "truncate":
            cuts.append(("truncate", draw(st.one_of(st.integers(0, 4096), st.integers(0, size - 1)))))
        elif how == "field":
            name = draw(st.sampled_from(sorted(GGUF_FIELDS)))
            value = (draw(st.sampled_from([b"GGUF", b"GGML", b"\x00\x00\x00\x00", b"FUGG"])) if name == "magic" else
                     draw(st.sampled_from([0, 1, 2, 3, 4, 2**31, 2**32 - 1] + ([2**40, 2**63, 2**64 - 1]
                                                                              if name != "version" else []))))
            cuts.append(("field", name, value))
        else:
            cuts.append(("garble", draw(st.one_of(st.integers(24, 4096), st.integers(0, size - 1))),
                         draw(st.binary(min_size=1, max_size=8))))
    return cuts


def damaged_gguf(data: bytes, cuts: list[tuple]) -> bytes:
    for cut in cuts:
        if cut[0] == "truncate":
            data = data[: cut[1]]
        elif cut[0] == "field":
            offset, fmt = GGUF_FIELDS[cut[1]]
            if len(data) >= offset + struct.calcsize(fmt):
                data = data[:offset] + struct.pack(fmt, cut[2]) + data[offset + struct.calcsize(fmt):]
        else:
            _, at, junk_bytes = cut
            data = data[:at] + junk_bytes + data[at + len(junk_bytes):]
    return data


@pytest.mark.fuzz(20, 150)
def test_gguf_files(harness, pair, gguf_file, examples):
    from draftsmith.data import self_distill
    from draftsmith.inference.evaluation.evaluator import evaluate

    source = gguf_file.read_bytes()

    @given(cuts=gguf_damage(len(source)), command=st.sampled_from(["eval", "data generate"]))
    def one(cuts, command):
        case = harness.fresh("gguf")
        model = case / "model.gguf"
        model.write_bytes(damaged_gguf(source, cuts))
        out = case / "out"
        argv = (["eval", "--target", model, "--method", "ar", "--limit", "1", "--max-new-tokens", "2", "--out",
                 out / "report.json", "--no-progress", "--warmup", "0"] if command == "eval" else
                ["data", "generate", "--target", model, "--prompts", pair["dataset"], "--out", out / "answers.jsonl",
                 "--limit", "1", "--max-new-tokens", "2", "--no-progress"])
        line = harness.command_line(argv).replace(f"{case}/", "").replace(str(pair["target"].parent), "$PAIR")
        repro = f"python -c 'gguf_fixture.write_tiny_gguf(\"model.gguf\")' && damage model.gguf {cuts} && {line}"
        harness.check("gguf", harness.cli(argv), out, repro)

    with harness.swapped(evaluate, harness.accept), harness.swapped(self_distill.generate_answers, harness.accept):
        harness.explore(one, examples)
