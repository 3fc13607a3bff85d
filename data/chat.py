"""Chat formatting: user rows to OpenAI-style messages, and messages to tokenized training examples.

Three row forms are understood (plus plain text rows):

- Alpaca:   ``{"instruction": str, "input": str (optional), "output": str, "system": str (optional)}``
- ShareGPT: ``{"conversations": [{"from": "human"|"gpt"|"system"|"user"|"assistant", "value": str}, ...]}``
- OpenAI:   ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}``
- text:     ``{"text": str}`` — a plain corpus row, trained on every token.

Every chat row becomes ``[{"role": ..., "content": ...}, ...]``; a row that cannot raises :class:`BadRow`
with a short category (counted by the dataset loader) and a reason a person can act on.

Tokenization renders the tokenizer's own chat template and finds the assistant tokens by rendering growing
prefixes of the conversation and diffing token sequences, so it works for any template (no
``{% generation %}`` block needed). Labels are the input ids on assistant tokens (content plus whatever the
template closes the turn with, e.g. the eos) and -100 everywhere else.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from draftsmith.common.errors import DataError

IGNORE_INDEX = -100
# A byte-pair merge across the generation-prompt / answer boundary re-tokenizes at most the last pre-token
# of the prompt: the renders may disagree on that many final prompt tokens and the span is still trusted.
MERGE_SLACK = 3
ROLES = ("system", "user", "assistant")
FORMATS = ("alpaca", "sharegpt", "messages", "text")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}

# Bad-row categories, in the order reports list them.
MISSING_FIELD = "missing_field"
EMPTY_TEXT = "empty_text"
WRONG_TYPE = "wrong_type"
UNKNOWN_ROLE = "unknown_role"
NO_ASSISTANT = "no_assistant"
INVALID_JSON = "invalid_json"
TEMPLATE_ERROR = "template_error"
TOO_LONG = "too_long"
CATEGORIES = (MISSING_FIELD, EMPTY_TEXT, WRONG_TYPE, UNKNOWN_ROLE, NO_ASSISTANT, INVALID_JSON, TEMPLATE_ERROR, TOO_LONG)


class BadRow(DataError):
    """One unusable row: ``category`` is one of :data:`CATEGORIES`, the message says what is wrong."""

    def __init__(self, category: str, reason: str):
        super().__init__(reason)
        self.category = category
        self.reason = reason


# ----------------------------------------------------------------------------------------------- normalisation


def detect_format(row: Any) -> str | None:
    """The format a row is written in, judged by its keys, or None when no known key is present."""
    if not isinstance(row, Mapping):
        return None
    for key, fmt in (
        ("messages", "messages"),
        ("conversations", "sharegpt"),
        ("instruction", "alpaca"),
        ("text", "text"),
    ):
        if key in row:
            return fmt
    return None


def _text_field(row: Mapping, key: str, *, required: bool = True, where: str = "") -> str | None:
    """``row[key]`` as a non-empty string; None if optional and absent/null/empty; BadRow otherwise."""
    value = row.get(key)
    if value is None:
        if required:
            raise BadRow(MISSING_FIELD, f"missing field '{key}'{where}")
        return None
    if not isinstance(value, str):
        raise BadRow(WRONG_TYPE, f"field '{key}'{where} is {type(value).__name__}, expected a string")
    if not value.strip():
        if required:
            raise BadRow(EMPTY_TEXT, f"field '{key}'{where} is empty")
        return None
    return value


def _require_mapping(row: Any) -> Mapping:
    if not isinstance(row, Mapping):
        raise BadRow(WRONG_TYPE, f"row is {type(row).__name__}, expected an object")
    return row


def _check_conversation(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRow(NO_ASSISTANT, "conversation has no assistant turn to train on")
    return messages


def _normalize_alpaca(row: Mapping) -> list[dict[str, str]]:
    instruction = _text_field(row, "instruction")
    extra = _text_field(row, "input", required=False)
    output = _text_field(row, "output")
    system = _text_field(row, "system", required=False)
    user = instruction if extra is None else f"{instruction}\n\n{extra}"
    head = [{"role": "system", "content": system}] if system else []
    return head + [{"role": "user", "content": user}, {"role": "assistant", "content": output}]


def _turns(row: Mapping, key: str) -> list:
    turns = row.get(key)
    if turns is None:
        raise BadRow(MISSING_FIELD, f"missing field '{key}'")
    if not isinstance(turns, (list, tuple)):
        raise BadRow(WRONG_TYPE, f"field '{key}' is {type(turns).__name__}, expected a list")
    if not turns:
        raise BadRow(EMPTY_TEXT, f"field '{key}' is an empty list")
    return list(turns)


def _normalize_sharegpt(row: Mapping) -> list[dict[str, str]]:
    system = _text_field(row, "system", required=False)
    messages = [{"role": "system", "content": system}] if system else []
    for i, turn in enumerate(_turns(row, "conversations")):
        where = f" in conversations[{i}]"
        if not isinstance(turn, Mapping):
            raise BadRow(WRONG_TYPE, f"conversations[{i}] is {type(turn).__name__}, expected an object")
        speaker = _text_field(turn, "from", where=where)
        role = SHAREGPT_ROLES.get(speaker.strip().lower())
        if role is None:
            known = ", ".join(SHAREGPT_ROLES)
            raise BadRow(UNKNOWN_ROLE, f"unknown speaker '{speaker}'{where}; expected one of {known}")
        messages.append({"role": role, "content": _text_field(turn, "value", where=where)})
    return _check_conversation(messages)


def _normalize_messages(row: Mapping) -> list[dict[str, str]]:
    messages = []
    for i, turn in enumerate(_turns(row, "messages")):
        where = f" in messages[{i}]"
        if not isinstance(turn, Mapping):
            raise BadRow(WRONG_TYPE, f"messages[{i}] is {type(turn).__name__}, expected an object")
        role = _text_field(turn, "role", where=where).strip().lower()
        if role not in ROLES:
            raise BadRow(UNKNOWN_ROLE, f"unknown role '{role}'{where}; expected one of {', '.join(ROLES)}")
        messages.append({"role": role, "content": _text_field(turn, "content", where=where)})
    return _check_conversation(messages)


def normalize_row(row: Any, fmt: str) -> list[dict[str, str]]:
    """OpenAI-style messages from one ``alpaca``, ``sharegpt`` or ``messages`` row; raises :class:`BadRow`."""
    row = _require_mapping(row)
    if fmt == "alpaca":
        return _normalize_alpaca(row)
    if fmt == "sharegpt":
        return _normalize_sharegpt(row)
    if fmt == "messages":
        return _normalize_messages(row)
    raise ValueError(f"normalize_row handles alpaca, sharegpt and messages rows, not {fmt!r}")


def normalize_text(row: Any) -> str:
    """The ``text`` of a plain corpus row; raises :class:`BadRow`."""
    return _text_field(_require_mapping(row), "text")


def normalize_example(row: Any, fmt: str) -> dict[str, Any]:
    """``{"messages": [...]}`` or ``{"text": str}`` from a row of format ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "text":
        return {"text": normalize_text(row)}
    return {"messages": normalize_row(row, fmt)}


