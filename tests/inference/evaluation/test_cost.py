"""The cost model: the measured verification curve on a synthetic target with a known cost, and the
predicted speedup against hand computations."""

import time

import pytest
import torch

from draftsmith.inference.evaluation.cost import (
    CostModel,
    expected_accepted,
    extend_curve,
    extension_sizes,
    measure_verify_curve,
    measure_verify_samples,
    predicted_speedup,
)


class SleepyTarget:
    """A target whose forward over n tokens takes 4 ms + 2 ms * n (and whose cache is a length)."""

    max_positions, vocab_size, device = 512, 100, torch.device("cpu")

    class Cache:
        def __init__(self) -> None:
            self.length = 0

        def crop(self, n: int) -> None:
            self.length = n

    def new_cache(self, capacity: int):
        return self.Cache()

    def forward(self, ids, cache, compute_logits=True):
        time.sleep(0.004 + 0.002 * ids.shape[1])
        cache.length += ids.shape[1]


def test_measured_curve_follows_the_known_cost():
    curve = measure_verify_curve(SleepyTarget(), prefix_tokens=16, sizes=(1, 4, 8), repeats=3, warmup=0)
    for n, seconds in curve.items():
        assert seconds == pytest.approx(0.004 + 0.002 * n, rel=0.5, abs=0.002)
    assert curve[1] < curve[4] < curve[8]


def test_interpolation_and_extrapolation():
    cost = CostModel({1: 1.0, 5: 2.0, 9: 4.0})
    assert cost.verify(1) == 1.0 and cost.verify(3) == pytest.approx(1.5) and cost.verify(7) == pytest.approx(3.0)
    assert cost.verify(13) == pytest.approx(4.0 + 0.375 * 4)  # the whole curve's least-squares slope carries on
    linear = CostModel({n: 0.1 + 0.01 * n for n in (1, 2, 4, 8, 16)})
    assert linear.verify(32) == pytest.approx(0.1 + 0.01 * 32)  # a straight curve extrapolates exactly
    assert cost.relative_verify(5) == pytest.approx(2.0)
    assert CostModel.from_dict(cost.to_dict()).verify_seconds == cost.verify_seconds


def test_a_noisy_fall_at_the_end_of_the_curve_never_makes_bigger_forwards_cheaper():
    """Measured on SmolLM2 (an EAGLE-3 tree eval): V(15) 0.233 s, V(16) 0.203 s; extrapolating the last two
    points gave V(30) < 0 and a predicted speedup of -1.1 for a 30-node tree."""
    cost = CostModel({1: 0.096, 4: 0.136, 8: 0.148, 12: 0.154, 15: 0.233, 16: 0.203})
    assert cost.verify(30) >= cost.verify(16) > 0
    assert cost.verify(64) >= cost.verify(30)
    assert CostModel({1: 1.0, 2: 0.5}).verify(10) == 0.5  # a falling curve: flat past its end, never below


def test_extension_sizes_reach_the_largest_verification_evenly():
    assert extension_sizes(16, 33) == (20, 24, 29, 33)
    assert extension_sizes(16, 18) == (17, 18)  # fewer sizes than asked where the gap is small
    assert extension_sizes(16, 16) == () and extension_sizes(16, 9) == ()


def test_extended_curve_measures_past_its_end_and_keeps_the_first_measurement_as_the_anchor():
    """A tree of 32 nodes verifies 33 tokens: the curve measured to 16 is extended by measuring 17..33 on the known
    target (4 ms + 2 ms per token), each new size priced at the old 1-token cost plus its extra in its own rounds."""
    curve = {1: 0.006, 8: 0.020, 16: 0.036}  # the known cost, as a first measurement gave it
    more = measure_verify_samples(SleepyTarget(), prefix_tokens=16, sizes=extension_sizes(16, 33), repeats=3, warmup=0)
    extended = extend_curve(curve, more)
    assert list(extended) == [1, 8, 16, 20, 24, 29, 33] and {n: extended[n] for n in curve} == curve
    for n in (20, 24, 29, 33):
        assert extended[n] == pytest.approx(0.004 + 0.002 * n, rel=0.3)
    shifted = extend_curve(curve, {1: [1.006], 20: [1.046]})  # a later measurement under load: same extra, same price
    assert shifted[20] == pytest.approx(0.046)


