"""The trainers' losses, each a pure function with its paper's equation beside it.

The four DistillSpec divergences (forward KL, reverse KL, JSD(beta), TVD) are defined once, in
:mod:`draftsmith.kernels.divergences` (the fused kernels' reference math), and used here.
"""

from __future__ import annotations

import torch

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
           "forward_kl", "generalized_jsd", "reverse_kl", "token_sum", "total_variation"]

def acceptance_from_tvd(tvd: torch.Tensor | float) -> torch.Tensor | float:
    """Expected speculative-sampling acceptance rate ``alpha = 1 - TVD(p, q) = sum_v min(p_v, q_v)``
    (Leviathan et al. 2023, Sec. 3; DistillSpec, Zhou et al. 2023)."""
    return 1 - tvd


def token_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # [...], [...] bool -> scalar
    """Sum of ``per_token`` over the positions ``mask`` keeps (non-finite values at masked positions ignored)."""
    return torch.where(mask, per_token, torch.zeros_like(per_token)).sum()
