"""The files of an offline feature cache (:mod:`draftsmith.data.feature_cache`): shards written whole with their
sha256 beside them, the manifest marked complete with every shard's sum and its own, the checks a reader makes of
the manifest when it opens a cache and of each shard as it loads it. Every problem is a one-line
:class:`~draftsmith.common.errors.DataError` naming the file and the fix."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load, save_file

from draftsmith.common.errors import DataError
from draftsmith.common.io import atomic_write_json, read_json, sha256_file, sha256_json, umask_modes

FORMAT = "draftsmith-features/1"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.safetensors"


def _sum_path(path: Path) -> Path:
    return path.with_suffix(".sha256")  # shard-00000.safetensors -> shard-00000.sha256


def save_shard(tensors: dict, path: Path) -> None:
    """One shard written whole (beside its place, hashed, its sum written, then renamed): a kill leaves no shard
    without its sum, and a failed write leaves no temporary behind."""
    tmp = path.with_suffix(".tmp")
    try:
        save_file(tensors, str(tmp))
        umask_modes(tmp)
        atomic_write_json(_sum_path(path), {"sha256": sha256_file(tmp), "bytes": tmp.stat().st_size})
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def shard_sum(path: Path) -> dict | None:
    """The sha256 and size recorded when ``path`` was written, if it is still what was written; else None."""
    record = read_json(_sum_path(path))
    if not (isinstance(record, dict) and path.is_file() and record.get("bytes") == path.stat().st_size):
        return None
    return record if sha256_file(path) == record.get("sha256") else None


def finish_feature_cache(directory: str | os.PathLike) -> None:
    """Mark a cache complete once every one of its shards is on disk as it was written: its sha256 and size go into
    the manifest, and the manifest's own sha256 (a DataError naming a missing or changed shard else: a rerun of the
    build rewrites it). A shard written before shards had sums is recorded as it is."""
    directory = Path(directory)
    manifest = read_json(directory / "manifest.json")
    if not (isinstance(manifest, dict) and isinstance(manifest.get("shards"), list)):
        raise DataError(f"{directory / 'manifest.json'} is missing or not a feature cache's: delete {directory} and "
                        "rerun the build")
    missing = [shard["file"] for shard in manifest["shards"] if not (directory / shard["file"]).is_file()]
    if missing:
        raise DataError(f"{directory} lacks {len(missing)} shard(s) ({missing[0]}, ...): rerun the build (it resumes)")
    for shard in manifest["shards"]:
        path = directory / shard["file"]
        record = shard_sum(path) if _sum_path(path).exists() else {"sha256": sha256_file(path),
                                                                    "bytes": path.stat().st_size}
        if record is None:
            _sum_path(path).unlink()  # the rerun rewrites the shard
            raise DataError(f"{path} is not what was written (its sha256 or size differs): rerun the build (it "
                            "rewrites that shard)")
        shard.update(sha256=record["sha256"], bytes=record["bytes"])
    manifest = {k: v for k, v in manifest.items() if k != "manifest_sha256"} | {"complete": True}
    atomic_write_json(directory / "manifest.json", manifest | {"manifest_sha256": sha256_json(manifest)})


def add_answered_source(directory: str | os.PathLike, source: str) -> None:
    """Record in the complete cache ``directory``'s manifest (re-signed) that it holds the target's answers to the
    rows whose :func:`~draftsmith.data.feature_cache.source_key` is ``source`` (``answered_from``, a list: a cache of
    several layers serves every run whose answered rows it holds)."""
    manifest = check_manifest(directory)
    sources = list(manifest.get("answered_from", []))
    if source in sources:
        return
    manifest = {k: v for k, v in manifest.items() if k != "manifest_sha256"} | {"answered_from": [*sources, source]}
    atomic_write_json(Path(directory) / "manifest.json", manifest | {"manifest_sha256": sha256_json(manifest)})


def _manifest_problem(manifest, directory: Path) -> str | None:
    """What is wrong with a complete cache's manifest (its shape, its self-hash, its shards' files), or None."""
    if not isinstance(manifest, dict):
        return "manifest.json is missing or not JSON"
    if manifest.get("format") != FORMAT or manifest.get("complete") is not True:
        return "manifest.json is not a complete draftsmith feature cache's"
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if manifest.get("manifest_sha256") != sha256_json(body):
        return "manifest.json was changed since it was written (its sha256 differs)"
    layers, shards, rows = manifest.get("layers"), manifest.get("shards"), manifest.get("rows")
    if (not isinstance(layers, list) or not layers or not all(type(x) is int for x in layers)
            or manifest.get("dtype") not in DTYPES or type(rows) is not int or not isinstance(shards, list)):
        return "manifest.json lacks its layers, dtype, rows or shards"
    start = 0
    for k, shard in enumerate(shards):
        span = shard.get("rows") if isinstance(shard, dict) else None
        if (shard.get("file") if span else None) != shard_name(k) or not (
                isinstance(span, list) and len(span) == 2 and span[0] == start and type(span[1]) is int
                and span[1] > start):
            return f"manifest.json's shard {k} is not shard-{k:05d} of rows from {start}"
        start = span[1]
        path = directory / shard["file"]
        if not path.is_file():
            return f"{shard['file']} is missing"
        if path.stat().st_size != shard.get("bytes"):
            return f"{shard['file']} has {path.stat().st_size} bytes, not the {shard.get('bytes')} written"
    return None if start == rows else f"manifest.json's shards cover {start} rows, not its {rows}"


def check_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of the complete cache ``directory``, checked (:func:`_manifest_problem`); a one-line DataError
    naming the problem and the fix else."""
    directory = Path(directory)
    manifest = read_json(directory / "manifest.json")
    problem = _manifest_problem(manifest, directory)
    if problem is not None:
        raise DataError(f"feature cache {directory}: {problem}; {rebuild_hint(directory)}")
    return manifest


