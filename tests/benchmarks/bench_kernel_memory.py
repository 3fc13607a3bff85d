"""Peak memory of the chunked linear + divergence loss against the naive loss (CPU, one process each).

    python tests/benchmarks/bench_kernel_memory.py                      # N=4096, H=512, V=32000, float32
    python tests/benchmarks/bench_kernel_memory.py --tokens 512 --vocab 8000 --json out.json

Each variant runs forward + backward in its own fresh Python process, so the peak resident set size
(``getrusage(RUSAGE_SELF).ru_maxrss``) belongs to that variant alone. Reported: the peak RSS, the RSS
after the inputs were allocated, and their difference (the memory the loss itself needed). Variants:

- ``naive`` / ``chunked``: the teacher given as hidden states + LM head (the fused path's best case:
  no ``[N, V]`` tensor exists anywhere in the chunked run);
- ``naive-logits`` / ``chunked-logits``: the teacher given as precomputed ``[N, V]`` logits (an input,
  so part of the baseline in both).

The chunked variants use the PyTorch reference (``backend="reference"``), the CPU path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

VARIANTS = ("naive", "chunked", "naive-logits", "chunked-logits")


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def run_variant(args: argparse.Namespace) -> dict:
    """Runs in the child process: build inputs, one forward + backward, measure."""
    import torch

    from draftsmith.kernels import fused_linear_divergence, naive_linear_divergence

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    n, h, v = args.tokens, args.hidden, args.vocab
    hidden = torch.randn(n, h, dtype=dtype).requires_grad_()  # [N, H]
    weight = (torch.randn(v, h, dtype=dtype) * (2 / h**0.5)).requires_grad_()  # [V, H]
    teacher_hidden = torch.randn(n, h, dtype=dtype)  # [N, H]
    teacher_weight = torch.randn(v, h, dtype=dtype) * (2 / h**0.5)  # [V, H]
    teacher = dict(teacher_hidden=teacher_hidden, teacher_weight=teacher_weight)
    if args.variant.endswith("-logits"):
        with torch.no_grad():
            teacher = dict(teacher_logits=teacher_hidden @ teacher_weight.t())  # [N, V], an input
        del teacher_hidden, teacher_weight
    loss_args = dict(kind=args.kind, beta=args.beta, temperature=args.temperature)
    rss_inputs = current_rss_bytes()
    start = time.perf_counter()
    if args.variant.startswith("naive"):
        loss = naive_linear_divergence(hidden, weight, **teacher, **loss_args)
    else:
        loss = fused_linear_divergence(
            hidden, weight, **teacher, **loss_args, chunk_size=args.chunk_size, backend="reference"
        )
    loss.backward()
    seconds = time.perf_counter() - start
    peak = peak_rss_bytes()
    return {
        "variant": args.variant,
        "loss": loss.item(),
        "grad_hidden_norm": hidden.grad.float().norm().item(),
        "grad_weight_norm": weight.grad.float().norm().item(),
        "seconds": seconds,
        "rss_inputs_mb": rss_inputs / 2**20,
        "peak_rss_mb": peak / 2**20,
        "loss_peak_mb": (peak - rss_inputs) / 2**20,
    }


def child_command(args: argparse.Namespace, variant: str) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--variant", variant]
    for name in ("tokens", "hidden", "vocab", "dtype", "kind", "beta", "temperature"):
        cmd += [f"--{name}", str(getattr(args, name))]
    if args.chunk_size is not None:
        cmd += ["--chunk-size", str(args.chunk_size)]
    return cmd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096, help="N, tokens in the batch")
    p.add_argument("--hidden", type=int, default=512, help="H, hidden size of both models")
    p.add_argument("--vocab", type=int, default=32000, help="V, vocabulary size")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--kind", default="forward_kl", choices=["forward_kl", "reverse_kl", "jsd", "tvd"])
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (default: Liger's heuristic)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # child mode
    args = p.parse_args(argv)
    if args.variant is not None:
        print(json.dumps(run_variant(args)))
        return 0

    print(f"N={args.tokens} H={args.hidden} V={args.vocab} {args.dtype} {args.kind}; one process per variant")
    print(
        f"one [N, V] {args.dtype} table = {args.tokens * args.vocab * (4 if args.dtype == 'float32' else 2) / 2**20:.0f} MB"
    )
    results = []
    for variant in args.variants.split(","):
        out = subprocess.run(child_command(args, variant), capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{variant}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(r)
        print(
            f"{variant:>15}: peak RSS {r['peak_rss_mb']:8.0f} MB | inputs {r['rss_inputs_mb']:7.0f} MB | "
            f"loss needed {r['loss_peak_mb']:7.0f} MB | {r['seconds']:6.2f} s | loss {r['loss']:.6f}"
        )
    by_name = {r["variant"]: r for r in results}
    for naive, chunked in (("naive", "chunked"), ("naive-logits", "chunked-logits")):
        if naive in by_name and chunked in by_name:
            a, b = by_name[naive], by_name[chunked]
            print(
                f"{chunked} vs {naive}: peak RSS {a['peak_rss_mb'] / b['peak_rss_mb']:.1f}x lower, "
                f"loss memory {a['loss_peak_mb'] / max(b['loss_peak_mb'], 1):.1f}x lower, "
                f"loss rel. diff {abs(a['loss'] - b['loss']) / abs(a['loss']):.1e}"
            )
    if args.json:
        from draftsmith.common.io import atomic_write_json

        atomic_write_json(
            args.json, {"config": {k: v for k, v in vars(args).items() if k != "variant"}, "results": results}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
