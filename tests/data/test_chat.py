"""Row normalisation and chat tokenization with an assistant-only loss mask."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsmith.common.errors import DataError
from draftsmith.data.chat import (
    EMPTY_TEXT,
    IGNORE_INDEX,
    MISSING_FIELD,
    NO_ASSISTANT,
    TEMPLATE_ERROR,
    TOO_LONG,
    UNKNOWN_ROLE,
    WRONG_TYPE,
    BadRow,
    build_prompt_ids,
    detect_format,
    normalize_row,
    normalize_text,
    tokenize_messages,
    tokenize_text,
)

# ----------------------------------------------------------------------------------------------- normalisation


def test_alpaca_with_and_without_input():
    assert normalize_row({"instruction": "Add", "input": "2 and 3", "output": "5"}, "alpaca") == [
        {"role": "user", "content": "Add\n\n2 and 3"},
        {"role": "assistant", "content": "5"},
    ]
    for missing_input in ({}, {"input": ""}, {"input": None}, {"input": "  "}):
        row = {"instruction": "Say hi", "output": "hi", **missing_input}
        assert normalize_row(row, "alpaca")[0] == {"role": "user", "content": "Say hi"}


def test_alpaca_system_field_becomes_system_message():
    msgs = normalize_row({"system": "Be brief.", "instruction": "Q", "output": "A"}, "alpaca")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]


def test_sharegpt_roles_are_mapped():
    row = {
        "conversations": [
            {"from": "system", "value": "S"},
            {"from": "human", "value": "H1"},
            {"from": "gpt", "value": "G1"},
            {"from": "user", "value": "H2"},
            {"from": "assistant", "value": "G2"},
        ]
    }
    msgs = normalize_row(row, "sharegpt")
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("system", "S"),
        ("user", "H1"),
        ("assistant", "G1"),
        ("user", "H2"),
        ("assistant", "G2"),
    ]


def test_messages_pass_through():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    assert normalize_row({"messages": msgs, "extra": 1}, "messages") == msgs


@pytest.mark.parametrize(
    "row, fmt, category",
    [
        ({"instruction": "Q"}, "alpaca", MISSING_FIELD),
        ({"output": "A"}, "alpaca", MISSING_FIELD),
        ({"instruction": "Q", "output": None}, "alpaca", MISSING_FIELD),
        ({"instruction": "Q", "output": "   "}, "alpaca", EMPTY_TEXT),
        ({"instruction": "", "output": "A"}, "alpaca", EMPTY_TEXT),
        ({"instruction": "Q", "output": 5}, "alpaca", WRONG_TYPE),
        ({"instruction": "Q", "input": ["x"], "output": "A"}, "alpaca", WRONG_TYPE),
        (["not", "an", "object"], "alpaca", WRONG_TYPE),
        ({"conversations": "hi"}, "sharegpt", WRONG_TYPE),
        ({"conversations": []}, "sharegpt", EMPTY_TEXT),
        ({"conversations": [{"from": "human", "value": "Q"}, "A"]}, "sharegpt", WRONG_TYPE),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "bot", "value": "A"}]}, "sharegpt", UNKNOWN_ROLE),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt"}]}, "sharegpt", MISSING_FIELD),
        ({"conversations": [{"from": "human", "value": "Q"}]}, "sharegpt", NO_ASSISTANT),
        ({"messages": [{"role": "user", "content": "Q"}, {"role": "tool", "content": "A"}]}, "messages", UNKNOWN_ROLE),
        (
            {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ""}]},
            "messages",
            EMPTY_TEXT,
        ),
        ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": 3}]}, "messages", WRONG_TYPE),
        ({"messages": [{"role": "user", "content": "Q"}, {"content": "A"}]}, "messages", MISSING_FIELD),
        (
            {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]},
            "messages",
            NO_ASSISTANT,
        ),
        ({"conversations": [{"from": "human", "value": "Q"}]}, "messages", MISSING_FIELD),
    ],
)
def test_bad_rows_raise_with_category(row, fmt, category):
    with pytest.raises(BadRow) as err:
        normalize_row(row, fmt)
    assert err.value.category == category
    assert "\n" not in str(err.value)


def test_normalize_text():
    assert normalize_text({"text": "plain"}) == "plain"
    with pytest.raises(BadRow) as err:
        normalize_text({"text": ""})
    assert err.value.category == EMPTY_TEXT


def test_detect_format_by_keys():
    assert detect_format({"messages": []}) == "messages"
    assert detect_format({"conversations": []}) == "sharegpt"
    assert detect_format({"instruction": "x", "output": "y"}) == "alpaca"
    assert detect_format({"text": "x"}) == "text"
    assert detect_format({"prompt": "x"}) is None
    assert detect_format("a string") is None


# ------------------------------------------------------------------------------------------------ tokenization


def _enc(tok, text):
    return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def _expected(tok, messages):
    """The role template's ids and labels built by hand: bos, then per message role token, content, eos."""
    role_id = {r: tok.convert_tokens_to_ids(f"<|{r}|>") for r in ("system", "user", "assistant")}
    ids, labels = [tok.bos_token_id], [IGNORE_INDEX]
    for m in messages:
        body = _enc(tok, m["content"]) + [tok.eos_token_id]
        ids += [role_id[m["role"]]] + body
        labels += [IGNORE_INDEX] + (body if m["role"] == "assistant" else [IGNORE_INDEX] * len(body))
    return ids, labels


