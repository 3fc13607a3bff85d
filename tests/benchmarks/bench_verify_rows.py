"""A target's verification cost by the number of rows it verifies, and the padding plan the evaluator makes of it.

    python tests/benchmarks/bench_verify_rows.py --target smollm2-135m --threads 1 --repeats 15 \\
        --json runs/verify_rows/smollm2.json

One forward over ``n`` new tokens after a cached prefix, ``n`` = 1..16, timed round-robin (every size once a round,
``--repeats`` rounds; :func:`draftsmith.inference.evaluation.cost.measure_verify_samples`, what ``draftsmith eval`` measures
before its runs). Prints the fastest and the median time per size, each median over the 1-row median, and the
sizes :func:`~draftsmith.inference.evaluation.cost.padding_plan` pads up (``--verify-padding auto``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def rows_table(samples: dict[int, list[float]], plan: dict[int, int]) -> list[dict]:
    """One row a size: fastest and median milliseconds, median over the 1-row median, the padded size."""
    base = statistics.median(samples[1])
    return [{"rows": n, "min_ms": 1e3 * min(v), "median_ms": 1e3 * statistics.median(v),
             "median_over_1": statistics.median(v) / base, "padded_to": plan.get(n)} for n, v in sorted(samples.items())]


def markdown(table: list[dict]) -> str:
    lines = ["| rows | fastest ms | median ms | median ÷ 1 row | padded to |", "|---|---|---|---|---|"]
    lines += [f"| {r['rows']} | {r['min_ms']:.1f} | {r['median_ms']:.1f} | {r['median_over_1']:.2f} | "
              f"{r['padded_to'] or '-'} |" for r in table]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target model directory, .gguf file or name (smollm2-135m)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--prefix", type=int, default=128, help="cached tokens before the verified rows")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from draftsmith.common.models import load_model
    from draftsmith.common.threads import torch_threads
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.evaluation.cost import PADDING_SIZES, measure_verify_samples, padding_plan

    with torch_threads(args.threads):
        target = ModelAdapter(load_model(Path(args.target), "float32", what="target").eval())
        samples = measure_verify_samples(target, prefix_tokens=args.prefix, sizes=PADDING_SIZES, repeats=args.repeats)
    table = rows_table(samples, padding_plan(samples))
    print(markdown(table))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"target": args.target, "threads": args.threads, "repeats": args.repeats,
                                         "rows": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
