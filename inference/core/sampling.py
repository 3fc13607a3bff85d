"""Turning logits into the distribution a token is drawn from, identically for draft and target.

Speculative sampling is lossless for the *processed* target distribution only if the draft's
proposals are judged against the target processed the same way, so every proposer and the verifier
go through :func:`process_logits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.common.precision import first_argmax


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filtering
    top_p: float = 1.0  # 1.0 = no nucleus filtering

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def process_logits(
    logits: torch.Tensor,  # [..., V]
    params: SamplingParams,
) -> torch.Tensor:  # [..., V] float32 probabilities (one-hot argmax when greedy)
    """Temperature, then top-k, then top-p (smallest set whose mass reaches ``top_p``; the token
    that crosses the threshold is kept), then softmax."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(first_argmax(logits), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly better tokens
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(
    probs: torch.Tensor,  # [V]
    generator: torch.Generator | None = None,
) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def uniform(
    shape: tuple[int, ...],
    generator: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:  # shape, float32 in [0, 1), on ``device``
    """Uniforms drawn on the generator's own device (a CPU generator may drive a CUDA decode) and
    moved to ``device`` without a host synchronisation."""
    where = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=where).to(device, non_blocking=True)


def draw(
    probs: torch.Tensor,  # [V], non-negative, sums to > 0
    generator: torch.Generator | None = None,
) -> torch.Tensor:  # [] long on probs.device
    """One token from ``probs`` by inversion of the CDF, on the device, without a host sync."""
    cdf = probs.float().cumsum(-1)  # [V]
    x = uniform((1,), generator, probs.device) * cdf[-1]  # [1]
    idx = torch.searchsorted(cdf, x, right=True)[0]  # first token whose CDF exceeds x
    # x < cdf[-1] in exact arithmetic; a float32 rounding up to it must not pick a zero-probability tail token
    top = torch.where(probs > 0, torch.arange(probs.shape[-1], device=probs.device), 0).max()  # [] last possible token
    return torch.minimum(idx, top)


def residual(
    p: torch.Tensor,  # [..., V] target distribution (possibly already a residual)
    q: torch.Tensor,  # [..., V] draft distribution of the rejected proposal
) -> torch.Tensor:  # [..., V]
    """norm(max(0, p - q)): the distribution to resample from after a rejection (Leviathan et al.
    2023, Algorithm 1; Chen et al. 2023, eq. 3), row-wise and without a host sync. Where ``p <= q``
    everywhere (only possible when p == q, where rejection has probability 0) ``p`` is returned
    unchanged."""
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)
