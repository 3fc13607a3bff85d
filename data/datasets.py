"""User datasets (local json / jsonl / parquet) to tokenized chat training examples.

    ds, report = load_chat_dataset("train.jsonl", tokenizer, max_length=1024)
    # ds columns: input_ids, labels (-100 outside assistant turns), attention_mask

Rows that cannot be used (missing field, empty text, wrong type, unknown role, no assistant turn, invalid
JSON, a conversation the chat template rejects, nothing to learn within ``max_length``) are skipped and
counted in the :class:`LoadReport`, which names the first offending line (1-based line for JSON lines,
1-based record index for a JSON list or parquet). More than ``max_bad_fraction`` of them stops the load
with a :class:`~draftsmith.common.errors.DataError` saying where and how to fix it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
from tqdm.auto import tqdm

from draftsmith.common.errors import ConfigError, DataError
from draftsmith.data.chat import (
    FORMATS,
    IGNORE_INDEX,
    INVALID_JSON,
    MISSING_FIELD,
    TOO_LONG,
    WRONG_TYPE,
    BadRow,
    detect_format,
    example_ids,
    normalize_example,
    truncate,
)

EXTENSIONS = (".json", ".jsonl", ".parquet")
COLUMNS = ("input_ids", "labels", "attention_mask")


@dataclass
class SkipCount:
    """The rows skipped for one reason: how many, the first one's line number and its message."""

    count: int
    first_line: int
    reason: str


@dataclass
class LoadReport:
    """What a load kept and skipped. ``unit`` is what line numbers count: "line", "record" or "example"."""

    source: str
    format: str
    unit: str = "line"
    total: int = 0
    kept: int = 0
    truncated: int = 0
    tokens: int = 0
    label_tokens: int = 0
    skips: dict[str, SkipCount] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return sum(s.count for s in self.skips.values())

    @property
    def bad_fraction(self) -> float:
        return self.skipped / self.total if self.total else 0.0

    @property
    def first_bad(self) -> SkipCount | None:
        """The earliest skipped row (over every reason)."""
        return min(self.skips.values(), key=lambda s: s.first_line, default=None)

    @property
    def first_bad_line(self) -> int | None:
        first = self.first_bad
        return first.first_line if first else None

    def add_skip(self, line: int, err: BadRow) -> None:
        stat = self.skips.get(err.category)
        if stat is None:
            self.skips[err.category] = SkipCount(1, line, err.reason)
        else:
            stat.count += 1
            stat.first_line = min(stat.first_line, line)

    def breakdown(self) -> str:
        """``invalid_json=1 (first at line 2), missing_field=3 (first at line 7)``, earliest first."""
        order = sorted(self.skips, key=lambda c: self.skips[c].first_line)
        return ", ".join(f"{c}={self.skips[c].count} (first at {self.unit} {self.skips[c].first_line})" for c in order)

    def summary(self) -> str:
        """One line for logs: totals, and the skips if any."""
        line = f"{self.source}: kept {self.kept} of {self.total} rows ({self.format}), {self.tokens} tokens"
        if self.truncated:
            line += f", {self.truncated} truncated"
        if self.skipped:
            first = self.first_bad
            line += (
                f"; skipped {self.skipped} ({self.bad_fraction:.1%}), first at {self.unit} {first.first_line}: "
                f"{first.reason} [{self.breakdown()}]"
            )
        return line

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for an artefact manifest."""
        out = asdict(self)
        out.update(skipped=self.skipped, first_bad_line=self.first_bad_line)
        return out


# ------------------------------------------------------------------------------------------------------ reading


def _check_path(path: Path) -> str:
    """The lower-case extension of an existing, non-empty dataset file; DataError otherwise."""
    if not path.exists():
        raise DataError(f"dataset file {path} not found; check the path (relative paths start at {Path.cwd()})")
    if path.is_dir():
        raise DataError(f"dataset path {path} is a directory; pass one .json, .jsonl or .parquet file")
    ext = path.suffix.lower()
    if ext not in EXTENSIONS:
        raise DataError(f"unsupported dataset file type '{ext or path.name}' for {path}; use .json, .jsonl or .parquet")
    if path.stat().st_size == 0:
        raise DataError(f"dataset file {path} is empty; add rows (one JSON object per line for .jsonl)")
    return ext


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(f"dataset file {path} is not UTF-8 text (byte {err.start}); re-save it as UTF-8") from err


def _json_lines(text: str) -> list[tuple[int, Any]]:
    """``(1-based line, object or BadRow)`` for every non-blank line."""
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as err:
            rows.append((n, BadRow(INVALID_JSON, f"invalid JSON ({err.msg}, column {err.colno})")))
    return rows


def _json_file(path: Path) -> tuple[str, list[tuple[int, Any]]]:
    """A JSON list (numbered by record) or, failing that, JSON lines (numbered by line)."""
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if text.lstrip().startswith("["):
            raise DataError(
                f"dataset file {path} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); "
                "fix the syntax, or write one object per line as .jsonl"
            ) from err
        return "line", _json_lines(text)
    if isinstance(data, list):
        return "record", list(enumerate(data, start=1))
    return "record", [(1, data)]


def _parquet_file(path: Path) -> tuple[str, list[tuple[int, Any]]]:
    import pyarrow  # a dependency of `datasets`
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pyarrow.ArrowException, OSError) as err:
        reason = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise DataError(f"dataset file {path} is not a readable parquet file ({reason}); re-export it") from err
    return "record", list(enumerate(table.to_pylist(), start=1))


def _read_file(path: str | os.PathLike) -> tuple[str, list[tuple[int, Any]]]:
    """``(unit, [(line number, row), ...])``; unparsable JSON lines come back as :class:`BadRow` rows."""
    path = Path(path)
    ext = _check_path(path)
    if ext == ".parquet":
        unit, rows = _parquet_file(path)
    elif ext == ".jsonl":
        unit, rows = "line", _json_lines(_read_text(path))
    else:
        unit, rows = _json_file(path)
    if not rows:
        raise DataError(f"dataset file {path} has no rows; add rows (one JSON object per line for .jsonl)")
    return unit, rows


def read_rows(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line number, row)`` for every row of a .json, .jsonl or .parquet file.

    Line numbers are 1-based lines for JSON lines and 1-based record indices for a JSON list or parquet.
    A line that is not valid JSON is yielded as a :class:`~draftsmith.data.chat.BadRow` instead of a dict.
    Raises :class:`DataError` for a missing, empty or unsupported file."""
    _, rows = _read_file(path)
    yield from rows


