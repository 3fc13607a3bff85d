"""The tuner: replaying profiled steps under other settings, and picking the known best setting."""

import pytest

from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.evaluation.cost import CostModel
from draftsmith.inference.evaluation.tune import (
    Candidate,
    Prefill,
    StepRecord,
    candidates,
    choose,
    predict,
    rank_candidates,
    replay,
    replay_policy,
)


def test_replay_cuts_at_length_and_confidence():
    rec = StepRecord((0.9, 0.8, 0.3, 0.9), accepted=3)
    assert replay(rec, 4, 0.0) == (4, 3)
    assert replay(rec, 2, 0.0) == (2, 2)  # a shorter draft accepts its whole prefix
    assert replay(rec, 4, 0.5) == (3, 3)  # stops after the unsure third token, which was accepted
    assert replay(StepRecord((0.3, 0.9), 0), 2, 0.5) == (1, 0)


def synthetic_profile() -> list[StepRecord]:
    """Confident tokens (0.9) are always accepted, unsure ones (0.45) never: the first unsure token ends the
    accepted prefix. Prefix lengths 0..8 in equal numbers, each step an answer of its own (so an adaptive length
    has nothing to adapt to)."""
    records = []
    for good in range(9):
        confs = (0.9,) * good + (0.45,) * (8 - good)
        records.append(StepRecord(confs, accepted=good, answer=good))
    return records


def test_tuner_picks_the_known_best_setting():
    # verification flat up to 9 tokens (memory-bound), a draft token costs 10% of a step
    cost = CostModel({1: 1.0, 9: 1.0}, draft_seconds=0.1)
    ranked = rank_candidates(synthetic_profile(), cost)
    best = ranked[0]
    # the best stops right after the first unsure token: any threshold in (0.45, 0.9] does, the lowest such wins
    # the tie; the longest length lets every confident run through
    assert (best.draft_length_mode, best.draft_length, best.confidence_threshold) == ("fixed", 8, 0.5)
    never_stop = predict(synthetic_profile(), cost, 8, 0.0)
    assert best.predicted_speedup > never_stop.predicted_speedup
    assert best.predicted_tau == pytest.approx(sum(g + 1 for g in range(9)) / 9)
    # a steep verification cost (compute-bound) favours shorter drafts
    steep = CostModel({1: 1.0, 9: 5.0}, draft_seconds=0.1)
    assert rank_candidates(synthetic_profile(), steep)[0].draft_length < 8


def test_measured_speedup_decides_between_the_top_candidates():
    a = Candidate(4, 0.4, 2.0, 1.5, measured_tau=2.0, measured_speedup=1.1)
    b = Candidate(6, 0.5, 2.2, 1.4, measured_tau=2.1, measured_speedup=1.2)
    assert choose([a, b]) == (b, a)


def test_replay_policy_runs_the_heuristic_answer_by_answer():
    cost = CostModel({1: 1.0, 9: 1.0}, draft_seconds=0.1)
    full = StepRecord((0.9,) * 8, accepted=8)
    miss = StepRecord((0.9,) * 8, accepted=0)
    records = [StepRecord(r.confidences, r.accepted, answer=a) for a, r in [(0, full), (0, full), (0, miss), (1, full)]]
    policy = DraftLengthPolicy(length=2, mode="heuristic", max_length=8)
    # answer 0: 2 (all accepted, +2) -> 4 (all accepted) -> 6 (rejected, -1); answer 1 starts again at 2
    assert replay_policy(records, policy, 0.0, cost) == [(2, 2), (4, 4), (6, 0), (2, 2)]


def mixed_answers() -> list[StepRecord]:
    """Half the answers are copyable (every drafted token accepted), half are not (none accepted); the draft's
    confidence is the same low 0.3 in both, so no threshold tells them apart."""
    records = []
    for answer in range(10):
        accepted = 8 if answer % 2 == 0 else 0
        records += [StepRecord((0.3,) * 8, accepted, answer) for _ in range(12)]
    return records


def test_tuner_picks_an_adaptive_policy_when_answers_differ():
    # a draft token costs 30% of a step and verification is flat: drafting long pays on the copyable answers
    # only; the grow/shrink heuristic finds out per answer, a fixed length cannot
    cost = CostModel({1: 1.0, 9: 1.0}, draft_seconds=0.3)
    ranked = rank_candidates(mixed_answers(), cost)
    best = ranked[0]
    assert best.draft_length_mode != "fixed"
    best_fixed = next(c for c in ranked if c.draft_length_mode == "fixed")
    assert best.predicted_speedup > 1.2 * best_fixed.predicted_speedup
    assert best.settings()["draft_max_length"] == 8 and best.settings()["draft_length_mode"] == best.draft_length_mode


def test_candidates_cover_every_policy_and_threshold():
    cands = candidates(lengths=(1, 2, 4), thresholds=(0.0, 0.5), max_length=4)
    assert {c.draft_length_mode for c in cands} == {"fixed", "heuristic", "leviathan"}
    assert len(cands) == (3 + 2 + 1) * 2
    assert all(c.max_length == 4 for c in cands if c.draft_length_mode != "fixed")
    assert "draft_max_length" not in Candidate(4, 0.3).settings()


def test_prompt_processing_dilutes_the_predicted_speedup():
    cost = CostModel({1: 1.0, 9: 1.0}, draft_seconds=0.1)  # a plain step costs 1
    bare = predict(synthetic_profile(), cost, 8, 0.5)
    diluted = predict(synthetic_profile(), cost, 8, 0.5, prefill=Prefill(method=0.5, plain=0.5))
    # per new token: plain decoding pays 0.5 of prompt + one step; the draft 0.5 + its step seconds / tau
    assert diluted.predicted_speedup == pytest.approx((0.5 + 1.0) / (0.5 + 1.0 / bare.predicted_speedup))
    assert 1.0 < diluted.predicted_speedup < bare.predicted_speedup
