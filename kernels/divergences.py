"""Token-level divergences between a draft (student) and its target (teacher), as pure functions.

They live with the kernels because they are the kernels' reference math; the trainers use them through
:mod:`draftsmith.trainers.losses`.

Notation (DistillSpec, Zhou et al. 2023, arXiv:2310.08461, which compares these four divergences):
``p`` is the target's (teacher's) next-token distribution, ``q`` the draft's (student's), both
``softmax(logits / temperature)`` over the vocabulary ``V``.

==============  ===========================================================  =============================
name            per-token value                                              reference
==============  ===========================================================  =============================
``forward_kl``  D_KL(p || q) = sum_v p_v (log p_v - log q_v)                 DistillSpec "FKL"; GKD
``reverse_kl``  D_KL(q || p) = sum_v q_v (log q_v - log p_v)                 DistillSpec "RKL"; GKD
``jsd``         JSD(beta) = beta KL(p || m) + (1 - beta) KL(q || m),         GKD (Agarwal et al. 2024,
                m = beta p + (1 - beta) q                                    arXiv:2306.13649), eq. 1
``tvd``         TVD(p, q) = 1/2 sum_v |p_v - q_v|                            DistillSpec; Leviathan et al.
``nla``         -log alpha, alpha = sum_v min(p_v, q_v) = 1 - TVD            LK losses (Samarin et al.
                                                                             2026, arXiv:2602.23881)
``lk_hybrid``   lambda KL(p || q) + (1 - lambda) TVD,                        LK losses, the hybrid
                lambda = exp(-eta sg[alpha]), eta = 3                        objective
==============  ===========================================================  =============================

The LK losses optimise the acceptance rate ``alpha`` itself: ``nla``'s gradient is TVD's scaled by ``1 / alpha``,
which keeps it from vanishing while the draft and the target barely overlap (and makes it the cross-entropy of
the target's token when the target is a point mass); ``lk_hybrid`` leans on the KL while ``alpha`` is small and
moves to TVD as it grows (the blend weight is not differentiated). ``eta`` is the paper's best hybrid setting
(:data:`LK_ETA`); ``alpha`` is floored at :data:`NLA_FLOOR` inside the log.

Generalised JSD convention. ``beta`` weights the *teacher* side, exactly as GKD eq. 1 and TRL's
``GKDTrainer.generalized_jsd_loss`` (which this module reproduces to float precision, endpoints
included): the mixture is ``m = beta * p_teacher + (1 - beta) * q_student`` and the first KL, from the
teacher to the mixture, carries weight ``beta``. ``beta = 0.5`` is the symmetric Jensen-Shannon
divergence (bounded by ``log 2``).

Limits of ``beta`` (proved by a first-order expansion of ``m`` and checked by the property tests):

- as ``beta -> 0``, ``m -> q`` and ``JSD(beta) = beta * D_KL(p || q) + O(beta^2) -> 0``;
  the *normalised* value ``JSD(beta) / beta -> D_KL(p || q)`` (forward KL);
- as ``beta -> 1``, ``m -> p`` and ``JSD(beta) = (1 - beta) * D_KL(q || p) + O((1 - beta)^2) -> 0``;
  ``JSD(beta) / (1 - beta) -> D_KL(q || p)`` (reverse KL).

So the formula itself vanishes at both ends. Like TRL (and GKD's description of ``beta`` as the knob
from forward to reverse KL), ``beta == 0`` exactly returns the forward KL and ``beta == 1`` exactly
returns the reverse KL: the loss is *discontinuous* at the endpoints, and near them ``beta`` mostly
scales the loss (an effective learning-rate factor), not only its direction. Use ``forward_kl`` or
``reverse_kl`` directly when that is what you mean.

Temperature divides both models' logits; no ``temperature**2`` factor is applied (as in TRL's GKD).

Acceptance. For speculative sampling the probability that a draft token is accepted at one position
is ``sum_v min(p_v, q_v) = 1 - TVD(p, q)`` (Leviathan et al. 2023, arXiv:2211.17192, Sec. 3; DistillSpec),
and with a constant acceptance rate ``alpha`` and ``k`` drafted tokens one target forward commits
``(1 - alpha**(k + 1)) / (1 - alpha)`` tokens on average (Leviathan et al. 2023, eq. 1).

Numerics: everything is computed from ``log_softmax`` in float32 (float64 inputs stay float64); ``-inf`` logits (masked vocabulary
entries) are zero-probability events and contribute exactly zero (``0 * log 0 = 0``) to values and
gradients. A token whose divergence is genuinely infinite (the teacher puts mass where the student
has ``-inf`` for the forward KL, or the converse for the reverse KL) gives ``inf``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

DivergenceFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def _xlogy_ratio(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """``a * (log a - log b)`` elementwise with ``0 * (...) = 0`` where ``a == 0``, NaN-free gradients.

    ``log_a``/``log_b`` are log-probabilities; entries with ``log_a == -inf`` contribute 0, and are
    replaced *before* the arithmetic so that no ``0 * inf`` appears in the backward pass either.
    """
    support = log_a > -math.inf
    safe_a = torch.where(support, log_a, torch.zeros_like(log_a))
    safe_b = torch.where(support, log_b, torch.zeros_like(log_b))
    return torch.where(support, safe_a.exp() * (safe_a - safe_b), torch.zeros_like(log_a))


def forward_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Forward KL ``D_KL(p || q) = sum_v p_v log(p_v / q_v)``, teacher ``p``, student ``q`` (mode covering).

    DistillSpec (Zhou et al. 2023) "FKL"; GKD (Agarwal et al. 2024) "forward KL". ``beta`` is
    ignored (uniform signature). Inputs are log-probabilities ``[..., V]``; returns ``[...]``.
    """
    return _xlogy_ratio(teacher_logprobs, student_logprobs).sum(-1)


