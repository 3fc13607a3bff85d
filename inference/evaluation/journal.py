"""The journal of an evaluation in progress: every finished question, one JSON line each, beside the report.

An evaluation of a real target runs for an hour or more; killed at question 79 of 80, it must not start over. The
evaluator appends each question's runs (AR, the method, transformers' baselines, the comparison) to the journal
as soon as the question is done (one fsynced write; a torn last line is cut off when it is read back). Rerunning
the same command reads the journal, keeps those questions as they were measured and runs only the rest; the
report then says how many were carried over (``resumed_questions``) and the journal is removed. Each question's
AR and method runs are measured back to back in one process, so its tokens/s ratio stays meaningful when the
questions come from two processes; the verification-cost curve and a proposer's own counters (``report_section``)
are those of the last process.

The first line records the settings that decide the answers and timings (method, target, draft, questions,
decoding); a journal written under other settings is refused with the way out.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from draftsmith.common.errors import ConfigError
from draftsmith.common.io import append_jsonl, recover_jsonl
from draftsmith.inference.core.generate import GenerationResult
from draftsmith.inference.evaluation.questions import Question
from draftsmith.inference.evaluation.runs import QuestionRun, TurnRun

FORMAT = "draftsmith-eval-journal/1"


def journal_path(report_path: str | os.PathLike) -> Path:
    """Where the journal of the report ``report_path`` lives: ``report.json`` -> ``report.partial.jsonl``."""
    path = Path(report_path)
    return path.with_name(f"{path.stem}.partial.jsonl")


def question_key(index: int, question: Question) -> str:
    """A question's key in the journal: its position and id (ids repeat across some question files)."""
    return f"{index}:{question.question_id}"


# ------------------------------------------------------------------------------------------------ (de)serialising


def _turn_from_dict(d: Mapping) -> TurnRun:
    fields = dict(d)
    fields["result"] = GenerationResult(**fields["result"])
    fields["steps"] = [tuple(s) for s in fields.get("steps", [])]
    return TurnRun(**fields)


def _turns(rows) -> list[TurnRun] | None:
    return None if rows is None else [_turn_from_dict(t) for t in rows]


def run_to_dict(run: QuestionRun) -> dict:
    """One question's runs as JSON-able data (:func:`run_from_dict` inverts it)."""
    return dataclasses.asdict(run)  # the question, turns and results as plain data (tuples become JSON lists)


def run_from_dict(d: Mapping) -> QuestionRun:
    q = dict(d["question"])
    question = Question(question_id=q["question_id"], category=q["category"], turns=tuple(q["turns"]),
                        reference=None if q.get("reference") is None else tuple(q["reference"]))
    hf = {k: [(list(ids), float(seconds), int(forwards)) for ids, seconds, forwards in v] for k, v in d["hf"].items()}
    return QuestionRun(question=question, method=_turns(d["method"]), ar=_turns(d["ar"]), hf=hf,
                       difference=d.get("difference"), original=_turns(d.get("original")))


# ---------------------------------------------------------------------------------------------------- the journal


class EvalJournal:
    """The finished questions of one evaluation (module docstring). ``settings``: what must match to resume."""

    def __init__(self, path: str | os.PathLike, settings: Mapping) -> None:
        self.path = Path(path)
        self.settings = dict(settings)

    def load(self) -> dict[str, QuestionRun]:
        """The questions already done (key -> runs); {} when there is no journal. A journal of other settings, or
        one that is not a journal, is a :class:`ConfigError`."""
        lines = recover_jsonl(self.path)
        if not lines:
            return {}
        fix = f"delete {self.path} to start this evaluation over"
        head = lines[0]
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise ConfigError(f"{self.path} is not a draftsmith evaluation journal; {fix}")
        old = head.get("settings", {})
        changed = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in self.settings.items() if old.get(k) != v]
        if changed:
            raise ConfigError(f"{self.path} holds an interrupted evaluation with other settings ({'; '.join(changed)}): "
                              f"rerun it as it was to resume, or {fix}")
        done = {}
        for n, row in enumerate(lines[1:], start=2):
            try:
                done[row["key"]] = run_from_dict(row["run"])
            except (KeyError, TypeError, ValueError):
                raise ConfigError(f"{self.path} line {n} is not a finished question; {fix}") from None
        return done

    def append(self, key: str, run: QuestionRun) -> None:
        """Record one finished question (the header first, when the journal is new)."""
        rows = [] if self.path.exists() and self.path.stat().st_size else [{"format": FORMAT, "settings": self.settings}]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_jsonl(self.path, [*rows, {"key": key, "run": run_to_dict(run)}])

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def kept(self) -> str:
        """What a failed write leaves of the evaluation (for its one-line error): the questions the journal holds,
        which a rerun of the same command keeps."""
        try:
            answered = max(0, len(recover_jsonl(self.path)) - 1)  # the first line is the header
        except Exception:  # noqa: BLE001 -- the count is a courtesy; the journal itself is what is kept
            answered = "the"
        return f"{answered} answered questions in {self.path}: rerun the same command to resume from them"


__all__ = ["EvalJournal", "journal_path", "question_key", "run_from_dict", "run_to_dict"]
