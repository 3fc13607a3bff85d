"""BiTA's proposer: the draft of each step comes from the mask tokens of the previous verification forward.

Every step's one target forward carries the pending token, the draft, and a group of ``M`` mask tokens after the
pending token and after every draft node (:func:`~draftsmith.inference.drafters.bita.decode_extras_layout`); only the masks
see BiTA's prompt (its keys/values ride along as the extras' prefix). After the verification the proposer reads the
group after the last accepted node (the pending token when nothing was accepted): its ``M`` masks predict the
``M`` tokens after the step's correction/bonus token, which become the next draft:

- ``tree="chain"``: the top-1 token of each mask, a chain of ``M``;
- ``tree="triangle"`` (the reference code's "upper-triangle" tree): level ``j`` (0-based) holds the top ``top_k - j``
  tokens of mask ``j``, every level hanging from the top-1 node of the level above.

The candidates are deterministic (no ``q``), so speculative sampling verifies them as one-hot proposals and stays
exact in distribution. The step's mask keys/values are dropped with the rejected nodes; the cache keeps only the
committed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.proposer import StepFeedback, TargetView
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.tree_shape import TreeShape
from draftsmith.inference.core.verify import Draft, ExtraInputs
from draftsmith.inference.drafters.bita import BitaEmbeddings, decode_extras_layout

TREES = ("chain", "triangle")


def triangle_slots(rows: int, k: int, top_k: int) -> tuple[list[int], list[int]]:
    """``(slots, parents)`` of the upper-triangle tree over candidates ``[rows, k]`` (each mask's tokens, best
    first): level ``j`` takes the top ``max(1, top_k - j)`` of mask ``j``, hanging from the first node of level
    ``j - 1``; node ``i`` holds candidate ``slots[i]`` of the flattened ``[rows * k]``."""
    slots: list[int] = []
    parents: list[int] = []
    anchor = -1
    for j in range(rows):
        width = min(max(1, top_k - j), k)
        first = len(slots)
        slots.extend(j * k + r for r in range(width))
        parents.extend([anchor] * width)
        anchor = first
    return slots, parents


def triangle_tree(candidates: torch.Tensor, top_k: int) -> tuple[list[int], list[int]]:
    """``(tokens, parents)`` of the upper-triangle tree over ``candidates`` ``[M, K]`` (:func:`triangle_slots`)."""
    slots, parents = triangle_slots(int(candidates.shape[0]), int(candidates.shape[1]), top_k)
    return candidates.reshape(-1)[slots].tolist(), parents


@dataclass
class Layout:
    """One draft layout of the proposer (``rows`` masks' candidates, ``k`` each), made once and kept: the node slots
    (on the host and per device), the tree's shape and the mask groups after it."""

    slots: torch.Tensor  # [n] long, into the flattened [rows * k] candidates
    shape: TreeShape
    visible: torch.Tensor  # [m, 1 + n + m] bool
    depths: torch.Tensor  # [m] long
    on: dict = field(default_factory=dict)  # device -> slots there


class BitaProposer:
    name = "bita"
    lossless = True
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, embeddings: BitaEmbeddings, tree: str = "chain", top_k: int = 5) -> None:
        if tree not in TREES:
            raise ConfigError(f"--tree {tree}: BiTA drafts a chain or the upper-triangle tree (--tree chain|triangle)")
        if top_k < 1:
            raise ConfigError(f"--tree-top-k {top_k}: the triangle tree needs at least 1 candidate per mask")
        self.embeddings = embeddings.eval().requires_grad_(False)
        self.tree, self.top_k = tree, int(top_k)
        self.masks = embeddings.mask_tokens
        self._prefix: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._candidates: torch.Tensor | None = None  # [M, K] next draft's candidates, best first
        self._layouts: dict[tuple[int, int], Layout] = {}  # (rows, k) -> the draft layout, made once

    def bind(self, view: TargetView) -> None:
        """The prompt's keys/values for the target of this sequence (plain prompts run through it: P tokens)."""
        with torch.no_grad():
            keys, values = self.embeddings.prefix_kv(view.adapter)
        self._prefix = ([k.to(view.adapter.dtype) for k in keys], [v.to(view.adapter.dtype) for v in values])

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._candidates = None  # the first step drafts nothing: its masks give the second step's draft

    def layout(self, rows: int, k: int) -> Layout:
        """The layout of a draft from ``rows`` masks' top-``k`` candidates (a chain: each mask's best), kept."""
        if (rows, k) not in self._layouts:
            if self.tree == "chain":
                slots, parents = [j * k for j in range(rows)], list(range(-1, rows - 1))
            else:
                slots, parents = triangle_slots(rows, k, self.top_k)
            visible, depths = decode_extras_layout(parents, self.masks, self.embeddings.mask_attention)
            self._layouts[(rows, k)] = Layout(torch.tensor(slots, dtype=torch.long),
                                              TreeShape(torch.tensor(parents, dtype=torch.long)), visible, depths)
        return self._layouts[(rows, k)]

    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        """The next draft from the stored candidates, at most ``max_tokens`` deep: gathered on their device by the
        layout's slots (no host read; the layout's structure reaches the device once)."""
        if self._prefix is None:
            raise ConfigError("the BiTA proposer runs inside the decode loop, which binds it to the target first")
        candidates = self._candidates[:max(0, max_tokens)] if self._candidates is not None else None  # [<= M, K]
        if candidates is None or candidates.numel() == 0:
            candidates = torch.empty(0, 1, dtype=torch.long)
        layout = self.layout(int(candidates.shape[0]), int(candidates.shape[1]))
        if candidates.device not in layout.on:
            layout.on[candidates.device] = layout.slots.to(candidates.device)
        nodes = candidates.reshape(-1).index_select(0, layout.on[candidates.device])  # [n]
        extras = ExtraInputs(layout.visible, layout.depths, inputs_embeds=self.embeddings.mask_inputs(len(nodes) + 1),
                             prefix=self._prefix)
        return Draft(tokens=nodes, parents=layout.shape.parents, extra_inputs=extras, shape=layout.shape)

    def observe(self, feedback: StepFeedback) -> None:
        """Keep the candidates of the group after the last accepted node (group 0 when nothing was accepted)."""
        if feedback.extra_logits is None:
            self._candidates = None
            return
        group = feedback.accepted[-1] + 1 if feedback.accepted else 0
        rows = feedback.extra_logits[group * self.masks:(group + 1) * self.masks]  # [M, V]
        k = self.top_k if self.tree == "triangle" else 1
        self._candidates = rows.topk(min(k, rows.shape[-1]), dim=-1).indices  # [M, K] on the device


__all__ = ["BitaProposer", "Layout", "TREES", "triangle_slots", "triangle_tree"]
