"""P-EAGLE drafting: the whole block in the head forward that takes in the committed tokens.

:class:`~draftsmith.inference.proposers.eagle.EagleProposer` feeds the head the committed tokens with the target's
features after each verification (``_feed``); its last output guesses the next draft token. Here the same forward
also carries ``K - 1`` placeholders (the mask token's embedding and ``fc(mask_hidden)``) at the positions after the
last committed one, attending causally (:mod:`draftsmith.inference.drafters.peagle`), so every draft token of the next
step is ready once the verification's features are in: one head forward per step, as vLLM's parallel drafting runs
it. The placeholders' cache entries lie past the committed positions and are cropped at the next feed. Greedy drafts
are each position's draft-vocabulary argmax; sampled drafts draw each position from its own distribution and return it
as ``q``, so the loop's rejection sampling keeps the target's distribution exactly (a proposal need not depend on the
drafts before it)."""

from __future__ import annotations

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.sampling import SamplingParams, process_logits
from draftsmith.inference.core.trees import StaticTree
from draftsmith.inference.core.verify import Draft
from draftsmith.inference.proposers.eagle import EagleProposer


class PEagleProposer(EagleProposer):
    """Drafts a chain of up to ``length`` tokens with a :class:`~draftsmith.inference.drafters.peagle.PEagleHead`,
    all of them from one head forward (module docstring)."""

    name = "p-eagle"

    def __init__(self, head, embed: torch.nn.Module, lm_head: torch.nn.Module, length: int = 5,
                 tree: StaticTree | str | None = None, **kwargs) -> None:
        if isinstance(tree, str) and tree != "chain":
            raise ConfigError(f"--tree {tree}: P-EAGLE drafts its block as a chain or a static tree over the block's "
                              "top-k (--tree chain|auto|FILE.json)")
        super().__init__(head, embed, lm_head, length=length, tree="chain", **kwargs)
        self.static = tree if isinstance(tree, StaticTree) else None
        if self.static is not None and self.static.max_depth > self.length:
            raise ConfigError(f"the tree is {self.static.max_depth} deep but the block drafts {self.length} tokens: "
                              "use a shallower tree or a longer --draft-length")
        self.name = "p-eagle" if self.static is None else "p-eagle (static tree)"
        self._block: torch.Tensor | None = None  # [K-1, H] the placeholders' outputs of the last feed
        self.forwards = 0  # head forwards run (the draft's cost per committed token)

    def report_section(self) -> tuple[str, dict]:
        """EAGLE's section (the draft vocabulary's share), with the static tree's shape when the block is one."""
        key, section = super().report_section()
        if self.static is not None:
            section |= {"rule": "static", "nodes": len(self.static), "depth": self.static.max_depth,
                        "top_k": self.static.top_k}
        return key, section

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        self._block = None

    @torch.inference_mode()
    def _feed(self, next_tokens: torch.Tensor, features: dict[int, torch.Tensor]) -> torch.Tensor:  # -> [m, H]
        """The committed tokens at positions ``_true .. _true + m - 1`` and ``length - 1`` placeholders after them, in
        one head forward; returns the committed positions' outputs and keeps the placeholders'."""
        m, extra = next_tokens.numel(), self.length - 1
        dtype = self.embed.weight.dtype
        hidden = self.head.fuse({i: f[:m].to(dtype) for i, f in features.items()})  # [m, H]
        embeds = self.embed(next_tokens)  # [m, H]
        if extra > 0:
            mask = torch.full((extra,), self.head.mask_token_id, dtype=torch.long, device=next_tokens.device)
            hidden = torch.cat([hidden, self.head.mask_state().to(dtype).expand(extra, -1)])  # [m + K-1, H]
            embeds = torch.cat([embeds, self.embed(mask)])
        pos = torch.arange(self._true, self._true + m + extra, device=hidden.device)[None]  # [1, m + K-1]
        out = self.head(embeds[None], hidden[None], pos, self._cache)[0]  # causal over the block
        self.forwards += 1
        self._true += m
        self._cache.crop(self._true)  # the placeholders' entries: not part of the committed sequence
        self._block = out[m:]
        return out[:m]

    @torch.inference_mode()
    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        k = min(self.length, max_tokens)
        if self._feature is None or k <= 0 or tokens.numel() - 1 != self._true:
            return Draft.empty()
        states = torch.cat([self._feature[None], self._block])[:k]  # [k, H]
        logits = self.head.draft_logits(states, self.lm_head).float()  # [k, Vd]
        self.last_draft_logits = logits
        if self.static is not None:  # the block's top-k per position (deterministic nodes: exact under sampling too)
            candidates = self.head.to_target(logits.topk(self.static.top_k, dim=-1).indices)  # [k, top_k]
            return self.static.draft(candidates, max_depth=k)
        if sampling.greedy:
            return Draft.chain(self.head.to_target(logits.argmax(-1)))
        q = torch.stack([process_logits(row, sampling) for row in logits])  # [k, Vd]
        idx = torch.multinomial(q, 1, generator=generator)[:, 0]  # [k]
        return Draft.chain(self.head.to_target(idx), q=torch.stack([self._on_target_vocab(row) for row in q]))


__all__ = ["PEagleProposer"]
