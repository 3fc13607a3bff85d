"""Triton kernel of decode-time tree attention (the math: :mod:`draftsmith.kernels.tree_attention`).

One program per (batch, query head, block of ``BLOCK_T`` tree tokens). It streams the ``P + T`` keys in blocks of
``BLOCK_S`` with an online softmax in float32 (running max and sum; flash-attention's recurrence), reading the
shared key/value head ``h // (Hq / Hkv)`` (grouped-query attention). Both products run as ``tl.dot`` in float32
(IEEE for float32 inputs, TF32 for 16-bit ones: see :func:`triton_tree_attention`). Visibility: keys ``s < P``
always, tree keys ``s = P + j`` where the ``[T, T]`` int8 tree mask says so. Imported lazily by the dispatcher,
never at package import.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.kernels.tree_attention_reference import check_shapes


@triton.jit
def _tree_attention_kernel(
    Q, K, V, M, OUT,  # q [B, Hq, T, D], k/v [B, Hkv, S, D], tree mask [T, T] int8, out [B, Hq, T, D]
    sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, sob, soh, sot, smt,
    T, S, P, GROUP, scale,
    D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, PRECISION: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    tb = tl.program_id(2)
    kvh = h // GROUP
    offs_t = tb * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    offs_d = tl.arange(0, D)  # [D]
    t_ok = offs_t < T
    q = tl.load(Q + b * sqb + h * sqh + offs_t[:, None] * sqt + offs_d[None, :], mask=t_ok[:, None], other=0.0)
    q = q.to(tl.float32) * scale  # [BLOCK_T, D]
    m_i = tl.full([BLOCK_T], -1.0e30, tl.float32)  # running max (finite floor: no -inf - -inf)
    l_i = tl.zeros([BLOCK_T], tl.float32)  # running sum of exp
    acc = tl.zeros([BLOCK_T, D], tl.float32)
    for start in range(0, S, BLOCK_S):
        offs_s = start + tl.arange(0, BLOCK_S)  # [BLOCK_S]
        s_ok = offs_s < S
        k = tl.load(K + b * skb + kvh * skh + offs_s[:, None] * sks + offs_d[None, :], mask=s_ok[:, None], other=0.0)
        v = tl.load(V + b * svb + kvh * svh + offs_s[:, None] * svs + offs_d[None, :], mask=s_ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=PRECISION)  # [BLOCK_T, BLOCK_S]
        j = offs_s - P  # tree key index (negative for prefix keys)
        in_tree = (j >= 0) & s_ok
        tree_ok = tl.load(M + offs_t[:, None] * smt + j[None, :], mask=t_ok[:, None] & in_tree[None, :], other=0)
        visible = ((j < 0)[None, :] | (tree_ok != 0)) & s_ok[None, :] & t_ok[:, None]
        scores = tl.where(visible, scores, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # [BLOCK_T]
        p = tl.where(visible, tl.exp(scores - m_new[:, None]), 0.0)  # [BLOCK_T, BLOCK_S]
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.maximum(l_i, 1.0e-30)[:, None]
    tl.store(OUT + b * sob + h * soh + offs_t[:, None] * sot + offs_d[None, :], out.to(OUT.dtype.element_ty),
             mask=t_ok[:, None])


def triton_tree_attention(
    q: torch.Tensor,  # [B, Hq, T, D]
    k: torch.Tensor,  # [B, Hkv, P + T, D]
    v: torch.Tensor,  # [B, Hkv, P + T, D]
    tree: torch.Tensor,  # [T, T] bool
    scale: float | None = None,
    block_t: int = 16,
    block_s: int = 32,
    precision: str | None = None,
) -> torch.Tensor:  # [B, Hq, T, D]
    """``precision``: ``tl.dot``'s input precision; default ``ieee`` for float32 inputs (float32 results as the
    reference gives them) and ``tf32`` for 16-bit ones (exact on bfloat16 keys and values, far below their
    rounding elsewhere)."""
    check_shapes(q, k, tree)
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if d & (d - 1) or d < 16:
        raise ValueError(f"triton tree attention needs a power-of-two head dim >= 16, got {d}: use backend='reference'")
    # the kernel takes any batch/head/token strides (the KV cache's views, attention's transposed queries) but a
    # contiguous head dim: copy only what lacks one
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    mask = tree.to(device=q.device, dtype=torch.int8).contiguous()
    out = torch.empty_like(q)
    scale = d ** -0.5 if scale is None else scale
    grid = (b, hq, triton.cdiv(t, block_t))
    _tree_attention_kernel[grid](
        q, k, v, mask, out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), mask.stride(0),
        t, s, s - t, hq // hkv, float(scale),
        D=d, BLOCK_T=block_t, BLOCK_S=block_s,
        PRECISION=precision or ("ieee" if q.dtype == torch.float32 else "tf32"),
    )
    return out


__all__ = ["triton_tree_attention"]
