"""Static token trees for head drafters (Medusa; EAGLE-1's static tree): a tree from choice paths, the default
tree per number of heads, and a tree of N nodes picked greedily from measured per-head top-k accuracies.

A *choice path* is a tuple of top-k ranks, one per depth (Medusa's ``medusa_choices``): ``(0, 1)`` is the
second-best candidate of head 2 following the best candidate of head 1. A tree is the set of its paths; every
prefix of a path must be in the tree too. :func:`tree_from_choices` turns the paths into the buffers the decode
loop needs — parents (verification mask and cache compaction come from them, :class:`~draftsmith.inference.core.verify.Draft`),
depths (position offsets), the rank each node takes from its head, and the retrieve indices of every leaf path —
and :meth:`StaticTree.draft` fills the tree with the heads' candidates.

Node order is by depth, then lexicographic by path (parents before children, as :class:`Draft` requires).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.masks import additive_mask
from draftsmith.inference.core.tree_shape import TreeShape
from draftsmith.inference.core.verify import Draft

Path = tuple[int, ...]


@dataclass(frozen=True)
class StaticTree:
    """A token tree of fixed shape: node ``i`` holds the candidate of rank ``ranks[i]`` of head ``depths[i]``."""

    paths: tuple[Path, ...]  # one per node, in node order

    def __len__(self) -> int:
        return len(self.paths)

    @cached_property
    def parents(self) -> torch.Tensor:  # [n] long; -1 = child of the root (the pending token)
        index = {p: i for i, p in enumerate(self.paths)}
        return torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in self.paths], dtype=torch.long)

    @cached_property
    def depths(self) -> torch.Tensor:  # [n] long, children of the root have depth 1
        return torch.tensor([len(p) for p in self.paths], dtype=torch.long)

    @cached_property
    def ranks(self) -> torch.Tensor:  # [n] long, the top-k rank each node takes from its head
        return torch.tensor([p[-1] for p in self.paths], dtype=torch.long)

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if len(self) else 0

    @property
    def top_k(self) -> int:
        """Candidates a head must supply: one more than the highest rank used."""
        return int(self.ranks.max()) + 1 if len(self) else 0

    @cached_property
    def shape(self) -> TreeShape:  # shared by every draft of this tree: its device copy is made once
        return TreeShape(self.parents)

    @cached_property
    def _skeleton(self) -> Draft:  # the tree's structure as a draft (tokens unknown)
        return Draft(tokens=torch.zeros(len(self), dtype=torch.long), parents=self.parents, shape=self.shape)

    @cached_property
    def _slots(self) -> dict[tuple[torch.device, int], torch.Tensor]:  # (device, k) -> [n] node's index in [heads * k]
        return {}

    @cached_property
    def _shallower(self) -> dict[int, StaticTree]:  # depth -> this tree without its deeper nodes
        return {}

    def within(self, max_depth: int) -> StaticTree:
        """This tree without its nodes deeper than ``max_depth`` (a prefix of its nodes: they are ordered by depth),
        kept for the next call."""
        if max_depth >= self.max_depth:
            return self
        if max_depth not in self._shallower:
            self._shallower[max_depth] = StaticTree(tuple(p for p in self.paths if len(p) <= max_depth))
        return self._shallower[max_depth]

    @cached_property
    def mask(self) -> torch.Tensor:  # [1 + n, 1 + n] bool: row i sees column j (row 0 = the pending token)
        tree = self._skeleton.verify_mask  # None for a chain: causal
        return torch.ones(len(self) + 1, len(self) + 1, dtype=torch.bool).tril() if tree is None else tree

    def attention_mask(self, past: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[1, 1, 1 + n, past + 1 + n]`` additive mask of the verification forward over ``past`` cached tokens."""
        return additive_mask(torch.cat([self.mask.new_ones(len(self) + 1, past), self.mask], dim=1), dtype)

    @property
    def position_offsets(self) -> torch.Tensor:  # [1 + n]: position of each row minus the pending token's
        return self._skeleton.position_offsets

    @cached_property
    def retrieve(self) -> torch.Tensor:  # [leaves, max_depth] node indices of each leaf path, -1 padded
        leaves = sorted(set(range(len(self))) - set(self.parents.tolist()))
        out = torch.full((len(leaves), self.max_depth), -1, dtype=torch.long)
        index = {p: i for i, p in enumerate(self.paths)}
        for row, leaf in enumerate(leaves):
            path = self.paths[leaf]
            out[row, : len(path)] = torch.tensor([index[path[:d]] for d in range(1, len(path) + 1)])
        return out

    def draft(self, candidates: torch.Tensor, max_depth: int | None = None) -> Draft:
        """The tree filled with the heads' candidates: ``candidates[d, r]`` is head ``d + 1``'s rank-``r`` token
        (``[heads, k]`` with ``heads >= max_depth`` and ``k >= top_k``); with ``max_depth``, only its nodes that deep
        or shallower (:meth:`within`). The node slots and the tree's structure reach the candidates' device once per
        tree and device, not once per draft."""
        if max_depth is not None and max_depth < self.max_depth:
            return self.within(max_depth).draft(candidates)
        if candidates.dim() != 2 or candidates.shape[0] < self.max_depth or candidates.shape[1] < self.top_k:
            raise ConfigError(f"a tree of depth {self.max_depth} using top-{self.top_k} candidates needs candidates of "
                              f"shape [>= {self.max_depth}, >= {self.top_k}], got {tuple(candidates.shape)}")
        k = int(candidates.shape[1])
        key = (candidates.device, k)
        if key not in self._slots:
            self._slots[key] = ((self.depths - 1) * k + self.ranks).to(candidates.device)  # [n]
        tokens = candidates.reshape(-1).index_select(0, self._slots[key])  # [n]
        return Draft(tokens=tokens, parents=self.parents, shape=self.shape)


