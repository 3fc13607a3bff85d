"""Medusa's typical acceptance (Cai et al. 2024, sec. 2.3.1; the reference's ``evaluate_posterior``): a verification
rule that commits the longest draft path whose tokens the target finds plausible enough. LOSSY under sampling (every
report that uses it says so); under greedy decoding it commits exactly the greedy tokens. Used by the Medusa
proposer with ``--acceptance typical``; the lossless rules live in :mod:`draftsmith.inference.core.verify`."""

from __future__ import annotations

import math

import torch

from draftsmith.inference.core.verify import Draft, Verdict, chain_path, empty_verdict, verdict_on_host


def typical_threshold(
    probs: torch.Tensor,  # [R, V] target distributions, one per verification row
    epsilon: float,
    delta: float,
) -> torch.Tensor:  # [R]
    """Medusa's typical-acceptance threshold of each row (Cai et al. 2024, sec. 2.3.1)::

        threshold(p) = min(epsilon, delta * exp(-H(p))),   H(p) = -sum_v p(v) log p(v)

    a hard floor ``epsilon`` lowered where the target is unsure (high entropy)."""
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)  # [R]
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


def longest_candidate(
    passed: torch.Tensor,  # [n] bool: each node passes its own test
    log_p: torch.Tensor,  # [n] float: log of the target probability of each node's token at its parent
    ancestors: torch.Tensor,  # [n, n] bool ancestor-or-self
    depths: torch.Tensor,  # [n] long
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # length [], next row [], on path [n] bool
    """Medusa's choice among the candidates (the tree's root-to-leaf paths): each candidate's accepted prefix is its
    leading run of passing nodes; the longest prefix wins, and among equally long ones the most likely (the largest
    sum of ``log_p`` along it; the first in node order on an exact tie). Every node whose ancestors (and itself) all
    pass ends such a prefix, so this is the deepest of those nodes, ties broken by path likelihood. ``row`` is the
    verification row after the prefix (0 when nothing is accepted)."""
    on = ~(ancestors & ~passed[None, :]).any(-1)  # [n]
    length = torch.where(on, depths, 0).max()  # []
    path_log_p = ancestors.to(log_p.dtype) @ log_p  # [n] sum of log p from the root to each node
    score = torch.where(on & (depths == length), path_log_p, float("-inf"))  # [n]
    leaf = score.argmax()  # [] the first maximum
    on_path = on & ancestors.index_select(0, leaf[None])[0] & (length > 0)  # [n]
    row = torch.where(length > 0, leaf + 1, 0)  # []
    return length, row, on_path


def typical_verifier(epsilon: float = 0.09, delta: float | None = None):
    """Medusa's *typical acceptance* (Cai et al. 2024, sec. 2.3.1; the reference's ``evaluate_posterior`` with
    ``sampling='typical', fast=True``) as a verification rule. LOSSY under sampling: the output no longer follows
    the target's distribution (the distribution check shows it); under greedy decoding the target's probabilities
    are one-hot and it commits exactly the greedy tokens.

    - a node ``x`` under a row with target distribution ``p`` passes when ``p(x) > min(epsilon, delta *
      exp(-H(p)))`` (:func:`typical_threshold`); ``delta`` unset is ``sqrt(epsilon)``, the reference's
      recommendation (0.3 at epsilon 0.09);
    - of the tree's candidates (root-to-leaf paths) the longest accepted prefix is committed, ties broken by its
      likelihood under ``p`` (:func:`longest_candidate`);
    - the token after it is the target's argmax at its last row: the reference draws no token; it takes the next
      step's first token greedily and accepts it unconditionally.

    ``p`` is the target's distribution as the loop processes it (temperature, then top-k/top-p when set): with
    top-k and top-p off it is the reference's ``softmax(logits / temperature)``."""
    delta = math.sqrt(epsilon) if delta is None and epsilon > 0 else delta
    if not (0.0 < epsilon < 1.0 and delta is not None and delta > 0.0):
        raise ValueError(f"typical acceptance needs 0 < epsilon < 1 and delta > 0, got {epsilon} and {delta}")

    def verify_typical(target_probs: torch.Tensor, draft: Draft, generator: torch.Generator | None = None) -> Verdict:
        probs = target_probs.float()  # [1 + n, V]
        device = probs.device
        if len(draft) == 0:
            return empty_verdict(probs[0].argmax())
        tokens = draft.tokens.to(device)  # [n]
        tree = draft.on(device)
        rows = tree.parents + 1  # [n] each node's verification row
        p = probs[rows, tokens]  # [n]
        passed = p > typical_threshold(probs, epsilon, delta)[rows]  # [n]
        if draft.is_chain:  # one candidate: its leading run of passing nodes
            length = chain_path(passed)
            return verdict_on_host(length, probs.index_select(0, length[None]).argmax(-1), tokens)
        length, row, on_path = longest_candidate(passed, p.clamp_min(1e-30).log(), tree.ancestors, tree.depths)
        return verdict_on_host(length, probs.index_select(0, row[None]).argmax(-1), tokens, on_path)

    verify_typical.__name__ = f"typical_acceptance(epsilon={epsilon:g}, delta={delta:g})"
    return verify_typical


__all__ = ["longest_candidate", "typical_threshold", "typical_verifier"]
