"""The trainers' losses, each a pure function with its paper's equation beside it.

The four DistillSpec divergences (forward KL, reverse KL, JSD(beta), TVD) are defined once, in
:mod:`draftsmith.kernels.divergences` (the fused kernels' reference math), and used here.

Every loss over a vocabulary goes through an LM head chunk by chunk (:class:`LinearHead` and the ``head_*``
functions): the fused linear + loss of :mod:`draftsmith.kernels` (the Triton kernel on CUDA where it has the loss,
the chunked PyTorch reference elsewhere) reads the head's weight; a head whose parameters are sharded (ZeRO-3, FSDP)
is called chunk by chunk under activation checkpointing instead. Either way no ``[tokens, vocabulary]`` float32
table exists beyond one chunk, and a teacher distribution ``softmax(teacher_head(h_teacher))`` is computed inside the
same loop from the teacher's hidden states. Sums are returned: the base trainer divides by the loss tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.common.errors import ConfigError
from draftsmith.common.precision import first_argmax
from draftsmith.common.sharding import full_shape, partitioned
from draftsmith.data.chat import IGNORE_INDEX
from draftsmith.kernels import (
    checkpointed_head_loss,
    chunked_head_rows,
    fused_linear_cross_entropy,
    fused_linear_divergence,
    fused_linear_loss,
    fused_linear_soft_cross_entropy,
)
from draftsmith.kernels.cross_entropy import cross_entropy_rows, soft_cross_entropy_rows
from draftsmith.kernels.divergences import (
    DIVERGENCES,
    check_divergence_args,
    divergence,
    divergence_per_token,
    forward_kl,
    generalized_jsd,
    reverse_kl,
    total_variation,
)
from draftsmith.kernels.reference import RowLoss
from draftsmith.trainers.logits import draft_argmax, head_rows, logit_transform, proposal_logits

__all__ = ["DIVERGENCES", "LinearHead", "acceptance_from_tvd", "acceptance_rows", "check_divergence_args",
           "check_plain_logits", "divergence", "divergence_per_token", "forward_kl", "generalized_jsd",
           "head_cross_entropy", "head_divergence", "head_loss", "head_rows_map", "head_soft_cross_entropy",
           "head_weighted_cross_entropy", "last_hidden", "plain_linear", "reverse_kl", "sequence_kd_nll", "token_sum",
           "total_variation"]


def acceptance_from_tvd(tvd: torch.Tensor | float) -> torch.Tensor | float:
    """Expected speculative-sampling acceptance rate ``alpha = 1 - TVD(p, q) = sum_v min(p_v, q_v)``
    (Leviathan et al. 2023, Sec. 3; DistillSpec, Zhou et al. 2023)."""
    return 1 - tvd


def acceptance_rows(student: torch.Tensor, teacher: torch.Tensor,
                    draft_ids: torch.Tensor | None) -> torch.Tensor:  # [C, V] x 2 -> [C, 2]
    """Per token: ``TVD(p, q_K)`` between the target's distribution and the one the draft proposes from (temperature
    1, over its vocabulary ``draft_ids`` renormalised: :func:`~draftsmith.trainers.logits.proposal_logits`; ``1 -
    TVD`` is the expected acceptance of speculative sampling) and whether the draft's greedy token over that
    vocabulary is the target's (greedy acceptance)."""
    tvd = divergence_per_token(proposal_logits(student, draft_ids), teacher, "tvd")  # [C]
    return torch.stack([tvd, (draft_argmax(student, draft_ids) == first_argmax(teacher)).to(tvd.dtype)], -1)


def last_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:  # [B, T, H]
    """A causal LM's final-normed last hidden state, its LM head's input, from a forward that computes one
    position's logits only (the chunked losses project the rest)."""
    return model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                 logits_to_keep=1).hidden_states[-1]


def token_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # [...], [...] bool -> scalar
    """Sum of ``per_token`` over the positions ``mask`` keeps (non-finite values at masked positions ignored)."""
    return torch.where(mask, per_token, torch.zeros_like(per_token)).sum()


