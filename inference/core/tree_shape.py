"""A draft tree's structure as verification uses it (:class:`TreeShape`: parents, depths, ancestors, the
verification mask, positions and sibling groups, derived once on the host and uploaded once per device), and its copy
on one device (:class:`DeviceTree`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from draftsmith.inference.core.masks import causal_tree_mask, tree_depths


class TreeShape:
    """The structure of a draft tree: ``parents`` (``[n]`` long, on the host) and what the verification derives from
    it, on the host (cached) and on the target's device (:meth:`on`: one upload per device, none for a chain, whose
    structure is made there). A proposer whose trees keep one shape (a static tree) shares one ``TreeShape`` between
    its drafts, so the device copy is made once."""

    def __init__(self, parents: torch.Tensor) -> None:
        self.parents = torch.as_tensor(parents, dtype=torch.long).reshape(-1)
        self._on: dict[torch.device, DeviceTree] = {}
        self._with_extras: tuple | None = None  # the last extras' (device, visible, depths, positions, mask)

    def __len__(self) -> int:
        return int(self.parents.numel())

    @cached_property
    def parent_list(self) -> list[int]:
        return self.parents.tolist()

    @cached_property
    def is_chain(self) -> bool:
        return self.parent_list == list(range(-1, len(self) - 1))

    @cached_property
    def depths(self) -> torch.Tensor:  # [n], children of the root have depth 1
        return torch.arange(1, len(self) + 1) if self.is_chain else tree_depths(self.parent_list)

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """``[n, n]`` bool: ``[i, j]`` when node ``j`` is node ``i`` or one of its ancestors."""
        n = len(self)
        if self.is_chain:
            return torch.ones(n, n, dtype=torch.bool).tril()
        return causal_tree_mask(self.parent_list)

    @cached_property
    def verify_mask(self) -> torch.Tensor | None:
        """``[1 + n, 1 + n]`` bool visibility for the verification forward (None = causal)."""
        if self.is_chain:
            return None
        n = len(self)
        m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        m[:, 0] = True
        m[1:, 1:] = self.ancestors
        return m

    @cached_property
    def position_offsets(self) -> torch.Tensor:  # [1 + n] long: each verification row's position minus the pending's
        return torch.cat([torch.zeros(1, dtype=torch.long), self.depths])

    @cached_property
    def children(self) -> list[list[int]]:
        """``children[0]`` are the root's children, ``children[i + 1]`` node i's, in draft order."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parent_list):
            kids[p + 1].append(i)
        return kids

    @cached_property
    def sibling_groups(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sibling rank r: ``(nodes, rows)``, the r-th child of every node that has one and the
        verification row of its parent (``parent + 1``); each row occurs once per group."""
        by_rank: list[list[tuple[int, int]]] = []
        for row, kids in enumerate(self.children):
            for r, c in enumerate(kids):
                if r == len(by_rank):
                    by_rank.append([])
                by_rank[r].append((c, row))
        flat = torch.tensor([pair for group in by_rank for pair in group], dtype=torch.long).reshape(-1, 2)
        parts = flat.split([len(group) for group in by_rank])
        return [(part[:, 0], part[:, 1]) for part in parts]

    def on(self, device: torch.device | str) -> DeviceTree:
        """The structure on ``device``, made once per device (one upload; a chain's is made on the device)."""
        device = torch.device(device)
        if device not in self._on:
            self._on[device] = self._chain_on(device) if self.is_chain else self._upload(device)
        return self._on[device]

    def forward_mask(self, visible: torch.Tensor) -> torch.Tensor:  # [m, 1 + n + m] -> [1 + n + m, 1 + n + m] bool
        """The whole verification forward's visibility with ``m`` extra inputs after the tree whose rows see
        ``visible`` (:class:`ExtraInputs`)."""
        n, m = len(self), int(visible.shape[0])
        vis = torch.zeros(1 + n + m, 1 + n + m, dtype=torch.bool)
        tree = self.verify_mask
        vis[: 1 + n, : 1 + n] = torch.ones(1 + n, 1 + n, dtype=torch.bool).tril() if tree is None else tree
        vis[1 + n :] = visible.to(torch.bool).cpu()
        return vis

    def with_extras_on(self, device: torch.device | str, visible: torch.Tensor,
                       depths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [1 + n + m], [T, T] bool
        """``(position offsets, forward mask)`` of the verification rows with extra inputs (``visible`` ``[m, 1 + n
        + m]``, ``depths`` ``[m]``, on the host) on ``device``, in one upload; a proposer that hands the same
        ``visible`` and ``depths`` tensors with this shape again gets the copy it was given the last time."""
        device = torch.device(device)
        last = self._with_extras
        if last is not None and last[0] == device and last[1] is visible and last[2] is depths:
            return last[3], last[4]
        offsets = torch.cat([self.position_offsets, depths.to(torch.long).cpu()])  # [T]
        t = int(offsets.numel())
        flat = torch.cat([offsets, self.forward_mask(visible).reshape(-1).long()]).to(device)  # the one upload
        pos, mask = flat[:t], flat[t:].reshape(t, t).bool()
        self._with_extras = (device, visible, depths, pos, mask)
        return pos, mask

    def _chain_on(self, device: torch.device) -> DeviceTree:
        n = len(self)
        nodes = torch.arange(n, device=device)  # [n]
        return DeviceTree(parents=nodes - 1, depths=nodes + 1,
                          ancestors=torch.ones(n, n, dtype=torch.bool, device=device).tril(), verify_mask=None,
                          position_offsets=torch.arange(n + 1, device=device),
                          sibling_groups=[(nodes, nodes)] if n else [])

    def _upload(self, device: torch.device) -> DeviceTree:
        parts = [self.parents, self.depths, self.ancestors, self.verify_mask, self.position_offsets]
        parts += [t for group in self.sibling_groups for t in group]
        flat = torch.cat([p.reshape(-1).to(torch.long) for p in parts]).to(device)  # the one upload
        pieces = [piece.reshape(p.shape) for piece, p in zip(flat.split([p.numel() for p in parts]), parts, strict=True)]
        groups = pieces[5:]
        return DeviceTree(parents=pieces[0], depths=pieces[1], ancestors=pieces[2].bool(),
                          verify_mask=pieces[3].bool(), position_offsets=pieces[4],
                          sibling_groups=list(zip(groups[0::2], groups[1::2], strict=True)))


@dataclass(frozen=True)
class DeviceTree:
    """A :class:`TreeShape` on one device (:meth:`TreeShape.on`)."""

    parents: torch.Tensor  # [n] long
    depths: torch.Tensor  # [n] long
    ancestors: torch.Tensor  # [n, n] bool
    verify_mask: torch.Tensor | None  # [1 + n, 1 + n] bool; None for a chain (causal)
    position_offsets: torch.Tensor  # [1 + n] long
    sibling_groups: list[tuple[torch.Tensor, torch.Tensor]]  # per sibling rank: (nodes [k], rows [k])


__all__ = ["DeviceTree", "TreeShape"]
