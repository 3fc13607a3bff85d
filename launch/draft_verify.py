"""The Draft & Verify search run (``recipes/draft_verify.py``): calibration prompts, the Optuna study
(:mod:`draftsmith.inference.evaluation.draft_verify`), the baselines measured beside it, a weightless artefact with the best
skip set and the threshold rule, and (``--evaluate``) the evaluator on it, as ``draftsmith eval --artefact`` runs it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftsmith.common.errors import ConfigError, DraftsmithError, error_line
from draftsmith.launch.cli import OneLineParser
from draftsmith.launch.targets import add_placement_options
from draftsmith.launch.zoo_cli import SIZES as ZOO_SIZE_NAMES

THRESHOLD_RULE_NAMES = ("reference", "unsmoothed")  # draftsmith.inference.proposers.draft_verify.THRESHOLD_RULES

METHOD = "draft-verify"


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="draft_verify.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", metavar="PATH", default=None, help="the target (default: the zoo's)")
    p.add_argument("--tokenizer", metavar="DIR", default=None, help="tokenizer (default: the target's)")
    p.add_argument("--zoo", default="tiny", choices=ZOO_SIZE_NAMES, help="zoo size used for the defaults")
    p.add_argument("--output_dir", "--output-dir", default="runs/draft_verify_tiny", help="study, artefact, reports")
    p.add_argument("--n-trials", type=int, default=40, help="finished trials the study should hold")
    p.add_argument("--timeout", type=float, default=None, help="stop searching after this many seconds")
    p.add_argument("--prompts", type=int, default=8, help="calibration prompts (held-out corpus split)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per calibration answer")
    p.add_argument("--draft-length", type=int, default=8, help="longest draft (adaptive exiting stops earlier)")
    p.add_argument("--sampler", default="tpe", choices=("tpe", "random"))
    p.add_argument("--objective", default="measured", choices=("measured", "predicted"),
                   help="measured seconds per token (default), or predicted from teacher-forced agreement and "
                        "sublayer costs (cheap, noise-free)")
    p.add_argument("--pin-ends", action=argparse.BooleanOptionalAction, default=False,
                   help="keep the first and last layers running while drafting (default: no; the reference searches the "
                        "attention and MLP of every layer)")
    p.add_argument("--threshold-rule", default="reference", choices=tuple(THRESHOLD_RULE_NAMES),
                   help="adaptive draft-exiting rule the trials and the artefact draft with: reference (the reference "
                        "code's: threshold from 0.8, target acceptance 0.9, both smoothed, held after a full-length "
                        "draft) or unsmoothed (draftsmith's earlier rule: from 0.6, target 0.8, whole steps)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: sqlite:///<output_dir>/study.db)")
    add_placement_options(p)  # search on the timings of the device the skip set will run on
    p.add_argument("--threads", default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--evaluate", action="store_true", help="evaluate the artefact on the bundled dev questions")
    p.add_argument("--eval-limit", type=int, default=40)
    p.add_argument("--no-progress", action="store_true")
    return p


def run(args: argparse.Namespace) -> dict:
    import torch

    from draftsmith.common.models import target_identity
    from draftsmith.inference.artefacts.manifest import write_artefact
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.evaluation.draft_verify import (
        SearchSettings,
        baselines,
        best_skip_set,
        search,
        seconds_per_token,
        study_summary,
    )
    from draftsmith.inference.evaluation.runs import chat_prompt_ids
    from draftsmith.inference.proposers.draft_verify import AdaptiveThreshold
    from draftsmith.launch.eval_cli import threads_context
    from draftsmith.launch.targets import load_target, placement
    from draftsmith.launch.tune_cli import calibration_questions

    if args.n_trials < 1 or args.prompts < 1:
        raise ConfigError("--n-trials and --prompts must be at least 1")
    device, dtype = placement(args)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with threads_context(args.threads):
        target_dir, target, tokenizer = load_target(args.target, args.tokenizer, args.zoo, dtype=dtype, device=device)
        adapter = ModelAdapter(target)
        prompts = [torch.tensor(chat_prompt_ids(tokenizer, [{"role": "user", "content": q.turns[0]}]))
                   for q in calibration_questions(args.prompts, args.seed)]
        eos = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
        settings = SearchSettings(draft_length=args.draft_length, max_new_tokens=args.max_new_tokens,
                                  pin_ends=args.pin_ends, sampler=args.sampler, seed=args.seed,
                                  objective=args.objective,
                                  threshold=AdaptiveThreshold.preset(args.threshold_rule).to_dict())
        storage = args.storage or f"sqlite:///{(out / 'study.db').resolve()}"
        import time

        t0 = time.perf_counter()
        study = search(target, prompts, storage, args.n_trials, settings, args.timeout, eos, not args.no_progress)
        wall = time.perf_counter() - t0
        layers = adapter.num_layers
        best = best_skip_set(study, layers)
        compared = {"plain_ar": seconds_per_token(adapter, prompts, best.__class__(), settings, eos)}
        compared["searched"] = seconds_per_token(adapter, prompts, best, settings, eos)
        for name, skip in baselines(layers).items():
            compared[name] = seconds_per_token(adapter, prompts, skip, settings, eos)
    ar = compared["plain_ar"][0]
    measured = {name: {"seconds_per_token": s, "tau": tau, "speedup": ar / s} for name, (s, tau) in compared.items()}
    proposer = {**best.to_dict(), "draft_length": args.draft_length, "threshold": settings.threshold}
    training = {"search": {"storage": storage, "n_trials": args.n_trials, "wall_seconds": round(wall, 1),
                           "settings": settings.__dict__, "calibration_prompts": len(prompts),
                           **study_summary(study, layers)},
                "skip_picture": best.picture(layers), "calibration": measured}
    manifest = write_artefact(out / "artefact", "none", method=METHOD,
                              target=target_identity(target, tokenizer, str(target_dir)), proposer=proposer,
                              training=training)
    print(f"study: {storage} ({training['search']['complete']} complete, {training['search']['pruned']} pruned, "
          f"{wall:.0f} s)")
    print(f"skip set: attention {best.picture(layers)['attention']}  mlp {best.picture(layers)['mlp']}")
    for name, m in measured.items():
        print(f"{name:18s} {m['seconds_per_token'] * 1000:8.2f} ms/token  tau {m['tau']:.3f}  speedup {m['speedup']:.3f}")
    print(f"artefact: {out / 'artefact'}  (load it with: draftsmith eval --artefact {out / 'artefact'})")
    if args.evaluate:
        from draftsmith.launch.cli import main

        main(["eval", "--artefact", str(out / "artefact"), "--target", str(target_dir), "--limit", str(args.eval_limit),
              "--device", device, "--dtype", dtype, "--out", str(out / "eval" / "report.json")]
             + (["--threads", args.threads] if args.threads else []))
    return manifest


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        run(args)
    except DraftsmithError as err:
        print(error_line(err), file=sys.stderr)
        return 2
    return 0


__all__ = ["METHOD", "main", "parser", "run"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
