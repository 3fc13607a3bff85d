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

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.proposer import StepFeedback, TargetView
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.verify import Draft, ExtraInputs
from draftsmith.inference.drafters.bita import BitaEmbeddings, decode_extras_layout

TREES = ("chain", "triangle")


def triangle_tree(candidates: torch.Tensor, top_k: int) -> tuple[list[int], list[int]]:
    """``(tokens, parents)`` of the upper-triangle tree over ``candidates`` ``[M, K]`` (each mask's tokens, best
    first): level ``j`` takes the top ``max(1, top_k - j)`` of mask ``j``, hanging from the first node of level
    ``j - 1``."""
    tokens: list[int] = []
    parents: list[int] = []
    anchor = -1
    for j in range(candidates.shape[0]):
        width = min(max(1, top_k - j), candidates.shape[1])
        first = len(tokens)
        tokens.extend(int(t) for t in candidates[j, :width])
        parents.extend([anchor] * width)
        anchor = first
    return tokens, parents


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

    def bind(self, view: TargetView) -> None:
        """The prompt's keys/values for the target of this sequence (plain prompts run through it: P tokens)."""
        with torch.no_grad():
            keys, values = self.embeddings.prefix_kv(view.adapter)
        self._prefix = ([k.to(view.adapter.dtype) for k in keys], [v.to(view.adapter.dtype) for v in values])

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._candidates = None  # the first step drafts nothing: its masks give the second step's draft

    def draft_nodes(self, max_tokens: int) -> tuple[list[int], list[int]]:
        """The next draft's ``(tokens, parents)`` from the stored candidates, at most ``max_tokens`` deep."""
        if self._candidates is None or max_tokens <= 0:
            return [], []
        candidates = self._candidates[:max_tokens]  # [<= M, K]: one mask per depth
        if self.tree == "chain":
            tokens = [int(t) for t in candidates[:, 0]]
            return tokens, list(range(-1, len(tokens) - 1))
        return triangle_tree(candidates, self.top_k)

    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        if self._prefix is None:
            raise ConfigError("the BiTA proposer runs inside the decode loop, which binds it to the target first")
        nodes, parents = self.draft_nodes(max_tokens)
        visible, depths = decode_extras_layout(parents, self.masks, self.embeddings.mask_attention)
        extras = ExtraInputs(visible, depths, inputs_embeds=self.embeddings.mask_inputs(len(nodes) + 1),
                             prefix=self._prefix)
        return Draft(tokens=torch.tensor(nodes, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long),
                     extra_inputs=extras)

    def observe(self, feedback: StepFeedback) -> None:
        """Keep the candidates of the group after the last accepted node (group 0 when nothing was accepted)."""
        if feedback.extra_logits is None:
            self._candidates = None
            return
        group = feedback.accepted[-1] + 1 if feedback.accepted else 0
        rows = feedback.extra_logits[group * self.masks:(group + 1) * self.masks]  # [M, V]
        k = self.top_k if self.tree == "triangle" else 1
        self._candidates = rows.topk(min(k, rows.shape[-1]), dim=-1).indices.cpu()  # [M, K]


__all__ = ["BitaProposer", "TREES", "triangle_tree"]