# ------------------------------------------------------------------------------------------ LM heads, chunked


@dataclass(frozen=True)
class LinearHead:
    """An LM head as the chunked losses read it: ``module`` (``h @ W.T (+ b)``), the vocabulary rows it scores
    (``rows``, token ids, in that order; else its first ``vocab`` rows, a padded head's real ones; else all of them)
    and whether its parameters can be read directly (``called=False``) or only inside calls of the module
    (``called=True``: sharded by ZeRO-3 or FSDP, gathered by the module's own hooks)."""

    module: nn.Module
    rows: torch.Tensor | None = None  # [K] long
    vocab: int | None = None
    called: bool = False

    @property
    def width(self) -> int:
        """The number of logits per token."""
        if self.rows is not None:
            return int(self.rows.numel())
        full = int(full_shape(self.module.weight)[0])
        return full if self.vocab is None else min(int(self.vocab), full)

    def _columns(self, logits: torch.Tensor) -> torch.Tensor:  # [C, V'] -> [C, K]
        if self.rows is not None:
            return logits.index_select(-1, self.rows.to(logits.device))
        return logits if self.vocab is None else logits[..., : int(self.vocab)]

    def weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:  # [K, H], [K]
        """The weight rows and bias entries of the scored vocabulary (differentiable: gradients reach the module)."""
        return head_rows(self.module, self.vocab, self.rows)

    def frozen_partitioned(self) -> bool:
        """Whether the module is frozen and ZeRO-3 partitions it (the target's LM head in its inference engine): its
        shards are released after its forward, and only the reentrant checkpoint reruns that forward, hooks and all,
        in the backward. A trained module's engine re-gathers for the non-reentrant recomputation itself."""
        params = list(self.module.parameters())
        return any(partitioned(p) for p in params) and not any(p.requires_grad for p in params)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [C, H] -> [C, K]
        """One chunk's logits through a call of the module (its hooks gather sharded parameters)."""
        return self._columns(self.module(hidden))


def plain_linear(module: nn.Module, what: str) -> nn.Module:
    """``module`` when it is an ``nn.Linear`` (what the chunked losses read as ``h @ W.T + b``), else a
    :class:`ConfigError` naming it (``what``: e.g. "the adapted target's LM head")."""
    if not isinstance(module, nn.Linear):
        kind = f"{type(module).__module__}.{type(module).__name__}"
        raise ConfigError(f"{what} is a {kind}, not a torch.nn.Linear, and the chunked loss reads a plain LM head's "
                          "weight: leave the LM head out of lora_target_modules")
    return module


def check_plain_logits(config, method: str) -> None:
    """Refuse a model whose logits are more than ``last hidden state @ LM head`` (soft-capping, scaling): ``method``'s
    chunked loss computes them as that product."""
    transform = logit_transform(config)
    if transform:
        raise ConfigError(f"{method} computes its loss chunk by chunk as last hidden state @ LM head, and this model "
                          f"also applies {transform}: use a model without logit post-processing")


def _called(head: LinearHead, teacher: LinearHead | None) -> bool:
    return head.called or (teacher is not None and teacher.called)


def _check_precomputed(head: LinearHead, teacher_logits: torch.Tensor | None) -> None:
    if teacher_logits is not None and head.called:
        raise ValueError("precomputed teacher logits need a head whose weights can be read (not a sharded one)")


def _teacher_args(teacher_hidden: torch.Tensor | None, teacher: LinearHead | None,
                  teacher_logits: torch.Tensor | None = None) -> dict:
    """``teacher_hidden`` / ``teacher_weight`` / ``teacher_bias`` for the kernels (the hidden states in the head's
    dtype, never cast per step on the weight side), or the teacher's precomputed ``teacher_logits``."""
    if teacher_logits is not None:
        return {"teacher_logits": teacher_logits.detach()}
    if teacher is None:
        return {}
    weight, bias = (x.detach() if x is not None else None for x in teacher.weights())
    return {"teacher_hidden": teacher_hidden.to(weight.dtype), "teacher_weight": weight, "teacher_bias": bias}