def _sorted_paths(choices: Iterable[Sequence[int]]) -> tuple[Path, ...]:
    return tuple(sorted({tuple(int(r) for r in c) for c in choices}, key=lambda p: (len(p), p)))


def tree_from_choices(choices: Iterable[Sequence[int]]) -> StaticTree:
    """The static tree of ``choices`` (Medusa's ``medusa_choices``: paths of top-k ranks). Every prefix of a path
    must be a path too; ranks are >= 0; duplicates are merged."""
    paths = _sorted_paths(choices)
    if not paths:
        raise ConfigError("a tree needs at least one choice path, e.g. [[0]]")
    known = set(paths)
    for p in paths:
        if not p or min(p) < 0:
            raise ConfigError(f"tree path {list(p)} is empty or has a negative rank: ranks are top-k indices >= 0")
        if len(p) > 1 and p[:-1] not in known:
            raise ConfigError(f"tree path {list(p)} has no parent {list(p[:-1])}: add every prefix of a path")
    return StaticTree(paths)


def chain_choices(depth: int) -> list[Path]:
    """The single chain of the top-1 candidates of ``depth`` heads: ``[(0,), (0, 0), ...]``."""
    return [(0,) * d for d in range(1, depth + 1)]


def grown_paths(accuracy: torch.Tensor, nodes: int, chain: int = 0) -> Iterator[tuple[Path, float]]:
    """Paths in the order a tree grows (Medusa's ``gen_tree``), with each path's value: the product of its steps'
    accuracies (``accuracy[d, r]``: the chance head ``d + 1``'s rank-``r`` candidate is the target's token), the
    chance the whole path is accepted. The first ``chain`` paths are the top-1 chain (kept whatever its value, so
    that a tree never loses to its own chain); then, greedily, the frontier path of highest value: a child never
    beats its parent, so the best tree of ``n + 1`` nodes is the best of ``n`` plus one frontier node."""
    heads, k = accuracy.shape
    acc = accuracy.double().tolist()
    spine = [(0,) * d for d in range(1, min(chain, heads) + 1)]
    value, taken = 1.0, 0
    frontier: list[tuple[float, Path]] = []
    for path in [(), *spine]:  # the chain's nodes; their children (but the chain's own) are the frontier
        if path:
            value *= acc[len(path) - 1][0]
            if taken == nodes:
                return
            taken += 1
            yield path, value
        if len(path) < heads:
            frontier += [(-value * acc[len(path)][r], (*path, r)) for r in range(k) if (*path, r) not in spine]
    heapq.heapify(frontier)
    while frontier and taken < nodes:
        neg, path = heapq.heappop(frontier)
        taken += 1
        yield path, -neg
        if len(path) < heads:
            for r in range(k):
                heapq.heappush(frontier, (neg * acc[len(path)][r], (*path, r)))


