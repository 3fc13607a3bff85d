"""DistillSpecTrainer side by side with TRL's GKDTrainer: training tokens/s and peak memory, same everything.

    python tests/benchmarks/bench_gkd.py --steps 100 --repeats 2 --json runs/bench_gkd/result.json
    python tests/benchmarks/bench_gkd.py --target DIR --draft DIR --tokenizer DIR --steps 5   # another pair

Both trainers distil the same draft into the same frozen target, on the same tokenized rows of the shipped
corpus, with the same ``TrainingArguments`` core (steps, batch, learning rate and schedule, seed, float32, no
gradient checkpointing, one torch thread) and the same divergence: forward KL, which is GKD's generalised
JSD at ``beta=0`` (``trl.experimental.gkd``: beta 0 = KL(teacher || student)) and DistillSpec's
``forward_kl``. GKD runs with ``lmbda=0`` and ``seq_kd=False``, i.e. on the fixed data only, like
DistillSpec's ``data_mode=fixed``; both get the same right-padding collator, so both see identical batches.

Each run is its own process (``--worker``), so the peak resident memory (``getrusage`` max RSS) belongs to
one trainer alone; it is reported whole and as the growth over the RSS after both models and the data were
loaded (what the training loop itself adds). Throughput counts the response tokens of the batches the
optimizer steps consumed, over the wall time from the end of the warm-up steps to the last step. Runs
alternate between trainers (``--repeats``), and the median of each is compared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINERS = ("draftsmith", "draftsmith-fused", "trl-gkd")

# ----------------------------------------------------------------------------------------------- pure helpers


def response_tokens(labels) -> int:
    """Tokens a causal LM is trained to predict in a ``[B, T]`` label batch (the trainer's response mask)."""
    from draftsmith.data.collate import response_mask

    return int(response_mask(labels).sum())


def throughput(step_ends: list[float], step_tokens: list[int], start: float, warmup: int) -> dict:
    """Tokens/s over the steps after ``warmup`` (steps ``warmup+1..n``, timed from the end of step ``warmup``,
    or from ``start`` when there is no warm-up). ``step_tokens[i]`` are the response tokens of step ``i+1``."""
    n = len(step_ends)
    if n <= warmup:
        raise ValueError(f"{n} steps timed, not more than the {warmup} warm-up steps: raise --steps or lower --warmup")
    t0 = step_ends[warmup - 1] if warmup > 0 else start
    seconds = step_ends[-1] - t0
    tokens = sum(step_tokens[warmup:n])
    return {"timed_steps": n - warmup, "timed_tokens": tokens, "timed_seconds": seconds,
            "tokens_per_s": tokens / seconds, "seconds_per_step": seconds / (n - warmup)}


def summarize(runs: list[dict]) -> dict:
    """Median tokens/s, peak RSS and RSS growth per trainer, and their ratios to TRL's GKDTrainer."""
    by: dict[str, dict] = {}
    for kind in TRAINERS:
        mine = [r for r in runs if r["trainer"] == kind]
        if not mine:
            continue
        by[kind] = {
            "runs": len(mine),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in mine),
            "training_rss_growth_mb": statistics.median(r["peak_rss_mb"] - r["loaded_rss_mb"] for r in mine),
            "first_losses": mine[0]["losses"][:3],
        }
    ref = by.get("trl-gkd")
    if ref:
        for s in by.values():
            s["speed_vs_gkd"] = s["tokens_per_s"] / ref["tokens_per_s"]
            s["peak_rss_vs_gkd"] = s["peak_rss_mb"] / ref["peak_rss_mb"]
            s["rss_growth_vs_gkd"] = s["training_rss_growth_mb"] / max(ref["training_rss_growth_mb"], 1e-9)
    return by


def markdown_table(summary: dict) -> str:
    lines = ["| trainer | tokens/s | vs GKDTrainer | peak RSS | training growth of RSS | first losses |",
             "|---|---|---|---|---|---|"]
    for kind, s in summary.items():
        losses = ", ".join(f"{x:.4f}" for x in s["first_losses"])
        lines.append(f"| {kind} | {s['tokens_per_s']:.0f} | {s.get('speed_vs_gkd', float('nan')):.2f}x | "
                     f"{s['peak_rss_mb']:.0f} MB ({s.get('peak_rss_vs_gkd', float('nan')):.2f}x) | "
                     f"{s['training_rss_growth_mb']:.0f} MB ({s.get('rss_growth_vs_gkd', float('nan')):.2f}x) | "
                     f"{losses} |")
    return "\n".join(lines)


