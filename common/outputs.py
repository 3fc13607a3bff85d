"""Outputs: checked before any model loads, written by one run at a time, and write failures as one line.

Every command that writes (a recipe's ``output_dir``, ``draftsmith eval --out``, ``data generate --out``, ``export
--out``) claims its output first, before it spends minutes loading models:

- :func:`prepare_output`: the path is a file or a directory as the option needs (never a file where a directory goes,
  nor under a file), its directory is created and writable, and, where the need is known, the disk has room for it;
- :class:`OutputLock`: a lock file in the output's directory (``DIR/.draftsmith.lock`` for a directory,
  ``.NAME.lock`` beside a file) naming the run that writes it, so a second run is refused in one line naming the
  first one's pid; a lock whose process has ended (a kill, a crash) is stale and taken over;
- :func:`write_error` / :func:`write_failures`: an ``OSError`` while writing (a full disk, no permission, a read-only
  file system) becomes one :class:`~draftsmith.common.errors.OutputError` line that names the file, the cause and
  what was kept (the rows written so far, the last complete checkpoint).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from draftsmith.common.errors import ConfigError, OutputError

LOCK_NAME = ".draftsmith.lock"  # the lock of an output directory, inside it
KINDS = ("file", "dir")
# errno -> why a write failed and what to do
REASONS = {
    errno.ENOSPC: "no space left on the device (free space, or write elsewhere)",
    errno.EDQUOT: "the disk quota is used up (free space, or write elsewhere)",
    errno.EFBIG: "the file is too large for the file system (write elsewhere)",
    errno.EACCES: "permission denied (choose a directory you can write)",
    errno.EPERM: "operation not permitted (choose a directory you can write)",
    errno.EROFS: "the file system is read-only (choose a writable directory)",
}
WRITE_ERRNOS = frozenset(REASONS)
# what libraries that do not raise OSError (torch.save, safetensors) say for the same causes
_MESSAGES = {"no space left": REASONS[errno.ENOSPC], "storagefull": REASONS[errno.ENOSPC],
             "quota exceeded": REASONS[errno.EDQUOT], "permission denied": REASONS[errno.EACCES],
             "read-only file system": REASONS[errno.EROFS], "readonlyfilesystem": REASONS[errno.EROFS],
             "file write failed": "the write failed (is the disk full? free space, or write elsewhere)"}


# ------------------------------------------------------------------------------------------------ write failures


def _message_reason(err: BaseException) -> str | None:
    text = str(err).lower()
    return next((reason for needle, reason in _MESSAGES.items() if needle in text), None)


def is_write_failure(err: BaseException) -> bool:
    """Whether ``err`` is a failed write: an :class:`OutputError`, an ``OSError`` of :data:`WRITE_ERRNOS`, or a
    library's error (torch.save's ``RuntimeError``, safetensors') saying the same."""
    if isinstance(err, OutputError):
        return True
    if isinstance(err, OSError):
        return err.errno in WRITE_ERRNOS
    library = isinstance(err, RuntimeError) or type(err).__name__ == "SafetensorError"
    return library and _message_reason(err) is not None


def failure_reason(err: BaseException) -> str:
    """Why a write failed, with the fix, in a few words."""
    reason = getattr(err, "reason", None)
    if reason:
        return reason
    if isinstance(err, OSError) and err.errno in REASONS:
        return REASONS[err.errno]
    if not isinstance(err, OSError) and _message_reason(err):
        return _message_reason(err)
    text = (err.strerror if isinstance(err, OSError) else None) or str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def write_error(path: str | os.PathLike, err: BaseException, kept: str, *, exact: bool = True) -> OutputError:
    """One line for a write of ``path`` that failed with ``err``: the file (with ``exact``, the one that failed when
    ``err`` knows it, say a checkpoint's shard; else ``path``), the cause and its fix, and ``kept``, what is still
    there."""
    failed = getattr(err, "path", None) or (err.filename if exact and isinstance(err, OSError) else None)
    where = os.fsdecode(failed) if failed is not None else os.fspath(path)
    reason = failure_reason(err)
    verb = "write" if _within(where, path) else "access"  # a file outside the output: maybe a read that failed
    error = OutputError(f"cannot {verb} {where}: {reason}; kept: {kept}")
    error.path, error.reason = where, reason
    return error


def _within(where: str, output: str | os.PathLike) -> bool:
    """Whether ``where`` lies in the output ``output`` (a directory, or the directory of an output file)."""
    full, root = Path(where).absolute(), Path(output).expanduser().absolute()
    return any(full == r or r in full.parents for r in (root, root.parent if not root.is_dir() else root))


