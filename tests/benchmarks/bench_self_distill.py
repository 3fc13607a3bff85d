"""Self-distillation throughput: batched generation (``draftsmith data generate``) beside one sequence at a time.

    python tests/benchmarks/bench_self_distill.py --target PATH --prompts corpus --n 64 --batch-size 16 \\
        --max-new-tokens 128 --dtype bfloat16 --json runs/bench_self_distill/result.json

Both runs load nothing twice: one target, the same first ``--n`` prompts (``--prompts`` as in ``draftsmith data
generate``), the same settings, through :func:`draftsmith.data.self_distill.generate_answers` into fresh files;
only the batch size differs (1 for sequential). A short unmeasured warm-up runs first. tokens/s is the generated
tokens (each answer's own, its EOS included; padding and the tokens a finished row waits through are not
counted) over the generation time. ``identical_rows`` is the fraction of rows the two runs answered alike
(1.0 expected when greedy, up to the last-bit differences padding makes in the logits).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target model directory, hub id or name")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the target's)")
    p.add_argument("--prompts", default="corpus", help="as draftsmith data generate --prompts (default corpus)")
    p.add_argument("--n", type=int, default=64, help="prompts answered by each run")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", default=None)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the result here")
    return p.parse_args(argv)


def identical_fraction(a: list[dict], b: list[dict]) -> float:
    """Fraction of ids whose answers are the same in both row lists."""
    answers = {r["id"]: r["messages"][-1]["content"] for r in b}
    return sum(answers.get(r["id"]) == r["messages"][-1]["content"] for r in a) / max(1, len(a))


def main(argv: list[str] | None = None) -> dict:
    from draftsmith.common.io import atomic_write_json, environment
    from draftsmith.common.models import load_model, load_tokenizer, resolve_model_path, tokenizer_dir_for
    from draftsmith.common.threads import parse_threads, torch_threads
    from draftsmith.data.row_files import recover_rows
    from draftsmith.data.self_distill import generate_answers
    from draftsmith.launch.data_cli import load_prompts
    from draftsmith.launch.targets import resolve_device

    args = parse_args(argv)
    threads = contextlib.nullcontext() if args.threads is None else torch_threads(
        parse_threads(args.threads, "--threads", "pass --threads N"))
    with threads, tempfile.TemporaryDirectory() as tmp:
        ids, prompts, source = load_prompts(args.prompts, args.n)
        device = resolve_device(args.device)
        path = resolve_model_path(args.target)
        model = load_model(path, args.dtype, device, what="target").eval()
        tokenizer = load_tokenizer(args.tokenizer or tokenizer_dir_for(path) or path)
        settings = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
                    "seed": 0, "target_name": args.target, "progress": False, "overwrite": True}
        warm = min(len(prompts), 2)
        generate_answers(model, tokenizer, prompts[:warm], Path(tmp) / "warmup.jsonl", batch_size=warm,
                         **(settings | {"max_new_tokens": min(8, args.max_new_tokens)}))
        runs, rows = {}, {}
        for name, batch_size in (("sequential", 1), ("batched", args.batch_size)):
            out = Path(tmp) / f"{name}.jsonl"
            stats = generate_answers(model, tokenizer, prompts, out, ids=ids, batch_size=batch_size, **settings)
            runs[name] = {"batch_size": batch_size, "rows": stats["new_rows"], "tokens": stats["new_tokens"],
                          "seconds": stats["new_seconds"], "tokens_per_s": stats["new_tokens_per_s"]}
            rows[name] = recover_rows(out)
    seq, bat = runs["sequential"]["tokens_per_s"], runs["batched"]["tokens_per_s"]
    result = {"target": args.target, "prompts": source, "n": len(prompts), "max_new_tokens": args.max_new_tokens,
              "temperature": args.temperature, "dtype": args.dtype, "device": device, **runs,
              "speedup": bat / seq if seq else None,
              "identical_rows": identical_fraction(rows["sequential"], rows["batched"]),
              "environment": environment()}
    for name in ("sequential", "batched"):
        r = runs[name]
        print(f"{name:>10} (batch {r['batch_size']:>3}): {r['rows']} rows, {r['tokens']} tokens in "
              f"{r['seconds']:.2f} s = {r['tokens_per_s']:.1f} tokens/s")
    print(f"batched / sequential: {result['speedup']:.2f}x; identical rows {result['identical_rows']:.0%}")
    if args.json:
        atomic_write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
