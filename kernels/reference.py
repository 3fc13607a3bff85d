"""Fused, chunked linear + divergence loss: the PyTorch reference (also the CPU path).

The distillation loss of a draft model needs ``softmax(h @ W.T)`` over a large vocabulary for every
token, next to the teacher's distribution. Materialising both ``[N, V]`` float32 probability tables
(plus the autograd buffers behind them) dominates memory: for N = 4096 tokens and V = 32000 one
float32 table is 524 MB. Following Liger-Kernel's ``FusedLinearCrossEntropy``, the driver here walks
over the tokens in chunks of ``C`` rows and, for each chunk, computes the student logits
``z_c = h_c @ W.T (+ b)``, the teacher logits (a slice of the given ``[N, V]`` logits, or
``h_t,c @ W_t.T (+ b_t)``), the per-row divergence and ``dL/dz_c``, and immediately folds that into
``dL/dh_c = dL/dz_c @ W`` and ``dL/dW += dL/dz_c.T @ h_c``. Only ``[C, V]`` buffers are ever alive;
the gradients are kept from the forward and scaled by the incoming gradient in the backward.

The per-chunk math is pluggable (``rows_fn``): :func:`reference_divergence_rows` differentiates the
pure functions of :mod:`draftsmith.kernels.divergences` with autograd (so the reference *is* the loss
definition); :mod:`draftsmith.kernels.triton_divergence` computes the same rows with a Triton kernel.
:func:`naive_linear_divergence` is the unfused baseline both are tested against.

The same driver runs any per-row loss of the logits (:func:`chunked_linear_loss`, the per-row function
differentiated with autograd chunk by chunk): the cross-entropies of :mod:`draftsmith.kernels.cross_entropy` are
built on it, and :mod:`draftsmith.kernels.head_calls` runs the same per-row losses through calls of a head whose
parameters are sharded.

Divergence definitions, conventions and equations: :mod:`draftsmith.kernels.divergences`
(DistillSpec, Zhou et al. 2023; GKD, Agarwal et al. 2024). The teacher is frozen: no gradient flows to
the teacher's logits, hidden states or LM head.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from draftsmith.kernels.divergences import check_divergence_args, divergence, divergence_per_token

# rows_fn(student_logits [C, V] (h.dtype, owned by the driver: may be overwritten), teacher_logits [C, V],
#         kind, beta, temperature, grad_scale, need_grad) -> (per-row divergence [C] float32,
#                                                             grad_scale * dL/dz [C, V] or None)
RowsFn = Callable[
    [torch.Tensor, torch.Tensor, str, float, float, float, bool], tuple[torch.Tensor, torch.Tensor | None]
]
# row_loss(student_logits [C, V] float32, labels [C] long | None, teacher_logits [C, Vt] | None) -> per-row loss [C]:
# a pure, differentiable function of the student logits (the teacher's are frozen)
RowLoss = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]
# chunk_fn(student_logits [C, V] (owned: may be overwritten), rows [C] long, grad_scale, need_grad)
#   -> (per-row loss [C], grad_scale * dL/dz [C, V] or None): the per-chunk step of the driver
ChunkFn = Callable[[torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor | None]]


def loss_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 for half-precision logits, float64 for float64 ones (as :mod:`draftsmith.kernels.divergences`)."""
    return torch.promote_types(t.dtype, torch.float32)


