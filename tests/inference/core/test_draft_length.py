import pytest

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.draft_length import DraftLengthPolicy, best_draft_length, expected_speedup, expected_tau


def test_expected_tau_limits():
    assert expected_tau(0.0, 5) == 1.0
    assert expected_tau(1.0, 4) == 5.0
    assert expected_tau(0.5, 0) == 1.0
    assert expected_tau(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_best_length_grows_with_alpha_and_shrinks_with_cost():
    assert best_draft_length(0.9, 0.05, 16) > best_draft_length(0.5, 0.05, 16)
    assert best_draft_length(0.8, 0.5, 16) < best_draft_length(0.8, 0.02, 16)
    assert best_draft_length(0.1, 1.0, 8) == 0
    k = best_draft_length(0.8, 0.1, 16)
    assert all(expected_speedup(0.8, k, 0.1) >= expected_speedup(0.8, j, 0.1) for j in range(17))


def test_heuristic_policy():
    pol = DraftLengthPolicy(length=4, mode="heuristic", max_length=8)
    pol.observe(4, 4, 0.01, 0.01)
    assert pol.next_length() == 6
    pol.observe(6, 1, 0.01, 0.01)
    assert pol.next_length() == 5
    pol.reset()
    assert pol.next_length() == 4


def test_leviathan_policy_tracks_estimates():
    pol = DraftLengthPolicy(length=4, mode="leviathan", max_length=12, ema=0.0)
    pol.observe(4, 4, draft_seconds=0.004, target_seconds=0.1)  # alpha 1, cheap draft
    assert pol.next_length() == 12
    pol.observe(4, 0, draft_seconds=0.4, target_seconds=0.1)  # alpha 0, expensive draft
    assert pol.next_length() == 1


def test_policy_validation():
    with pytest.raises(ConfigError):
        DraftLengthPolicy(mode="magic")
    with pytest.raises(ConfigError):
        DraftLengthPolicy(length=0)


def test_leviathan_rule_with_a_measured_verification_cost_drafts_less_on_a_steep_curve():
    from draftsmith.inference.evaluation.cost import CostModel

    flat = CostModel({1: 1.0, 17: 1.0}).relative_verify
    steep = CostModel({1: 1.0, 5: 1.6, 17: 4.0}).relative_verify
    assert expected_speedup(0.8, 4, 0.1, flat) == pytest.approx(expected_speedup(0.8, 4, 0.1))
    assert best_draft_length(0.8, 0.1, 16, steep) < best_draft_length(0.8, 0.1, 16, flat)
    policy = DraftLengthPolicy(length=4, mode="leviathan", alpha=0.8, cost_ratio=0.1, relative_verify=steep)
    assert policy.next_length() == best_draft_length(0.8, 0.1, 16, steep)
