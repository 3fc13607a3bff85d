"""A tiny byte-level BPE tokenizer with a chat template, built offline in milliseconds."""

from __future__ import annotations

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, how are you today? I am fine, thank you.",
    "Speculative decoding drafts a few tokens and the target verifies them in one forward pass.",
    "Write a short poem about the sea. The sea is blue and deep.",
]
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]

# Special role tokens, an eos after every message, a bos in front.
ROLE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|>{% elif m['role'] == 'user' %}<|user|>{% else %}<|assistant|>{% endif %}"
    "{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# ChatML: plain-text role names, a newline after the end-of-turn token, a default system prompt.
CHATML_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(chat_template: str | None = ROLE_TEMPLATE, chatml: bool = False):
    specials = ["<|pad|>", "<|bos|>", "<|eos|>"] + (["<|im_start|>", "<|im_end|>"] if chatml else ROLE_TOKENS)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(SENTENCES, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|bos|>",
        eos_token="<|im_end|>" if chatml else "<|eos|>",
        pad_token="<|pad|>",
        extra_special_tokens=specials[3:],
        chat_template=chat_template,
    )


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def chatml_tokenizer():
    return build_tokenizer(CHATML_TEMPLATE, chatml=True)


@pytest.fixture(scope="session")
def make_tokenizer():
    """``make_tokenizer(chat_template=..., chatml=False)`` for tests that need their own template."""
    return build_tokenizer


@pytest.fixture(scope="module")
def tok():
    """The character tokenizer with a chat template (pairs with ``model``)."""
    from draftsmith.data.tiny_models import char_tokenizer

    return char_tokenizer()


@pytest.fixture(scope="module")
def model():
    """A 2-layer random llama over ``tok``'s vocabulary, run on one thread."""
    import torch

    from draftsmith.data.tiny_models import random_model

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield random_model("llama", seed=0, layers=2)
    torch.set_num_threads(before)
