"""Building the built-in model zoo (what it holds and where: :mod:`draftsmith.data.zoo`).

``build_zoo("tiny")`` trains, deterministically from ``spec.seed``, three stages into
``$DRAFTSMITH_HOME/zoo/<size>/`` (:func:`draftsmith.common.paths.zoo_dir`):

- ``tokenizer/`` byte-level BPE with a chat template, trained on the train split of the shipped corpus;
- ``target/`` and ``draft/`` models of the spec's family (Llama unless ``spec.family``), each trained independently from scratch on the train split
  (chat-formatted, packed into fixed-length sequences) with the loop of :mod:`draftsmith.trainers.pretrain`, and
  scored on the held-out split;

then writes ``manifest.json``. Token budgets, not minutes, set how long each model trains, so the bigger target
ends with the lower held-out loss.

Work is resumable: every ``spec.checkpoint_every`` steps the model, optimizer and step (the data position
follows from the step) are written atomically under ``.build/``; a finished stage (its directory published and
its record in ``.build/<stage>.json``) is skipped on rerun; the build directory is locked while a build runs.
CPU threads are the cores idle when the build starts unless ``threads`` / ``--threads`` /
``$DRAFTSMITH_THREADS`` say otherwise (:func:`draftsmith.common.threads.choose_threads`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from draftsmith.common import __version__
from draftsmith.common.errors import ConfigError
from draftsmith.common.io import atomic_write_text, environment, read_json, sha256_file, umask_modes
from draftsmith.common.paths import draftsmith_home, zoo_dir, zoo_path
from draftsmith.common.threads import choose_threads, torch_threads
from draftsmith.data.corpus import corpus_sha256
from draftsmith.data.zoo import (
    MANIFEST_FORMAT,
    MODEL_ROLES,
    STAGES,
    ZooRows,
    ZooSpec,
    frequent_tokens,
    param_count,
    train_zoo_tokenizer,
    zoo_examples,
    zoo_model_config,
    zoo_rows,
    zoo_spec,
)
from draftsmith.trainers.draft_layers import draft_from_target
from draftsmith.trainers.pretrain import StepHook, heldout_loss, train_model

# ------------------------------------------------------------------------------------ directories and records


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` (a sibling ``.lock`` file) so two builds never interleave."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock_path = directory.with_name(f".{directory.name}.lock")
    with open(lock_path, "w") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX: no locking
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written directory (or a symlink) into place, replacing an older one."""
    if final.is_symlink():
        final.unlink()
    elif final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def fingerprint(spec: ZooSpec, corpus_hash: str) -> dict:
    """What a build depends on: equal fingerprints give identical zoos."""
    return {"spec": asdict(spec), "corpus_sha256": corpus_hash}


def manifest_fingerprint(manifest: dict) -> dict:
    """The fingerprint of the build that wrote ``manifest``."""
    return fingerprint(ZooSpec(**manifest["spec"]), manifest["corpus_sha256"])


def stage_record(out: Path, stage: str) -> dict | None:
    """The record of a finished ``stage`` (None while it is not finished)."""
    record = read_json(out / ".build" / f"{stage}.json")
    return record if record is not None and (out / stage).is_dir() else None


def write_stage_record(out: Path, stage: str, record: dict) -> None:
    atomic_write_text(out / ".build" / f"{stage}.json", json.dumps(record, indent=1))


def start_over(out: Path) -> None:
    """Remove every stage, the build directory and the manifest of the zoo at ``out``."""
    for name in (*STAGES, ".build", "manifest.json"):
        target = out / name
        if target.is_symlink():  # an imported target is linked, never removed through the link
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


# ------------------------------------------------------------------------------------------------- stages


def build_tokenizer_stage(out: Path, spec: ZooSpec, train: list[dict]) -> dict:
    """Train the tokenizer, publish it to ``out/tokenizer`` and return its record."""
    started = time.perf_counter()
    record = _publish_tokenizer(out, train_zoo_tokenizer(spec, train))
    return {**record, "train_seconds": round(time.perf_counter() - started, 3)}


def _publish_tokenizer(out: Path, tokenizer) -> dict:
    """Save ``tokenizer`` to ``out/tokenizer`` atomically (a temporary directory, then published) and return the
    record's path, size and hash."""
    tmp = out / ".build" / "tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    publish_dir(tmp, out / "tokenizer")
    return {"path": "tokenizer", "vocab_size": len(tokenizer),
            "sha256": sha256_file(out / "tokenizer" / "tokenizer.json")}


