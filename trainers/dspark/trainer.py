"""DSpark (deepseek-ai/DeepSpec): DFlash's block draft (:mod:`draftsmith.trainers.dflash.trainer`) with next-token
queries, a Markov head and a confidence head (the draft: :mod:`draftsmith.inference.drafters.dspark`).

Each anchor ``a`` (drawn as DFlash draws them) makes one block ``[x_a, MASK x (B-1)]`` at positions ``a .. a+B-1``
with DFlash's visibility; slot ``k`` (every one, the anchor's included) predicts ``x_{a+k+1}``, teacher-forced on the
true token before it (``prev_k = x_{a+k}``). The losses, as speculators' DSpark trainer defines them (with the
target's answers as hard labels, as draftsmith's DFlash trains)::

    z_k    = LMHead(h_k) + W2 W1[x_{a+k}]                                   (the Markov-corrected logits)
    L_tok  = sum_blocks sum_k w_k m_{a,k} CE(x_{a+k+1}, softmax(z_k))
    c*_k   = sg[ softmax(z_k)(x_{a+k+1}) ]                                  (= 1 - TV(q_k, onehot(x_{a+k+1})))
    L_conf = sum_blocks sum_k w_k m_{a,k} BCE(sigmoid(l_k), c*_k),  l_k = w . [h_k; W1[x_{a+k}]] + b
    L      = L_tok + alpha L_conf          w_k = exp(-k / gamma)  (gamma = 4 for B = 8; D-PACE optional)

``m_{a,k}`` is 1 where ``x_{a+k+1}`` exists and is an answer token. The reference's confidence target is the slot's
acceptance rate against the target's soft distribution, ``sum_v min(q_v, p_v)``; with the target's greedy answers as
labels that rate is the draft's probability of the label. The BCE always takes the decay weights (the reference's,
also under D-PACE). Evaluation reports each slot's top-1 agreement with the Markov chain teacher-forced, the greedy
block's accepted length, and the confidence head's mean absolute error against ``c*``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError
from draftsmith.common.precision import first_argmax
from draftsmith.inference.drafters.dspark import DSparkDraft
from draftsmith.inference.drafters.peagle import mask_token
from draftsmith.kernels.cross_entropy import cross_entropy_rows
from draftsmith.kernels.head_calls import checkpointed_head_loss, chunked_head_rows
from draftsmith.trainers.dflash.trainer import (
    EVAL_SEED,
    IGNORE,
    DFlashConfig,
    DFlashTrainer,
    DFlashTraining,
    block_inputs,
    dpace_weights,
)
from draftsmith.trainers.mixins import help_text as _help


@dataclass
class DSparkConfig(DFlashConfig):
    """DSpark settings: DFlash's (a block now drafts ``block_size`` tokens) and the two heads'."""

    loss_weighting: str = field(default="decay", metadata=_help("Slot weights: decay = exp(-k/loss_gamma) from the "
                                                                "anchor's slot on (the reference's); dpace = D-PACE's "
                                                                "(DFlash's), from the Markov-corrected draft's own "
                                                                "confidence."))
    markov_rank: int = field(default=256, metadata=_help("The Markov head's rank r: W1 [V, r], W2 [V, r] (the "
                                                         "reference's 256)."))
    confidence_head: bool = field(default=True, metadata=_help("Train the confidence head (each slot's chance of "
                                                               "being accepted)."))
    confidence_with_markov: bool = field(default=True, metadata=_help("The confidence head reads [h; W1[prev]] "
                                                                      "(the reference's) instead of h."))
    confidence_alpha: float = field(default=1.0, metadata=_help("Weight of the confidence head's BCE (the "
                                                                "reference's 1.0)."))
    confidence_threshold: float = field(default=0.0, metadata=_help("Evaluation: stop a draft where the running "
                                                                    "product of the slots' confidences falls below "
                                                                    "P (0 = always the whole draft length)."))

    def __post_init__(self) -> None:
        super().__post_init__()
        if int(self.markov_rank) < 1 or float(self.confidence_alpha) < 0:
            raise ConfigError(f"markov_rank={self.markov_rank} must be >= 1 and confidence_alpha="
                              f"{self.confidence_alpha} >= 0")
        if not 0.0 <= float(self.confidence_threshold) < 1.0:
            raise ConfigError(f"confidence_threshold={self.confidence_threshold} must be in [0, 1)")
        if float(self.confidence_threshold) > 0 and not self.confidence_head:
            raise ConfigError("confidence_threshold needs the confidence head: set confidence_head=true")

    def block_drafts(self) -> int:
        """Every query of the block drafts: ``block_size`` tokens."""
        return int(self.block_size)

    def slot_weights(self) -> list[float]:
        """``w_k = exp(-k / gamma)`` for slots ``k = 0 .. B-1``."""
        g = self.gamma()
        return [math.exp(-k / g) if g > 0 else 1.0 for k in range(int(self.block_size))]

    def proposer_settings(self) -> dict[str, Any]:
        return super().proposer_settings() | {"confidence_threshold": float(self.confidence_threshold)}


def build_dspark(models: dict, config: DSparkConfig, tokenizer=None) -> DFlashTraining:
    """A fresh DSpark draft for the target, in float32 master weights."""
    target = models["target"]
    mask = int(config.mask_token_id) if int(config.mask_token_id) >= 0 else mask_token(tokenizer, target.config)
    draft = DSparkDraft.for_target(target, int(config.draft_layers), config.target_layers(target),
                                   int(config.block_size), mask, int(config.markov_rank), bool(config.confidence_head),
                                   bool(config.confidence_with_markov))
    return DFlashTraining(draft).float()


def dspark_block_inputs(input_ids: torch.Tensor, labels: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                        block: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, positions, targets, prev)``, each ``[B, N, blk]``: the blocks' tokens ``[x_a, MASK...]`` at positions
    ``a .. a+blk-1``, each slot's label ``x_{a+k+1}`` (``IGNORE`` past the sequence, on non-answer tokens and in invalid
    blocks) and the true token before it ``x_{a+k}`` (the Markov head's teacher-forced input)."""
    ids, positions, targets = block_inputs(input_ids, labels, anchors, valid, block + 1, mask_id)  # DFlash's, one longer
    prev = input_ids.gather(1, positions[..., :block].clamp(max=input_ids.shape[1] - 1).flatten(1))
    return ids[..., :block], positions[..., :block], targets[..., 1:], prev.view_as(targets[..., 1:])


