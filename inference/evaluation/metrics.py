"""The evaluation metrics over decode runs (definitions in :mod:`draftsmith.inference.evaluation.evaluator`):
summary fields, the Leviathan prediction, per-question records and where an answer differs from AR."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from draftsmith.inference.core.draft_length import expected_tau
from draftsmith.inference.evaluation.cost import CostModel, anchored, predicted_step, predicted_wall
from draftsmith.inference.evaluation.runs import QuestionRun, TurnRun

SUMMARY_FIELDS = ("tau", "acceptance_rate", "speedup", "tokens_per_s", "ar_tokens_per_s", "predicted_speedup", "greedy_identical")


# ---------------------------------------------------------------------------------------------- small sums


def tokens_per_s(turns: Sequence[TurnRun]) -> float:
    """New tokens / wall seconds over ``turns`` (0 when no time was measured)."""
    tokens = sum(len(t.result.output_ids) for t in turns)
    seconds = sum(t.result.wall_time for t in turns)
    return tokens / seconds if seconds > 0 else 0.0


def mean_or_none(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def ratio_or_none(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _sum_lists(lists: Sequence[Sequence[int]]) -> list[int]:
    """Element-wise sum of lists of different lengths (missing entries count 0)."""
    out: list[int] = []
    for xs in lists:
        for i, x in enumerate(xs):
            if i == len(out):
                out.append(0)
            out[i] += x
    return out


# ---------------------------------------------------------------------------------------------- differences


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where the sequences differ (a shorter prefix differs at its end)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


NEAR_TIE_ULPS = 4  # 16-bit weights: a top-2 gap within this many units in the last place of the top logit is a tie
FP32_NEAR_TIE = 1e-3  # float32/float64: reduction order across kernels (batched verification vs one-token steps)


def logit_spacing(dtype: torch.dtype, value: float) -> float:
    """Distance between ``dtype``'s representable numbers at ``value`` (one unit in the last place)."""
    magnitude = max(abs(value), torch.finfo(dtype).tiny)
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(magnitude))


def near_tie_tolerance(dtype: torch.dtype, top_logit: float) -> float:
    """Largest top-2 logit gap still called a numerical near-tie for weights in ``dtype`` at a top logit of
    ``top_logit``: ``FP32_NEAR_TIE`` for float32/64, else ``NEAR_TIE_ULPS`` units in the last place of the top logit
    (bfloat16 at a logit of 20: 4 x 0.125 = 0.5; at 3: 4 x 0.0156)."""
    if dtype in (torch.float32, torch.float64):
        return FP32_NEAR_TIE
    return NEAR_TIE_ULPS * logit_spacing(dtype, top_logit)


def near_tie_rule(dtype: torch.dtype) -> str:
    """The near-tie rule of :func:`near_tie_tolerance` in words, for reports."""
    if dtype in (torch.float32, torch.float64):
        return f"top-2 logit gap <= {FP32_NEAR_TIE:g}"
    return f"top-2 logit gap <= {NEAR_TIE_ULPS} units in the last place of {str(dtype).removeprefix('torch.')} at the top logit"


def is_near_tie(gap: dict, dtype: torch.dtype) -> bool:
    """Whether :func:`logit_gap`'s ``gap`` is a near-tie for weights in ``dtype``."""
    return gap.get("top2_gap") is not None and gap["top2_gap"] <= near_tie_tolerance(dtype, gap["top1_logit"])


@torch.inference_mode()
def logit_gap(model, prefix_ids: Sequence[int], token: int | None = None) -> dict:
    """Plain target forward on ``prefix_ids``: top-2 tokens, the top logit and the top-2 logit gap at the next
    position (and the rank of ``token`` there)."""
    ids = torch.tensor([list(prefix_ids)], dtype=torch.long, device=model.device)  # [1, L]
    logits = model(input_ids=ids).logits[0, -1].float()  # [V]
    top = logits.topk(2)
    values = top.values.tolist()
    out = {"top2_tokens": top.indices.tolist(), "top1_logit": values[0], "top2_gap": values[0] - values[1]}
    if token is not None:
        out["method_token_rank"] = int((logits > logits[token]).sum())
    return out


