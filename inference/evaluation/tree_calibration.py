"""Calibrating a head drafter's tree: how often the candidate of each depth and rank is the target's token.

A tree is only as good as its node scores. EAGLE-2 ranks nodes by the head's cumulative draft probability, and
Medusa grows its static tree from per-head top-k accuracies multiplied along a path; both read the numbers as
"the chance this node is accepted". Neither is, as trained: a head trained against the target's soft distribution
(or with feature noise) is under-confident about the target's greedy token, and a Medusa head's accuracy measured on
its own ignores that its errors are strongly correlated with the heads before it (given that the first ``d - 1``
heads were right, the ``d``-th is right far more often than on its own). Scores that are too low for deep nodes keep
broad, shallow trees that lose to their own chain.

The calibration measures what the decode loop sees. The drafter runs as a *chain* over held-out calibration prompts
(greedy): at every step, each drafted depth ``d`` whose prefix the target accepted has a known target token (the
accepted token or the correction at that depth). For those depths it records

- the rank of the target's token among the head's top-:data:`RANKS` candidates (or a miss): the *conditional rank
  accuracy* ``a[d][r] = P(target token = rank-r candidate | depths < d accepted)``, which Medusa's tree grows from;
- the negative log-likelihood of the target's token under ``softmax(logits / T)`` for a grid of temperatures
  :data:`TEMPERATURES`: the per-depth temperature ``T_d`` minimising it turns the head's distribution at depth ``d``
  into a calibrated estimate of acceptance (temperature scaling; Guo et al. 2017), which EAGLE-2's dynamic tree
  scores nodes with.

Proposers opt in with two members: ``last_draft_logits`` (``[k, Vd]``, the chain's logits per drafted depth, over the
vocabulary the head drafts from) and ``draft_index(tokens)`` (target token ids -> indices into that vocabulary, -1
for a token the head cannot draft).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.inference.evaluation.runs import StepRecorder

RANKS = 10  # candidate ranks whose conditional accuracy is measured
TEMPERATURES = tuple(round(0.1 * 1.1 ** i, 4) for i in range(40))  # 0.1 .. ~4.1, geometric (1.0 ~ i = 24)


def depth_targets(committed: Sequence[int], drafted: int) -> list[int]:
    """The target's token at each drafted depth whose prefix was accepted: ``committed`` (the accepted tokens, then
    the correction or bonus token) covers depths ``1 .. a + 1``; a chain of ``drafted`` tokens has depths
    ``1 .. drafted``. Returns ``committed[: min(len(committed), drafted)]``."""
    return list(committed[: min(len(committed), drafted)])


def temperature_nll(logits: torch.Tensor, targets: torch.Tensor,
                    temperatures: Sequence[float] = TEMPERATURES) -> torch.Tensor:
    """``[m, G]``: ``-log softmax(logits[i] / T_g)[targets[i]]`` for rows ``logits`` ``[m, V]`` and ``targets`` ``[m]``
    (indices into ``V``)."""
    logits = logits.double()
    t = torch.tensor(temperatures, dtype=torch.float64, device=logits.device)  # [G]
    picked = logits.gather(1, targets[:, None].to(logits.device))  # [m, 1]
    out = [torch.logsumexp(logits / tg, dim=-1) - picked[:, 0] / tg for tg in t]  # G x [m]
    return torch.stack(out, dim=1)


def top1_probability(logits: torch.Tensor, temperatures: Sequence[float] = TEMPERATURES) -> torch.Tensor:
    """``[m, G]``: the highest probability of ``softmax(logits / T_g)`` per row (``logits`` ``[m, V]``)."""
    logits = logits.double()
    top = logits.max(dim=-1).values  # [m]
    return torch.stack([torch.exp(top / tg - torch.logsumexp(logits / tg, dim=-1)) for tg in temperatures], dim=1)


def target_ranks(logits: torch.Tensor, targets: torch.Tensor, ranks: int = RANKS) -> torch.Tensor:
    """``[m]`` long: the rank of ``targets[i]`` among row ``i``'s top-``ranks`` logits, or ``ranks`` for a miss (and for
    a target of -1, a token the head cannot draft)."""
    top = logits.topk(min(ranks, logits.shape[-1]), dim=-1).indices  # [m, R]
    hit = top == targets[:, None].to(top.device)  # [m, R]
    return torch.where(hit.any(dim=1), hit.float().argmax(dim=1), torch.full_like(targets, ranks).to(top.device))


@dataclass
class TreeCalibration:
    """Accumulated per-depth statistics of a chain drafter (module docstring); :meth:`fit` gives the record."""

    depth: int
    temperatures: tuple[float, ...] = TEMPERATURES
    ranks: int = RANKS
    reached: torch.Tensor = field(init=False)  # [D] depths whose prefix was accepted
    rank_hits: torch.Tensor = field(init=False)  # [D, R] the target's token was the rank-r candidate
    nll: torch.Tensor = field(init=False)  # [D, G] summed NLL of draftable target tokens per temperature
    confidence: torch.Tensor = field(init=False)  # [D, G] summed top-1 probability per temperature
    draftable: torch.Tensor = field(init=False)  # [D] reached depths whose target token the head can draft
    steps: int = 0

    def __post_init__(self) -> None:
        g = len(self.temperatures)
        self.reached = torch.zeros(self.depth, dtype=torch.float64)
        self.rank_hits = torch.zeros(self.depth, self.ranks, dtype=torch.float64)
        self.nll = torch.zeros(self.depth, g, dtype=torch.float64)
        self.confidence = torch.zeros(self.depth, g, dtype=torch.float64)
        self.draftable = torch.zeros(self.depth, dtype=torch.float64)

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """One step: ``logits`` ``[m, V]`` of the first ``m <= depth`` drafted depths whose prefix was accepted,
        ``targets`` ``[m]`` the target's tokens there as indices into ``V`` (-1: not draftable)."""
        m = min(int(targets.numel()), self.depth)
        if m == 0:
            return
        logits, targets = logits[:m].float().cpu(), targets[:m].long().cpu()
        self.steps += 1
        self.reached[:m] += 1
        rank = target_ranks(logits, targets, self.ranks)  # [m]
        hit = rank < self.ranks
        self.rank_hits[torch.arange(m)[hit], rank[hit]] += 1
        ok = targets >= 0
        if ok.any():
            rows = torch.arange(m)[ok]
            self.nll[rows] += temperature_nll(logits[ok], targets[ok], self.temperatures)
            self.confidence[rows] += top1_probability(logits[ok], self.temperatures)
            self.draftable[rows] += 1

    def fit(self) -> dict:
        """``{"temperatures": [T_d], "rank_accuracy": [[a[d][r]]], "chain_acceptance": [a[d][0]],
        "confidence": [mean top-1 probability at T = 1], "calibrated_confidence": [... at T_d], "reached": [n_d],
        "steps": n}``; a depth never reached keeps ``T = 1`` and zero accuracies."""
        one = min(range(len(self.temperatures)), key=lambda g: abs(self.temperatures[g] - 1.0))
        temps, conf, calibrated = [], [], []
        for d in range(self.depth):
            n = float(self.draftable[d])
            best = int(self.nll[d].argmin()) if n > 0 else one
            temps.append(float(self.temperatures[best]))
            conf.append(round(float(self.confidence[d, one]) / n, 5) if n > 0 else 0.0)
            calibrated.append(round(float(self.confidence[d, best]) / n, 5) if n > 0 else 0.0)
        reached = self.reached.clamp(min=1)[:, None]
        accuracy = (self.rank_hits / reached).tolist()
        return {"temperatures": temps, "rank_accuracy": [[round(a, 5) for a in row] for row in accuracy],
                "chain_acceptance": [round(row[0], 5) for row in accuracy], "confidence": conf,
                "calibrated_confidence": calibrated, "reached": [int(r) for r in self.reached], "steps": self.steps}