def reverse_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Reverse KL ``D_KL(q || p) = sum_v q_v log(q_v / p_v)``, teacher ``p``, student ``q`` (mode seeking).

    DistillSpec (Zhou et al. 2023) "RKL"; GKD (Agarwal et al. 2024) "reverse KL". ``beta`` is
    ignored. Inputs are log-probabilities ``[..., V]``; returns ``[...]``.
    """
    return _xlogy_ratio(student_logprobs, teacher_logprobs).sum(-1)


def generalized_jsd(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Generalised Jensen-Shannon divergence (GKD, Agarwal et al. 2024, eq. 1; DistillSpec "JSD[beta]").

    ``JSD(beta) = beta * KL(p || m) + (1 - beta) * KL(q || m)`` with ``m = beta * p + (1 - beta) * q``,
    teacher ``p``, student ``q`` — TRL's ``generalized_jsd_loss`` convention. ``beta == 0`` returns the
    forward KL and ``beta == 1`` the reverse KL (the interior formula tends to 0 at both ends; see the
    module docstring). Inputs are log-probabilities ``[..., V]``; returns ``[...]``.
    """
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"jsd beta must lie in [0, 1], got {beta}")
    if beta == 0.0:
        return forward_kl(student_logprobs, teacher_logprobs)
    if beta == 1.0:
        return reverse_kl(student_logprobs, teacher_logprobs)
    # Where p = q = 0 both KL terms are zeroed by _xlogy_ratio; give logaddexp finite inputs there so its
    # backward never computes exp(-inf - (-inf)) = NaN.
    void = (teacher_logprobs == -math.inf) & (student_logprobs == -math.inf)  # [..., V]
    t_safe = torch.where(void, torch.zeros_like(teacher_logprobs), teacher_logprobs)
    s_safe = torch.where(void, torch.zeros_like(student_logprobs), student_logprobs)
    log_m = torch.logaddexp(t_safe + math.log(beta), s_safe + math.log1p(-beta))  # [..., V]
    return beta * _xlogy_ratio(teacher_logprobs, log_m).sum(-1) + (1.0 - beta) * _xlogy_ratio(
        student_logprobs, log_m
    ).sum(-1)


