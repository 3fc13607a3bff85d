"""Peak memory of one training step of every method's loss, against DistillSpec's chunked step (CPU).

    python tests/benchmarks/bench_loss_memory.py              # V=128,256, H=512, 2 layers, 4,096 tokens, float32
    python tests/benchmarks/bench_loss_memory.py --vocab 32000 --hidden 256 --tokens 1024 --json out.json

For each method a random Llama-style target (vocabulary ``V``, hidden ``H``, ``--layers`` decoder layers; EAGLE-3
fuses three layers and gets at least 4) and a batch of ``--tokens`` tokens (``--rows`` rows, a 16-token prompt each,
the rest labelled) are built; then ONE training step runs: the method's own trainer computes its loss
(``trainer.compute_loss``, the training path: the trainer's forwards, the chunked LM-head losses) and ``backward()``
follows. What each method trains (draft, heads, a copy of the target, embeddings) and its data:

- ``distillspec``: a 1-layer draft of the same vocabulary, forward-KL to the target (the fused chunked loss);
- ``medusa``: 4 heads on the frozen target (Medusa-1); ``medusa2``: the heads and a LoRA adapter of a copy of the
  target, the default self-distillation (KL to the original) plus the heads' CE;
- ``eagle``: the EAGLE-1 head (feature regression + soft CE); ``eagle3``: the EAGLE-3 head, 7 unrolled steps, an
  8,192-token draft vocabulary;
- ``layerskip``: a fully fine-tuned copy, every exit enabled (curriculum ``all``), layer dropout on;
- ``cllm``: a fully fine-tuned copy; each row is one Jacobi block covering its whole answer (consistency KL to the
  fixed point + label-smoothed AR loss, both over every answer position);
- ``bita``: prompt and mask embeddings (16 groups x 3 masks per row: their CE rows are far fewer than the tokens);
- ``distillspec-unchunked`` (not run unless asked for): DistillSpec with ``use_fused_kernel=false``, the full
  ``[N, V]`` logits of both models, for scale.

Memory: every method runs in its own fresh Python process. After the models, the trainer and the batch exist, the
process's peak resident set (``VmHWM``) is reset (``/proc/self/clear_refs``, Linux), the step runs, and the step's
memory is the peak RSS minus the RSS just before the step: what the loss, its activations and the gradients needed
(parameters, the target's copies and the batch are before it). Reported per method: that step memory, its ratio to
DistillSpec's, the absolute peak RSS and the step's time. One float32 ``[N, V]`` table is printed for scale.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

METHODS = ("distillspec", "medusa", "medusa2", "eagle", "eagle3", "layerskip", "cllm", "bita")
BASELINES = ("distillspec-unchunked",)  # run only when named in --methods
PROMPT = 16  # prompt tokens per row (unlabelled)


def status_mb(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status``, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} is not in /proc/self/status")


def reset_peak() -> bool:
    """Reset the process's peak RSS to its current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _target(args, layers: int):
    from draftsmith.data.tiny_models import random_model

    positions = max(256, args.tokens // args.rows + 16)
    model = random_model("llama", seed=0, vocab_size=args.vocab, hidden=args.hidden, layers=layers,
                         max_positions=positions)
    return model.requires_grad_(False)


def _batch(args, generator) -> dict:
    import torch

    t = args.tokens // args.rows
    ids = torch.randint(3, args.vocab, (args.rows, t), generator=generator)
    labels = ids.clone()
    labels[:, :PROMPT] = -100
    return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def build(args, method: str, target=None, draft=None, **training_kwargs):
    """``(trainer, trained module, batch)`` of ``method`` on a fresh random target (or ``target``; DistillSpec's draft
    ``draft``, else a 1-layer random one); ``training_kwargs`` go to the ``TrainingArguments`` (default: the CPU)."""
    import torch
    import transformers

    from draftsmith.data.tiny_models import random_model

    gen = torch.Generator().manual_seed(0)
    training = transformers.TrainingArguments(output_dir=args.output_dir, report_to=[], save_strategy="no",
                                              disable_tqdm=True, max_steps=10, **({"use_cpu": True} | training_kwargs))
    if target is None:
        target = _target(args, max(args.layers, 4) if method == "eagle3" else args.layers)
    batch = _batch(args, gen)
    common = dict(teacher_model=target, args=training)
    if method in ("distillspec", "distillspec-unchunked"):
        from draftsmith.trainers.distillspec.trainer import DistillSpecConfig, DistillSpecTrainer

        if draft is None:
            draft = random_model("llama", seed=1, vocab_size=args.vocab, hidden=args.hidden, layers=1,
                                 max_positions=target.config.max_position_embeddings)
        draft = draft.train()
        cfg = DistillSpecConfig(use_fused_kernel=False if method == "distillspec-unchunked" else None)
        return DistillSpecTrainer(model=draft, method_config=cfg, **common), draft, batch
    if method in ("medusa", "medusa2"):
        from draftsmith.trainers.medusa.trainer import MedusaConfig, MedusaTrainer, build_heads

        cfg = MedusaConfig(variant="medusa1" if method == "medusa" else "medusa2", data_mode="fixed")
        module = build_heads({"target": target}, cfg).train()
        return MedusaTrainer(model=module, method_config=cfg, **common), module, batch
    if method in ("eagle", "eagle3"):
        from draftsmith.inference.drafters.eagle import Eagle3Head, EagleHead, draft_vocab
        from draftsmith.trainers.eagle.trainer import Eagle3Training, EagleConfig, EagleTrainer

        if method == "eagle":
            cfg = EagleConfig(data_mode="fixed")
            module = EagleHead.for_target(target, fc_bias=True).train()
        else:
            cfg = EagleConfig(variant="eagle3", data_mode="fixed")
            counts = torch.randint(0, 1000, (args.vocab,), generator=gen)
            d2t, t2d = draft_vocab(counts, min(cfg.draft_vocab_size, args.vocab))
            module = Eagle3Training(Eagle3Head.for_target(target, d2t, t2d), recompute=cfg.ttt_recompute).train()
        return EagleTrainer(model=module, method_config=cfg, **common), module, batch
    if method == "dflash":
        from draftsmith.trainers.dflash.trainer import DFlashConfig, DFlashTrainer, build_dflash

        cfg = DFlashConfig(data_mode="fixed")
        module = build_dflash({"target": target}, cfg).train()
        trainer = DFlashTrainer(model=module, method_config=cfg, **common)
        return trainer, module, trainer.prepare_training_batch(module, batch, gen)  # the batch's blocks
    if method == "layerskip":
        from draftsmith.trainers.layerskip.trainer import LayerSkipConfig, LayerSkipTrainer, build_layerskip_model

        cfg = LayerSkipConfig(curriculum=getattr(args, "curriculum", "all"))  # bench_memory_plan: the default
        module = build_layerskip_model({"target": target}, cfg).train()
        return LayerSkipTrainer(model=module, method_config=cfg, **common), module, batch
    if method == "cllm":
        from draftsmith.trainers.cllm.trainer import CllmConfig, CllmTrainer, build_cllm_model

        cfg = CllmConfig()
        module = build_cllm_model({"target": target}, cfg).train()
        fixed = batch["input_ids"]
        state = fixed.clone()
        state[:, PROMPT:] = torch.randint(3, args.vocab, state[:, PROMPT:].shape, generator=gen)  # a Jacobi state
        consistency = (batch["labels"] != -100).long()
        batch = {**batch, "input_state": state, "input_next": state.clone(), "consistency_mask": consistency}
        return CllmTrainer(model=module, method_config=cfg, **common), module, batch
    if method == "bita":
        from draftsmith.trainers.bita.trainer import POINTS_KEY, BitaConfig, BitaTrainer, build_bita, insertion_points

        cfg = BitaConfig(data_mode="fixed")
        module = build_bita({"target": target}, cfg).train()
        batch = {**batch, POINTS_KEY: insertion_points(batch["labels"], cfg.groups, gen)}
        return BitaTrainer(model=module, method_config=cfg, **common), module, batch
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS + BASELINES)}")