def compare_with_ar(model, method: list[TurnRun], ar: list[TurnRun], dtype: torch.dtype) -> dict | None:
    """None when every turn is token-identical, else where and how the first differing turn differs (``near_tie``
    by :func:`near_tie_tolerance` for weights in ``dtype``)."""
    for t, (m, a) in enumerate(zip(method, ar)):
        mi, ai = m.result.output_ids, a.result.output_ids
        pos = first_difference(mi, ai)
        if pos is None:
            continue
        diff = {
            "turn": t,
            "position": pos,
            "ar_token": ai[pos] if pos < len(ai) else None,
            "method_token": mi[pos] if pos < len(mi) else None,
            "ar_output_ids": ai,
        }
        if pos < len(ai):
            diff.update(logit_gap(model, a.prompt_ids + ai[:pos], diff["method_token"]))
            diff["tie_tolerance"] = near_tie_tolerance(dtype, diff["top1_logit"])
            diff["near_tie"] = diff["top2_gap"] <= diff["tie_tolerance"]
        return diff
    return None


def adapter_drift(pairs: Sequence[tuple[list[TurnRun], list[TurnRun]]]) -> dict:
    """How far an adapted target's AR answers moved from the original target's, over ``(adapted, original)``
    turn lists of each question: the fraction of questions answered token-identically, and the mean over turns of
    the tokens the two answers share from the start, as a fraction of the original answer's length and in tokens (the
    mean first differing position; an identical answer counts its whole length)."""
    identical, shared, first = [], [], []
    for adapted, original in pairs:
        same = True
        for a, o in zip(adapted, original):
            ai, oi = a.result.output_ids, o.result.output_ids
            pos = first_difference(ai, oi)
            same = same and pos is None
            shared.append(1.0 if pos is None else pos / max(1, len(oi)))
            first.append(float(len(oi) if pos is None else pos))
        identical.append(1.0 if same else 0.0)
    return {"questions": len(pairs), "answers_identical_to_original": mean_or_none(identical),
            "mean_shared_prefix_fraction": mean_or_none(shared), "mean_first_difference": mean_or_none(first)}


# ---------------------------------------------------------------------------------------------- summaries


def predicted_speedup(alpha: float, draft_lengths: Sequence[int], cost_ratio: float) -> tuple[float, float]:
    """(predicted tau, predicted speedup) for steps drafting ``draft_lengths`` tokens each
    (Leviathan et al. 2023, eq. 1 and Theorem 3.8, summed over steps)."""
    if not draft_lengths:
        return 1.0, 1.0
    taus = [expected_tau(alpha, k) for k in draft_lengths]
    cost = sum(1.0 + k * cost_ratio for k in draft_lengths)
    return sum(taus) / len(taus), sum(taus) / cost


def depth_acceptance(steps: Sequence[tuple[int, int]]) -> list[float | None]:
    """Conditional acceptance by depth from (proposed, accepted) steps: ``a_d`` = accepted at depth d / steps
    that proposed depth d and accepted every node above it (what the cost model's E[tau | k] multiplies)."""
    depth = max((p for p, _ in steps), default=0)
    reached, passed = [0] * depth, [0] * depth
    for p, a in steps:
        for d in range(min(p, a + 1)):  # depths 1..min(p, a + 1) were reached (0-based d)
            reached[d] += 1
            passed[d] += d < a
    return [passed[d] / reached[d] if reached[d] else None for d in range(depth)]


def largest_verification(runs: Sequence[QuestionRun]) -> int:
    """The most tokens one verification forward of ``runs``' method took: the pending token, the draft and the
    proposer's own extra inputs."""
    turns = [t for r in runs for t in r.method]
    return max((1 + max(t.draft_lengths, default=0) + max(t.extra_rows, default=0) for t in turns), default=1)


