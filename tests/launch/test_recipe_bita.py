"""The BiTA recipe end to end on a tiny random target: prompt and mask embeddings trained through the recipe runner,
the embeddings-only artefact, decoding token-identical to AR with the chain and the tree, under accelerate with 2
processes and DeepSpeed ZeRO-2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.methods import load_artefact
from draftsmith.launch.recipe import run_recipe

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", ["deep", "embeddings"])
def test_recipe_trains_embeddings_only_and_decodes_identically(tiny_pair, tmp_path, mode):
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    out = tmp_path / "bita"
    target = random_model("llama", seed=0, layers=2)  # the pair's target (same seed)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    result = run_recipe("bita", [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "bita_test.yaml"), f"prompt_mode={mode}",
        "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out)])
    artefact, manifest = result.artefact, result.manifest
    assert manifest["kind"] == "embeddings" and manifest["method"] == "bita"
    # embeddings only: the prompt and the masks, nothing of the target
    assert sorted(p.name for p in artefact.iterdir()) == ["embeddings.safetensors", "embeddings_config.json",
                                                          "manifest.json"]
    tensors = load_file(str(artefact / "embeddings.safetensors"))
    config = json.loads((artefact / "embeddings_config.json").read_text())
    assert set(tensors) == {"masks", "prompt.embedding.weight"}
    assert tensors["masks"].shape == (2, 32)
    width = 2 * 2 * config["kv_heads"] * config["head_dim"] if mode == "deep" else 32  # layers * (k, v) * kv width
    assert tensors["prompt.embedding.weight"].shape == (4, width)
    assert manifest["training"]["trained_parameters"] == sum(t.numel() for t in tensors.values())
    assert len(manifest["training"]["mask_accuracy"]) == 2 and "mask1_top1" in manifest["metrics"]
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    adapter = ModelAdapter(target)
    for tree in ("chain", "triangle"):
        proposer, _ = load_artefact(artefact, target, None, tree=tree, tree_top_k=3)
        for seed in range(2):
            prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
            ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
            sp = generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer)
            assert sp.output_ids == ar.output_ids and sp.num_proposed > 0


def test_training_lowers_the_mask_loss(tiny_pair, tmp_path):
    """A few dozen steps at the reference code's learning rate lower the mask loss from the untrained start."""
    torch.set_num_threads(1)
    run_recipe("bita", [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "bita_test.yaml"), "max_steps=30", "eval_steps=30",
        "save_steps=30", "data_mode=fixed", "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]),
        "--output_dir", str(tmp_path / "b")])
    history = json.loads((tmp_path / "b" / "checkpoint-30" / "trainer_state.json").read_text())["log_history"]
    losses = [h["loss"] for h in history if "loss" in h]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses


@pytest.mark.parametrize("path", sorted((ROOT / "launch" / "configs" / "recipes").glob("bita*.yaml")), ids=lambda p: p.name)
def test_every_shipped_bita_config_parses(path, tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.bita.trainer import BitaConfig

    recipe, bita, targs = parse_recipe_args(BitaConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
    assert recipe.config == str(path) and targs.max_steps > 0 and bita.mask_tokens >= 1


def test_accelerate_two_cpu_processes(launcher, tmp_path):
    """recipes/bita.py under `accelerate launch` with 2 CPU processes (DDP): one artefact, world size 2, and the
    replicas end identical (the trainer checks)."""
    proc = launcher("accelerate", "bita", 29551, tmp_path / "acc", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "acc" / "artefact" / "manifest.json").read_text())
    assert manifest["method"] == "bita" and manifest["training"]["world_size"] == 2


@pytest.mark.slow
def test_deepspeed_zero2_two_cpu_processes(launcher, tmp_path):
    proc = launcher("deepspeed", "bita", 29553, tmp_path / "ds")
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "ds" / "artefact" / "manifest.json").read_text())
    assert manifest["training"]["world_size"] == 2 and manifest["kind"] == "embeddings"


@pytest.mark.slow
def test_zoo_bita_greedy_identical_on_the_dev_questions(zoo_identity):
    """Issue 16, done-when: BiTA decoding token-identical to AR on the bundled dev questions (tiny
    zoo; ``--dev-questions all`` for every one)."""
    result = zoo_identity.train("bita")
    for tree in ("chain", "triangle"):
        zoo_identity.check(result, "bita", tree=tree)