class DSparkTrainer(DFlashTrainer):
    """Trains a DSpark draft (module docstring) on DFlash's anchors, blocks and features."""

    config_class = DSparkConfig

    def prepare_training_batch(self, model, inputs, generator: torch.Generator | None = None):
        inputs = super().prepare_training_batch(model, inputs, generator)
        ids, positions, targets, prev = dspark_block_inputs(inputs["input_ids"], inputs["labels"],
                                                            inputs["block_anchors"], inputs["block_valid"],
                                                            int(self.method_config.block_size),
                                                            self._draft(model).mask_token_id)
        return inputs | {"block_ids": ids, "block_positions": positions, "block_targets": targets, "block_prev": prev}

    def loss_sum(self, model, inputs) -> tuple[torch.Tensor, Any]:
        return self._dspark_loss(model, self._block_states(model, inputs), inputs)[0], None

    def _slot_rows(self, model, states: torch.Tensor, inputs) -> tuple[torch.Tensor, ...]:
        """The labelled slots as rows: ``(h [M, H], e [M, r], labels [M], slot [M], labelled [B, N, blk])``."""
        targets = inputs["block_targets"]
        labelled = targets != IGNORE
        slot = torch.arange(targets.shape[-1], device=targets.device).expand_as(targets)[labelled]
        embedded = self._draft(model).markov_embed(inputs["block_prev"][labelled])
        return states[labelled], embedded, targets[labelled], slot, labelled

    def _markov_head(self, model):
        """``[h; e] -> LMHead(h) + W2 e``: the Markov-corrected logits as one callable head over ``[M, H + r]``."""
        draft, lm_head = self._draft(model), self.teacher_module.get_output_embeddings()
        return lambda x: draft.slot_logits(lm_head(x[:, : draft.hidden]), x[:, draft.hidden:])

    def _dspark_loss(self, model, states: torch.Tensor, inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(L_tok + alpha L_conf, c* [M], the confidence logits [M] or None)`` over the labelled slots (module
        docstring)."""
        cfg, draft = self.method_config, self._draft(model)
        h, e, y, slot, labelled = self._slot_rows(model, states, inputs)
        x = torch.cat([h, e.to(h.dtype)], dim=-1)  # [M, H + r]
        head, vocab = self._markov_head(model), int(draft.config.vocab_size)
        with torch.no_grad():  # c* = q(y), the Markov-corrected draft's probability of each label
            target = chunked_head_rows(x.detach(), head, lambda z, t, _: (-cross_entropy_rows(z, t)).exp(), vocab=vocab,
                                       labels=y, lockstep=self.sharded()).float()
        decay = torch.tensor(cfg.slot_weights(), device=h.device)[slot]  # [M]
        if cfg.loss_weighting == "dpace":
            probs = torch.zeros(labelled.shape, dtype=torch.float32, device=h.device)
            probs[labelled] = target
            weights = dpace_weights(probs, labelled, float(cfg.dpace_alpha))[labelled]
        else:
            weights = decay
        rows = torch.arange(y.shape[0], device=y.device)
        total = checkpointed_head_loss(x, head, lambda z, i, _: weights[i] * cross_entropy_rows(z, y[i]), vocab=vocab,
                                       labels=rows, reduction="sum", lockstep=self.sharded())
        if draft.confidence_head is None:
            return total, target, None
        logits = draft.confidence_logits(h, e)  # [M]
        bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        return total + float(cfg.confidence_alpha) * (decay * bce).sum(), target, logits

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out loss with anchors drawn by a fixed seed; per slot the top-1 hits of the Markov-corrected logits
        (teacher-forced), the trained slots, the accepted length of the fully labelled blocks, and the confidence
        head's summed absolute error against ``c*``."""
        inputs = self._prepare_inputs(inputs)
        inputs = self.prepare_training_batch(model, inputs, torch.Generator().manual_seed(EVAL_SEED))
        with torch.no_grad():
            states = self._block_states(model, inputs)
            total, target, conf = self._dspark_loss(model, states, inputs)
            h, e, y, slot, labelled = self._slot_rows(model, states, inputs)
            head, vocab = self._markov_head(model), int(self._draft(model).config.vocab_size)
            top = chunked_head_rows(torch.cat([h, e.to(h.dtype)], -1), head, lambda z, _, __: first_argmax(z),
                                    vocab=vocab, lockstep=self.sharded())
            hits = torch.zeros(labelled.shape, dtype=torch.bool, device=labelled.device)  # [B, N, blk]
            hits[labelled] = top.to(y.device) == y
            full = labelled.all(-1)
            accepted = hits.long().cumprod(-1).sum(-1)[full]
            error = (torch.sigmoid(conf) - target).abs().sum() if conf is not None else total.new_zeros(())
            sums = torch.cat([hits.sum((0, 1)).float(), labelled.sum((0, 1)).float(),
                              torch.stack([accepted.sum().float(), full.sum().float(), error.float()])])
            self.add_eval_sums(sums)
        return (total / self.count_loss_tokens(inputs).clamp(min=1).to(total.device)).detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        """DFlash's slot and block metrics (slots numbered from 1, the anchor's first), and the confidence head's
        mean absolute error."""
        metrics = super().eval_metrics(sums[:-1], prefix)
        labelled = float(sums[(sums.numel() - 3) // 2: sums.numel() - 3].sum())
        return metrics | {f"{prefix}_confidence_error": float(sums[-1]) / max(1.0, labelled)}


__all__ = ["DSparkConfig", "DSparkTrainer", "build_dspark", "dspark_block_inputs"]