def greedy_choices(accuracy: torch.Tensor, nodes: int, chain: int = 0) -> list[Path]:
    """The ``nodes`` paths of highest estimated acceptance, grown greedily from the root (Medusa's ``gen_tree``),
    after the top-1 chain of depth ``chain`` (:func:`grown_paths`)."""
    return [path for path, _ in grown_paths(accuracy, nodes, chain)]


def tree_size_for_cost(accuracy: torch.Tensor, relative_verify, max_nodes: int = 64, chain: int = 0) -> dict:
    """The node count whose grown tree (:func:`greedy_choices` on ``accuracy``, the top-1 chain of depth ``chain``
    first) has the best predicted speedup on a measured verification cost: ``relative_verify(n)`` = V(n) / V(1), the
    cost of one target forward over ``n`` tokens against a plain decoding step
    (:meth:`draftsmith.inference.evaluation.cost.CostModel.relative_verify`)::

        tau(N)     = 1 + sum of the N chosen paths' values (each the chance the whole path is accepted)
        speedup(N) = tau(N) / relative_verify(N + 1)

    (the heads' own cost is left out: one small matmul per head against a target forward). Returns ``{"nodes",
    "predicted_tau", "predicted_speedup", "table": [[N, tau, speedup], ...]}``."""
    tau, table = 1.0, []
    for n, (_, value) in enumerate(grown_paths(accuracy, max_nodes, chain), start=1):
        tau += value
        table.append([n, round(tau, 5), round(tau / relative_verify(n + 1), 5)])
    best = max(table, key=lambda row: row[2])
    return {"nodes": best[0], "predicted_tau": best[1], "predicted_speedup": best[2], "table": table}


def size_for_step(path_probs: torch.Tensor, step_cost: torch.Tensor) -> int:
    """How many of one step's candidate nodes to verify, given each node's chance of being accepted (``path_probs``
    ``[c]``; EAGLE-2's cumulative draft probability of the node's path) and the step's cost with ``n`` nodes kept
    (``step_cost[n - 1]`` for ``n = 1 .. N``: the drafting already done plus a target forward over ``n + 1`` tokens,
    in any unit). Keeping the ``n`` most probable nodes (a set closed under ancestors, as a child never beats its
    parent) commits ``1 + sum_{i<=n} p_(i)`` tokens in expectation, so the best ``n`` maximises::

        (1 + sum_{i<=n} p_(i)) / step_cost(n)          (tokens per unit of time of this step)

    Returns ``n`` in ``1 .. min(c, N)``."""
    p = path_probs.double().sort(descending=True).values[: step_cost.numel()]  # [n]
    if p.numel() == 0:
        return 0
    rate = (1.0 + p.cumsum(0)) / step_cost[: p.numel()].double()  # [n]
    return int(rate.argmax()) + 1


def default_accuracy(heads: int, k: int = 10) -> torch.Tensor:  # [heads, k]
    """A typical per-head top-k accuracy profile (head 1 top-1 0.6, decaying by 0.75 per head and by rank as a
    geometric tail): what :func:`default_choices` plans for before a drafter's own accuracies are measured."""
    head = 0.6 * 0.75 ** torch.arange(heads, dtype=torch.float64)[:, None]  # [heads, 1]
    rank = 0.45 ** torch.arange(k, dtype=torch.float64)[None, :]  # [1, k]
    return head * rank


def default_choices(heads: int, nodes: int = 32) -> list[Path]:
    """The default tree for ``heads`` heads: the top-1 chain through every head, then paths chosen by
    :func:`greedy_choices` on :func:`default_accuracy`, ``nodes`` in all."""
    if heads < 1 or nodes < 1:
        raise ConfigError(f"a default tree needs heads >= 1 and nodes >= 1, got {heads} and {nodes}")
    return greedy_choices(default_accuracy(heads), nodes, chain=heads)