def _rss_mb() -> float:
    """Peak resident memory of this process so far, MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------------------------------- worker


class CountingCollator:
    """Wraps a collator and records the response tokens of every batch it builds, in order (batch i feeds
    optimizer step i+1: the dataloader may build one batch ahead, never out of order)."""

    def __init__(self, inner):
        self.inner = inner
        self.tokens: list[int] = []

    def __call__(self, features):
        batch = self.inner(features)
        self.tokens.append(response_tokens(batch["labels"]))
        return batch


def _common_args(args: argparse.Namespace, out_dir: str) -> dict:
    return dict(
        output_dir=out_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0,
        seed=args.seed, use_cpu=True, bf16=False, fp16=False, activation_checkpointing=False,
        report_to="none", save_strategy="no", eval_strategy="no", logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False,
    )


def build_trainer(kind: str, args: argparse.Namespace, draft, target, tokenizer, train, collator, out_dir: str):
    """The trainer under test, configured identically apart from the class."""
    if kind == "trl-gkd":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        config = GKDConfig(**_common_args(args, out_dir), beta=0.0, lmbda=0.0, seq_kd=False, temperature=1.0,
                           max_length=args.max_length)
        return GKDTrainer(model=draft, teacher_model=target, args=config, train_dataset=train,
                          processing_class=tokenizer, data_collator=collator)
    import transformers

    from draftsmith.trainers.distillspec.trainer import DistillSpecConfig, DistillSpecTrainer

    distill = DistillSpecConfig(divergence="forward_kl", data_mode="fixed", temperature=1.0,
                                use_fused_kernel=kind == "draftsmith-fused")
    targs = transformers.TrainingArguments(**_common_args(args, out_dir))
    return DistillSpecTrainer(model=draft, teacher_model=target, method_config=distill, args=targs,
                              train_dataset=train, processing_class=tokenizer, data_collator=collator)


def worker(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    from draftsmith.common.models import load_model, load_tokenizer
    from draftsmith.common.registry import get_method
    from draftsmith.data.collate import PadCollator
    from draftsmith.data.corpus import load_corpus
    from draftsmith.data.datasets import examples_to_dataset
    from draftsmith.launch.recipe import resolve_models
    from draftsmith.launch.recipe_args import RecipeArguments
    from draftsmith.launch.targets import tokenizer_source

    torch.set_num_threads(args.threads)
    transformers.set_seed(args.seed)
    paths = resolve_models(RecipeArguments(target=args.target, draft=args.draft, tokenizer=args.tokenizer),
                           get_method("distillspec"))
    tokenizer = load_tokenizer(tokenizer_source(paths["target"], paths["tokenizer"]))
    target, draft = load_model(paths["target"]), load_model(paths["draft"])
    rows = load_corpus("train")[: args.examples]
    train, _ = examples_to_dataset(rows, tokenizer, args.max_length, 0.05, source="draftsmith corpus (train)")
    collator = CountingCollator(PadCollator(tokenizer.pad_token_id))

    step_ends: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, *_, **__):
            step_ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(args.worker, args, draft, target, tokenizer, train, collator, out_dir)
        trainer.add_callback(Clock())
        loaded = _rss_mb()
        start = time.perf_counter()
        trainer.train()
    peak = _rss_mb()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    result = {"trainer": args.worker, "steps": len(step_ends), "loaded_rss_mb": loaded, "peak_rss_mb": peak,
              "losses": losses, "torch": torch.__version__, "trl": _version("trl"),
              "transformers": transformers.__version__, "pair": paths}
    result.update(throughput(step_ends, collator.tokens[: len(step_ends)], start, args.warmup))
    return result


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# --------------------------------------------------------------------------------------------------- driver


def worker_command(kind: str, args: argparse.Namespace, result: Path) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--result", str(result)]
    for flag in ("steps", "warmup", "batch_size", "learning_rate", "seed", "examples", "max_length", "threads"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    for flag in ("target", "draft", "tokenizer"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag}", getattr(args, flag)]
    return cmd


def drive(args: argparse.Namespace) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               TOKENIZERS_PARALLELISM="false")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = args.trainers if repeat % 2 == 0 else list(reversed(args.trainers))
            for kind in order:
                result = Path(tmp) / f"{kind}-{repeat}.json"
                proc = subprocess.run(worker_command(kind, args, result), env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if proc.returncode != 0:
                    tail = "\n".join(proc.stdout.splitlines()[-30:])
                    raise RuntimeError(f"the {kind} run failed (exit {proc.returncode}):\n{tail}")
                run = json.loads(result.read_text())
                print(f"{kind} (run {repeat + 1}): {run['tokens_per_s']:.0f} tokens/s, peak RSS "
                      f"{run['peak_rss_mb']:.0f} MB (+{run['peak_rss_mb'] - run['loaded_rss_mb']:.0f} MB training), "
                      f"first loss {run['losses'][0]:.4f}", flush=True)
                runs.append(run)
    summary = summarize(runs)
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]), "settings": {
        k: getattr(args, k) for k in ("steps", "warmup", "batch_size", "learning_rate", "seed", "examples",
                                      "max_length", "threads", "repeats")}, "runs": runs, "summary": summary}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--examples", type=int, default=2000, help="corpus rows tokenized (the first N of the train split)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--repeats", type=int, default=2, help="runs per trainer, alternating the order")
    p.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    p.add_argument("--target", default=None, help="target model directory (default: the tiny zoo's)")
    p.add_argument("--draft", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--json", type=Path, default=None, help="write the runs and the summary here")
    p.add_argument("--worker", choices=TRAINERS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        p.error("pass --target and --draft together (or neither, for the tiny zoo pair)")
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        args.result.write_text(json.dumps(worker(args)) + "\n")
        return 0
    result = drive(args)
    table = markdown_table(result["summary"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        args.json.with_suffix(".md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
