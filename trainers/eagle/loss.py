"""EAGLE-3's token loss over the training-time test (Li et al. 2025, sec. 3): the trainable module whose forward
unrolls the head (:func:`~draftsmith.trainers.eagle.ttt.unrolled_states`) and sums
every step's cross-entropy to the target's distribution over the draft vocabulary, chunk by chunk over that
vocabulary (:mod:`draftsmith.trainers.losses`). The loss's definition and the trainer:
:mod:`draftsmith.trainers.eagle.trainer`."""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.common.precision import first_argmax
from draftsmith.trainers.eagle.ttt import Eagle3TTT, kept, shifted, ttt_start, unrolled_states
from draftsmith.trainers.losses import LinearHead, head_divergence, head_rows_map, head_soft_cross_entropy


class Eagle3Training(Eagle3TTT):
    """EAGLE-3's trainable module as :class:`EagleTrainer` runs it: ``forward`` is the unrolled training-time test
    *and* its token loss (one forward per training step, as data-parallel wrappers require), every step's draft
    logits chunked over the draft vocabulary beside the target's distribution over it. The artefact keeps the head's
    own tensors (:class:`~draftsmith.trainers.eagle.ttt.Eagle3TTT`)."""

    def forward(self, features: torch.Tensor, step_embeds: torch.Tensor, keep: torch.Tensor,
                label_hidden: torch.Tensor, target_head: nn.Module, decay: float | list[float], called: bool = False,
                top1: bool = False, token_loss: str = "ce") -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``features`` ``[B, A, 3Ht]``, ``step_embeds`` ``[K, B, A, H]``, ``keep`` ``[K, B, A]`` (the anchors each
        step trains on), ``label_hidden`` ``[B, A, Ht]`` (the target's last hidden state at ``t + 1``, whose LM head
        ``target_head`` gives ``p_{t+2}``) -> ``(sum_j decay**j CE_j, [K] CE_j, [K] x [N_j] the draft's greedy target
        ids when top1)``, ``CE_j = sum_t H(p_{t+2+j}|Vd, q^j_t)`` over step ``j``'s anchors (module docstring);
        ``called``: the LM heads are sharded and called chunk by chunk; ``decay`` a list: step ``j``'s weight;
        ``token_loss`` another divergence in place of the cross-entropy (:mod:`draftsmith.kernels.divergences`: the LK
        losses ``nla`` and ``lk_hybrid``, ``sum_t D(p_{t+2+j}|Vd || q^j_t)``)."""
        draft = LinearHead(self.head.lm_head, called=called)
        label_head = LinearHead(target_head, rows=self.t2d.nonzero().squeeze(1), called=called)  # [Vd] draft order
        total = features.new_zeros((), dtype=torch.float32)
        ce_sums, tops = [], []
        start = ttt_start(keep)  # steps after the first run from the first anchor they train on
        for j, hidden in enumerate(unrolled_states(self.head, features, step_embeds, self.recompute, start)):
            rows = self.head.logits_input(hidden[kept(keep, j, start)])  # [N_j, H]: what the draft LM head reads
            labels = shifted(label_hidden, j)[keep[j]]  # [N_j, Ht]: p_{t+2+j}, from the target's state at t+1+j
            ce = head_soft_cross_entropy(rows, draft, labels, label_head) if token_loss == "ce" else \
                head_divergence(rows, draft, labels, label_head, kind=token_loss)
            total = total + (decay[j] if isinstance(decay, list) else decay ** j) * ce
            ce_sums.append(ce.detach())
            if top1:
                tops.append(self.to_target(head_rows_map(rows.detach(), draft, lambda z, _, __: first_argmax(z))))
        return total, torch.stack(ce_sums), tops


__all__ = ["Eagle3Training"]
