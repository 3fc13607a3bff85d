import pytest
import torch

from draftsmith.inference.adapter import ModelAdapter
from draftsmith.inference.draft_length import expected_speedup
from draftsmith.inference.generate import GenerationConfig
from draftsmith.inference.metrics import (
    compare_with_ar,
    first_difference,
    mean_or_none,
    near_tie_tolerance,
    predicted_speedup,
    ratio_or_none,
)
from draftsmith.inference.questions import Question
from draftsmith.inference.runs import answer_question

pytestmark = pytest.mark.usefixtures("one_thread")


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_difference_reports_position_and_top2_gap(lm_pair, chat_tokenizer):
    target, _ = lm_pair
    adapter = ModelAdapter(target)
    q = Question(1, "x", ("Hello world",))
    ar = answer_question(adapter, chat_tokenizer, q, GenerationConfig(max_new_tokens=8), None, 0, 400)
    method = answer_question(adapter, chat_tokenizer, q, GenerationConfig(max_new_tokens=8), None, 0, 400)
    assert compare_with_ar(target, method, ar, 1e-3) is None
    prefix = ar[0].prompt_ids + ar[0].result.output_ids[:3]
    with torch.no_grad():
        logits = target(torch.tensor([prefix])).logits[0, -1]
    top = logits.topk(2)
    method[0].result.output_ids = ar[0].result.output_ids[:3] + [int(top.indices[1])] + [0] * 4
    diff = compare_with_ar(target, method, ar, 1e-3)
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


def test_near_tie_tolerance_depends_on_precision():
    assert near_tie_tolerance(torch.float32) == near_tie_tolerance(torch.float64) == 1e-3
    assert near_tie_tolerance(torch.bfloat16) == near_tie_tolerance(torch.float16) == 0.125


def test_mean_and_ratio_of_nothing_are_none():
    assert mean_or_none([]) is None and mean_or_none([1.0, 3.0]) == 2.0
    assert ratio_or_none(None, 2.0) is None and ratio_or_none(1.0, 0.0) is None and ratio_or_none(1.0, 2.0) == 0.5