# --------------------------------------------------------------------------------------------------- formatting


def resolve_format(rows: Iterable[tuple[int, Any]], fmt: str = "auto", source: str = "dataset") -> str:
    """``fmt`` itself, or for "auto" the format of the first row that normalizes cleanly (failing that, of
    the first row with a recognisable key, so its errors get reported against the right format)."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise DataError(f"unknown dataset format '{fmt}'; choose auto, {', '.join(FORMATS)}")
        return fmt
    fallback = None
    for _, row in rows:
        guess = detect_format(row)
        if guess is None:
            continue
        fallback = fallback or guess
        try:
            normalize_example(row, guess)
        except BadRow:
            continue
        return guess
    if fallback is None:
        raise DataError(
            f"cannot tell the format of {source}: no row has a 'messages', 'conversations', 'instruction' or "
            "'text' field; convert it to Alpaca, ShareGPT or OpenAI messages rows, or pass the format explicitly"
        )
    return fallback


def _check_options(max_length: int, max_bad_fraction: float) -> None:
    if not isinstance(max_length, int) or max_length < 1:
        raise ConfigError(f"max_length must be a positive integer, got {max_length!r}")
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise ConfigError(f"max_bad_fraction must be between 0 and 1, got {max_bad_fraction!r}")


def _tokenize_rows(
    rows: Iterable[tuple[int, Any]],
    tokenizer: Any,
    max_length: int,
    fmt: str | None,
    report: LoadReport,
    progress: bool,
) -> dict[str, list[list[int]]]:
    """Columns of the kept rows; skips go into ``report``. ``fmt=None`` detects the format per row."""
    columns: dict[str, list[list[int]]] = {c: [] for c in COLUMNS}
    bar = tqdm(rows, desc=f"tokenizing {Path(report.source).name}", unit="row", disable=not progress, leave=False)
    for line, row in bar:
        report.total += 1
        try:
            if isinstance(row, BadRow):
                raise row
            row_fmt = fmt or detect_format(row)
            if row_fmt is None:
                if not isinstance(row, Mapping):
                    raise BadRow(WRONG_TYPE, f"row is {type(row).__name__}, expected an object")
                raise BadRow(MISSING_FIELD, "row has none of 'messages', 'conversations', 'instruction', 'text'")
            ids, labels = example_ids(tokenizer, normalize_example(row, row_fmt))
            example = truncate(ids, labels, max_length)
        except BadRow as err:
            report.add_skip(line, err)
            continue
        report.kept += 1
        report.truncated += len(ids) > max_length
        report.tokens += len(example["input_ids"])
        report.label_tokens += sum(label != IGNORE_INDEX for label in example["labels"])
        for c in COLUMNS:
            columns[c].append(example[c])
    return columns


def _check_report(report: LoadReport, max_bad_fraction: float, max_length: int) -> None:
    """Raise past the threshold (or when nothing is left), otherwise log one warning line for the skips."""
    if not report.skipped:
        return
    first = report.first_bad
    hint = f", or raise max_length (now {max_length})" if TOO_LONG in report.skips else ""
    where = f"first at {report.unit} {first.first_line}: {first.reason} [{report.breakdown()}]"
    fix = f"Fix or drop those rows, check the format (detected: {report.format}){hint}"
    if report.kept == 0:
        raise DataError(f"{report.source}: none of the {report.total} rows is usable; {where}. {fix}")
    if report.bad_fraction > max_bad_fraction:
        raise DataError(
            f"{report.source}: {report.skipped} of {report.total} rows ({report.bad_fraction:.1%}) are unusable, "
            f"more than max_bad_fraction={max_bad_fraction:g}; {where}. {fix}, or raise max_bad_fraction"
        )
    logging.getLogger(__name__).warning(
        f"{report.source}: skipped {report.skipped} of {report.total} rows ({report.bad_fraction:.1%}), {where}"
    )


def _to_dataset(columns: dict[str, list[list[int]]]) -> datasets.Dataset:
    features = datasets.Features({c: datasets.Sequence(datasets.Value("int64")) for c in COLUMNS})
    return datasets.Dataset.from_dict(columns, features=features)


def load_chat_dataset(
    path: str | os.PathLike,
    tokenizer: Any,
    max_length: int = 1024,
    fmt: str = "auto",
    max_bad_fraction: float = 0.05,
    progress: bool = True,
) -> tuple[datasets.Dataset, LoadReport]:
    """Tokenized training examples from a local .json / .jsonl / .parquet file.

    ``fmt`` is "auto" (from the first valid row), "alpaca", "sharegpt", "messages" or "text". Chat rows
    go through the tokenizer's chat template with labels on assistant tokens only; text rows are trained
    on every token. Returns the dataset (input_ids, labels, attention_mask) and a :class:`LoadReport`."""
    _check_options(max_length, max_bad_fraction)
    if fmt != "auto" and fmt not in FORMATS:
        raise DataError(f"unknown dataset format '{fmt}'; choose auto, {', '.join(FORMATS)}")
    unit, rows = _read_file(path)
    resolved = resolve_format(rows, fmt, source=str(path))
    report = LoadReport(source=str(path), format=resolved, unit=unit)
    columns = _tokenize_rows(rows, tokenizer, max_length, resolved, report, progress)
    _check_report(report, max_bad_fraction, max_length)
    return _to_dataset(columns), report


def examples_to_dataset(
    examples: Iterable[Mapping[str, Any]],
    tokenizer: Any,
    max_length: int = 1024,
    max_bad_fraction: float = 0.05,
    progress: bool = True,
    source: str = "examples",
) -> tuple[datasets.Dataset, LoadReport]:
    """Tokenized training examples from in-memory rows, the format detected per row (so chat and plain text
    rows can mix): ``{"messages": [...]}``, ``{"text": ...}``, and Alpaca or ShareGPT rows too.
    Rows are numbered from 1 in the report; skips and the threshold work as in :func:`load_chat_dataset`."""
    _check_options(max_length, max_bad_fraction)
    report = LoadReport(source=source, format="per-row", unit="example")
    columns = _tokenize_rows(enumerate(examples, start=1), tokenizer, max_length, None, report, progress)
    if report.total == 0:
        raise DataError(f"{source}: no examples to tokenize; check the corpus or dataset that produced them")
    _check_report(report, max_bad_fraction, max_length)
    return _to_dataset(columns), report
