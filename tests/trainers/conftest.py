"""A character-level chat tokenizer and a tiny random target/draft pair sharing it (seconds to build)."""

from __future__ import annotations

import pytest

from draftsmith.data.tiny_models import char_tokenizer, random_model


@pytest.fixture
def tokenizer():
    return char_tokenizer()


@pytest.fixture
def pair():
    """(target, draft): two different random llama models on the same 128-entry vocabulary."""
    return random_model("llama", seed=0, layers=2), random_model("llama", seed=1, layers=1)
