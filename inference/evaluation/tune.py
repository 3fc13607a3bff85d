"""Choosing a draft model's decoding settings (draft length policy and confidence stop) for one artefact and target.

1. *Profile*: decode held-out calibration prompts once with a long fixed draft (``max_length`` tokens, no
   confidence stop), recording for every step, in order, the draft's probability of each drafted token and how
   many were accepted; time the draft per token and measure the target's verification cost by tokens, priced as
   the decode loop pays it (:func:`~draftsmith.inference.evaluation.cost.loop_curve`: padding included).
2. *Predict*: every candidate policy — a fixed length ``k``, transformers' grow/shrink heuristic from ``k``, or
   Leviathan's expected-speedup rule (:mod:`draftsmith.inference.core.draft_length`), each with a confidence threshold
   ``t`` — is replayed on those records, answer by answer: the policy object itself picks each step's length from
   what it observed on the steps before, a draft stops after the first token below ``t``, and as greedy acceptance
   of a prefix does not depend on what follows it, the accepted count is ``min(recorded, drafted)``. Scored with
   the cost model (:mod:`draftsmith.inference.evaluation.cost`), per new token: (prompt processing + plain step) /
   (prompt processing + E[step seconds] / E[tau]), the plain step timed on a plain decode. (The replay
   keeps the recorded steps' order: a shorter draft would have started later steps elsewhere, so an adaptive
   policy's prediction assumes acceptance changes as slowly along an answer as the recorded steps do.)
3. *Measure*: the best predicted candidates run through the evaluator on the calibration prompts, side by side
   with plain decoding; the measured best wins. The choice, the runner-up and both figures go in the manifest.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.evaluation.cost import CostModel
from draftsmith.inference.evaluation.runs import StepRecorder

LENGTHS = (1, 2, 3, 4, 5, 6, 8)
THRESHOLDS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
HEURISTIC_STARTS = (2, 4)  # the grow/shrink heuristic's length at the start of every answer
MODE_ORDER = {"fixed": 0, "heuristic": 1, "leviathan": 2}  # ties in prediction: the simpler policy first


@dataclass(frozen=True)
class StepRecord:
    """One profiled step: the draft's probability of every drafted token, and how many the target accepted."""

    confidences: tuple[float, ...]
    accepted: int
    answer: int = 0  # which calibration answer the step belongs to (steps of one answer are kept in order)


@dataclass
class Candidate:
    """A draft length policy: ``draft_length`` is the fixed length, or an adaptive policy's starting length;
    adaptive policies draft at most ``max_length`` tokens."""

    draft_length: int
    confidence_threshold: float
    predicted_tau: float = 0.0
    predicted_speedup: float = 0.0
    measured_tau: float | None = None
    measured_speedup: float | None = None
    draft_length_mode: str = "fixed"
    max_length: int | None = None

    def settings(self) -> dict:
        out = {"draft_length": self.draft_length, "draft_length_mode": self.draft_length_mode,
               "confidence_threshold": self.confidence_threshold}
        return out | ({"draft_max_length": self.max_length} if self.draft_length_mode != "fixed" else {})

    def policy_label(self) -> str:
        return {"fixed": f"fixed {self.draft_length}",
                "heuristic": f"heuristic from {self.draft_length} up to {self.max_length}",
                "leviathan": f"Leviathan rule up to {self.max_length}"}.get(self.draft_length_mode, self.draft_length_mode)

    def label(self) -> str:
        return f"{self.policy_label()}, confidence {self.confidence_threshold}"

    def policy(self, cost: CostModel) -> DraftLengthPolicy:
        top = max(self.max_length or 0, self.draft_length) if self.draft_length_mode != "fixed" else self.draft_length
        return DraftLengthPolicy(length=self.draft_length, mode=self.draft_length_mode, max_length=top,
                                 relative_verify=cost.relative_verify)


def replay(record: StepRecord, k: int, threshold: float) -> tuple[int, int]:
    """(drafted, accepted) of ``record`` had the draft been ``k`` tokens with confidence stop ``threshold``."""
    drafted = min(k, len(record.confidences))
    for i, conf in enumerate(record.confidences[:drafted]):
        if conf < threshold:
            drafted = i + 1
            break
    return drafted, min(record.accepted, drafted)


def replay_policy(records: Sequence[StepRecord], policy: DraftLengthPolicy, threshold: float,
                  cost: CostModel) -> list[tuple[int, int]]:
    """(drafted, accepted) per recorded step had ``policy`` chosen the lengths: reset at every answer, as the
    proposer does; told each step's outcome and its cost-model seconds, as the decode loop tells it."""
    steps, answer = [], None
    for r in records:
        if r.answer != answer:
            policy.reset()
            answer = r.answer
        drafted, accepted = replay(r, policy.next_length(), threshold)
        policy.observe(drafted, accepted, drafted * cost.draft_seconds, cost.verify(1 + drafted))
        steps.append((drafted, accepted))
    return steps


@dataclass(frozen=True)
class Prefill:
    """Seconds of prompt processing per new token written, by the drafting method (the target's prompt forward and
    the draft's start) and by plain decoding: a fixed cost per answer that fewer steps do not shrink."""

    method: float = 0.0
    plain: float = 0.0


