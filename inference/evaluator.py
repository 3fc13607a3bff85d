"""The built-in evaluator: a method against plain autoregressive decoding, Spec-Bench's way.

For every question, plain AR decoding (``generate`` with no proposer) and the method answer the same
prompts in the same process, one after the other, with the same ``max_new_tokens``, after warm-up runs
that are not measured. Multi-turn questions are one conversation: each answer becomes the assistant
turn before the next user turn, and each side continues its own conversation.

Metrics (DESIGN.md "Metrics", Spec-Bench's definitions):

- ``tau``: mean over all decoding steps of the tokens one target forward committed (bonus included).
- ``acceptance_rate``: accepted draft tokens / proposed draft tokens.
- ``speedup``: mean over questions of method tokens/s / mean over questions of AR tokens/s.
- ``predicted_speedup``: Leviathan et al. (2023), Theorem 3.8, from the per-token acceptance
  probability (geometric estimate: accepted / (accepted + rejections)), the draft length of every
  step and the measured cost ratio c = (draft time per proposed token) / (verify time per step):
  sum_s E[tau | alpha, k_s] / sum_s (1 + k_s c), which is ``expected_speedup(alpha, k, c)`` when
  every step drafts k tokens.
- ``greedy_identical``: fraction of questions whose answers (all turns) are token-identical to AR
  (greedy only; null under sampling, where losslessness is a distribution check). Where an answer
  differs, the first differing position and the target's top-2 logit gap there (plain target forward
  on the AR prefix) tell a floating-point near-tie from a bug.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.adapter import ModelAdapter
from draftsmith.inference.draft_length import expected_tau
from draftsmith.inference.generate import GenerationConfig, GenerationResult, generate
from draftsmith.inference.proposers.base import Proposer
from draftsmith.inference.questions import Question
from draftsmith.inference.sampling import SamplingParams

ProposerFactory = Callable[[], "Proposer | None"]
HF_PROMPT_LOOKUP_TOKENS = 10
SUMMARY_FIELDS = ("tau", "acceptance_rate", "speedup", "tokens_per_s", "ar_tokens_per_s", "predicted_speedup", "greedy_identical")


# ---------------------------------------------------------------------------------------------- records


@dataclass
class TurnRun:
    prompt_ids: list[int]
    result: GenerationResult
    text: str
    truncated: int = 0  # prompt tokens dropped from the left to fit the context
    draft_lengths: list[int] = field(default_factory=list)  # per step, 0 when nothing was proposed
    rejections: int = 0  # steps whose draft was not fully accepted


@dataclass
class QuestionRun:
    question: Question
    method: list[TurnRun]
    ar: list[TurnRun]
    hf: dict[str, list[tuple[list[int], float, int]]] = field(default_factory=dict)  # name -> (ids, s, forwards)
    difference: dict | None = None  # where the method's answer first differs from AR (greedy only)


class StepRecorder:
    """Wraps a proposer and records how many nodes it proposed and got accepted at every step
    (composition: the wrapped proposer is untouched; other attributes are delegated to it)."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.name = inner.name
        self.lossless = getattr(inner, "lossless", True)
        self.hidden_layers = tuple(getattr(inner, "hidden_layers", ()) or ())
        self.steps: list[tuple[int, int]] = []  # (proposed, accepted) of the steps that proposed something

    def __getattr__(self, name: str):
        return getattr(self.__dict__["inner"], name)

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self.steps = []
        self.inner.reset(prompt_ids)

    def propose(self, tokens, max_tokens, sampling, generator=None):
        return self.inner.propose(tokens, max_tokens, sampling, generator)

    def observe(self, feedback) -> None:
        if feedback.num_proposed > 0:
            self.steps.append((feedback.num_proposed, feedback.num_accepted))
        self.inner.observe(feedback)


# ---------------------------------------------------------------------------------------------- prompts


def chat_prompt_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Prompt ids of ``messages`` through the tokenizer's chat template, generation prompt added."""
    from draftsmith.data.chat import build_prompt_ids

    return build_prompt_ids(tokenizer, messages)


