"""The measured cost model of speculative decoding on one target and machine.

A decoding step costs one verification forward over ``1 + k`` tokens (the pending token and ``k`` draft nodes),
``k`` draft tokens and some bookkeeping. On a GPU the forward is memory-bound and nearly flat in ``k``; on a
CPU, or for a tiny target, it is not (verifying 5 tokens took 1.6x one on the tiny zoo). So the verification
cost is a *measured curve* ``V(n)``, not a constant, and the expected speedup over plain decoding of steps that
draft ``k_s`` tokens with per-depth acceptance ``a_1, a_2, ...`` (``a_d`` = P(depth d accepted | depth d - 1
accepted and depth d proposed)) is::

    E[tau | k]  = 1 + sum_{d=1..k} prod_{j=1..d} a_j                       (Leviathan et al. 2023, eq. 1,
                                                                             with depth-dependent acceptance)
    speedup     = mean_s E[tau | k_s] / mean_s (V(1 + k_s) + k_s D + O) * (V(1) + O)

with ``D`` the cost of one draft token and ``O`` the per-step overhead outside the forwards. For a constant
acceptance and a constant ``V`` this is Theorem 3.8 of Leviathan et al.

The measured ``V`` need not be monotone: a CPU's matrix kernels can run 4 rows faster than 3. The evaluator pads a
verification to a cheaper larger size where the measurement says so (:func:`padding_plan`) and prices each step at
the size the loop actually runs (:func:`padded_curve`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

DEFAULT_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
PADDING_SIZES = tuple(range(1, 17))  # every size a draft of up to 15 tokens verifies, so each can be padded


@dataclass
class CostModel:
    """Seconds of a verification forward by tokens verified, of one draft token, and of a step's overhead."""

    verify_seconds: dict[int, float]  # tokens in one target forward -> seconds (measured)
    draft_seconds: float = 0.0  # one drafted token
    overhead_seconds: float = 0.0  # per step, outside the target and draft forwards
    prefix_tokens: int = 0  # the KV-cache length the curve was measured at
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.verify_seconds = {int(n): float(s) for n, s in sorted(self.verify_seconds.items())}
        if not self.verify_seconds or 1 not in self.verify_seconds:
            raise ValueError("the verification curve needs at least the 1-token cost")

    def verify(self, n: float) -> float:
        """V(n), linearly interpolated between measured sizes; past the largest, the last measured cost plus the
        least-squares slope of the whole curve (never negative: a noisy fall between the last two sizes must not
        make bigger forwards look free, or cost less than nothing)."""
        xs = list(self.verify_seconds)
        ys = list(self.verify_seconds.values())
        if n <= xs[0] or len(xs) == 1:  # one point: no slope to extrapolate with
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return ys[-1] + fitted_slope(xs, ys) * (n - xs[-1])

    def relative_verify(self, n: float) -> float:
        """V(n) / V(1): how much one forward over ``n`` tokens costs against a plain decoding step."""
        return self.verify(n) / self.verify(1)

    def step_seconds(self, k: int, extra: float = 0) -> float:
        """A speculative step that drafts ``k`` tokens (k = 0: a plain decoding step) and puts ``extra`` inputs of its
        own into the verification forward (BiTA's mask tokens)."""
        return self.verify(1 + k + extra) + k * self.draft_seconds + self.overhead_seconds

    def to_dict(self) -> dict:
        return asdict(self) | {"verify_seconds": {str(k): v for k, v in self.verify_seconds.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        return cls(**(dict(d) | {"verify_seconds": {int(k): v for k, v in d["verify_seconds"].items()}}))


def fitted_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs``, clamped at 0 (seconds per extra verified token)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var) if var > 0 else 0.0


def expected_accepted(acceptance_by_depth: Sequence[float | None], k: int) -> float:
    """E[tokens committed | k drafted] = 1 + sum_{d<=k} prod_{j<=d} a_j (missing depths count as 0)."""
    total, survive = 1.0, 1.0
    for d in range(k):
        a = acceptance_by_depth[d] if d < len(acceptance_by_depth) else None
        survive *= float(a) if a is not None else 0.0
        total += survive
    return total


def predicted_step(cost: CostModel, draft_lengths: Sequence[int], acceptance_by_depth: Sequence[float | None],
                   extra_rows: Sequence[int] | None = None) -> tuple[float, float]:
    """(predicted tau, predicted seconds per step) of steps drafting ``draft_lengths`` tokens each (see the module
    docstring); ``extra_rows`` (per step, in any order, as many as the steps) adds the inputs a proposer puts into
    the verification forward besides its draft (BiTA's mask tokens) to those forwards' size."""
    if not draft_lengths:
        return 1.0, cost.step_seconds(0)
    taus = [expected_accepted(acceptance_by_depth, k) for k in draft_lengths]
    mean_extra = sum(extra_rows) / len(extra_rows) if extra_rows else 0.0  # each forward widened by the mean extras
    seconds = [cost.step_seconds(k, mean_extra) for k in draft_lengths]
    return sum(taus) / len(taus), sum(seconds) / len(seconds)


def predicted_speedup(cost: CostModel, draft_lengths: Sequence[int],
                      acceptance_by_depth: Sequence[float | None],
                      extra_rows: Sequence[int] | None = None) -> tuple[float, float]:
    """(predicted tau, predicted speedup over plain decoding per step, prefill aside) of :func:`predicted_step`."""
    if not draft_lengths:
        return 1.0, 1.0
    tau, seconds = predicted_step(cost, draft_lengths, acceptance_by_depth, extra_rows)
    return tau, tau / seconds * cost.step_seconds(0)


def predicted_wall(prefill_seconds: float, new_tokens: int, tau: float, step_seconds: float) -> float:
    """Seconds to write ``new_tokens`` at ``tau`` tokens per step of ``step_seconds``, after ``prefill_seconds`` of
    prompt processing: the fixed cost a shorter run of steps pays as much of as a longer one."""
    return prefill_seconds + new_tokens / tau * step_seconds


def _seconds(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def monotone(curve: dict[int, float]) -> dict[int, float]:
    """The curve made non-decreasing in the number of tokens: a forward over more tokens never costs less, and
    timing noise only ever adds time, so a size slower than a larger one is lowered to it."""
    out, best = {}, float("inf")
    for n in sorted(curve, reverse=True):
        best = min(best, curve[n])
        out[n] = best
    return dict(sorted(out.items()))


def padding_plan(samples: dict[int, list[float]], margin: float = 0.05, wins: float = 0.75) -> dict[int, int]:
    """``{n: m}``: verification forwards over ``n`` tokens (n >= 2) that are cheaper padded to ``m > n`` rows.

    ``samples[n]``: seconds of a forward over ``n`` rows, one per round of :func:`measure_verify_samples` (round
    ``r`` of every size measured back to back). A size ``m`` qualifies when it beat ``n`` in at least ``wins`` of
    the rounds (a paired comparison, so load that comes and goes hits both alike) and its median is more than
    ``margin`` below ``n``'s; the qualifying size with the lowest median is chosen. Only measured sizes are
    candidates.

    A CPU's matrix kernels are not monotone in the number of rows: on the 2-core development machine one SmolLM2
    forward over 3 tokens took longer than over 4 (MKL's small-M GEMM), so a step that verifies 2 draft tokens
    is faster with a dummy row appended."""
    sizes = sorted(samples)
    med = {n: statistics.median(samples[n]) for n in sizes}
    plan = {}
    for i, n in enumerate(sizes):
        if n < 2:
            continue
        good = [m for m in sizes[i + 1:] if med[m] < (1 - margin) * med[n]
                and sum(a < b for a, b in zip(samples[m], samples[n])) >= wins * len(samples[n])]
        if good:
            plan[n] = min(good, key=lambda m: (med[m], m))
    return plan


def padded_curve(times: dict[int, float], plan: dict[int, int]) -> dict[int, float]:
    """What verifying ``n`` tokens costs when the loop pads by ``plan``: ``times[plan.get(n, n)]``."""
    return {n: times[plan.get(n, n)] for n in sorted(times)}


def anchored(curve: dict[int, float], step: float) -> dict[int, float]:
    """``curve`` (forwards only) moved so that one token costs ``step``, a plain decoding step as the decode loop
    measured it (forward plus bookkeeping); each larger size adds its forward's measured extra over one token."""
    return {n: step + (s - curve[1]) for n, s in curve.items()}


def loop_curve(samples: dict[int, list[float]], verify_padding: bool = True) -> tuple[dict[int, int], dict[int, float]]:
    """(padding plan, verification curve) of :func:`measure_verify_samples`' ``samples`` as the decode loop will pay
    them: each size's :func:`typical` cost, priced at the size the loop pads it to (none when ``verify_padding`` is off).
    The evaluator and ``draftsmith tune`` both price steps with it."""
    plan = padding_plan(samples) if verify_padding else {}
    return plan, padded_curve(typical(samples), plan)


def extension_sizes(measured: int, largest: int, count: int = 4) -> tuple[int, ...]:
    """Up to ``count`` sizes past ``measured`` (the largest size a curve holds), evenly spaced and ending at
    ``largest`` (the largest forward a run verified): where a curve must be extended so that no step is priced by
    extrapolation. Empty when ``largest <= measured``."""
    if largest <= measured:
        return ()
    span = largest - measured
    n = min(count, span)
    return tuple(measured + round(span * (i + 1) / n) for i in range(n))


def extend_curve(curve: dict[int, float], samples: dict[int, list[float]]) -> dict[int, float]:
    """``curve`` with the sizes of ``samples`` past its largest, measured later (:func:`measure_verify_samples`, the
    1-token size included): each priced at ``curve[1]`` plus its :func:`typical` extra over one token in ``samples``'
    own rounds, so load that differs between the two measurements does not shift the new sizes against the old."""
    extra = typical(samples)
    top = max(curve)
    return dict(sorted({**curve, **{n: curve[1] + s - extra[1] for n, s in extra.items() if n > top}}.items()))


@torch.inference_mode()
def measure_verify_curve(target, prefix_tokens: int = 128, sizes: Sequence[int] = DEFAULT_SIZES,
                         repeats: int = 9, warmup: int = 2, seed: int = 0) -> dict[int, float]:
    """:func:`measure_verify_times` made non-decreasing (a larger forward padded down to the cheapest size at or
    above it, which is what :func:`padding_plan` lets the decode loop do)."""
    return monotone(measure_verify_times(target, prefix_tokens, sizes, repeats, warmup, seed))


def measure_verify_times(target, prefix_tokens: int = 128, sizes: Sequence[int] = DEFAULT_SIZES,
                         repeats: int = 9, warmup: int = 2, seed: int = 0) -> dict[int, float]:
    """The fastest of each size's :func:`measure_verify_samples`: timing noise only ever adds time, and a burst
    of load from other processes hits every size alike (round-robin). Not made monotone: see
    :func:`padding_plan`."""
    return fastest(measure_verify_samples(target, prefix_tokens, sizes, repeats, warmup, seed))


def fastest(samples: dict[int, list[float]]) -> dict[int, float]:
    """Each size's fastest round (timing noise only ever adds time)."""
    return {n: min(v) for n, v in samples.items()}


def typical(samples: dict[int, list[float]]) -> dict[int, float]:
    """Each size's cost as a run pays it: the fastest one-token round plus the size's *typical* extra over one token,
    the median over rounds of ``samples[n][r] - samples[1][r]`` (both sides of a round back to back, so load that
    comes and goes hits them alike). The costs are anchored to a plain step the run measures, a typical step, so
    the extras must be typical too: under load each size's fastest round is a lucky one, and the differences of
    lucky rounds understated the extra by up to half on a busy 2-core machine (measured ÷ predicted 0.87)."""
    base = min(samples[1])
    return {n: base if n == 1 else base + max(0.0, statistics.median(a - b for a, b in zip(v, samples[1])))
            for n, v in samples.items()}


@torch.inference_mode()
def measure_verify_samples(target, prefix_tokens: int = 128, sizes: Sequence[int] = DEFAULT_SIZES,
                           repeats: int = 9, warmup: int = 2, seed: int = 0) -> dict[int, list[float]]:
    """Seconds of one target forward over ``n`` new tokens after a cached prefix of ``prefix_tokens``, for every
    ``n`` in ``sizes`` (``target``: a :class:`~draftsmith.inference.core.adapter.ModelAdapter`), one per round: the
    sizes are timed round-robin, ``repeats`` rounds after ``warmup``. Each measurement crops the cache back, so
    every size sees the same prefix."""
    sizes = sorted(set(int(s) for s in sizes) | {1})
    limit = target.max_positions
    prefix_tokens = max(1, min(prefix_tokens, limit - max(sizes) - 1))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (1, prefix_tokens + max(sizes)), generator=g).to(target.device)
    cache = target.new_cache(capacity=prefix_tokens + max(sizes) + 8)
    target.forward(ids[:, :prefix_tokens], cache, compute_logits=False)

    def step(n: int) -> None:
        target.forward(ids[:, prefix_tokens: prefix_tokens + n], cache)
        cache.crop(prefix_tokens)

    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(warmup + repeats):
        for n in sizes:
            seconds = _seconds(lambda n=n: step(n), target.device)
            if r >= warmup:
                samples[n].append(seconds)
    return samples
