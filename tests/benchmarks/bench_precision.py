"""float32 against ``dtype=auto`` (bfloat16 where native) on one CPU: every recipe's training step, the target's
verification forward, and what fraction of the bfloat16 peak the matrix products reach.

    python tests/benchmarks/bench_precision.py --threads 1 --json runs/bench/precision.json      # SmolLM2's shape
    python tests/benchmarks/bench_precision.py --config path/to/config.json --methods eagle3,distillspec --profile

Three parts, side by side in one run, each (method, dtype) in its own fresh process:

- **peak**: a plain 2048x2048x2048 product in float32 and in bfloat16 (GFLOP/s), the ceiling of the rest;
- **training**: each method's trainer on a random target of ``--config`` (default: SmolLM2-135M's shape) held in
  the frozen dtype, its trained module in float32 master weights, ``--rows`` rows of ``--tokens`` tokens in all;
  one warm-up step, then ``--steps`` steps of the trainer's own ``compute_loss`` (under its mixed precision:
  float32, or bfloat16 autocast for ``auto``), ``backward`` and AdamW, timed: training tokens/s. One more step runs
  under ``torch.profiler`` with FLOP counting: the matrix products' FLOPs over their own time is the achieved FLOP/s,
  reported as a fraction of the bfloat16 peak the same process measured just before (so a loaded machine loads
  both); ``--profile`` prints each step's top operators;
- **verification**: the target's forward over 1, 2, 4, ..., 64 new tokens after 512 cached (median of 5), both
  dtypes: what a verification step costs in plain decoding steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

METHODS = ("distillspec", "medusa", "medusa2", "eagle", "eagle3", "dflash", "layerskip", "cllm", "bita")
DTYPES = ("float32", "auto")
VERIFY_ROWS = (1, 2, 4, 8, 16, 32, 64)
# SmolLM2-135M-Instruct's shape (its config.json), so that the bench needs no import
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
               max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def config_of(spec: str | None):
    """The transformers config to build random models from: ``--config`` (a config.json or model directory), or
    SmolLM2-135M's shape."""
    import transformers

    cfg = transformers.LlamaConfig(**SMOLLM2) if spec is None else transformers.AutoConfig.from_pretrained(spec)
    cfg._attn_implementation = "sdpa"
    return cfg


def peak_gflops(dtype, size: int = 2048, seconds: float = 1.0) -> float:
    """GFLOP/s of a plain ``size``^3 product in ``dtype`` on this process's threads."""
    import torch

    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(2):
        a @ b
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        runs += 1
    return 2 * size**3 * runs / (time.perf_counter() - start) / 1e9


def matmul_flops(prof) -> tuple[float, float]:
    """``(FLOPs, self seconds)`` of the matrix products a ``torch.profiler`` run with ``with_flops`` recorded."""
    flops = seconds = 0.0
    for event in prof.key_averages():
        if event.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear"):
            flops += event.flops or 0
            seconds += event.self_cpu_time_total / 1e6
    return flops, seconds


def train_child(args) -> dict:
    """In the child: one method at one dtype; tokens/s over ``--steps`` steps and the profiled step's FLOPs."""
    import torch
    from bench_loss_memory import build
    from bench_memory_plan import _model, draft_config

    from draftsmith.common.precision import mixed_precision_flag, resolve_dtype

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    peak = peak_gflops(torch.bfloat16, seconds=0.5)  # this process's ceiling, under the load the step meets
    dtype = resolve_dtype(args.dtype, "cpu")
    flag = mixed_precision_flag(dtype)
    cfg = config_of(args.config)
    cfg.max_position_embeddings = max(cfg.max_position_embeddings, args.tokens // args.rows + 16)
    args.vocab, args.hidden = cfg.vocab_size, cfg.hidden_size
    target = _model(cfg, getattr(torch, dtype), "cpu").eval().requires_grad_(False)
    draft = _model(draft_config(cfg, args.draft_layers), torch.float32, "cpu") if args.method == "distillspec" else None
    kwargs = {flag: True} if flag else {}
    trainer, module, batch = build(args, args.method, target=target, draft=draft, **kwargs)
    module.train()
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-5)

    def step():
        loss = trainer.compute_loss(module, batch)  # the trainer's mixed precision (autocast) is inside
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    step()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    seconds = (time.perf_counter() - start) / args.steps
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        t0 = time.perf_counter()
        step()
        profiled = time.perf_counter() - t0
    flops, mm_seconds = matmul_flops(prof)
    top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12) if args.profile else ""
    tokens = int(batch["input_ids"].numel())
    return {"method": args.method, "dtype": args.dtype, "resolved": dtype, "mixed_precision": flag,
            "tokens": tokens, "step_seconds": seconds, "tokens_per_s": tokens / seconds, "loss": float(loss),
            "matmul_gflop": flops / 1e9, "matmul_seconds": mm_seconds, "profiled_seconds": profiled,
            "matmul_share": mm_seconds / profiled, "bf16_peak_gflops": peak, "top_ops": top}


