"""An engine's checkpoint directory (``model.safetensors`` + ``config.json`` + the export's own record), written
atomically: every export format ends here.

An export never replaces what it did not make: the directory it writes holds :data:`EXPORT_RECORD` (its format and
draftsmith's version), and an existing directory is replaced only when it is empty or holds the record of an
export of the same format holding nothing but the files an export writes (:data:`EXPORT_FILES`), each as it was
written (the record holds their sha256): a file a user added or edited there is never deleted
(:func:`check_replaceable`; the command line asks for ``--overwrite`` besides).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftsmith.common import __version__
from draftsmith.common.errors import OutputError
from draftsmith.common.io import atomic_write_json, sha256_file, umask_modes

EXPORT_RECORD = "draftsmith-export.json"
RECORD_FORMAT = "draftsmith-export/1"
EXPORT_FILES = frozenset({"model.safetensors", "config.json", EXPORT_RECORD})  # all an export writes


def export_record(out: str | os.PathLike) -> dict | None:
    """The record of the export in ``out``, or None when it holds none (or an unreadable one)."""
    path = Path(out) / EXPORT_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == RECORD_FORMAT else None


def check_replaceable(out: str | os.PathLike, fmt: str, overwrite: bool, flag: str = "--out") -> None:
    """Refuse (one line) to write an export of ``fmt`` over ``out`` unless it is absent, an empty directory, or, with
    ``overwrite``, an earlier export of the same format; a file, or a directory holding anything else, never."""
    out = Path(out)
    if out.is_symlink():
        raise OutputError(f"{flag} {out} is a symbolic link: pass the directory itself ({out.resolve()})")
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputError(f"{flag} {out} is a file: pass a directory (a new one, or an earlier export to replace)")
    if not any(out.iterdir()):
        return
    record = export_record(out)
    if record is None:
        raise OutputError(f"{flag} {out} holds files that draftsmith did not export, and an export replaces its "
                          "directory whole: pass a new or empty directory")
    if record.get("export_format") != fmt:
        raise OutputError(f"{flag} {out} holds a {record.get('export_format')} export, not {fmt}: pass a new or "
                          "empty directory")
    others = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_FILES)
    if others:
        raise OutputError(f"{flag} {out} holds an earlier {fmt} export and files it did not write ({others[0]}"
                          f"{', ...' if len(others) > 1 else ''}), which replacing it would delete: move them, or pass "
                          "a new directory")
    written = record.get("files") if isinstance(record.get("files"), dict) else {}  # an older record: none
    edited = sorted(name for name, digest in written.items() if name in EXPORT_FILES and (out / name).is_file()
                    and sha256_file(out / name) != digest)
    if edited:
        raise OutputError(f"{flag} {out} holds an earlier {fmt} export whose {edited[0]} was changed since it was "
                          "written, which replacing it would lose: move the directory, or pass a new one")
    if not overwrite:
        raise OutputError(f"{flag} {out} holds an earlier {fmt} export: pass --overwrite to replace it, or a new "
                          "directory")


def write_export(out: str | os.PathLike, tensors: dict[str, torch.Tensor], config: dict, fmt: str) -> Path:
    """An engine's checkpoint directory at ``out`` (``model.safetensors`` + ``config.json`` + :data:`EXPORT_RECORD`),
    atomically: staged beside it, then renamed over an earlier export of the same format (anything else there is
    refused: :func:`check_replaceable`)."""
    out = Path(out)
    check_replaceable(out, fmt, overwrite=True)
    staging = out.with_name(f".{out.name}.export.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        save_file(tensors, str(staging / "model.safetensors"))
        umask_modes(staging / "model.safetensors")
        atomic_write_json(staging / "config.json", config)
        files = {name: sha256_file(staging / name) for name in sorted(EXPORT_FILES - {EXPORT_RECORD})}
        atomic_write_json(staging / EXPORT_RECORD, {"format": RECORD_FORMAT, "export_format": fmt,
                                                    "draftsmith_version": __version__, "files": files})
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


__all__ = ["EXPORT_FILES", "EXPORT_RECORD", "check_replaceable", "export_record", "write_export"]
