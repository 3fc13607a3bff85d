"""Tree calibration: the target's token per accepted depth, conditional rank accuracies, the per-depth temperature
that makes an under-confident head's probabilities match its measured acceptance, and the recorder around a chain
proposer in the decode loop."""

from __future__ import annotations

import math

import torch

from draftsmith.inference.core.proposer import StepFeedback
from draftsmith.inference.core.verify import Draft
from draftsmith.inference.evaluation.tree_calibration import (
    TEMPERATURES,
    CalibrationRecorder,
    TreeCalibration,
    depth_targets,
    target_ranks,
    temperature_nll,
)


def test_depth_targets_are_the_committed_tokens_of_depths_whose_prefix_was_accepted():
    assert depth_targets([7, 8, 9], drafted=5) == [7, 8, 9]  # 2 accepted, then the correction at depth 3
    assert depth_targets([7, 8, 9, 1, 2, 3], drafted=5) == [7, 8, 9, 1, 2]  # all 5 accepted: the bonus is depth 6
    assert depth_targets([4], drafted=3) == [4]  # the first draft token rejected: depth 1 only


def test_target_ranks_give_the_rank_or_a_miss():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0], [5.0, 0.0, 0.0, 4.0]])
    assert target_ranks(logits, torch.tensor([1, 2]), ranks=2).tolist() == [0, 2]  # rank 0; outside the top-2
    assert target_ranks(logits, torch.tensor([2, -1]), ranks=3).tolist() == [1, 3]  # -1: not draftable = a miss


def test_temperature_nll_is_the_cross_entropy_at_each_temperature():
    logits = torch.tensor([[2.0, 0.0, 0.0]])
    nll = temperature_nll(logits, torch.tensor([0]), temperatures=(1.0, 0.5))
    assert math.isclose(float(nll[0, 0]), -math.log(math.exp(2) / (math.exp(2) + 2)), rel_tol=1e-9)
    assert math.isclose(float(nll[0, 1]), -math.log(math.exp(4) / (math.exp(4) + 2)), rel_tol=1e-9)


def test_an_under_confident_head_gets_a_temperature_below_one_that_matches_its_acceptance():
    """The head's top-1 probability is ~0.3, but its top-1 is the target's token 80% of the time: the fitted
    temperature sharpens the distribution until the calibrated confidence is near 0.8."""
    cal = TreeCalibration(depth=1)
    logits = torch.tensor([1.0, 0.2, 0.1, 0.0, 0.0])  # softmax top-1 ~0.36
    for i in range(100):
        target = 0 if i % 5 else 1 + (i // 5) % 4  # 80% rank 0, the rest spread over the others
        cal.add(logits[None], torch.tensor([target]))
    fit = cal.fit()
    assert fit["confidence"][0] < 0.4
    assert fit["temperatures"][0] < 0.6
    assert abs(fit["calibrated_confidence"][0] - 0.8) < 0.06
    assert fit["chain_acceptance"] == [0.8]


def test_rank_accuracy_is_conditional_on_the_prefix_being_accepted():
    """Depth 2 is only counted on steps whose depth 1 was accepted: 1 of 2 reaches it, and is right there."""
    cal = TreeCalibration(depth=2, temperatures=(1.0,))
    rows = torch.tensor([[3.0, 1.0, 0.0], [0.0, 3.0, 1.0]])  # depth 1 drafts token 0, depth 2 token 1
    cal.add(rows, torch.tensor([0, 1]))  # both right: depth 2's prefix accepted
    cal.add(rows, torch.tensor([2]))  # depth 1 wrong (the target chose 2): depth 2 not reached
    fit = cal.fit()
    assert fit["reached"] == [2, 1]
    assert fit["rank_accuracy"][0][:3] == [0.5, 0.0, 0.5]
    assert fit["rank_accuracy"][1][:3] == [1.0, 0.0, 0.0]  # conditional: 1 of the 1 step that reached depth 2
    assert fit["temperatures"] == [1.0, 1.0]


def test_an_unreached_depth_keeps_temperature_one():
    cal = TreeCalibration(depth=3)
    cal.add(torch.zeros(1, 4), torch.tensor([2]))
    fit = cal.fit()
    assert fit["reached"] == [1, 0, 0]
    assert fit["temperatures"][1:] == [TEMPERATURES[min(range(len(TEMPERATURES)), key=lambda g: abs(TEMPERATURES[g] - 1))]] * 2


class _ChainProposer:
    """Drafts a fixed chain and exposes its logits as a head drafter does."""

    name, lossless, hidden_layers = "fake", True, ()

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits  # [k, V]
        self.last_draft_logits = None

    def reset(self, prompt_ids) -> None:
        """A fixed chain keeps no state between sequences."""

    def propose(self, tokens, max_tokens, sampling, generator=None) -> Draft:
        self.last_draft_logits = self.logits
        return Draft.chain(self.logits.argmax(-1).tolist())

    def observe(self, feedback) -> None:
        """Nothing to learn from a verification: the chain is fixed."""

    def draft_index(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.where(tokens < self.logits.shape[-1], tokens, -1)


def test_the_recorder_feeds_the_accepted_depths_of_each_step():
    logits = torch.tensor([[4.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 4.0]])  # drafts 0, 1, 2
    cal = TreeCalibration(depth=3, temperatures=(1.0,))
    rec = CalibrationRecorder(_ChainProposer(logits), cal)
    rec.propose(torch.tensor([1]), 10, None)
    rec.observe(StepFeedback(num_proposed=3, num_accepted=1, draft_seconds=0.0, target_seconds=0.0,
                             accepted=[0], committed=[0, 2]))  # depth 1 right, depth 2 corrected to 2
    rec.propose(torch.tensor([1]), 10, None)
    rec.observe(StepFeedback(num_proposed=3, num_accepted=3, draft_seconds=0.0, target_seconds=0.0,
                             accepted=[0, 1, 2], committed=[0, 1, 2, 9]))  # all right, bonus 9 (not a depth)
    fit = cal.fit()
    assert fit["reached"] == [2, 2, 1] and fit["steps"] == 2
    assert fit["chain_acceptance"] == [1.0, 0.5, 1.0]
    assert rec.steps == [(3, 1), (3, 3)]