def fit_prompt(ids: list[int], max_prompt: int, where: str = "") -> tuple[list[int], int]:
    """Keep the last ``max_prompt`` tokens (left truncation) with a warning; returns (ids, dropped)."""
    if len(ids) <= max_prompt:
        return ids, 0
    dropped = len(ids) - max_prompt
    warnings.warn(
        f"prompt{where} has {len(ids)} tokens, more than the {max_prompt} the context leaves after max_new_tokens: "
        f"dropped the first {dropped} (left truncation)",
        stacklevel=2,
    )
    return ids[dropped:], dropped


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def answer_question(
    target: ModelAdapter,
    tokenizer,
    question: Question,
    config: GenerationConfig,
    proposer: StepRecorder | None,
    seed: int,
    max_prompt: int,
) -> list[TurnRun]:
    """Answer every turn of ``question`` in one conversation; the answers become assistant turns."""
    messages: list[dict] = []
    turns: list[TurnRun] = []
    for t, user in enumerate(question.turns):
        messages.append({"role": "user", "content": user})
        ids, dropped = fit_prompt(chat_prompt_ids(tokenizer, messages), max_prompt, f" of question {question.question_id} turn {t + 1}")
        gen = _generator(target.device, seed + t)
        res = generate(target, torch.tensor(ids, dtype=torch.long), config, proposer, generator=gen, tokenizer=tokenizer)
        text = tokenizer.decode(res.output_ids, skip_special_tokens=True)
        run = TurnRun(prompt_ids=ids, result=res, text=text, truncated=dropped)
        if proposer is not None:
            lengths = [p for p, _ in proposer.steps]
            run.draft_lengths = lengths + [0] * max(0, res.steps - len(lengths))
            run.rejections = sum(1 for p, a in proposer.steps if a < p)
        turns.append(run)
        messages.append({"role": "assistant", "content": text})
    return turns


# ---------------------------------------------------------------------------------------------- HF baselines


@contextlib.contextmanager
def count_forwards(model: torch.nn.Module) -> Iterator[list[int]]:
    """Count the calls of ``model``'s forward inside the block (a public forward hook, removed after)."""
    counter = [0]

    def hook(module, args, output):
        counter[0] += 1

    handle = model.register_forward_hook(hook)
    try:
        yield counter
    finally:
        handle.remove()


def hf_generate(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: Sequence[int], pad_id: int, **kwargs):
    """transformers' own greedy ``generate`` (plain, assisted or prompt lookup); returns
    (new token ids, seconds, target forwards)."""
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
    with count_forwards(model) as counter, _quiet_transformers():
        _sync(model.device)
        t0 = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=list(eos_ids) or None,
            pad_token_id=pad_id,
            **kwargs,
        )
        _sync(model.device)
        seconds = time.perf_counter() - t0
    return out[0, ids.shape[1] :].tolist(), seconds, counter[0]


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' generation-config chatter for the duration of a baseline call."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_variants(draft_model, prompt_lookup_tokens: int, target_model=None) -> dict[str, dict]:
    """name -> extra ``generate`` kwargs of the transformers baselines (no assisted generation without
    a separate draft model: its target forwards could not be told from the draft's)."""
    variants: dict[str, dict] = {"hf_ar": {}}
    if draft_model is not None and draft_model is not target_model:
        variants["hf_assisted"] = {"assistant_model": draft_model}
    variants["hf_prompt_lookup"] = {"prompt_lookup_num_tokens": prompt_lookup_tokens}
    return variants


# ---------------------------------------------------------------------------------------------- metrics


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where the sequences differ (a shorter prefix differs at its end)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def near_tie_tolerance(dtype: torch.dtype) -> float:
    """Largest top-2 logit gap still called a numerical near-tie for ``dtype``."""
    return 1e-3 if dtype in (torch.float32, torch.float64) else 0.125


@torch.inference_mode()
def logit_gap(model, prefix_ids: Sequence[int], token: int | None = None) -> dict:
    """Plain target forward on ``prefix_ids``: top-2 tokens and their logit gap at the next position
    (and the rank of ``token`` there)."""
    ids = torch.tensor([list(prefix_ids)], dtype=torch.long, device=model.device)
    logits = model(input_ids=ids).logits[0, -1].float()  # [V]
    top = logits.topk(2)
    out = {"top2_tokens": top.indices.tolist(), "top2_gap": float(top.values[0] - top.values[1])}
    if token is not None:
        out["method_token_rank"] = int((logits > logits[token]).sum())
    return out


def compare_with_ar(model, method: list[TurnRun], ar: list[TurnRun], tol: float) -> dict | None:
    """None when every turn is token-identical, else where and how the first differing turn differs."""
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
            diff["near_tie"] = diff["top2_gap"] <= tol
        return diff
    return None