class CalibrationRecorder(StepRecorder):
    """A :class:`~draftsmith.inference.evaluation.runs.StepRecorder` that feeds a :class:`TreeCalibration` from a
    chain proposer exposing ``last_draft_logits`` and ``draft_index`` (module docstring)."""

    def __init__(self, inner, calibration: TreeCalibration) -> None:
        super().__init__(inner)
        self.calibration = calibration
        self._logits: torch.Tensor | None = None

    def propose(self, tokens, max_tokens, sampling, generator=None):
        draft = super().propose(tokens, max_tokens, sampling, generator)
        logits = getattr(self.inner, "last_draft_logits", None)
        self._logits = logits[: len(draft)] if len(draft) and logits is not None else None
        return draft

    def observe(self, feedback) -> None:
        if self._logits is not None and feedback.num_proposed > 0:
            targets = depth_targets(feedback.committed, self._logits.shape[0])
            index = self.inner.draft_index(torch.tensor(targets, dtype=torch.long, device=self._logits.device))
            self.calibration.add(self._logits[: len(targets)], index)
        self._logits = None
        super().observe(feedback)


def calibrate(target, proposer, prompts: Sequence[Sequence[int]], depth: int, max_new_tokens: int,
              eos_token_ids: tuple[int, ...] = ()) -> dict:
    """Greedy chain decode of ``prompts`` with ``proposer`` (drafting chains of ``depth``), fitted into the
    calibration record (:meth:`TreeCalibration.fit`). ``target``: a
    :class:`~draftsmith.inference.core.adapter.ModelAdapter`."""
    from draftsmith.inference.core.generate import GenerationConfig, generate

    calibration = TreeCalibration(depth)
    recorder = CalibrationRecorder(proposer, calibration)
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos_token_ids))
    for ids in prompts:
        generate(target, torch.tensor(list(ids), dtype=torch.long), config, recorder)
    return calibration.fit()


__all__ = ["RANKS", "TEMPERATURES", "CalibrationRecorder", "TreeCalibration", "calibrate", "depth_targets",
           "target_ranks", "temperature_nll", "top1_probability"]
