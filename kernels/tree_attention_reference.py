"""Decode-time tree attention in PyTorch: the reference the Triton kernel
(:mod:`draftsmith.kernels.triton_tree_attention`) is checked against, and the CPU path of
:func:`draftsmith.kernels.tree_attention.tree_attention`."""

from __future__ import annotations

import torch


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


__all__ = ["check_shapes", "tree_attention_reference", "tree_visibility"]