# ------------------------------------------------------------------------------------------------ tokenization


def _supports(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


def _template_options(tokenizer: Any) -> dict[str, Any]:
    """Keyword arguments for ``apply_chat_template``: control-token strings inside message contents (a
    literal ``<|eos|>`` in a user's text) are encoded as plain text where transformers supports it."""
    if _supports(tokenizer.apply_chat_template, "sanitize_control_tokens"):
        return {"sanitize_control_tokens": True}
    return {}


def _render_ids(
    tokenizer: Any,
    conversations: Sequence[Sequence[Mapping[str, str]]],
    add_generation_prompt: bool,
    options: Mapping[str, Any],
) -> list[list[int]]:
    """Token ids of the chat template over each conversation (one batched tokenizer call)."""
    if not conversations:
        return []
    out = tokenizer.apply_chat_template(
        [list(c) for c in conversations],
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        return_dict=False,
        **options,
    )
    if isinstance(out, Mapping):  # transformers versions that ignore return_dict=False
        out = out["input_ids"]
    return [[int(i) for i in ids] for ids in out]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _span_start(before: Sequence[int], full: Sequence[int]) -> int | None:
    """Where an assistant turn starts in ``full``, given the render of everything before it plus the generation
    prompt; None when the renders part earlier than a boundary merge explains (the template rendered an
    earlier turn differently), since starting there would put labels on user or system tokens."""
    start = _common_prefix(before, full)
    return start if start >= len(before) - MERGE_SLACK else None


def _require_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise DataError(
            f"tokenizer {name} has no chat template; use a chat tokenizer (e.g. the zoo's) or set "
            "tokenizer.chat_template before formatting chat data"
        )


def assistant_spans(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> tuple[list[int], list[tuple[int, int]]]:
    """The template's token ids for ``messages`` and the ``[start, end)`` token span of every assistant turn.

    Span k starts where the render of the turns before it plus the generation prompt stops agreeing with the
    full render, and ends where the render up to and including turn k stops agreeing with it. Taking common
    prefixes (not assuming one render extends the other) keeps this safe for any template: a byte-pair
    merge across a turn boundary moves a span edge by a token; a template that renders history differently
    from the last turn (e.g. strips reasoning from earlier answers, or marks the latest question) only
    shrinks or drops the affected turn's span (see :func:`_span_start`), never extends it over system, user
    or template tokens. Renders are batched: one tokenizer call for the generation-prompt prefixes and one
    for the rest.
    """
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise BadRow(NO_ASSISTANT, "conversation has no assistant turn to train on")
    options = _template_options(tokenizer)
    throughs = [messages[: k + 1] for k in turns if k + 1 < len(messages)]
    try:
        # k == 0: an assistant-first conversation has no prefix to render (transformers refuses empty chats)
        befores = _render_ids(tokenizer, [messages[:k] for k in turns if k], True, options)
        full, *afters = _render_ids(tokenizer, [messages, *throughs], False, options)
        if len(afters) < len(turns):  # the conversation ends on an assistant turn: its render is the full one
            afters.append(full)
        starts = [0] * (turns[0] == 0) + [_span_start(ids, full) for ids in befores]
        ends = [_common_prefix(ids, full) for ids in afters]
        spans = [(start, end) for start, end in zip(starts, ends) if start is not None and end > start]
    except Exception as err:  # jinja raise_exception(), role-alternation checks, ...
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BadRow(TEMPLATE_ERROR, f"the chat template rejected this conversation: {message}") from err
    if not spans:
        raise BadRow(TEMPLATE_ERROR, "the chat template renders no assistant tokens for this conversation")
    return full, spans


def messages_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> tuple[list[int], list[int]]:
    """Untruncated ``(input_ids, labels)`` of a conversation: labels are the ids on every assistant turn
    (its content plus the template's end-of-turn tokens) and -100 on system, user and template tokens."""
    _require_template(tokenizer)
    ids, spans = assistant_spans(tokenizer, messages)
    labels = [IGNORE_INDEX] * len(ids)
    for start, end in spans:
        labels[start:end] = ids[start:end]
    return ids, labels


def text_ids(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """Untruncated ``(input_ids, labels)`` of a plain text row: bos/eos if the tokenizer has them, every
    token a label. Special-token strings inside the text are encoded as plain text."""
    encoded = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    ids = ([bos] if bos is not None else []) + [int(i) for i in encoded] + ([eos] if eos is not None else [])
    return ids, list(ids)


def truncate(ids: list[int], labels: list[int], max_length: int) -> dict[str, list[int]]:
    """The training example cut to ``max_length`` tokens; raises :class:`BadRow` (``too_long``) when no
    label survives the cut (a row with nothing to learn from would only add a NaN loss)."""
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    ids, labels = ids[:max_length], labels[:max_length]
    if all(label == IGNORE_INDEX for label in labels):
        raise BadRow(TOO_LONG, f"no assistant token within max_length={max_length}")
    return {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)}


def tokenize_messages(tokenizer: Any, messages: Sequence[Mapping[str, str]], max_length: int) -> dict[str, list[int]]:
    """``input_ids``, ``labels`` (ids on assistant tokens, -100 elsewhere) and ``attention_mask`` of a
    conversation, cut to ``max_length`` tokens. Raises :class:`BadRow` for a conversation the template
    rejects or whose assistant tokens all fall past ``max_length``."""
    return truncate(*messages_ids(tokenizer, messages), max_length)


def tokenize_text(tokenizer: Any, text: str, max_length: int) -> dict[str, list[int]]:
    """A plain text row as one sequence (bos/eos if the tokenizer has them), every token a label."""
    return truncate(*text_ids(tokenizer, text), max_length)


def tokenize_example(tokenizer: Any, example: Mapping[str, Any], max_length: int) -> dict[str, list[int]]:
    """Tokenize a normalized ``{"messages": [...]}`` or ``{"text": str}`` example."""
    return truncate(*example_ids(tokenizer, example), max_length)


def example_ids(tokenizer: Any, example: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """Untruncated ``(input_ids, labels)`` of a normalized ``{"messages": [...]}`` or ``{"text": str}`` example."""
    if "messages" in example:
        return messages_ids(tokenizer, example["messages"])
    return text_ids(tokenizer, example["text"])


def build_prompt_ids(tokenizer: Any, turns_so_far: Sequence[Mapping[str, str]]) -> list[int]:
    """Prompt ids for generating the next assistant turn after ``turns_so_far`` (generation prompt added).

    Uses the same rendering as training, so a model sees at inference exactly the prefix it was trained on."""
    _require_template(tokenizer)
    if not turns_so_far:
        raise ValueError("build_prompt_ids needs at least one turn")
    return _render_ids(tokenizer, [turns_so_far], True, _template_options(tokenizer))[0]


def user_prefix_ids(tokenizer: Any, opener: str = "") -> list[int]:
    """The template's token ids before a user turn's content (its system prompt, if it adds one, and the user
    header): what an instruction-tuned model continues with a user's request (Magpie's pre-query template). With
    ``opener``, the ids of that header followed by the first words of the request (tokenized together, so a merge
    across the boundary is the tokenizer's own).

    Rendered with a sentinel content and cut at the sentinel, so the ids are the template's own, not a guess."""
    _require_template(tokenizer)
    sentinel = "\u2063draftsmith-user-content\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": sentinel}], tokenize=False,
                                         add_generation_prompt=False)
    if sentinel not in text:
        raise DataError("the chat template does not render a user turn's content verbatim, so the text before it "
                        "cannot be found; pass prompts instead of synthesizing them")
    return list(tokenizer(text[: text.index(sentinel)] + opener, add_special_tokens=False)["input_ids"])
