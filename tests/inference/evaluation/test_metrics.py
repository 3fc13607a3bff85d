import pytest
import torch

from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import expected_speedup
from draftsmith.inference.core.generate import GenerationConfig, GenerationResult
from draftsmith.inference.evaluation.metrics import (
    adapter_drift,
    compare_with_ar,
    first_difference,
    is_near_tie,
    logit_spacing,
    mean_or_none,
    near_tie_rule,
    near_tie_tolerance,
    predicted_speedup,
    ratio_or_none,
)
from draftsmith.inference.evaluation.questions import Question
from draftsmith.inference.evaluation.runs import TurnRun, answer_question

pytestmark = pytest.mark.usefixtures("one_thread")


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def _turn(ids: list[int]) -> TurnRun:
    return TurnRun([0], GenerationResult(ids, [1] * len(ids), 0, 0, "length", 0.0), "")


def test_adapter_drift_counts_identical_answers_and_the_first_differing_token():
    same = ([_turn([1, 2, 3, 4])], [_turn([1, 2, 3, 4])])
    moved = ([_turn([1, 2, 9, 9]), _turn([5, 6])], [_turn([1, 2, 3, 4]), _turn([7, 6])])  # turns differ at 2 and 0
    drift = adapter_drift([same, moved])
    assert drift["questions"] == 2 and drift["answers_identical_to_original"] == 0.5
    assert drift["mean_first_difference"] == pytest.approx((4 + 2 + 0) / 3)  # an identical answer counts its length
    assert drift["mean_shared_prefix_fraction"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)


def test_difference_reports_position_and_top2_gap(lm_pair, chat_tokenizer):
    target, _ = lm_pair
    adapter = ModelAdapter(target)
    q = Question(1, "x", ("Hello world",))
    ar = answer_question(adapter, chat_tokenizer, q, GenerationConfig(max_new_tokens=8), None, 0, 400)
    method = answer_question(adapter, chat_tokenizer, q, GenerationConfig(max_new_tokens=8), None, 0, 400)
    assert compare_with_ar(target, method, ar, torch.float32) is None
    prefix = ar[0].prompt_ids + ar[0].result.output_ids[:3]
    with torch.no_grad():
        logits = target(torch.tensor([prefix])).logits[0, -1]
    top = logits.topk(2)
    method[0].result.output_ids = ar[0].result.output_ids[:3] + [int(top.indices[1])] + [0] * 4
    diff = compare_with_ar(target, method, ar, torch.float32)
    assert diff["turn"] == 0 and diff["position"] == 3
    assert diff["ar_token"] == ar[0].result.output_ids[3] == int(top.indices[0])
    assert diff["method_token"] == int(top.indices[1]) and diff["method_token_rank"] == 1
    assert diff["top2_gap"] == pytest.approx(float(top.values[0] - top.values[1]), abs=1e-5)
    assert diff["near_tie"] == (diff["top2_gap"] <= 1e-3)


def test_predicted_speedup_matches_leviathan():
    tau, speedup = predicted_speedup(0.7, [4] * 10, 0.1)
    assert speedup == pytest.approx(expected_speedup(0.7, 4, 0.1))
    assert tau == pytest.approx((1 - 0.7**5) / 0.3)
    assert predicted_speedup(0.7, [0, 0], 0.1) == (1.0, 1.0)


def test_near_tie_tolerance_follows_the_precision_spacing_at_the_top_logit():
    assert near_tie_tolerance(torch.float32, 20.0) == near_tie_tolerance(torch.float64, 3.0) == 1e-3
    # bfloat16 keeps 8 significant bits: spacing 2**-7 in [1, 2), 0.125 in [16, 32)
    assert near_tie_tolerance(torch.bfloat16, 20.0) == pytest.approx(4 * 0.125)
    assert near_tie_tolerance(torch.bfloat16, -20.0) == pytest.approx(4 * 0.125)
    assert near_tie_tolerance(torch.bfloat16, 1.5) == pytest.approx(4 * 2**-7)
    assert near_tie_tolerance(torch.float16, 20.0) == pytest.approx(4 * 2**-6)  # 11 bits: 2**-10 * 16
    assert near_tie_tolerance(torch.bfloat16, 0.0) > 0
    for value in (0.3, 3.0, 17.0, 100.0):  # one spacing is the gap to the next bfloat16 number
        x = torch.tensor(value, dtype=torch.bfloat16)
        assert logit_spacing(torch.bfloat16, value) == pytest.approx(float(torch.nextafter(x, x + 1) - x))
    assert is_near_tie({"top2_gap": 0.4, "top1_logit": 20.0}, torch.bfloat16)
    assert not is_near_tie({"top2_gap": 0.4, "top1_logit": 3.0}, torch.bfloat16)
    assert not is_near_tie({"top2_gap": None}, torch.bfloat16)
    assert "units in the last place of bfloat16" in near_tie_rule(torch.bfloat16)
    assert near_tie_rule(torch.float32) == "top-2 logit gap <= 0.001"


