"""The proposer seam: every drafting method is a ``Proposer`` the decode loop calls once per step.

A proposer sees the committed tokens (prompt + generated, the last one *pending*: the target has
not processed it yet) and returns a :class:`~draftsmith.inference.verify.Draft`. After the
target's verification the loop calls :meth:`Proposer.observe` so that stateful proposers (their own
KV caches, adaptive draft lengths) can follow what was committed.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from draftsmith.inference.sampling import SamplingParams
from draftsmith.inference.verify import Draft


@runtime_checkable
class Proposer(Protocol):
    name: str
    lossless: bool  # False for rules that change the output distribution (must be reported)

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

    def observe(self, num_proposed: int, num_accepted: int, draft_seconds: float, target_seconds: float) -> None:
        """Told after every verification: how many nodes were proposed and accepted, and how long
        proposing and verifying took."""


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D tensors."""
    n = min(a.numel(), b.numel())
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else n
