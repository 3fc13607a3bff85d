"""LayerSkip's early-exit self-speculation (Elhoushi et al. 2024): draft with layers ``0 .. E-1``, the final
norm and the shared LM head. The first ``E`` layers of the verification are the same computation, so the draft
leaves its keys/values in those layers of the target's cache and hands the verification the layer-``E`` hidden
states of the pending token and every drafted token (:class:`~draftsmith.inference.core.verify.Resume`); the
verification runs layers ``E ..`` only (LayerSkip's shared KV cache and exit query cache).
"""

from __future__ import annotations

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.verify import Draft, Resume
from draftsmith.inference.proposers.self_drafting import SelfDrafting, chain_draft, pick_token


class EarlyExitProposer(SelfDrafting):
    """Drafts a chain with the target's first ``exit_layer`` layers (LayerSkip's self-speculation)."""

    name = "early-exit"

    def __init__(self, exit_layer: int, policy: DraftLengthPolicy | None = None) -> None:
        super().__init__(policy)
        if exit_layer < 1:
            raise ConfigError(f"exit_layer must be at least 1 (draft with layers 0..exit_layer-1), got {exit_layer}")
        self.exit_layer = int(exit_layer)

    def _check(self, num_layers: int) -> None:
        if self.exit_layer > num_layers:
            raise ConfigError(f"exit_layer {self.exit_layer} is past the target's {num_layers} layers")

    def propose(
        self,
        tokens: torch.Tensor,  # [L]; tokens[-1] is pending
        max_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Draft:
        k = self._length(tokens, max_tokens)
        if k <= 0:
            return Draft.empty()
        adapter, cache, exit_ = self._target.adapter, self._target.cache, self.exit_layer
        feed = tokens[-1:]  # [1]
        drafted: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        hidden: list[torch.Tensor] = []  # layer-E states of the pending token and the drafted ones, [1, H] each
        for _ in range(k):
            out = adapter.forward(feed[None], cache, exit_layer=exit_, output_hidden_states=(exit_,))
            hidden.append(out.hidden_states[exit_][0])
            feed, q = pick_token(out.logits[0, -1], sampling, generator)
            drafted.append(feed)
            if q is not None:
                qs.append(q)
        # layers 0..E-1 of the last drafted token as well: the verification starts at layer E for every row
        out = adapter.forward(feed[None], cache, exit_layer=exit_, output_hidden_states=(exit_,), compute_logits=False)
        hidden.append(out.hidden_states[exit_][0])
        return chain_draft(drafted, qs, Resume(start=exit_, hidden=torch.cat(hidden)))  # hidden [1 + k, H]


__all__ = ["EarlyExitProposer"]
