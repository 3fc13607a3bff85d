"""The Medusa-1 recipe end to end on a tiny random target: heads trained through the recipe runner, the heads
artefact with its measured accuracies, and the artefact decoding token-identically to AR with its tree and with
the chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.adapter import ModelAdapter
from draftsmith.inference.artefact import load_artefact
from draftsmith.inference.generate import GenerationConfig, generate
from draftsmith.launch.recipe import run_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_recipe_trains_heads_writes_the_artefact_and_decodes_identically(tiny_pair, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "medusa"
    result = run_recipe("medusa", [
        "--config", str(ROOT / "recipes" / "configs" / "medusa_test.yaml"),
        "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out)])
    artefact = result.artefact
    assert (artefact / "heads.safetensors").is_file()
    config = json.loads((artefact / "heads_config.json").read_text())
    assert config["heads"] == 3 and config["shared_lm_head"] is True
    manifest = result.manifest
    assert manifest["kind"] == "heads" and manifest["method"] == "medusa"
    accuracy = manifest["training"]["head_accuracy"]
    assert len(accuracy) == 3 and len(accuracy[0]) == 10 and all(0 <= a <= 1 for row in accuracy for a in row)
    assert "head0_top1" in manifest["metrics"]
    target = random_model("llama", seed=0, layers=2)  # the pair's target (same seed)
    tok = None
    adapter = ModelAdapter(target)
    for tree in ("auto", "chain"):
        proposer, _ = load_artefact(artefact, target, tok, tree=tree)
        assert len(proposer.tree) == (8 if tree == "auto" else 3)
        for seed in range(2):
            prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
            ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
            sp = generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer)
            assert sp.output_ids == ar.output_ids
    # the vLLM export of the same artefact, through the command line, reads back to the same heads
    from draftsmith.inference.export import load_heads_artefact, read_vllm_medusa
    from draftsmith.launch.cli import main

    export = tmp_path / "vllm"
    assert main(["export", "--artefact", str(artefact), "--format", "vllm-medusa", "--out", str(export),
                 "--target", str(tiny_pair["target"])]) == 0
    back, back_head = read_vllm_medusa(export)
    h = torch.randn(3, 32)
    assert torch.equal(back(h, back_head), load_heads_artefact(artefact)(h, target.get_output_embeddings()))


@pytest.mark.parametrize("path", sorted((ROOT / "recipes" / "configs").glob("medusa*.yaml")), ids=lambda p: p.name)
def test_every_shipped_medusa_config_parses(path, tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.medusa import MedusaConfig

    recipe, medusa, targs = parse_recipe_args(MedusaConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
    assert recipe.config == str(path) and targs.max_steps > 0 and medusa.heads >= 1


@pytest.mark.slow
def test_zoo_medusa_greedy_identical_on_every_dev_question(tmp_path):
    """Issue 12, done-when: Medusa-1 token-identical to AR on every bundled dev question (tiny zoo), with its
    default tree and with the chain."""
    from draftsmith.data.zoo import load_zoo
    from draftsmith.inference.evaluator import evaluate
    from draftsmith.inference.questions import read_questions

    result = run_recipe("medusa", ["--output_dir", str(tmp_path / "medusa"), "max_steps=40", "eval_steps=40",
                                   "save_steps=40", "evaluate=false", "eval_examples=16"])
    tokenizer, target, _ = load_zoo("tiny")
    for tree in ("auto", "chain"):
        proposer, _ = load_artefact(result.artefact, target, tokenizer, tree=tree)
        rep = evaluate(target, tokenizer, "medusa", lambda p=proposer: p, read_questions(), max_new_tokens=64,
                       warmup=1, progress=False)
        assert rep["num_questions"] == 324
        differing = [(r["question_id"], r["difference"]) for r in rep["questions"] if not r["identical"]]
        assert rep["summary"]["greedy_identical"] == 1.0, (tree, differing[:3])


def test_accelerate_two_cpu_processes(tiny_pair, tmp_path):
    """recipes/medusa.py under `accelerate launch` with 2 CPU processes (DDP): one heads artefact, world size 2."""
    import os
    import subprocess
    import sys

    out = tmp_path / "acc"
    cfg = ROOT / "launch" / "configs" / "accelerate" / "cpu_2proc.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(cfg), "--main_process_port",
           "29541", str(ROOT / "recipes" / "medusa.py"), "--config", str(ROOT / "recipes" / "configs" / "medusa_test.yaml"),
           "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out),
           "ddp_find_unused_parameters=false"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    assert manifest["method"] == "medusa" and manifest["training"]["world_size"] == 2
    assert len(manifest["training"]["head_accuracy"]) == 3
