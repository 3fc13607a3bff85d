"""Files that are written whole or not at all, and their hashes."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in ``chunk``-byte blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hex sha256 of ``obj`` as canonical JSON (sorted keys; non-JSON values through ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename: a reader sees
    the old file or the new one, never half of it (parent directories are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def recover_jsonl(path: str | os.PathLike) -> list[Any]:
    """The complete lines of an append-only JSON-lines file, parsed (None for a line that is not JSON), in file
    order. A torn last line (no newline: the writer was killed mid-write) is cut off the file. [] when there is no
    file."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)
            fh.flush()
            os.fsync(fh.fileno())
    out = []
    for line in data[:end].decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append(None)
    return out


def append_jsonl(path: str | os.PathLike, rows) -> None:
    """Append ``rows`` (an iterable of JSON-able objects) as JSON lines in one write, flushed and fsynced: a kill
    loses at most this write, and :func:`recover_jsonl` cuts a torn one off."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any | None:
    """The parsed file, or None when it is missing or not valid JSON (a half-written file reads as None)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def environment(**extra: Any) -> dict:
    """Versions and machine, for manifests and reports; ``extra`` adds keys (device, threads, ...)."""
    import torch
    import transformers

    from draftsmith.common import __version__

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "draftsmith": __version__,
        "machine": f"{platform.machine()} {platform.system()} {os.cpu_count()} cpu"
        + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""),
    }
    env.update(extra)
    return env
