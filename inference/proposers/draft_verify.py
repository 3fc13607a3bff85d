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

# The settings of :class:`AdaptiveThreshold` that draftsmith ships, by name.
# "reference": the reference implementation's (dilab-zju/self-speculative-decoding, decoding.py: th_stop_draft=0.8,
#   auto_parameters=[every 1, beta1 0.5, target 0.9, step 1e-2, beta2 0.9], the estimate starting at 0, no clamp).
# "unsmoothed": draftsmith's earlier rule, kept to measure against: the threshold moves by the whole step (beta2 = 0),
#   never holds after a full-length draft, the estimate starts at the target, clamped to [0, 0.99], from 0.6
#   towards an acceptance of 0.8 with beta1 0.9.
THRESHOLD_RULES: dict[str, dict] = {
    "reference": {"gamma": 0.8, "target": 0.9, "step": 0.01, "beta1": 0.5, "beta2": 0.9, "every": 1,
                  "hold_at_full": True, "prior": 0.0, "low": None, "high": None},
    "unsmoothed": {"gamma": 0.6, "target": 0.8, "step": 0.01, "beta1": 0.9, "beta2": 0.0, "every": 1,
                   "hold_at_full": False, "prior": 0.8, "low": 0.0, "high": 0.99},
}


class AdaptiveThreshold:
    """Draft & Verify's adaptive draft-exiting (Zhang et al. 2023, sec. 3.3; the update of the reference's
    decoding.py): drafting stops after a token whose draft probability is below ``gamma``, and every ``every``
    verified steps ``gamma`` follows the measured acceptance::

        AR     <- beta1 * AR + (1 - beta1) * accepted / proposed
        gamma' =  gamma + step   if AR < target                                (accepting too little: stop earlier)
                  gamma          elif hold_at_full and the draft ran to its longest   (long drafts pay: keep going)
                  gamma - step   otherwise                                     (accepting enough: draft longer)
        gamma  <- beta2 * gamma + (1 - beta2) * gamma'

    Args:
        gamma: the threshold a sequence starts from (the reference's th_stop_draft).
        target: the acceptance rate the threshold steers towards (alpha; auto_parameters[2]).
        step: how far one update moves the threshold before smoothing (epsilon; auto_parameters[3]).
        beta1: smoothing of the acceptance estimate AR (auto_parameters[1]).
        beta2: smoothing of the threshold; 0 moves it by the whole step (auto_parameters[4]).
        every: update after every ``every``-th verified step (auto_parameters[0]).
        hold_at_full: keep the threshold when AR meets the target but the draft already ran to its longest.
        prior: the acceptance estimate a sequence starts from (the reference: 0).
        low, high: clamp the threshold to these (None: no clamp, as the reference).

    ``AR`` and ``gamma`` restart for every sequence. Stopping depends only on the draft's own probabilities, so
    decoding stays exact. :data:`THRESHOLD_RULES` names the shipped settings (:meth:`preset`)."""

    def __init__(self, gamma: float = 0.8, target: float = 0.9, step: float = 0.01, beta1: float = 0.5,
                 beta2: float = 0.9, every: int = 1, hold_at_full: bool = True, prior: float = 0.0,
                 low: float | None = None, high: float | None = None) -> None:
        ok = (0.0 <= gamma <= 1.0 and 0.0 < target <= 1.0 and step >= 0 and 0.0 <= beta1 < 1.0
              and 0.0 <= beta2 < 1.0 and every >= 1 and 0.0 <= prior <= 1.0
              and (low is None or low <= gamma) and (high is None or gamma <= high))
        if not ok:
            raise ConfigError(f"adaptive threshold: need gamma in [0, 1] within [low, high], target in (0, 1], "
                              f"step >= 0, beta1 and beta2 in [0, 1), every >= 1, prior in [0, 1]; got gamma={gamma}, "
                              f"target={target}, step={step}, beta1={beta1}, beta2={beta2}, every={every}, "
                              f"prior={prior}, low={low}, high={high}")
        self.initial, self.target, self.step, self.beta1, self.beta2 = gamma, target, step, beta1, beta2
        self.every, self.hold_at_full, self.prior, self.low, self.high = int(every), bool(hold_at_full), prior, low, high
        self.reset()

    @classmethod
    def preset(cls, rule: str = "reference", **overrides) -> AdaptiveThreshold:
        """The named settings of :data:`THRESHOLD_RULES`, with ``overrides``."""
        if rule not in THRESHOLD_RULES:
            raise ConfigError(f"threshold rule {rule!r} is unknown: choose one of {', '.join(THRESHOLD_RULES)}")
        unknown = sorted(set(overrides) - set(THRESHOLD_RULES[rule]))
        if unknown:
            raise ConfigError(f"adaptive threshold: unknown settings {unknown}: use {', '.join(THRESHOLD_RULES[rule])}")
        return cls(**(THRESHOLD_RULES[rule] | overrides))

    @classmethod
    def from_dict(cls, settings: dict | None) -> AdaptiveThreshold:
        """From :meth:`to_dict` (an artefact's ``threshold``); empty: the reference rule. Settings written before the
        reference rule was the default (``beta``, no ``beta1``) keep the rule they were measured with (unsmoothed)."""
        settings = dict(settings or {})
        rule = settings.pop("rule", None)
        if rule is None and "beta" in settings and "beta1" not in settings:
            rule, settings["beta1"] = "unsmoothed", settings.pop("beta")
        return cls.preset("reference" if rule in (None, "custom") else rule, **settings)

    def reset(self) -> None:
        self.gamma, self.acceptance, self.steps = self.initial, self.prior, 0

    def observe(self, proposed: int, accepted: int, full: bool = False) -> None:
        """One verified step: ``accepted`` of ``proposed`` draft tokens; ``full``: the draft ran to its longest."""
        if proposed <= 0:
            return
        self.steps += 1
        if self.steps % self.every:
            return
        self.acceptance = self.beta1 * self.acceptance + (1.0 - self.beta1) * accepted / proposed
        if self.acceptance < self.target:
            moved = self.gamma + self.step
        elif full and self.hold_at_full:
            moved = self.gamma
        else:
            moved = self.gamma - self.step
        gamma = self.beta2 * self.gamma + (1.0 - self.beta2) * moved
        if self.low is not None:
            gamma = max(self.low, gamma)
        if self.high is not None:
            gamma = min(self.high, gamma)
        self.gamma = gamma

    def settings(self) -> dict:
        return {"gamma": self.initial, "target": self.target, "step": self.step, "beta1": self.beta1,
                "beta2": self.beta2, "every": self.every, "hold_at_full": self.hold_at_full, "prior": self.prior,
                "low": self.low, "high": self.high}

    @property
    def rule(self) -> str:
        """The name of the shipped settings these are, or ``custom``."""
        mine = self.settings()
        return next((name for name, values in THRESHOLD_RULES.items() if values == mine), "custom")

    def to_dict(self) -> dict:
        return {"rule": self.rule, **self.settings()}


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
        self._full = False  # the last draft ran to the policy's length (not stopped by the threshold or the end)
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
        longest = self.policy.next_length()  # the configured longest (the reference's max_step_draft)
        k = self._length(tokens, max_tokens)  # <= longest: shorter near the end of the answer
        self._full = False
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
            # adaptive draft-exiting on the draft's own (unwarped) probability of its token, as the reference does
            if self.stop is not None and float(logits.float().softmax(-1)[feed]) < self.stop.gamma:
                break
        cache.crop(past)  # the draft's own entries are not the full model's: drop them
        self._full = len(drafted) >= longest  # a draft cut short by the answer's end is not full, as in the reference
        return chain_draft(drafted, qs)

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        if self.stop is not None:
            self.stop.reset()

    def observe(self, feedback: StepFeedback) -> None:
        super().observe(feedback)
        if self.stop is not None:
            self.stop.observe(feedback.num_proposed, feedback.num_accepted, full=self._full)

    def report_section(self) -> tuple[str, dict]:
        """``("draft_stop", {...})``: the rule that ended drafts (the adaptive threshold's settings, or none)."""
        if self.stop is None:
            return "draft_stop", {"rule": "none", "draft_length": self.policy.length}
        settings = self.stop.to_dict()
        return "draft_stop", {"rule": "adaptive", "threshold_rule": settings.pop("rule"), **settings,
                              "draft_length": self.policy.length}


__all__ = ["THRESHOLD_RULES", "AdaptiveThreshold", "DraftVerifyProposer"]