def imported_tokenizer_stage(out: Path, spec: ZooSpec, home: Path) -> dict:
    """The tokenizer stage of a zoo around a real target: import the target into ``home`` (first use) and copy its
    tokenizer (chat template included) to ``out/tokenizer``."""
    from draftsmith.common.models import load_tokenizer
    from draftsmith.data.model_import import ensure_imported

    started = time.perf_counter()
    source = ensure_imported(spec.target_import, home)
    record = _publish_tokenizer(out, load_tokenizer(source))
    return {**record, "source": spec.target_import, "train_seconds": round(time.perf_counter() - started, 3)}


def imported_target_stage(out: Path, spec: ZooSpec, rows: ZooRows, device: str, home: Path) -> dict:
    """The target stage of a zoo around a real target: ``out/target`` links to the imported model directory
    (``$DRAFTSMITH_HOME/models/...``); the record holds its held-out loss on the corpus."""
    from draftsmith.common.models import load_model
    from draftsmith.data.model_import import ensure_imported

    started = time.perf_counter()
    source = ensure_imported(spec.target_import, home)
    link = out / ".build" / "target.link"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(os.path.relpath(source, out), link, target_is_directory=True)
    publish_dir(link, out / "target")
    model = load_model(out / "target", "float32", device, what="imported target")
    loss, n_scored = heldout_loss(model, rows.heldout, rows.n_heldout, spec.eval_batch_size, device)
    return {
        "path": "target",
        "imported": spec.target_import,
        "source_dir": str(source),
        "config": model.config.to_diff_dict(),
        "parameters": param_count(model),
        "tokens_seen": 0,
        "train_seconds": 0.0,
        "tokens_per_second": 0.0,
        "heldout_loss": round(loss, 4),
        "heldout_tokens": n_scored,
        "weights_sha256": read_json(source / "manifest.json")["weights_sha256"],
        "stage_seconds": round(time.perf_counter() - started, 3),
    }


def model_seed(spec: ZooSpec, role: str) -> int:
    """Seed of ``role``'s initialisation and data order (target and draft are independent)."""
    return spec.seed * 1000 + MODEL_ROLES.index(role) + 1


def build_model_stage(
    out: Path,
    spec: ZooSpec,
    role: str,
    rows: ZooRows,
    device: str,
    on_step: StepHook | None,
    progress: bool,
) -> dict:
    """Train (or finish training) ``role``, score it on the held-out rows, publish it to ``out/<role>`` and
    return its record."""
    started = time.perf_counter()
    seed = model_seed(spec, role)
    torch.manual_seed(seed)
    if spec.model(role).init_from_target:
        from draftsmith.common.models import load_model

        model = draft_from_target(load_model(out / "target", "float32", what="zoo target"), spec.model(role)).to(device)
    else:
        model = transformers.AutoModelForCausalLM.from_config(zoo_model_config(spec, role)).to(device)
    config = model.config
    checkpoint = out / ".build" / f"{role}.ckpt.pt"
    stats = train_model(model, rows.train, spec.model(role), spec, role, seed, checkpoint, device, on_step, progress)
    loss, n_scored = heldout_loss(model, rows.heldout, rows.n_heldout, spec.eval_batch_size, device)
    vocab_record = {}
    if spec.model(role).draft_vocab:
        special = transformers.AutoTokenizer.from_pretrained(out / "tokenizer").all_special_ids
        ids, coverage = frequent_tokens(rows.train, model.config.vocab_size, spec.model(role).draft_vocab, special)
        model.config.draft_vocab = ids  # read by the draft proposer (draftsmith.inference.proposers.draft_model)
        vocab_record = {"draft_vocab": len(ids), "draft_vocab_coverage": round(coverage, 4)}
    tmp = out / ".build" / f"{role}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.to("cpu").save_pretrained(tmp, safe_serialization=True)
    umask_modes(tmp)
    publish_dir(tmp, out / role)
    checkpoint.unlink(missing_ok=True)
    return {
        "path": role,
        "config": {k: v for k, v in config.to_diff_dict().items() if k != "draft_vocab"},
        "parameters": param_count(model),
        **stats,
        "tokens_per_second": round(stats["tokens_seen"] / max(stats["train_seconds"], 1e-9), 1),
        "heldout_loss": round(loss, 4),
        "heldout_tokens": n_scored,
        **vocab_record,
        "weights_sha256": sha256_file(out / role / "model.safetensors"),
        "stage_seconds": round(time.perf_counter() - started, 3),
    }


def build_environment(device: str) -> dict:
    import tokenizers

    return environment(tokenizers=tokenizers.__version__, device=device, threads=torch.get_num_threads())


