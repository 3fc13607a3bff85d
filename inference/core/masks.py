"""Attention masks of token trees and causal blocks: the ancestor relation of a tree (:func:`causal_tree_mask`), its
nodes' depths, which keys each new query sees after a cache (:func:`visibility`, with a sliding window) and the
additive float mask transformers' attention layers take (:func:`additive_mask`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def causal_tree_mask(parents: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self relation of a token tree, ``[n, n]`` bool: ``m[i, j]`` is True when node
    ``j`` is node ``i`` or one of its ancestors. ``parents[i]`` is the index of node ``i``'s parent
    (``-1`` for a child of the root); parents come before children."""
    parents = torch.as_tensor(parents, dtype=torch.long).tolist()
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"tree node {i} has parent {p}: parents must come before children")
        if p >= 0:
            m[i] = m[p]
        m[i, i] = True
    return m


def tree_depths(parents: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Depth of every node (children of the root have depth 1), ``[n]`` long."""
    parents = torch.as_tensor(parents, dtype=torch.long).tolist()
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return torch.tensor(depth, dtype=torch.long)


def additive_mask(
    visible: torch.Tensor,  # [T, L] or [B, T, L] bool: query t may attend to key l
    dtype: torch.dtype,
) -> torch.Tensor:  # [1, 1, T, L] or [B, 1, T, L]
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None] if visible.dim() == 2 else mask[:, None]


def visibility(
    past: int,
    new_visible: torch.Tensor,  # [T, T] bool among the new tokens (causal or tree)
    query_pos: torch.Tensor,  # [T] absolute positions of the new tokens
    window: int | None = None,
) -> torch.Tensor:  # [T, past + T] bool
    t = new_visible.shape[0]
    vis = torch.cat([new_visible.new_ones(t, past), new_visible], dim=1)
    if window is not None:
        key_pos = torch.cat([torch.arange(past, device=query_pos.device), query_pos])
        vis = vis & ((query_pos[:, None] - key_pos[None, :]) < window)
    return vis


__all__ = ["additive_mask", "causal_tree_mask", "tree_depths", "visibility"]
