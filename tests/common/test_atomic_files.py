"""Atomic writes (draftsmith.common.io) give their files the mode a plain open() gives under the process umask."""

from __future__ import annotations

import os
import stat

import pytest

from draftsmith.common.io import atomic_write_json, atomic_write_text


@pytest.fixture
def umask():
    """``umask(mask)`` sets the process umask for the test; the old one is restored after it."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077, 0o000], ids=oct)
@pytest.mark.parametrize("write", [lambda p: atomic_write_text(p, "text\n"), lambda p: atomic_write_json(p, {"a": 1})],
                         ids=["text", "json"])
def test_atomic_files_get_the_mode_of_a_plain_open(tmp_path, umask, mask, write):
    umask(mask)
    with open(tmp_path / "plain", "w") as fh:
        fh.write("text\n")
    write(tmp_path / "atomic")
    assert mode(tmp_path / "atomic") == mode(tmp_path / "plain") == 0o666 & ~mask


def test_replacing_a_file_leaves_no_temporary_behind(tmp_path, umask):
    umask(0o022)
    atomic_write_text(tmp_path / "f.txt", "old")
    atomic_write_text(tmp_path / "f.txt", "new")
    assert (tmp_path / "f.txt").read_text() == "new" and mode(tmp_path / "f.txt") == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_a_failed_write_removes_its_temporary_and_keeps_the_old_file(tmp_path):
    atomic_write_text(tmp_path / "f.json", "old")
    with pytest.raises(TypeError):
        atomic_write_text(tmp_path / "f.json", object())  # not text: the write fails midway
    assert (tmp_path / "f.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077], ids=oct)
def test_weights_written_by_safetensors_get_the_umask_mode(tmp_path, umask, mask):
    """safetensors' save_file makes 0600 files; the artefact, export, checkpoint and cache writers widen them."""
    import torch
    from safetensors.torch import save_file

    from draftsmith.common.io import process_umask, umask_modes
    from draftsmith.inference.artefacts.checkpoint import write_export

    umask(mask)
    assert process_umask() == mask
    (tmp_path / "dir" / "sub").mkdir(parents=True)
    for name in ("dir/a.safetensors", "dir/sub/b.safetensors", "one.safetensors"):
        save_file({"w": torch.zeros(2)}, str(tmp_path / name))
    umask_modes(tmp_path / "dir")
    umask_modes(tmp_path / "one.safetensors")
    export = write_export(tmp_path / "export", {"w": torch.zeros(2)}, {"model_type": "llama"}, "eagle")
    for path in (*tmp_path.rglob("*.safetensors"), export / "config.json"):
        assert mode(path) == 0o666 & ~mask, path


def test_umask_modes_skips_a_file_that_vanishes_while_the_folder_is_walked(tmp_path, monkeypatch):
    """Another rank's temporary file in a shared checkpoint folder, seen and then renamed away before its mode is
    read, is skipped: the walk finishes and fixes the files that stay (a ZeRO-2 checkpoint once failed there)."""
    from pathlib import Path

    from draftsmith.common.io import process_umask, umask_modes

    stays, goes = tmp_path / "weights.bin", tmp_path / ".tmpabc123"
    for f in (stays, goes):
        f.write_bytes(b"x")
        f.chmod(0o600)
    real = Path.is_file

    def seen_then_vanishing(self):  # the other rank renames its file right after this one saw it
        seen = real(self)
        if self == goes and seen:
            goes.unlink()
        return seen

    monkeypatch.setattr(Path, "is_file", seen_then_vanishing)
    umask_modes(tmp_path)
    assert stays.stat().st_mode & 0o777 == 0o666 & ~process_umask()