@contextlib.contextmanager
def write_failures(path: str | os.PathLike, kept: str | Callable[[], str]) -> Iterator[None]:
    """Turn a write failure in the block (:func:`is_write_failure`) into one :class:`OutputError` naming what was
    kept (``kept``, or ``kept()`` asked at the failure); any other error passes through."""
    try:
        yield
    except Exception as err:
        if not is_write_failure(err):
            raise
        raise write_error(path, err, kept() if callable(kept) else kept) from None


# ------------------------------------------------------------------------------------------------- the checks


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def output_path(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a :class:`Path` (``~`` expanded), or a :class:`ConfigError` for an empty or malformed one."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{flag} is empty: pass the path to write")
    if "\x00" in text:
        raise ConfigError(f"{flag} {text!r} holds a NUL character, which no path can: pass a plain path")
    return Path(text).expanduser()


def _existing_ancestor(path: Path) -> Path:
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def prepare_output(path: str | os.PathLike, flag: str, kind: str = "file", *, need_bytes: int | None = None,
                   need: str = "", example: str | None = None, create: bool = True) -> Path:
    """The output ``path`` of option ``flag`` checked and made ready to write, before any model loads: ``kind``
    ``file`` (an existing file is fine; a directory is refused; its directory is created) or ``dir`` (created; a
    file is refused); nothing may lie under a file; the directory must take a new file; with ``need_bytes``, its
    disk must have that much free (``need`` says what for). ``example`` names a file for the fix when a directory
    was given for a file. ``create=False`` creates nothing: the nearest existing directory above must take a new
    file. Returns the path (``~`` expanded)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    path = output_path(path, flag)
    try:
        if kind == "file" and path.is_dir():
            suggestion = f" such as {path / example}" if example else ""
            raise OutputError(f"{flag} {path} is a directory: pass a file path{suggestion}")
        if kind == "dir" and path.exists() and not path.is_dir():
            raise OutputError(f"{flag} {path} is a file: pass a directory (a new one, or one this command wrote)")
        directory = path if kind == "dir" else path.parent
        ancestor = _existing_ancestor(directory)
        if not ancestor.is_dir():
            raise OutputError(f"{flag} {path} lies under {ancestor}, which is a file, not a directory: pass a path "
                              "in a directory")
        if kind == "file" and path.is_file() and not os.access(path, os.W_OK):
            raise OutputError(f"{flag} {path} is not writable (permission denied): make it writable or pass "
                              "another path")
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        else:
            directory = ancestor
        tempfile.TemporaryFile(dir=directory).close()  # the one sure test that a new file can be made there
    except OSError as err:
        raise OutputError(f"{flag} {path} cannot be written: {failure_reason(err)}") from None
    except ValueError as err:  # a name the file system refuses outright
        raise OutputError(f"{flag} {path} is not a usable path ({err}): pass another") from None
    if need_bytes:
        free = shutil.disk_usage(directory).free
        if need_bytes > free:
            raise OutputError(f"{flag} {path}: its disk has {_size(free)} free and this needs at least "
                              f"{_size(need_bytes)}{f' ({need})' if need else ''}: free space or pass another {flag}")
    return path


def weights_bytes(path: str | os.PathLike | None) -> int | None:
    """Bytes of the weight files (safetensors, bin, gguf) of a local model directory or file; None when ``path`` is
    not local (a hub id, a name) or holds none."""
    if path is None:
        return None
    path = Path(path).expanduser()
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return None
    total = sum(p.stat().st_size for p in path.rglob("*") if p.suffix in (".safetensors", ".bin", ".gguf")
                and p.is_file())
    return total or None


# ----------------------------------------------------------------------------------------------------- the lock


def lock_path(path: str | os.PathLike, kind: str = "file") -> Path:
    """The lock of an output: ``DIR/.draftsmith.lock`` for a directory, ``.NAME.lock`` beside a file."""
    path = Path(path)
    return path / LOCK_NAME if kind == "dir" else path.with_name(f".{path.name}.lock")


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux), to tell a reused pid from the locking process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OSError:
        return False
    return True


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "start_ticks": _start_ticks(os.getpid()),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)[:300]}


def _read_lock(lock: Path) -> dict | None:
    try:
        data = json.loads(lock.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def lock_is_stale(holder: dict | None) -> bool:
    """Whether a lock's run is gone: unreadable, this very process (a run that ended here without releasing it), or a
    process of this host that has ended (or whose pid now belongs to a later process)."""
    if holder is None or holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        return True
    if holder.get("host") != socket.gethostname():
        return False  # cannot tell: refuse, naming the host
    ticks = holder.get("start_ticks")
    return not _alive(holder["pid"]) or (ticks is not None and _start_ticks(holder["pid"]) not in (None, ticks))


class OutputLock:
    """The claim of one run on one output (module docstring). ``acquire()`` raises :class:`OutputError` naming the
    run that holds it; ``release()`` (also on leaving a ``with`` block, or when the lock is collected) removes the
    lock file if it is still this run's."""

    def __init__(self, path: str | os.PathLike, flag: str, kind: str = "file") -> None:
        self.output, self.flag, self.path = Path(path), flag, lock_path(path, kind)
        self.held = False

    def _link(self, holder: dict) -> bool:
        """Create the lock file whole (written beside it, then hard-linked into place); False if it exists."""
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.new")
        try:
            tmp.write_text(json.dumps(holder) + "\n", encoding="utf-8")
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            except OSError as err:
                if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # no hard links here
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(json.dumps(holder) + "\n")
            return True
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def acquire(self) -> OutputLock:
        holder = _holder()
        for _ in range(3):
            try:
                taken = self._link(holder)
            except FileExistsError:  # another run's lock is there: read it below
                taken = False
            except OSError as err:
                raise OutputError(f"{self.flag} {self.output} cannot be written (its lock {self.path}): "
                                  f"{failure_reason(err)}") from None
            if taken:
                self.held = True
                return self
            other = _read_lock(self.path)
            if not lock_is_stale(other):
                host = "" if other.get("host") == holder["host"] else f" on {other.get('host')}"
                raise OutputError(f"{self.flag} {self.output} is being written by another draftsmith run (pid "
                                  f"{other['pid']}{host}, since {other.get('started', '?')}): wait for it to end or pass "
                                  f"another {self.flag}; if that run is gone, delete {self.path}")
            # stale: move it aside (one taker wins the rename), then try again
            with contextlib.suppress(OSError):
                aside = self.path.with_name(f"{self.path.name}.{os.getpid()}.stale")
                os.replace(self.path, aside)
                aside.unlink()
        raise OutputError(f"{self.flag} {self.output}: could not take its lock {self.path} (other runs keep "
                          "starting): retry, or pass another path")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        current = _read_lock(self.path)
        if current is not None and current.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                self.path.unlink()

    def __enter__(self) -> OutputLock:
        return self if self.held else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()


