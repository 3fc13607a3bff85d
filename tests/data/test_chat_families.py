"""Loss masks under each target family's turn format: the trained tokens are exactly the assistant's (its content and
the template's end of turn), never a role header, a system prompt, a user turn or a generation prompt.

The templates render each family's published chat format (the released instruct models' templates, reduced to
their turn syntax): Llama 3's headers, Qwen2's ChatML with its default system prompt, Qwen3's ChatML whose history
drops earlier answers' reasoning (``<think>...</think>``), Gemma 3's turns (the one draftsmith gives the imported
base model, ``data.model_import.GEMMA3_TURNS``), OLMo2's Tulu roles and Mistral's ``[INST]`` blocks."""

from __future__ import annotations

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from draftsmith.data.chat import IGNORE_INDEX, messages_ids
from draftsmith.data.model_import import GEMMA3_TURNS

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN2 = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3 = (  # an earlier answer loses its reasoning; the last one keeps it
    "{% for m in messages %}{% set content = m['content'] %}"
    "{% if m['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
OLMO2 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] }}"
    "{{ eos_token }}\n{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
# family -> (template, its special tokens, bos, eos, the end of an assistant turn as rendered)
FAMILIES = {
    "llama": (LLAMA3, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>",
              "<|eot_id|>"),
    "qwen2": (QWEN2, ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|im_end|>\n"),
    "qwen3": (QWEN3, ["<|im_start|>", "<|im_end|>", "<think>", "</think>"], None, "<|im_end|>", "<|im_end|>\n"),
    "gemma3": (GEMMA3_TURNS, ["<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", "<end_of_turn>\n"),
    "olmo2": (OLMO2, ["<|system|>", "<|user|>", "<|assistant|>"], "<|endoftext|>", "<|endoftext|>",
              "<|endoftext|>\n"),
    "mistral": (MISTRAL, ["[INST]", "[/INST]"], "<s>", "</s>", "</s>"),
}
TEXT = ["The quick brown fox jumps over the lazy dog.", "Hello world, how are you today? I am fine, thank you.",
        "Write a short poem about the sea. The sea is blue and deep.", "Let me think: two and two make four."]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello world"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Write a poem about the sea."},
    {"role": "assistant", "content": "The sea is blue and deep."},
]


def family_tokenizer(family: str) -> transformers.PreTrainedTokenizerFast:
    template, specials, bos, eos, _ = FAMILIES[family]
    named = [t for t in ("<pad>", bos, eos) if t is not None]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                          special_tokens=list(dict.fromkeys(named + specials)),
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos,
                                                pad_token="<pad>", extra_special_tokens=specials,
                                                chat_template=template)


def trained_text(tokenizer, messages) -> list[str]:
    """The decoded runs of labelled tokens."""
    ids, labels = messages_ids(tokenizer, messages)
    runs, run = [], []
    for token, label in zip(ids, labels):
        if label != IGNORE_INDEX:
            run.append(token)
        elif run:
            runs, run = runs + [run], []
    return [tokenizer.decode(r) for r in runs + ([run] if run else [])]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_familys_turns_train_exactly_the_assistants_tokens(family):
    tokenizer = family_tokenizer(family)
    end = FAMILIES[family][4]
    messages = CONVERSATION if family != "mistral" else CONVERSATION[1:]  # Mistral's format has no system turn
    assert trained_text(tokenizer, messages) == ["Hello!" + end, "The sea is blue and deep." + end]
    ids, labels = messages_ids(tokenizer, messages)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tokenize=False)  # the template's render


def test_qwen3_trains_the_last_answers_reasoning_and_never_a_rewritten_earlier_answer():
    """Qwen3's history drops an earlier answer's reasoning, so that answer renders differently in the conversation
    than when it was the last turn: its span is dropped (never stretched over other tokens); the last answer trains
    with its ``<think>`` block."""
    tokenizer = family_tokenizer("qwen3")
    messages = [{"role": "user", "content": "Hello world"},
                {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nHello!"},
                {"role": "user", "content": "Write a poem about the sea."},
                {"role": "assistant", "content": "<think>\nthe sea\n</think>\n\nThe sea is blue and deep."}]
    runs = trained_text(tokenizer, messages)
    assert runs[-1] == "<think>\nthe sea\n</think>\n\nThe sea is blue and deep.<|im_end|>\n"
    assert all(r in ("Hello!<|im_end|>\n", runs[-1]) for r in runs)  # at most the earlier answer as rendered
