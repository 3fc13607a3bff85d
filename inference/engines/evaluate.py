"""``draftsmith eval --engine vllm``: a method run inside vLLM on the same prompts, and the engine report.

The questions' first turns go through draftsmith's chat template (so both sides see the same token ids) and vLLM
answers them greedily twice in the engine environment: plain (the engine's AR) and with the method's
``speculative_config``, one request at a time (per-answer time and draft counters), then in waves at each
``concurrency``. draftsmith's own AR answers the same prompts in this process, so the report states greedy
identity against both ARs; an answer that differs is classed as a near tie when the target's top-2 logit gap at
the first differing token is within the dtype's tolerance (a floating-point tie between two kernels, not a bug).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.engines.environment import run_engine
from draftsmith.inference.engines.report import by_category, summarize, throughput
from draftsmith.inference.engines.vllm import EngineMethod
from draftsmith.inference.evaluation.metrics import first_difference, is_near_tie, logit_gap, near_tie_rule
from draftsmith.inference.evaluation.questions import Question
from draftsmith.inference.evaluation.runs import fit_prompt, question_prompt_ids


def first_turn_prompts(tokenizer, questions: Sequence[Question], max_prompt: int) -> list[list[int]]:
    """Each question's first turn as prompt ids, chat-formatted unless a completion question (left-truncated to
    ``max_prompt``)."""
    return [fit_prompt(question_prompt_ids(tokenizer, q, [{"role": "user", "content": q.turns[0]}]), max_prompt,
                       str(q.question_id))[0] for q in questions]


def draftsmith_ar(target_model, prompts: Sequence[list[int]], max_new_tokens: int, eos: tuple[int, ...]) -> list[list[int]]:
    """draftsmith's own greedy answers (plain decoding) to ``prompts``."""
    adapter = ModelAdapter(target_model)
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=eos)
    device = adapter.device
    return [generate(adapter, torch.tensor(p, device=device), config).output_ids for p in prompts]


def classify(target_model, prompts: Sequence[list[int]], answers: Sequence[Sequence[int]],
             reference: Sequence[Sequence[int]], dtype: torch.dtype) -> dict:
    """How ``answers`` differ from ``reference`` (draftsmith's AR): counts of identical answers, near ties and
    other differences, with the first few differences for the report."""
    counts = {"identical": 0, "near_tie": 0, "differs": 0}
    examples = []
    for i, (prompt, a, r) in enumerate(zip(prompts, answers, reference)):
        pos = first_difference(list(a), list(r))
        if pos is None:
            counts["identical"] += 1
            continue
        gap = logit_gap(target_model, list(prompt) + list(r[:pos]), a[pos] if pos < len(a) else None) \
            if pos < len(r) else {"top2_gap": None}
        tie = is_near_tie(gap, dtype)
        counts["near_tie" if tie else "differs"] += 1
        if len(examples) < 8:
            examples.append({"index": i, "position": pos, "near_tie": tie, "top2_gap": gap["top2_gap"]})
    return counts | {"examples": examples}


def engine_evaluate(target_model, tokenizer, questions: Sequence[Question], method: EngineMethod, *, python: Path,
                    model_dir: str, tokenizer_dir: str, max_new_tokens: int, dtype: str = "float32", seed: int = 0,
                    concurrency: Sequence[int] = (), threads: int | None = None, log_dir: Path | None = None,
                    references: dict | None = None) -> dict:
    """Run ``method`` and plain decoding in vLLM on the questions' first turns; returns the engine report
    (:mod:`draftsmith.inference.engines.report`). ``references``: a dict the caller keeps across several methods on
    the same questions and settings, holding the plain-decoding runs (vLLM's and draftsmith's) by served model, so
    judging several heads decodes each reference once."""
    target = ModelAdapter(target_model)
    k = int(method.speculative_config.get("num_speculative_tokens") or 0)
    prompts = first_turn_prompts(tokenizer, questions, target.max_positions - max_new_tokens - k - 1)
    served = method.served_model or model_dir
    base = {"model": served, "tokenizer": tokenizer_dir, "dtype": dtype, "seed": seed, "prompts": prompts,
            "max_tokens": max_new_tokens, "max_model_len": int(target.max_positions), "sequential": True,
            "concurrency": list(concurrency)}
    logs = {name: (log_dir / f"engine_{name}.log" if log_dir else None) for name in ("ar", "spec")}
    known = (references or {}).get(served)
    if known is None:
        eos = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
        known = (run_engine(base | {"speculative_config": None}, python, threads=threads, log=logs["ar"]),
                 draftsmith_ar(target_model, prompts, max_new_tokens, eos) if method.served_model is None else None)
        if references is not None:
            references[served] = known
    ar, ours = known
    spec = run_engine(base | {"speculative_config": method.speculative_config}, python, threads=threads,
                      log=logs["spec"])
    dtype = next(target_model.parameters()).dtype
    categories = [q.category for q in questions]
    report = {
        "engine": "vllm", "versions": spec["versions"], "engine_method": method.engine_method,
        "num_speculative_tokens": k, "speculative_config": method.speculative_config, "served_model": served,
        "max_new_tokens": max_new_tokens, "first_turns_only": True, "load_seconds": spec["load_seconds"],
        "summary": summarize(spec["results"], ar["results"], ours),
        "categories": by_category(categories, spec["results"], ar["results"], ours),
        "throughput": throughput(spec["throughput"], ar["throughput"]),
    }
    if ours is not None:
        report["differences"] = {
            "speculative_vs_draftsmith_ar": classify(target_model, prompts, [r["token_ids"] for r in spec["results"]],
                                                     ours, dtype),
            "engine_ar_vs_draftsmith_ar": classify(target_model, prompts, [r["token_ids"] for r in ar["results"]],
                                                   ours, dtype),
            "near_tie_rule": near_tie_rule(dtype)}
    report["questions"] = [{"question_id": q.question_id, "category": q.category, "spec": s["spec"],
                            "tokens": len(s["token_ids"]), "seconds": s["seconds"], "ar_seconds": a["seconds"],
                            "identical_to_engine_ar": list(s["token_ids"]) == list(a["token_ids"])}
                           for q, s, a in zip(questions, spec["results"], ar["results"])]
    return report


__all__ = ["classify", "draftsmith_ar", "engine_evaluate", "first_turn_prompts"]
