"""A malformed GGUF file is refused in one line before any loader reads it (draftsmith.common.models.check_gguf):
a 5-byte file used to end in a ``struct.error`` traceback from transformers' reader."""

from __future__ import annotations

import struct

import gguf_fixture as gg
import pytest

from draftsmith.common.errors import DraftsmithError
from draftsmith.common.models import check_gguf, load_model, load_tokenizer


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> bytes:
    return gg.write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf").path.read_bytes()


def _field(data: bytes, offset: int, fmt: str, value) -> bytes:
    return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt):]


DAMAGES = {
    "five bytes": (lambda d: b"GGUF\x00", "shorter than a GGUF header"),
    "empty": (lambda d: b"", "shorter than a GGUF header"),
    "bad magic": (lambda d: b"GGML" + d[4:], "GGUF magic"),
    "version 1": (lambda d: _field(d, 4, "<I", 1), "GGUF version 1"),
    "huge version": (lambda d: _field(d, 4, "<I", 1007536302), "GGUF version"),
    "2**63 entries": (lambda d: _field(d, 16, "<Q", 2**63), "more than its"),
    "2**40 tensors": (lambda d: _field(d, 8, "<Q", 2**40), "more than its"),
    "header cut": (lambda d: d[:100], "more than its"),
    "half": (lambda d: d[: len(d) // 2], "past the end"),
    "ten bytes short": (lambda d: d[:-10], "past the end"),
}


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_a_damaged_gguf_file_is_one_line_saying_where_it_breaks(name, source, tmp_path):
    damage, words = DAMAGES[name]
    bad = tmp_path / "model.gguf"
    bad.write_bytes(damage(source))
    for read in (check_gguf, load_model, load_tokenizer):
        with pytest.raises(DraftsmithError) as err:
            read(bad)
        text = str(err.value)
        assert "\n" not in text and str(bad) in text and words in text, text


def test_a_whole_gguf_file_passes_the_check(source, tmp_path):
    good = tmp_path / "model.gguf"
    good.write_bytes(source)
    assert check_gguf(good) == good


def test_importing_a_named_target_into_a_read_only_home_is_one_line(tmp_path, monkeypatch):
    """``smollm2-135m`` is imported into ``$DRAFTSMITH_HOME/models`` on first use: a home it cannot write is one
    line naming the directory, not a PermissionError traceback."""
    from draftsmith.common.errors import OutputError
    from draftsmith.common.models import resolve_model_path

    def read_only_home(name):
        raise PermissionError(13, "Permission denied", str(tmp_path / "models" / "smollm2-135m"))

    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    monkeypatch.setattr("draftsmith.data.model_import.ensure_imported", read_only_home)
    with pytest.raises(OutputError) as err:
        resolve_model_path("smollm2-135m")
    assert str(err.value).startswith(f"cannot write {tmp_path / 'models'}") and "permission denied" in str(err.value)
