"""Files that are written whole or not at all, and their hashes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import secrets
from pathlib import Path
from typing import Any

from draftsmith.common.outputs import write_error


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


def _create_temporary(path: Path) -> tuple[int, Path]:
    """``(fd, name)`` of a new file beside ``path``, created as a plain ``open()`` creates one, so it gets the mode
    the process umask gives (``tempfile.mkstemp`` would make it 0600 whatever the umask)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue


def process_umask() -> int:
    """The process umask, read without changing it where the system tells it (``/proc/self/status``), so a thread
    creating a file meanwhile cannot get a wider mode."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_modes(path: str | os.PathLike) -> None:
    """Give the file ``path``, or every file under the directory ``path``, the mode a plain ``open()`` gives a new
    file under the process umask (safetensors' ``save_file`` creates its files 0600 whatever the umask, so weights
    would be unreadable to the group that shares a checkpoint or artefact). A file that vanishes meanwhile (another
    rank's temporary file in a shared checkpoint folder) is skipped."""
    path, mode = Path(path), 0o666 & ~process_umask()
    for file in (path.rglob("*") if path.is_dir() else [path]):
        with contextlib.suppress(FileNotFoundError):  # another process's temporary file, gone since it was listed
            if file.is_file() and not file.is_symlink() and file.stat().st_mode & 0o777 != mode:
                os.chmod(file, mode)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename: a reader sees
    the old file or the new one, never half of it (parent directories are created). The file gets the mode a
    plain ``open()`` would give it under the process umask."""
    path = Path(path)
    kept = f"{path} as it was before this write (or no file, if there was none)"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temporary(path)
    except OSError as err:
        raise write_error(path, err, kept, exact=False) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):  # on a read-only disk the removal fails too
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise write_error(path, err, kept, exact=False) from None
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
        try:
            with open(path, "r+b") as fh:
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as err:
            raise write_error(path, err, f"{path} with a torn last line, which the next read cuts off",
                              exact=False) from None
    out = []
    for line in data[:end].decode("utf-8", errors="replace").split("\n"):  # not splitlines: U+2028 is in rows
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append(None)
    return out


def append_jsonl(path: str | os.PathLike, rows) -> None:
    """Append ``rows`` (an iterable of JSON-able objects) as JSON lines in one write, flushed and fsynced: a kill
    loses at most this write, and :func:`recover_jsonl` cuts a torn one off. A write that fails (a full disk) is
    cut off again and raises :class:`~draftsmith.common.errors.OutputError`: the file keeps its earlier lines."""
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)  # no torn line left behind
                raise
        finally:
            os.close(fd)
    except OSError as err:
        raise write_error(path, err, f"the lines {path} held before this write", exact=False) from None


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any | None:
    """The parsed file, or None when it is missing or not valid JSON (a half-written file reads as None)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_safetensors_dir(folder: str | os.PathLike) -> dict:
    """Every tensor of a checkpoint folder's weights: ``model.safetensors``, or the files its
    ``model.safetensors.index.json`` names (a sharded save)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = read_json(folder / "model.safetensors.index.json")
    files = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    state: dict = {}
    for name in files:
        state.update(load_file(str(folder / name)))
    return state


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


SUMS_FILE = "sha256sums.json"  # a directory's files and their sha256, written after them


def write_sums(folder: str | os.PathLike) -> dict[str, str]:
    """Hash every file under ``folder`` (relative paths, but :data:`SUMS_FILE` itself) into :data:`SUMS_FILE`,
    atomically; returns the sums."""
    root = Path(folder)
    sums = {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != SUMS_FILE}
    atomic_write_json(root / SUMS_FILE, {"format": "draftsmith-sha256sums/1", "files": sums})
    return sums


def changed_files(folder: str | os.PathLike) -> list[str] | None:
    """The files of :data:`SUMS_FILE` that are missing or differ from their recorded sha256 (``[]``: every file is as
    written), or None when ``folder`` records no readable sums."""
    root = Path(folder)
    record = read_json(root / SUMS_FILE)
    if not (isinstance(record, dict) and isinstance(record.get("files"), dict)):
        return None
    return [name for name, digest in record["files"].items()
            if not (root / name).is_file() or sha256_file(root / name) != digest]
