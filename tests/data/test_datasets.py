"""Loading user datasets from json / jsonl / parquet: formats, bad rows, thresholds and file errors."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers

from draftsmith.common.errors import ConfigError, DataError
from draftsmith.data.chat import IGNORE_INDEX
from draftsmith.data.datasets import examples_to_dataset, load_chat_dataset, read_rows
from draftsmith.data.tiny_models import random_model

ALPACA = [
    {"instruction": "Add the numbers", "input": "2 and 3", "output": "The sum is 5."},
    {"instruction": "Say hello", "input": "", "output": "Hello world!"},
]
SHAREGPT = [
    {"conversations": [{"from": "human", "value": "How are you?"}, {"from": "gpt", "value": "I am fine."}]},
    {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "human", "value": "A poem?"},
            {"from": "gpt", "value": "The sea is deep."},
        ]
    },
]
MESSAGES = [
    {"messages": [{"role": "user", "content": "Name a fox."}, {"role": "assistant", "content": "The quick fox."}]},
    {"messages": [{"role": "user", "content": "Name a dog."}, {"role": "assistant", "content": "The lazy dog."}]},
]
ANSWERS = {
    "alpaca": ["The sum is 5.", "Hello world!"],
    "sharegpt": ["I am fine.", "Hello!The sea is deep."],
    "messages": ["The quick fox.", "The lazy dog."],
}


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_json(path, rows):
    path.write_text(json.dumps(rows, indent=2))
    return path


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


WRITERS = {"jsonl": write_jsonl, "json": write_json, "parquet": write_parquet}
ROWS = {"alpaca": ALPACA, "sharegpt": SHAREGPT, "messages": MESSAGES}


def _answers(tok, ds):
    """Decoded assistant tokens of every example, eos markers removed."""
    return [tok.decode([t for t in ex["labels"] if t != IGNORE_INDEX]).replace("<|eos|>", "") for ex in ds]


@pytest.mark.parametrize("ext", ["jsonl", "json", "parquet"])
@pytest.mark.parametrize("fmt", ["alpaca", "sharegpt", "messages"])
def test_each_format_and_file_type_auto_detected(tmp_path, tokenizer, ext, fmt):
    path = WRITERS[ext](tmp_path / f"train.{ext}", ROWS[fmt])
    ds, report = load_chat_dataset(path, tokenizer, max_length=256, progress=False)
    assert report.format == fmt
    assert (report.total, report.kept, report.skipped) == (2, 2, 0)
    assert report.unit == ("line" if ext == "jsonl" else "record")
    assert ds.column_names == ["input_ids", "labels", "attention_mask"]
    assert _answers(tokenizer, ds) == ANSWERS[fmt]
    assert report.tokens == sum(len(x) for x in ds["input_ids"])


def test_explicit_format_matches_auto(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", ALPACA)
    auto, _ = load_chat_dataset(path, tokenizer, progress=False)
    explicit, report = load_chat_dataset(path, tokenizer, fmt="alpaca", progress=False)
    assert report.format == "alpaca"
    assert auto["input_ids"] == explicit["input_ids"] and auto["labels"] == explicit["labels"]


def test_alpaca_user_turn_joins_instruction_and_input(tmp_path, tokenizer):
    ds, _ = load_chat_dataset(write_jsonl(tmp_path / "a.jsonl", ALPACA), tokenizer, progress=False)
    text = tokenizer.decode(ds[0]["input_ids"])
    assert "<|user|>Add the numbers\n\n2 and 3<|eos|><|assistant|>The sum is 5.<|eos|>" in text
    assert "<|user|>Say hello<|eos|>" in tokenizer.decode(ds[1]["input_ids"])


def test_json_file_holding_json_lines_uses_line_numbers(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "lines.json", [*MESSAGES * 20, "{broken", *MESSAGES * 20])
    ds, report = load_chat_dataset(path, tokenizer, progress=False)
    assert report.unit == "line"
    assert (report.total, report.kept) == (81, 80)
    assert report.skips["invalid_json"].first_line == 41


def test_auto_detection_skips_bad_first_rows(tmp_path, tokenizer):
    rows = ["not json", {"instruction": "Q", "output": ""}, *ALPACA * 30]
    _, report = load_chat_dataset(write_jsonl(tmp_path / "a.jsonl", rows), tokenizer, progress=False)
    assert report.format == "alpaca"
    assert report.first_bad_line == 1
    assert report.skips["empty_text"].first_line == 2


def test_malformed_rows_counted_per_reason_with_first_line(tmp_path, tokenizer, caplog):
    good = MESSAGES[0]
    bad = {
        5: '{"messages": [{"role": "user", "content": "Q"}',  # invalid JSON
        9: {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant"}]},  # missing field
        12: {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "A"}]},  # empty text
        20: {"messages": [{"role": "user", "content": ["Q"]}, {"role": "assistant", "content": "A"}]},  # wrong type
        33: {"messages": [{"role": "user", "content": "Q"}, {"role": "robot", "content": "A"}]},  # unknown role
        47: {"messages": [{"role": "user", "content": "Q"}]},  # no assistant turn
        60: [1, 2, 3],  # not an object
        71: {"prompt": "Q", "completion": "A"},  # no messages field
    }
    rows = [bad.get(n, good) for n in range(1, 201)]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="draftsmith.data.datasets"):
        ds, report = load_chat_dataset(path, tokenizer, progress=False)
    assert (report.total, report.kept, report.skipped) == (200, 192, 8)
    assert len(ds) == 192
    firsts = {cat: (s.count, s.first_line) for cat, s in report.skips.items()}
    assert firsts == {
        "invalid_json": (1, 5),
        "missing_field": (2, 9),
        "empty_text": (1, 12),
        "wrong_type": (2, 20),
        "unknown_role": (1, 33),
        "no_assistant": (1, 47),
    }
    assert report.skips["unknown_role"].reason.startswith("unknown role 'robot'")
    assert report.first_bad_line == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "skipped 8 of 200" in warnings[0] and "first at line 5" in warnings[0]
    json.dumps(report.to_dict())  # manifest-ready


def test_record_index_for_json_list_and_parquet(tmp_path, tokenizer):
    rows = [*ALPACA * 15, {"instruction": "Q", "input": None, "output": None}, *ALPACA * 15]
    for path in (write_json(tmp_path / "a.json", rows), write_parquet(tmp_path / "a.parquet", rows)):
        _, report = load_chat_dataset(path, tokenizer, progress=False)
        assert report.unit == "record"
        assert report.skips["missing_field"].first_line == 31
        assert report.kept == 60


def test_too_long_rows_skipped(tmp_path, tokenizer):
    long_q = {"instruction": "Write a short poem about the sea. " * 20, "output": "The sea."}
    path = write_jsonl(tmp_path / "a.jsonl", [*ALPACA * 10, long_q])
    _, report = load_chat_dataset(path, tokenizer, max_length=48, max_bad_fraction=0.1, progress=False)
    assert report.skips["too_long"].first_line == 21
    with pytest.raises(DataError, match="raise max_length"):
        load_chat_dataset(path, tokenizer, max_length=48, max_bad_fraction=0.01, progress=False)


def test_truncated_rows_counted(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", SHAREGPT)
    ds, report = load_chat_dataset(path, tokenizer, max_length=20, progress=False)
    assert report.truncated >= 1
    assert max(len(x) for x in ds["input_ids"]) == 20


def test_over_threshold_error_names_fraction_line_and_fix(tmp_path, tokenizer):
    rows = [*MESSAGES * 4, {"messages": []}, *MESSAGES, {"messages": "x"}]  # 2 bad of 12
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as err:
        load_chat_dataset(path, tokenizer, progress=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert "2 of 12 rows (16.7%)" in msg
    assert "max_bad_fraction=0.05" in msg
    assert "first at line 9" in msg
    assert "Fix or drop those rows" in msg
    _, report = load_chat_dataset(path, tokenizer, max_bad_fraction=0.2, progress=False)
    assert report.kept == 10


def test_wrong_explicit_format_fails_clearly(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", ALPACA)
    for limit in (0.05, 1.0):  # nothing usable is an error whatever the threshold
        with pytest.raises(DataError, match=r"none of the 2 rows.*missing field 'conversations'.*detected: sharegpt"):
            load_chat_dataset(path, tokenizer, fmt="sharegpt", max_bad_fraction=limit, progress=False)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: d / "nope.jsonl", "not found"),
        (lambda d: (d / "data.csv").write_text("a,b\n") and d / "data.csv", "unsupported dataset file type '.csv'"),
        (lambda d: (d / "e.jsonl").write_text("") or d / "e.jsonl", "is empty"),
        (lambda d: (d / "blank.jsonl").write_text("\n \n") and d / "blank.jsonl", "has no rows"),
        (lambda d: (d / "e.json").write_text("[]") and d / "e.json", "has no rows"),
        (lambda d: (d / "b.json").write_text('[{"a": 1},') and d / "b.json", "not valid JSON"),
        (lambda d: (d / "b.parquet").write_text("garbage") and d / "b.parquet", "not a readable parquet"),
        (lambda d: d, "is a directory"),
        (lambda d: write_jsonl(d / "p.jsonl", [{"prompt": "Q"}]), "cannot tell the format"),
    ],
    ids=["missing", "extension", "empty", "blank", "empty-list", "broken-json", "bad-parquet", "directory", "format"],
)
def test_file_problems_are_one_line_data_errors(tmp_path, tokenizer, make, match):
    path = make(tmp_path)
    with pytest.raises(DataError, match=match) as err:
        load_chat_dataset(path, tokenizer, progress=False)
    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_bad_arguments(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", ALPACA)
    with pytest.raises(DataError, match="unknown dataset format 'csv'"):
        load_chat_dataset(path, tokenizer, fmt="csv")
    with pytest.raises(ConfigError, match="max_bad_fraction"):
        load_chat_dataset(path, tokenizer, max_bad_fraction=1.5)
    with pytest.raises(ConfigError, match="max_length"):
        load_chat_dataset(path, tokenizer, max_length=0)


def test_read_rows_numbers_lines(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [ALPACA[0], "", ALPACA[1]])
    assert [n for n, _ in read_rows(path)] == [1, 3]


def test_plain_text_file(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"text": "The quick brown fox."}, {"text": "Hello world."}])
    ds, report = load_chat_dataset(path, tokenizer, progress=False)
    assert report.format == "text"
    for ex in ds:
        assert ex["labels"] == ex["input_ids"]
        assert ex["input_ids"][0] == tokenizer.bos_token_id and ex["input_ids"][-1] == tokenizer.eos_token_id
    assert report.label_tokens == report.tokens


def test_plain_text_needs_no_chat_template(tmp_path, make_tokenizer):
    tok = make_tokenizer(chat_template=None)
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"text": "fox"}])
    ds, _ = load_chat_dataset(path, tok, progress=False)
    assert len(ds) == 1
    with pytest.raises(DataError, match="no chat template"):
        load_chat_dataset(write_jsonl(tmp_path / "chat.jsonl", MESSAGES), tok, progress=False)


def test_examples_to_dataset_mixes_chat_and_text(tokenizer):
    examples = [
        MESSAGES[0],
        {"text": "The lazy dog."},
        *MESSAGES * 10,
        {"messages": [{"role": "user", "content": "Q"}]},
    ]
    ds, report = examples_to_dataset(examples, tokenizer, max_length=128, max_bad_fraction=0.1, progress=False)
    assert (report.total, report.kept, report.unit) == (23, 22, "example")
    assert report.skips["no_assistant"].first_line == 23
    assert ds[1]["labels"] == ds[1]["input_ids"]
    assert IGNORE_INDEX in ds[0]["labels"]
    with pytest.raises(DataError, match="no examples"):
        examples_to_dataset([], tokenizer)


def test_batches_train_a_tiny_model(tmp_path, tokenizer):
    """The dataset collates with a stock collator and gives a finite loss on assistant tokens only."""
    ds, _ = load_chat_dataset(write_jsonl(tmp_path / "a.jsonl", SHAREGPT), tokenizer, progress=False)
    collate = transformers.DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
    batch = collate([ds[0], ds[1]])
    assert batch["input_ids"].shape == batch["labels"].shape  # [2, T]
    model = random_model("llama", vocab_size=len(tokenizer))
    loss = model(**batch).loss
    assert torch.isfinite(loss)
