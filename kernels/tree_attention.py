"""Decode-time tree attention: the attention of ``T`` tree tokens (the pending token and the draft tree) over the
``P`` cached prefix keys plus the tree's own keys under the tree mask, with grouped-query attention.

    out[b, h, t] = sum_s softmax_s(q[b, h, t] . k[b, h // g, s] * scale  +  mask(t, s)) v[b, h // g, s]

with ``g = Hq / Hkv`` and ``mask(t, s) = 0`` where key ``s`` is visible to query ``t`` — every prefix key
``s < P``, and tree key ``s = P + j`` when ``tree[t, j]`` (``j`` is ``t`` or one of its ancestors) — ``-inf``
elsewhere. :func:`tree_attention_reference` is the PyTorch reference and the CPU path (the adapter's 4-D mask gives
the same result through the model's own attention); ``triton_tree_attention`` (:mod:`.triton_tree_attention`,
imported lazily) is the CUDA path, one program per (batch, query head, block of tree tokens), streaming the
keys in blocks with an online softmax.
"""

from __future__ import annotations

import torch

from draftsmith.kernels.dispatch import resolve_backend


def tree_visibility(prefix: int, tree: torch.Tensor) -> torch.Tensor:  # [T, P + T] bool
    """Every prefix key, plus the tree keys ``tree`` ([T, T] bool, ancestor-or-self) allows."""
    t = tree.shape[0]
    return torch.cat([tree.new_ones(t, prefix, dtype=torch.bool), tree.to(torch.bool)], dim=1)


def check_shapes(q: torch.Tensor, k: torch.Tensor, tree: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``Hq`` is a multiple of ``Hkv``, there are at least ``T`` keys and the tree is
    ``[T, T]``."""
    hq, t, hkv, s = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    if hq % hkv or s < t or tuple(tree.shape) != (t, t):
        raise ValueError(f"tree attention: q {tuple(q.shape)}, k {tuple(k.shape)}, tree {tuple(tree.shape)}: need "
                         "Hq divisible by Hkv, at least T keys and a [T, T] tree")


def tree_attention_reference(
    q: torch.Tensor,  # [B, Hq, T, D]
    k: torch.Tensor,  # [B, Hkv, P + T, D]
    v: torch.Tensor,  # [B, Hkv, P + T, D]
    tree: torch.Tensor,  # [T, T] bool
    scale: float | None = None,
) -> torch.Tensor:  # [B, Hq, T, D], q's dtype
    """Softmax attention in float32 under :func:`tree_visibility`; key/value heads repeated for GQA."""
    check_shapes(q, k, tree)
    hq, t, d = q.shape[1:]
    hkv, s = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)  # [B, Hq, S, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("bhtd,bhsd->bhts", q.float(), kf) * scale  # [B, Hq, T, S]
    visible = tree_visibility(s - t, tree.to(q.device))  # [T, S]
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("bhts,bhsd->bhtd", scores.softmax(-1), vf).to(q.dtype)


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree: torch.Tensor, scale: float | None = None,
                   backend: str = "auto") -> torch.Tensor:
    """Tree attention through ``backend``: ``auto`` (Triton on CUDA, the reference elsewhere), ``reference`` or
    ``triton`` (CUDA, or the CPU interpreter under ``TRITON_INTERPRET=1``)."""
    if resolve_backend(backend, q.device) == "triton":
        from draftsmith.kernels.triton_tree_attention import triton_tree_attention

        return triton_tree_attention(q, k, v, tree, scale)
    return tree_attention_reference(q, k, v, tree, scale)


__all__ = ["check_shapes", "tree_visibility", "tree_attention_reference", "tree_attention"]