def claim(path: str | os.PathLike, flag: str, kind: str = "file", *, lock: bool = True,
          **checks) -> OutputLock | None:
    """:func:`prepare_output`, then, with ``lock``, the output's :class:`OutputLock` taken (None without): for a run
    that releases it at its end (and, failing that, when the lock is collected or the process ends)."""
    path = prepare_output(path, flag, kind, **checks)
    return OutputLock(path, flag, kind).acquire() if lock else None


@contextlib.contextmanager
def claim_output(path: str | os.PathLike, flag: str, kind: str = "file", *, lock: bool = True,
                 **checks) -> Iterator[Path]:
    """:func:`prepare_output` then, with ``lock``, hold the output's :class:`OutputLock` for the block; yields the
    path (``~`` expanded). Directories it created are removed again when the block fails and leaves them empty."""
    target = output_path(path, flag)
    created = first_missing(target if kind == "dir" else target.parent)
    path = prepare_output(path, flag, kind, **checks)
    try:
        if not lock:
            yield path
            return
        with OutputLock(path, flag, kind):
            yield path
    except BaseException:
        remove_empty(path if kind == "dir" else path.parent, created)
        raise


def first_missing(directory: str | os.PathLike) -> Path | None:
    """The highest directory of ``directory``'s chain that does not exist yet (None when it exists)."""
    missing = None
    current = Path(directory).expanduser().absolute()
    while not current.exists() and current != current.parent:
        missing, current = current, current.parent
    return missing


def remove_empty(directory: str | os.PathLike, top: Path | None) -> None:
    """Remove ``directory`` and its parents up to ``top`` while they are empty (best effort)."""
    if top is None:
        return
    current = Path(directory).expanduser().absolute()
    while True:
        try:
            current.rmdir()
        except OSError:
            return
        if current == top or current == current.parent:
            return
        current = current.parent


__all__ = ["KINDS", "LOCK_NAME", "REASONS", "WRITE_ERRNOS", "OutputLock", "claim", "claim_output", "failure_reason",
           "first_missing", "remove_empty",
           "is_write_failure", "lock_is_stale", "lock_path", "output_path", "prepare_output", "weights_bytes",
           "write_error", "write_failures"]
