"""The memory plan (``draftsmith memory``, :mod:`draftsmith.launch.memory_plan`) against measured peaks: one process,
the whole training state and two optimizer steps of each method on a random target of a real model's config.

    python tests/benchmarks/bench_memory_plan.py --config path/to/config.json --tokens 512      # CPU, float32
    python tests/benchmarks/bench_memory_plan.py --config llama-3.1-8b --device cuda --tokens 2048  # GPU, bfloat16
    python tests/benchmarks/bench_memory_plan.py --config path/to/config.json --sharding fsdp2 --processes 2  # CPU

``--config`` is a ``config.json`` (or a model directory) or a preset (``draftsmith.launch.memory_plan.PRESETS``:
the published shapes of Llama-3.2-1B, 3.1-8B and 3.1-70B). For each method, in its own fresh process: the target is built from the config with
random weights on the device in the frozen dtype (float32 on the CPU, bfloat16 on CUDA), the method's trained
module as its recipe builds it (DistillSpec: a draft of the target's config with ``--draft-layers`` layers, float32
master weights), the method's own trainer computes the loss (``compute_loss``) on a batch of ``--tokens`` tokens
(``--rows`` rows), and two AdamW steps run (the moments exist from the first). Measured: the peak of everything the
process allocated from before the models, on CUDA ``torch.cuda.max_memory_allocated``, on the CPU the peak resident
set (``VmHWM``) less the resident set before the models. Planned: the plan's one-GPU (``ddp``) total for the same
shapes. Reported per method: planned and measured GiB and their ratio.

``--sharding fsdp2``: each method runs as ``--processes`` processes under ``torchrun`` (gloo on the CPU), the trained
module sharded by its trainer (FSDP2: :mod:`draftsmith.trainers.cpu_fsdp` on CPU processes); measured: the largest
process's peak; planned: the plan's ``fsdp2`` total at that many processes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_loss_memory import build, reset_peak, status_mb  # noqa: E402

METHODS = ("distillspec", "medusa", "eagle", "eagle3", "dflash", "bita", "layerskip", "cllm")  # every recipe's
# trained module with its defaults (LayerSkip: the rotational curriculum the plan counts)


def target_config(spec: str, max_positions: int):
    """The transformers config of a preset, a ``config.json`` or a model directory, with sdpa attention."""
    import transformers

    from draftsmith.launch.memory_plan import PRESETS

    if spec in PRESETS:
        cfg = transformers.LlamaConfig(**{**PRESETS[spec], "max_position_embeddings": max_positions}, bos_token_id=1,
                                       eos_token_id=2, pad_token_id=0)
    else:
        cfg = transformers.AutoConfig.from_pretrained(spec)
    cfg._attn_implementation = "sdpa"
    return cfg


def draft_config(cfg, layers: int):
    import copy

    draft = copy.deepcopy(cfg)
    draft.num_hidden_layers = layers
    if getattr(draft, "layer_types", None):
        draft.layer_types = draft.layer_types[:layers]
    return draft


def _model(cfg, dtype, device):
    import torch
    import transformers

    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)


def _shrunk(cfg):
    """``cfg`` at a toy size (the same family and code paths)."""
    import copy

    small = copy.deepcopy(cfg)
    small.hidden_size, small.intermediate_size, small.num_hidden_layers = 64, 128, 4
    small.num_attention_heads, small.num_key_value_heads, small.head_dim, small.vocab_size = 4, 2, 16, 256
    if getattr(small, "layer_types", None):
        small.layer_types = small.layer_types[:4]
    return small


def _peak(args) -> float:
    """GiB: the CUDA allocator's peak, or the peak resident set less the resident set :func:`run_method` took before the models."""
    import torch

    if args.device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return (status_mb("VmHWM") - getattr(args, "rss_before_mb", 0.0)) / 1024


