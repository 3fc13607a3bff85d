"""Prompts the target writes itself (Magpie): the template prefix is the template's own, attempts are judged by
whether they ended, their length and repeats, the file is a prompt set `data generate` reads, and a run resumes to
the file an uninterrupted run writes."""

from __future__ import annotations

import json
import shutil

import pytest

from draftsmith.common.errors import ConfigError, DataError
from draftsmith.data.chat import user_prefix_ids
from draftsmith.data.row_files import meta_path
from draftsmith.data.self_distill import dataset_prompts, prompt_id
from draftsmith.data.synthetic_prompts import (
    TASK_OPENERS,
    judge_attempt,
    prompt_key,
    resolve_openers,
    synthesize_prompts,
)

from .conftest import build_tokenizer

SETTINGS = {"max_new_tokens": 48, "min_words": 1, "batch_size": 4, "progress": False}
OPENERS = ("Write a poem about", "Translate into French:\n\n")

def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_user_prefix_is_the_templates_text_before_a_user_turns_content(chatml_tokenizer, tok):
    for t in (chatml_tokenizer, tok):
        turn = [{"role": "user", "content": "Hello there"}]
        full = t.apply_chat_template(turn, tokenize=False, add_generation_prompt=False)
        prefix = t.decode(user_prefix_ids(t))
        assert full.startswith(prefix) and full[len(prefix):].startswith("Hello there")
    assert chatml_tokenizer.decode(user_prefix_ids(chatml_tokenizer)) == \
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"  # the default system prompt kept
    with pytest.raises(DataError, match="no chat template"):
        user_prefix_ids(build_tokenizer(chat_template=None))


def test_an_attempt_is_kept_only_when_it_ended_is_long_enough_and_new():
    eos, seen = [9], set()
    assert judge_attempt([5, 6, 9], "Write a poem", eos, 3, seen) is None
    assert judge_attempt([5, 6, 7], "Write a poem about", eos, 3, seen) == "unfinished"  # no end-of-turn token
    assert judge_attempt([5, 9], "Hi there", eos, 3, seen) == "too_short"
    assert judge_attempt([5, 9], "write  a\nPOEM ", eos, 3, seen) == "repeat"  # case and spacing ignored
    assert seen == {prompt_key("Write a poem")} == {"write a poem"}


def test_prompts_are_a_prompt_set_written_reproducibly(model, tok, tmp_path):
    out = tmp_path / "p.jsonl"
    stats = synthesize_prompts(model, tok, out, count=5, seed=3, **SETTINGS)
    rows = _rows(out)
    assert stats["kept"] == len(rows) == 5 and stats["complete"]
    assert stats["attempts"] == rows[-1]["attempt"] + 1 == 5 + sum(stats["dropped"].values())
    for row in rows:
        assert row["id"] == prompt_id(row["messages"]) and [m["role"] for m in row["messages"]] == ["user"]
        assert row["messages"][0]["content"] == row["messages"][0]["content"].strip() != ""
    assert len({prompt_key(r["messages"][0]["content"]) for r in rows}) == 5
    prompts, report = dataset_prompts(out)  # what `data generate --prompts FILE` reads
    assert prompts == [r["messages"] for r in rows] and not report.skipped
    meta = json.loads(meta_path(out).read_text())
    assert meta["settings"] == {"temperature": 1.0, "top_p": 0.95, "seed": 3, "max_new_tokens": 48, "openers": None}
    assert meta["prefix"] == tok.decode(user_prefix_ids(tok)) and meta["progress"]["kept"] == 5

    again = tmp_path / "again.jsonl"
    synthesize_prompts(model, tok, again, count=5, seed=3, **{**SETTINGS, "batch_size": 3})
    assert again.read_text() == out.read_text()  # per-attempt seeds: the batch size does not matter
    other = tmp_path / "other.jsonl"
    synthesize_prompts(model, tok, other, count=5, seed=4, **SETTINGS)
    assert other.read_text() != out.read_text()


def test_a_stopped_run_resumes_to_the_uninterrupted_file(model, tok, tmp_path):
    whole = tmp_path / "whole.jsonl"
    synthesize_prompts(model, tok, whole, count=7, **SETTINGS)
    part = tmp_path / "part.jsonl"
    synthesize_prompts(model, tok, part, count=2, **SETTINGS)  # stopped after 2
    synthesize_prompts(model, tok, part, count=7, **SETTINGS)
    assert part.read_text() == whole.read_text()

    torn = tmp_path / "torn.jsonl"  # killed after a batch reached the file but before its meta did
    shutil.copy(whole, torn)
    shutil.copy(meta_path(part), meta_path(torn))
    meta = json.loads(meta_path(torn).read_text())
    meta["progress"] |= {"kept": 2, "attempts": _rows(whole)[1]["attempt"] + 1}
    meta_path(torn).write_text(json.dumps(meta))
    stats = synthesize_prompts(model, tok, torn, count=7, **SETTINGS)
    assert torn.read_text() == whole.read_text() and stats["kept"] == 7  # the rows past the meta are not doubled


