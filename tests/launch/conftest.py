"""A tiny random target/draft pair, a character tokenizer and a chat dataset written to disk for recipe runs."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models

from draftsmith.data.tiny_models import random_model

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3, matching tiny_config's pad/bos/eos
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def char_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Printable ASCII + newline, one token per character, with a chat template (vocab 104 < 128)."""
    vocab = {c: i for i, c in enumerate(dict.fromkeys(SPECIALS + list(string.printable[:95]) + ["\n"]))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_pair(root: Path) -> dict[str, Path]:
    """target/, draft/ (HF model directories with the tokenizer) and data.jsonl (48 chat rows) under ``root``."""
    tokenizer = char_tokenizer()
    paths = {"target": root / "target", "draft": root / "draft", "dataset": root / "data.jsonl"}
    for name, model in (("target", random_model("llama", seed=0, layers=2)), ("draft", random_model("llama", seed=1, layers=1))):
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                      {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]}
        for i in range(48)
    ]
    paths["dataset"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> dict[str, Path]:
    return write_pair(tmp_path_factory.mktemp("tiny_pair"))