def within_depth(draft: Draft, max_depth: int) -> Draft:
    """``draft`` without its nodes deeper than ``max_depth`` (near the end of an answer: a path longer than the tokens
    left could not be kept, while its shallower branches still can). Nodes are in topological order and the kept set
    is closed under ancestors, so parents are renumbered in place."""
    if len(draft) == 0 or int(draft.depths.max()) <= max_depth:
        return draft
    keep = draft.depths <= max_depth  # [n] bool
    m = int(keep.sum())
    if bool(keep[:m].all()):  # the kept nodes come first (a tree ordered by depth): slices, no index on the device
        q = draft.q[:m] if draft.q is not None else None
        return Draft(tokens=draft.tokens[:m], parents=draft.parents[:m], q=q)
    new_index = keep.long().cumsum(0) - 1  # [n]
    parents = draft.parents[keep]
    parents = torch.where(parents >= 0, new_index[parents.clamp(min=0)], parents)
    q = draft.q[keep.to(draft.q.device)] if draft.q is not None else None
    return Draft(tokens=draft.tokens[keep.to(draft.tokens.device)], parents=parents, q=q)


def rerank_order(scores: torch.Tensor, depths: torch.Tensor, total: int, first: torch.Tensor) -> torch.Tensor:
    """:func:`rerank`'s choice as tensor operations on ``scores``' device (stable sorts, no host read): the indices
    ``[min(total, n)]`` of the kept candidates in topological order. ``scores`` ``[n]`` float, ``depths`` ``[n]`` long,
    ``first`` ``[n]`` long: a forced candidate's rank among the forced ones (kept before any other, in that order), ``n``
    for the others. Order kept: forced first, then by score (the higher first), depth, index; then the kept ones by
    depth, score (the higher first), index."""
    n = scores.numel()
    order = torch.sort(depths, stable=True).indices  # [n] by (depth, index)
    order = order[torch.sort(scores[order], descending=True, stable=True).indices]  # by (-score, depth, index)
    order = order[torch.sort(first[order], stable=True).indices]  # the forced ones first, in their order
    kept = torch.sort(order[: max(0, min(total, n))]).values  # by index
    kept = kept[torch.sort(scores[kept], descending=True, stable=True).indices]
    return kept[torch.sort(depths[kept], stable=True).indices]  # by (depth, -score, index)


def kept_parents(kept: Sequence[int], parents: Sequence[int]) -> list[int]:
    """The parents of the ``kept`` candidates as indices into ``kept`` (-1 = the root), from the candidates' own
    ``parents`` (-1 = the root); a candidate kept without its parent is refused."""
    where = {c: j for j, c in enumerate(kept)}
    new_parents = []
    for c in kept:
        p = parents[c]
        if p >= 0 and p not in where:
            raise ValueError(f"candidate {c} is kept without its parent {p}: its score exceeds its parent's")
        new_parents.append(where[p] if p >= 0 else -1)
    return new_parents


def forced_ranks(n: int, keep: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:  # [n] long
    """``first`` for :func:`rerank_order`: the rank of each candidate of ``keep`` (duplicates once), ``n`` elsewhere;
    made on ``device`` with one fill per forced candidate (no upload)."""
    first = torch.full((n,), n, dtype=torch.long, device=device)
    for j, c in enumerate(dict.fromkeys(int(i) for i in keep)):
        first[c] = j
    return first


def rerank(scores: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, total: int,
           keep: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2's rerank: of the candidate nodes an expansion produced, keep the ``total`` with the highest cumulative
    draft log-probability (``scores`` ``[n]``; ties: the shallower first, so a parent, never scoring below its
    child, always precedes it and the kept set is closed under ancestors). ``parents`` ``[n]`` index into the
    candidates (-1 = the root), ``depths`` ``[n]`` (1 = a child of the root). ``keep``: candidates kept before any
    other (the top-1 chain, root first, so that a tree never loses to its own chain: a prefix of it when ``total``
    is smaller); it must be closed under ancestors.

    Returns ``(keep, new_parents)``: the kept candidates' indices in topological order (by depth, then by score)
    and their parents as indices into ``keep`` (-1 = the root). The choice is :func:`rerank_order`'s."""
    first = forced_ranks(scores.numel(), keep, scores.device)
    kept = rerank_order(scores, depths.to(scores.device), total, first).tolist()
    new_parents = kept_parents(kept, torch.as_tensor(parents).tolist())
    return torch.tensor(kept, dtype=torch.long), torch.tensor(new_parents, dtype=torch.long)


__all__ = ["StaticTree", "chain_choices", "default_accuracy", "default_choices", "forced_ranks", "greedy_choices",
           "grown_paths", "kept_parents", "rerank", "rerank_order", "size_for_step", "tree_from_choices",
           "tree_size_for_cost", "within_depth"]
