"""How many tokens to draft next: fixed, the grow/shrink heuristic, or the length that maximises
the expected speedup of Leviathan et al. (2023).

Expected tokens per target forward with per-token acceptance alpha and draft length k
(Leviathan et al. 2023, eq. 1):           E[tau] = (1 - alpha^(k+1)) / (1 - alpha)
Expected walltime improvement with draft/target cost ratio c (ibid., Theorem 3.8):
                                          S(k) = (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from draftsmith.common.errors import ConfigError


def expected_tau(alpha: float | torch.Tensor, k: int) -> float | torch.Tensor:
    """Expected tokens committed per target forward with ``k`` drafted tokens and acceptance ``alpha``.

    ``tau = (1 - alpha**(k + 1)) / (1 - alpha)`` (Leviathan et al. 2023, eq. 1), bonus token included;
    its limit at ``alpha = 1`` is ``k + 1``; ``k = 0`` (no drafting) gives 1. Written as the geometric
    sum ``sum_{i=0..k} alpha**i``, which is exact at and near ``alpha = 1``.
    """
    if k < 0:
        raise ValueError(f"draft length k must be >= 0, got {k}")
    if isinstance(alpha, torch.Tensor):
        powers = alpha.unsqueeze(-1) ** torch.arange(k + 1, dtype=alpha.dtype, device=alpha.device)
        return powers.sum(-1)
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance rate alpha must lie in [0, 1], got {alpha}")
    return float(sum(alpha**i for i in range(k + 1)))


def expected_speedup(alpha: float, k: int, cost_ratio: float,
                     relative_verify: Callable[[int], float] | None = None) -> float:
    """Leviathan et al. (2023) Theorem 3.8: expected speedup over autoregressive decoding, with the verification
    of ``1 + k`` tokens costing ``relative_verify(1 + k)`` plain steps (the measured cost model's
    :meth:`~draftsmith.inference.evaluation.cost.CostModel.relative_verify`; default 1, Leviathan's constant cost)."""
    verify = relative_verify(1 + k) if relative_verify is not None else 1.0
    return expected_tau(alpha, k) / (k * cost_ratio + verify)


def best_draft_length(alpha: float, cost_ratio: float, max_length: int,
                      relative_verify: Callable[[int], float] | None = None) -> int:
    """The k in 0..max_length with the highest expected speedup (0 = do not draft)."""
    return max(range(max_length + 1), key=lambda k: expected_speedup(alpha, k, cost_ratio, relative_verify))


@dataclass
class DraftLengthPolicy:
    """``mode``: "fixed" (always ``length``), "heuristic" (+2 after a fully accepted draft, -1
    otherwise, as transformers' assisted generation does), or "leviathan" (maximise expected
    speedup from running estimates of alpha and of the draft/target cost ratio)."""

    length: int = 4
    mode: str = "fixed"
    min_length: int = 1
    max_length: int = 16
    ema: float = 0.9  # smoothing of the running estimates
    alpha: float = 0.6  # running acceptance-rate estimate (prior)
    cost_ratio: float = 0.2  # running draft-token/target-forward time estimate (prior)
    # the target's verification cost of n tokens in plain steps (a measured cost model's relative_verify);
    # None = Leviathan's constant cost
    relative_verify: Callable[[int], float] | None = None
    _current: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in ("fixed", "heuristic", "leviathan"):
            raise ConfigError(f"draft length mode must be fixed, heuristic or leviathan, got {self.mode!r}")
        if not 1 <= self.min_length <= self.length <= self.max_length:
            raise ConfigError(
                f"need 1 <= min_length <= length <= max_length, got {self.min_length}, {self.length}, {self.max_length}"
            )
        self._current = float(self.length)

    def reset(self) -> None:
        self._current = float(self.length)

    def next_length(self) -> int:
        if self.mode == "leviathan":
            return max(self.min_length, best_draft_length(self.alpha, self.cost_ratio, self.max_length,
                                                          self.relative_verify))
        return int(self._current)

    def observe(self, num_proposed: int, num_accepted: int, draft_seconds: float, target_seconds: float) -> None:
        if num_proposed <= 0:
            return
        if self.mode == "heuristic":
            step = 2.0 if num_accepted == num_proposed else -1.0
            self._current = min(self.max_length, max(self.min_length, self._current + step))
        # Per-token acceptance: the accepted run is geometric, so each step is num_accepted
        # successes out of num_accepted (+1 if the run ended on a rejection) trials.
        trials = num_accepted + (1 if num_accepted < num_proposed else 0)
        self.alpha = self.ema * self.alpha + (1 - self.ema) * (num_accepted / trials)
        if target_seconds > 0:
            ratio = (draft_seconds / num_proposed) / target_seconds
            self.cost_ratio = self.ema * self.cost_ratio + (1 - self.ema) * ratio
