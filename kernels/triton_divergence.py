"""Triton kernel: per-row divergence and its gradient w.r.t. the student logits, for one chunk.

Imported lazily by :mod:`draftsmith.kernels.dispatch` (never at package import). It replaces
:func:`draftsmith.kernels.reference.reference_divergence_rows` inside the same chunked driver, so the
matmuls stay in PyTorch (cuBLAS) and only the ``[C, V]`` softmax/divergence math is fused.

One program per row; the vocabulary is walked in ``BLOCK_V`` blocks, so any ``V`` works:

1. online log-sum-exp of ``s = z / T`` (student) and ``t = x / T`` (teacher) (Milakov & Gimelshein 2018);
2. the divergence ``L`` and, where needed, the scalar ``c = sum_v q_v g_v``;
3. ``dL/dz_v = q_v (g_v - c) / T`` written over the student logits (in place, like Liger-Kernel),

where ``g_v = dL/dq_v`` is the gradient w.r.t. the student probabilities and
``q_v (g_v - c)`` is the softmax Jacobian applied to it. With teacher ``p`` and student ``q``
(definitions in :mod:`draftsmith.kernels.divergences`):

- forward KL ``sum p log(p/q)``:            ``dL/ds = q - p``
- reverse KL ``sum q log(q/p)``:            ``g = log(q/p) + 1``       -> ``dL/ds = q (log(q/p) - L)``
- JSD(beta), ``m = beta p + (1-beta) q``:   ``g = (1-beta) log(q/m)``  -> ``dL/ds = q (g - (1-beta) KL(q||m))``
- TVD ``1/2 sum |p - q|``:                  ``g = sign(q - p) / 2``    -> ``dL/ds = q (g - sum q g)``

Zero-probability entries (``-inf`` logits, or padding past ``V``) contribute 0, as in the reference.
Under ``TRITON_INTERPRET=1`` (set before this module is imported) the kernel runs on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

KIND_IDS = {"forward_kl": 0, "reverse_kl": 1, "jsd": 2, "tvd": 3}
MAX_BLOCK_V = 4096


@triton.jit
def _divergence_rows_kernel(
    S,  # student logits [C, V] (any float dtype); overwritten by the gradient when G == S
    stride_s,
    X,  # teacher logits [C, V]
    stride_x,
    G,  # gradient out [C, V]
    stride_g,
    LOSS,  # per-row divergence out [C] float32
    V,
    inv_temp,
    beta,
    grad_scale,
    KIND: tl.constexpr,  # 0 forward KL, 1 reverse KL, 2 JSD (0 < beta < 1), 3 TVD
    WRITE_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    S += row * stride_s
    X += row * stride_x
    G += row * stride_g
    offs = tl.arange(0, BLOCK_V)

    # 1. online log-sum-exp of both rows. The running maxima start at a finite floor so that a block
    #    of -inf logits never computes (-inf) - (-inf).
    max_s = -1e30
    max_t = -1e30
    sum_s = 0.0
    sum_t = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        inside = cols < V
        s = tl.load(S + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp
        t = tl.load(X + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp
        new_s = tl.maximum(max_s, tl.max(s, axis=0))
        new_t = tl.maximum(max_t, tl.max(t, axis=0))
        sum_s = sum_s * tl.exp(max_s - new_s) + tl.sum(tl.exp(s - new_s), axis=0)
        sum_t = sum_t * tl.exp(max_t - new_t) + tl.sum(tl.exp(t - new_t), axis=0)
        max_s = new_s
        max_t = new_t
    lse_s = max_s + tl.log(sum_s)
    lse_t = max_t + tl.log(sum_t)

    # 2. the divergence and the scalar c = sum_v q_v g_v of the softmax backward
    loss = 0.0
    c = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        inside = cols < V
        log_q = tl.load(S + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp - lse_s
        log_p = tl.load(X + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp - lse_t
        q = tl.exp(log_q)
        p = tl.exp(log_p)
        if KIND == 0:
            loss += tl.sum(tl.where(p > 0, p * (log_p - log_q), 0.0), axis=0)
        elif KIND == 1:
            loss += tl.sum(tl.where(q > 0, q * (log_q - log_p), 0.0), axis=0)
        elif KIND == 2:
            log_m = tl.log(beta * p + (1.0 - beta) * q)
            kl_q = tl.sum(tl.where(q > 0, q * (log_q - log_m), 0.0), axis=0)
            kl_p = tl.sum(tl.where(p > 0, p * (log_p - log_m), 0.0), axis=0)
            loss += beta * kl_p + (1.0 - beta) * kl_q
            c += (1.0 - beta) * kl_q
        else:
            diff = q - p
            loss += 0.5 * tl.sum(tl.abs(diff), axis=0)
            c += tl.sum(q * tl.where(diff > 0, 0.5, tl.where(diff < 0, -0.5, 0.0)), axis=0)
    tl.store(LOSS + row, loss)

    # 3. dL/dz = q (g - c) / T, scaled
    if WRITE_GRAD:
        if KIND == 1:
            c = loss
        scale = inv_temp * grad_scale
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            inside = cols < V
            log_q = tl.load(S + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp - lse_s
            log_p = tl.load(X + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp - lse_t
            q = tl.exp(log_q)
            p = tl.exp(log_p)
            if KIND == 0:
                grad = q - p
            elif KIND == 1:
                grad = tl.where(q > 0, q * (log_q - log_p - c), 0.0)
            elif KIND == 2:
                log_m = tl.log(beta * p + (1.0 - beta) * q)
                grad = tl.where(q > 0, q * ((1.0 - beta) * (log_q - log_m) - c), 0.0)
            else:
                diff = q - p
                grad = q * (tl.where(diff > 0, 0.5, tl.where(diff < 0, -0.5, 0.0)) - c)
            tl.store(G + cols, (grad * scale).to(G.dtype.element_ty), mask=inside)


def _launch_config(vocab: int, block_v: int | None) -> tuple[int, int]:
    block = block_v or min(triton.next_power_of_2(vocab), MAX_BLOCK_V)
    if block & (block - 1):
        raise ValueError(f"block_v must be a power of two, got {block}")
    warps = 4 if block <= 1024 else 8 if block <= 2048 else 16
    return block, warps


def triton_divergence_rows(
    student_logits: torch.Tensor,  # [C, V]; overwritten by the gradient when need_grad
    teacher_logits: torch.Tensor,  # [C, V]
    kind: str,
    beta: float,
    temperature: float,
    grad_scale: float,
    need_grad: bool,
    block_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [C] float32, [C, V] (student dtype) | None
    """Per-row divergence and ``grad_scale * dL/d(student_logits)``; the same contract as
    :func:`draftsmith.kernels.reference.reference_divergence_rows`, but the gradient is written over
    ``student_logits`` (in its dtype) to save a ``[C, V]`` buffer."""
    if kind == "jsd" and beta in (0.0, 1.0):  # the endpoint convention of draftsmith.kernels.divergences
        kind = "forward_kl" if beta == 0.0 else "reverse_kl"
    rows, vocab = student_logits.shape
    student_logits = student_logits if student_logits.stride(-1) == 1 else student_logits.contiguous()
    teacher_logits = teacher_logits if teacher_logits.stride(-1) == 1 else teacher_logits.contiguous()
    loss = torch.empty(rows, dtype=torch.float32, device=student_logits.device)  # [C]
    if rows == 0:
        return loss, student_logits if need_grad else None
    block, warps = _launch_config(vocab, block_v)
    _divergence_rows_kernel[(rows,)](
        student_logits,
        student_logits.stride(0),
        teacher_logits,
        teacher_logits.stride(0),
        student_logits,
        student_logits.stride(0),
        loss,
        vocab,
        1.0 / temperature,
        float(beta),
        float(grad_scale),
        KIND=KIND_IDS[kind],
        WRITE_GRAD=need_grad,
        BLOCK_V=block,
        num_warps=warps,
    )
    return loss, student_logits if need_grad else None
