"""DFlash's training pieces: the anchors, the blocks and their labels, the slot weights of eq. 4, the visibility, and the
loss against a plain computation."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.drafters.dflash import block_visibility
from draftsmith.trainers.dflash.trainer import DFlashConfig, block_inputs, build_dflash, sample_anchors

IGNORE = -100


def _labels() -> torch.Tensor:  # [2, 12]: answers at 5..11 and at 3..8 (then padding)
    labels = torch.full((2, 12), IGNORE)
    labels[0, 5:] = torch.arange(5, 12) + 10
    labels[1, 3:9] = torch.arange(3, 9) + 10
    return labels


def test_anchors_are_distinct_ascending_positions_followed_by_an_answer_token():
    labels = _labels()
    anchors, valid = sample_anchors(labels, 4, torch.Generator().manual_seed(0))
    assert anchors.shape == valid.shape == (2, 4) and valid.all()
    for row in range(2):
        a = anchors[row].tolist()
        assert a == sorted(set(a)) and all(labels[row, i + 1] != IGNORE for i in a)
    anchors, valid = sample_anchors(labels, 9, torch.Generator().manual_seed(0))
    assert valid.sum(1).tolist() == [7, 6]  # 4..10 and 2..7 (the last prompt token first): the rest invalid
    assert anchors[0, 0] == 4 and anchors[1, 0] == 2  # the answer's first block is drafted from the last prompt token
    again = sample_anchors(labels, 9, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], anchors)  # a seeded draw repeats (evaluation)
    answers, valid = sample_anchors(labels, 9, torch.Generator().manual_seed(0), prompt_anchor=False)
    assert valid.sum(1).tolist() == [6, 5] and answers[0, 0] == 5 and answers[1, 0] == 3  # answer tokens only


def test_blocks_hold_the_anchor_then_masks_and_label_the_same_positions():
    ids = torch.arange(12).repeat(2, 1) + 10
    labels = _labels()
    anchors, valid = torch.tensor([[5, 10], [7, 0]]), torch.tensor([[True, True], [True, False]])
    block_ids, positions, targets = block_inputs(ids, labels, anchors, valid, 4, 99)
    assert block_ids[0, 0].tolist() == [15, 99, 99, 99] and positions[0, 0].tolist() == [5, 6, 7, 8]
    assert targets[0, 0].tolist() == [IGNORE, 16, 17, 18]  # slot k labels x_{a+k}; the anchor slot is no draft
    assert targets[0, 1].tolist() == [IGNORE, 21, IGNORE, IGNORE]  # past the sequence
    assert targets[1, 0].tolist() == [IGNORE, 18, IGNORE, IGNORE]  # past the answer
    assert (targets[1, 1] == IGNORE).all()  # an invalid block trains nothing


def test_a_block_sees_the_context_before_its_anchor_and_its_own_block_only():
    vis = block_visibility(torch.tensor([[2, 4]]), torch.tensor([[True, False]]), 6, 3)[0]  # [6, 6 + 6]
    assert vis[0, :6].tolist() == [True, True, False, False, False, False]  # s < a: not the anchor itself
    assert vis[0, 6:].tolist() == [True, True, True, False, False, False]  # its own block, bidirectional
    assert not vis[3:, :6].any() and vis[3:, 9:].all() and not vis[3:, 6:9].any()  # invalid: own block only


def test_slot_weights_are_the_papers_decay():
    cfg = DFlashConfig(block_size=8, loss_gamma=4.0)
    assert cfg.slot_weights() == pytest.approx([math.exp(-(k - 1) / 4) for k in range(1, 8)])
    assert DFlashConfig(block_size=4, loss_gamma=0).slot_weights() == [1.0, 1.0, 1.0]


def test_the_default_decay_follows_the_block_size_as_in_the_paper():
    """Eq. 4's gamma: 7 for blocks of 16, 5 for 10, 4 for 8 (the paper's pairs), linear between and beyond."""
    assert [DFlashConfig(block_size=b).gamma() for b in (8, 10, 16)] == [4.0, 5.0, 7.0]
    assert DFlashConfig(block_size=12).gamma() == pytest.approx(5 + 2 * 2 / 6)
    assert DFlashConfig(block_size=4).gamma() == 2.0 and DFlashConfig(block_size=8, loss_gamma=3).gamma() == 3.0
    with pytest.raises(ConfigError, match="loss_gamma"):
        DFlashConfig(loss_gamma=-2)
    with pytest.raises(Exception, match="draft_length=8"):
        DFlashConfig(block_size=8, draft_length=8)


def test_the_loss_is_the_weighted_cross_entropy_of_the_slots(tmp_path):
    """DFlashTrainer.loss_sum against cross-entropy computed plainly from the same block states."""
    from transformers import TrainingArguments

    from draftsmith.trainers.dflash.trainer import DFlashTrainer

    torch.manual_seed(0)
    target = random_model("llama", seed=0, layers=4)
    cfg = DFlashConfig(block_size=4, anchors=3, data_mode="fixed", draft_layers=1, loss_weighting="decay")
    module = build_dflash({"target": target}, cfg)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = DFlashTrainer(module, target, cfg, args=args)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    labels = torch.where(_labels() != IGNORE, ids, IGNORE)
    inputs = trainer.prepare_training_batch(module, {"input_ids": ids, "labels": labels,
                                                     "attention_mask": torch.ones_like(ids)})
    total, _ = trainer.loss_sum(module, inputs)
    with torch.no_grad():
        states = trainer._block_states(module, inputs)
        logits = target.get_output_embeddings()(states).float()  # [B, N, 4, V]
        targets = inputs["block_targets"]
        plain = sum(w * torch.nn.functional.cross_entropy(logits[:, :, k].flatten(0, 1), targets[:, :, k].flatten(),
                                                          ignore_index=IGNORE, reduction="sum")
                    for k, w in enumerate(cfg.slot_weights(), start=1))
    assert float(total.detach()) == pytest.approx(float(plain), rel=1e-5)
    assert int(trainer.count_loss_tokens(inputs)) == int((targets != IGNORE).sum()) > 0


def test_dpace_weights_are_suffix_sums_of_the_confidence_products():
    """D-PACE (arXiv:2605.18810, eqs. 7-9): c = alpha + (1 - alpha) q, C_k = m_k prod_{i<=k} c_i, w_k = sum_{j>=k}
    C_j, scaled to a mean of 1 over the labelled slots; alpha = 1 (no confidence) counts the labelled slots ahead."""
    from draftsmith.trainers.dflash.trainer import dpace_weights

    probs = torch.tensor([[0.8, 0.5, 0.2], [0.9, 0.0, 0.0]])
    labelled = torch.tensor([[True, True, True], [True, False, False]])
    c = [0.5 + 0.5 * 0.8, 0.5 + 0.5 * 0.5, 0.5 + 0.5 * 0.2]
    run = [c[0], c[0] * c[1], c[0] * c[1] * c[2]]
    raw = torch.tensor([[sum(run), run[1] + run[2], run[2]], [0.5 + 0.5 * 0.9, 0.0, 0.0]])
    want = raw * 4 / raw.sum()  # 4 labelled slots
    assert torch.allclose(dpace_weights(probs, labelled, 0.5), want)
    counted = dpace_weights(probs, labelled, 1.0)
    assert torch.allclose(counted, torch.tensor([[3.0, 2.0, 1.0], [1.0, 0.0, 0.0]]) * 4 / 7)


def test_the_dpace_loss_is_the_confidence_weighted_cross_entropy_and_its_weights_take_no_gradient(tmp_path):
    """loss_weighting=dpace: loss_sum equals sum w CE (w from the draft's own probabilities, no gradient through
    them), and its gradient is the plain CE's weighted by the same constants."""
    from transformers import TrainingArguments

    from draftsmith.trainers.dflash.trainer import DFlashTrainer, dpace_weights

    torch.manual_seed(0)
    target = random_model("llama", seed=0, layers=4)
    cfg = DFlashConfig(block_size=4, anchors=3, data_mode="fixed", draft_layers=1, loss_weighting="dpace")
    module = build_dflash({"target": target}, cfg)
    trainer = DFlashTrainer(module, target, cfg, args=TrainingArguments(output_dir=str(tmp_path), report_to=[],
                                                                        use_cpu=True))
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    labels = torch.where(_labels() != IGNORE, ids, IGNORE)
    inputs = trainer.prepare_training_batch(module, {"input_ids": ids, "labels": labels,
                                                     "attention_mask": torch.ones_like(ids)})
    states = trainer._block_states(module, inputs)
    total = trainer._slots_loss(states, inputs["block_targets"])
    targets = inputs["block_targets"]
    logits = target.get_output_embeddings()(states).float()  # [B, N, 4, V]
    ce = torch.nn.functional.cross_entropy(logits[:, :, 1:].flatten(0, 2), targets[:, :, 1:].clamp(min=0).flatten(),
                                           reduction="none").view(targets[:, :, 1:].shape)  # [B, N, 3]
    weights = dpace_weights((-ce).exp().detach(), targets[:, :, 1:] != IGNORE, 0.5)
    plain = (weights * torch.where(targets[:, :, 1:] != IGNORE, ce, 0.0)).sum()
    assert float(total.detach()) == pytest.approx(float(plain.detach()), rel=1e-5)
    params = [p for p in module.parameters() if p.requires_grad]
    got = torch.autograd.grad(total, params, retain_graph=True)
    want = torch.autograd.grad(plain, params)
    assert all(torch.allclose(g, w, atol=1e-6, rtol=1e-4) for g, w in zip(got, want))
    with pytest.raises(Exception, match="loss_weighting"):
        DFlashConfig(loss_weighting="cumprod")
