"""The proposer seam: every drafting method is a ``Proposer`` the decode loop calls once per step.

A proposer sees the committed tokens (prompt + generated, the last one *pending*: the target has
not processed it yet) and returns a :class:`~draftsmith.inference.verify.Draft`. After the
target's verification the loop calls :meth:`Proposer.observe` so that stateful proposers (their own
KV caches, adaptive draft lengths) can follow what was committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from draftsmith.inference.sampling import SamplingParams
from draftsmith.inference.verify import Draft


@dataclass
class StepFeedback:
    """What one verification step tells the proposer (see :meth:`Proposer.observe`)."""

    num_proposed: int  # draft nodes proposed this step
    num_accepted: int  # of which accepted
    draft_seconds: float  # time spent proposing
    target_seconds: float  # time of the target forward + acceptance
    accepted: list[int] = field(default_factory=list)  # accepted node indices, root to leaf
    committed: list[int] = field(default_factory=list)  # tokens committed (accepted + correction/bonus)
    target_logits: torch.Tensor | None = None  # [1 + n, V] rows: pending token, then draft nodes
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)
    # layer index -> [1 + a, H]: the target's hidden states at the pending token and the accepted
    # nodes (only the layers the proposer lists in ``hidden_layers``; -1 = last, after the final norm)


@runtime_checkable
class Proposer(Protocol):
    name: str
    lossless: bool  # False for rules that change the output distribution (must be reported)
    # Target hidden states the proposer needs (EAGLE, Medusa): transformers-style layer indices,
    # -1 for the final-normed last hidden state. Empty: the loop computes none.
    hidden_layers: tuple[int, ...]

    def reset(self, prompt_ids: torch.Tensor) -> None:
        """Start a new sequence. ``prompt_ids``: [L] long."""

    def propose(
        self,
        tokens: torch.Tensor,  # [L] long, committed tokens; tokens[-1] is pending
        max_tokens: int,  # never propose more than this many nodes
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Draft:
        """Return the draft for the next verification step."""

    def prefill_hidden(self, hidden_states: dict[int, torch.Tensor]) -> None:
        """Called after the prefill when ``hidden_layers`` is non-empty, with ``[L - 1, H]``
        hidden states of the prompt tokens the target processed (all but the pending one)."""

    def observe(self, feedback: StepFeedback) -> None:
        """Told after every verification step that proposed something."""


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D tensors."""
    n = min(a.numel(), b.numel())
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else n