def test_expected_accepted_uses_conditional_depth_acceptance():
    assert expected_accepted([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_accepted([1.0, 0.0, 1.0], 3) == pytest.approx(2.0)
    assert expected_accepted([0.8], 3) == pytest.approx(1.8)  # depths never observed count as rejected
    assert expected_accepted([0.8], 0) == 1.0


def test_predicted_speedup_by_hand():
    # verify 1 token 10 ms, 5 tokens 15 ms; a draft token 1 ms; 2 ms bookkeeping per step
    cost = CostModel({1: 0.010, 5: 0.015}, draft_seconds=0.001, overhead_seconds=0.002)
    tau, speedup = predicted_speedup(cost, [4, 4], [0.5] * 4)
    assert tau == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    assert speedup == pytest.approx(tau / (0.015 + 0.004 + 0.002) * 0.012)
    # a flat verification curve (GPU-like) predicts more than a steep one (CPU-like)
    flat = CostModel({1: 0.010, 5: 0.010}, draft_seconds=0.001, overhead_seconds=0.002)
    assert predicted_speedup(flat, [4], [0.5] * 4)[1] > speedup
    assert predicted_speedup(cost, [], []) == (1.0, 1.0)


def test_monotone_removes_noise_dips():
    from draftsmith.inference.evaluation.cost import monotone

    assert monotone({1: 2.0, 2: 1.5, 4: 3.0, 8: 2.5}) == {1: 1.5, 2: 1.5, 4: 2.5, 8: 2.5}


def test_extra_rows_widen_the_verification_forward():
    """A proposer's own inputs in the forward (BiTA's mask tokens) cost what their rows cost on the curve."""
    from draftsmith.inference.evaluation.cost import CostModel, predicted_speedup

    cost = CostModel({1: 1.0, 5: 2.0, 17: 5.0})
    plain = predicted_speedup(cost, [4, 4], [1.0, 1.0, 1.0, 1.0])
    widened = predicted_speedup(cost, [4, 4], [1.0, 1.0, 1.0, 1.0], extra_rows=[12, 12])
    assert plain[0] == widened[0] == 5.0
    assert plain[1] == 5.0 / 2.0 and widened[1] == 5.0 / 5.0
    assert cost.step_seconds(4, extra=12) == 5.0


def test_padding_plan_pads_to_a_size_that_wins_its_paired_rounds_and_ignores_small_or_unsteady_gains():
    from draftsmith.inference.evaluation.cost import padded_curve, padding_plan

    def rounds(t, jitter=(1.0, 1.02, 0.99, 1.01)):  # four rounds, the same load drift for every size
        return [t * j for j in jitter]

    times = {1: 1.0, 2: 1.5, 3: 2.0, 4: 1.6, 5: 1.9, 6: 1.7, 8: 2.5}  # 3 and 5 rows are slower than 4 and 6
    plan = padding_plan({n: rounds(t) for n, t in times.items()})
    assert plan == {3: 4, 5: 6}
    assert padded_curve(times, plan) == {1: 1.0, 2: 1.5, 3: 1.6, 4: 1.6, 5: 1.7, 6: 1.7, 8: 2.5}
    assert padding_plan({1: rounds(1.0), 2: rounds(1.0), 3: rounds(0.98)}) == {}  # 2%: within timing noise
    assert padding_plan({1: rounds(2.0), 2: rounds(1.0)}) == {}  # one row is never padded: plain decoding as it is
    # a size that is faster in one lucky round only (a burst of load hit the others) is not a size to pad to
    assert padding_plan({1: [1.0] * 4, 2: [1.5] * 4, 3: [0.5, 1.6, 1.6, 1.6]}) == {}


def test_typical_extra_is_the_paired_median_so_one_lucky_round_does_not_set_it():
    from draftsmith.inference.evaluation.cost import fastest, loop_curve, typical

    # one token 50 ms, four tokens 80 ms (extra 30 ms); round 2 ran under load (both sides 1.5x), and in round 3 the
    # four-token forward was lucky (55 ms)
    samples = {1: [0.050, 0.050, 0.075, 0.050, 0.051], 4: [0.080, 0.081, 0.120, 0.055, 0.080]}
    curve = typical(samples)
    assert curve[1] == pytest.approx(0.050) and curve[4] == pytest.approx(0.080)  # 50 + median(30, 31, 45, 5, 29)
    assert fastest(samples)[4] - fastest(samples)[1] == pytest.approx(0.005)  # what the fastest rounds would claim
    assert typical({1: [0.05, 0.05, 0.05], 2: [0.04, 0.05, 0.04]})[2] == pytest.approx(0.05)  # never below one token
    plan, padded = loop_curve({1: samples[1], 3: [0.1] * 5, 4: samples[4]})
    assert plan == {3: 4} and padded[3] == padded[4] == pytest.approx(0.080)