def test_mean_and_ratio_of_nothing_are_none():
    assert mean_or_none([]) is None and mean_or_none([1.0, 3.0]) == 2.0
    assert ratio_or_none(None, 2.0) is None and ratio_or_none(1.0, 0.0) is None and ratio_or_none(1.0, 2.0) == 0.5


def test_depth_acceptance_is_conditional_on_reaching_the_depth():
    from draftsmith.inference.evaluation.metrics import depth_acceptance

    # (proposed, accepted): depth 1 reached 3 times, passed twice; depth 2 reached twice (a >= 1), passed once;
    # depth 3 reached once (a >= 2), passed once; depth 4 reached only by the first step, which stops at 3
    steps = [(4, 3), (2, 1), (3, 0)]
    assert depth_acceptance(steps) == pytest.approx([2 / 3, 1 / 2, 1.0, 0.0])
    assert depth_acceptance([]) == []


def test_cost_prediction_adds_the_curves_extra_cost_to_the_runs_ar_step():
    from types import SimpleNamespace

    from draftsmith.inference.evaluation.metrics import cost_prediction

    def turn(wall, steps, new, prefill=0.0, proposed=0, draft_time=0.0, lengths=(), recorded=()):
        result = SimpleNamespace(wall_time=wall, steps=steps, num_proposed=proposed, draft_time=draft_time,
                                 prefill_time=prefill, output_ids=[0] * new)
        return SimpleNamespace(result=result, draft_lengths=list(lengths), steps=list(recorded), extra_rows=[])

    # AR: 10 steps in 0.1 s -> 10 ms a step; the curve says 3 tokens cost 2x one; drafts of 2, all accepted
    run = SimpleNamespace(ar=[turn(0.1, 10, 10)], method=[turn(0.05, 2, 6, proposed=4, draft_time=0.004,
                                                               lengths=[2, 2], recorded=[(2, 2), (2, 2)])])
    out = cost_prediction([run], {1: 0.005, 3: 0.015})  # the forward over 3 tokens costs 10 ms more than over 1
    assert out["predicted_tau"] == pytest.approx(3.0)
    # a step: the 10 ms plain step + 10 ms more verification + 2 x 1 ms drafting = 22 ms for 3 tokens
    assert out["predicted_speedup"] == pytest.approx(3.0 / 0.022 * 0.010)


def test_cost_prediction_charges_prompt_processing_once_per_answer():
    from types import SimpleNamespace

    from draftsmith.inference.evaluation.metrics import cost_prediction

    def turn(wall, steps, new, prefill, proposed=0, draft_time=0.0, lengths=(), recorded=()):
        result = SimpleNamespace(wall_time=wall, steps=steps, num_proposed=proposed, draft_time=draft_time,
                                 prefill_time=prefill, output_ids=[0] * new)
        return SimpleNamespace(result=result, draft_lengths=list(lengths), steps=list(recorded), extra_rows=[])

    # AR: 20 ms of prompt, then 10 steps of 10 ms; the method: 20 ms of prompt, then 2 steps of 3 tokens at 22 ms
    run = SimpleNamespace(ar=[turn(0.12, 10, 10, 0.02)], method=[turn(0.064, 2, 6, 0.02, proposed=4, draft_time=0.004,
                                                                      lengths=[2, 2], recorded=[(2, 2), (2, 2)])])
    out = cost_prediction([run], {1: 0.005, 3: 0.015})
    # 6 tokens in 0.02 + 2 x 0.022 s against 10 in 0.12 s: the prompt costs both the same, so the gain is smaller
    # than the per-step 1.36x
    assert out["predicted_speedup"] == pytest.approx((6 / 0.064) / (10 / 0.12))
    assert out["predicted_speedup"] < 3.0 / 0.022 * 0.010
