"""Fixtures for the evaluator tests: a small byte-level BPE chat tokenizer and tiny random models
that use it, saved to temporary directories."""

from __future__ import annotations

import json

import pytest

from draftsmith.data.tiny_models import random_model
from draftsmith.data.tokenizer import train_tokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, how are you today? I am fine, thank you.",
    "Speculative decoding drafts a few tokens and the target verifies them in one forward pass.",
    "def add(a, b):\n    return a + b\n",
    "What is 12 plus 30? The answer is 42.",
]

QUESTIONS = [
    {"question_id": 1, "category": "chat", "turns": ["Hello, how are you?", "Tell me about the fox."]},
    {"question_id": 2, "category": "code", "turns": ["def add(a, b):"]},
    {"question_id": 3, "category": "math", "turns": ["What is 12 plus 30?"], "reference": ["42"]},
]


@pytest.fixture(scope="session")
def chat_tokenizer():
    return train_tokenizer(SENTENCES * 4, vocab_size=300, min_frequency=1, model_max_length=512)


@pytest.fixture(scope="session")
def lm_pair(chat_tokenizer):
    """(target, weak draft) tiny Llama models over the chat tokenizer's vocabulary."""
    vocab = len(chat_tokenizer)
    target = random_model("llama", seed=0, vocab_size=vocab, layers=2, hidden=48)
    draft = random_model("llama", seed=1, vocab_size=vocab, layers=1, hidden=32)
    return target, draft


@pytest.fixture(scope="session")
def questions_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("questions") / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path