def run_method(args) -> dict:
    """Runs in the child process: build, then one forward + backward of the method's training loss, measured."""
    import torch

    torch.manual_seed(0)
    trainer, module, batch = build(args, args.method)
    module.train()
    gc.collect()
    rss_before = status_mb("VmRSS")
    exact = reset_peak()
    start = time.perf_counter()
    loss = trainer.compute_loss(module, batch)
    loss.backward()
    seconds = time.perf_counter() - start
    peak = status_mb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"method": args.method, "loss": loss.item(), "seconds": seconds, "rss_before_mb": rss_before,
            "peak_rss_mb": peak, "step_mb": peak - rss_before, "peak_reset": exact,
            "loss_tokens": int(trainer.count_loss_tokens(batch))}


def child_command(args, method: str) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--method", method, "--output-dir", args.output_dir]
    for name in ("tokens", "rows", "hidden", "vocab", "layers"):
        cmd += [f"--{name}", str(getattr(args, name))]
    return cmd


def table(results: list[dict]) -> str:
    """The markdown table: method, step memory, ratio to DistillSpec's, peak RSS, time, loss tokens."""
    base = next((r["step_mb"] for r in results if r["method"] == "distillspec"), None)
    lines = ["| method | step peak (MB) | ratio to distillspec | peak RSS (MB) | step time (s) | loss tokens |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ratio = f"{r['step_mb'] / base:.2f}" if base else "-"
        lines.append(f"| {r['method']} | {r['step_mb']:.0f} | {ratio} | {r['peak_rss_mb']:.0f} | {r['seconds']:.1f} | "
                     f"{r['loss_tokens']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096, help="tokens in the batch (rows x sequence length)")
    p.add_argument("--rows", type=int, default=8, help="rows of the batch")
    p.add_argument("--hidden", type=int, default=512, help="H, the target's hidden size")
    p.add_argument("--vocab", type=int, default=128256, help="V, the vocabulary")
    p.add_argument("--layers", type=int, default=2, help="the target's decoder layers (EAGLE-3: at least 4)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated subset of " + ", ".join(METHODS + BASELINES))
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--output-dir", default=None, help=argparse.SUPPRESS)  # the trainers' (unused) output directory
    p.add_argument("--method", default=None, help=argparse.SUPPRESS)  # child mode
    args = p.parse_args(argv)
    if args.method is not None:
        print(json.dumps(run_method(args)))
        return 0
    methods = args.methods.split(",")
    if "distillspec" in methods:
        methods = ["distillspec"] + [m for m in methods if m != "distillspec"]
    print(f"V={args.vocab} H={args.hidden} layers={args.layers} tokens={args.tokens} ({args.rows} rows), float32; "
          f"one process per method; one [N, V] float32 table = {args.tokens * args.vocab * 4 / 2**20:.0f} MB",
          flush=True)
    results = []
    with tempfile.TemporaryDirectory() as out:
        args.output_dir = out
        for method in methods:
            run = subprocess.run(child_command(args, method), capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{method}: failed\n{run.stderr[-3000:]}", file=sys.stderr)
                return 1
            r = json.loads(run.stdout.strip().splitlines()[-1])
            results.append(r)
            print(f"{method:>12}: step {r['step_mb']:7.0f} MB | peak RSS {r['peak_rss_mb']:7.0f} MB | "
                  f"{r['seconds']:6.1f} s | loss {r['loss']:.4f}", flush=True)
    print(table(results))
    if args.json:
        config = {k: v for k, v in vars(args).items() if k not in ("method", "output_dir")}
        from draftsmith.common.io import atomic_write_json

        atomic_write_json(args.json, {"config": config, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