def predict(records: Sequence[StepRecord], cost: CostModel, k: int | Candidate, threshold: float = 0.0,
            prefill: Prefill = Prefill()) -> Candidate:
    """Predicted tau and speedup over plain decoding (all new tokens over all wall time) of a candidate (or of a fixed
    ``k`` with ``threshold``) on the profiled steps: (prefill + plain step) / (prefill + step seconds / tau), per
    token."""
    cand = k if isinstance(k, Candidate) else Candidate(k, threshold)
    steps = replay_policy(records, cand.policy(cost), cand.confidence_threshold, cost)
    if not steps:
        return dataclasses.replace(cand, predicted_tau=1.0, predicted_speedup=1.0)
    tau = sum(a + 1 for _, a in steps) / len(steps)
    seconds = sum(cost.step_seconds(d) for d, _ in steps) / len(steps)
    speedup = (prefill.plain + cost.step_seconds(0)) / (prefill.method + seconds / tau)
    return dataclasses.replace(cand, predicted_tau=tau, predicted_speedup=speedup)


def candidates(lengths: Sequence[int] = LENGTHS, thresholds: Sequence[float] = THRESHOLDS,
               max_length: int | None = None) -> list[Candidate]:
    """Every policy considered: fixed lengths, the heuristic from each of :data:`HEURISTIC_STARTS`, and Leviathan's
    rule, each with every threshold; adaptive ones draft at most ``max_length`` (default: the longest length)."""
    top = max_length or max(lengths)
    policies = [(k, "fixed") for k in lengths]
    policies += [(k, "heuristic") for k in HEURISTIC_STARTS if k <= top]
    policies += [(min(4, top), "leviathan")]
    return [Candidate(k, t, draft_length_mode=mode, max_length=None if mode == "fixed" else top)
            for (k, mode), t in itertools.product(policies, thresholds)]


def rank_candidates(records: Sequence[StepRecord], cost: CostModel, lengths: Sequence[int] = LENGTHS,
                    thresholds: Sequence[float] = THRESHOLDS, max_length: int | None = None,
                    prefill: Prefill = Prefill()) -> list[Candidate]:
    """Every candidate policy, best predicted speedup first (ties: the simpler policy, shorter drafts, lower
    threshold)."""
    cands = [predict(records, cost, c, prefill=prefill) for c in candidates(lengths, thresholds, max_length)]
    return sorted(cands, key=lambda c: (-c.predicted_speedup, MODE_ORDER[c.draft_length_mode], c.draft_length,
                                        c.confidence_threshold))


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
                  eos_token_ids: tuple[int, ...] = ()) -> tuple[list[StepRecord], float, float]:
    """Greedy decode of ``prompts`` with ``proposer`` (a draft-model proposer with a fixed length and no
    confidence stop), recording every step; returns the records, the draft's seconds per drafted token and the
    prompt processing's seconds per new token. ``target``: a :class:`~draftsmith.inference.core.adapter.ModelAdapter`."""
    import torch

    from draftsmith.inference.core.generate import GenerationConfig, generate

    proposer.record_confidences = True
    recorder = _Recorder(proposer)
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos_token_ids))
    seconds = drafted = prefill = new = 0.0
    for i, ids in enumerate(prompts):
        recorder.answer = i
        result = generate(target, torch.tensor(list(ids), dtype=torch.long), config, recorder)
        seconds += result.draft_time
        drafted += result.num_proposed
        prefill += result.prefill_time
        new += len(result.output_ids)
    return recorder.records, (seconds / drafted if drafted else 0.0), (prefill / new if new else 0.0)


def plain_step_seconds(target, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                       eos_token_ids: tuple[int, ...] = ()) -> tuple[float, float]:
    """(seconds per plain decoding step, forward plus the loop's bookkeeping; seconds of prompt processing per new
    token) from a greedy AR decode of ``prompts``: the step is what the evaluator anchors its cost model to
    (:func:`~draftsmith.inference.evaluation.cost.anchored`)."""
    import torch

    from draftsmith.inference.core.generate import GenerationConfig, generate

    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos_token_ids))
    wall = steps = prefill = new = 0.0
    for ids in prompts:
        result = generate(target, torch.tensor(list(ids), dtype=torch.long), config)
        wall += result.wall_time - result.prefill_time
        prefill += result.prefill_time
        steps += result.steps
        new += len(result.output_ids)
    return (wall / steps if steps else 0.0), (prefill / new if new else 0.0)


class _Recorder(StepRecorder):
    """A :class:`~draftsmith.inference.evaluation.runs.StepRecorder` that also keeps a :class:`StepRecord` (the draft's
    confidences and the accepted count) per verified step."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.records: list[StepRecord] = []
        self.answer = 0

    def observe(self, feedback) -> None:
        if feedback.num_proposed > 0:
            confs = tuple(self.inner.last_confidences[: feedback.num_proposed])
            self.records.append(StepRecord(confs, feedback.num_accepted, self.answer))
        super().observe(feedback)
