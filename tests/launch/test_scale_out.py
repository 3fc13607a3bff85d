"""Every recipe past one process, on 2 CPU processes (gloo), slow.

DeepSpeed ZeRO-3 (``deepspeed``, launch/configs/deepspeed/zero3.json): each run trains 2 steps and checkpoints, is
resumed to step 3 with the evaluation after training on (the main process loads the target whole; the other
process has finished), all within a timeout, so a hang fails the test; its artefact has the layout of the
one-process run's, and its first two losses are within 2% of the one-process run's at the same global batch.

FSDP: accelerate (under ``accelerate launch`` and under ``torchrun`` with the Trainer's ``--fsdp``) applies FSDP only
to GPU processes and runs CPU processes as DDP; the run says so and its manifest records what ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_pair import write_pair

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RECIPES = ("distillspec", "medusa", "medusa2", "eagle", "eagle3", "dflash", "layerskip", "cllm")
VARIANTS = {"eagle3": ("eagle", ["--variant", "eagle3", "ttt_steps=3", "draft_vocab_size=64"]),  # on a 4-layer target
            "medusa2": ("medusa", ["variant=medusa2"])}
TIMEOUT = 1500  # seconds per launch: a rank left waiting on a collective ends here, not in CI's limit
PORTS = iter(range(29700, 29800))

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


def launch_command(mode: str, script: list[str]) -> list[str]:
    """The command that runs ``script`` (a recipe and its arguments) in ``mode``: one process, ZeRO-3 or FSDP2."""
    if mode == "single":
        return [sys.executable, *script]
    port = str(next(PORTS))
    if mode == "zero3":
        return [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", port, *script, "--deepspeed",
                str(ROOT / "launch" / "configs" / "deepspeed" / "zero3.json")]
    return [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", port, *script, "--use_cpu", "--fsdp",
            "full_shard auto_wrap", "--fsdp_config", str(ROOT / "launch" / "configs" / "fsdp" / "fsdp2.json")]


def run(mode: str, method: str, pair: dict, out: Path, *extra: str) -> subprocess.CompletedProcess:
    recipe, variant = VARIANTS.get(method, (method, []))
    target = pair["target4"] if method == "eagle3" else pair["target"]
    script = [str(ROOT / "recipes" / f"{recipe}.py"), "--config", str(ROOT / "recipes" / "configs" / f"{recipe}_test.yaml"),
              "--target", str(target), "--dataset", str(pair["dataset"]), "--output_dir", str(out), *variant]
    if method == "distillspec":
        script += ["--draft", str(pair["draft"])]
    proc = subprocess.run(launch_command(mode, script + list(extra)), cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"{mode} {method}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def logged_losses(checkpoint: Path) -> list[float]:
    """The training losses a checkpoint's ``trainer_state.json`` logged, step by step."""
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return [row["loss"] for row in history if "loss" in row]


def artefact_layout(artefact: Path) -> set[str]:
    """The artefact's files, and the name and shape of every tensor in its safetensors files (a tensor saved from a
    ZeRO-3 partition has no elements)."""
    from safetensors import safe_open

    layout = set()
    for path in artefact.rglob("*"):
        name = str(path.relative_to(artefact))
        if path.is_file():
            layout.add(name)
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as f:
                layout |= {f"{name}:{key}:{tuple(f.get_slice(key).get_shape())}" for key in f.keys()}
    return layout


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    """The tiny pair, and a 4-layer random target with its tokenizer for EAGLE-3 (three fused layers)."""
    import shutil

    from draftsmith.data.tiny_models import random_model

    paths = write_pair(tmp_path_factory.mktemp("scale_out_pair"))
    paths["target4"] = paths["target"].parent / "target4"
    random_model("llama", seed=0, layers=4).save_pretrained(paths["target4"])
    for f in paths["target"].iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            shutil.copy(f, paths["target4"] / f.name)
    return paths


@pytest.fixture(scope="module")
def single(pair, tmp_path_factory):
    """One-process runs at the 2-process runs' global batch (2 x 2 rows), by recipe: ``(losses, artefact layout)``."""
    done: dict[str, tuple[list[float], set[str]]] = {}

    def get(method: str):
        if method not in done:
            out = tmp_path_factory.mktemp(f"single_{method}")
            run("single", method, pair, out, "max_steps=2", "per_device_train_batch_size=4")
            done[method] = (logged_losses(out / "checkpoint-2"), artefact_layout(out / "artefact"))
        return done[method]

    return get


@pytest.mark.parametrize("method", RECIPES)
def test_a_recipe_trains_resumes_and_evaluates_under_zero3_on_two_processes(pair, single, tmp_path, method):
    mode, out = "zero3", tmp_path / "run"
    run(mode, method, pair, out, "max_steps=2")
    first = json.loads((out / "artefact" / "manifest.json").read_text())
    assert first["training"]["world_size"] == 2 and first["training"]["steps"] == 2
    assert first["training"]["parallelism"] == mode
    losses = logged_losses(out / "checkpoint-2")
    want, layout = single(method)
    assert len(losses) == len(want) == 2 and all(abs(a - b) <= 0.02 * abs(b) for a, b in zip(losses, want)), \
        (losses, want)
    assert artefact_layout(out / "artefact") == layout
    proc = run(mode, method, pair, out, "max_steps=3", "--resume_from_checkpoint", "auto", "evaluate=true",
               "eval_limit=2", "eval_max_new_tokens=8")
    resumed = json.loads((out / "artefact" / "manifest.json").read_text())
    assert resumed["training"]["steps"] == 3 and artefact_layout(out / "artefact") == layout
    report = json.loads((out / "eval" / "trained.json").read_text())
    assert report["summary"]["greedy_identical"] == 1.0, report["summary"]  # every answer token-identical to AR
    assert "loading the whole target on the main process" in proc.stdout


def test_bita_refuses_zero3_in_one_line(pair, tmp_path):
    """BiTA runs the frozen target layer by layer, which a ZeRO-3-sharded target does not allow: refused up front."""
    script = [str(ROOT / "recipes" / "bita.py"), "--config", str(ROOT / "recipes" / "configs" / "bita_test.yaml"),
              "--target", str(pair["target"]), "--dataset", str(pair["dataset"]), "--output_dir", str(tmp_path / "run")]
    proc = subprocess.run(launch_command("zero3", script), cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "error: BiTA runs the frozen target layer by layer" in output
    assert "Traceback" not in output


def test_fsdp_asked_for_on_cpu_processes_runs_as_ddp_and_says_so(pair, tmp_path):
    proc = run("fsdp", "distillspec", pair, tmp_path / "run", "max_steps=1")
    manifest = json.loads((tmp_path / "run" / "artefact" / "manifest.json").read_text())
    assert manifest["training"]["world_size"] == 2 and manifest["training"]["parallelism"] == "ddp"
    assert "--fsdp was given, but this run is ddp" in proc.stderr
