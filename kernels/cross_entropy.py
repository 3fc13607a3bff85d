"""Cross-entropies of an LM head's logits, chunked over the tokens: to labels (with ``ignore_index`` and label
smoothing: Medusa's heads, LayerSkip's exits, CLLM's AR loss, BiTA's masks, sequence-level KD) and to a frozen
teacher's distribution (EAGLE's token loss). Each is a pure per-row function run through the chunked driver of
:mod:`draftsmith.kernels.reference` (:func:`~draftsmith.kernels.reference.chunked_linear_loss`), so only
``[chunk, V]`` buffers exist; the soft cross-entropy can also take the Triton kernel's divergence rows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from draftsmith.kernels.reference import (
    ChunkedLinearLoss,
    RowsFn,
    check_inputs,
    chunked_linear_loss,
    counted_rows,
    detached,
    flatten_inputs,
    loss_dtype,
    need_grads,
    resolve_chunk_size,
    teacher_chunk,
)


def cross_entropy_rows(
    logits: torch.Tensor,  # [C, V]
    labels: torch.Tensor,  # [C] long, every one a class index
    label_smoothing: float = 0.0,
) -> torch.Tensor:  # [C] float32
    """Per-row cross-entropy ``(1 - eps) * (-log q_y) + eps * mean_v(-log q_v)``, ``q = softmax(logits)``:
    ``torch.nn.functional.cross_entropy(..., label_smoothing=eps, reduction="none")`` in float32 (Szegedy et al.
    2016's label smoothing; ``eps = 0`` is the plain negative log-likelihood)."""
    return F.cross_entropy(logits.to(loss_dtype(logits)), labels, reduction="none",
                           label_smoothing=float(label_smoothing))


def soft_cross_entropy_rows(
    logits: torch.Tensor,  # [C, V] student
    teacher_logits: torch.Tensor,  # [C, V]
    temperature: float = 1.0,
) -> torch.Tensor:  # [C] float32
    """Per-row cross-entropy to the teacher's distribution ``H(p, q) = - sum_v p_v log q_v`` with
    ``p = softmax(teacher / T)``, ``q = softmax(logits / T)`` (EAGLE's ``L_cls``); equals ``D_KL(p || q) + H(p)``, so
    its gradient w.r.t. the student logits is the forward KL's. The teacher side is frozen."""
    dtype = loss_dtype(logits)
    p = torch.softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)  # [C, V]
    return -(p * torch.log_softmax(logits.to(dtype) / temperature, dim=-1)).sum(-1)


def soft_cross_entropy_grad_rows(
    logits: torch.Tensor,  # [C, V] student
    teacher_logits: torch.Tensor,  # [C, V]
    temperature: float,
    grad_scale: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [C] float32, [C, V] float32 | None
    """:func:`soft_cross_entropy_rows` and ``grad_scale * dH/dz`` in closed form, the chunked driver's per-chunk step:
    ``dH(p, softmax(z / T))/dz_v = (q_v - p_v) / T`` (``p`` sums to 1), with no autograd graph per chunk."""
    dtype = loss_dtype(logits)
    p = torch.softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)  # [C, V]
    log_q = torch.log_softmax(logits.detach().to(dtype) / temperature, dim=-1)  # [C, V]
    per_row = -(p * log_q).sum(-1)  # [C]
    if not need_grad:
        return per_row, None
    return per_row, log_q.exp_().sub_(p).mul_(grad_scale / temperature)


