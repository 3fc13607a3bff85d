"""The trainers' losses, each a pure function with its paper's equation beside it.

The four DistillSpec divergences (forward KL, reverse KL, JSD(beta), TVD) are defined once, in
:mod:`draftsmith.kernels.divergences` (the fused kernels' reference math), and used here.
"""

from __future__ import annotations

import torch

from draftsmith.data.chat import IGNORE_INDEX
from draftsmith.kernels.divergences import (
    DIVERGENCES,
    check_divergence_args,
    divergence,
    divergence_per_token,
    forward_kl,
    generalized_jsd,
    reverse_kl,
    total_variation,
)

__all__ = ["DIVERGENCES", "acceptance_from_tvd", "check_divergence_args", "divergence", "divergence_per_token",
           "forward_kl", "generalized_jsd", "reverse_kl", "sequence_kd_nll", "token_sum", "total_variation"]

def acceptance_from_tvd(tvd: torch.Tensor | float) -> torch.Tensor | float:
    """Expected speculative-sampling acceptance rate ``alpha = 1 - TVD(p, q) = sum_v min(p_v, q_v)``
    (Leviathan et al. 2023, Sec. 3; DistillSpec, Zhou et al. 2023)."""
    return 1 - tvd


def token_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # [...], [...] bool -> scalar
    """Sum of ``per_token`` over the positions ``mask`` keeps (non-finite values at masked positions ignored)."""
    return torch.where(mask, per_token, torch.zeros_like(per_token)).sum()


def sequence_kd_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:  # [N, K], [N] -> scalar
    """Sequence-level KD (Kim & Rush 2016: the sequence-level objective with the teacher's distribution over
    sequences approximated by its mode, here its greedy answer; GKD's "SeqKD" baseline):
    ``L = - sum_t log q(y_t | y_<t, x)`` along answers ``y`` the target wrote itself, summed over the ``N`` answer
    positions. Labels of -100 (a token the draft's vocabulary cannot propose) are left out."""
    return torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
