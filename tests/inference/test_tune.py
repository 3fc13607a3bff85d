"""The tuner: replaying profiled steps under other settings, and picking the known best setting."""

import pytest

from draftsmith.inference.cost import CostModel
from draftsmith.inference.tune import Candidate, StepRecord, choose, predict, rank_candidates, replay


def test_replay_cuts_at_length_and_confidence():
    rec = StepRecord((0.9, 0.8, 0.3, 0.9), accepted=3)
    assert replay(rec, 4, 0.0) == (4, 3)
    assert replay(rec, 2, 0.0) == (2, 2)  # a shorter draft accepts its whole prefix
    assert replay(rec, 4, 0.5) == (3, 3)  # stops after the unsure third token, which was accepted
    assert replay(StepRecord((0.3, 0.9), 0), 2, 0.5) == (1, 0)


def synthetic_profile() -> list[StepRecord]:
    """Confident tokens (0.9) are always accepted, unsure ones (0.45) never: the first unsure token ends the
    accepted prefix. Prefix lengths 0..8 in equal numbers."""
    records = []
    for good in range(9):
        confs = (0.9,) * good + (0.45,) * (8 - good)
        records.append(StepRecord(confs, accepted=good))
    return records


def test_tuner_picks_the_known_best_setting():
    # verification flat up to 9 tokens (memory-bound), a draft token costs 10% of a step
    cost = CostModel({1: 1.0, 9: 1.0}, draft_seconds=0.1)
    ranked = rank_candidates(synthetic_profile(), cost)
    best = ranked[0]
    # the best stops right after the first unsure token: any threshold in (0.45, 0.9] does, the lowest such wins
    # the tie; the longest length lets every confident run through
    assert (best.draft_length, best.confidence_threshold) == (8, 0.5)
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
