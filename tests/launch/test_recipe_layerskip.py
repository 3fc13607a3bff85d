"""The LayerSkip recipe end to end on a tiny random target: the adapted target with its exit layer, per-exit
agreement and the full-depth loss against the original's, and early-exit decoding token-identical to the adapted
model's own AR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.artefacts.manifest import adapted_target, read_manifest
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.methods import load_artefact
from draftsmith.launch.recipe import run_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_recipe_adapts_the_target_and_self_speculation_matches_its_ar(tiny_pair, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "layerskip"
    result = run_recipe("layerskip", [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "layerskip_test.yaml"),
        "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out)])
    artefact, manifest = result.artefact, result.manifest
    assert manifest["kind"] == "adapted_target" and (artefact / "model" / "config.json").is_file()
    assert manifest["proposer"]["exit_layer"] == 1 and len(manifest["training"]["exit_agreement"]) == 2
    assert manifest["training"]["exit_agreement"][-1] == 1.0
    assert {"exit1_top1", "full_loss", "original_full_loss"} <= manifest["metrics"].keys()
    original = random_model("llama", seed=0, layers=2)  # the pair's target (same seed)
    adapted = adapted_target(artefact, read_manifest(artefact), original)
    assert any(not torch.equal(p, q) for p, q in zip(adapted.parameters(), original.parameters()))
    proposer, _ = load_artefact(artefact, adapted, None)
    assert proposer.exit_layer == 1
    from draftsmith.launch.cli import main

    assert main(["exit-layer", "--artefact", str(artefact), "--prompts", "2", "--max-new-tokens", "8",
                 "--threads", "1"]) == 0
    recorded = read_manifest(artefact)
    assert recorded["proposer"]["exit_layer"] == 1 and recorded["tuning"]["exit_layer"]["table"]
    adapter = ModelAdapter(adapted)
    for seed in range(2):
        prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
        assert generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer).output_ids == ar.output_ids


def test_accelerate_two_cpu_processes(tiny_pair, tmp_path):
    """recipes/layerskip.py under `accelerate launch` with 2 CPU processes (DDP): one adapted-target artefact."""
    out = tmp_path / "acc"
    cfg = ROOT / "launch" / "configs" / "accelerate" / "cpu_2proc.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(cfg), "--main_process_port",
           "29549", str(ROOT / "recipes" / "layerskip.py"), "--config",
           str(ROOT / "launch" / "configs" / "recipes" / "layerskip_test.yaml"), "--target", str(tiny_pair["target"]),
           "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    assert manifest["method"] == "layerskip" and manifest["training"]["world_size"] == 2


def test_every_shipped_layerskip_config_parses(tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.layerskip.trainer import LayerSkipConfig

    for path in sorted((ROOT / "launch" / "configs" / "recipes").glob("layerskip*.yaml")):
        recipe, config, targs = parse_recipe_args(LayerSkipConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
        assert targs.max_steps > 0 and config.curriculum in ("rotational", "gradual", "all"), path


def test_lora_variant_ships_the_merged_adapted_target(tiny_pair, tmp_path):
    torch.set_num_threads(1)
    result = run_recipe("layerskip", [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "layerskip_test.yaml"), "finetune=lora", "lora_r=4",
        "learning_rate=1e-2", "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]),
        "--output_dir", str(tmp_path / "lora")])
    model_dir = result.artefact / "model"
    assert (model_dir / "config.json").is_file() and not (model_dir / "adapter_config.json").exists()
    original = random_model("llama", seed=0, layers=2)
    adapted = adapted_target(result.artefact, read_manifest(result.artefact), original)
    assert not any("lora" in n for n, _ in adapted.named_parameters())
    assert any(not torch.equal(p, q) for p, q in zip(adapted.parameters(), original.parameters()))


@pytest.mark.slow
def test_zoo_layerskip_greedy_identical_on_the_dev_questions(zoo_identity):
    """Issue 14, done-when: early-exit self-speculation (exit 2 of 4, 4 tokens, the draft's cache reused) token-
    identical to the adapted model's own AR on the bundled dev questions (tiny zoo; ``--dev-questions all`` for every one)."""
    rep = zoo_identity.check(zoo_identity.train("layerskip", "max_train_examples=400", "exit_layer=2"), "layerskip")
    assert rep["early_exit"]["exit_layer"] == 2
