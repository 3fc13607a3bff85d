"""The DFlash recipe end to end on a tiny random target: a draft trained through the recipe runner (online features,
then cached ones), the heads artefact, the artefact drafting token-identically to AR, and the command-line export
read back to the same draft."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_pair import write_target

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.methods import load_artefact
from draftsmith.launch.recipe import run_recipe

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "launch" / "configs" / "recipes" / "dflash_test.yaml"


def test_recipe_trains_a_draft_writes_the_artefact_and_decodes_identically(tiny_pair, tmp_path):
    torch.set_num_threads(1)
    target_dir = write_target(tmp_path, 4)
    result = run_recipe("dflash", ["--config", str(CONFIG), "draft_layers=2", "--target", str(target_dir),
                                   "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(tmp_path / "run")])
    artefact, manifest = result.artefact, result.manifest
    assert manifest["kind"] == "heads" and manifest["method"] == "dflash"
    config = json.loads((artefact / "heads_config.json").read_text())
    assert config["method"] == "dflash" and config["layers"] == [1, 3] and config["block_size"] == 4
    assert {"slot1_top1", "slot3_top1", "block_tau"} <= manifest["metrics"].keys()
    assert 1.0 <= manifest["training"]["predicted_tau"] <= 4.0
    assert manifest["proposer"]["draft_length"] == 3
    calibration = json.loads((artefact / "manifest.json").read_text())["proposer"]["tree_calibration"]
    assert len(calibration["rank_accuracy"]) == 3  # the slots' conditional rank accuracies, which --tree auto grows from
    target = random_model("llama", seed=0, layers=4)  # the recipe's target (same seed)
    adapter = ModelAdapter(target)
    for length, tree in ((None, None), (2, None), (None, "auto")):
        proposer, _ = load_artefact(result.artefact, target, None, draft_length=length, tree=tree, tree_nodes="8")
        assert proposer.length == (length or 3) and (proposer.tree is None) == (tree is None)
        for seed in range(2):
            prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
            ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
            assert generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer).output_ids == ar.output_ids
    from draftsmith.inference.artefacts.dflash import load_dflash_draft, read_dflash_export
    from draftsmith.launch.cli import main

    export = tmp_path / "export"
    assert main(["export", "--artefact", str(artefact), "--format", "vllm-dflash", "--out", str(export),
                 "--target", str(target_dir)]) == 0
    back, draft = read_dflash_export(export, target), load_dflash_draft(artefact, target)
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in draft.state_dict().items())


@pytest.mark.slow
def test_offline_and_online_features_train_to_the_same_loss_curve(tiny_pair, tmp_path, offline_matches_online):
    """The same rows (data_mode=fixed), the same seed: features from the cache or from the target in every step
    (conftest's ``offline_matches_online``; slow: EAGLE's recipe tests run the same cache path by default)."""
    torch.set_num_threads(1)
    target = write_target(tmp_path, 4)
    offline_matches_online("dflash", lambda out: [
        "--config", str(CONFIG), "data_mode=fixed", "--target", str(target), "--dataset", str(tiny_pair["dataset"]),
        "--output_dir", str(out)])


@pytest.mark.parametrize("path", sorted((ROOT / "launch" / "configs" / "recipes").glob("dflash*.yaml")), ids=lambda p: p.name)
def test_every_shipped_dflash_config_parses(path, tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.dflash.trainer import DFlashConfig

    recipe, dflash, targs = parse_recipe_args(DFlashConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
    assert recipe.config == str(path) and targs.max_steps > 0 and dflash.block_size >= 2


def test_a_resumed_run_gives_the_uninterrupted_runs_losses_and_weights(tiny_pair, tmp_path):
    """The anchors of each micro-batch come from the seed, the step and the micro-batch, so a run resumed from its
    step-2 checkpoint repeats the uninterrupted run bit for bit, though other draws used the global generator."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    target_dir = write_target(tmp_path, 4)

    def run(out, *extra):
        return run_recipe("dflash", ["--config", str(CONFIG), "--target", str(target_dir), "--dataset",
                                     str(tiny_pair["dataset"]), "--output_dir", str(out), "max_steps=4", "save_steps=2",
                                     "logging_steps=1", "eval_strategy=no", "calibrate_tree=false", "report_to=none",
                                     "gradient_accumulation_steps=2", *extra])

    def losses(out):
        state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
        return [h["loss"] for h in state["log_history"] if "loss" in h]

    run(tmp_path / "whole")
    run(tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "checkpoint-4")  # as if killed after checkpoint-2
    torch.rand(1000)  # the global generator has moved on
    run(tmp_path / "cut", "--resume_from_checkpoint", "latest")
    assert losses(tmp_path / "cut") == losses(tmp_path / "whole") and len(losses(tmp_path / "whole")) == 4
    whole, cut = (load_file(str(d / "checkpoint-4" / "model.safetensors")) for d in (tmp_path / "whole", tmp_path / "cut"))
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)
