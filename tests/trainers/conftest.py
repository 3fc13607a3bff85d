"""A character-level chat tokenizer and a tiny random target/draft pair sharing it (seconds to build)."""

from __future__ import annotations

import string

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
    chars = SPECIALS + list(string.printable[:95]) + ["\n"]
    vocab = {c: i for i, c in enumerate(dict.fromkeys(chars))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture
def tokenizer():
    return char_tokenizer()


@pytest.fixture
def pair():
    """(target, draft): two different random llama models on the same 128-entry vocabulary."""
    return random_model("llama", seed=0, layers=2), random_model("llama", seed=1, layers=1)
