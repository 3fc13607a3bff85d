"""EAGLE-3's training-time test (Li et al. 2025, sec. 3): the head unrolled over its own outputs in one forward, and
which anchors each unrolled step sees and is trained on. The loss and the trainer: :mod:`draftsmith.trainers.eagle`."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftsmith.inference.drafters.eagle import Eagle3Head, GrowingCache


class Eagle3TTT(nn.Module):
    """EAGLE-3's trainable module: the head, whose ``forward`` runs the whole unrolled training-time test (one
    forward per training step, as data-parallel wrappers require). The artefact keeps the head's own tensors.
    ``recompute``: each unrolled step's activations are recomputed in the backward (:func:`unrolled_states`)."""

    def __init__(self, head: Eagle3Head, recompute: bool = True) -> None:
        super().__init__()
        self.head = head
        self.recompute = bool(recompute)

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.head.hidden_layers

    @property
    def t2d(self) -> torch.Tensor:
        return self.head.t2d

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.to_target(ids)

    def forward(self, features: torch.Tensor, step_embeds: torch.Tensor,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """``features`` ``[B, A, 3Ht]`` (the target's three layers at anchors ``0 .. A-1``), ``step_embeds``
        ``[K, B, A, H]`` (``E(x_{t+1+j})`` for step ``j``) -> draft logits ``[K, B, A, Vd]``; with ``keep``
        ``[K, B, A]`` bool (the anchors each step is trained on), only those: ``[sum_j keep[j].sum(), Vd]``, step by
        step (the draft LM head skips the unlabelled anchors, most of a prompt)."""
        logits = []
        for j, hidden in enumerate(unrolled_states(self.head, features, step_embeds, self.recompute)):
            logits.append(self.head.draft_logits(hidden if keep is None else hidden[keep[j]]))
        return torch.stack(logits) if keep is None else torch.cat(logits)

    def artefact_config(self) -> dict:
        return self.head.artefact_config()

    @staticmethod
    def artefact_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.removeprefix("head."): v for k, v in state_dict.items() if k.startswith("head.")}


def unrolled_states(head: Eagle3Head, features: torch.Tensor, step_embeds: torch.Tensor,
                    recompute: bool = False) -> Iterator[torch.Tensor]:  # yields [B, A, H] per step
    """The training-time test's head outputs ``h^j`` (pre-norm), step by step: ``features`` ``[B, A, 3Ht]`` fused
    by ``fc`` into ``g``, then step ``j`` reads ``step_embeds[j]`` ``[B, A, H]`` and its step ``j-1`` output at
    positions ``t + j``, seeing what decoding shows draft depth ``j + 1`` (:func:`ttt_visibility`).

    A P-EAGLE head (:class:`~draftsmith.inference.drafters.peagle.PEagleHead`) drafts depth ``j > 0`` from
    placeholders instead: ``step_embeds[j]`` holds the mask token's embedding and the step reads ``fc(mask_hidden)`` in
    place of step ``j-1``'s output; the visibility and positions are the same (the reference's parallel-drafting mask:
    the true prefix up to the anchor, and the anchor's own shallower depths).

    ``recompute`` (with gradients on): each step runs under activation checkpointing, so the forward keeps only a
    step's output and its new keys and values, and the backward recomputes one step's attention at a time — the
    attention over keys that grow to ``K x A`` is otherwise held for every step at once (``K(K+1)/2 x A^2`` scores).
    The gradients are the same."""
    steps, b, a = step_embeds.shape[:3]
    hidden = head.fc(features)  # [B, A, H]: g
    placeholder = head.mask_state().expand(b, a, -1) if hasattr(head, "mask_hidden") else None  # P-EAGLE: [B, A, H]
    past: list[torch.Tensor] = []  # keys, values of steps 0 .. j-1, [B, KV, A, D] each
    run = partial(checkpoint, partial(_unrolled_step, head), use_reentrant=False) \
        if recompute and torch.is_grad_enabled() else partial(_unrolled_step, head)
    for j in range(steps):
        pos = (torch.arange(a, device=features.device) + j)[None].expand(b, a)  # [B, A]
        if placeholder is not None and j > 0:  # P-EAGLE: every later depth reads the shared placeholder state
            hidden = placeholder
        hidden, key, value = run(step_embeds[j], hidden, pos, ttt_visibility(a, j, features.device), *past)
        past += [key, value]
        yield hidden


def _unrolled_step(head: Eagle3Head, embeds: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor,
                   visible: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One unrolled step as a function of its inputs (so it can be recomputed): ``past`` the earlier steps' keys and
    values, alternating -> ``(h^j [B, A, H], keys [B, KV, A, D], values [B, KV, A, D])`` of this step."""
    cache = GrowingCache(torch.cat(past[0::2], dim=2), torch.cat(past[1::2], dim=2)) if past else GrowingCache()
    out = head(embeds, hidden, pos, cache, visible=visible)
    return (out, *cache.new)


def ttt_visibility(anchors: int, step: int, device=None) -> torch.Tensor:  # [A, (step + 1) * A] bool
    """What unrolled step ``step`` sees in the training-time test, over the keys of steps ``0 .. step`` (``anchors``
    keys each): step 0's keys causally (``s <= t``, the true prefix), and each later step's key at the same anchor
    only (``s == t``: the draft's own ancestors) — decoding's view of draft depth ``step + 1``."""
    causal = torch.ones(anchors, anchors, dtype=torch.bool, device=device).tril()
    eye = torch.eye(anchors, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def ttt_anchors(labels: torch.Tensor, step: int,
                draftable: torch.Tensor | None = None) -> torch.Tensor:  # labels [B, T] -> [B, A = T-1] bool
    """The anchors ``t`` unrolled step ``step`` is trained on: those whose ``x_{t+2+step}`` is an answer token (the
    last anchor never has a label); with ``draftable`` ``[B, A]`` (at anchor ``t``: the target's argmax next token
    ``argmax p_{t+2}`` lies in the draft vocabulary), only those whose step-``step`` label ``argmax p_{t+2+step}`` does
    — EAGLE-3's ``position_mask = t2d[target_argmax] * loss_mask``, shifted with the labels."""
    keep = shifted(labels[:, 2:], step, -100) != -100  # [B, A-1]
    keep = torch.cat([keep, keep.new_zeros(keep.shape[0], 1)], dim=1)  # [B, A]
    return keep if draftable is None else keep & shifted(draftable.bool(), step, False)


def shifted(x: torch.Tensor, by: int, fill: float = 0) -> torch.Tensor:  # [B, A, ...] -> [B, A, ...]
    """``x`` moved ``by`` places to the left along dim 1, ``fill`` at the end."""
    if by == 0:
        return x
    return torch.cat([x[:, by:], x.new_full((x.shape[0], by, *x.shape[2:]), fill)], dim=1)


__all__ = ["Eagle3TTT", "shifted", "ttt_anchors", "ttt_visibility", "unrolled_states"]