def cost_prediction(runs: Sequence[QuestionRun], curve: dict[int, float]) -> dict:
    """Predicted tau and speedup (all new tokens over all wall time, against AR's) from this run's plain decoding step
    plus the measured verification curve's extra cost for more tokens, this run's draft cost per proposed token and
    its per-depth acceptance (:mod:`~draftsmith.inference.evaluation.cost`), with the cost model itself. Prompt processing is a
    fixed cost per answer, outside the steps: a method that needs fewer steps pays as much of it as AR does."""
    turns = [t for r in runs for t in r.method]
    ar_turns = [t for r in runs for t in r.ar]
    ar_steps = sum(t.result.steps for t in ar_turns)
    ar_wall = sum(t.result.wall_time for t in ar_turns)
    ar_prefill = sum(t.result.prefill_time for t in ar_turns)
    ar_new = sum(len(t.result.output_ids) for t in ar_turns)
    new = sum(len(t.result.output_ids) for t in turns)
    proposed = sum(t.result.num_proposed for t in turns)
    if not ar_steps or ar_wall <= ar_prefill or 1 not in curve or not new:
        return {}
    step = (ar_wall - ar_prefill) / ar_steps  # one plain decoding step, as this run measured it (forward + bookkeeping)
    # verifying n tokens costs the plain step plus the forward's measured extra for the n - 1 more tokens
    cost = CostModel(anchored(curve, step),
                     draft_seconds=sum(t.result.draft_time for t in turns) / proposed if proposed else 0.0)
    tau, step_seconds = predicted_step(cost, [k for t in turns for k in t.draft_lengths],
                                       depth_acceptance([s for t in turns for s in t.steps]),
                                       [m for t in turns for m in t.extra_rows])
    wall = predicted_wall(sum(t.result.prefill_time for t in turns), new, tau, step_seconds)
    return {"predicted_tau": tau, "predicted_speedup": (new / wall) / (ar_new / ar_wall), "cost_model": cost.to_dict()}


