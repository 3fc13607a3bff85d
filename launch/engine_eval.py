"""``draftsmith eval --engine vllm|both``: the method inside vLLM, and its acceptance parity with draftsmith's loop.

    draftsmith eval --engine vllm --method pld --limit 80 --max-new-tokens 64             # vLLM's ngram
    draftsmith eval --engine vllm --artefact runs/eagle3_tiny/artefact --concurrency 1,4,16
    draftsmith eval --engine both --artefact runs/eagle3_tiny/artefact --limit 80 --max-new-tokens 64

``vllm`` writes the engine report (``--out``; :mod:`draftsmith.inference.engines.report`). ``both`` also runs
draftsmith's evaluator on the same first turns, drafting the same chain (the settings the method's engine function
gives, ``engine_steps`` on so that its steps and acceptance by position count as vLLM's do), and prints the two
acceptance curves side by side with their difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from draftsmith.common.errors import ConfigError
from draftsmith.common.io import atomic_write_text
from draftsmith.common.models import resolve_model_path
from draftsmith.common.registry import REGISTRY, get_method


def add_engine_options(g) -> None:
    g.add_argument("--engine", choices=("vllm", "both"), default=None,
                   help="run the method inside vLLM instead of draftsmith's loop (vllm), or in both with their "
                        "acceptance by position side by side (both); greedy, first turns (docs/EVALUATION.md)")
    g.add_argument("--engine-python", metavar="PATH", default=None,
                   help="the vLLM environment's python (default: $DRAFTSMITH_VLLM_PYTHON, else the one `make engine` "
                        "made under DRAFTSMITH_HOME/engines/vllm)")
    g.add_argument("--engine-export", choices=("auto", "speculators"), default="auto",
                   help="--engine: the layout the artefact is exported in: each method's own (auto), or "
                        "vllm-project/speculators' (EAGLE-3 heads)")
    g.add_argument("--concurrency", metavar="N,N", default=None,
                   help="--engine: also measure output tokens/s with and without speculation at these concurrencies "
                        "(e.g. 1,4,16)")


ENGINE_ONLY = {"engine_python": None, "engine_export": "auto", "concurrency": None}  # option -> its default


def refuse_engine_options_without_engine(args: argparse.Namespace) -> None:
    """Options that only mean something with ``--engine`` are refused without it (one line), not ignored."""
    if getattr(args, "engine", None) is not None:
        return
    given = [name for name, default in ENGINE_ONLY.items() if getattr(args, name, default) != default]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        verb = "applies" if len(given) == 1 else "apply"
        raise ConfigError(f"{flags} {verb} only with --engine: add --engine vllm, or drop {flags}")


def concurrency_list(value: str | None) -> list[int]:
    if not value:
        return []
    try:
        levels = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--concurrency {value}: give comma-separated request counts, e.g. 1,4,16") from None
    if any(c < 1 for c in levels):
        raise ConfigError(f"--concurrency {value}: every level must be at least 1")
    return levels


def engine_setup(args: argparse.Namespace, info: dict, target_model, export_dir: Path, options: dict):
    """The method's :class:`~draftsmith.inference.engines.vllm.EngineMethod` from its registry entry."""
    from draftsmith.inference.engines.vllm import EngineSetup

    spec = get_method(info["method"])
    if "vllm" not in spec.engine_configs:
        have = [n for n in REGISTRY.names() if "vllm" in get_method(n).engine_configs]
        raise ConfigError(f"{info['method']} has no vLLM counterpart: the engine runs {', '.join(have)}")
    setup = EngineSetup(method=info["method"], length=args.draft_length, export_dir=export_dir,
                        target_model=info.get("original_target") or target_model,
                        artefact_dir=Path(args.artefact) if args.artefact else None, manifest=info["manifest"],
                        draft_dir=info["draft"] if not args.artefact else None, options=options,
                        export_format=args.engine_export)
    return spec.engine_configs["vllm"](setup)


def run_engine_eval(args: argparse.Namespace, setup: Callable, run_eval: Callable, options: dict,
                    default_out: str) -> int:
    """``setup(args) -> (target, tokenizer, info)`` and ``run_eval`` are ``draftsmith eval``'s own; ``options`` its
    method options as given."""
    from draftsmith.inference.core.sampling import SamplingParams
    from draftsmith.inference.engines.environment import engine_python, engine_versions
    from draftsmith.inference.engines.evaluate import engine_evaluate
    from draftsmith.inference.engines.report import parity, parity_table, summary_lines
    from draftsmith.inference.evaluation.questions import read_questions

    if args.temperature != 0 or args.check_distribution:
        raise ConfigError("--engine compares greedy answers: use --temperature 0 and no --check-distribution")
    python = engine_python(args.engine_python)  # refused before any model loads when missing
    levels = concurrency_list(args.concurrency)
    engine_versions(python)  # an interpreter that is not the engine's is refused before any model loads
    out = Path(args.out or default_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    questions = [replace(q, turns=q.turns[:1]) for q in read_questions(args.questions, limit=args.limit,
                                                                         per_category=args.per_category)]
    target, tokenizer, info = setup(args)
    method = engine_setup(args, info, target, out.parent / (out.stem + "_export"), options)
    report = engine_evaluate(target, tokenizer, questions, method, python=python,
                             model_dir=str(resolve_model_path(info["target"])),  # a named target's directory
                             tokenizer_dir=info["tokenizer"] or info["target"], max_new_tokens=args.max_new_tokens,
                             dtype=args.dtype, seed=args.seed, concurrency=levels, threads=args.threads,
                             log_dir=out.parent)
    report |= {"method": info["method"], "artefact": args.artefact, "target": info["target"]}
    lines = summary_lines(report)
    if args.engine == "both":  # draftsmith's loop on the same first turns, drafting the same chain
        for name, value in method.draftsmith_options.items():
            setattr(args, name, value)
        ds_out = out.with_name(out.stem + "_draftsmith.json")
        args.out = str(ds_out)
        run_eval(args, *setup(args), questions, SamplingParams(), engine_steps=True)
        ds = json.loads(ds_out.read_text())
        report["parity"] = parity(ds["summary"].get("acceptance_by_position") or [],
                                  report["summary"]["acceptance_by_position"])
        report["draftsmith"] = {"report": str(ds_out), "summary": ds["summary"]}
        lines += ["", "acceptance by position, same prompts and chain:", parity_table(report["parity"])]
    atomic_write_text(out, json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))
    print(f"engine report: {out}", file=sys.stderr)
    return 0


__all__ = ["add_engine_options", "concurrency_list", "engine_setup", "refuse_engine_options_without_engine",
           "run_engine_eval"]
