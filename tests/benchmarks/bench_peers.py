"""Against the peers: draftsmith's EAGLE-3 head and vllm-project/speculators' trainer on the same rows, the same
hidden states, the same draft vocabulary, steps, schedule and seed, both heads judged by the same vLLM.

    python tests/benchmarks/bench_peers.py setup                      # the peer's own environment, pinned, recorded
    python tests/benchmarks/bench_peers.py run --steps 300 --out runs/bench/peers   # the tiny zoo, one budget
    python tests/benchmarks/bench_peers.py run --target smollm2 --steps 400          # SmolLM2 (its cached features)

``setup`` makes ``DRAFTSMITH_HOME/peers/speculators`` (a venv: torch and transformers inside speculators' pins,
speculators without its CUDA-only extras) and records the versions it imports in ``draftsmith-peer.json``. ``run``:

1. trains draftsmith's EAGLE-3 (``launch/configs/recipes/eagle3_tiny.yaml``, or ``eagle3_smollm2.yaml`` with ``--target
   smollm2``; features cached offline) for ``--steps``;
2. converts that cache, unchanged, to speculators' offline format (``peers/to_speculators.py``) and writes the
   draftsmith head's draft vocabulary as speculators' ``d2t``/``t2d``;
3. trains speculators' EAGLE-3 on it through ``peers/speculators_cpu.py`` (its CPU adaptation) with the same steps,
   learning rate, warm-up, cosine schedule, seed, training-time-test depth and tokens per step (speculators packs
   rows into one sequence per step: ``--total-seq-len`` is draftsmith's batch of rows times their mean length);
4. exports draftsmith's head for vLLM (``--format eagle3``) and serves both heads with vLLM 0.32.0's ``eagle3`` on the
   same held-out dev questions: acceptance by position, tau and identity to vLLM's AR;
5. reports each trainer's training tokens/s (the rows' tokens over the training's own runtime, the feature cache
   excluded on both sides) and peak RSS, one thread each, one after the other.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = Path(__file__).with_name("peers")
SPECULATORS = {  # what `setup` installs: the peer without its CUDA-only dependencies (torchaudio, torchvision)
    "speculators": "0.9.0", "hs-connectors": "0.9.0", "torch": "2.13.0", "transformers": "5.19.0"}
SPECULATORS_DEPS = ("aiohttp", "click", "datasets<=5.1.0,>=4.0.0", "httpx", "huggingface-hub", "loguru<=0.7.3,>=0.7.2",
                    "numpy<=2.5.4,>=2.0.0", "openai>=2.0.0", "protobuf", "psutil", "pydantic>=2.0.0",
                    "pydantic-settings>=2.0.0", "rich", "safetensors", "tqdm<=4.70.1,>=4.66.3", "typer>=0.12.0")
SPECFORGE = {"specforge": "0.2.0", "torch": "2.11.0", "transformers": "5.8.1"}  # its pins; sglang left out
SPECFORGE_DEPS = ("datasets", "tqdm", "accelerate", "huggingface-hub", "numpy", "pydantic", "psutil", "pyyaml",
                  "safetensors", "requests", "tensorboard", "typing-extensions")
PEERS = {"speculators": (SPECULATORS, SPECULATORS_DEPS), "specforge": (SPECFORGE, SPECFORGE_DEPS)}
RECORD = "draftsmith-peer.json"


def peer_dir(name: str = "speculators") -> Path:
    from draftsmith.common.paths import draftsmith_home

    return draftsmith_home() / "peers" / name


def peer_python(name: str = "speculators") -> Path:
    python = peer_dir(name) / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"no {name} environment at {python.parent.parent}: run `python {__file__} setup`")
    return python


def setup(name: str) -> dict:
    """The environment of peer ``name`` under DRAFTSMITH_HOME/peers: a venv with the peer's own pins (the peer
    installed without its dependencies, which pull CUDA-only or serving packages, then the plain ones); the versions
    it imports recorded in ``draftsmith-peer.json``."""
    pins, deps = PEERS[name]
    directory = peer_dir(name)
    python = directory / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
    framework = [f"{p}=={v}" for p, v in pins.items() if p in ("torch", "transformers")]
    own = [f"{p}=={v}" for p, v in pins.items() if p not in ("torch", "transformers")]
    for step in (framework, ["--no-deps", *own], list(deps)):
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *step], check=True)
    probe = f"import json, importlib.metadata as m; print(json.dumps({{p: m.version(p) for p in {sorted(pins)!r}}}))"
    versions = json.loads(subprocess.run([str(python), "-c", probe], check=True, capture_output=True,
                                         text=True).stdout)
    record = {"peer": name, "versions": versions, "python": str(python),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (directory / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


def timed(argv: list[str], log: Path, env: dict | None = None) -> dict:
    """Run ``argv`` (output to ``log``); its wall seconds and peak RSS (MiB, the process and what it waited for)."""
    start = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                                     **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed: see {log}")
    return {"seconds": time.perf_counter() - start, "peak_rss_mib": usage.ru_maxrss / 1024}


def once(path: Path, make) -> dict:
    """``make()``'s result, kept in ``path`` so that a rerun of the bench does not train again."""
    if path.is_file():
        return json.loads(path.read_text())
    result = make()
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def train_draftsmith(out: Path, steps: int, examples: int | None = None, target: str = "tiny",
                     recipe: str = "eagle", cache: Path | None = None, overrides: tuple[str, ...] = ()) -> dict:
    """draftsmith's ``recipe`` on the target's config (``dflash``: dflash_tiny.yaml) from the cache under ``cache``
    (default :func:`cache_root`), with the config's ``overrides`` (``key=value``); the Trainer's own runtime and
    epochs, for its tokens/s. No held-out evaluation inside the run (vLLM judges the heads; neither peer's rate
    counts one)."""
    run = out / "draftsmith"
    config = "dflash_tiny.yaml" if recipe == "dflash" else TARGETS[target]
    argv = [str(ROOT / ".venv" / "bin" / "draftsmith"), "train", recipe, "--config",
            str(ROOT / "launch" / "configs" / "recipes" / config), "features=offline",
            f"feature_cache_dir={cache or cache_root(out, target)}", f"output_dir={run}", f"max_steps={steps}",
            "evaluate=false", "tune=false", "report_to=none", f"save_steps={steps}", "eval_strategy=no",
            *(["calibrate_tree=false"] if recipe == "eagle" else []),
            *([f"max_train_examples={examples}"] if examples else []),
            *([f"draft_vocab_prompts={min(examples, 512)}"] if examples and recipe == "eagle" else []), *overrides]
    process = timed(argv, out / "draftsmith_train.log")
    state = json.loads((run / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    ended = re.findall(r"'train_runtime': '([0-9.]+)'", (out / "draftsmith_train.log").read_text())  # the Trainer's
    return {"process": process, "train_runtime": float(ended[-1]), "epochs": state["epoch"],
            "artefact": str(run / "artefact"), "overrides": list(overrides)}


def train_cache(out: Path, target: str = "tiny") -> Path:
    """The training rows' cache: the largest cache of EAGLE-3's layers (three auxiliary ones and the last) of this
    target under the run's cache root (the held-out rows' is the smaller)."""
    from transformers import AutoConfig

    from draftsmith.inference.drafters.eagle import aux_layers

    model = target_dirs(target)[0]
    layers = [*aux_layers(AutoConfig.from_pretrained(model).num_hidden_layers), -1]
    manifests = [json.loads(p.read_text()) | {"dir": p.parent} for p in cache_root(out, target).glob("*/manifest.json")]
    found = [(m["rows"], m["dir"]) for m in manifests if m.get("complete") and m["layers"] == layers
             and Path(m["target"]["name_or_path"]).resolve() == model.resolve()]
    return max(found)[1]


def convert(out: Path, artefact: Path, target: str = "tiny") -> dict:
    """The cache and the head's draft vocabulary in speculators' formats; the rows' count and mean length."""
    import numpy as np
    from safetensors.torch import load_file

    cache, data = train_cache(out, target), out / "speculators_data"
    if not (data / "dataset_info.json").is_file():
        subprocess.run([str(peer_python()), str(PEERS_DIR / "to_speculators.py"), str(cache),
                        str(target_dirs(target)[0]), str(data)], check=True, cwd=ROOT)
    heads = load_file(str(artefact / "heads.safetensors"))
    np.save(out / "d2t.npy", heads["d2t"].numpy())
    np.save(out / "t2d.npy", heads["t2d"].numpy())
    manifest = json.loads((cache / "manifest.json").read_text())
    return {"rows": manifest["rows"], "tokens": manifest["tokens"], "mean_length": manifest["tokens"] / manifest["rows"],
            "draft_vocab": int(heads["d2t"].numel())}


TARGETS = {"tiny": "eagle3_tiny.yaml", "smollm2": "eagle3_smollm2.yaml"}  # --target: the recipe config it trains


def target_dirs(target: str) -> tuple[Path, Path]:
    """``(model directory, tokenizer directory)`` of ``--target``: the tiny zoo's target (its tokenizer beside it), or
    SmolLM2-135M-Instruct (imported on first use; its tokenizer in its own directory)."""
    from draftsmith.common.models import resolve_model_path
    from draftsmith.launch.targets import tokenizer_source

    model = Path(resolve_model_path("smollm2-135m")) if target == "smollm2" else tiny_target()
    return model, Path(tokenizer_source(str(model)))


def tiny_target() -> Path:
    from draftsmith.common.paths import zoo_dir

    return zoo_dir("tiny") / "target"


def cache_root(out: Path, target: str) -> Path:
    """Where draftsmith's run writes (or finds) its feature cache: the bench's own folder for the tiny zoo, the shared
    default (``DRAFTSMITH_HOME/features``) for SmolLM2, whose cache the recipe's own runs already built."""
    from draftsmith.common.paths import features_dir

    return features_dir() if target == "smollm2" else out / "cache"


def rows_per_step(config: dict) -> int:
    """The rows of one optimizer step of draftsmith's config (its per-device batch times its accumulated
    micro-batches): what every peer is given a step."""
    return int(config["per_device_train_batch_size"]) * int(config.get("gradient_accumulation_steps", 1))


def peer_epochs(steps: int, config: dict, rows: int) -> int:
    """Epochs a peer is allowed so that it runs all ``steps`` (both stop at the end of their epochs even under a
    step cap, and both decay their schedule over the step cap): the steps' rows over the data's, one more as slack."""
    return -(-int(steps) * rows_per_step(config) // max(1, int(rows))) + 1


def train_speculators(out: Path, steps: int, data: dict, config: dict, target: str = "tiny") -> dict:
    """speculators' EAGLE-3 with draftsmith's settings (``config``: the target's recipe config)."""
    from transformers import AutoConfig

    from draftsmith.inference.drafters.eagle import aux_layers

    model = target_dirs(target)[0]
    layers = aux_layers(AutoConfig.from_pretrained(model).num_hidden_layers)
    save = out / "speculators"
    metrics = out / "speculators_metrics.jsonl"
    metrics.unlink(missing_ok=True)
    per_step = round(rows_per_step(config) * data["mean_length"])
    argv = [str(peer_python()), str(PEERS_DIR / "speculators_cpu.py"), "--speculator-type", "eagle3",
            "--verifier-name-or-path", str(model), "--data-path", str(out / "speculators_data"),
            "--hidden-states-path", str(out / "speculators_data" / "hidden_states"), "--on-missing", "raise",
            "--target-layer-ids", *map(str, layers), "--draft-vocab-size", str(data["draft_vocab"]),
            "--d2t-path", str(out / "d2t.npy"), "--t2d-path", str(out / "t2d.npy"), "--num-layers", "1",
            "--full-attention-indices", "0", "--no-norm-before-fc", "--no-norm-output",
            "--total-seq-len", str(per_step), "--optimizer", "adamw", "--lr", str(config["learning_rate"]),
            "--weight-decay", str(config["weight_decay"]), "--scheduler-type", "cosine",
            "--scheduler-warmup-ratio", str(min(int(config["warmup_steps"]) / steps, 0.99)), "--epochs",
            str(peer_epochs(steps, config, data["rows"])),
            "--max-steps", str(steps), "--ttt-steps", str(config["ttt_steps"]), "--seed", str(config["seed"]),
            "--save-path", str(save), "--no-resume-from-checkpoint", "--loss-implementation", "eager",
            "--draft-attn-impl", "sdpa", "--hidden-states-dtype", "bfloat16", "--num-workers", "0",
            "--train-data-ratio", "0.98", "--mask-token-id", "0", "--log-freq", "10"]
    process = timed(argv, out / "speculators_train.log", env={"METRICS_JSONL": str(metrics)})
    checkpoint = max((p for p in save.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    return {"process": process, "tokens_per_s": speculators_rate(metrics), "tokens_per_step": per_step,
            "checkpoint": str(checkpoint)}


def speculators_rate(metrics: Path) -> float | None:
    """speculators' own per-step ``tokens_per_s`` (the step alone, data loading excluded), averaged."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    rates = [r["profile"]["tokens_per_s"] for r in records if isinstance(r.get("profile"), dict)
             and r["profile"].get("tokens_per_s")]
    return sum(rates) / len(rates) if rates else None


def specforge_inputs(out: Path, artefact: Path, export: Path, target: str = "tiny") -> Path:
    """What SpecForge reads besides the features: the target with the weight index it requires, the draft's config
    (draftsmith's exported head config: one Llama layer of the target's shape, the aux layers vLLM reads) and the
    draft vocabulary of draftsmith's head. Returns the folder holding them."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    root, model = out / "specforge_inputs", target_dirs(target)[0]
    linked = root / "target"
    linked.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (model / name).exists() and not (linked / name).exists():
            (linked / name).symlink_to(model / name)
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    (linked / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: "model.safetensors" for n in names}}))
    draft = json.loads((export / "config.json").read_text())
    draft["target_hidden_size"] = draft["hidden_size"]
    (root / "draft.json").write_text(json.dumps(draft, indent=1))
    heads = load_file(str(artefact / "heads.safetensors"))
    torch.save({"d2t": heads["d2t"], "t2d": heads["t2d"]}, root / "vocab_mapping.pt")
    return root


def train_specforge(out: Path, steps: int, config: dict, inputs: Path, target: str = "tiny", rows: int = 1) -> dict:
    """SpecForge's EAGLE-3 with draftsmith's settings on the converted features; exported for vLLM."""
    import yaml

    features = out / "specforge_data"
    if not (features / "rows").is_dir():
        subprocess.run([str(peer_python("specforge")), str(PEERS_DIR / "to_specforge.py"), str(train_cache(out, target)),
                        str(features)], check=True, cwd=ROOT)
    run_config = {
        "run_id": "bench", "output_dir": str(out / "specforge"),
        "model": {"target_model_path": str(inputs / "target"), "draft_model_config": str(inputs / "draft.json"),
                  "lm_head_key": "model.embed_tokens.weight", "vocab_mapping_path": str(inputs / "vocab_mapping.pt"),
                  "torch_dtype": "bfloat16"},
        "data": {"hidden_states_path": str(features), "max_length": int(config["max_length"]),
                 "dataloader_num_workers": 0, "cache_dir": str(out / "specforge_cache")},
        "training": {"strategy": "eagle3", "attention_backend": "sdpa", "fsdp_sharding": "NO_SHARD",
                     "batch_size": rows_per_step(config), "accumulation_steps": 1,
                     "learning_rate": float(config["learning_rate"]), "lr_scheduler": "cosine",
                     "warmup_ratio": min(int(config["warmup_steps"]) / steps, 0.99),
                     "num_epochs": peer_epochs(steps, config, rows),
                     "max_steps": steps, "ttt_length": int(config["ttt_steps"]), "seed": int(config["seed"]),
                     "log_interval": min(10, steps), "save_interval": 0}}
    (out / "specforge_run.yaml").write_text(yaml.safe_dump(run_config))
    launcher = [str(peer_python("specforge")), str(PEERS_DIR / "specforge_cpu.py")]
    process = timed([*launcher, "train", "--config", str(out / "specforge_run.yaml")], out / "specforge_train.log")
    logged = [ast.literal_eval(m) for m in re.findall(r"step \d+: (\{.*\})",
                                                                      (out / "specforge_train.log").read_text())]
    rates = [r["perf/global_samples_per_second"] for r in logged if r.get("perf/global_samples_per_second")]
    checkpoint = max((p for p in (out / "specforge").glob("bench-step*") if p.is_dir()),
                     key=lambda p: int(p.name.rsplit("step", 1)[1]))
    export = out / "specforge_export"
    timed([*launcher, "export", "--to", "sglang", "--checkpoint", str(checkpoint), "--draft-config",
           str(inputs / "draft.json"), "--output-dir", str(export)], out / "specforge_export.log")
    return {"process": process, "samples_per_s": sum(rates) / len(rates) if rates else None,
            "checkpoint": str(export), "logged": logged[-1:] if logged else []}


def judge(heads: dict[str, str], limit: int, max_new_tokens: int, k: int, concurrency: list[int],
          target: str = "tiny", method: str = "eagle3") -> dict:
    """Each head served by vLLM (``method``, ``k`` tokens) on the same dev questions' first turns, and its output
    tokens/s against vLLM's AR in waves of each ``concurrency``."""
    from dataclasses import replace

    import transformers

    from draftsmith.inference.engines.environment import engine_python, engine_versions
    from draftsmith.inference.engines.evaluate import engine_evaluate
    from draftsmith.inference.engines.vllm import EngineMethod
    from draftsmith.inference.evaluation.questions import read_questions

    python = engine_python()
    versions = engine_versions(python)
    model_dir, tokenizer_dir = target_dirs(target)
    verifier = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    questions = [replace(q, turns=q.turns[:1]) for q in read_questions("dev", limit=limit)]
    out, references = {"vllm": versions}, {}  # the plain-decoding runs, decoded once for every head
    for name, head in heads.items():
        engine = EngineMethod({"method": method, "model": head, "num_speculative_tokens": k}, {})
        report = engine_evaluate(verifier, tokenizer, questions, engine, python=python, model_dir=str(model_dir),
                                 tokenizer_dir=str(tokenizer_dir), max_new_tokens=max_new_tokens, threads=1,
                                 concurrency=concurrency, references=references)
        out[name] = report["summary"] | {"throughput": report["throughput"]}
    return out


def run_dflash(args: argparse.Namespace) -> dict:
    """DFlash against speculators' ``dflash`` on the tiny zoo: the EAGLE-3 bench's rows and cache (its layers 1, 2, 3
    and the last hold DFlash's 1 and 3, and the last layer speculators' targets come from), dflash_tiny.yaml's
    settings on both sides (2 Qwen3 layers, blocks of 8, anchors, CE decayed exp(-(k-1)/4)), served by vLLM's
    ``dflash`` with the block's 7 tokens."""
    import yaml

    caches = sorted(Path(args.out).glob("steps*/cache"))
    if not caches:
        raise SystemExit(f"no EAGLE-3 bench cache under {args.out}: run `bench_peers.py run` (EAGLE-3) first")
    out = Path(args.out) / "dflash" / f"steps{args.steps}"
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "launch" / "configs" / "recipes" / "dflash_tiny.yaml").read_text())
    ours = once(out / "draftsmith.json", lambda: train_draftsmith(out, args.steps, args.examples, recipe="dflash",
                                                                  cache=caches[0], overrides=tuple(args.set)))
    cache = train_cache(caches[0].parent)
    manifest = json.loads((cache / "manifest.json").read_text())
    ours["tokens_per_s"] = manifest["tokens"] * ours["epochs"] / ours["train_runtime"]
    from transformers import AutoConfig

    from draftsmith.inference.drafters.dflash import dflash_layers

    layers = list(dflash_layers(AutoConfig.from_pretrained(tiny_target()).num_hidden_layers, int(config["draft_layers"])))
    data = out / "speculators_data"
    if not (data / "dataset_info.json").is_file():
        subprocess.run([str(peer_python()), str(PEERS_DIR / "to_speculators.py"), str(cache), str(tiny_target()),
                        str(data), ",".join(map(str, layers))], check=True, cwd=ROOT)
    per_step = round(rows_per_step(config) * manifest["tokens"] / manifest["rows"])
    from draftsmith.trainers.dflash.trainer import DFlashConfig

    save = out / "speculators"
    argv = [str(peer_python()), str(PEERS_DIR / "speculators_cpu.py"), "--speculator-type", "dflash",
            "--verifier-name-or-path", str(tiny_target()), "--data-path", str(data), "--hidden-states-path",
            str(data / "hidden_states"), "--on-missing", "raise", "--target-layer-ids", *map(str, layers),
            "--num-layers", str(config["draft_layers"]), "--full-attention-indices",
            *map(str, range(int(config["draft_layers"]))), "--sliding-window-non-causal", "--block-size",
            str(config["block_size"]), "--max-anchors",
            str(int(config["anchors"]) * rows_per_step(config)),
            "--mask-token-id", "0", "--loss-fn", "ce", "--per-position-loss-weight", "fixed-exp-decay",
            "--dflash-decay-gamma", str(DFlashConfig(block_size=int(config["block_size"]),
                                                     loss_gamma=float(config["loss_gamma"])).gamma()), "--total-seq-len", str(per_step), "--optimizer",
            "adamw", "--lr", str(config["learning_rate"]), "--weight-decay", str(config["weight_decay"]),
            "--scheduler-type", "cosine", "--scheduler-warmup-ratio",
            str(min(int(config["warmup_steps"]) / args.steps, 0.99)), "--epochs",
            str(peer_epochs(args.steps, config, manifest["rows"])), "--max-steps", str(args.steps),
            "--seed", str(config["seed"]), "--save-path", str(save), "--no-resume-from-checkpoint",
            "--loss-implementation", "eager", "--draft-attn-impl", "sdpa", "--hidden-states-dtype", "bfloat16",
            "--num-workers", "0", "--train-data-ratio", "0.98", "--log-freq", "10"]
    metrics = out / "speculators_metrics.jsonl"
    theirs = once(out / "speculators.json", lambda: {
        "process": timed(argv, out / "speculators_train.log", env={"METRICS_JSONL": str(metrics)}),
        "tokens_per_s": speculators_rate(metrics), "tokens_per_step": per_step,
        "checkpoint": str(max((p for p in save.iterdir() if p.is_dir() and p.name.isdigit()),
                              key=lambda p: int(p.name)))})
    export = out / "draftsmith_dflash"
    if not (export / "config.json").is_file():
        subprocess.run([str(ROOT / ".venv" / "bin" / "draftsmith"), "export", "--artefact", ours["artefact"],
                        "--format", "vllm-dflash", "--out", str(export)], check=True, cwd=ROOT)
    result = {"method": "dflash", "steps": args.steps, "draftsmith": ours, "speculators": theirs}
    heads = {"draftsmith": str(export), "speculators": theirs["checkpoint"]}
    result["served"] = judge(heads, args.limit, args.max_new_tokens, int(config["block_size"]) - 1, [],
                             method="dflash") if args.judge else {}
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def run(args: argparse.Namespace) -> dict:
    import yaml

    target = args.target
    out = Path(args.out) / ("" if target == "tiny" else target) / f"steps{args.steps}"
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "launch" / "configs" / "recipes" / TARGETS[target]).read_text())
    ours = once(out / "draftsmith.json", lambda: train_draftsmith(out, args.steps, args.examples, target,
                                                                  overrides=tuple(args.set)))
    data = convert(out, Path(ours["artefact"]), target)
    theirs = once(out / "speculators.json", lambda: train_speculators(out, args.steps, data, config, target))
    ours["tokens_per_s"] = data["tokens"] * ours["epochs"] / ours["train_runtime"]
    export = out / "draftsmith_eagle3"
    if not (export / "config.json").is_file():
        subprocess.run([str(ROOT / ".venv" / "bin" / "draftsmith"), "export", "--artefact", ours["artefact"],
                        "--format", "eagle3", "--out", str(export)], check=True, cwd=ROOT)
    heads = {"draftsmith": str(export), "speculators": theirs["checkpoint"]}
    result = {"target": target, "steps": args.steps, "data": data, "draftsmith": ours, "speculators": theirs}
    if "specforge" in args.peers.split(","):
        inputs = specforge_inputs(out, Path(ours["artefact"]), export, target)
        forge = once(out / "specforge.json", lambda: train_specforge(out, args.steps, config, inputs, target,
                                                                    rows=data["rows"]))
        forge["tokens_per_s"] = forge["samples_per_s"] and forge["samples_per_s"] * data["mean_length"]
        result["specforge"], heads["specforge"] = forge, forge["checkpoint"]
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()] if args.concurrency else []
    result["served"] = judge(heads, args.limit, args.max_new_tokens, args.draft_length, levels, target) \
        if args.judge else {}
    result["peers"] = {name: json.loads((peer_dir(name) / RECORD).read_text()) for name in PEERS
                       if (peer_dir(name) / RECORD).is_file()}
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def table(result: dict) -> str:
    rows = ["| trainer | tau (vLLM) | acceptance by position (vLLM) | identical to AR | training tokens/s | peak RSS |",
            "|---|---|---|---|---|---|"]
    for name in (n for n in ("draftsmith", "speculators", "specforge") if n in result):
        s = result["served"].get(name, {})
        by_pos = " / ".join(f"{a:.3f}" for a in s.get("acceptance_by_position") or [])
        rows.append(f"| {name} | {s.get('mean_acceptance_length') or float('nan'):.3f} | {by_pos or '-'} | "
                    f"{s.get('identical_to_engine_ar')} | "
                    f"{result[name].get('tokens_per_s') or float('nan'):.0f} | "
                    f"{result[name]['process']['peak_rss_mib']:.0f} MiB |")
    measured = [v["throughput"] for v in result["served"].values() if isinstance(v, dict) and v.get("throughput")]
    levels = [t["concurrency"] for t in measured[0]] if measured else []
    if levels:
        rows += ["", "| head | " + " | ".join(f"speedup at concurrency {c}" for c in levels) + " |",
                 "|---|" + "---|" * len(levels)]
        for name, served in result["served"].items():
            if isinstance(served, dict) and served.get("throughput"):
                rows.append(f"| {name} | " + " | ".join(f"{t['speedup']:.3f}" if t.get("speedup") else "-"
                                                        for t in served["throughput"]) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("setup", help="make the peers' environments (pinned versions, recorded)")
    st.add_argument("peer", nargs="?", choices=(*PEERS, "all"), default="all")
    r = sub.add_parser("run", help="train both, serve both, compare")
    r.add_argument("--target", choices=tuple(TARGETS), default="tiny",
                   help="the tiny zoo (eagle3_tiny.yaml) or SmolLM2-135M-Instruct (eagle3_smollm2.yaml)")
    r.add_argument("--steps", type=int, default=300, help="optimizer steps of each trainer (eagle3_tiny.yaml's: 300; "
                   "eagle3_smollm2.yaml's: 400)")
    r.add_argument("--examples", type=int, default=None, help="training rows (default: the config's)")
    r.add_argument("--method", choices=("eagle3", "dflash"), default="eagle3",
                   help="eagle3 (draftsmith, speculators, SpecForge) or dflash (draftsmith and speculators' dflash, "
                   "the tiny zoo, on the EAGLE-3 bench's rows: run that first)")
    r.add_argument("--no-judge", dest="judge", action="store_false",
                   help="train and time only (no vLLM): the side-by-side training speed")
    r.add_argument("--limit", type=int, default=40, help="held-out dev questions vLLM answers")
    r.add_argument("--max-new-tokens", type=int, default=64)
    r.add_argument("--draft-length", type=int, default=5, help="vLLM's num_speculative_tokens")
    r.add_argument("--out", default="runs/bench/peers")
    r.add_argument("--peers", default="speculators,specforge", help="which peers train besides draftsmith")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a draftsmith config override (repeatable), e.g. step_decay=0.8; recorded in the result")
    r.add_argument("--concurrency", default="", help="also vLLM's output tokens/s with each head against its AR "
                   "at these concurrencies, e.g. 1,4,16")
    args = parser.parse_args(argv)
    if args.command == "setup":
        for name in PEERS if args.peer == "all" else [args.peer]:
            print(json.dumps(setup(name), indent=1))
        return 0
    result = run_dflash(args) if args.method == "dflash" else run(args)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
