"""The built-in byte-level BPE tokenizer with a chat template, trained deterministically on the shipped corpus.

Special tokens have fixed ids: ``<|pad|>`` = 0, ``<|bos|>`` = 1, ``<|eos|>`` = 2, then the role tokens
``<|system|>``, ``<|user|>``, ``<|assistant|>``. The chat template renders::

    <|bos|><|user|>\\n{content}<|eos|>\\n<|assistant|>\\n{content}<|eos|>\\n

so every assistant answer ends with EOS, and ``add_generation_prompt`` appends ``<|assistant|>\\n``.
``tokenizer(text)`` prepends BOS (like Llama tokenizers); ``apply_chat_template`` does not add a second one.
Plain-text training examples are encoded as BOS + text + EOS (:func:`encode_example`).
"""

from __future__ import annotations

from collections.abc import Iterable

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
ROLES = ("system", "user", "assistant")
ROLE_TOKENS = tuple(f"<|{role}|>" for role in ROLES)
SPECIAL_TOKENS = (PAD, BOS, EOS, *ROLE_TOKENS)  # ids 0, 1, 2, 3, 4, 5

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role ' + message['role'] + '; use system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def train_bpe(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> Tokenizer:
    """A raw byte-level BPE :class:`tokenizers.Tokenizer` trained on ``texts`` (deterministic in its input).

    All 256 byte symbols are in the alphabet, so any text encodes without unknown tokens."""
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 256} (specials + 256 bytes)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def wrap_tokenizer(tok: Tokenizer, model_max_length: int = 2048) -> transformers.PreTrainedTokenizerFast:
    """Wrap a raw tokenizer as a :class:`transformers.PreTrainedTokenizerFast` with specials and chat template."""
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 4096, model_max_length: int = 2048, min_frequency: int = 2
) -> transformers.PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``texts`` and wrap it (see the module docstring for the token layout)."""
    tokenizer = wrap_tokenizer(train_bpe(texts, vocab_size, min_frequency), model_max_length)
    check_special_ids(tokenizer)
    return tokenizer


def check_special_ids(tokenizer: transformers.PreTrainedTokenizerBase) -> None:
    """Raise if the special tokens do not have ids 0..5 in :data:`SPECIAL_TOKENS` order."""
    ids = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise ValueError(f"special token ids are {ids}, expected {list(range(len(SPECIAL_TOKENS)))}")


def render_chat(tokenizer: transformers.PreTrainedTokenizerBase, messages: list[dict], **kwargs) -> str:
    """The chat template applied to ``messages`` as a string (BOS included)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def encode_example(tokenizer: transformers.PreTrainedTokenizerBase, example: dict) -> list[int]:
    """Token ids of one corpus example: chat template for ``messages``, BOS + text + EOS for ``text``."""
    if "messages" in example:
        return tokenizer(render_chat(tokenizer, example["messages"]), add_special_tokens=False)["input_ids"]
    ids = tokenizer(example["text"], add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids, tokenizer.eos_token_id]


def encode_examples(tokenizer: transformers.PreTrainedTokenizerBase, examples: list[dict]) -> list[list[int]]:
    """:func:`encode_example` over a list, batched through the fast tokenizer."""
    texts = [render_chat(tokenizer, e["messages"]) if "messages" in e else e["text"] for e in examples]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return [ids if "messages" in e else [bos, *ids, eos] for e, ids in zip(examples, encoded)]
