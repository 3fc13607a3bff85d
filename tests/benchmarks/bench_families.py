"""Every target family through vLLM: on each tiny zoo family (``draftsmith zoo build --size tiny --family F``), an
EAGLE-3 head, a P-EAGLE head and a DFlash draft trained at a small budget, exported and served by vLLM beside
draftsmith's own loop on the same held-out questions (``draftsmith eval --engine both``): acceptance by position on
both sides, their largest difference, and whether every answer is identical to the engine's AR and draftsmith's AR.

    python tests/benchmarks/bench_families.py --out runs/bench/families              # six families, three methods
    python tests/benchmarks/bench_families.py --families qwen3,gemma3 --methods eagle3 --steps 60 --limit 8

Each (family, method) is kept in ``<out>/<family>/<method>/result.json``: a rerun skips what is done. The zoos are
built on first use (a few minutes each, one thread).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# the recipe, its shipped config and the overrides that size it down (every method: its own default config)
METHODS = {"eagle3": ("eagle", "eagle3_tiny"), "peagle": ("peagle", "peagle_tiny"), "dflash": ("dflash", "dflash_tiny")}


def train(family: str, method: str, steps: int, examples: int, out: Path) -> str:
    """The artefact of ``method`` trained on the ``family`` tiny zoo for ``steps`` steps on ``examples`` corpus rows
    (the corpus's answers, not the target's own: the round trip needs a head that accepts something, not the best
    head, and the target's answers would cost each training minutes of generation)."""
    from draftsmith.data.zoo import family_size
    from draftsmith.launch.recipe import run_recipe
    from draftsmith.launch.recipe_args import config_path

    done = out / "run" / "artefact"
    if (done / "manifest.json").is_file():  # trained by an earlier run of the bench
        return str(done)
    recipe, config = METHODS[method]
    extra = [f"draft_vocab_prompts={min(examples, 512)}", "calibrate_tree=false"] if recipe != "dflash" else []
    result = run_recipe(recipe, ["data_mode=fixed", f"zoo_size={family_size('tiny', family)}", "--output_dir",
                                 str(out / "run"), f"max_steps={steps}", f"max_train_examples={examples}",
                                 "eval_strategy=no", "save_strategy=no", "evaluate=false", "tune=false",
                                 "report_to=none", "disable_tqdm=true", *extra], default_config=config_path(config))
    return str(result.artefact)


def round_trip(family: str, method: str, *, steps: int, examples: int, limit: int, max_new_tokens: int, out: Path,
               engine_python: str | None = None, dtype: str = "float32") -> dict:
    """Train, export and serve ``method`` on ``family``'s tiny zoo; the engine report's figures (kept in ``out``).
    Both sides run in ``dtype``: float32 by default, where vLLM's kernels and draftsmith's agree to rounding, so that
    a difference in acceptance is the export's and not a bfloat16 near tie decided two ways."""
    from draftsmith.data.zoo import family_size
    from draftsmith.launch.cli import main
    from draftsmith.trainers.zoo import ensure_zoo

    run = out / family / method
    done = run / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    zoo = ensure_zoo(family_size("tiny", family), threads=1)
    artefact = train(family, method, steps, examples, run)
    report_path = run / "report.json"
    args = ["eval", "--engine", "both", "--artefact", artefact, "--target", str(zoo / "target"), "--limit",
            str(limit), "--max-new-tokens", str(max_new_tokens), "--warmup", "0", "--threads", "1", "--no-progress", "--dtype", dtype,
            "--out", str(report_path), *(["--engine-python", engine_python] if engine_python else [])]
    if main(args) != 0:
        raise SystemExit(f"draftsmith eval failed for {family} {method}: see {run}")
    report = json.loads(report_path.read_text())
    result = {"family": family, "method": method, "steps": steps, "engine_method": report["engine_method"],
              "draftsmith": report["parity"]["draftsmith"], "vllm": report["parity"]["engine"],
              "max_abs_difference": report["parity"]["max_abs_difference"],
              "identical_to_engine_ar": report["summary"]["identical_to_engine_ar"],
              "differs_from_draftsmith_ar": report["differences"]["speculative_vs_draftsmith_ar"]["differs"],
              "questions": limit, "dtype": dtype, "tau_vllm": report["summary"]["mean_acceptance_length"]}
    done.write_text(json.dumps(result, indent=1) + "\n")
    return result


def table(results: list[dict]) -> str:
    """The markdown table of the results, one row per family and method."""
    rows = ["| family | method (vLLM) | acceptance by position: draftsmith | vLLM | max difference | identical |",
            "|---|---|---|---|---|---|"]
    for r in results:
        ds, en = (" / ".join(f"{a:.3f}" for a in r[k]) for k in ("draftsmith", "vllm"))
        same = f"{r['identical_to_engine_ar']:.0%} of {r['questions']}, {r['differs_from_draftsmith_ar']} differ"
        rows.append(f"| {r['family']} | {r['method']} ({r['engine_method']}) | {ds} | {en} | "
                    f"{r['max_abs_difference']:.3f} | {same} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from draftsmith.data.zoo import ZOO_FAMILIES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(ZOO_FAMILIES))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--steps", type=int, default=150, help="optimizer steps of each training (default 150)")
    p.add_argument("--examples", type=int, default=1000, help="training rows (default 1000)")
    p.add_argument("--limit", type=int, default=40, help="held-out dev questions (default 40)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--engine-python", default=None, help="the vLLM environment's interpreter (default: its own)")
    p.add_argument("--dtype", default="float32", help="target and heads on both sides (default float32)")
    p.add_argument("--out", default="runs/bench/families")
    args = p.parse_args(argv)
    results = [round_trip(f, m, steps=args.steps, examples=args.examples, limit=args.limit,
                          max_new_tokens=args.max_new_tokens, out=Path(args.out), engine_python=args.engine_python,
                          dtype=args.dtype)
               for f in args.families.split(",") for m in args.methods.split(",")]
    text = table(results)
    (Path(args.out) / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
