"""DistillSpec at one training budget: every divergence x every data mode, each evaluated side by side with AR.

    python tests/benchmarks/bench_distillspec_grid.py --out-dir runs/grid --jobs 2
    python tests/benchmarks/bench_distillspec_grid.py --steps 300 --divergences tvd forward_kl --modes fixed onpolicy

Each cell runs ``recipes/distillspec.py`` (tiny zoo pair, shipped corpus, the recipe's default config) with
the same budget (``--steps`` optimizer steps of ``per_device_train_batch_size`` examples, same seed and
learning rate), only ``divergence`` and ``data_mode`` changing; then ``draftsmith eval --artefact`` measures it
on the bundled dev prompts, greedy, with a fixed draft length and no confidence stop, so that tau reflects the
draft alone. The undistilled zoo draft is measured once the same way. Cells run ``--jobs`` at a time, one
torch thread each; speedups are measured within each evaluation (method and AR in one process), so they
are comparable across cells only as far as the load on the machine was even.

Data modes (DistillSpec Sec. 4, GKD Algorithm 1): ``fixed`` = the corpus responses; ``onpolicy`` = the draft's
own (greedy) continuations of the corpus prompts; ``mixed`` = a batch is on-policy with probability
``--lmbda``, otherwise fixed; ``target`` = the target's (greedy) continuations (sequence-level KD, the
recipe's default). Writes ``grid.json`` and ``grid.md`` in ``--out-dir``; finished cells are not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "distillspec.py"
DIVERGENCES = ("forward_kl", "reverse_kl", "jsd", "tvd")
MODES = ("fixed", "onpolicy", "mixed", "target")


def cell_overrides(divergence: str, mode: str, steps: int, lmbda: float, generation_temperature: float) -> list[str]:
    """``key=value`` recipe overrides of one grid cell (everything else: launch/configs/recipes/distillspec_tiny.yaml)."""
    return [
        f"divergence={divergence}", f"data_mode={mode}", f"max_steps={steps}", f"lmbda={lmbda}", "mixed_with=fixed",
        f"generation_temperature={generation_temperature}", "eval_strategy=no", "save_strategy=no",
        "evaluate=false", "report_to=none", "disable_tqdm=true",
    ]


def eval_command(artefact: Path | None, out: Path, limit: int, max_new_tokens: int, draft_length: int) -> list[str]:
    """``draftsmith eval`` of an artefact (or of the undistilled zoo draft when ``artefact`` is None)."""
    cmd = [str(Path(sys.executable).parent / "draftsmith"), "eval"]
    cmd += ["--artefact", str(artefact)] if artefact is not None else ["--method", "draft"]
    return cmd + ["--limit", str(limit), "--max-new-tokens", str(max_new_tokens), "--draft-length", str(draft_length),
                  "--draft-confidence", "0", "--threads", "1", "--no-progress", "--out", str(out)]


def summarize_cell(report: dict, manifest: dict | None, seconds: float | None) -> dict:
    """The figures of one cell: evaluator summary + the training-time acceptance proxy."""
    s = report["summary"]
    metrics = (manifest or {}).get("metrics", {})
    return {
        "tau": s["tau"], "acceptance_rate": s["acceptance_rate"], "speedup": s["speedup"],
        "greedy_identical": s["greedy_identical"], "predicted_tau_greedy": metrics.get("predicted_tau_greedy"),
        "estimated_acceptance": metrics.get("estimated_acceptance"), "train_seconds": seconds,
        "tokens": (manifest or {}).get("training", {}).get("tokens"),
    }


def markdown_table(cells: dict[str, dict], baseline: dict) -> str:
    """Rows = divergences, columns = data modes; each entry ``tau (speedup)``, plus the baseline line."""
    modes = [m for m in MODES if any(k.endswith(f"/{m}") for k in cells)]
    divs = [d for d in DIVERGENCES if any(k.startswith(f"{d}/") for k in cells)]
    lines = ["| divergence | " + " | ".join(f"{m}: tau (speedup)" for m in modes) + " |",
             "|---|" + "---|" * len(modes)]
    for d in divs:
        row = []
        for m in modes:
            c = cells.get(f"{d}/{m}")
            row.append(f"{c['tau']:.3f} ({c['speedup']:.2f}x)" if c else "—")
        lines.append(f"| {d} | " + " | ".join(row) + " |")
    lines.append(f"| zoo draft, not distilled | {baseline['tau']:.3f} ({baseline['speedup']:.2f}x) |" + " |" * (len(modes) - 1))
    return "\n".join(lines)


def _run(cmd: list[str], log: Path) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        subprocess.run(cmd, check=True, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return time.perf_counter() - t0


def run_cell(divergence: str, mode: str, args: argparse.Namespace) -> tuple[str, dict]:
    name = f"{divergence}/{mode}"
    out = args.out_dir / f"{divergence}-{mode}"
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "eval" / "report.json"
    if not report_path.is_file():  # a finished cell is not run again (the grid resumes)
        train = [sys.executable, str(RECIPE), f"output_dir={out}",
                 *cell_overrides(divergence, mode, args.steps, args.lmbda, args.generation_temperature)]
        seconds = _run(train, out / "log.txt")
        (out / "train_seconds.txt").write_text(f"{seconds:.1f}\n")
        _run(eval_command(out / "artefact", report_path, args.limit, args.max_new_tokens, args.draft_length),
             out / "log.txt")
    seconds_file = out / "train_seconds.txt"
    seconds = float(seconds_file.read_text()) if seconds_file.is_file() else None
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    cell = summarize_cell(json.loads(report_path.read_text()), manifest, seconds)
    print(f"{name}: tau {cell['tau']:.3f} speedup {cell['speedup']:.3f} ({seconds or 0:.0f} s training)", flush=True)
    return name, cell


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=Path("runs/distillspec_grid"))
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per cell (the equal budget)")
    p.add_argument("--divergences", nargs="+", default=list(DIVERGENCES), choices=DIVERGENCES)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--lmbda", type=float, default=0.5, help="mixed mode: fraction of on-policy batches")
    p.add_argument("--generation-temperature", type=float, default=0.0, help="of the on-policy generations (0 = greedy)")
    p.add_argument("--limit", type=int, default=40, help="dev questions evaluated")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--draft-length", type=int, default=4)
    p.add_argument("--jobs", type=int, default=1, help="cells trained at once (one torch thread each)")
    args = p.parse_args(argv)
    args.out_dir = args.out_dir.resolve()
    args.out_dir.mkdir(parents=True, exist_ok=True)

    base_report = args.out_dir / "baseline" / "report.json"
    if not base_report.is_file():
        base_report.parent.mkdir(parents=True, exist_ok=True)
        _run(eval_command(None, base_report, args.limit, args.max_new_tokens, args.draft_length),
             args.out_dir / "baseline" / "log.txt")
    baseline = summarize_cell(json.loads(base_report.read_text()), None, None)
    print(f"zoo draft: tau {baseline['tau']:.3f} speedup {baseline['speedup']:.3f}", flush=True)

    jobs = [(d, m) for d in args.divergences for m in args.modes]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        cells = dict(pool.map(lambda job: run_cell(*job, args), jobs))
    result = {"command": " ".join([sys.executable, *sys.argv]), "steps": args.steps, "lmbda": args.lmbda,
              "generation_temperature": args.generation_temperature, "limit": args.limit,
              "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length, "jobs": args.jobs,
              "baseline": baseline, "cells": cells}
    (args.out_dir / "grid.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown_table(cells, baseline)
    (args.out_dir / "grid.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
