"""The evaluation journal: finished questions written as they finish and read back to resume a killed run."""

import json

import pytest

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.evaluation.evaluator import evaluate
from draftsmith.inference.evaluation.journal import EvalJournal, journal_path, question_key, run_from_dict, run_to_dict
from draftsmith.inference.evaluation.questions import read_questions
from draftsmith.inference.proposers.draft_model import DraftModelProposer

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = {"method": "draft", "max_new_tokens": 10}


def _evaluate(lm_pair, tok, questions, journal, compare_hf=False):
    target, draft = lm_pair
    return evaluate(target, tok, "draft", lambda: DraftModelProposer(draft, DraftLengthPolicy(length=3)), questions,
                    max_new_tokens=10, warmup=0, progress=False, compare_hf=compare_hf, journal=journal)


def _measured(report):  # what only a run itself can produce: its timings, per question
    return [(q["question_id"], q["wall_time"], q["ar"]["wall_time"]) for q in report["questions"]]


def test_a_question_run_survives_the_round_trip(lm_pair, chat_tokenizer, questions_file, tmp_path):
    qs = read_questions(questions_file)[:2]
    journal = EvalJournal(tmp_path / "j.partial.jsonl", SETTINGS)
    _evaluate(lm_pair, chat_tokenizer, qs, journal, compare_hf=True)
    done = journal.load()
    assert list(done) == [question_key(i, q) for i, q in enumerate(qs)]
    for run in done.values():
        assert run_to_dict(run_from_dict(json.loads(json.dumps(run_to_dict(run))))) == run_to_dict(run)
        assert run.hf and all(isinstance(r, tuple) for v in run.hf.values() for r in v)
        assert all(isinstance(s, tuple) for t in run.method for s in t.steps)


def test_a_killed_evaluation_resumes_with_its_finished_questions_kept(lm_pair, chat_tokenizer, questions_file,
                                                                     tmp_path):
    qs = read_questions(questions_file)
    path = tmp_path / "report.partial.jsonl"
    first = _evaluate(lm_pair, chat_tokenizer, qs[:2], EvalJournal(path, SETTINGS))  # "killed" after two questions
    with open(path, "a") as fh:
        fh.write('{"key": "2:')  # and in the middle of writing the third
    full = _evaluate(lm_pair, chat_tokenizer, qs, EvalJournal(path, SETTINGS))
    assert full["resumed_questions"] == 2 and full["num_questions"] == len(qs)
    assert _measured(full)[:2] == _measured(first)  # carried over as measured, not run again
    assert full["summary"]["greedy_identical"] == 1.0
    assert len(EvalJournal(path, SETTINGS).load()) == len(qs)  # the torn line was cut, the third appended whole
    again = _evaluate(lm_pair, chat_tokenizer, qs, EvalJournal(path, SETTINGS))
    assert again["resumed_questions"] == len(qs) and _measured(again) == _measured(full)


def test_a_journal_of_other_settings_or_not_a_journal_is_refused(lm_pair, chat_tokenizer, questions_file, tmp_path):
    qs = read_questions(questions_file)[:1]
    path = tmp_path / "report.partial.jsonl"
    _evaluate(lm_pair, chat_tokenizer, qs, EvalJournal(path, SETTINGS))
    with pytest.raises(ConfigError, match=r"max_new_tokens 10 -> 64.*delete .*report.partial.jsonl"):
        EvalJournal(path, {**SETTINGS, "max_new_tokens": 64}).load()
    path.write_text('{"something": "else"}\n')
    with pytest.raises(ConfigError, match="not a draftsmith evaluation journal"):
        EvalJournal(path, SETTINGS).load()
    assert EvalJournal(tmp_path / "none.jsonl", SETTINGS).load() == {}
    assert journal_path(tmp_path / "eval" / "report.json") == tmp_path / "eval" / "report.partial.jsonl"
