"""EAGLE-3's token loss over the training-time test (Li et al. 2025, sec. 3): the trainable module whose forward
unrolls the head (:func:`~draftsmith.trainers.eagle.ttt.unrolled_states`) and sums
every step's cross-entropy to the target's distribution over the draft vocabulary, chunk by chunk over that
vocabulary (:mod:`draftsmith.trainers.losses`). The loss's definition and the trainer:
:mod:`draftsmith.trainers.eagle.trainer`."""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.common.precision import first_argmax
from draftsmith.trainers.eagle.ttt import Eagle3TTT, shifted, unrolled_states
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
        table = None if called else teacher_table(label_hidden, keep, label_head)
        total = features.new_zeros((), dtype=torch.float32)
        ce_sums, tops = [], []
        for j, hidden in enumerate(unrolled_states(self.head, features, step_embeds, self.recompute, keep)):
            rows = self.head.logits_input(hidden)  # [N_j, H]: what the draft LM head reads
            if table is None:
                labels, teacher, logits = shifted(label_hidden, j)[keep[j]], label_head, None  # [N_j, Ht]
            else:
                labels, teacher, logits = None, None, table[0].index_select(0, shifted(table[1], j)[keep[j]])
            ce = head_soft_cross_entropy(rows, draft, labels, teacher, teacher_logits=logits) if token_loss == "ce" \
                else head_divergence(rows, draft, labels, teacher, kind=token_loss, teacher_logits=logits)
            total = total + (decay[j] if isinstance(decay, list) else decay ** j) * ce
            ce_sums.append(ce.detach())
            if top1:
                tops.append(self.to_target(head_rows_map(rows.detach(), draft, lambda z, _, __: first_argmax(z))))
        return total, torch.stack(ce_sums), tops


TEACHER_TABLE_BYTES = 256 * 2**20  # the largest [U, Vd] float32 table of the target's logits made once per batch


def teacher_table(label_hidden: torch.Tensor, keep: torch.Tensor, label_head: LinearHead,
                  budget: int = TEACHER_TABLE_BYTES) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The target's logits over the draft vocabulary at every state some step's label reads, made once for all the
    unrolled steps instead of once per step (step ``j``'s label at anchor ``t`` is the state at ``t + j``, so each is
    read by up to ``K`` steps): ``([U, Vd] float32, [B, A] long: each anchor's row in it)`` from ``label_hidden``
    ``[B, A, Ht]`` and ``keep`` ``[K, B, A]``, computed as the chunked loss computes its teacher (float32, no
    autocast); None where the table would exceed ``budget`` bytes, or where a step trains an anchor whose label lies
    past the row (never from :func:`~draftsmith.trainers.eagle.ttt.ttt_anchors`): the loss then makes each chunk's
    own."""
    read = torch.zeros_like(keep[0])  # [B, A]: states some step's label reads
    anchors = keep.shape[2]
    for j in range(keep.shape[0]):
        if j and keep[j][:, anchors - j:].any():
            return None
        read[:, j:] |= keep[j][:, : anchors - j]
    if int(read.sum()) * label_head.width * 4 > budget:
        return None
    weight, bias = (None if x is None else x.detach() for x in label_head.weights())  # [Vd, Ht], [Vd]
    with torch.no_grad(), torch.autocast(label_hidden.device.type, enabled=False):
        logits = label_hidden[read].to(weight.dtype) @ weight.t()  # [U, Vd]
        if bias is not None:
            logits += bias
    return logits.float(), read.flatten().cumsum(0).view(read.shape) - 1


__all__ = ["Eagle3Training", "teacher_table"]