def _labelled_runs(out):
    """Contiguous runs of labelled positions as lists of token ids."""
    runs, current = [], []
    for label in out["labels"]:
        if label == IGNORE_INDEX:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(label)
    return runs + ([current] if current else [])


SINGLE = [{"role": "user", "content": "How are you today?"}, {"role": "assistant", "content": "I am fine, thank you."}]
MULTI = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello world"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Write a poem about the sea."},
    {"role": "assistant", "content": "The sea is blue and deep."},
]


@pytest.mark.parametrize("messages", [SINGLE, MULTI], ids=["single", "multi"])
def test_mask_covers_exactly_assistant_content_and_eos(tokenizer, messages):
    out = tokenize_messages(tokenizer, messages, max_length=512)
    ids, labels = _expected(tokenizer, messages)
    assert out["input_ids"] == ids
    assert out["labels"] == labels
    assert out["attention_mask"] == [1] * len(ids)
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    runs = _labelled_runs(out)
    assert [tokenizer.decode(r) for r in runs] == [a + "<|eos|>" for a in answers]


def test_chatml_template_masks_system_prompt_and_user(chatml_tokenizer):
    """A different template (text role names, newline after the end-of-turn token, default system prompt)."""
    tok = chatml_tokenizer
    out = tokenize_messages(tok, MULTI[1:], max_length=512)
    runs = [tok.decode(r) for r in _labelled_runs(out)]
    assert runs == ["Hello!<|im_end|>\n", "The sea is blue and deep.<|im_end|>\n"]
    full = tok.apply_chat_template(MULTI[1:], tokenize=False)
    assert full.startswith("<|im_start|>system\nYou are helpful.")
    assert tok.decode(out["input_ids"]) == full


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.text("abc xyz.?", min_size=1, max_size=12), st.text("the fox!", min_size=1, max_size=12)),
        min_size=1,
        max_size=3,
    )
)
def test_mask_property_random_conversations(tokenizer, turns):
    messages = []
    for question, answer in turns:
        if not question.strip() or not answer.strip():
            continue
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    if not messages:
        return
    out = tokenize_messages(tokenizer, messages, max_length=10_000)
    assert (out["input_ids"], out["labels"]) == _expected(tokenizer, messages)


def test_control_token_strings_in_content_stay_text(tokenizer):
    messages = [{"role": "user", "content": "say <|eos|> now"}, {"role": "assistant", "content": "ok"}]
    out = tokenize_messages(tokenizer, messages, max_length=512)
    # eos only closes the two messages; the literal in the user text is plain characters
    assert out["input_ids"].count(tokenizer.eos_token_id) == 2
    assert tokenizer.decode(_labelled_runs(out)[0]) == "ok<|eos|>"


def test_truncation_keeps_prefix_and_cuts_labels(tokenizer):
    full = tokenize_messages(tokenizer, MULTI, max_length=10_000)
    n = len(full["input_ids"]) - 3
    cut = tokenize_messages(tokenizer, MULTI, max_length=n)
    assert cut["input_ids"] == full["input_ids"][:n]
    assert cut["labels"] == full["labels"][:n]
    assert len(cut["attention_mask"]) == n


