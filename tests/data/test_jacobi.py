"""Jacobi trajectories: the fixed points are the greedy answer, states end at the fixed point, and a killed
collection resumes with no trajectory lost or duplicated."""

import json

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data import jacobi
from draftsmith.data.jacobi import collect_trajectories, prompt_trajectory, read_trajectories
from draftsmith.data.row_files import append_rows
from draftsmith.data.tiny_models import random_model

IDENTITY = {"name_or_path": "tiny", "config_sha256": "c", "tokenizer_sha256": "t", "vocab_size": 128}


@pytest.fixture(scope="module")
def model():
    return random_model("llama", seed=0, layers=2, hidden=48)


def _prompts(k):
    return [torch.randint(3, 128, (6 + i,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(k)]


def _greedy(model, prompt, n):
    out = model.generate(torch.tensor(prompt)[None], max_new_tokens=n, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_fixed_points_are_the_greedy_answer(model):
    prompt = _prompts(1)[0]
    rows = prompt_trajectory(model, "p", prompt, block=4, max_new_tokens=12, eos_ids=(), seed=0)
    assert [r["block"] for r in rows] == [0, 1, 2] and [r["last"] for r in rows] == [False, False, True]
    answer = [t for r in rows for t in r["fixed_point"]]
    assert answer == _greedy(model, prompt, 12)
    for r in rows:
        assert r["states"][-1] == r["fixed_point"] and 1 <= len(r["states"]) <= 4 + 1
        assert r["prefix"] == prompt + answer[: 4 * r["block"]]
        assert set(r["states"][0]) <= set(r["prefix"])  # the initial guess is drawn from the context


def test_eos_ends_the_trajectory(model):
    prompt = _prompts(1)[0]
    answer = _greedy(model, prompt, 12)
    eos = answer[5]
    rows = prompt_trajectory(model, "p", prompt, block=4, max_new_tokens=12, eos_ids=(eos,), seed=0)
    first = answer.index(eos) // 4
    assert len(rows) == first + 1 and rows[-1]["eos"] and rows[-1]["last"]


def test_a_killed_collection_resumes_without_loss_or_duplicates(model, tmp_path, monkeypatch):
    prompts, ids = _prompts(5), [f"q{i}" for i in range(5)]
    out = tmp_path / "traj.jsonl"
    full = tmp_path / "full.jsonl"
    collect_trajectories(model, prompts, ids, full, target=IDENTITY, block=4, max_new_tokens=8, progress=False)
    calls = {"n": 0}
    original = jacobi.batch_trajectories

    def dies_on_the_second_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(jacobi, "batch_trajectories", dies_on_the_second_batch)
    with pytest.raises(KeyboardInterrupt):
        collect_trajectories(model, prompts, ids, out, target=IDENTITY, block=4, max_new_tokens=8, batch_size=2,
                             progress=False)
    monkeypatch.setattr(jacobi, "batch_trajectories", original)
    assert len({r["id"] for r in read_trajectories(out)}) == 2  # the first batch survived
    # a torn write of a prompt's rows: one of its rows on disk, not its last, then half a line
    done = {r["id"] for r in read_trajectories(out)}
    other = next(i for i in ids if i not in done)
    first_of_next = prompt_trajectory(model, other, prompts[ids.index(other)], block=4, max_new_tokens=8, eos_ids=(),
                                      seed=0)[0]
    append_rows(out, [first_of_next])  # as the writer appends: its sum, then the row
    with open(out, "a") as fh:
        fh.write('{"id": "q3", "blo')
    stats = collect_trajectories(model, prompts, ids, out, target=IDENTITY, block=4, max_new_tokens=8, batch_size=2,
                                 progress=False)
    assert stats["complete"] and stats["prompts"] == 5
    key = lambda r: (r["id"], r["block"])  # noqa: E731
    assert sorted(map(key, read_trajectories(out))) == sorted(map(key, read_trajectories(full)))
    assert sorted(json.dumps(r, sort_keys=True) for r in read_trajectories(out)) == \
        sorted(json.dumps(r, sort_keys=True) for r in read_trajectories(full))


def test_a_batch_gives_each_prompt_its_own_trajectory(model):
    """Left-padded batches of prompts of different lengths give the rows each prompt gets alone."""
    prompts = _prompts(3)
    together = jacobi.batch_trajectories(model, ["a", "b", "c"], prompts, block=4, max_new_tokens=12, eos_ids=(),
                                         seed=0)
    for rid, prompt, rows in zip("abc", prompts, together):
        alone = prompt_trajectory(model, rid, prompt, block=4, max_new_tokens=12, eos_ids=(), seed=0)
        assert [r["fixed_point"] for r in rows] == [r["fixed_point"] for r in alone]
        assert [r["states"] for r in rows] == [r["states"] for r in alone]


def test_other_settings_are_refused(model, tmp_path):
    out = tmp_path / "t.jsonl"
    collect_trajectories(model, _prompts(1), ["a"], out, target=IDENTITY, block=4, max_new_tokens=4, progress=False)
    with pytest.raises(ConfigError, match="other settings"):
        collect_trajectories(model, _prompts(1), ["a"], out, target=IDENTITY, block=8, max_new_tokens=4, progress=False)
