"""DSpark's training pieces: the next-token blocks and their teacher-forced Markov inputs, the slot weights, the loss
(Markov-corrected cross-entropy and the confidence head's BCE against q(label)) against a plain computation, and the
gradients that reach both Markov factors and the confidence head."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.trainers.dspark.trainer import DSparkConfig, build_dspark, dspark_block_inputs

IGNORE = -100


def _labels() -> torch.Tensor:  # [2, 12]: answers at 5..11 and at 3..8 (then padding)
    labels = torch.full((2, 12), IGNORE)
    labels[0, 5:] = torch.arange(5, 12) + 10
    labels[1, 3:9] = torch.arange(3, 9) + 10
    return labels


def test_every_slot_predicts_the_next_token_from_the_true_one_before_it():
    ids = torch.arange(12).repeat(2, 1) + 10
    anchors, valid = torch.tensor([[4, 9], [7, 0]]), torch.tensor([[True, True], [True, False]])
    block_ids, positions, targets, prev = dspark_block_inputs(ids, _labels(), anchors, valid, 4, 99)
    assert block_ids[0, 0].tolist() == [14, 99, 99, 99] and positions[0, 0].tolist() == [4, 5, 6, 7]
    assert targets[0, 0].tolist() == [15, 16, 17, 18]  # slot k labels x_{a+k+1}, the anchor's slot included
    assert prev[0, 0].tolist() == [14, 15, 16, 17]  # the Markov head reads the true x_{a+k}
    assert targets[0, 1].tolist() == [20, 21, IGNORE, IGNORE]  # past the sequence
    assert targets[1, 0].tolist() == [18, IGNORE, IGNORE, IGNORE]  # past the answer
    assert (targets[1, 1] == IGNORE).all()  # an invalid block trains nothing


def test_slot_weights_decay_from_the_anchors_slot_and_the_config_is_checked():
    cfg = DSparkConfig(block_size=8, data_mode="fixed")
    assert cfg.slot_weights() == pytest.approx([math.exp(-k / 4) for k in range(8)])
    assert cfg.proposer_settings()["draft_length"] == 8 and DSparkConfig(block_size=8, draft_length=8,
                                                                          data_mode="fixed").draft_length == 8
    for bad in ({"markov_rank": 0}, {"draft_length": 9}, {"confidence_threshold": 1.0},
                {"confidence_head": False, "confidence_threshold": 0.5}):
        with pytest.raises(ConfigError):
            DSparkConfig(block_size=8, data_mode="fixed", **bad)


@pytest.mark.parametrize("weighting", ["decay", "dpace"])
def test_the_loss_is_the_markov_corrected_cross_entropy_plus_the_confidence_bce(tmp_path, weighting):
    """DSparkTrainer.loss_sum against the two losses computed plainly from the same block states; the gradients reach
    W1, W2, the confidence head and the draft's layers."""
    from transformers import TrainingArguments

    from draftsmith.trainers.dflash.trainer import dpace_weights
    from draftsmith.trainers.dspark.trainer import DSparkTrainer

    torch.manual_seed(0)
    target = random_model("llama", seed=0, layers=4)
    cfg = DSparkConfig(block_size=4, anchors=3, data_mode="fixed", draft_layers=1, markov_rank=8,
                       loss_weighting=weighting, confidence_alpha=0.7)
    module = build_dspark({"target": target}, cfg)
    torch.nn.init.normal_(module.draft.markov_head.markov_w1.weight, std=0.5)  # a bias that matters
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = DSparkTrainer(module, target, cfg, args=args)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    labels = torch.where(_labels() != IGNORE, ids, IGNORE)
    inputs = trainer.prepare_training_batch(module, {"input_ids": ids, "labels": labels,
                                                     "attention_mask": torch.ones_like(ids)})
    total, _ = trainer.loss_sum(module, inputs)
    total.backward()
    draft = module.draft
    for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                 "fc.weight", "layers.0.mlp.down_proj.weight"):
        assert dict(draft.named_parameters())[name].grad.abs().sum() > 0, name
    with torch.no_grad():
        states = trainer._block_states(module, inputs)  # [B, N, 4, H]
        targets, prev = inputs["block_targets"], inputs["block_prev"]
        keep = targets != IGNORE
        e = draft.markov_embed(prev)
        logits = target.get_output_embeddings()(states).float() + draft.markov_head(e).float()  # [B, N, 4, V]
        ce = F.cross_entropy(logits[keep], targets[keep], reduction="none")
        q = (-ce).exp()
        decay = torch.tensor(cfg.slot_weights()).expand_as(targets)[keep]
        if weighting == "dpace":
            probs = torch.zeros(keep.shape)
            probs[keep] = q
            weights = dpace_weights(probs, keep, cfg.dpace_alpha)[keep]
        else:
            weights = decay
        conf = draft.confidence_head(torch.cat([states, e], -1)[keep])
        bce = F.binary_cross_entropy_with_logits(conf, q, reduction="none")
        plain = (weights * ce).sum() + 0.7 * (decay * bce).sum()
    assert float(total.detach()) == pytest.approx(float(plain), rel=1e-4)
    assert int(trainer.count_loss_tokens(inputs)) == int(keep.sum()) > 0