def steps(args, cfg, frozen, kwargs: dict, draft_layers: int) -> float:
    """Build the target, the method's trained module and its trainer, and run two AdamW steps; the last loss."""
    import torch

    args.vocab, args.hidden = cfg.vocab_size, cfg.hidden_size
    target = _model(cfg, frozen, args.device).eval().requires_grad_(False)
    draft = _model(draft_config(cfg, draft_layers), torch.float32, args.device) if args.method == "distillspec" else None
    trainer, module, batch = build(args, args.method, target=target, draft=draft, **kwargs)
    module = (module if getattr(trainer, "own_fsdp", False) else module.to(args.device)).train()  # sharded in place
    batch = {k: v.to(args.device) if hasattr(v, "to") else v for k, v in batch.items()}
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-5)
    args.built_gib = _peak(args)  # the models and the trainer: before any step
    for _ in range(2):
        loss = trainer.compute_loss(module, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.item()


def planned(method: str, config: str, device: str, tokens: int, draft_layers: int, mode: str = "ddp",
            processes: int = 1) -> dict[str, float]:
    """The plan's components for one device (``mode`` at ``processes`` processes; default one-GPU ``ddp``), GiB, for
    the bench's shapes and dtypes on ``device``."""
    import torch

    from draftsmith.kernels.reference import resolve_chunk_size
    from draftsmith.launch.memory_plan import count, plan

    cfg = target_config(config, 256)
    c = count(method, cfg, draft_config(cfg, draft_layers) if method == "distillspec" else None)
    rows = resolve_chunk_size(None, tokens, c.loss_vocab, cfg.hidden_size, torch.device(device))
    size = 2 if device == "cuda" else 4
    return {k: v / 2**30 for k, v in plan(c, mode, processes, tokens, size, size, rows).items()}


def replan(path: str) -> list[dict]:
    """The results of an earlier ``--json`` with the current plan beside their measurements (no measuring)."""
    saved = json.load(open(path))
    a = saved["args"]
    return [{**r, "planned": (p := planned(r["method"], a["config"], a["device"], a["tokens"], a["draft_layers"],
                                           "fsdp2" if r.get("sharding") == "fsdp2" else "ddp", r.get("processes", 1))),
             "planned_gib": p["total"]} for r in saved["results"]]


def run_method(args) -> dict:
    """In the child: build, two optimizer steps, the peak; and the plan for the same shapes."""
    import torch

    torch.manual_seed(0)
    cuda = args.device == "cuda"
    frozen = torch.bfloat16 if cuda else torch.float32
    cfg = target_config(args.config, max(256, args.tokens // args.rows + 16))
    from draftsmith.trainers.layerskip.trainer import LayerSkipConfig

    args.curriculum = LayerSkipConfig().curriculum  # the recipe's default, which the plan counts
    kwargs = {"use_cpu": not cuda, **({"bf16": True} if cuda else {})}
    sharded = args.sharding == "fsdp2"
    if sharded:
        kwargs |= {"fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 2}}
    small = argparse.Namespace(**{**vars(args), "tokens": 64})
    steps(small, _shrunk(cfg), frozen, kwargs, 1)  # loads every module's code first: the CPU's RSS counts it
    gc.collect()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak()
    args.rss_before_mb = status_mb("VmRSS")
    loss = steps(args, cfg, frozen, kwargs, args.draft_layers)
    measured = _peak(args)
    processes = 1
    if sharded:  # the largest process's peak
        import torch.distributed as dist

        processes = dist.get_world_size()
        peaks = torch.tensor([measured, args.built_gib], dtype=torch.float64)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        measured, args.built_gib = peaks.tolist()
    planned_gib = planned(args.method, args.config, args.device, args.tokens, args.draft_layers,
                          "fsdp2" if sharded else "ddp", processes)
    return {"method": args.method, "device": args.device, "tokens": args.tokens, "loss": loss,
            "sharding": args.sharding, "processes": processes,
            "measured_gib": measured, "measured_built_gib": args.built_gib, "planned_gib": planned_gib["total"],
            "planned": planned_gib}


def table(results: list[dict]) -> str:
    lines = ["| method | planned GiB | measured GiB | planned / measured | frozen | trained state | step | "
             "measured before the steps |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        p = r["planned"]
        step = p["target_forward"] + p["trained_activations"] + p["loss_chunk"]
        lines.append(f"| {r['method']} | {r['planned_gib']:.2f} | {r['measured_gib']:.2f} | "
                     f"{r['planned_gib'] / r['measured_gib']:.2f} | {p['frozen_weights']:.2f} | "
                     f"{p['trained_state']:.2f} | {step:.2f} | {r['measured_built_gib']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="a config.json, a model directory, or a preset of the plan's")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--tokens", type=int, default=512, help="tokens in the batch (rows x sequence length)")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--draft-layers", type=int, default=2, help="DistillSpec's draft: the target's config, this deep")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--sharding", default="none", choices=("none", "fsdp2"),
                   help="fsdp2: each method on --processes processes under torchrun, the trained module sharded")
    p.add_argument("--processes", type=int, default=2, help="with --sharding fsdp2: processes (gloo on the CPU)")
    p.add_argument("--json", default=None)
    p.add_argument("--method", default=None, help=argparse.SUPPRESS)  # the child's one method
    p.add_argument("--output-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--replan", metavar="JSON", default=None,
                   help="print an earlier --json's measurements beside the current plan, without measuring")
    args = p.parse_args(argv)
    if args.replan:
        print(table(replan(args.replan)))
        return 0
    if args.method:
        result = run_method(args)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(result))
        return 0
    results = []
    with tempfile.TemporaryDirectory() as out:
        for method in args.methods.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--method", method, "--output-dir", out]
            if args.sharding != "none":
                cmd[:1] = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node",
                           str(args.processes), "--master_port", str(29400 + len(results))]
            for name in ("config", "device", "tokens", "rows", "draft_layers", "sharding"):
                cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{method}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                continue
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"{method}: planned {results[-1]['planned_gib']:.2f} GiB, measured {results[-1]['measured_gib']:.2f}",
                  flush=True)
    print(table(results))
    if args.json:
        from draftsmith.common.io import atomic_write_json

        atomic_write_json(args.json, {"args": vars(args), "results": results})
    return 0 if len(results) == len(args.methods.split(",")) else 1


if __name__ == "__main__":
    sys.exit(main())
