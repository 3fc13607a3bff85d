"""Resumable row files: a JSONL file written one batch at a time beside ``<file>.meta.json``, shared by every
generator of training data (:mod:`~draftsmith.data.self_distill` answers, :mod:`~draftsmith.data.synthetic_prompts`,
:mod:`~draftsmith.data.jacobi` trajectories).

- :func:`append_rows` / :func:`rewrite_rows`: rows on disk with their sha256 in ``<file>.sha256`` (one per line,
  appended before the rows), and :func:`recover_rows`: the complete rows after a kill (a torn last line is cut off),
  each checked against those sums, so a row edited since it was written is refused with its line;
- :func:`check_resume` / :func:`open_row_file`: a rerun adds to a file only with the same settings (format ``fmt``
  of the meta, the ``keys`` of its settings) and the same target, else a one-line :class:`ConfigError`;
- :func:`writer_identity`: what a meta records of the target that wrote the rows (its identity and a sample of its
  weights), :func:`same_target` compares two such records;
- :func:`row_seed`: the sampling seed of one row, so a row's tokens do not depend on its batch or on restarts;
  :func:`sampling_settings` / :func:`check_settings`: the sampling settings a file records, and their checks.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from draftsmith.common.errors import ConfigError, DataError
from draftsmith.common.io import append_jsonl, atomic_write_text, read_json, recover_jsonl, sha256_json
from draftsmith.common.models import target_identity
from draftsmith.common.sharding import full_tensor

META_SUFFIX = ".meta.json"
SUMS_SUFFIX = ".sha256"  # the sha256 of every row line, one JSON string a line, appended before the rows
SETTINGS = ("temperature", "top_p", "seed", "max_new_tokens")  # what must match to resume a sampled file
TARGET_KEYS = ("config_sha256", "tokenizer_sha256", "vocab_size", "weights_sample_sha256")  # identity, not path
FIX = "pass a new --out, or --overwrite to start that file again"


def meta_path(out: str | os.PathLike) -> Path:
    return Path(f"{out}{META_SUFFIX}")


def sums_path(out: str | os.PathLike) -> Path:
    return Path(f"{out}{SUMS_SUFFIX}")


def _line(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False)  # as common.io.append_jsonl writes a row


def _digest(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()[:32]


def _file_lines(out: Path) -> list[bytes]:
    """The non-empty lines of a row file (split at newlines only, as :func:`~draftsmith.common.io.recover_jsonl`)."""
    return [line for line in out.read_bytes().split(b"\n") if line.strip()] if out.exists() else []


def append_rows(out: str | os.PathLike, rows: Sequence[dict]) -> None:
    """Append ``rows`` to ``out``, their sha256 first to ``<out>.sha256``: a kill between the two leaves sums of rows
    that are not on disk, which :func:`recover_rows` ignores, never rows without sums."""
    append_jsonl(sums_path(out), [_digest(_line(r).encode("utf-8")) for r in rows])
    append_jsonl(out, rows)


def rewrite_rows(out: str | os.PathLike, rows: Sequence[dict]) -> None:
    """Replace ``out`` by ``rows`` (reordered or fewer rows of it), then its sums, each atomically."""
    lines = [_line(r) for r in rows]
    atomic_write_text(out, "".join(f"{line}\n" for line in lines))
    atomic_write_text(sums_path(out), "".join(json.dumps(_digest(line.encode("utf-8"))) + "\n" for line in lines))


def recover_rows(out: str | os.PathLike) -> list[dict]:
    """The complete rows of an output file, in file order. A torn last line (no newline: the run was killed while
    writing it) is cut off the file; any other unreadable line, or a line whose sha256 is not among those written
    with the rows (edited since), is a :class:`DataError` naming it. A file written before rows had sums gets them
    now."""
    rows = recover_jsonl(out)
    for n, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise DataError(f"{out} line {n} is not a generated row; {FIX}")
    lines, sums_file = _file_lines(Path(out)), sums_path(out)
    if rows and not sums_file.exists():
        rewrite_rows(out, rows)
        return rows
    written = Counter(s for s in recover_jsonl(sums_file) if isinstance(s, str))
    for n, line in enumerate(lines, start=1):
        digest = _digest(line)
        if written[digest] < 1:
            raise DataError(f"{out} line {n} was changed since it was written (its sha256 is not in {sums_file.name}): "
                            f"restore it, or {FIX}")
        written[digest] -= 1
    return rows


def check_resume(meta: Mapping | None, settings: Mapping, target: Mapping, out: Path, has_rows: bool, *,
                 fmt: str, keys: Sequence[str] = SETTINGS, fix: str = FIX) -> None:
    """Refuse to add to ``out`` unless its meta (format ``fmt``) records the same ``keys`` of ``settings`` and the
    same target (ConfigError naming ``fix``). Shared by every resumable row file (answers, Jacobi trajectories)."""
    if meta is None:
        if has_rows:
            raise ConfigError(f"{out} holds rows but no readable {meta_path(out).name}, so they cannot be resumed; {fix}")
        return
    if meta.get("format") != fmt:
        raise ConfigError(f"{meta_path(out)} is not a {fmt} meta file; {fix}")
    old = meta.get("settings", {})
    changed = [f"{k} {old.get(k)!r} -> {settings[k]!r}" for k in keys if old.get(k) != settings[k]]
    if changed:
        raise ConfigError(f"{out} was generated with other settings ({', '.join(changed)}); rerun with the same "
                          f"settings to resume, or {fix}")
    old_target = meta.get("target", {})
    if not same_target(old_target, target):
        raise ConfigError(f"{out} was generated by another target ({old_target.get('name_or_path')}); pass that "
                          f"target to resume, or {fix}")


def sampling_settings(temperature: float, top_p: float, seed: int, max_new_tokens: int) -> dict:
    """The generation settings a sampled row file records and a resumed run must repeat (:data:`SETTINGS`)."""
    return {"temperature": float(temperature), "top_p": float(top_p), "seed": int(seed),
            "max_new_tokens": int(max_new_tokens)}


def open_row_file(out_path: str | os.PathLike, settings: Mapping, target: Mapping, overwrite: bool, *,
                  fmt: str, fix: str = FIX,
                  keys: Sequence[str] = SETTINGS) -> tuple[Path, Path, list[dict], dict | None]:
    """``(out, meta_file, rows, meta)`` of a sampled row file about to be (re)started: emptied first with
    ``overwrite``; its complete rows and meta, after :func:`check_resume` of ``keys`` of ``settings`` and
    ``target``."""
    out, meta_file = Path(out_path), meta_path(out_path)
    if overwrite:
        for path in (out, meta_file, sums_path(out)):
            path.unlink(missing_ok=True)
    done = recover_rows(out)
    old_meta = read_json(meta_file) if done else None  # no rows yet: start afresh whatever the meta says
    check_resume(old_meta, settings, target, out, has_rows=bool(done), fmt=fmt, keys=keys, fix=fix)
    return out, meta_file, done, old_meta


def writer_identity(model, tokenizer, target_name: str | None = None) -> dict:
    """What a row file's meta records of the target that wrote it: its identity and a sample of its weights."""
    return target_identity(model, tokenizer, target_name) | {"weights_sample_sha256": weights_sample_sha256(model)}