def rebuild_hint(directory: Path) -> str:
    """What to do about a damaged feature cache: rebuild it from scratch."""
    return f"delete {directory} and rerun (the recipe rebuilds it)"


def read_shard(path: Path, sha256: str, rows: int, layers: Sequence[int]) -> dict[str, torch.Tensor]:
    """The shard at ``path``, checked against the ``sha256`` its manifest records and for the tensors its ``rows`` of
    ``layers`` need (a one-line DataError naming the shard and the fix else)."""
    fix = rebuild_hint(path.parent)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataError(f"feature cache shard {path} cannot be read ({err.strerror}); {fix}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise DataError(f"feature cache shard {path} was changed since it was written (its sha256 differs); {fix}")
    shard = load(data)  # [N] ids and labels, [rows + 1] offsets, [N, H] per layer
    n = int(shard["offsets"][-1]) if shard.get("offsets", torch.empty(0)).numel() == rows + 1 else -1
    if n < 0 or any(shard.get(name, torch.empty(0)).shape[0] != n
                    for name in ("input_ids", "labels", *(f"layer_{i}" for i in layers))):
        raise DataError(f"feature cache shard {path} does not hold the {rows} rows of layers "
                        f"{list(layers)} its manifest names; {fix}")
    return shard


def read_offsets(path: Path, rows: int) -> torch.Tensor:
    """The ``[rows + 1]`` row offsets of the shard at ``path``, read without the rest of the file (its hash is checked
    when :func:`read_shard` reads it whole); a damaged file is a one-line DataError naming the shard and the fix."""
    from safetensors import SafetensorError, safe_open

    fix = rebuild_hint(path.parent)
    try:
        with safe_open(str(path), "pt") as f:
            offsets = f.get_tensor("offsets")
    except (OSError, SafetensorError, KeyError, RuntimeError, ValueError) as err:
        raise DataError(f"feature cache shard {path} cannot be read ({str(err).splitlines()[0][:120]}); {fix}") from None
    if offsets.shape != (rows + 1,) or bool((offsets.diff() < 0).any()):
        raise DataError(f"feature cache shard {path} does not hold the offsets of the {rows} rows its manifest names; "
                        f"{fix}")
    return offsets


__all__ = ["DTYPES", "FORMAT", "check_manifest", "finish_feature_cache", "read_offsets", "read_shard", "save_shard",
           "shard_name", "shard_sum"]