def total_variation(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Total variation distance ``TVD(p, q) = 1/2 sum_v |p_v - q_v|``, in ``[0, 1]``.

    DistillSpec (Zhou et al. 2023): the expected acceptance rate of speculative sampling is
    ``1 - TVD`` (Leviathan et al. 2023, Sec. 3), so minimising TVD maximises acceptance.
    ``beta`` is ignored. Inputs are log-probabilities ``[..., V]``; returns ``[...]``.
    """
    return 0.5 * (student_logprobs.exp() - teacher_logprobs.exp()).abs().sum(-1)


LK_ETA = 3.0  # lk_hybrid's blend temperature (the LK paper's best hybrid setting)
NLA_FLOOR = 1e-5  # nla: alpha floored inside the log


def acceptance(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...]
    """``alpha = sum_v min(p_v, q_v) = 1 - TVD(p, q)``: the probability that speculative sampling accepts a draft
    token drawn from ``q`` (Leviathan et al. 2023, sec. 3)."""
    return torch.minimum(student_logprobs.exp(), teacher_logprobs.exp()).sum(-1)


def neg_log_acceptance(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                       beta: float = 0.5) -> torch.Tensor:
    """LK's ``nla`` loss ``-log alpha`` (Samarin et al. 2026, arXiv:2602.23881): ``d/dq = (1 / alpha) d TVD / dq``.
    ``beta`` is ignored. Inputs are log-probabilities ``[..., V]``; returns ``[...]``."""
    return -acceptance(student_logprobs, teacher_logprobs).clamp_min(NLA_FLOOR).log()


def lk_hybrid(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """LK's hybrid loss ``lambda KL(p || q) + (1 - lambda) TVD(p, q)``, ``lambda = exp(-eta sg[alpha])`` (Samarin et
    al. 2026, the hybrid objective; ``eta`` :data:`LK_ETA`). ``beta`` is ignored. Inputs are log-probabilities
    ``[..., V]``; returns ``[...]``."""
    alpha = acceptance(student_logprobs, teacher_logprobs)
    weight = torch.exp(-LK_ETA * alpha.detach())
    return weight * forward_kl(student_logprobs, teacher_logprobs) + (1.0 - weight) * (1.0 - alpha)


DIVERGENCES: dict[str, DivergenceFn] = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "jsd": generalized_jsd,
    "tvd": total_variation,
    "nla": neg_log_acceptance,
    "lk_hybrid": lk_hybrid,
}


def check_divergence_args(kind: str, beta: float, temperature: float) -> None:
    """Raise ``ValueError`` naming the bad argument (shared with the fused kernels)."""
    if kind not in DIVERGENCES:
        raise ValueError(f"unknown divergence {kind!r}; choose one of {sorted(DIVERGENCES)}")
    if not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"jsd beta must lie in [0, 1], got {beta}")
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def divergence_per_token(
    student_logits: torch.Tensor,  # [..., V]
    teacher_logits: torch.Tensor,  # [..., V]
    kind: str = "forward_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
) -> torch.Tensor:  # [...] float32 (float64 for float64 inputs)
    """Divergence ``kind`` between ``softmax(teacher/T)`` and ``softmax(student/T)`` for every token.

    Computed in float32 for half-precision inputs (float64 stays float64). The teacher side is
    detached (it is frozen).
    """
    check_divergence_args(kind, beta, temperature)
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} must have the same shape"
        )
    dtype = torch.promote_types(torch.promote_types(student_logits.dtype, teacher_logits.dtype), torch.float32)
    s_logp = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)  # [..., V]
    t_logp = torch.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)  # [..., V]
    return DIVERGENCES[kind](s_logp, t_logp, beta)


def divergence(
    student_logits: torch.Tensor,  # [N, V] (or [..., V])
    teacher_logits: torch.Tensor,  # [N, V]
    kind: str = "forward_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,  # [N] bool, True = token counts
    reduction: str = "mean",
) -> torch.Tensor:  # scalar float32
    """Mean (or sum) over unmasked tokens of :func:`divergence_per_token`.

    Masked tokens contribute nothing to the value or the gradients, even when their logits are not
    finite (they are replaced by zeros before the softmax). With no unmasked token the mean is 0.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if mask is not None:
        mask = mask.to(device=student_logits.device, dtype=torch.bool)
        if mask.shape != student_logits.shape[:-1]:
            raise ValueError(f"mask {tuple(mask.shape)} must match the token dims {tuple(student_logits.shape[:-1])}")
        keep = mask.unsqueeze(-1)  # [..., 1]
        student_logits = torch.where(keep, student_logits, torch.zeros((), dtype=student_logits.dtype))
        teacher_logits = torch.where(keep, teacher_logits, torch.zeros((), dtype=teacher_logits.dtype))
    per_token = divergence_per_token(student_logits, teacher_logits, kind, beta, temperature)  # [...]
    if mask is None:
        total, count = per_token.sum(), per_token.numel()
    else:
        total = torch.where(mask, per_token, torch.zeros_like(per_token)).sum()
        count = int(mask.sum())
    if reduction == "sum":
        return total
    return total / max(count, 1)