def head_loss(
    hidden: torch.Tensor,  # [N, H]
    head: LinearHead,
    row_loss: RowLoss,
    *,
    labels: torch.Tensor | None = None,  # [N]
    teacher_hidden: torch.Tensor | None = None,  # [N, Ht]
    teacher: LinearHead | None = None,
    mask: torch.Tensor | None = None,  # [N] bool
    chunk_size: int | None = None,
) -> torch.Tensor:  # scalar float32
    """``sum_t row_loss(head(h_t), y_t, teacher(h'_t))`` over the tokens ``mask`` keeps, chunked (any per-row loss:
    :func:`~draftsmith.kernels.reference.chunked_linear_loss`, or the checkpointed calls of a sharded head)."""
    if _called(head, teacher):
        return checkpointed_head_loss(hidden, head.logits, row_loss, vocab=head.width, labels=labels,
                                      teacher_hidden=teacher_hidden, teacher_head=None if teacher is None else
                                      teacher.logits, mask=mask, reduction="sum", chunk_size=chunk_size,
                                      reentrant=head.frozen_partitioned())
    weight, bias = head.weights()
    return fused_linear_loss(hidden, weight, row_loss, bias=bias, labels=labels, mask=mask, reduction="sum",
                             chunk_size=chunk_size, **_teacher_args(teacher_hidden, teacher))


def head_cross_entropy(
    hidden: torch.Tensor,  # [N, H]
    head: LinearHead,
    labels: torch.Tensor,  # [N], IGNORE_INDEX = not counted
    *,
    label_smoothing: float = 0.0,
    chunk_size: int | None = None,
) -> torch.Tensor:  # scalar float32
    """``sum_t CE(softmax(head(h_t)), y_t)`` over the labelled tokens, with label smoothing ``eps``:
    ``(1 - eps) * (-log q_y) + eps * mean_v(-log q_v)`` per token (``torch.nn.functional.cross_entropy``), chunked."""
    if head.called:
        eps = float(label_smoothing)
        return head_loss(hidden, head, lambda z, y, _: cross_entropy_rows(z, y, eps), labels=labels,
                         mask=labels != IGNORE_INDEX, chunk_size=chunk_size)
    weight, bias = head.weights()
    return fused_linear_cross_entropy(hidden, weight, labels, bias=bias, ignore_index=IGNORE_INDEX,
                                      label_smoothing=label_smoothing, reduction="sum", chunk_size=chunk_size)


