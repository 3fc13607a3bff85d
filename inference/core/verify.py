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
- :func:`~draftsmith.inference.core.typical.typical_verifier` — Medusa's typical acceptance (LOSSY under sampling; a proposer that
  carries it says so): a node passes when the target gives its token more than an entropy-dependent
  threshold, the longest passing candidate path is committed (ties by likelihood) and the token
  after it is the target's argmax.

The rules run as a fixed sequence of tensor ops on the logits' device and move one small tensor to
the host per step (gpt-fast style), for chains and trees alike: every node gets its own test
(greedy: its token equals the target's argmax at its parent; sampling: ``u < p'(x) / q(x)`` with
``p'`` the residual left by its earlier siblings, computed for all nodes by sibling rank), the first
passing child of each node is kept, and the accepted path is the deepest node whose ancestors all
pass (typical acceptance keeps every passing child and picks among the passing paths). Drawing a
uniform for every node instead of only the nodes tried changes nothing in distribution, since each
tried node still uses a fresh independent uniform.

A draft may also carry :class:`Resume` (the proposer already ran the first layers of the
verification, early exit) and :class:`ExtraInputs` (tokens of the proposer's own that ride along in
the verification forward, after the tree: BiTA's mask tokens, Jacobi blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import torch

from draftsmith.common.errors import ProposerError
from draftsmith.common.precision import first_argmax
from draftsmith.inference.core.sampling import draw, residual, sample, uniform
from draftsmith.inference.core.tree_shape import DeviceTree, TreeShape


@dataclass
class Resume:
    """The verification forward starts at decoder layer ``start`` from ``hidden``: the proposer has
    already run layers ``0 .. start-1`` of the target over the pending token and every draft node
    (the early-exit draft), and their keys/values sit in the target's cache at those layers, at
    the positions the verification would have written (``past .. past + n``)."""

    start: int
    hidden: torch.Tensor  # [1 + n, H] input of layer `start`; rows: pending token, then draft nodes


@dataclass
class ExtraInputs:
    """``m`` inputs of the proposer's own, placed after the tree in the verification forward.

    Row ``r`` of ``visible`` says which of ``[pending, n draft nodes, m extras]`` extra ``r`` attends
    to (the committed prefix is always visible); the tree rows never see the extras, so verification
    is unaffected. Extra ``r`` sits at position ``past + depths[r]`` (the pending token is at
    ``past``). The loop hands their logits (and the hidden states of ``hidden_layers``) back in
    :class:`~draftsmith.inference.core.proposer.StepFeedback`, and their keys/values never outlive
    the step. Give ``input_ids`` or ``inputs_embeds`` (token embeddings, e.g. trained mask-token
    embeddings; GPT-2 position embeddings are added by the adapter), not both. ``visible`` and
    ``depths`` are structure, read on the host (keep them on the CPU); the inputs may live on the
    target's device. ``prefix``: per-layer keys and values (each ``[1, H_kv, P, D]``) that the extras
    see and the tree rows never do (BiTA's deep prompt; see
    :class:`~draftsmith.inference.core.kv_cache.KVPrefix`)."""

    visible: torch.Tensor  # [m, 1 + n + m] bool
    depths: torch.Tensor  # [m] long, position offsets from the pending token
    input_ids: torch.Tensor | None = None  # [m] long
    inputs_embeds: torch.Tensor | None = None  # [m, H]
    hidden_layers: tuple[int, ...] = ()  # transformers-style indices, -1 = after the final norm
    prefix: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None  # (keys, values) per layer, extras only

    def __len__(self) -> int:
        return int(self.depths.numel())

    @classmethod
    def after_chain(
        cls,
        n: int,  # draft chain length
        input_ids: torch.Tensor | None = None,  # [m]
        inputs_embeds: torch.Tensor | None = None,  # [m, H]
        hidden_layers: tuple[int, ...] = (),
    ) -> ExtraInputs:
        """A causal block that continues a draft chain of ``n`` nodes: extra ``r`` sees the pending
        token, every chain node and extras ``0 .. r``, at position offset ``n + 1 + r`` (a Jacobi
        block, or BiTA's mask tokens after the draft)."""
        m = int((input_ids if input_ids is not None else inputs_embeds).shape[0])
        visible = torch.ones(m, 1 + n + m, dtype=torch.bool)
        visible[:, 1 + n :] = torch.ones(m, m, dtype=torch.bool).tril()
        depths = torch.arange(n + 1, n + 1 + m)
        return cls(visible, depths, input_ids, inputs_embeds, tuple(hidden_layers))


@dataclass
class Draft:
    """Proposed tokens as a tree in topological order (parents before children).

    ``parents`` is structure, read on the host (keep it on the CPU); ``tokens`` and ``q`` may live
    on the target's device. ``shape``: the tree's :class:`TreeShape` when the proposer keeps one (made from
    ``parents`` otherwise)."""

    tokens: torch.Tensor  # [n] long
    parents: torch.Tensor  # [n] long; -1 = child of the root (the pending token)
    q: torch.Tensor | None = None  # [n, V] distribution node i was drawn from; None = deterministic (one-hot)
    extras: dict = field(default_factory=dict)  # proposer-specific payload (e.g. hidden states)
    resume: Resume | None = None  # verification starts at layer resume.start (early exit)
    extra_inputs: ExtraInputs | None = None  # proposer inputs after the tree (BiTA, Jacobi)
    shape: TreeShape | None = None

    def __post_init__(self) -> None:
        n = len(self)
        if self.parents.numel() != n:
            raise ProposerError(f"a draft with {n} tokens has {self.parents.numel()} parents")
        if self.shape is None:
            self.shape = TreeShape(self.parents)
        elif self.shape.parents is not self.parents and not torch.equal(self.shape.parents, self.parents):
            raise ProposerError("a draft's shape was made from other parents than the draft's")
        if self.q is not None and self.q.shape[0] != n:
            raise ProposerError(f"a draft with {n} tokens has q for {self.q.shape[0]} nodes")
        if self.resume is not None and self.resume.hidden.shape[0] != 1 + n:
            raise ProposerError(
                f"Resume.hidden has {self.resume.hidden.shape[0]} rows; it needs 1 + {n} (pending token + nodes)"
            )
        ex = self.extra_inputs
        if ex is not None:
            if self.resume is not None:
                raise ProposerError("a draft cannot both resume the verification at a layer and add extra inputs")
            m = len(ex)
            if (ex.input_ids is None) == (ex.inputs_embeds is None):
                raise ProposerError("ExtraInputs needs exactly one of input_ids and inputs_embeds")
            rows = (ex.input_ids if ex.input_ids is not None else ex.inputs_embeds).shape[0]
            if rows != m or tuple(ex.visible.shape) != (m, 1 + n + m):
                raise ProposerError(
                    f"ExtraInputs: {rows} inputs, {m} depths and a visibility of shape {tuple(ex.visible.shape)}; "
                    f"need {m} inputs and [{m}, {1 + n + m}]"
                )

    @classmethod
    def chain(
        cls,
        tokens: torch.Tensor | list[int],
        q: torch.Tensor | None = None,
        *,
        resume: Resume | None = None,
        extra_inputs: ExtraInputs | None = None,
    ) -> Draft:
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        parents = torch.arange(-1, tokens.numel() - 1, dtype=torch.long)
        return cls(tokens=tokens, parents=parents, q=q, resume=resume, extra_inputs=extra_inputs)

    @classmethod
    def empty(cls) -> Draft:
        return cls.chain(torch.empty(0, dtype=torch.long))

    def __len__(self) -> int:
        return int(self.tokens.numel())

    def to(self, device: torch.device) -> Draft:
        """This draft with its tokens on ``device`` (one upload when they are on the host; the shape is shared)."""
        tokens = self.tokens.to(device) if len(self) else self.tokens
        return self if tokens is self.tokens else replace(self, tokens=tokens)

    @property
    def num_extra(self) -> int:
        return len(self.extra_inputs) if self.extra_inputs is not None else 0

    @property
    def _parent_list(self) -> list[int]:
        return self.shape.parent_list

    @property
    def is_chain(self) -> bool:
        return self.shape.is_chain

    @property
    def depths(self) -> torch.Tensor:  # [n], children of the root have depth 1
        return self.shape.depths

    @property
    def ancestors(self) -> torch.Tensor:
        """``[n, n]`` bool: ``[i, j]`` when node ``j`` is node ``i`` or one of its ancestors."""
        return self.shape.ancestors

    @property
    def verify_mask(self) -> torch.Tensor | None:
        """``[1 + n, 1 + n]`` bool visibility for the verification forward (None = causal)."""
        return self.shape.verify_mask

    @property
    def children(self) -> list[list[int]]:
        """``children[0]`` are the root's children, ``children[i + 1]`` node i's, in draft order."""
        return self.shape.children

    @property
    def sibling_groups(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sibling rank r: ``(nodes, rows)``, the r-th child of every node that has one and the
        verification row of its parent (``parent + 1``); each row occurs once per group."""
        return self.shape.sibling_groups

    def on(self, device: torch.device) -> DeviceTree:
        """The tree's structure on ``device`` (:meth:`TreeShape.on`)."""
        return self.shape.on(device)

    @cached_property
    def forward_mask(self) -> torch.Tensor | None:
        """``[1 + n + m, 1 + n + m]`` bool visibility of the whole verification forward, extras
        included (None = causal)."""
        if self.extra_inputs is None:
            return self.verify_mask
        return self.shape.forward_mask(self.extra_inputs.visible)

    @cached_property
    def position_offsets(self) -> torch.Tensor:
        """``[1 + n + m]`` long: position of each verification row minus the pending token's."""
        if self.extra_inputs is None:
            return self.shape.position_offsets
        return torch.cat([self.shape.position_offsets, self.extra_inputs.depths.to(torch.long).cpu()])

    def forward_inputs(self, past: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(positions [1 + n + m], mask [1 + n + m, 1 + n + m] bool or None = causal)`` of the verification
        forward when the pending token sits at ``past``, on ``device``: from the shape's device copy (a static
        tree's is made once; a chain's on the device), or, with extra inputs, in one upload (none when a proposer
        hands the same layout again: :meth:`TreeShape.with_extras_on`)."""
        if self.extra_inputs is None:
            tree = self.on(device)
            return past + tree.position_offsets, tree.verify_mask
        offsets, mask = self.shape.with_extras_on(device, self.extra_inputs.visible, self.extra_inputs.depths)
        return past + offsets, mask

    def positions(self, past: int, device: torch.device) -> torch.Tensor:  # [1 + n + m] long, on device
        """Positions of the verification rows when the pending token sits at ``past``, on ``device``
        (:meth:`forward_inputs`)."""
        return self.forward_inputs(past, device)[0]


@dataclass
class Verdict:
    accepted: list[int]  # node indices of the accepted path, root to leaf
    next_token: int  # correction (after a rejection) or bonus (after a full accept) token
    tokens: list[int] | None = None  # the accepted nodes' tokens, when the rule already has them on the host
    # what the rules of this module also give, on the target's device (the loop needs no upload with them):
    path: torch.Tensor | None = None  # [a] long, the accepted node indices
    committed: torch.Tensor | None = None  # [a + 1] long, the accepted tokens then next_token
    drafted: list[int] | None = None  # every draft token, read on the host with the verdict

    @property
    def num_committed(self) -> int:
        return len(self.accepted) + 1

    def accepted_tokens(self, draft: Draft) -> list[int]:
        return self.tokens if self.tokens is not None else draft.tokens[self.accepted].tolist()


# ---------------------------------------------------------------------------------------- tensor pieces
def first_in_siblings(
    flag: torch.Tensor,  # [n] bool
    parents: torch.Tensor,  # [n] long
) -> torch.Tensor:  # [n] bool
    """``flag`` kept only on the first flagged child of each parent (children in draft order)."""
    n = flag.numel()
    same = parents[:, None] == parents[None, :]  # [n, n]
    earlier = torch.ones(n, n, dtype=torch.bool, device=flag.device).tril(-1)  # [i, j]: j < i
    return flag & ~(same & earlier & flag[None, :]).any(-1)


def accepted_path(
    ok: torch.Tensor,  # [n] bool: the node passes its test and is the first passing sibling
    ancestors: torch.Tensor,  # [n, n] bool ancestor-or-self
    depths: torch.Tensor,  # [n] long
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # length [], next row [], on path [n] bool
    """The accepted path: the nodes whose ancestors (and themselves) all pass. With at most one
    passing child per node these form one branch; ``row`` is the verification row after its leaf
    (0 when nothing is accepted)."""
    on = ~(ancestors & ~ok[None, :]).any(-1)  # [n]
    d = torch.where(on, depths, 0)  # [n]
    length = d.max()  # []
    leaf = d.argmax()  # []
    on_path = on & ancestors.index_select(0, leaf[None])[0]  # [n]
    row = torch.where(length > 0, leaf + 1, 0)  # []
    return length, row, on_path


def chain_path(ok: torch.Tensor) -> torch.Tensor:  # [n] bool -> [] long
    """Accepted length of a chain: the leading run of passing nodes (its next row is the length)."""
    return ok.long().cumprod(0).sum()


def verdict_on_host(
    length: torch.Tensor,  # []
    next_token: torch.Tensor,  # [] or [1]
    tokens: torch.Tensor,  # [n]
    on_path: torch.Tensor | None = None,  # [n] bool; None for a chain (the path is 0 .. length-1)
) -> Verdict:
    """The one device-to-host transfer of a verification step. The verdict also keeps, on the device, the accepted
    path's node indices and the committed tokens (sliced with the length read here: no further read), and every
    draft token as read."""
    n = tokens.numel()
    parts = [length.reshape(1), next_token.reshape(1)] + ([] if on_path is None else [on_path.long()]) + [tokens]
    host = torch.cat(parts).tolist()
    a = host[0]
    path = list(range(a)) if on_path is None else [i for i in range(n) if host[2 + i]]
    toks = host[2:] if on_path is None else host[2 + n :]
    if on_path is None:
        index = torch.arange(a, device=tokens.device)  # [a]
    else:  # the path's nodes first, in node (root-to-leaf) order
        index = torch.argsort((~on_path).to(torch.int8), stable=True)[:a]  # [a]
    committed = torch.cat([tokens.index_select(0, index), next_token.reshape(1).to(tokens.dtype)])  # [a + 1]
    return Verdict(path, host[1], tokens=[toks[i] for i in path], path=index, committed=committed, drafted=toks)


def empty_verdict(next_token: torch.Tensor) -> Verdict:  # next_token [] on the device
    """The verdict of a step that drafted nothing: one read, the next token."""
    return Verdict([], int(next_token), tokens=[], path=next_token.new_empty(0, dtype=torch.long),
                   committed=next_token.reshape(1).long(), drafted=[])


def _accept(
    passed: torch.Tensor,  # [n] bool: each node passes its own test
    draft: Draft,
    tokens: torch.Tensor,  # [n] the draft's tokens, on the target's device
    next_token: Callable[[torch.Tensor], torch.Tensor],  # verification row [1] -> the token after the branch
) -> Verdict:
    """The accepted branch — a chain's leading run of passing nodes; in a tree the first passing child of each
    node, followed from the root — and the token after it, in one device-to-host transfer."""
    if draft.is_chain:
        length = chain_path(passed)
        return verdict_on_host(length, next_token(length[None]), tokens)
    tree = draft.on(tokens.device)
    ok = first_in_siblings(passed, tree.parents)  # [n]
    length, row, on_path = accepted_path(ok, tree.ancestors, tree.depths)
    return verdict_on_host(length, next_token(row[None]), tokens, on_path)


def verify_greedy(
    target_logits: torch.Tensor,  # [1 + n, V]
    draft: Draft,
) -> Verdict:
    """Follow the target's argmax from the root through the tree while a child matches it."""
    choice = first_argmax(target_logits)  # [1 + n]
    device = choice.device
    if len(draft) == 0:
        return empty_verdict(choice[0])
    tokens = draft.tokens.to(device)  # [n]
    wanted = choice[:-1] if draft.is_chain else choice[draft.on(device).parents + 1]  # [n] the argmax at each parent
    return _accept(tokens == wanted, draft, tokens, lambda row: choice.index_select(0, row))


def _node_q(draft: Draft, vocab: int, device: torch.device) -> torch.Tensor:  # [n, V]
    if draft.q is not None:
        return draft.q.to(device, torch.float32)
    tokens = draft.tokens.to(device)
    return torch.zeros(len(draft), vocab, device=device).scatter_(1, tokens[:, None], 1.0)


def sibling_residuals(
    probs: torch.Tensor,  # [1 + n, V] target distributions per verification row
    q: torch.Tensor,  # [n, V] draft distribution of each node
    draft: Draft,
) -> tuple[torch.Tensor, torch.Tensor]:  # tried [n, V], left [1 + n, V]
    """``tried[i]``: the target distribution at node i's parent once i's earlier siblings are all
    rejected; ``left[r]``: what is left at row r once all its children are rejected (the row itself
    for a leaf). One pass per sibling rank, all rows at once."""
    left = probs.clone()
    tried = torch.empty_like(q)
    for nodes, rows in draft.on(probs.device).sibling_groups:
        here = left.index_select(0, rows)  # [k, V]
        tried[nodes] = here
        left[rows] = residual(here, q.index_select(0, nodes))
    return tried, left


def verify_sampling(
    target_probs: torch.Tensor,  # [1 + n, V], processed with the same SamplingParams as the draft
    draft: Draft,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Multi-branch speculative sampling; exact in distribution for any tree (see module doc)."""
    probs = target_probs.float()
    device = probs.device
    if len(draft) == 0:
        return empty_verdict(draw(probs[0], generator))
    tokens = draft.tokens.to(device)  # [n]
    q = _node_q(draft, probs.shape[-1], device)  # [n, V]
    tried, left = sibling_residuals(probs, q, draft)
    x = tokens[:, None]  # [n, 1]
    ratio = tried.gather(1, x)[:, 0] / q.gather(1, x)[:, 0].clamp_min(1e-30)  # [n]
    passed = uniform((len(draft),), generator, device) < ratio  # [n]
    return _accept(passed, draft, tokens, lambda row: draw(left.index_select(0, row)[0], generator))


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