def test_bad_settings_and_other_settings_on_resume_are_one_line_errors(model, tok, tmp_path):
    with pytest.raises(ConfigError, match="greedy"):
        synthesize_prompts(model, tok, tmp_path / "g.jsonl", count=2, temperature=0.0, **SETTINGS)
    with pytest.raises(ConfigError, match="--count"):
        synthesize_prompts(model, tok, tmp_path / "g.jsonl", count=0, **SETTINGS)
    out = tmp_path / "p.jsonl"
    synthesize_prompts(model, tok, out, count=2, **SETTINGS)
    with pytest.raises(ConfigError, match="other settings.*--overwrite"):
        synthesize_prompts(model, tok, out, count=3, top_p=0.5, **SETTINGS)
    stats = synthesize_prompts(model, tok, out, count=3, top_p=0.5, overwrite=True, **SETTINGS)
    assert stats["kept"] == 3 == len(_rows(out))


def test_a_target_that_never_ends_its_request_stops_after_max_attempts(model, tok, tmp_path):
    stats = synthesize_prompts(model, tok, tmp_path / "p.jsonl", count=3, max_attempts=6,
                               **{**SETTINGS, "max_new_tokens": 1, "min_words": 5})
    assert stats["attempts"] == 6 and stats["kept"] == 0 and not stats["complete"]
    assert sum(stats["dropped"].values()) == 6


def test_an_opener_follows_the_user_header_and_its_words_are_not_the_models():
    eos = [9]
    assert judge_attempt([5, 9], "Write a poem about cats", eos, 3, set(), "Write a poem about") == "too_short"
    assert judge_attempt([5, 6, 7, 9], "Write a poem about big fat cats", eos, 3, set(), "Write a poem about") is None


def test_each_attempt_starts_with_the_next_opener(model, tok, tmp_path):
    assert tok.decode(user_prefix_ids(tok, OPENERS[1])) == tok.decode(user_prefix_ids(tok)) + OPENERS[1]
    out = tmp_path / "p.jsonl"
    stats = synthesize_prompts(model, tok, out, count=6, openers=OPENERS, **SETTINGS)
    rows = _rows(out)
    assert stats["kept"] == len(rows) == 6
    for row in rows:
        opener = OPENERS[row["attempt"] % 2]
        assert row["opener"] == row["attempt"] % 2 and row["messages"][0]["content"].startswith(opener.strip())
    assert {r["opener"] for r in rows} == {0, 1}
    assert json.loads(meta_path(out).read_text())["settings"]["openers"] == list(OPENERS)
    with pytest.raises(ConfigError, match="other settings"):  # a resume must use the same openers
        synthesize_prompts(model, tok, out, count=8, openers=OPENERS[:1], **SETTINGS)
    plain = tmp_path / "plain.jsonl"
    synthesize_prompts(model, tok, plain, count=2, **SETTINGS)
    assert "opener" not in _rows(plain)[0] and json.loads(meta_path(plain).read_text())["settings"]["openers"] is None


def test_openers_come_from_a_built_in_set_or_a_file(tmp_path):
    assert resolve_openers(None) == () and resolve_openers("tasks") == TASK_OPENERS
    assert len(TASK_OPENERS) == len(set(TASK_OPENERS)) >= 36 and not any(o.endswith(" ") for o in TASK_OPENERS)
    f = tmp_path / "openers.txt"
    f.write_text('Write a haiku about \n\n"Summarize this:\\n\\n"\n')
    assert resolve_openers(str(f)) == ("Write a haiku about", "Summarize this:\n\n")  # no trailing space kept
    with pytest.raises(ConfigError, match="neither a built-in set"):
        resolve_openers(str(tmp_path / "missing.txt"))
    f.write_text('"unclosed\n')
    with pytest.raises(ConfigError, match="openers.txt:1: not a JSON string"):
        resolve_openers(str(f))
    f.write_text("\n  \n")
    with pytest.raises(ConfigError, match="at least one"):
        resolve_openers(str(f))


def test_an_openers_file_that_is_not_utf8_is_one_line(tmp_path):
    from draftsmith.common.errors import ConfigError
    from draftsmith.data.synthetic_prompts import resolve_openers

    path = tmp_path / "openers.txt"
    path.write_bytes(b"Translate:\n\xff\xfe latin-1\n")
    with pytest.raises(ConfigError, match=r"openers.txt is not UTF-8 text \(byte 11\): save it as UTF-8"):
        resolve_openers(str(path))
