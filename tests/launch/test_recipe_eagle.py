"""The EAGLE-1 recipe end to end on a tiny random target: a head trained through the recipe runner (online
features), the heads artefact, and the artefact drafting token-identically to AR; under `accelerate launch` with 2
CPU processes too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_recipe_trains_a_head_writes_the_artefact_and_decodes_identically(tiny_pair, tmp_path, variant, caplog):
    torch.set_num_threads(1)
    out = tmp_path / variant
    layers = 2 if variant == "eagle1" else 4  # EAGLE-3 fuses three layers: a 4-layer target
    target_dir = tiny_pair["target"] if variant == "eagle1" else write_target(tmp_path, layers)
    result = run_recipe("eagle", [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "eagle_test.yaml"), f"variant={variant}", "ttt_steps=3",
        "draft_vocab_size=64", "layers=auto",
        "--target", str(target_dir), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out)])
    artefact, manifest = result.artefact, result.manifest
    assert manifest["kind"] == "heads" and manifest["method"] == "eagle"
    config = json.loads((artefact / "heads_config.json").read_text())
    assert config["method"] == "eagle" and config["variant"] == variant
    assert 0 <= manifest["training"]["head_top1"] <= 1 and "top1" in manifest["metrics"]
    if variant == "eagle1":
        assert {"reg", "cls"} <= manifest["metrics"].keys()
    else:
        assert {"step0_top1", "step2_top1"} <= manifest["metrics"].keys() and config["draft_vocab_size"] == 64
        coverage = manifest["training"]["draft_vocab_heldout_coverage"]  # held-out answer tokens a draft can propose
        assert 0 < coverage <= 1 and manifest["metrics"]["draft_vocab_coverage"] == coverage
        warned = [r.message for r in caplog.records if "raise draft_vocab_size" in r.getMessage()]
        assert bool(warned) == (coverage < 0.97)  # a one-line warning when the draft can never propose 3%+
    assert manifest["proposer"]["draft_length"] == 3
    calibration = json.loads((artefact / "manifest.json").read_text())["proposer"]["tree_calibration"]
    assert len(calibration["temperatures"]) == 3  # the tree calibrated after training, one temperature per depth
    target = random_model("llama", seed=0, layers=layers)  # the recipe's target (same seed)
    adapter = ModelAdapter(target)
    for tree in ("dynamic", "chain"):
        proposer, _ = load_artefact(artefact, target, None, tree=tree)
        for seed in range(2):
            prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
            ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
            assert generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer).output_ids == ar.output_ids
    with pytest.raises(Exception, match="chain"):
        load_artefact(artefact, target, None, tree="auto")
    # exported through the command line for the engines, and read back to the same head
    from draftsmith.inference.artefacts.eagle import load_eagle_head, read_eagle_export
    from draftsmith.launch.cli import main

    for fmt in (("eagle3",) if variant == "eagle3" else ("vllm-eagle", "sglang-eagle")):
        export = tmp_path / f"export-{fmt}"
        assert main(["export", "--artefact", str(artefact), "--format", fmt, "--out", str(export),
                     "--target", str(target_dir)]) == 0
        back, head = read_eagle_export(export, target), load_eagle_head(artefact, target)
        assert all(torch.equal(v, back.state_dict()[k]) for k, v in head.state_dict().items())


def test_a_resumed_eagle3_run_keeps_the_draft_vocabulary_of_its_checkpoint(tiny_pair, tmp_path):
    """The draft vocabulary is counted on the target's answers before training; a resumed run restores the one its
    checkpoint trained with (d2t/t2d are saved with the head), even when it would count another."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    target = write_target(tmp_path, 4)

    def run(out: Path, *extra: str):
        return run_recipe("eagle", [
            "--config", str(ROOT / "launch" / "configs" / "recipes" / "eagle_test.yaml"), "variant=eagle3", "ttt_steps=2",
            "draft_vocab_size=64", "evaluate=false", "eval_strategy=no", "--target", str(target),
            "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out), *extra])

    run(tmp_path / "resumed", "--max_steps", "2")
    saved = load_file(str(tmp_path / "resumed" / "checkpoint-2" / "model.safetensors"))["head.t2d"]
    result = run(tmp_path / "resumed", "--max_steps", "3", "draft_vocab_prompts=1", "--resume_from_checkpoint", "latest",
                 "--allow-changed-settings")  # a changed method setting is refused without it
    assert result.manifest["training"]["steps"] == 3
    assert torch.equal(load_file(str(result.artefact / "heads.safetensors"))["t2d"], saved)
    fresh = run(tmp_path / "fresh", "--max_steps", "1", "draft_vocab_prompts=1").artefact  # what it would count
    assert not torch.equal(load_file(str(fresh / "heads.safetensors"))["t2d"], saved)


@pytest.mark.parametrize("path", sorted((ROOT / "launch" / "configs" / "recipes").glob("eagle*.yaml")), ids=lambda p: p.name)
def test_every_shipped_eagle_config_parses(path, tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.eagle.trainer import EagleConfig

    recipe, eagle, targs = parse_recipe_args(EagleConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
    assert recipe.config == str(path) and targs.max_steps > 0 and eagle.draft_length >= 1


def test_accelerate_two_cpu_processes(tiny_pair, tmp_path):
    """recipes/eagle.py under `accelerate launch` with 2 CPU processes (DDP): one heads artefact, world size 2."""
    out = tmp_path / "acc"
    cfg = ROOT / "launch" / "configs" / "accelerate" / "cpu_2proc.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(cfg), "--main_process_port",
           "29545", str(ROOT / "recipes" / "eagle.py"), "--config", str(ROOT / "launch" / "configs" / "recipes" / "eagle_test.yaml"),
           "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    assert manifest["method"] == "eagle" and manifest["training"]["world_size"] == 2


@pytest.mark.slow
def test_eagle3_under_deepspeed_zero2_two_cpu_processes(tiny_pair, tmp_path):
    """recipes/eagle.py --variant eagle3 under `deepspeed` (ZeRO-2, 2 CPU processes): the unrolled training-time
    test is one forward per step, so data parallelism sees one forward per backward."""
    out = tmp_path / "ds"
    target = write_target(tmp_path, 4)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    cmd = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2", "--master_port", "29547",
           str(ROOT / "recipes" / "eagle.py"), "--config", str(ROOT / "launch" / "configs" / "recipes" / "eagle_test.yaml"),
           "--variant", "eagle3", "ttt_steps=3", "draft_vocab_size=64", "--max_steps", "3",
           "--target", str(target), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out),
           "--deepspeed", str(ROOT / "launch" / "configs" / "deepspeed" / "zero2.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    assert manifest["training"]["world_size"] == 2 and manifest["training"]["config"]["eagle"]["variant"] == "eagle3"


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_offline_and_online_features_train_to_the_same_loss_curve(tiny_pair, tmp_path, offline_matches_online, variant):
    """The same rows (data_mode=fixed), the same seed: features from the cache or from the target in every step
    (conftest's ``offline_matches_online``)."""
    torch.set_num_threads(1)
    target = tiny_pair["target"] if variant == "eagle1" else write_target(tmp_path, 4)
    cache = offline_matches_online("eagle", lambda out: [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "eagle_test.yaml"), f"variant={variant}", "ttt_steps=2",
        "draft_vocab_size=64", "data_mode=fixed", "--target", str(target), "--dataset", str(tiny_pair["dataset"]),
        "--output_dir", str(out)])
    assert len(list(cache.iterdir())) == 4  # train and held-out, float32 and float16


@pytest.mark.slow
def test_zoo_eagle_greedy_identical_on_the_dev_questions(zoo_identity):
    """Issue 13, done-when: token-identical to AR on the bundled dev questions (tiny zoo; ``--dev-questions all``
    for every one) for the EAGLE-1 chain, the EAGLE-1 dynamic tree and the EAGLE-3 dynamic tree."""
    for variant, trees in (("eagle1", ("chain", "dynamic")), ("eagle3", ("dynamic",))):
        config = ROOT / "launch" / "configs" / "recipes" / ("eagle_tiny.yaml" if variant == "eagle1" else "eagle3_tiny.yaml")
        result = zoo_identity.train("eagle", "--config", str(config), "max_steps=30", "eval_steps=30", "save_steps=30",
                                    name=variant)
        for tree in trees:
            zoo_identity.check(result, "eagle", tree=tree)


def test_peagle_trains_by_name_and_decodes_identically(tiny_pair, tmp_path):
    """`draftsmith train peagle`: EAGLE's spec with the P-EAGLE variant fixed — a P-EAGLE head, an artefact of method
    peagle, drafting its block token-identically to AR; a config that names another variant is refused."""
    from draftsmith.common.errors import ConfigError
    from draftsmith.inference.drafters.peagle import PEagleHead

    torch.set_num_threads(1)
    target_dir = write_target(tmp_path, 4)
    argv = ["--config", "eagle_test", "ttt_steps=3", "draft_vocab_size=64", "layers=auto", "--target", str(target_dir),
            "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(tmp_path / "p"), "calibrate_tree=false"]
    result = run_recipe("peagle", argv)
    assert result.manifest["method"] == "peagle"
    target = random_model("llama", seed=0, layers=4)
    proposer, _ = load_artefact(result.artefact, target, None)
    assert isinstance(proposer.head, PEagleHead)
    adapter = ModelAdapter(target)
    prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(0))
    ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
    assert generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer).output_ids == ar.output_ids
    with pytest.raises(ConfigError, match="fixes"):
        run_recipe("peagle", [*argv[:-1], "variant=eagle3"])
