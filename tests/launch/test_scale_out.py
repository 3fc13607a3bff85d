"""Every recipe past one process, on 2 CPU processes (gloo), slow.

DeepSpeed ZeRO-3 (``deepspeed``, launch/configs/deepspeed/zero3.json) and FSDP2 (``torchrun`` with the Trainer's
``--fsdp`` and launch/configs/fsdp/fsdp2.json; on CPU processes draftsmith shards the trained module itself:
draftsmith.trainers.cpu_fsdp): each run trains 2 steps and checkpoints, is resumed to step 3 with the evaluation
after training on (the main process loads the target whole; the other process has finished), all within a timeout,
so a hang fails the test; its artefact has the layout of the one-process run's, and its first two losses are within
2% of the one-process run's at the same global batch. An FSDP2 resume continues exactly as the run that was not
interrupted (the whole weights and AdamW state are checkpointed), and ``accelerate launch`` with the shipped FSDP
config shards CPU processes the same way."""

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
MODES = {"zero3": "zero3", "fsdp": "fsdp2"}  # launch mode -> the manifest's parallelism
VARIANTS = {"eagle3": ("eagle", ["--variant", "eagle3", "ttt_steps=3", "draft_vocab_size=64"]),  # on a 4-layer target
            "medusa2": ("medusa", ["variant=medusa2"])}
TIMEOUT = 1500  # seconds per launch: a rank left waiting on a collective ends here, not in CI's limit
PORTS = iter(range(29700, 29800))

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


def launch_command(mode: str, script: list[str]) -> list[str]:
    """The command that runs ``script`` (a recipe and its arguments) in ``mode``: one process, ZeRO-3, FSDP2 under
    torchrun, or FSDP2 under ``accelerate launch`` (``accelerate-fsdp``)."""
    if mode == "single":
        return [sys.executable, *script]
    port = str(next(PORTS))
    if mode == "accelerate-fsdp":
        return [str(BIN / "accelerate"), "launch", "--config_file", str(ROOT / "launch" / "configs" / "accelerate" /
                "fsdp.yaml"), "--num_processes", "2", "--main_process_port", port, "--mixed_precision", "no",
                *script, "--use_cpu"]
    if mode == "zero3":
        return [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", port, *script, "--deepspeed",
                str(ROOT / "launch" / "configs" / "deepspeed" / "zero3.json")]
    return [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", port, *script, "--use_cpu", "--fsdp",
            "full_shard auto_wrap", "--fsdp_config", str(ROOT / "launch" / "configs" / "fsdp" / "fsdp2.json")]


def run(mode: str, method: str, pair: dict, out: Path, *extra: str) -> subprocess.CompletedProcess:
    recipe, variant = VARIANTS.get(method, (method, []))
    target = pair["target4"] if method == "eagle3" else pair["target"]
    script = [str(ROOT / "recipes" / f"{recipe}.py"), "--config", str(ROOT / "launch" / "configs" / "recipes" / f"{recipe}_test.yaml"),
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


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("method", RECIPES + ("bita",))
def test_a_recipe_trains_resumes_and_evaluates_sharded_on_two_processes(pair, single, tmp_path, method, mode):
    if (method, mode) == ("bita", "zero3"):
        pytest.skip("BiTA refuses ZeRO-3 (test_bita_refuses_zero3_in_one_line)")
    out = tmp_path / "run"
    run(mode, method, pair, out, "max_steps=2")
    first = json.loads((out / "artefact" / "manifest.json").read_text())
    assert first["training"]["world_size"] == 2 and first["training"]["steps"] == 2
    assert first["training"]["parallelism"] == MODES[mode]
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
    script = [str(ROOT / "recipes" / "bita.py"), "--config", str(ROOT / "launch" / "configs" / "recipes" / "bita_test.yaml"),
              "--target", str(pair["target"]), "--dataset", str(pair["dataset"]), "--output_dir", str(tmp_path / "run")]
    proc = subprocess.run(launch_command("zero3", script), cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "error: BiTA runs the frozen target layer by layer" in output
    assert "Traceback" not in output


@pytest.mark.parametrize("method", ["distillspec", "eagle3"])
def test_an_fsdp2_resume_continues_as_the_run_that_was_not_interrupted(pair, tmp_path, method):
    """Weights and AdamW state are checkpointed whole and resharded on resume: after a resume from step 2, steps 3
    and 4 have the losses of one 4-step run (step 4's loss depends on the restored AdamW moments; a constant learning
    rate, so that the schedule of the 2-step run does not differ)."""
    constant = ("lr_scheduler_type=constant", "warmup_steps=0")
    run("fsdp", method, pair, tmp_path / "whole", "max_steps=4", *constant)
    run("fsdp", method, pair, tmp_path / "split", "max_steps=2", *constant)
    run("fsdp", method, pair, tmp_path / "split", "max_steps=4", *constant, "--resume_from_checkpoint", "auto")
    whole, split = (logged_losses(tmp_path / name / "checkpoint-4") for name in ("whole", "split"))
    assert len(whole) == 4 and split == pytest.approx(whole, rel=1e-5, abs=1e-7)


def test_accelerate_launch_with_the_fsdp_config_shards_cpu_processes(pair, tmp_path):
    run("accelerate-fsdp", "distillspec", pair, tmp_path / "run", "max_steps=1")
    manifest = json.loads((tmp_path / "run" / "artefact" / "manifest.json").read_text())
    assert manifest["training"]["world_size"] == 2 and manifest["training"]["parallelism"] == "fsdp2"


def test_the_fsdp2_sharded_draft_generates_its_own_batches_in_lockstep(pair, tmp_path):
    """On-policy DistillSpec: the sharded draft generates each batch's answers, every process in lockstep
    (``synced_gpus``), within the timeout."""
    out = tmp_path / "run"
    run("fsdp", "distillspec", pair, out, "max_steps=2", "data_mode=onpolicy", "max_new_tokens=8")
    losses = logged_losses(out / "checkpoint-2")
    assert len(losses) == 2 and all(loss == loss and abs(loss) < float("inf") for loss in losses)
    assert json.loads((out / "artefact" / "manifest.json").read_text())["training"]["parallelism"] == "fsdp2"


def test_fsdp2_accumulates_gradients_as_one_larger_micro_batch(pair, tmp_path):
    """Two micro-batches of 1 per process (FSDP2's gradient reduction held back until the window's last one) train
    as one micro-batch of 2: the second step's loss agrees."""
    run("fsdp", "eagle", pair, tmp_path / "acc", "max_steps=2", "per_device_train_batch_size=1",
        "gradient_accumulation_steps=2")
    run("fsdp", "eagle", pair, tmp_path / "one", "max_steps=2", "per_device_train_batch_size=2")
    accumulated, single = (logged_losses(tmp_path / name / "checkpoint-2") for name in ("acc", "one"))
    assert accumulated == pytest.approx(single, rel=2e-3)
