import gzip
import json

import pytest

from draftsmith.common.errors import DataError
from draftsmith.inference.evaluation.questions import Question, default_questions_path, read_questions

ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now make it rhyme."]},
    {"question_id": 82, "category": "math", "turns": ["What is 2 + 2?"], "reference": ["4"]},
    {"question_id": "q3", "turns": ["No category here."]},
]


def _write(path, rows, gz=False):
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_reads_spec_bench_format_plain_and_gz(tmp_path, gz):
    path = _write(tmp_path / ("q.jsonl.gz" if gz else "q.jsonl"), ROWS, gz)
    qs = read_questions(path)
    assert qs[0] == Question(81, "writing", ("Write a haiku.", "Now make it rhyme."), None)
    assert qs[1].reference == ("4",)
    assert qs[2].question_id == "q3" and qs[2].category == "general"
    assert [len(q.turns) for q in qs] == [2, 1, 1]


def test_limit_and_blank_lines(tmp_path):
    path = _write(tmp_path / "q.jsonl", [ROWS[0], "", ROWS[1], ROWS[2]])
    assert [q.question_id for q in read_questions(path, limit=2)] == [81, 82]
    assert len(read_questions(path)) == 3
    with pytest.raises(DataError, match="--limit"):
        read_questions(path, limit=0)


def test_per_category_keeps_the_first_n_of_each_category_in_file_order(tmp_path):
    rows = [json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]})
            for i, c in enumerate(["a", "a", "b", "a", "c", "b", "b"])]
    path = _write(tmp_path / "q.jsonl", rows)
    assert [q.question_id for q in read_questions(path, per_category=2)] == [0, 1, 2, 4, 5]
    assert [q.question_id for q in read_questions(path, per_category=1)] == [0, 2, 4]
    assert [q.question_id for q in read_questions(path, per_category=2, limit=3)] == [0, 1, 2]
    with pytest.raises(DataError, match="--per-category"):
        read_questions(path, per_category=0)


def test_per_category_on_the_broad_set_covers_every_category():
    qs = read_questions("broad", per_category=4)
    cats = {q.category for q in qs}
    assert len(cats) == 12 and len(qs) == 48


def test_malformed_line_names_file_and_line(tmp_path):
    path = _write(tmp_path / "q.jsonl", [ROWS[0], '{"question_id": 2, "turns": [', ROWS[1]])
    with pytest.raises(DataError) as err:
        read_questions(path)
    msg = str(err.value)
    assert f"{path}:2" in msg and "not valid JSON" in msg and "\n" not in msg


def test_empty_turn_names_question_id(tmp_path):
    path = _write(tmp_path / "q.jsonl", [ROWS[0], {"question_id": 77, "category": "x", "turns": ["ok", "   "]}])
    with pytest.raises(DataError, match="question 77 .* empty turn 2"):
        read_questions(path)


@pytest.mark.parametrize(
    "row, pattern",
    [
        ({"category": "x", "turns": ["a"]}, "missing 'question_id'"),
        ({"question_id": 1, "turns": []}, "non-empty list"),
        ({"question_id": 1, "turns": "a"}, "non-empty list"),
        ({"question_id": 1, "turns": [3]}, "turn 1 is int"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_rows(tmp_path, row, pattern):
    path = _write(tmp_path / "q.jsonl", [row])
    with pytest.raises(DataError, match=pattern) as err:
        read_questions(path)
    assert f"{path}:1" in str(err.value)


def test_duplicate_ids_and_missing_or_empty_files(tmp_path):
    with pytest.raises(DataError, match="repeats line 1"):
        read_questions(_write(tmp_path / "d.jsonl", [ROWS[1], ROWS[1]]))
    with pytest.raises(DataError, match="does not exist"):
        read_questions(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="no questions"):
        read_questions(_write(tmp_path / "e.jsonl", [""]))


def test_bundled_dev_questions():
    path = default_questions_path()
    qs = read_questions()
    assert path.name.startswith("dev_questions.jsonl")
    assert len(qs) == 324
    assert {q.category for q in qs} == {"coding", "math_reasoning"}
    assert all(q.turns and all(t.strip() for t in q.turns) for q in qs)


def test_bundled_broad_set_by_name():
    questions = read_questions("broad")
    assert len(questions) == 244
    assert {q.category for q in questions} == {"writing", "roleplay", "reasoning", "math", "coding", "extraction",
                                               "stem", "humanities", "summarization", "qa", "rag", "translation"}
    assert sum(len(q.turns) == 2 for q in questions) == 11
    assert read_questions("dev", limit=3) == read_questions(None, limit=3)


def test_a_lone_surrogate_and_a_directory_are_named_for_what_they_are(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 7, "category": "math", "turns": ["two \\ud800 three"]}\n')
    with pytest.raises(DataError, match=r"q.jsonl:1: question 7 turn 1 holds '\\ud800' at character 4, a lone "
                                        r"surrogate"):
        read_questions(path)
    with pytest.raises(DataError, match="is a directory: pass --questions with a Spec-Bench question.jsonl"):
        read_questions(tmp_path)


def test_completion_questions_are_one_text_and_the_openings_set_is_the_corpus_openings(tmp_path):
    from draftsmith.data.corpus import corpus_openings

    rows = [{"question_id": 1, "turns": ["Once upon a time"], "completion": True}, {"question_id": 2, "turns": ["Hi"]}]
    assert [q.completion for q in read_questions(_write(tmp_path / "q.jsonl", rows))] == [True, False]
    for bad in ({"question_id": 3, "turns": ["a", "b"], "completion": True}, {"question_id": 4, "turns": ["a"],
                                                                              "completion": "yes"}):
        with pytest.raises(DataError, match="completion"):
            read_questions(_write(tmp_path / "bad.jsonl", [bad]))
    shipped = read_questions("openings")
    assert [(q.question_id, q.category, q.turns, q.completion) for q in shipped] == \
        [(r["question_id"], r["category"], tuple(r["turns"]), True) for r in corpus_openings()]
    assert len({q.category for q in shipped}) == 5