def head_weighted_cross_entropy(
    hidden: torch.Tensor,  # [N, H]
    head: LinearHead,
    labels: torch.Tensor,  # [N], IGNORE_INDEX = not counted
    weights: torch.Tensor,  # [N] frozen per-row weights
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:  # scalar float32
    """``sum_t w_t CE(softmax(head(h_t)), y_t)`` over the labelled tokens, chunked; the weights are constants (no
    gradient flows to them). Each chunk reads its rows' labels and weights by row index."""
    w = weights.detach().to(torch.float32)
    rows = torch.arange(labels.shape[0], device=labels.device)
    return head_loss(hidden, head, lambda z, i, _: w[i].to(z.device) * cross_entropy_rows(z, labels[i].to(z.device)),
                     labels=rows, mask=labels != IGNORE_INDEX, chunk_size=chunk_size)


def head_soft_cross_entropy(
    hidden: torch.Tensor,  # [N, H] student
    head: LinearHead,
    teacher_hidden: torch.Tensor,  # [N, Ht]
    teacher: LinearHead,
    *,
    mask: torch.Tensor | None = None,
    chunk_size: int | None = None,
    backend: str = "auto",
    teacher_logits: torch.Tensor | None = None,  # [N, V]
) -> torch.Tensor:  # scalar float32
    """``sum_t H(p_t, q_t) = - sum_t sum_v p_t(v) log q_t(v)``, ``p = softmax(teacher(h'))``, ``q = softmax(head(h))``
    (EAGLE's ``L_cls``), chunked; the teacher's distribution is computed per chunk from its hidden states, or read
    from its precomputed ``teacher_logits`` (``teacher_hidden`` and ``teacher`` then unused; not for a sharded head)."""
    _check_precomputed(head, teacher_logits)
    if _called(head, teacher):
        return head_loss(hidden, head, lambda z, _, t: soft_cross_entropy_rows(z, t), teacher_hidden=teacher_hidden,
                         teacher=teacher, mask=mask, chunk_size=chunk_size)
    weight, bias = head.weights()
    return fused_linear_soft_cross_entropy(hidden, weight, bias=bias, mask=mask, reduction="sum",
                                           chunk_size=chunk_size, backend=backend,
                                           **_teacher_args(teacher_hidden, teacher, teacher_logits))


def head_divergence(
    hidden: torch.Tensor,  # [..., H] student
    head: LinearHead,
    teacher_hidden: torch.Tensor,  # [..., Ht]
    teacher: LinearHead,
    *,
    kind: str = "forward_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,  # [...] bool
    chunk_size: int | None = None,
    backend: str = "auto",
    teacher_logits: torch.Tensor | None = None,  # [N, V]
) -> torch.Tensor:  # scalar float32
    """``sum_t D(p_t || q_t)`` (:mod:`draftsmith.kernels.divergences`) between ``softmax(teacher(h') / T)`` and
    ``softmax(head(h) / T)``, chunked: :func:`~draftsmith.kernels.fused_linear_divergence` (Triton on CUDA); the
    teacher's logits may come precomputed (``teacher_logits``, as :func:`head_soft_cross_entropy`)."""
    _check_precomputed(head, teacher_logits)
    if _called(head, teacher):
        check_divergence_args(kind, beta, temperature)
        return head_loss(hidden, head, lambda z, _, t: divergence_per_token(z, t, kind, beta, temperature),
                         teacher_hidden=teacher_hidden, teacher=teacher, mask=mask, chunk_size=chunk_size)
    weight, bias = head.weights()
    return fused_linear_divergence(hidden, weight, bias=bias, kind=kind, beta=beta, temperature=temperature,
                                   mask=mask, reduction="sum", chunk_size=chunk_size, backend=backend,
                                   **_teacher_args(teacher_hidden, teacher, teacher_logits))


def head_rows_map(
    hidden: torch.Tensor,  # [N, H]
    head: LinearHead,
    row_fn,
    *,
    labels: torch.Tensor | None = None,  # [N]
    teacher_hidden: torch.Tensor | None = None,  # [N, Ht]
    teacher: LinearHead | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:  # [N, ...]
    """``row_fn(head(h_c), y_c, teacher(h'_c))`` chunk by chunk, without gradient (evaluation statistics: argmax,
    ranks, per-token losses), through calls of the heads: one ``[C, V]`` chunk alive at a time."""
    return chunked_head_rows(hidden, head.logits, row_fn, vocab=head.width, labels=labels,
                             teacher_hidden=None if teacher is None else teacher_hidden.to(teacher.module.weight.dtype),
                             teacher_head=None if teacher is None else teacher.logits, chunk_size=chunk_size,
                             lockstep=_called(head, teacher))


def sequence_kd_nll(hidden: torch.Tensor, head: LinearHead, labels: torch.Tensor) -> torch.Tensor:  # [N, H], [N]
    """Sequence-level KD (Kim & Rush 2016: the sequence-level objective with the teacher's distribution over
    sequences approximated by its mode, here its greedy answer; GKD's "SeqKD" baseline):
    ``L = - sum_t log q(y_t | y_<t, x)`` along answers ``y`` the target wrote itself, summed over the ``N`` answer
    positions, over ``head``'s vocabulary (the draft's own rows). Labels of -100 (a token the draft's vocabulary
    cannot propose) are left out."""
    return head_cross_entropy(hidden, head, labels)