def summarize(runs: Sequence[QuestionRun], greedy: bool, curve: dict[int, float] | None = None) -> dict:
    """The summary fields over ``runs`` (all questions, or one category). With ``curve`` (the measured
    verification cost by tokens, :func:`~draftsmith.inference.evaluation.cost.measure_verify_curve`) the prediction uses
    the cost model; without it, Leviathan et al.'s constant-cost formula."""
    turns = [t for r in runs for t in r.method]
    accept = [a for t in turns for a in t.result.accept_lengths]
    proposed = sum(t.result.num_proposed for t in turns)
    accepted = sum(t.result.num_accepted for t in turns)
    rejections = sum(t.rejections for t in turns)
    steps = sum(t.result.steps for t in turns)
    draft_time = sum(t.result.draft_time for t in turns)
    verify_time = sum(t.result.verify_time for t in turns)
    tps = mean_or_none([tokens_per_s(r.method) for r in runs])
    ar_tps = mean_or_none([tokens_per_s(r.ar) for r in runs])
    alpha = accepted / (accepted + rejections) if accepted + rejections else None
    cost_ratio = (draft_time / proposed) / (verify_time / steps) if proposed and steps and verify_time > 0 else None
    lengths = [k for t in turns for k in t.draft_lengths]
    if proposed and alpha is not None and cost_ratio is not None:
        pred_tau, pred_speedup = predicted_speedup(alpha, lengths, cost_ratio)
    else:
        pred_tau, pred_speedup = 1.0, 1.0
    by_depth_p = _sum_lists([t.result.proposed_by_depth for t in turns])
    by_depth_a = _sum_lists([t.result.accepted_by_depth for t in turns])
    identical = None
    if greedy:
        identical = sum(1 for r in runs if r.difference is None) / len(runs) if runs else None
    constant_cost_speedup = pred_speedup
    modelled = cost_prediction(runs, curve) if curve and proposed else {}
    if modelled:
        pred_tau, pred_speedup = modelled["predicted_tau"], modelled["predicted_speedup"]
    speedup = ratio_or_none(tps, ar_tps)
    # what the cost model predicts: total tokens over total time, the method's against AR's (the per-question
    # mean of Spec-Bench's `speedup` weights short, fast answers more)
    wall, ar_wall = sum(t.result.wall_time for t in turns), sum(t.result.wall_time for r in runs for t in r.ar)
    new, ar_new = sum(len(t.result.output_ids) for t in turns), sum(len(t.result.output_ids) for r in runs for t in r.ar)
    aggregate = ratio_or_none(new / wall if wall > 0 else None, ar_new / ar_wall if ar_wall > 0 else None)
    return {
        "tau": sum(accept) / len(accept) if accept else None,
        "acceptance_rate": accepted / proposed if proposed else None,
        "speedup": speedup,
        "tokens_per_s": tps,
        "ar_tokens_per_s": ar_tps,
        "predicted_speedup": pred_speedup,
        "greedy_identical": identical,
        "predicted_tau": pred_tau,
        "aggregate_speedup": aggregate,
        "measured_over_predicted": ratio_or_none(aggregate, pred_speedup) if proposed else None,
        "predicted_speedup_constant_cost": constant_cost_speedup,
        "cost_model": modelled.get("cost_model"),
        "alpha_per_token": alpha,
        "cost_ratio": cost_ratio,
        "mean_draft_length": proposed / sum(1 for k in lengths if k) if any(lengths) else 0.0,
        "acceptance_by_depth": [a / p if p else None for a, p in zip(by_depth_a, by_depth_p)],
        # vLLM's convention: steps that accepted draft position d / steps that drafted at all
        "acceptance_by_position": [a / by_depth_p[0] for a in by_depth_a] if by_depth_p and by_depth_p[0] else [],
        "num_questions": len(runs),
        "new_tokens": sum(len(t.result.output_ids) for t in turns),
        "ar_new_tokens": sum(len(t.result.output_ids) for r in runs for t in r.ar),
        "steps": steps,
        "proposed": proposed,
        "accepted": accepted,
        "wall_time": sum(t.result.wall_time for t in turns),
        "ar_wall_time": sum(t.result.wall_time for r in runs for t in r.ar),
        "draft_time": draft_time,
        "verify_time": verify_time,
    }


def question_record(run: QuestionRun, greedy: bool) -> dict:
    """The report's record of one question: per-turn figures of the method and of AR (and baselines)."""
    m, a = run.method, run.ar
    rec = {
        "question_id": run.question.question_id,
        "category": run.question.category,
        "new_tokens": [len(t.result.output_ids) for t in m],
        "wall_time": [t.result.wall_time for t in m],
        "steps": [t.result.steps for t in m],
        "accept_lengths": [x for t in m for x in t.result.accept_lengths],
        "identical": (run.difference is None) if greedy else None,
        "output_ids": [t.result.output_ids for t in m],
        "output_text": [t.text for t in m],
        "tokens_per_s": tokens_per_s(m),
        "finish_reason": [t.result.finish_reason for t in m],
        "prompt_tokens": [len(t.prompt_ids) for t in m],
        "truncated_prompt_tokens": [t.truncated for t in m],
        "ar": {
            "new_tokens": [len(t.result.output_ids) for t in a],
            "wall_time": [t.result.wall_time for t in a],
            "tokens_per_s": tokens_per_s(a),
        },
    }
    if run.difference is not None:
        rec["difference"] = run.difference
    if run.hf:
        rec["hf"] = {
            n: {"new_tokens": [len(ids) for ids, _, _ in v], "wall_time": [s for _, s, _ in v], "target_forwards": [f for _, _, f in v]}
            for n, v in run.hf.items()
        }
    return rec