def teacher_entropy_rows(teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:  # [C, V] -> [C]
    """``H(p) = - sum_v p_v log p_v`` of ``p = softmax(teacher / T)`` (zero-probability entries add 0)."""
    logp = torch.log_softmax(teacher_logits.to(loss_dtype(teacher_logits)) / temperature, dim=-1)  # [C, V]
    return -torch.where(logp > -math.inf, logp.exp() * logp, torch.zeros_like(logp)).sum(-1)


def labelled(labels: torch.Tensor, mask: torch.Tensor | None, ignore_index: int) -> torch.Tensor:  # [...] bool
    """The tokens a cross-entropy counts: ``labels != ignore_index`` (and ``mask``)."""
    keep = labels != ignore_index
    return keep if mask is None else keep & mask.to(device=keep.device, dtype=torch.bool)


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [V, H]
    labels: torch.Tensor,  # [...] long
    *,
    bias: torch.Tensor | None = None,  # [V]
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    mask: torch.Tensor | None = None,  # [...] bool
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> torch.Tensor:  # scalar float32
    """``torch.nn.functional.cross_entropy(h @ W.T + b, labels, ignore_index=..., label_smoothing=...)`` (mean over the
    labelled tokens, or their sum), chunked: :func:`cross_entropy_rows` through
    :func:`~draftsmith.kernels.reference.chunked_linear_loss`."""
    if not 0.0 <= float(label_smoothing) < 1.0:
        raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(f"labels {tuple(labels.shape)} must match the token dims {tuple(hidden.shape[:-1])}")
    eps = float(label_smoothing)
    return chunked_linear_loss(hidden, weight, lambda z, y, _: cross_entropy_rows(z, y, eps), bias=bias,
                               labels=labels, mask=labelled(labels, mask, ignore_index), reduction=reduction,
                               chunk_size=chunk_size)


def chunked_linear_soft_cross_entropy(
    hidden: torch.Tensor,  # [..., H] student
    weight: torch.Tensor,  # [V, H]
    teacher_logits: torch.Tensor | None = None,  # [..., V]
    *,
    bias: torch.Tensor | None = None,
    teacher_hidden: torch.Tensor | None = None,  # [..., Ht]
    teacher_weight: torch.Tensor | None = None,  # [V, Ht]
    teacher_bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
    chunk_size: int | None = None,
    rows_fn: RowsFn | None = None,
) -> torch.Tensor:  # scalar float32
    """Mean (or sum) over unmasked tokens of :func:`soft_cross_entropy_rows` ``H(p_teacher, q_student)``, chunked.
    With ``rows_fn`` (a :data:`RowsFn`, e.g. the Triton kernel's) each chunk is its forward KL plus the teacher's
    entropy :func:`teacher_entropy_rows` (the same value; the same gradient, the entropy being constant)."""
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    t = float(temperature)
    if (teacher_logits is None) == (teacher_hidden is None):
        raise ValueError("pass either teacher_logits or teacher_hidden + teacher_weight (exactly one)")
    hidden, teacher_logits, teacher_hidden, mask, _ = flatten_inputs(hidden, teacher_logits, teacher_hidden, mask)
    check_inputs(hidden, weight, bias, teacher_logits, teacher_hidden, teacher_weight, teacher_bias, reduction)
    teacher = tuple(detached(x) for x in (teacher_logits, teacher_hidden, teacher_weight, teacher_bias))

    def chunk_fn(z_c, idx, grad_scale, need_grad):
        t_c = teacher_chunk(idx, *teacher)  # [C, V]
        if rows_fn is None:
            return soft_cross_entropy_grad_rows(z_c, t_c, t, grad_scale, need_grad)
        kl, grad = rows_fn(z_c, t_c, "forward_kl", 0.5, t, grad_scale, need_grad)
        return kl + teacher_entropy_rows(t_c, t).to(kl.dtype), grad

    n = hidden.shape[0]
    chunk_size = resolve_chunk_size(chunk_size, n, weight.shape[0], hidden.shape[1], hidden.device)
    return ChunkedLinearLoss.apply(hidden, weight, bias, counted_rows(n, mask, hidden.device), chunk_fn, reduction,
                                   chunk_size, need_grads(hidden, weight, bias))


__all__ = ["chunked_linear_cross_entropy", "chunked_linear_soft_cross_entropy", "cross_entropy_rows", "labelled",
           "soft_cross_entropy_grad_rows", "soft_cross_entropy_rows", "teacher_entropy_rows"]