def same_target(recorded: Mapping, identity: Mapping) -> bool:
    """Whether two target records name the same model (config, tokenizer, vocabulary, weights; not the path)."""
    return all(recorded.get(k) == identity.get(k) for k in TARGET_KEYS)


def weights_sample_sha256(model, values: int = 4096) -> str:
    """sha256 of the first ``values`` weights of the model's first and last parameter tensors, rounded to bfloat16:
    tells two checkpoints of one architecture apart without reading every weight, and is the same whether the model
    is held in float32 or bfloat16 (answers written in one precision train a run in the other). The same under
    ZeRO-3 or FSDP as on one process (those two tensors are gathered: every process calls it then)."""
    params = list(model.parameters())
    blob = [full_tensor(p).flatten()[:values].bfloat16().float().cpu().numpy().tobytes() for p in (params[0], params[-1])]
    return hashlib.sha256(b"".join(blob)).hexdigest()


def check_settings(batch_size: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    """One-line ConfigErrors for generation settings out of range."""
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"--top-p must lie in (0, 1] (1 = no cut), got {top_p}")


def row_seed(seed: int, row_id: str) -> int:
    """The generator seed of one row: 63 bits of sha256(``"<seed>:<id>"``)."""
    return int(sha256_json(f"{seed}:{row_id}")[:16], 16) & ((1 << 63) - 1)


__all__ = ["FIX", "META_SUFFIX", "SETTINGS", "SUMS_SUFFIX", "TARGET_KEYS", "append_rows", "check_resume",
           "check_settings", "meta_path", "open_row_file", "recover_rows", "rewrite_rows", "row_seed", "same_target",
           "sampling_settings", "sums_path", "weights_sample_sha256", "writer_identity"]
