"""Medusa drafting (Cai et al. 2024): the heads read the target's last hidden state and a static token tree of
their top-k candidates is verified in one target forward.

The hidden state used is the target's at the last token it processed (the last accepted node, or the pending
token's predecessor right after the prefill): its LM head gave the pending token, so head ``k`` (0-based)
guesses the token ``k + 1`` places after the pending one, the candidates of tree depth ``k + 1``. The tree's
nodes are the heads' top-k candidates, so they are deterministic proposals (``q`` one-hot): greedy
verification accepts the longest matching branch, and sampling stays exact through the loop's multi-branch
rejection sampling. With ``typical=(epsilon, delta)`` the proposer carries Medusa's typical acceptance instead
(:func:`~draftsmith.inference.core.typical.typical_verifier`: the longest candidate whose tokens the target finds
typical, ties by likelihood, then the target's argmax; ``delta=None`` is ``sqrt(epsilon)``), which is lossy under
sampling and reported as lossy.
"""

from __future__ import annotations

import torch

from draftsmith.common.errors import ProposerError
from draftsmith.inference.core.proposer import StepFeedback
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.trees import StaticTree
from draftsmith.inference.core.typical import typical_verifier
from draftsmith.inference.core.verify import Draft
from draftsmith.inference.drafters.medusa import MedusaHeads


class MedusaProposer:
    """Drafts ``tree`` filled with the ``heads``' top-k candidates."""

    name = "medusa"
    lossless = True
    hidden_layers: tuple[int, ...] = (-1,)

    def __init__(self, heads: MedusaHeads, lm_head: torch.nn.Module, tree: StaticTree,
                 typical: tuple[float, float | None] | None = None) -> None:
        if tree.max_depth > heads.num_heads:
            raise ProposerError(f"the tree is {tree.max_depth} deep but there are only {heads.num_heads} Medusa heads: "
                                "use a shallower tree (--tree chain, or fewer levels in the choice paths)")
        self.heads, self.lm_head, self.tree = heads.eval(), lm_head, tree
        self._hidden: torch.Tensor | None = None  # [H] the target's last-processed hidden state
        self.last_draft_logits: torch.Tensor | None = None  # [D, V] the heads' logits of the last draft
        if typical is not None:  # Medusa's typical acceptance: lossy under sampling, reported as such
            self.verifier = typical_verifier(*typical)
            self.lossless = False
            self.name = "medusa (typical acceptance, lossy)"

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._hidden = None

    def prefill_hidden(self, hidden_states: dict[int, torch.Tensor]) -> None:
        states = hidden_states[-1]  # [L - 1, H]
        self._hidden = states[-1] if states.shape[0] else None

    def observe(self, feedback: StepFeedback) -> None:
        self._hidden = feedback.hidden_states[-1][-1]  # [H] at the last accepted node (or the pending token)

    def candidates(self) -> torch.Tensor:  # [depth, k] token ids, best first
        depth, k = self.tree.max_depth, self.tree.top_k
        logits = torch.stack([self.heads.head_logits(self._hidden, d, self.lm_head) for d in range(depth)])  # [D, V]
        self.last_draft_logits = logits  # per depth: what a chain tree drafts from (tree calibration)
        return logits.topk(k, dim=-1).indices

    def draft_index(self, tokens: torch.Tensor) -> torch.Tensor:  # [m] target ids, the heads' vocabulary too
        return tokens

    @torch.inference_mode()
    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        if self._hidden is None or max_tokens <= 0:
            return Draft.empty()
        return self.tree.draft(self.candidates(), max_depth=max_tokens)


__all__ = ["MedusaProposer"]
