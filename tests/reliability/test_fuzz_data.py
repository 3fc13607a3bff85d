"""Fuzzed data files (reliability suite; see conftest.py): chat datasets (.jsonl/.json/.parquet rows with missing,
extra and mistyped fields, empty files, binary garbage, truncated files) given to ``draftsmith data generate
--prompts`` and to a recipe's ``--dataset``, and Spec-Bench question files given to ``draftsmith eval --questions``
and ``data generate --prompts``. Every outcome is exit 2 with one ``error:`` line, or an accepted file; model
loading (data generate, eval) or the training itself (recipes) is stubbed away."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROW_FORMATS = ("messages", "sharegpt", "alpaca", "text")


def junk():
    scalars = st.one_of(st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=8), st.booleans(), st.none(),
                        st.sampled_from(["", " ", "user", "assistant", "system", "gpt", "human", "\x00", "\ud7ff"]))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=5)


def good_row(fmt: str, i: int) -> dict:
    question, answer = f"What is {i} plus {i}?", f"{i} plus {i} is {2 * i}."
    return {"messages": {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]},
            "sharegpt": {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]},
            "alpaca": {"instruction": question, "input": "", "output": answer},
            "text": {"text": f"{question} {answer}"}}[fmt]


@st.composite
def bad_row(draw, fmt: str, i: int):
    """A row of ``fmt`` with one thing wrong: a field dropped, added, mistyped, or the row not an object."""
    row = good_row(fmt, i)
    how = draw(st.sampled_from(["drop", "extra", "mistype", "inner", "not an object", "empty turns"]))
    key = draw(st.sampled_from(sorted(row)))
    if how == "drop":
        row.pop(key)
    elif how == "extra":
        row[draw(st.text(min_size=1, max_size=8))] = draw(junk())
    elif how == "mistype":
        row[key] = draw(junk())
    elif how == "inner" and isinstance(row[key], list):
        turn = dict(row[key][draw(st.integers(0, len(row[key]) - 1))])
        turn[draw(st.sampled_from(sorted(turn) + ["name"]))] = draw(junk())
        row[key] = [turn, *row[key][1:]]
    elif how == "empty turns" and isinstance(row[key], list):
        row[key] = []
    else:
        return draw(st.one_of(st.lists(junk(), max_size=2), st.integers(), st.text(max_size=5), st.none()))
    return row


def encode(rows: list, suffix: str) -> bytes:
    if suffix == ".jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8", errors="surrogatepass")
    if suffix == ".json":
        return json.dumps(rows, ensure_ascii=False).encode("utf-8", errors="surrogatepass")
    import pyarrow as pa
    import pyarrow.parquet as pq

    def parquet(records) -> bytes:
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(records), sink)
        return sink.getvalue()

    try:
        return parquet([r if isinstance(r, dict) else {"value": json.dumps(r)} for r in rows])
    except (pa.ArrowException, TypeError, ValueError):  # mixed or empty column types: store them as JSON text
        return parquet([{k or "_": json.dumps(v) for k, v in r.items()} if isinstance(r, dict) else {"value": "null"}
                        for r in rows])


@st.composite
def dataset_files(draw, good: int = 0) -> tuple[str, bytes]:
    """``(suffix, bytes)``: ``good`` valid rows with a few bad ones among them, or a whole file gone wrong."""
    suffix = draw(st.sampled_from([".jsonl", ".jsonl", ".json", ".parquet"]))
    fmt = draw(st.sampled_from(ROW_FORMATS))
    rows = [good_row(fmt, i) for i in range(good)]
    for _ in range(draw(st.integers(0 if good else 1, 4))):
        rows.insert(draw(st.integers(0, len(rows))), draw(bad_row(fmt, len(rows))))
    try:
        data = encode(rows, suffix)
    except UnicodeEncodeError:
        data = b"\xff\xfe"
    shape = draw(st.sampled_from(["rows"] * 6 + ["truncated", "garbage", "empty", "bom", "not utf-8", "scalar"]))
    if shape == "truncated" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif shape == "garbage":
        data = draw(st.binary(min_size=1, max_size=200))
    elif shape == "empty":
        data = draw(st.sampled_from([b"", b"\n\n", b"[]", b"{}", b"null"]))
    elif shape == "bom":
        data = b"\xef\xbb\xbf" + data
    elif shape == "not utf-8":
        data = data[:20] + b"\xff\xfe\xfa" + data[20:]
    elif shape == "scalar":
        data = json.dumps(draw(junk())).encode()
    return suffix, data


@st.composite
def question_files(draw) -> tuple[str, bytes]:
    rows = []
    for i in range(draw(st.integers(0, 4))):
        row = {"question_id": i + 1, "category": "math", "turns": [f"What is {i} plus {i}?"]}
        if draw(st.booleans()):
            key = draw(st.sampled_from(["question_id", "category", "turns", "reference", "extra"]))
            how = draw(st.sampled_from(["drop", "junk", "duplicate id"]))
            if how == "drop":
                row.pop(key, None)
            elif how == "junk":
                row[key] = draw(junk())
            else:
                row["question_id"] = 1
        rows.append(row if draw(st.integers(0, 9)) else draw(junk()))
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    if draw(st.booleans()) and lines:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["", "{", "not json", "[1,", "\t"])))
    data = ("\n".join(lines) + "\n").encode("utf-8", errors="surrogatepass")
    shape = draw(st.sampled_from(["plain"] * 5 + ["gzip", "bad gzip", "garbage", "truncated"]))
    if shape == "gzip":
        return ".jsonl.gz", gzip.compress(data)
    if shape == "bad gzip":
        return ".jsonl.gz", gzip.compress(data)[: draw(st.integers(0, 30))]
    if shape == "garbage":
        return ".jsonl", draw(st.binary(max_size=100))
    if shape == "truncated" and data:
        return ".jsonl", data[: draw(st.integers(0, len(data) - 1))]
    return ".jsonl", data


def data_generate_argv(pair: dict, prompts: Path, out: Path) -> list[str]:
    return ["data", "generate", "--target", pair["target"], "--prompts", prompts, "--out", out / "answers.jsonl",
            "--limit", "2", "--max-new-tokens", "2", "--no-progress"]


def repro(harness, pair, case: Path, files: dict[str, bytes], argv: list, prefix: str = "draftsmith") -> str:
    line = harness.command_line(argv, prefix).replace(str(pair["target"].parent), "$PAIR").replace(f"{case}/", "")
    return " && ".join([*(harness.file_recipe(Path(n), d) for n, d in files.items()), line]) + \
        "   # $PAIR: tests/common/tiny_pair.py's write_pair"


@pytest.mark.fuzz(60, 300)
def test_prompt_datasets_of_data_generate(harness, pair, examples):
    from draftsmith.common.models import load_model

    @given(case_file=dataset_files())
    def one(case_file):
        suffix, data = case_file
        case = harness.fresh("prompts")
        prompts = case / f"prompts{suffix}"
        prompts.write_bytes(data)
        argv = data_generate_argv(pair, prompts, case / "out")
        harness.check("dataset (data generate)", harness.cli(argv), case / "out",
                      repro(harness, pair, case, {prompts.name: data}, argv))

    with harness.swapped(load_model, harness.accept):
        harness.explore(one, examples)


@pytest.mark.fuzz(6, 120)
def test_training_datasets_of_a_recipe(harness, pair, examples):
    """48 good rows with bad ones among them, or a broken file, as ``--dataset``: loaded, checked and tokenized for
    real (the models come from a cache), the trainer built; only its ``train`` is stubbed."""
    import copy

    from draftsmith.common.models import load_model
    from draftsmith.trainers.base import FrozenTargetTrainer

    loaded = {}

    def cached(name, *args, **kwargs):
        key = (str(name), repr(args), repr(sorted(kwargs.items())))
        if key not in loaded:
            loaded[key] = load_model(name, *args, **kwargs)
        return copy.deepcopy(loaded[key])

    @given(case_file=dataset_files(good=48))
    def one(case_file):
        suffix, data = case_file
        case = harness.fresh("dataset")
        dataset = case / f"data{suffix}"
        dataset.write_bytes(data)
        argv = harness.recipe_argv(pair, case / "out", "distillspec")
        argv[argv.index(str(pair["dataset"]))] = str(dataset)
        argv += ["report_to=none"]
        outcome = harness.cli(["train", "distillspec", *argv])
        harness.check("dataset (recipe)", outcome, case / "out",
                      repro(harness, pair, case, {dataset.name: data}, ["train", "distillspec", *argv]))

    with harness.swapped(load_model, cached), _stubbed(FrozenTargetTrainer, "train", harness.accept):
        harness.explore(one, examples)


@pytest.mark.fuzz(40, 200)
def test_question_files_of_eval_and_data_generate(harness, pair, examples):
    from draftsmith.common.models import load_model

    @given(case_file=question_files(), command=st.sampled_from(["eval", "data generate"]))
    def one(case_file, command):
        suffix, data = case_file
        case = harness.fresh("questions")
        questions = case / f"questions{suffix}"
        questions.write_bytes(data)
        argv = (["eval", "--questions", questions, "--method", "ar", "--target", pair["target"], "--out",
                 case / "out" / "report.json", "--no-progress"] if command == "eval"
                else data_generate_argv(pair, questions, case / "out"))
        harness.check("question file", harness.cli(argv), case / "out",
                      repro(harness, pair, case, {questions.name: data}, argv))

    with harness.swapped(load_model, harness.accept):
        harness.explore(one, examples)


@contextlib.contextmanager
def _stubbed(owner, name: str, replacement):
    original = owner.__dict__[name]
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def test_a_damaged_parquet_file_is_one_line(harness, pair):
    """Found by the fuzzer: pyarrow's message for a parquet file with bytes before its magic runs over three lines."""
    from draftsmith.common.models import load_model

    case = harness.fresh("parquet")
    prompts = case / "prompts.parquet"
    prompts.write_bytes(b"\xef\xbb\xbf" + encode([good_row("text", 0)], ".parquet"))
    argv = data_generate_argv(pair, prompts, case / "out")
    with harness.swapped(load_model, harness.accept):
        outcome = harness.cli(argv)
    harness.check("dataset (data generate)", outcome, case / "out", "BOM + a parquet file: " + str(argv))
    assert outcome.code == 2 and "not a readable parquet file" in outcome.stderr