def predicted_speedup(alpha: float, draft_lengths: Sequence[int], cost_ratio: float) -> tuple[float, float]:
    """(predicted tau, predicted speedup) for steps drafting ``draft_lengths`` tokens each
    (Leviathan et al. 2023, eq. 1 and Theorem 3.8, summed over steps)."""
    if not draft_lengths:
        return 1.0, 1.0
    taus = [expected_tau(alpha, k) for k in draft_lengths]
    cost = sum(1.0 + k * cost_ratio for k in draft_lengths)
    return sum(taus) / len(taus), sum(taus) / cost


def _tps(turns: Sequence[TurnRun]) -> float:
    tokens = sum(len(t.result.output_ids) for t in turns)
    seconds = sum(t.result.wall_time for t in turns)
    return tokens / seconds if seconds > 0 else 0.0


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(runs: Sequence[QuestionRun], greedy: bool) -> dict:
    """The summary fields over ``runs`` (all questions, or one category)."""
    turns = [t for r in runs for t in r.method]
    accept = [a for t in turns for a in t.result.accept_lengths]
    proposed = sum(t.result.num_proposed for t in turns)
    accepted = sum(t.result.num_accepted for t in turns)
    rejections = sum(t.rejections for t in turns)
    steps = sum(t.result.steps for t in turns)
    draft_time = sum(t.result.draft_time for t in turns)
    verify_time = sum(t.result.verify_time for t in turns)
    tps = _mean([_tps(r.method) for r in runs])
    ar_tps = _mean([_tps(r.ar) for r in runs])
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
    return {
        "tau": sum(accept) / len(accept) if accept else None,
        "acceptance_rate": accepted / proposed if proposed else None,
        "speedup": _ratio(tps, ar_tps),
        "tokens_per_s": tps,
        "ar_tokens_per_s": ar_tps,
        "predicted_speedup": pred_speedup,
        "greedy_identical": identical,
        "predicted_tau": pred_tau,
        "alpha_per_token": alpha,
        "cost_ratio": cost_ratio,
        "mean_draft_length": proposed / sum(1 for k in lengths if k) if any(lengths) else 0.0,
        "acceptance_by_depth": [a / p if p else None for a, p in zip(by_depth_a, by_depth_p)],
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


def _sum_lists(lists: Sequence[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for xs in lists:
        for i, x in enumerate(xs):
            if i == len(out):
                out.append(0)
            out[i] += x
    return out


def summarize_hf(runs: Sequence[QuestionRun], ar_tps: float | None) -> dict[str, dict]:
    """Baseline fields per transformers variant: tokens/s, speedups, tau = tokens / target forwards."""
    if not runs or not runs[0].hf:
        return {}
    names = list(runs[0].hf)
    per_q = {n: [] for n in names}
    for r in runs:
        for n in names:
            triples = r.hf[n]
            tokens = sum(len(ids) for ids, _, _ in triples)
            seconds = sum(s for _, s, _ in triples)
            per_q[n].append(tokens / seconds if seconds > 0 else 0.0)
    hf_ar_tps = _mean(per_q.get("hf_ar", []))
    out: dict[str, dict] = {}
    for n in names:
        tokens = sum(len(ids) for r in runs for ids, _, _ in r.hf[n])
        forwards = sum(f for r in runs for _, _, f in r.hf[n])
        identical = sum(
            1 for r in runs if all(ids == t.result.output_ids for (ids, _, _), t in zip(r.hf[n], r.ar))
        ) / len(runs)
        tps = _mean(per_q[n])
        out[n] = {
            "speedup": _ratio(tps, ar_tps),
            "tau": tokens / forwards if forwards else None,
            "tokens_per_s": tps,
            "speedup_vs_hf_ar": _ratio(tps, hf_ar_tps),
            "identical_to_ar": identical,
            "new_tokens": tokens,
            "target_forwards": forwards,
        }
    return out


def question_record(run: QuestionRun, greedy: bool) -> dict:
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
        "tokens_per_s": _tps(m),
        "finish_reason": [t.result.finish_reason for t in m],
        "prompt_tokens": [len(t.prompt_ids) for t in m],
        "truncated_prompt_tokens": [t.truncated for t in m],
        "ar": {
            "new_tokens": [len(t.result.output_ids) for t in a],
            "wall_time": [t.result.wall_time for t in a],
            "tokens_per_s": _tps(a),
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


# ---------------------------------------------------------------------------------------------- the run


def _tensorboard(log_dir: str | Path | None):
    if log_dir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir))


def _progress(items, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=not enabled, unit="q", dynamic_ncols=True)


def _warm_up(target, model, tokenizer, questions, n, config, proposer, seed, max_prompt, hf_plan, pad) -> None:
    """``n`` unmeasured first-turn answers with AR, the method and every transformers baseline."""
    for i in range(n):
        q = questions[i % len(questions)]
        q1 = Question(q.question_id, q.category, q.turns[:1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ar = answer_question(target, tokenizer, q1, config, None, seed, max_prompt)
            answer_question(target, tokenizer, q1, config, proposer, seed, max_prompt)
        for kwargs in hf_plan.values():
            hf_generate(model, ar[0].prompt_ids, config.max_new_tokens, config.eos_token_ids, pad, **kwargs)


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
) -> dict:
    """Run AR and ``method`` on ``questions`` and return the report (see the module docstring and
    :func:`draftsmith.inference.report.write_report`).

    ``proposer_factory`` is called once (``None`` or a factory returning ``None`` = AR); the
    proposer's ``reset`` starts every answer. ``draft_model`` is the draft for transformers'
    assisted generation under ``compare_hf`` (defaults to the proposer's own draft model, if any)."""
    sampling = sampling or SamplingParams()
    if not questions:
        raise ConfigError("no questions to evaluate: pass a questions file with at least one question")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if warmup < 0:
        raise ConfigError(f"warmup must be >= 0, got {warmup}")
    target = ModelAdapter(target_model)
    max_prompt = target.max_positions - max_new_tokens
    if max_prompt < 1:
        raise ConfigError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the target's context of "
            f"{target.max_positions} tokens: lower --max-new-tokens"
        )
    if compare_hf and not sampling.greedy:
        raise ConfigError("--compare hf runs greedy baselines: use --temperature 0 with it")
    inner = proposer_factory() if proposer_factory is not None else None
    proposer = StepRecorder(inner) if inner is not None else None
    if draft_model is None and inner is not None and hasattr(inner, "adapter") and getattr(inner, "name", "") == "draft":
        draft_model = inner.adapter.model
    eos = tokenizer.eos_token_id
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=(eos,) if eos is not None else ()
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos if eos is not None else 0)
    hf_plan = hf_variants(draft_model, HF_PROMPT_LOOKUP_TOKENS, target_model) if compare_hf else {}
    torch.manual_seed(seed)
    _warm_up(target, target_model, tokenizer, questions, warmup, config, proposer, seed, max_prompt, hf_plan, pad)
    writer = _tensorboard(tensorboard_dir)
    tol = near_tie_tolerance(target.dtype)
    runs: list[QuestionRun] = []
    bar = _progress(questions, progress, f"eval {method}")
    try:
        for qi, q in enumerate(bar):
            qseed = seed + 1000 * qi
            ar = answer_question(target, tokenizer, q, config, None, qseed, max_prompt)
            meth = answer_question(target, tokenizer, q, config, proposer, qseed, max_prompt)
            run = QuestionRun(q, meth, ar)
            for name, kwargs in hf_plan.items():
                run.hf[name] = [
                    hf_generate(target_model, t.prompt_ids, max_new_tokens, config.eos_token_ids, pad, **kwargs)
                    for t in ar
                ]
            run.difference = compare_with_ar(target_model, meth, ar, tol) if sampling.greedy else None
            runs.append(run)
            m_tps, a_tps = _tps(meth), _tps(ar)
            bar.set_postfix(speedup=f"{_mean([_tps(r.method) for r in runs]) / max(1e-9, _mean([_tps(r.ar) for r in runs])):.2f}")
            if writer is not None:
                writer.add_scalar("question/tokens_per_s", m_tps, qi)
                writer.add_scalar("question/ar_tokens_per_s", a_tps, qi)
                acc = [x for t in meth for x in t.result.accept_lengths]
                writer.add_scalar("question/tau", sum(acc) / max(1, len(acc)), qi)
    finally:
        bar.close()
    report = build_report(
        runs, method=method, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed, warmup=warmup,
        proposer=inner, target_name=target_name or str(getattr(target_model.config, "_name_or_path", "") or ""),
        draft_name=draft_name, question_file=question_file, command=command, tol=tol, target=target,
        compare_hf=compare_hf, extra=extra,
    )
    if writer is not None:
        for key in SUMMARY_FIELDS:
            value = report["summary"].get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                writer.add_scalar(f"summary/{key}", value, 0)
        acc = [x for r in runs for t in r.method for x in t.result.accept_lengths]
        if acc:
            writer.add_histogram("accept_lengths", torch.tensor(acc, dtype=torch.float32), 0)
        writer.close()
    return report


def build_report(
    runs: Sequence[QuestionRun],
    *,
    method: str,
    sampling: SamplingParams,
    max_new_tokens: int,
    seed: int,
    warmup: int,
    proposer,
    target_name: str,
    draft_name: str | None,
    question_file: str | None,
    command: str | None,
    tol: float,
    target: ModelAdapter,
    compare_hf: bool,
    extra: dict | None,
) -> dict:
    from draftsmith.common import __version__
    from draftsmith.inference.artefact import environment

    greedy = sampling.greedy
    lossless = bool(getattr(proposer, "lossless", True)) if proposer is not None else True
    summary = summarize(runs, greedy)
    categories: dict[str, dict] = {}
    for cat in dict.fromkeys(r.question.category for r in runs):
        categories[cat] = summarize([r for r in runs if r.question.category == cat], greedy)
    notes = []
    if not greedy:
        notes.append(
            "temperature > 0: greedy_identical is null (sampled answers are not expected to match AR token for "
            "token); losslessness under sampling is checked by `draftsmith eval --check-distribution`"
        )
    if not lossless:
        notes.append(f"LOSSY: the {getattr(proposer, 'name', method)} acceptance rule changes the output distribution")
    near = [r.difference for r in runs if r.difference is not None]
    if near:
        ties = sum(1 for d in near if d.get("near_tie"))
        notes.append(
            f"{len(near)} answer(s) differ from AR; {ties} at a near-tie (top-2 logit gap <= {tol:g}), "
            f"{len(near) - ties} not explained by a near-tie"
        )
    truncated = sum(1 for r in runs for t in r.method if t.truncated)
    if truncated:
        notes.append(f"{truncated} prompt(s) were truncated from the left to fit the context")
    baselines: dict[str, dict] = {}
    if compare_hf:
        baselines = summarize_hf(runs, summary["ar_tokens_per_s"])
        if "hf_assisted" not in baselines:
            baselines["hf_assisted"] = {"speedup": None, "tau": None, "tokens_per_s": None,
                                        "skipped": "no separate draft model for transformers' assisted generation (pass --draft)"}
        assisted = baselines["hf_assisted"].get("speedup")
        baselines["draftsmith_vs_hf_assisted"] = summary["speedup"] / assisted if assisted and summary["speedup"] else None
        baselines["settings"] = {
            "hf_assisted": "transformers defaults (num_assistant_tokens=20 'constant' schedule unless the draft's "
            "generation_config says otherwise, assistant_confidence_threshold=0.4)",
            "hf_prompt_lookup": f"prompt_lookup_num_tokens={HF_PROMPT_LOOKUP_TOKENS}",
            "greedy": True,
        }
    env = environment()
    env["torch_threads"] = torch.get_num_threads()
    env["device"] = str(target.device)
    env["dtype"] = str(target.dtype).replace("torch.", "")
    report = {
        "method": method,
        "target": target_name,
        "draft": draft_name,
        "question_file": question_file,
        "num_questions": len(runs),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "warmup": warmup,
        "lossless": lossless,
        "verification": "greedy (exact match)" if greedy else "speculative sampling",
        "proposer": _proposer_info(proposer),
        "summary": summary,
        "categories": categories,
        "baselines": baselines,
        "notes": notes,
        "near_tie_tolerance": tol,
        "draftsmith_version": __version__,
        "environment": env,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "questions": [question_record(r, greedy) for r in runs],
    }
    if extra:
        report.update(extra)
    return report


def _proposer_info(proposer) -> dict | None:
    if proposer is None:
        return None
    info: dict = {"name": getattr(proposer, "name", type(proposer).__name__), "lossless": getattr(proposer, "lossless", True)}
    policy = getattr(proposer, "policy", None)
    if policy is not None:
        info["draft_length"] = policy.length
        info["draft_length_mode"] = policy.mode
    for attr in ("num_draft_tokens", "max_ngram", "min_ngram", "confidence_threshold"):
        if hasattr(proposer, attr):
            info[attr] = getattr(proposer, attr)
    return info
