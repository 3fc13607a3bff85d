"""The built-in byte-level BPE tokenizer: determinism, special ids, chat template, round trips."""

from __future__ import annotations

import subprocess
import sys

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsmith.data import tokenizer as tk

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "Imagine you are a detective in a Victorian town. Describe the scene of the crime.",
    "toolformer: enabled\nwikipedia('French Revolution')",
] * 3
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture(scope="module")
def zoo_tokenizer():
    return tk.train_tokenizer(TEXTS, vocab_size=320)


def test_special_tokens_have_fixed_ids(zoo_tokenizer):
    assert zoo_tokenizer.convert_tokens_to_ids(list(tk.SPECIAL_TOKENS)) == [0, 1, 2, 3, 4, 5]
    assert (zoo_tokenizer.pad_token_id, zoo_tokenizer.bos_token_id, zoo_tokenizer.eos_token_id) == (0, 1, 2)
    assert len(zoo_tokenizer) == 320
    for role_token in tk.ROLE_TOKENS:  # role tokens are single, unsplittable tokens
        assert len(zoo_tokenizer(role_token, add_special_tokens=False)["input_ids"]) == 1


def test_training_is_deterministic_across_processes(zoo_tokenizer):
    code = (
        "import sys, json\nfrom draftsmith.data import tokenizer as tk\n"
        "texts = json.loads(sys.stdin.read())\n"
        "print(tk.train_tokenizer(texts, vocab_size=320).backend_tokenizer.to_str())"
    )
    import json

    other = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(TEXTS), capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other == zoo_tokenizer.backend_tokenizer.to_str()


def test_chat_template_renders_roles_eos_and_generation_prompt(zoo_tokenizer):
    assert tk.render_chat(zoo_tokenizer, MESSAGES) == (
        "<|bos|><|system|>\nBe brief.<|eos|>\n<|user|>\nWhat is 2+2?<|eos|>\n<|assistant|>\n4<|eos|>\n"
    )
    assert tk.render_chat(zoo_tokenizer, MESSAGES[:2], add_generation_prompt=True).endswith(
        "<|user|>\nWhat is 2+2?<|eos|>\n<|assistant|>\n"
    )
    with pytest.raises(Exception, match="unknown chat role"):
        tk.render_chat(zoo_tokenizer, [{"role": "tool", "content": "x"}])


def test_chat_round_trip_and_assistant_answer_ends_with_eos(zoo_tokenizer):
    ids = tk.encode_example(zoo_tokenizer, {"messages": MESSAGES})
    assert ids[0] == zoo_tokenizer.bos_token_id and ids.count(zoo_tokenizer.bos_token_id) == 1
    assert zoo_tokenizer.decode(ids) == tk.render_chat(zoo_tokenizer, MESSAGES)
    assistant = zoo_tokenizer.convert_tokens_to_ids("<|assistant|>")
    answer = ids[ids.index(assistant) + 1 :]
    assert zoo_tokenizer.decode(answer[: answer.index(zoo_tokenizer.eos_token_id)]) == "\n4"
    prompt = zoo_tokenizer.apply_chat_template(MESSAGES[:2], add_generation_prompt=True, return_dict=False)
    assert ids[: len(prompt)] == prompt  # the generation prompt is a prefix of the full conversation
    assert zoo_tokenizer.decode(ids, skip_special_tokens=True) == "\nBe brief.\n\nWhat is 2+2?\n\n4\n"


def test_plain_text_is_bos_text_eos_and_plain_calls_prepend_bos(zoo_tokenizer):
    ids = tk.encode_example(zoo_tokenizer, {"text": "hear me speak"})
    assert ids[0] == 1 and ids[-1] == 2 and zoo_tokenizer.decode(ids[1:-1]) == "hear me speak"
    assert zoo_tokenizer("hear me speak")["input_ids"] == ids[:-1]


def test_batched_encoding_equals_one_by_one(zoo_tokenizer):
    examples = [{"messages": MESSAGES[1:]}, {"text": TEXTS[2]}, {"messages": MESSAGES}]
    assert tk.encode_examples(zoo_tokenizer, examples) == [tk.encode_example(zoo_tokenizer, e) for e in examples]


def test_saved_tokenizer_reloads_with_auto_tokenizer(zoo_tokenizer, tmp_path):
    zoo_tokenizer.save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == tk.CHAT_TEMPLATE
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token) == (tk.PAD, tk.BOS, tk.EOS)
    for example in ({"messages": MESSAGES}, {"text": TEXTS[0]}):
        assert tk.encode_example(loaded, example) == tk.encode_example(zoo_tokenizer, example)


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80))
def test_any_text_round_trips_without_unknown_tokens(zoo_tokenizer, text):
    ids = zoo_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert all(i >= len(tk.SPECIAL_TOKENS) for i in ids) or any(s in text for s in tk.SPECIAL_TOKENS)
    assert zoo_tokenizer.decode(ids) == text


def test_too_small_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        tk.train_tokenizer(TEXTS, vocab_size=100)
