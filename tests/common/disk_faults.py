"""Write failures under one directory, for the tests of one-line write errors (not a test module; pytest puts
``tests/common`` on the path).

:func:`read_only` makes a directory read-only with ``chmod`` where that stops writes (not as root: root writes through
any mode) and otherwise simulates it; :func:`failing_writes` makes the ``after``-th write under a directory and every
one after it fail with ``errno`` ``code`` (ENOSPC: a disk that fills up), by wrapping, in the test only, the calls
that create or move files: ``open``, ``os.open``, ``os.replace``, ``os.link``, ``os.mkdir``.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
from pathlib import Path

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class FailingWrites:
    """Counts the writes under ``root``; from the ``after``-th on they raise ``OSError(code)``."""

    def __init__(self, root: Path, code: int, after: int = 1) -> None:
        self.root, self.code, self.after = os.path.realpath(root), code, after
        self.writes = 0
        self.failed: list[str] = []

    def under(self, path) -> bool:
        try:
            full = os.path.realpath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return False
        return full == self.root or full.startswith(self.root + os.sep)

    def hit(self, path) -> None:
        if not self.under(path):
            return
        self.writes += 1
        if self.writes >= self.after:
            self.failed.append(os.fsdecode(os.fspath(path)))
            raise OSError(self.code, os.strerror(self.code), os.fsdecode(os.fspath(path)))

    def install(self, monkeypatch) -> FailingWrites:
        real_open, real_os_open = io.open, os.open
        real_replace, real_link, real_mkdir = os.replace, os.link, os.mkdir

        def open_(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wax+"):
                self.hit(file)
            return real_open(file, mode, *args, **kwargs)

        def os_open(path, flags, *args, **kwargs):
            if flags & WRITE_FLAGS:
                self.hit(path)
            return real_os_open(path, flags, *args, **kwargs)

        def moving(real):
            def move(src, dst, *args, **kwargs):
                self.hit(dst)
                return real(src, dst, *args, **kwargs)
            return move

        def mkdir(path, *args, **kwargs):
            self.hit(path)
            return real_mkdir(path, *args, **kwargs)

        for owner in (io, builtins):
            monkeypatch.setattr(owner, "open", open_)
        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(os, "replace", moving(real_replace))
        monkeypatch.setattr(os, "link", moving(real_link))
        monkeypatch.setattr(os, "mkdir", mkdir)
        return self


def failing_writes(monkeypatch, root: Path, code: int = errno.ENOSPC, after: int = 1) -> FailingWrites:
    """From the ``after``-th write under ``root`` on, every write fails with ``code`` (see the module docstring)."""
    return FailingWrites(Path(root), code, after).install(monkeypatch)


def read_only(monkeypatch, request, root: Path) -> str:
    """Make ``root`` read-only: ``chmod`` where that stops writes (its mode is given back when the test ends), else
    (as root, where chmod stops nothing) simulated with EACCES. Returns how: ``"chmod"`` or ``"simulated"``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    mode = root.stat().st_mode
    os.chmod(root, 0o555)
    request.addfinalizer(lambda: os.chmod(root, mode))
    probe = root / ".probe"
    try:
        probe.write_text("x")
    except PermissionError:
        return "chmod"
    probe.unlink()
    os.chmod(root, mode)
    failing_writes(monkeypatch, root, errno.EACCES)
    return "simulated"
