"""EAGLE-1 drafting as a chain (Li et al. 2024): the head extrapolates the target's features token by token.

Head position ``t`` reads ``[E(x_{t+1}); f_t]`` and predicts ``f^_{t+1}``, whose LM-head distribution guesses
``x_{t+2}``. The head keeps its own KV cache over the committed sequence, filled only from *true* target
features: after the prefill it holds positions ``0 .. L-2`` (the prompt's features, the pending token as the last
``x_{t+1}``). A draft continues from there on the head's own predicted features (``f^`` for ``f``), writing
entries the next :meth:`EagleProposer.observe` crops away; ``observe`` then feeds the verification's true
features at the pending token and the accepted nodes, with the committed tokens as ``x_{t+1}``, so the cache is
always in step with the accepted branch. Greedy drafts are argmax tokens; under sampling each token is drawn
from the head's distribution, which is returned as ``q`` so that the loop's rejection sampling keeps the target's
distribution exactly.
"""

from __future__ import annotations

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.eagle import EagleHead
from draftsmith.inference.proposers.base import StepFeedback
from draftsmith.inference.sampling import SamplingParams, process_logits
from draftsmith.inference.verify import Draft


class EagleProposer:
    """Drafts a chain of up to ``length`` tokens with an :class:`EagleHead` over the target's embedding and LM
    head."""

    name = "eagle"
    lossless = True
    hidden_layers: tuple[int, ...] = (-1,)

    def __init__(self, head: EagleHead, embed: torch.nn.Module, lm_head: torch.nn.Module, length: int = 5) -> None:
        if length < 1:
            raise ConfigError(f"EAGLE draft length must be >= 1, got {length}")
        self.head, self.embed, self.lm_head, self.length = head.eval(), embed, lm_head, int(length)
        self._prompt: torch.Tensor | None = None  # [L] the sequence's prompt (for the prefill)
        self._cache = None
        self._true = 0  # head positions filled from true target features (= committed tokens - 1)
        self._feature: torch.Tensor | None = None  # [H] f^ of the next position, from true inputs

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = prompt_ids
        self._cache = self.head.new_cache(capacity=max(256, 2 * prompt_ids.numel()))
        self._true, self._feature = 0, None

    def _feed(self, next_tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:  # [m], [m, H] -> [m, H]
        """Run the head on true inputs at positions ``_true .. _true + m - 1`` and advance ``_true``."""
        m = next_tokens.numel()
        pos = torch.arange(self._true, self._true + m, device=features.device)[None]  # [1, m]
        out = self.head(self.embed(next_tokens)[None], features[None].to(self.embed.weight.dtype), pos, self._cache)
        self._true += m
        return out[0]

    def prefill_hidden(self, hidden_states: dict[int, torch.Tensor]) -> None:
        features = hidden_states[-1]  # [L - 1, H]: f_0 .. f_{L-2}
        if features.shape[0] == 0:
            return
        self._feature = self._feed(self._prompt[1:].to(features.device), features)[-1]

    def observe(self, feedback: StepFeedback) -> None:
        if self._feature is None:
            return
        self._cache.crop(self._true)  # drop the draft's own entries
        committed = torch.tensor(feedback.committed, dtype=torch.long, device=self._feature.device)  # [a + 1]
        if committed.numel() == 0:
            return
        features = feedback.hidden_states[-1][: committed.numel()]  # f at the pending token and accepted nodes
        self._feature = self._feed(committed, features)[-1]

    @torch.inference_mode()
    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        k = min(self.length, max_tokens)
        if self._feature is None or k <= 0 or tokens.numel() - 1 != self._true:
            return Draft.empty()  # no features yet, or the head fell out of step (a step that drafted nothing)
        feature, pos = self._feature, self._true
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            logits = self.lm_head(feature).float()  # [V]
            if sampling.greedy:
                tok = int(logits.argmax())
            else:
                q = process_logits(logits, sampling)  # [V]
                tok = int(torch.multinomial(q, 1, generator=generator))
                qs.append(q)
            drafted.append(tok)
            if i + 1 < k:  # the head's next position reads its own feature
                ids = torch.tensor([[tok]], dtype=torch.long, device=feature.device)
                p = torch.tensor([[pos]], device=feature.device)
                feature = self.head(self.embed(ids), feature[None, None], p, self._cache)[0, -1]
                pos += 1
        return Draft.chain(drafted, q=torch.stack(qs) if qs else None)


__all__ = ["EagleProposer"]
