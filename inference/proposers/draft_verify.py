"""Draft & Verify's self-speculation (Zhang et al. 2023): draft with every layer except a skip set (whole
layers, or only their attention or MLP), reading the target's cache of the committed prefix; what it writes for
its own tokens differs from the full model's, so it crops the cache back before the verification. With
:class:`AdaptiveThreshold` it stops a draft at an unsure token, the threshold following the measured acceptance.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.proposer import StepFeedback
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.verify import Draft
from draftsmith.inference.proposers.self_drafting import SelfDrafting, chain_draft, check_layers, pick_token


class AdaptiveThreshold:
    """Draft & Verify's adaptive draft-exiting (Zhang et al. 2023, sec. 3.3): drafting stops after a token whose
    draft probability is below ``gamma``, and ``gamma`` follows the measured acceptance::

        AR    <- beta * AR + (1 - beta) * accepted / proposed          (after every verified step)
        gamma <- gamma + step   if AR < target     (accepting too little: stop drafts earlier)
                 gamma - step   otherwise           (accepting enough: let drafts run longer)

    clamped to ``[low, high]``. Stopping depends only on the draft's own probabilities, so decoding stays exact."""

    def __init__(self, gamma: float = 0.6, target: float = 0.8, step: float = 0.01, beta: float = 0.9,
                 low: float = 0.0, high: float = 0.99) -> None:
        if not (0.0 <= low <= gamma <= high < 1.0 and 0.0 < target <= 1.0 and step >= 0 and 0.0 <= beta < 1.0):
            raise ConfigError(f"adaptive threshold: need 0 <= low <= gamma <= high < 1, target in (0, 1], step >= 0 "
                              f"and beta in [0, 1); got gamma={gamma}, target={target}, low={low}, high={high}")
        self.initial, self.target, self.step, self.beta, self.low, self.high = gamma, target, step, beta, low, high
        self.reset()

    def reset(self) -> None:
        self.gamma, self.acceptance = self.initial, self.target

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self.acceptance = self.beta * self.acceptance + (1.0 - self.beta) * accepted / proposed
        move = self.step if self.acceptance < self.target else -self.step
        self.gamma = min(self.high, max(self.low, self.gamma + move))

    def to_dict(self) -> dict:
        return {"gamma": self.initial, "target": self.target, "step": self.step, "beta": self.beta, "low": self.low,
                "high": self.high}


class DraftVerifyProposer(SelfDrafting):
    """Drafts a chain with the target minus a skip set (Draft & Verify's self-speculation).

    ``skip_layers`` are skipped whole; in ``skip_attention`` / ``skip_mlp`` only that sublayer is
    (the adapter supports sublayer skipping for Llama, Qwen2, Qwen3, Mistral and GPT-2 layouts)."""

    name = "skip-layers"

    def __init__(
        self,
        skip_layers: Iterable[int] = (),
        skip_attention: Iterable[int] = (),
        skip_mlp: Iterable[int] = (),
        policy: DraftLengthPolicy | None = None,
        stop: AdaptiveThreshold | None = None,
    ) -> None:
        super().__init__(policy)
        self.stop = stop
        self.skip_layers = tuple(sorted(set(skip_layers)))
        self.skip_attention = tuple(sorted(set(skip_attention)))
        self.skip_mlp = tuple(sorted(set(skip_mlp)))
        if not (self.skip_layers or self.skip_attention or self.skip_mlp):
            raise ConfigError("a skip-layer draft needs something to skip (skip_layers, skip_attention or skip_mlp)")

    def _check(self, num_layers: int) -> None:
        check_layers("skip_layers", self.skip_layers, num_layers)
        check_layers("skip_attention", self.skip_attention, num_layers)
        check_layers("skip_mlp", self.skip_mlp, num_layers)

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
        adapter, cache = self._target.adapter, self._target.cache
        past = tokens.numel() - 1
        feed = tokens[-1:]  # [1]
        drafted: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        for _ in range(k):
            logits = adapter.forward(
                feed[None],
                cache,
                skip_layers=self.skip_layers,
                skip_attention=self.skip_attention,
                skip_mlp=self.skip_mlp,
            ).logits[0, -1]  # [V]
            feed, q = pick_token(logits, sampling, generator)
            drafted.append(feed)
            if q is not None:
                qs.append(q)
            if self.stop is not None:  # adaptive draft-exiting on the draft's own probability of its token
                p = (q if q is not None else logits.float().softmax(-1))[feed]
                if float(p) < self.stop.gamma:
                    break
        cache.crop(past)  # the draft's own entries are not the full model's: drop them
        return chain_draft(drafted, qs)

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        if self.stop is not None:
            self.stop.reset()

    def observe(self, feedback: StepFeedback) -> None:
        super().observe(feedback)
        if self.stop is not None:
            self.stop.observe(feedback.num_proposed, feedback.num_accepted)

    def report_section(self) -> tuple[str, dict]:
        """``("draft_stop", {...})``: the rule that ended drafts (the adaptive threshold's settings, or none)."""
        if self.stop is None:
            return "draft_stop", {"rule": "none", "draft_length": self.policy.length}
        return "draft_stop", {"rule": "adaptive", **self.stop.to_dict(), "draft_length": self.policy.length}


__all__ = ["AdaptiveThreshold", "DraftVerifyProposer"]