def reference_divergence_rows(
    student_logits: torch.Tensor,  # [C, V]
    teacher_logits: torch.Tensor,  # [C, V]
    kind: str,
    beta: float,
    temperature: float,
    grad_scale: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [C] float32, [C, V] float32 | None
    """Per-row divergence and ``grad_scale * d(divergence)/d(student_logits)`` by autograd."""
    return autograd_rows(lambda z, _, t: divergence_per_token(z, t, kind, beta, temperature), student_logits, None,
                         teacher_logits, grad_scale, need_grad)


def autograd_rows(
    row_loss: RowLoss,
    student_logits: torch.Tensor,  # [C, V]
    labels: torch.Tensor | None,  # [C]
    teacher_logits: torch.Tensor | None,  # [C, Vt]
    grad_scale: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [C] float32, [C, V] float32 | None
    """``row_loss`` of one chunk and ``grad_scale * d(row_loss)/d(student_logits)`` by autograd: the reference's
    per-chunk step for any per-row loss."""
    with torch.enable_grad():
        z = student_logits.detach().to(loss_dtype(student_logits)).requires_grad_(need_grad)  # [C, V]
        per_row = row_loss(z, labels, None if teacher_logits is None else teacher_logits.detach())  # [C]
        if not need_grad:
            return per_row.detach(), None
        (grad,) = torch.autograd.grad(per_row.sum() * grad_scale, z)  # [C, V]
    return per_row.detach(), grad


GPU_CHUNK_BYTES = 2**30  # on a GPU a [C, V] float32 chunk may take up to 1 GiB (docs/GPU.md: rows per chunk)
# On the CPU every chunk pays a fixed [V, H] cost (the LM head's gradient cast and added in float32) against its
# C x V x H products: below ~128 rows that cost dominates. SmolLM2's shape, 1,024 tokens, one thread, bfloat16
# autocast: 15.7 s a step in the heuristic's 16-row chunks, 7.6 s in 128-row ones, 6.8 s in one chunk.
CPU_MIN_CHUNK_ROWS = 128
# ... and as many more rows as a 16 MiB float32 [C, V] chunk holds, where the vocabulary is small (a reduced draft
# vocabulary): EAGLE-3 on the tiny zoo (Vd 2,048) then computes a step's rows in one chunk instead of three, while a
# vocabulary of 32k or more keeps the 128-row chunks measured above.
CPU_CHUNK_BYTES = 16 * 2**20


def default_chunk_size(n_tokens: int, vocab: int, hidden: int, budget_bytes: int | None = None) -> int:
    """Liger-Kernel's heuristic: chunk rows so that one ``[C, V]`` logits chunk is about the size of the
    ``[N, H]`` hidden states, rounded up to a power of two (at least 1, at most ``n_tokens``). With ``budget_bytes``
    (a GPU's), at least the largest power of two of rows whose ``[C, V]`` float32 chunk fits it: small chunks leave a
    GPU idle (an H200 ran 2,048 tokens x 256k vocabulary 27x faster in 1,024-row chunks than in the heuristic's 16,
    for 16% more peak memory)."""
    factor = max(1, math.ceil(vocab / max(hidden, 1)))
    rows = max(1, math.ceil(n_tokens / factor))
    rows = 1 << (rows - 1).bit_length()
    if budget_bytes is not None:
        fits = max(1, budget_bytes // (4 * max(vocab, 1)))
        rows = max(rows, 1 << (fits.bit_length() - 1))
    return max(1, min(rows, max(n_tokens, 1)))


def resolve_chunk_size(chunk_size: int | None, n: int, vocab: int, hidden: int, device: torch.device) -> int:
    """``chunk_size``, or :func:`default_chunk_size` (with the GPU budget on CUDA; elsewhere the CPU's, and at least
    :data:`CPU_MIN_CHUNK_ROWS` rows); refuses a size below 1."""
    if chunk_size is None:
        budget = GPU_CHUNK_BYTES if device.type == "cuda" else CPU_CHUNK_BYTES
        chunk_size = default_chunk_size(n, vocab, hidden, budget)
        if device.type != "cuda":
            chunk_size = max(chunk_size, min(CPU_MIN_CHUNK_ROWS, max(n, 1)))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return int(chunk_size)


def matmul_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype ``t``'s matrix products run in: autocast's on ``t``'s device when it is on, else ``t``'s own."""
    device = t.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return t.dtype


def teacher_chunk(
    rows: torch.Tensor,  # [C] long
    teacher_logits: torch.Tensor | None,  # [N, V]
    teacher_hidden: torch.Tensor | None,  # [N, Ht]
    teacher_weight: torch.Tensor | None,  # [V, Ht]
    teacher_bias: torch.Tensor | None,  # [V]
) -> torch.Tensor | None:  # [C, V]
    if teacher_logits is not None:
        return teacher_logits.index_select(0, rows)
    if teacher_hidden is None:
        return None
    logits = teacher_hidden.index_select(0, rows) @ teacher_weight.t()  # [C, V]
    return logits if teacher_bias is None else logits + teacher_bias


class ChunkedLinearLoss(torch.autograd.Function):
    """Loss and gradients chunk by chunk in the forward; the backward only rescales them. ``chunk_fn`` computes one
    chunk's per-row losses and their gradient w.r.t. the chunk's logits (the teacher, labels, ... it closes over)."""

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,  # [N, H]
        weight: torch.Tensor,  # [V, H]
        bias: torch.Tensor | None,  # [V]
        rows: torch.Tensor,  # [M] long, the unmasked token indices
        chunk_fn: ChunkFn,
        reduction: str,
        chunk_size: int,
        need_grads: tuple[bool, bool, bool],  # hidden, weight, bias
    ) -> torch.Tensor:  # scalar float32
        need_h, need_w, need_b = need_grads
        need_grad = need_h or need_w or need_b
        count = rows.numel()
        grad_scale = 1.0 / max(count, 1) if reduction == "mean" else 1.0
        compute = matmul_dtype(hidden)  # autocast's dtype when it is on (mixed precision), else the hidden states'
        grad_h = torch.zeros_like(hidden) if need_h else None  # [N, H]
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None  # [V, H]
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None  # [V]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
            w_c = weight.to(compute)  # [V, H], cast once per call (float32 master weights under mixed precision)
            b_c = None if bias is None else bias.to(compute)
            for start in range(0, count, chunk_size):
                idx = rows[start : start + chunk_size]  # [C]
                h_c = hidden.index_select(0, idx).to(compute)  # [C, H]
                z_c = h_c @ w_c.t()  # [C, V]
                if b_c is not None:
                    z_c += b_c
                per_row, g_c = chunk_fn(z_c, idx, grad_scale, need_grad)
                total += per_row.sum()
                if not need_grad:
                    continue
                g_c = g_c.to(compute)  # [C, V], as autograd would cast it for the matmuls
                if need_h:
                    grad_h.index_copy_(0, idx, (g_c @ w_c).to(grad_h.dtype))
                if need_w:
                    grad_w += (g_c.t() @ h_c).float()
                if need_b:
                    grad_b += g_c.float().sum(0)
                del z_c, g_c
        ctx.grads = (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
        )
        return total * grad_scale if reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grads = ctx.grads
        ctx.grads = None
        if not torch.equal(grad_output, torch.ones_like(grad_output)):
            grads = tuple(None if g is None else g * grad_output.to(g.dtype) for g in grads)
        return (*grads, *([None] * 5))


def flatten_inputs(
    hidden: torch.Tensor,
    teacher_logits: torch.Tensor | None,
    teacher_hidden: torch.Tensor | None,
    mask: torch.Tensor | None,
    labels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    lead = hidden.shape[:-1]
    flat = lambda x: None if x is None else x.reshape(-1, x.shape[-1])  # noqa: E731
    if mask is not None:
        if mask.shape != lead:
            raise ValueError(f"mask {tuple(mask.shape)} must match the token dims {tuple(lead)} of the hidden states")
        mask = mask.reshape(-1).to(device=hidden.device, dtype=torch.bool)
    if labels is not None:
        if labels.shape != lead:
            raise ValueError(f"labels {tuple(labels.shape)} must match the token dims {tuple(lead)} of the hidden "
                             "states")
        labels = labels.reshape(-1).to(hidden.device)
    return flat(hidden), flat(teacher_logits), flat(teacher_hidden), mask, labels


def check_inputs(
    hidden: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H]
    bias: torch.Tensor | None,
    teacher_logits: torch.Tensor | None,
    teacher_hidden: torch.Tensor | None,
    teacher_weight: torch.Tensor | None,
    teacher_bias: torch.Tensor | None,
    reduction: str,
    teacher_required: bool = True,
) -> None:
    n, h = hidden.shape
    if weight.dim() != 2 or weight.shape[1] != h:
        raise ValueError(f"student LM-head weight {tuple(weight.shape)} must be [V, {h}]")
    v = weight.shape[0]
    if bias is not None and bias.shape != (v,):
        raise ValueError(f"student LM-head bias {tuple(bias.shape)} must be [{v}]")
    if teacher_logits is not None and teacher_hidden is not None:
        raise ValueError("pass either teacher_logits or teacher_hidden + teacher_weight (exactly one)")
    if teacher_logits is None and teacher_hidden is None:
        if teacher_required:
            raise ValueError("pass either teacher_logits or teacher_hidden + teacher_weight (exactly one)")
    elif teacher_logits is not None:
        if teacher_weight is not None or teacher_bias is not None:
            raise ValueError("teacher_weight/teacher_bias go with teacher_hidden, not with teacher_logits")
        if teacher_logits.shape != (n, v):
            raise ValueError(f"teacher logits {tuple(teacher_logits.shape)} must be [{n}, {v}] (tokens, student vocab)")
    else:
        if teacher_weight is None:
            raise ValueError("teacher_hidden needs teacher_weight (the teacher's LM head [V, Ht])")
        if teacher_hidden.shape[0] != n or teacher_weight.shape != (v, teacher_hidden.shape[1]):
            raise ValueError(
                f"teacher hidden {tuple(teacher_hidden.shape)} and LM head {tuple(teacher_weight.shape)} must be "
                f"[{n}, Ht] and [{v}, Ht]: the teacher and the draft must share tokens and vocabulary"
            )
        if teacher_bias is not None and teacher_bias.shape != (v,):
            raise ValueError(f"teacher LM-head bias {tuple(teacher_bias.shape)} must be [{v}]")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def need_grads(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[bool, bool, bool]:
    grad_on = torch.is_grad_enabled()
    return (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
            grad_on and bias is not None and bias.requires_grad)


def counted_rows(n: int, mask: torch.Tensor | None, device: torch.device) -> torch.Tensor:  # [M] long
    return torch.arange(n, device=device) if mask is None else mask.nonzero().reshape(-1)


def detached(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.detach()


def chunked_linear_divergence(
    hidden: torch.Tensor,  # [..., H] student last hidden states
    weight: torch.Tensor,  # [V, H] student LM head
    teacher_logits: torch.Tensor | None = None,  # [..., V]
    *,
    bias: torch.Tensor | None = None,  # [V]
    teacher_hidden: torch.Tensor | None = None,  # [..., Ht]
    teacher_weight: torch.Tensor | None = None,  # [V, Ht]
    teacher_bias: torch.Tensor | None = None,  # [V]
    kind: str = "forward_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,  # [...] bool, True = token counts
    reduction: str = "mean",
    chunk_size: int | None = None,
    rows_fn: RowsFn = reference_divergence_rows,
) -> torch.Tensor:  # scalar float32
    """Mean (or sum) over unmasked tokens of ``divergence(h @ W.T + b, teacher logits)``, chunked.

    Same value and gradients (w.r.t. ``hidden``, ``weight``, ``bias``) as :func:`naive_linear_divergence`,
    without ever holding ``[N, V]`` float32 tables of both models: only ``[chunk_size, V]`` buffers.
    The teacher is given either as logits (sliced per chunk) or as hidden states and LM head (projected
    per chunk, without gradient). Gradients are computed in the forward (float32 accumulation for the
    LM head) and rescaled by the incoming gradient in the backward, so call ``backward`` at most once.
    """
    check_divergence_args(kind, beta, temperature)
    hidden, teacher_logits, teacher_hidden, mask, _ = flatten_inputs(hidden, teacher_logits, teacher_hidden, mask)
    check_inputs(hidden, weight, bias, teacher_logits, teacher_hidden, teacher_weight, teacher_bias, reduction)
    teacher = tuple(detached(x) for x in (teacher_logits, teacher_hidden, teacher_weight, teacher_bias))  # frozen
    beta, temperature = float(beta), float(temperature)

    def chunk_fn(z_c, idx, grad_scale, need_grad):
        t_c = teacher_chunk(idx, *teacher)  # [C, V]
        return rows_fn(z_c, t_c, kind, beta, temperature, grad_scale, need_grad)

    n = hidden.shape[0]
    chunk_size = resolve_chunk_size(chunk_size, n, weight.shape[0], hidden.shape[1], hidden.device)
    return ChunkedLinearLoss.apply(hidden, weight, bias, counted_rows(n, mask, hidden.device), chunk_fn, reduction,
                                   chunk_size, need_grads(hidden, weight, bias))


def chunked_linear_loss(
    hidden: torch.Tensor,  # [..., H] student hidden states
    weight: torch.Tensor,  # [V, H] student LM head
    row_loss: RowLoss,
    *,
    bias: torch.Tensor | None = None,  # [V]
    labels: torch.Tensor | None = None,  # [...] long
    teacher_logits: torch.Tensor | None = None,  # [..., V]
    teacher_hidden: torch.Tensor | None = None,  # [..., Ht]
    teacher_weight: torch.Tensor | None = None,  # [V, Ht]
    teacher_bias: torch.Tensor | None = None,  # [V]
    mask: torch.Tensor | None = None,  # [...] bool, True = token counts
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> torch.Tensor:  # scalar float32
    """Mean (or sum) over unmasked tokens of ``row_loss(h @ W.T + b, label, teacher logits)``, chunked like
    :func:`chunked_linear_divergence`: the same value and gradients (w.r.t. ``hidden``, ``weight``, ``bias``) as
    ``row_loss`` over the full ``[N, V]`` logits, with only ``[chunk_size, V]`` buffers alive. ``row_loss`` is
    differentiated with autograd chunk by chunk; labels and the (frozen) teacher are optional and sliced per chunk."""
    hidden, teacher_logits, teacher_hidden, mask, labels = flatten_inputs(hidden, teacher_logits, teacher_hidden,
                                                                           mask, labels)
    check_inputs(hidden, weight, bias, teacher_logits, teacher_hidden, teacher_weight, teacher_bias, reduction,
                  teacher_required=False)
    teacher = tuple(detached(x) for x in (teacher_logits, teacher_hidden, teacher_weight, teacher_bias))

    def chunk_fn(z_c, idx, grad_scale, need_grad):
        y_c = None if labels is None else labels.index_select(0, idx)  # [C]
        return autograd_rows(row_loss, z_c, y_c, teacher_chunk(idx, *teacher), grad_scale, need_grad)

    n = hidden.shape[0]
    chunk_size = resolve_chunk_size(chunk_size, n, weight.shape[0], hidden.shape[1], hidden.device)
    return ChunkedLinearLoss.apply(hidden, weight, bias, counted_rows(n, mask, hidden.device), chunk_fn, reduction,
                                   chunk_size, need_grads(hidden, weight, bias))


def naive_linear_divergence(
    hidden: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [V, H]
    teacher_logits: torch.Tensor | None = None,  # [..., V]
    *,
    bias: torch.Tensor | None = None,
    teacher_hidden: torch.Tensor | None = None,
    teacher_weight: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    kind: str = "forward_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:  # scalar float32
    """The unfused baseline: full ``[N, V]`` logits of both models, then :func:`~draftsmith.kernels.divergences.divergence`."""
    check_divergence_args(kind, beta, temperature)
    hidden, teacher_logits, teacher_hidden, mask, _ = flatten_inputs(hidden, teacher_logits, teacher_hidden, mask)
    check_inputs(hidden, weight, bias, teacher_logits, teacher_hidden, teacher_weight, teacher_bias, reduction)
    student_logits = hidden @ weight.t()  # [N, V]
    if bias is not None:
        student_logits = student_logits + bias
    if teacher_logits is None:
        with torch.no_grad():
            teacher_logits = teacher_hidden @ teacher_weight.t()  # [N, V]
            if teacher_bias is not None:
                teacher_logits = teacher_logits + teacher_bias
    return divergence(
        student_logits,
        teacher_logits.detach(),
        kind,
        beta=beta,
        temperature=temperature,
        mask=mask,
        reduction=reduction,
    )
