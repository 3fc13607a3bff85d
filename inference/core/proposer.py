"""The proposer seam: every drafting method is a ``Proposer`` the decode loop calls once per step.

A proposer sees the committed tokens (prompt + generated, the last one *pending*: the target has
not processed it yet) and returns a :class:`~draftsmith.inference.core.verify.Draft`. After the
target's verification the loop calls :meth:`Proposer.observe` so that stateful proposers (their own
KV caches, adaptive draft lengths) can follow what was committed.

Self-drafting proposers (LayerSkip's early exit, Draft & Verify's layer skipping) draft with the
target itself. They define the optional hook ``bind(target: TargetView)``, which the loop calls
before ``reset`` for every sequence with the target's adapter and the sequence's KV cache; the
contract on that cache is in :class:`TargetView`. Proposers without ``bind`` never see the target.

A draft can ask for more from the verification forward than the tree's logits:
``Draft.resume`` starts it at a layer from hidden states the proposer computed (early exit), and
``Draft.extra_inputs`` adds tokens of the proposer's own after the tree (BiTA's mask tokens, Jacobi
blocks), whose logits and hidden states come back in :class:`StepFeedback`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.kv_cache import KVCache
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.verify import Draft

__all__ = ["Draft", "OwnsAcceptanceRule", "Proposer", "ReportsSection", "ResetsStats", "RunsDraftModel",
           "SelfDrafting", "StepFeedback", "TargetView", "acceptance_rule", "common_prefix_length"]


@dataclass(frozen=True)
class TargetView:
    """The target and the KV cache of the sequence being decoded, for proposers that draft with the
    target's own layers.

    At every ``propose(tokens, ...)`` call the cache holds exactly the committed tokens but the
    pending one: ``cache.get_seq_length(i) == len(tokens) - 1`` in every layer ``i``. The proposer
    may run target layers with the cache (``adapter.forward(..., cache)``), reading the committed
    entries and appending its own. When ``propose`` returns, every layer must again hold
    ``len(tokens) - 1`` entries (crop what the draft wrote: ``cache.crop(len(tokens) - 1)``), with one
    exception: a draft with ``resume=Resume(start=E, hidden)`` leaves layers ``0 .. E-1`` holding
    ``len(tokens) + n`` entries, the pending token and the ``n`` nodes at the positions the
    verification forward uses, so that the verification runs layers ``E ..`` only. The loop checks
    this after every proposal (:class:`~draftsmith.common.errors.ProposerError` otherwise)."""

    adapter: ModelAdapter
    cache: KVCache


@dataclass
class StepFeedback:
    """What one verification step tells the proposer (see :meth:`Proposer.observe`)."""

    num_proposed: int  # draft nodes proposed this step
    num_accepted: int  # of which accepted
    draft_seconds: float  # time spent proposing
    target_seconds: float  # time of the target forward + acceptance
    accepted: list[int] = field(default_factory=list)  # accepted node indices, root to leaf
    committed: list[int] = field(default_factory=list)  # tokens committed (accepted + correction/bonus)
    committed_ids: torch.Tensor | None = None  # [a + 1] long: the same tokens on the target's device (None: not given)
    draft_tokens: list[int] | None = None  # [n] every draft token, read with the verdict (None: not read)
    target_logits: torch.Tensor | None = None  # [1 + n, V] rows: pending token, then draft nodes
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)
    # layer index -> [1 + a, H]: the target's hidden states at the pending token and the accepted
    # nodes (only the layers the proposer lists in ``hidden_layers``; -1 = last, after the final norm)
    extra_logits: torch.Tensor | None = None  # [m, V] the target's logits at Draft.extra_inputs (None: no extras)
    extra_hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    # layer index -> [m, H] at the extras (the layers listed in ExtraInputs.hidden_layers)


@runtime_checkable
class Proposer(Protocol):
    """Required members. The optional hooks are declared below (:class:`SelfDrafting`, :class:`ResetsStats`,
    :class:`ReportsSection`, :class:`OwnsAcceptanceRule`, :class:`RunsDraftModel`): a proposer offers one by defining
    its member, and the loop and the evaluator test for it with ``isinstance``. ``prefill_hidden`` is called when ``hidden_layers`` is non-empty."""

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
        max_tokens: int,  # never propose a path deeper than this (a tree may hold more nodes)
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Draft:
        """Return the draft for the next verification step."""

    def prefill_hidden(self, hidden_states: dict[int, torch.Tensor]) -> None:
        """Called after the prefill when ``hidden_layers`` is non-empty, with ``[L - 1, H]``
        hidden states of the prompt tokens the target processed (all but the pending one)."""

    def observe(self, feedback: StepFeedback) -> None:
        """Told after every verification step that proposed something."""


# -- optional hooks: a proposer offers them by defining the member; callers test with isinstance -----------------


@runtime_checkable
class SelfDrafting(Protocol):
    """Drafts with the target's own layers: the loop binds it to the target and the sequence's cache before
    ``reset`` (:class:`TargetView`)."""

    def bind(self, target: TargetView) -> None: ...


@runtime_checkable
class ResetsStats(Protocol):
    """Keeps counts of its own, which the evaluator clears after the warm-up."""

    def reset_stats(self) -> None: ...


@runtime_checkable
class ReportsSection(Protocol):
    """Adds ``(key, figures)`` to the evaluation report (Jacobi's fast-forwarded and stationary tokens, ...)."""

    def report_section(self) -> tuple[str, dict]: ...


@runtime_checkable
class OwnsAcceptanceRule(Protocol):
    """Verifies its drafts by a rule of its own (Medusa's typical acceptance: lossy, and reported so), which the loop
    uses unless its caller passes one: ``verifier(processed target logits, draft, generator) -> Verdict``."""

    verifier: Callable


def acceptance_rule(proposer: object, verifier: Callable | None = None) -> Callable | None:
    """The rule that verifies ``proposer``'s drafts: ``verifier`` when given, else the proposer's own
    (:class:`OwnsAcceptanceRule`), else None (the exact rules)."""
    if verifier is None and isinstance(proposer, OwnsAcceptanceRule):
        return proposer.verifier
    return verifier


@runtime_checkable
class RunsDraftModel(Protocol):
    """Runs a separate draft model, which transformers' assisted generation and ``draftsmith tune`` take."""

    @property
    def draft_model(self) -> torch.nn.Module: ...


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (host lists: no device read)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
