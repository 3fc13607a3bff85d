"""A tiny random target with its character tokenizer on disk, for the engine round trip's stand-in engine."""

from __future__ import annotations

import pytest

from draftsmith.data.tiny_models import char_tokenizer, random_model


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine_target") / "target"
    random_model("llama", seed=0, layers=4).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path
