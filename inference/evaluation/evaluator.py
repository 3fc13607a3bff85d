"""The built-in evaluator: a method against plain autoregressive decoding, Spec-Bench's way.

For every question, plain AR decoding (``generate`` with no proposer) and the method answer the same
prompts in the same process, one after the other, with the same ``max_new_tokens``, after warm-up runs
that are not measured. Multi-turn questions are one conversation: each answer becomes the assistant
turn before the next user turn, and each side continues its own conversation.

Metrics (Spec-Bench's definitions; docs/EVALUATION.md):

- ``tau``: mean over all decoding steps of the tokens one target forward committed (bonus included).
- ``acceptance_rate``: accepted draft tokens / proposed draft tokens.
- ``speedup``: mean over questions of method tokens/s / mean over questions of AR tokens/s.
- ``predicted_speedup``: from the measured cost model (:mod:`draftsmith.inference.evaluation.cost`): the target's
  verification cost by tokens verified, measured before the runs (its extra cost over one token, added
  to this run's plain decoding step), the draft cost per proposed token, the per-depth conditional acceptance and the draft
  length of every step. It predicts ``aggregate_speedup`` (all new tokens over all time, against AR's),
  and ``measured_over_predicted`` is that ratio's measured value over the prediction. ``predicted_speedup_constant_cost``
  is Leviathan et al.'s Theorem 3.8 with a verification cost that does not grow with the draft, for
  comparison.
- ``adapted_target`` (only for artefacts that tune the target, e.g. Medusa-2): the method is verified against
  the adapted target, whose own AR is then the reference for losslessness; the original target answers too
  (plain AR, not timed into the speedup) and the report says how far the adapted target's greedy answers
  moved from the original's (:func:`~draftsmith.inference.evaluation.metrics.adapter_drift`).
- ``greedy_identical``: fraction of questions whose answers (all turns) are token-identical to AR
  (greedy only; null under sampling, where losslessness is a distribution check). Where an answer
  differs, the first differing position and the target's top-2 logit gap there (plain target forward
  on the AR prefix) tell a floating-point near-tie from a bug.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig
from draftsmith.inference.core.proposer import Proposer, ReportsSection, ResetsStats, RunsDraftModel
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.evaluation.baselines import HF_PROMPT_LOOKUP_TOKENS, hf_pad_id, hf_runners, hf_variants
from draftsmith.inference.evaluation.cost import (
    PADDING_SIZES,
    extend_curve,
    extension_sizes,
    loop_curve,
    measure_verify_samples,
    typical,
)
from draftsmith.inference.evaluation.journal import EvalJournal, question_key
from draftsmith.inference.evaluation.metrics import (
    SUMMARY_FIELDS,
    adapter_drift,
    compare_with_ar,
    largest_verification,
    mean_or_none,
    near_tie_rule,
    tokens_per_s,
)
from draftsmith.inference.evaluation.questions import Question
from draftsmith.inference.evaluation.report import build_report
from draftsmith.inference.evaluation.runs import HFRun, QuestionRun, StepRecorder, answer_question, warm_up

ProposerFactory = Callable[[], "Proposer | None"]


def evaluate(
    target_model,
    tokenizer,
    method: str,
    proposer_factory: ProposerFactory | None,
    questions: Sequence[Question],
    max_new_tokens: int = 128,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    warmup: int = 1,
    compare_hf: bool = False,
    draft_model=None,
    *,
    target_name: str | None = None,
    draft_name: str | None = None,
    question_file: str | None = None,
    tensorboard_dir: str | Path | None = None,
    progress: bool = True,
    command: str | None = None,
    extra: dict | None = None,
    original_model=None,
    journal: EvalJournal | None = None,
    verify_padding: bool = True,
    engine_steps: bool = False,
) -> dict:
    """Run AR and ``method`` on ``questions`` and return the report (see the module docstring and
    :func:`draftsmith.inference.evaluation.report.write_report`).

    ``proposer_factory`` is called once (``None`` or a factory returning ``None`` = AR); the
    proposer's ``reset`` starts every answer. ``draft_model`` is the draft for transformers'
    assisted generation under ``compare_hf`` (defaults to the proposer's own draft model, if any).
    ``original_model``: when ``target_model`` is an adapted target (an artefact that tuned it), the original, whose
    AR answers the report compares with the adapted target's (``adapted_target``). ``journal``: where finished
    questions are recorded as they finish, and read back from to resume an interrupted run
    (:mod:`~draftsmith.inference.evaluation.journal`). ``verify_padding``: pad the method's verification forwards to the
    cheapest measured size at or above theirs (:func:`~draftsmith.inference.evaluation.cost.padding_plan`); AR never pads.
    ``engine_steps``: take steps as a serving engine does (no draft with the first token, full-length drafts at an
    answer's end), so that acceptance counts as the engine's does."""
    sampling = sampling or SamplingParams()
    _check_settings(questions, max_new_tokens, warmup)
    target = ModelAdapter(target_model)
    max_prompt = _max_prompt(target, max_new_tokens)
    if compare_hf and not sampling.greedy:
        raise ConfigError("--compare hf runs greedy baselines: use --temperature 0 with it")
    inner = proposer_factory() if proposer_factory is not None else None
    proposer = StepRecorder(inner) if inner is not None else None
    eos = tokenizer.eos_token_id
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=(eos,) if eos is not None else (),
        draft_first_step=not engine_steps, shorten_last_drafts=not engine_steps,
    )
    hf: dict[str, Callable[[list[int]], HFRun]] = {}
    if compare_hf:
        variants = hf_variants(_assistant(draft_model, inner), HF_PROMPT_LOOKUP_TOKENS, target_model)
        hf = hf_runners(target_model, variants, max_new_tokens, config.eos_token_ids, hf_pad_id(tokenizer))
    torch.manual_seed(seed)
    warm_up(target, tokenizer, questions, warmup, config, proposer, seed, max_prompt, list(hf.values()))
    if isinstance(inner, ResetsStats):  # a proposer's own counts cover the measured questions only
        inner.reset_stats()
    curve, plan = None, {}
    if inner is not None:  # the verification cost by rows; where padding a forward makes it cheaper, the loop pads
        samples = measure_verify_samples(target, prefix_tokens=min(max_prompt, 128), sizes=PADDING_SIZES)
        times = typical(samples)
        plan, curve = loop_curve(samples, verify_padding)
        config = dataclasses.replace(config, verify_padding=tuple(sorted(plan.items())))
    writer = _tensorboard(tensorboard_dir)
    original = ModelAdapter(original_model) if original_model is not None else None
    runs: list[QuestionRun] = []
    done = journal.load() if journal is not None else {}
    resumed = 0  # questions measured by an earlier, interrupted process (each one's AR and method side by side there)
    bar = _progress(questions, progress, f"eval {method}")
    try:
        for qi, q in enumerate(bar):
            run = done.get(question_key(qi, q))
            resumed += run is not None
            if run is None:
                run = _run_question(target, tokenizer, q, config, proposer, seed + 1000 * qi, max_prompt, hf)
                if original is not None:
                    run.original = answer_question(original, tokenizer, q, config, None, seed + 1000 * qi, max_prompt)
                run.difference = compare_with_ar(target_model, run.method, run.ar, target.dtype) if sampling.greedy else None
                if journal is not None:
                    journal.append(question_key(qi, q), run)
            runs.append(run)
            bar.set_postfix(speedup=f"{_running_speedup(runs):.2f}")
            if writer is not None:
                _log_question(writer, run, qi)
    finally:
        bar.close()
    sizes = extension_sizes(max(curve), largest_verification(runs)) if curve is not None else ()
    if sizes:  # trees verify more tokens than the start-up curve holds: measure those sizes, do not extrapolate
        more = measure_verify_samples(target, prefix_tokens=min(max_prompt, 128), sizes=sizes)
        curve, times = extend_curve(curve, more), extend_curve(times, more)
    report = build_report(
        runs, method=method, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed, warmup=warmup,
        proposer=inner, target_name=target_name or str(getattr(target_model.config, "_name_or_path", "") or ""),
        draft_name=draft_name, question_file=question_file, command=command, tie_rule=near_tie_rule(target.dtype), target=target,
        compare_hf=compare_hf, extra=extra, cost_curve=curve,
    )
    skip_attention, skip_mlp = getattr(inner, "skip_attention", None), getattr(inner, "skip_mlp", None)
    if skip_attention is not None or skip_mlp is not None:  # the skip set, one character per layer (x = skipped)
        report["skip_set"] = {
            "attention": "".join("x" if i in (skip_attention or ()) else "." for i in range(target.num_layers)),
            "mlp": "".join("x" if i in (skip_mlp or ()) else "." for i in range(target.num_layers))}
    if isinstance(inner, ReportsSection):  # a proposer's own figures (Jacobi's fast-forwarded and stationary tokens)
        key, value = inner.report_section()
        report[key] = value
    exit_layer = getattr(inner, "exit_layer", None)
    if exit_layer is not None:  # self-speculation from the first E layers: how often layer E's top-1 is the model's
        by_depth = report["summary"].get("acceptance_by_depth") or [None]
        report["early_exit"] = {"exit_layer": int(exit_layer), "num_layers": target.num_layers,
                                "top1_agreement": by_depth[0] if sampling.greedy else None}
    if original is not None:
        report["adapted_target"] = {
            "verified_against": "the artefact's adapted target (its LoRA adapter merged into a copy of the target, or "
                                "its own fine-tuned model); AR of that adapted target is the reference for speedup and "
                                "losslessness",
            **adapter_drift([(r.ar, r.original) for r in runs if r.original is not None]),
        }
    if curve is not None:
        report["verify_padding"] = {"enabled": verify_padding, "plan": {str(n): m for n, m in sorted(plan.items())},
                                    "forward_seconds": {str(n): s for n, s in times.items()}}
    if resumed:
        report["resumed_questions"] = resumed
    if writer is not None:
        _log_summary(writer, report, runs)
        writer.close()
    return report


# ---------------------------------------------------------------------------------------------- settings


def _check_settings(questions: Sequence[Question], max_new_tokens: int, warmup: int) -> None:
    if not questions:
        raise ConfigError("no questions to evaluate: pass a questions file with at least one question")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if warmup < 0:
        raise ConfigError(f"warmup must be >= 0, got {warmup}")


def _max_prompt(target: ModelAdapter, max_new_tokens: int) -> int:
    """Prompt tokens the target's context leaves after ``max_new_tokens``; an error when none."""
    max_prompt = target.max_positions - max_new_tokens
    if max_prompt < 1:
        raise ConfigError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the target's context of "
            f"{target.max_positions} tokens: lower --max-new-tokens"
        )
    return max_prompt


def _assistant(draft_model, proposer: Proposer | None):
    """The draft for transformers' assisted generation: ``draft_model``, else a draft proposer's own model."""
    if draft_model is None and proposer is not None:
        return proposer.draft_model if isinstance(proposer, RunsDraftModel) else None
    return draft_model


# ---------------------------------------------------------------------------------------------- one question


def _run_question(
    target: ModelAdapter,
    tokenizer,
    question: Question,
    config: GenerationConfig,
    proposer: StepRecorder | None,
    seed: int,
    max_prompt: int,
    hf: Mapping[str, Callable[[list[int]], HFRun]],
) -> QuestionRun:
    """AR, then the method, then every transformers baseline on the AR prompts of ``question``."""
    ar = answer_question(target, tokenizer, question, config, None, seed, max_prompt)
    meth = answer_question(target, tokenizer, question, config, proposer, seed, max_prompt)
    run = QuestionRun(question, meth, ar)
    for name, baseline in hf.items():
        run.hf[name] = [baseline(t.prompt_ids) for t in ar]
    return run


def _running_speedup(runs: Sequence[QuestionRun]) -> float:
    """Mean method tokens/s / mean AR tokens/s over the questions so far (for the progress bar)."""
    return mean_or_none([tokens_per_s(r.method) for r in runs]) / max(1e-9, mean_or_none([tokens_per_s(r.ar) for r in runs]))


# ---------------------------------------------------------------------------------------------- progress and logs


def _tensorboard(log_dir: str | Path | None):
    if log_dir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir))


def _progress(items, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=not enabled, unit="q", dynamic_ncols=True)


def _log_question(writer, run: QuestionRun, qi: int) -> None:
    writer.add_scalar("question/tokens_per_s", tokens_per_s(run.method), qi)
    writer.add_scalar("question/ar_tokens_per_s", tokens_per_s(run.ar), qi)
    acc = [x for t in run.method for x in t.result.accept_lengths]
    writer.add_scalar("question/tau", sum(acc) / max(1, len(acc)), qi)


def _log_summary(writer, report: dict, runs: Sequence[QuestionRun]) -> None:
    for key in SUMMARY_FIELDS:
        value = report["summary"].get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            writer.add_scalar(f"summary/{key}", value, 0)
    acc = [x for r in runs for t in r.method for x in t.result.accept_lengths]
    if acc:
        writer.add_histogram("accept_lengths", torch.tensor(acc, dtype=torch.float32), 0)  # [steps]
