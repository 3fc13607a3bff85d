"""Evaluation questions in Spec-Bench's ``question.jsonl`` format (MT-Bench's file is the same).

One JSON object a line::

    {"question_id": 81, "category": "writing", "turns": ["first user turn", "second user turn"],
     "reference": ["..."]}                       # reference optional

``turns`` holds the user turns of one conversation; the evaluator answers them one after the other,
each answer becoming the assistant turn before the next user turn. Plain and gzip-compressed
(``.gz``) files are read; blank lines are skipped.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.common.errors import DataError
from draftsmith.data.corpus import QUESTION_SETS, dev_questions_path, question_set_path

DEFAULT_CATEGORY = "general"


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]
    reference: tuple | None = None
    completion: bool = False  # the one turn is a text to continue as is, without the chat template (a base model's)


def default_questions_path() -> Path:
    """The dev prompts bundled with draftsmith (data/eval/dev_questions.jsonl)."""
    return dev_questions_path()


def resolve_questions_path(path: str | Path | None) -> Path:
    """A questions file: the name of a bundled set (``dev``, ``broad``), a path, or None for ``dev``."""
    if path is None:
        return default_questions_path()
    if str(path) in QUESTION_SETS and not Path(path).exists():
        return question_set_path(str(path))
    return Path(path)


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            yield from fh
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read questions file {path} ({err}): pass a UTF-8 .jsonl or .jsonl.gz file") from None


def parse_question(row: object, where: str) -> Question:
    """One decoded JSON row as a :class:`Question`; ``where`` ("file:line") goes into every error."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object with question_id, category and turns, got {type(row).__name__}")
    if "question_id" not in row:
        raise DataError(f"{where}: missing 'question_id' (Spec-Bench format: question_id, category, turns)")
    qid = row["question_id"]
    if not isinstance(qid, (int, str)) or isinstance(qid, bool):
        raise DataError(f"{where}: question_id must be an integer or a string, got {type(qid).__name__}")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: question {qid} needs 'turns', a non-empty list of user messages")
    for i, turn in enumerate(turns):
        if not isinstance(turn, str):
            raise DataError(f"{where}: question {qid} turn {i + 1} is {type(turn).__name__}, expected a string")
        if not turn.strip():
            raise DataError(f"question {qid} ({where}) has an empty turn {i + 1}: give every turn some text or drop it")
        try:
            turn.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate escape such as "\ud800": no text can hold it
            raise DataError(f"{where}: question {qid} turn {i + 1} holds {turn[err.start]!r} at character "
                            f"{err.start}, a lone surrogate that is no text: fix or remove it") from None
    category = row.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise DataError(f"{where}: question {qid} has category {category!r}, expected a non-empty string")
    reference = row.get("reference")
    completion = row.get("completion", False)
    if not isinstance(completion, bool) or (completion and len(turns) > 1):
        raise DataError(f"{where}: question {qid} has completion {completion!r}: true (one text to continue, no chat "
                        "turns) or false")
    return Question(
        question_id=qid,
        category=category,
        turns=tuple(turns),
        reference=tuple(reference) if isinstance(reference, list) else (None if reference is None else (reference,)),
        completion=completion,
    )


def first_per_category(questions: list[Question], n: int) -> list[Question]:
    """The first ``n`` questions of every category, in file order: a stratified subset of a large set."""
    kept: dict[str, int] = {}
    out = []
    for q in questions:
        if kept.get(q.category, 0) < n:
            kept[q.category] = kept.get(q.category, 0) + 1
            out.append(q)
    return out


def read_questions(path: str | Path | None = None, limit: int | None = None,
                   per_category: int | None = None) -> list[Question]:
    """Read a Spec-Bench/MT-Bench question file or a bundled set by name (default: the bundled dev prompts):
    the first ``per_category`` questions of each category (all when None), then the first ``limit`` of those, in
    file order. Any problem is a :class:`DataError` naming the file and line."""
    path = resolve_questions_path(path)
    if path.is_dir():
        raise DataError(f"questions file {path} is a directory: pass --questions with a Spec-Bench question.jsonl "
                        "(such as the one inside it)")
    if not path.is_file():
        raise DataError(f"questions file {path} does not exist: pass --questions with a Spec-Bench question.jsonl")
    for flag, value in (("--limit", limit), ("--per-category", per_category)):
        if value is not None and value < 1:
            raise DataError(f"{flag} must be at least 1, got {value}")
    questions: list[Question] = []
    seen: dict[int | str, int] = {}
    for lineno, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno}): fix or remove that line") from None
        q = parse_question(row, where)
        if q.question_id in seen:
            raise DataError(
                f"{where}: question_id {q.question_id} repeats line {seen[q.question_id]}: question ids must be unique"
            )
        seen[q.question_id] = lineno
        questions.append(q)
        if limit is not None and per_category is None and len(questions) >= limit:
            break
    if not questions:
        raise DataError(f"questions file {path} holds no questions: one JSON object a line, Spec-Bench format")
    if per_category is not None:
        questions = first_per_category(questions, per_category)
    return questions[:limit]
