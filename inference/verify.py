"""Drafts (token trees) and the rules that accept them against one target forward.

A :class:`Draft` is a token tree rooted at the last committed token (the *pending* token, not yet
in the target's KV cache); a chain is a tree with one branch. The target runs once over
``[pending] + draft.tokens`` with the tree's ancestor mask, which gives ``1 + n`` rows of logits:
row 0 predicts the children of the root, row ``i + 1`` predicts the children of node ``i``.

Rules:

- :func:`verify_greedy` — exact match with the target's argmax (lossless for greedy decoding).
- :func:`verify_sampling` — speculative sampling (Leviathan et al. 2023; Chen et al. 2023): a
  proposal ``x`` drawn from ``q`` is accepted with probability ``min(1, p(x) / q(x))``; on rejection
  the target distribution becomes ``norm(max(0, p - q))``. Siblings are tried in order, each with the
  distribution it was actually drawn from given the earlier siblings (multi-round / recursive
  rejection sampling: SpecInfer, Miao et al. 2024; Jeon et al. 2024), so the committed token is
  distributed exactly as the target's, for chains and for trees, with or without replacement.
  When every proposal at a node is rejected, or the node is a leaf, one token is drawn from what
  is left (the correction or the bonus token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from draftsmith.inference.adapter import causal_tree_mask, tree_depths
from draftsmith.inference.sampling import residual, sample


@dataclass
class Draft:
    """Proposed tokens as a tree in topological order (parents before children)."""

    tokens: torch.Tensor  # [n] long
    parents: torch.Tensor  # [n] long; -1 = child of the root (the pending token)
    q: torch.Tensor | None = None  # [n, V] distribution node i was drawn from; None = deterministic (one-hot)
    extras: dict = field(default_factory=dict)  # proposer-specific payload (e.g. hidden states)

    @classmethod
    def chain(cls, tokens: torch.Tensor | list[int], q: torch.Tensor | None = None) -> Draft:
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        parents = torch.arange(-1, tokens.numel() - 1, dtype=torch.long)
        return cls(tokens=tokens, parents=parents, q=q)

    @classmethod
    def empty(cls) -> Draft:
        return cls.chain(torch.empty(0, dtype=torch.long))

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @cached_property
    def is_chain(self) -> bool:
        return bool((self.parents == torch.arange(-1, len(self) - 1)).all())

    @cached_property
    def depths(self) -> torch.Tensor:  # [n], children of the root have depth 1
        return torch.arange(1, len(self) + 1) if self.is_chain else tree_depths(self.parents)

    @cached_property
    def verify_mask(self) -> torch.Tensor | None:
        """``[1 + n, 1 + n]`` bool visibility for the verification forward (None = causal)."""
        if self.is_chain:
            return None
        n = len(self)
        m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        m[:, 0] = True
        m[1:, 1:] = causal_tree_mask(self.parents)
        return m

    @cached_property
    def children(self) -> list[list[int]]:
        """``children[0]`` are the root's children, ``children[i + 1]`` node i's, in draft order."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents.tolist()):
            kids[p + 1].append(i)
        return kids


@dataclass
class Verdict:
    accepted: list[int]  # node indices of the accepted path, root to leaf
    next_token: int  # correction (after a rejection) or bonus (after a full accept) token

    @property
    def num_committed(self) -> int:
        return len(self.accepted) + 1


def verify_greedy(
    target_logits: torch.Tensor,  # [1 + n, V]
    draft: Draft,
) -> Verdict:
    """Follow the target's argmax from the root through the tree while a child matches it."""
    choice = target_logits.argmax(-1)  # [1 + n]
    if draft.is_chain:
        n = len(draft)
        if n == 0:
            return Verdict([], int(choice[0]))
        match = (draft.tokens == choice[:n]).long()  # [n]
        a = int(match.cumprod(0).sum())
        return Verdict(list(range(a)), int(choice[a]))
    choice_list = choice.tolist()
    tokens = draft.tokens.tolist()
    path: list[int] = []
    row = 0
    while True:
        want = choice_list[row]
        nxt = next((c for c in draft.children[row] if tokens[c] == want), None)
        if nxt is None:
            return Verdict(path, want)
        path.append(nxt)
        row = nxt + 1


def verify_sampling(
    target_probs: torch.Tensor,  # [1 + n, V], processed with the same SamplingParams as the draft
    draft: Draft,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Multi-branch speculative sampling; exact in distribution for any tree (see module doc)."""
    tokens = draft.tokens.tolist()
    path: list[int] = []
    row = 0
    while True:
        p = target_probs[row]
        accepted = None
        for c in draft.children[row]:
            x = tokens[c]
            if draft.q is None:  # deterministic proposal: q is one-hot at x
                q = torch.zeros_like(p)
                q[x] = 1.0
            else:
                q = draft.q[c]
            ratio = float(p[x]) / max(float(q[x]), 1e-30)
            u = float(torch.rand((), generator=generator))
            if u < min(1.0, ratio):
                accepted = c
                break
            p = residual(p, q)
        if accepted is None:
            return Verdict(path, sample(p, generator))
        path.append(accepted)
        row = accepted + 1


def verify_accept_all(target_probs: torch.Tensor, draft: Draft, generator: torch.Generator | None = None) -> Verdict:
    """A deliberately BROKEN rule that accepts every draft token along the first branch. It is
    not lossless; it exists as the negative control of the distribution check."""
    path: list[int] = []
    row = 0
    while draft.children[row]:
        c = draft.children[row][0]
        path.append(c)
        row = c + 1
    return Verdict(path, sample(target_probs[row], generator))