def verify_child(args) -> dict:
    """In the child: the target's forward over n new tokens after ``--cached`` cached, median of 5, in ms."""
    import torch
    import transformers
    from bench_memory_plan import _model

    from draftsmith.common.precision import resolve_dtype

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, "cpu")
    cfg = config_of(args.config)
    model = _model(cfg, getattr(torch, dtype), "cpu").eval()
    ids = torch.randint(3, cfg.vocab_size, (1, args.cached + max(VERIFY_ROWS)))
    out = {}
    with torch.inference_mode():
        cache = transformers.DynamicCache(config=cfg)
        model(ids[:, :args.cached], past_key_values=cache, use_cache=True)
        for n in VERIFY_ROWS:
            times = []
            for _ in range(5):
                start = time.perf_counter()
                model(ids[:, args.cached:args.cached + n], past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - start)
                cache.crop(-n)
            out[str(n)] = sorted(times)[2] * 1e3
    return {"dtype": args.dtype, "resolved": dtype, "ms": out}


def child(args, part: str, **over) -> dict:
    """Run one part in a fresh process and read its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", part, "--child-out", out, "--output-dir", tmp]
        values = {**vars(args), **over}
        for name in ("threads", "tokens", "rows", "steps", "cached", "draft_layers", "method", "dtype", "config"):
            if values.get(name) is not None:
                cmd += [f"--{name.replace('_', '-')}", str(values[name])]
        if args.profile:
            cmd.append("--profile")
        run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        if run.returncode != 0:
            raise SystemExit(f"{part} {over}: the child failed:\n{run.stderr[-3000:]}")
        return json.load(open(out))


def tables(result: dict) -> str:
    peak = result["peak_gflops"]
    lines = [f"Plain 2048^3 product: float32 {peak['float32']:.0f} GFLOP/s, bfloat16 {peak['bfloat16']:.0f} GFLOP/s "
             f"({peak['bfloat16'] / peak['float32']:.2f}x).", "",
             "| method | tokens/step | float32 tokens/s | auto tokens/s | auto / float32 | matmul share of the step "
             "(float32 / auto) | matmul GFLOP/s (auto) | of the bf16 peak in the same process |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["method"], r["dtype"]): r for r in result["training"]}
    for method in result["methods"]:
        f, a = by[(method, "float32")], by[(method, "auto")]
        achieved = a["matmul_gflop"] / a["matmul_seconds"] if a["matmul_seconds"] else 0.0
        lines.append(f"| {method} | {a['tokens']} | {f['tokens_per_s']:.0f} | {a['tokens_per_s']:.0f} | "
                     f"{a['tokens_per_s'] / f['tokens_per_s']:.2f} | {f['matmul_share']:.2f} / {a['matmul_share']:.2f} | "
                     f"{achieved:.0f} | {achieved / a['bf16_peak_gflops']:.2f} |")
    v = {r["dtype"]: r for r in result["verification"]}
    lines += ["", "| new tokens after " + str(result["args"]["cached"]) + " cached | " +
              " | ".join(str(n) for n in VERIFY_ROWS) + " |", "|---|" + "---:|" * len(VERIFY_ROWS)]
    for dtype in DTYPES:
        ms = v[dtype]["ms"]
        lines.append(f"| {dtype} ({v[dtype]['resolved']}), ms | " + " | ".join(f"{ms[str(n)]:.1f}" for n in VERIFY_ROWS)
                     + " |")
        lines.append(f"| {dtype}, in its own 1-token steps | " +
                     " | ".join(f"{ms[str(n)] / ms['1']:.2f}" for n in VERIFY_ROWS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="config.json or model directory (default: SmolLM2-135M's shape)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=1024, help="tokens per training step (rows x sequence length)")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--steps", type=int, default=2, help="timed training steps after one warm-up step")
    p.add_argument("--cached", type=int, default=512, help="cached tokens before the verification forward")
    p.add_argument("--draft-layers", type=int, default=2, help="DistillSpec's draft: the target's config, this deep")
    p.add_argument("--profile", action="store_true", help="print each step's top operators (torch.profiler)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--child", default=None, choices=("train", "verify"), help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--output-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--method", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dtype", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        result = (train_child if args.child == "train" else verify_child)(args)
        json.dump(result, open(args.child_out, "w"))
        return 0
    import torch

    from draftsmith.common.precision import native_bf16

    torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m]
    result = {"args": vars(args), "methods": methods, "native_bf16": native_bf16("cpu"),
              "peak_gflops": {"float32": peak_gflops(torch.float32), "bfloat16": peak_gflops(torch.bfloat16)},
              "training": [], "verification": []}
    for method in methods:
        for dtype in DTYPES:
            r = child(args, "train", method=method, dtype=dtype)
            result["training"].append(r)
            print(f"{method} {dtype} ({r['resolved']}): {r['tokens_per_s']:.0f} tokens/s, matmul "
                  f"{r['matmul_share']:.0%} of the step", flush=True)
            if args.profile:
                print(r["top_ops"], flush=True)
    for dtype in DTYPES:
        result["verification"].append(child(args, "verify", dtype=dtype))
    text = tables(result)
    print(text)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        json.dump({**result, "table": text}, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
