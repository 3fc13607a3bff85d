"""``draftsmith tune``: choose a draft artefact's decoding settings on held-out calibration prompts.

    draftsmith tune --artefact runs/distillspec_tiny/artefact
    draftsmith tune --artefact DIR --target PATH --prompts 60 --max-new-tokens 64 --threads 1

Profiles the draft on calibration prompts (the shipped corpus' held-out split, never trained on and distinct from
the evaluation sets), predicts every draft length policy (fixed, grow/shrink heuristic, Leviathan's rule) and
confidence threshold with the measured cost model, measures
the best predicted ones against plain decoding and writes the winner into the artefact's manifest
(``proposer``) with the runner-up and all figures (``tuning``). ``draftsmith eval --artefact`` then uses it.
See :mod:`draftsmith.inference.evaluation.tune`.

A Medusa or EAGLE artefact's tree is calibrated instead: its chain decodes the calibration prompts, and the
per-depth acceptance it measures (conditional top-k accuracies, per-depth temperatures) is written as
``proposer.tree_calibration``, which the trees then score nodes with
(:mod:`draftsmith.inference.evaluation.tree_calibration`).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.registry import get_method
from draftsmith.launch.targets import add_placement_options
from draftsmith.launch.zoo_cli import SIZES as ZOO_SIZE_NAMES

AR_PROMPTS = 8  # calibration prompts decoded plainly to time a plain step


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="choose a draft artefact's draft length and confidence stop, or calibrate a Medusa/EAGLE "
                       "artefact's tree, on calibration prompts",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--artefact", metavar="DIR", required=True, help="a draft-model artefact (e.g. DistillSpec's), or a Medusa or EAGLE one")
    p.add_argument("--target", metavar="PATH", default=None, help="target: a model directory, a .gguf file, a hub id or smollm2-135m (default: the zoo's)")
    p.add_argument("--tokenizer", metavar="DIR", default=None, help="tokenizer (default: the target's, or the zoo's)")
    p.add_argument("--zoo", default="tiny", choices=ZOO_SIZE_NAMES, help="zoo size used for the defaults")
    p.add_argument("--prompts", metavar="N", type=int, default=40, help="calibration prompts (held-out corpus split)")
    p.add_argument("--max-new-tokens", metavar="N", type=int, default=64, help="tokens per calibration answer")
    p.add_argument("--max-length", metavar="K", type=int, default=8, help="longest draft profiled and considered")
    p.add_argument("--measure-top", metavar="N", type=int, default=2,
                   help="measure the N best predicted settings with the evaluator (0 = trust the prediction)")
    add_placement_options(p)  # tune where the drafts will run: timings on the CPU do not hold on a GPU
    p.add_argument("--threads", metavar="N", default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allow-target-mismatch", action="store_true")
    p.set_defaults(run=run)


def calibration_questions(n: int, seed: int = 0):
    """``n`` single-turn questions from the held-out split of the shipped corpus, an equal share per source."""
    from draftsmith.data.corpus import load_corpus
    from draftsmith.inference.evaluation.questions import Question

    rows = [r for r in load_corpus("heldout") if "messages" in r]
    by_source: dict[str, list[dict]] = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(r)
    rng, picked = random.Random(seed), []
    for name in sorted(by_source):
        picked += rng.sample(by_source[name], min(len(by_source[name]), -(-n // len(by_source))))
    rng.shuffle(picked)
    return [Question(question_id=f"cal-{i}", category=r["source"], turns=(r["messages"][0]["content"],))
            for i, r in enumerate(picked[:n])]


def first_turn_prompts(tokenizer, questions) -> tuple[list[list[int]], tuple[int, ...]]:
    """The calibration questions' first turns as chat prompt ids, and the tokenizer's end-of-sequence ids."""
    from draftsmith.inference.evaluation.runs import chat_prompt_ids

    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    return prompts, ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())


def tune_artefact(artefact: Path, target_model, tokenizer, questions, *, max_new_tokens: int = 64,
                  max_length: int = 8, measure_top: int = 2, allow_target_mismatch: bool = False) -> dict:
    """Tune ``artefact`` in place (see the module docstring); returns the tuning record."""
    from draftsmith.inference.artefacts.manifest import rewrite_manifest
    from draftsmith.inference.artefacts.reader import read_manifest
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.evaluation.cost import (
        PADDING_SIZES,
        CostModel,
        anchored,
        loop_curve,
        measure_verify_samples,
    )
    from draftsmith.inference.evaluation.evaluator import evaluate
    from draftsmith.inference.evaluation.tune import (
        Prefill,
        choose,
        plain_step_seconds,
        profile_draft,
        rank_candidates,
        tuning_record,
    )
    from draftsmith.inference.methods import load_artefact

    manifest = read_manifest(artefact)
    if get_method(manifest.get("method")).calibrated_tree:
        return calibrate_tree_artefact(artefact, target_model, tokenizer, questions, max_new_tokens=max_new_tokens,
                                       allow_target_mismatch=allow_target_mismatch, manifest=manifest)
    profiler, _ = load_artefact(artefact, target_model, tokenizer, allow_target_mismatch, draft_length=max_length,
                                draft_length_mode="fixed", confidence_threshold=0.0, manifest=manifest)
    if getattr(profiler, "draft_model", None) is None:
        raise ArtefactError(f"{artefact} is a {manifest['method']} artefact: draftsmith tune chooses a draft model's "
                            "length and confidence stop; other methods carry their own settings")
    target = ModelAdapter(target_model)
    prompts, eos = first_turn_prompts(tokenizer, questions)
    profile_draft(target, profiler, prompts[:2], max_new_tokens, eos)  # warm-up
    records, draft_seconds, method_prefill = profile_draft(target, profiler, prompts, max_new_tokens, eos)
    samples = measure_verify_samples(target, prefix_tokens=128, sizes=range(1, max(max_length + 2, max(PADDING_SIZES) + 1)))
    plan, curve = loop_curve(samples)  # as the evaluator will pay it, verification padding included
    step, plain_prefill = plain_step_seconds(target, prompts[:AR_PROMPTS], max_new_tokens, eos)
    prefill = Prefill(method=method_prefill, plain=plain_prefill)
    cost = CostModel(anchored(curve, step), draft_seconds=draft_seconds,
                     meta={"verify_padding": {str(n): m for n, m in plan.items()}, "plain_step_seconds": step,
                           "prefill_seconds_per_token": {"method": prefill.method, "plain": prefill.plain}})
    ranked = rank_candidates(records, cost, lengths=[k for k in (1, 2, 3, 4, 5, 6, 8, 10, 12) if k <= max_length],
                             max_length=max_length, prefill=prefill)
    measured = ranked[: max(1, measure_top)]
    for cand in measured if measure_top > 0 else []:
        proposer, _ = load_artefact(artefact, target_model, tokenizer, allow_target_mismatch, manifest=manifest,
                                    **cand.settings())
        report = evaluate(target_model, tokenizer, "draft", lambda p=proposer: p, questions,
                          max_new_tokens=max_new_tokens, progress=False)
        summary = report["summary"]  # the token-weighted speedup: what the prediction is of
        cand.measured_tau = summary["tau"]
        cand.measured_speedup = summary.get("aggregate_speedup") or summary["speedup"]
    chosen, runner_up = choose(measured)
    record = tuning_record(chosen, runner_up, ranked, cost, {
        "source": "shipped corpus, held-out split", "prompts": len(questions), "max_new_tokens": max_new_tokens,
        "profiled_steps": len(records), "measured": measure_top > 0})
    manifest["proposer"].pop("draft_max_length", None)  # an earlier tuning's adaptive cap
    manifest["proposer"].update(chosen.settings())
    manifest["tuning"] = record
    rewrite_manifest(artefact, manifest)
    return record


def calibrate_tree_artefact(artefact: Path, target_model, tokenizer, questions, *, max_new_tokens: int = 64,
                            allow_target_mismatch: bool = False, manifest: dict | None = None) -> dict:
    """Calibrate a Medusa or EAGLE artefact's tree in place: decode the calibration ``questions`` with its chain
    (every head, or the tree's depth) and store the per-depth temperatures and conditional rank accuracies as
    ``proposer.tree_calibration``, the whole record as ``tuning`` (:mod:`~draftsmith.inference.evaluation.tree_calibration`).
    ``manifest``: the artefact's, when read (and its files hashed) already."""
    from draftsmith.inference.artefacts.manifest import rewrite_manifest
    from draftsmith.inference.artefacts.reader import read_manifest
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.evaluation.tree_calibration import calibrate
    from draftsmith.inference.methods import load_artefact

    manifest = read_manifest(artefact) if manifest is None else manifest
    depth = manifest["proposer"].get("tree_depth") or manifest["proposer"].get("draft_length") or 5
    chain = get_method(manifest["method"]).chain_options
    options = chain(depth) if chain else {"tree": "chain"}
    proposer, _ = load_artefact(artefact, target_model, tokenizer, allow_target_mismatch, manifest=manifest, **options)
    depth = getattr(getattr(proposer, "tree", None), "max_depth", None) or depth  # Medusa: its number of heads
    prompts, eos = first_turn_prompts(tokenizer, questions)
    fitted = calibrate(ModelAdapter(target_model), proposer, prompts, depth, max_new_tokens, eos)
    record = {"tree_calibration": fitted, "calibration": {"source": "shipped corpus, held-out split",
                                                          "prompts": len(questions), "max_new_tokens": max_new_tokens}}
    manifest["proposer"]["tree_calibration"] = {"temperatures": fitted["temperatures"],
                                                "rank_accuracy": fitted["rank_accuracy"]}
    manifest["tuning"] = record
    rewrite_manifest(artefact, manifest)
    return record


def summary_lines(record: dict) -> list[str]:
    from draftsmith.inference.evaluation.tune import Candidate

    def line(name: str, c: dict | None) -> str:
        if not c:
            return f"{name}: -"
        measured = "" if c["measured_speedup"] is None else \
            f", measured tau {c['measured_tau']:.3f} speedup {c['measured_speedup']:.3f}"
        return (f"{name}: {Candidate(**c).label()}: predicted tau {c['predicted_tau']:.3f} speedup "
                f"{c['predicted_speedup']:.3f}{measured}")

    if "tree_calibration" in record:
        fit = record["tree_calibration"]
        return [f"tree calibration on {fit['steps']} steps: chain acceptance by depth "
                + " / ".join(f"{a:.3f}" for a in fit["chain_acceptance"]) + "; head confidence "
                + " / ".join(f"{c:.3f}" for c in fit["confidence"]) + "; calibrated "
                + " / ".join(f"{c:.3f}" for c in fit["calibrated_confidence"]) + " (temperatures "
                + " / ".join(f"{t:.3g}" for t in fit["temperatures"]) + ")"]
    return [line("chosen", record["chosen"]), line("runner-up", record["runner_up"])]


def run(args: argparse.Namespace) -> int:
    from draftsmith.launch.eval_cli import artefact_target, threads_context
    from draftsmith.launch.targets import load_target, placement

    if args.prompts < 1 or args.max_new_tokens < 1 or args.max_length < 1:
        raise ConfigError("--prompts, --max-new-tokens and --max-length must be at least 1")
    device, dtype = placement(args)
    with threads_context(args.threads):
        _, target, tokenizer = load_target(artefact_target(args.artefact, args.target), args.tokenizer, args.zoo,
                                           dtype=dtype, device=device)
        record = tune_artefact(Path(args.artefact), target, tokenizer, calibration_questions(args.prompts, args.seed),
                               max_new_tokens=args.max_new_tokens, max_length=args.max_length,
                               measure_top=args.measure_top, allow_target_mismatch=args.allow_target_mismatch)
    for line in summary_lines(record):
        print(line)
    print(json.dumps({"artefact": str(args.artefact), "proposer": record.get("chosen") or record["tree_calibration"]}))
    return 0