def test_truncation_before_any_answer_is_too_long(tokenizer):
    with pytest.raises(BadRow) as err:
        tokenize_messages(tokenizer, SINGLE, max_length=4)
    assert err.value.category == TOO_LONG
    assert "max_length=4" in str(err.value)


def test_plain_text_all_tokens_are_labels(tokenizer):
    out = tokenize_text(tokenizer, "The quick brown fox.", max_length=512)
    body = _enc(tokenizer, "The quick brown fox.")
    assert out["input_ids"] == [tokenizer.bos_token_id] + body + [tokenizer.eos_token_id]
    assert out["labels"] == out["input_ids"]
    short = tokenize_text(tokenizer, "The quick brown fox.", max_length=3)
    assert short["input_ids"] == out["input_ids"][:3] == short["labels"]


def test_plain_text_without_bos(make_tokenizer):
    tok = make_tokenizer()
    tok.bos_token = None
    out = tokenize_text(tok, "fox", max_length=512)
    assert out["input_ids"] == _enc(tok, "fox") + [tok.eos_token_id]


def test_build_prompt_ids_is_the_training_prefix(tokenizer):
    """The generation prompt for turn k is exactly what training saw before assistant turn k."""
    train = tokenize_messages(tokenizer, MULTI, max_length=10_000)
    for k in (2, 4):
        prompt = build_prompt_ids(tokenizer, MULTI[:k])
        assert prompt[-1] == tokenizer.convert_tokens_to_ids("<|assistant|>")
        assert train["input_ids"][: len(prompt)] == prompt
        assert train["labels"][len(prompt) - 1] == IGNORE_INDEX
        assert train["labels"][len(prompt)] != IGNORE_INDEX


def test_template_that_rejects_a_conversation(make_tokenizer):
    strict = make_tokenizer(
        "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('Conversation must start with a user turn') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    )
    with pytest.raises(BadRow) as err:
        tokenize_messages(strict, [{"role": "assistant", "content": "hi"}], max_length=64)
    assert err.value.category == TEMPLATE_ERROR
    assert "must start with a user turn" in str(err.value)


def test_missing_chat_template_is_a_data_error(make_tokenizer):
    tok = make_tokenizer(chat_template=None)
    with pytest.raises(DataError, match="no chat template"):
        tokenize_messages(tok, SINGLE, max_length=64)
    with pytest.raises(DataError, match="no chat template"):
        build_prompt_ids(tok, SINGLE[:1])


def test_template_that_rewrites_history_never_labels_user_tokens(make_tokenizer):
    """A template that renders the last turn differently (like reasoning templates that strip history):
    spans shrink to where renders agree, so the final answer is labelled and nothing else leaks in."""
    tok = make_tokenizer(
        "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}{{ eos_token }}"
        "{% else %}<|assistant|>{% if loop.last %}[final] {% endif %}{{ m['content'] }}{{ eos_token }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    out = tokenize_messages(tok, MULTI[1:], max_length=512)
    runs = [tok.decode(r) for r in _labelled_runs(out)]
    assert runs == ["[final] The sea is blue and deep.<|eos|>"]


def test_template_that_marks_the_latest_question_never_labels_it(make_tokenizer):
    """When the prompt render disagrees with the full render inside an earlier turn, the answer is dropped
    rather than labelled from the point of disagreement (which would put the question under the loss)."""
    tok = make_tokenizer(
        "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{% if loop.last %}(now) {% endif %}"
        "{{ m['content'] }}{{ eos_token }}{% else %}<|assistant|>{{ m['content'] }}{{ eos_token }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    # every prompt render marks its last question, which the full render never does: no span is trusted
    with pytest.raises(BadRow) as err:
        tokenize_messages(tok, MULTI[1:], max_length=512)
    assert err.value.category == TEMPLATE_ERROR
    # an assistant-first turn needs no prompt render, so it is still found
    out = tokenize_messages(tok, [{"role": "assistant", "content": "Hello!"}, *MULTI[3:]], max_length=512)
    assert [tok.decode(r) for r in _labelled_runs(out)] == ["<|assistant|>Hello!<|eos|>"]