def zoo_manifest(
    size: str,
    spec: ZooSpec,
    corpus_hash: str,
    examples: tuple[list[dict], list[dict]],
    rows: ZooRows,
    records: dict[str, dict],
    data_seconds: float,
    env: dict,
) -> dict:
    """The ``manifest.json`` of a finished build from its stage ``records``."""
    train, heldout = examples
    build_seconds = records["tokenizer"]["train_seconds"] + data_seconds
    build_seconds += sum(records[role]["stage_seconds"] for role in MODEL_ROLES)
    return {
        "format": MANIFEST_FORMAT,
        "size": size,
        "draftsmith_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seed": spec.seed,
        "corpus_sha256": corpus_hash,
        "corpus": {
            "train_examples": len(train),
            "heldout_examples": len(heldout),
            "train_tokens": rows.train_tokens,
            "heldout_tokens_scored": rows.n_heldout,
        },
        "spec": asdict(spec),
        "tokenizer": records["tokenizer"],
        "models": {role: records[role] for role in MODEL_ROLES},
        "build_seconds": round(build_seconds, 1),
        "environment": env,
    }


# -------------------------------------------------------------------------------------------------- build


def run_stages(
    home: Path,
    size: str,
    spec: ZooSpec,
    corpus_hash: str,
    restart: bool,
    device: str,
    on_step: StepHook | None,
    progress: bool,
) -> None:
    """Run the stages of the zoo of ``size`` under ``home`` not yet finished (all of them when ``restart``, or when
    ``.build`` holds work for another fingerprint), then write the manifest and drop ``.build``."""
    out = zoo_dir(size, home)
    build = out / ".build"
    wanted = fingerprint(spec, corpus_hash)
    if restart or read_json(build / "fingerprint.json") != wanted:
        start_over(out)  # stale partial work
    build.mkdir(parents=True, exist_ok=True)
    atomic_write_text(build / "fingerprint.json", json.dumps(wanted, indent=1))

    started = time.perf_counter()
    examples = zoo_examples(spec)
    data_seconds = time.perf_counter() - started
    records = {"tokenizer": stage_record(out, "tokenizer")}
    if records["tokenizer"] is None:
        records["tokenizer"] = (imported_tokenizer_stage(out, spec, home) if spec.target_import
                                else build_tokenizer_stage(out, spec, examples[0]))
        write_stage_record(out, "tokenizer", records["tokenizer"])

    started = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "tokenizer")
    rows = zoo_rows(tokenizer, spec, *examples)
    data_seconds += time.perf_counter() - started

    for role in MODEL_ROLES:
        records[role] = stage_record(out, role)
        if records[role] is None:
            if role == "target" and spec.target_import:
                records[role] = imported_target_stage(out, spec, rows, device, home)
            else:
                records[role] = build_model_stage(out, spec, role, rows, device, on_step, progress)
            write_stage_record(out, role, records[role])

    env = build_environment(device)
    manifest = zoo_manifest(size, spec, corpus_hash, examples, rows, records, data_seconds, env)
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(build, ignore_errors=True)


def build_zoo(
    size: str = "tiny",
    home: str | os.PathLike | None = None,
    spec: ZooSpec | None = None,
    force: bool = False,
    *,
    device: str | None = None,
    threads: int | str | None = None,
    progress: bool = True,
    on_step: StepHook | None = None,
) -> Path:
    """Build (or finish building) the zoo of ``size`` and return its directory.

    ``spec`` overrides the built-in spec of ``size`` (e.g. a reduced one in tests). An existing complete zoo
    is returned as is; if it was built from a different spec or corpus, this raises unless ``force``, which
    rebuilds from scratch. An interrupted build resumes from its last checkpoint. ``on_step(stage, step)``
    is called after every optimizer step. ``threads`` defaults to ``$DRAFTSMITH_THREADS``, else the cores idle
    now (:func:`draftsmith.common.threads.choose_threads`); weights are bit-identical across builds with the
    same spec, machine and thread count."""
    spec = spec if spec is not None else zoo_spec(size)
    home = draftsmith_home(home)
    out = zoo_dir(size, home)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    corpus_hash = corpus_sha256()
    with build_lock(out):
        manifest = read_json(out / "manifest.json")
        if manifest is not None and not force:
            if manifest_fingerprint(manifest) != fingerprint(spec, corpus_hash):
                raise ConfigError(
                    f"the zoo at {out} was built from a different spec or corpus; "
                    f"rebuild it by adding --force (`draftsmith zoo build --size {size} --force`)"
                )
            return out
        with torch_threads(choose_threads(threads, device, cap=torch.get_num_threads())):
            run_stages(home, size, spec, corpus_hash, force, device, on_step, progress)
    return out


def ensure_zoo(size: str = "tiny", home: str | os.PathLike | None = None, **build_kwargs) -> Path:
    """The zoo directory of ``size``, building it first (:func:`build_zoo`) if it is missing or unfinished."""
    out = zoo_dir(size, home)
    if zoo_path(size, "manifest.json", home).is_file():
        return out
    return build_zoo(size, home, **build_kwargs)
