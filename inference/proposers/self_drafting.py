"""Self-speculation's shared plumbing: the target drafts for itself with part of its own layers, over its own
cache (LayerSkip's early exit in :mod:`draftsmith.inference.proposers.layerskip`, Draft & Verify's skipped
sublayers in :mod:`draftsmith.inference.proposers.draft_verify`).

Both need the target: :func:`~draftsmith.inference.core.generate.generate` binds it through ``bind(TargetView)``
before every sequence. Drafted tokens stay on the device (no host sync per drafted token).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.proposer import StepFeedback, TargetView
from draftsmith.inference.core.sampling import SamplingParams, draw, process_logits
from draftsmith.inference.core.verify import Draft, Resume


def pick_token(
    logits: torch.Tensor,  # [V]
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # token [1] long on the device, q [V] (None when greedy)
    """The draft's next token, without leaving the device."""
    if sampling.greedy:
        return logits.argmax(-1, keepdim=True), None
    q = process_logits(logits, sampling)
    return draw(q, generator).reshape(1), q


def chain_draft(tokens: list[torch.Tensor], qs: list[torch.Tensor], resume: Resume | None = None) -> Draft:
    """A chain from per-step ``[1]`` token tensors and ``[V]`` draft distributions (empty: greedy)."""
    return Draft.chain(torch.cat(tokens), q=torch.stack(qs) if qs else None, resume=resume)


def check_layers(what: str, layers: Iterable[int], num_layers: int) -> None:
    bad = sorted(i for i in layers if not 0 <= i < num_layers)
    if bad:
        raise ConfigError(f"{what} {bad} are outside the target's layers 0..{num_layers - 1}")


class SelfDrafting:
    """Shared plumbing: the bound target, the draft length policy, the step feedback."""

    lossless = True
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, policy: DraftLengthPolicy | None) -> None:
        self.policy = policy or DraftLengthPolicy()
        self._target: TargetView | None = None

    def bind(self, target: TargetView) -> None:
        self._check(target.adapter.num_layers)
        self._target = target

    def _check(self, num_layers: int) -> None:
        """Raise :class:`ConfigError` when the settings do not fit a target of ``num_layers`` layers."""
        raise NotImplementedError(f"{type(self).__name__} must implement _check(num_layers)")

    def reset(self, prompt_ids: torch.Tensor) -> None:
        if self._target is None:
            raise ConfigError(f"the {self.name} proposer drafts with the target: bind(TargetView(adapter, cache)) first")
        self.policy.reset()

    def _length(self, tokens: torch.Tensor, max_tokens: int) -> int:
        return min(self.policy.next_length(), max_tokens, self._target.adapter.max_positions - tokens.numel())

    def observe(self, feedback: StepFeedback) -> None:
        self.policy.observe(feedback.num_proposed, feedback.num_accepted, feedback.draft_seconds, feedback.target_seconds)


__all__ = ["SelfDrafting", "check_layers", "chain_draft", "pick_token"]
