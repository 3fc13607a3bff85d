"""The CLLM recipe end to end on a tiny random target: trajectories collected (and reused on a rerun), a copy of
the target trained, the adapted-target artefact, and Jacobi decoding token-identical to that model's AR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.artefacts.manifest import adapted_target
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.methods import load_artefact
from draftsmith.launch.recipe import run_recipe

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_recipe_collects_trains_and_decodes_identically(tiny_pair, tmp_path, finetune):
    torch.set_num_threads(1)
    out = tmp_path / "cllm"
    args = ["--config", str(ROOT / "launch" / "configs" / "recipes" / "cllm_test.yaml"), f"finetune={finetune}", "lora_r=4",
            "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out)]
    result = run_recipe("cllm", args)
    manifest = result.manifest
    assert manifest["kind"] == "adapted_target" and manifest["method"] == "cllm"
    assert manifest["proposer"]["draft_length"] == 4
    meta = json.loads((out / "trajectories" / "train.jsonl.meta.json").read_text())
    assert meta["progress"]["complete"] and meta["settings"]["block"] == 4
    metrics = " ".join(manifest["metrics"])
    assert "state_top1" in metrics and "original_ar_loss" in metrics
    original = random_model("llama", seed=0, layers=2)  # the pair's target (same seed)
    tuned = adapted_target(result.artefact, manifest, original)
    assert any(not torch.equal(a, b) for a, b in zip(tuned.state_dict().values(), original.state_dict().values()))
    proposer, _ = load_artefact(result.artefact, original, None)
    adapter = ModelAdapter(tuned)
    for seed in range(2):
        prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
        sp = generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer)
        assert sp.output_ids == ar.output_ids
    # a rerun reuses the trajectories (no new collection: the files are unchanged)
    before = (out / "trajectories" / "train.jsonl").read_bytes()
    run_recipe("cllm", args + ["--output_dir", str(tmp_path / "again"), f"trajectory_dir={out / 'trajectories'}"])
    assert (out / "trajectories" / "train.jsonl").read_bytes() == before


@pytest.mark.parametrize("path", sorted((ROOT / "launch" / "configs" / "recipes").glob("cllm*.yaml")), ids=lambda p: p.name)
def test_every_shipped_cllm_config_parses(path, tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.cllm.trainer import CllmConfig

    recipe, cllm, targs = parse_recipe_args(CllmConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
    assert recipe.config == str(path) and targs.max_steps > 0 and cllm.block >= 1


def test_accelerate_two_cpu_processes(launcher, tmp_path):
    proc = launcher("accelerate", "cllm", 29561, tmp_path / "acc", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "acc" / "artefact" / "manifest.json").read_text())
    assert manifest["method"] == "cllm" and manifest["training"]["world_size"] == 2


@pytest.mark.slow
def test_deepspeed_zero2_two_cpu_processes(launcher, tmp_path):
    proc = launcher("deepspeed", "cllm", 29563, tmp_path / "ds")
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "ds" / "artefact" / "manifest.json").read_text())
    assert manifest["training"]["world_size"] == 2 and manifest["kind"] == "adapted_target"


@pytest.mark.slow
def test_zoo_cllm_greedy_identical_on_the_dev_questions(zoo_identity):
    """Issue 17, done-when: Jacobi decoding of the CLLM model token-identical to that model's own AR on the bundled
    dev questions (tiny zoo; ``--dev-questions all`` for every one)."""
    rep = zoo_identity.check(zoo_identity.train("cllm", "max_train_examples=100"), "cllm")
    assert rep["jacobi"]["block"] == 16
