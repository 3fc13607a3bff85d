"""Choosing a draft model's decoding settings (draft length and confidence stop) for one artefact and target.

1. *Profile*: decode held-out calibration prompts once with a long fixed draft (``max_length`` tokens, no
   confidence stop), recording for every step the draft's probability of each drafted token and how many were
   accepted; time the draft per token and measure the target's verification cost by tokens.
2. *Predict*: every candidate (draft length ``k``, confidence threshold ``t``) is replayed on those records —
   a draft of ``k`` stops after the first token below ``t``; greedy acceptance of a prefix does not depend on
   what follows it, so the accepted count is ``min(recorded, drafted)`` — and scored with the cost model
   (:mod:`draftsmith.inference.cost`): E[tau] / E[step seconds] x (plain step seconds).
3. *Measure*: the best predicted candidates run through the evaluator on the calibration prompts, side by side
   with plain decoding; the measured best wins. The choice, the runner-up and both figures go in the manifest.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from draftsmith.inference.cost import CostModel
from draftsmith.inference.runs import StepRecorder

LENGTHS = (1, 2, 3, 4, 5, 6, 8)
THRESHOLDS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


@dataclass(frozen=True)
class StepRecord:
    """One profiled step: the draft's probability of every drafted token, and how many the target accepted."""

    confidences: tuple[float, ...]
    accepted: int


@dataclass
class Candidate:
    draft_length: int
    confidence_threshold: float
    predicted_tau: float = 0.0
    predicted_speedup: float = 0.0
    measured_tau: float | None = None
    measured_speedup: float | None = None

    def settings(self) -> dict:
        return {"draft_length": self.draft_length, "draft_length_mode": "fixed",
                "confidence_threshold": self.confidence_threshold}


def replay(record: StepRecord, k: int, threshold: float) -> tuple[int, int]:
    """(drafted, accepted) of ``record`` had the draft been ``k`` tokens with confidence stop ``threshold``."""
    drafted = min(k, len(record.confidences))
    for i, conf in enumerate(record.confidences[:drafted]):
        if conf < threshold:
            drafted = i + 1
            break
    return drafted, min(record.accepted, drafted)


def predict(records: Sequence[StepRecord], cost: CostModel, k: int, threshold: float) -> Candidate:
    """Predicted tau and speedup over plain decoding of ``(k, threshold)`` on the profiled steps."""
    steps = [replay(r, k, threshold) for r in records]
    if not steps:
        return Candidate(k, threshold, 1.0, 1.0)
    tau = sum(a + 1 for _, a in steps) / len(steps)
    seconds = sum(cost.step_seconds(d) for d, _ in steps) / len(steps)
    return Candidate(k, threshold, tau, tau / seconds * cost.step_seconds(0))


def rank_candidates(records: Sequence[StepRecord], cost: CostModel, lengths: Sequence[int] = LENGTHS,
                    thresholds: Sequence[float] = THRESHOLDS) -> list[Candidate]:
    """Every (length, threshold) candidate, best predicted speedup first (ties: shorter drafts, lower threshold)."""
    cands = [predict(records, cost, k, t) for k, t in itertools.product(lengths, thresholds)]
    return sorted(cands, key=lambda c: (-c.predicted_speedup, c.draft_length, c.confidence_threshold))


def choose(measured: Sequence[Candidate]) -> tuple[Candidate, Candidate | None]:
    """(chosen, runner-up) among measured candidates: the highest measured speedup wins."""
    ranked = sorted(measured, key=lambda c: -(c.measured_speedup if c.measured_speedup is not None else c.predicted_speedup))
    return ranked[0], (ranked[1] if len(ranked) > 1 else None)


def tuning_record(chosen: Candidate, runner_up: Candidate | None, ranked: Sequence[Candidate], cost: CostModel,
                  calibration: dict) -> dict:
    """What the manifest records of a tuning run."""
    return {
        "chosen": asdict(chosen),
        "runner_up": asdict(runner_up) if runner_up else None,
        "top_predicted": [asdict(c) for c in ranked[:8]],
        "cost_model": cost.to_dict(),
        "calibration": calibration,
    }


def profile_draft(target, proposer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  eos_token_ids: tuple[int, ...] = ()) -> tuple[list[StepRecord], float]:
    """Greedy decode of ``prompts`` with ``proposer`` (a draft-model proposer with a fixed length and no
    confidence stop), recording every step; returns the records and the draft's seconds per drafted token.
    ``target``: a :class:`~draftsmith.inference.adapter.ModelAdapter`."""
    import torch

    from draftsmith.inference.generate import GenerationConfig, generate

    proposer.record_confidences = True
    recorder = _Recorder(proposer)
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos_token_ids))
    seconds = drafted = 0.0
    for ids in prompts:
        result = generate(target, torch.tensor(list(ids), dtype=torch.long), config, recorder)
        seconds += result.draft_time
        drafted += result.num_proposed
    return recorder.records, (seconds / drafted if drafted else 0.0)


class _Recorder(StepRecorder):
    """A :class:`~draftsmith.inference.runs.StepRecorder` that also keeps a :class:`StepRecord` (the draft's
    confidences and the accepted count) per verified step."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.records: list[StepRecord] = []

    def observe(self, feedback) -> None:
        if feedback.num_proposed > 0:
            confs = tuple(self.inner.last_confidences[: feedback.num_proposed])
            self.records.append(StepRecord(confs, feedback.num_accepted))
        super().observe(feedback)
