"""The Medusa-1 recipe end to end on a tiny random target: heads trained through the recipe runner, the heads
artefact with its measured accuracies, and the artefact decoding token-identically to AR with its tree and with
the chain."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.methods import load_artefact
from draftsmith.launch.recipe import run_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_recipe_trains_heads_writes_the_artefact_and_decodes_identically(tiny_pair, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "medusa"
    result = run_recipe("medusa", [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "medusa_test.yaml"),
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
    calibration = json.loads((artefact / "manifest.json").read_text())["proposer"]["tree_calibration"]
    assert len(calibration["rank_accuracy"]) == 3  # conditional accuracies measured in the loop after training
    target = random_model("llama", seed=0, layers=2)  # the pair's target (same seed)
    tok = None
    adapter = ModelAdapter(target)
    sized, _ = load_artefact(artefact, target, tok, tree="auto", tree_nodes="auto")  # sized on the measured cost
    assert 1 <= len(sized.tree) <= 64
    for tree in ("auto", "chain"):
        proposer, _ = load_artefact(artefact, target, tok, tree=tree)
        assert len(proposer.tree) == (8 if tree == "auto" else 3)
        for seed in range(2):
            prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
            ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
            sp = generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer)
            assert sp.output_ids == ar.output_ids
    typical, _ = load_artefact(artefact, target, tok, acceptance="typical")  # Medusa's rule: lossy, exact when greedy
    assert typical.lossless is False and typical.verifier.__name__ == "typical_acceptance(epsilon=0.09, delta=0.3)"
    assert generate(adapter, prompt, GenerationConfig(max_new_tokens=20), typical).output_ids == ar.output_ids
    # the vLLM export of the same artefact, through the command line, reads back to the same heads
    from draftsmith.inference.artefacts.medusa import load_heads_artefact, read_vllm_medusa
    from draftsmith.launch.cli import main

    export = tmp_path / "vllm"
    assert main(["export", "--artefact", str(artefact), "--format", "vllm-medusa", "--out", str(export),
                 "--target", str(tiny_pair["target"])]) == 0
    back, back_head = read_vllm_medusa(export)
    h = torch.randn(3, 32)
    assert torch.equal(back(h, back_head), load_heads_artefact(artefact)(h, target.get_output_embeddings()))


def test_bfloat16_trains_float32_heads_over_the_bfloat16_target_under_autocast(tiny_pair, tmp_path):
    """dtype=bfloat16 on the CPU: the frozen target in bfloat16, the heads in float32 master weights, every loss
    (training and held-out, outside the heads' own forward too) under autocast; the artefact decodes as the chain."""
    torch.set_num_threads(1)
    result = run_recipe("medusa", [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "medusa_test.yaml"), "--target", str(tiny_pair["target"]),
        "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(tmp_path / "m"), "dtype=bfloat16"])
    config = result.manifest["training"]["config"]
    assert config["recipe"]["dtype"] == "bfloat16" and config["training_args"]["bf16"] is True
    assert math.isfinite(result.manifest["metrics"]["eval_loss"])
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(result.artefact / "heads.safetensors").values()} == {torch.float32}


def test_medusa2_tunes_the_target_ships_its_adapter_and_verifies_against_it(tiny_pair, tmp_path):
    """Medusa-2: heads warmed up alone, then heads and a LoRA adapter of the target jointly; the artefact carries
    the adapter, decoding is token-identical to the adapted target's AR, and the report says how far the adapted
    target's answers moved from the original's."""
    from safetensors.torch import load_file

    from draftsmith.inference.artefacts.manifest import adapted_target, read_manifest
    from draftsmith.inference.evaluation.evaluator import evaluate
    from draftsmith.inference.evaluation.questions import Question
    from draftsmith.inference.evaluation.report import summary_table

    torch.set_num_threads(1)
    out = tmp_path / "medusa2"
    result = run_recipe("medusa", [
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "medusa_test.yaml"), "variant=medusa2", "max_steps=4",
        "heads_warmup_ratio=0.5", "lora_r=4", "lora_learning_rate=1e-2", "eval_steps=4",
        "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out)])
    artefact, manifest = result.artefact, result.manifest
    assert manifest["target_adapter"] == "adapter" and (artefact / "adapter" / "adapter_config.json").is_file()
    saved = load_file(str(out / "checkpoint-4" / "model.safetensors"))  # trainable parameters only
    assert saved and all("lora_" in k or k.startswith("heads.") for k in saved)
    again = run_recipe("medusa", [  # and such a checkpoint resumes
        "--config", str(ROOT / "launch" / "configs" / "recipes" / "medusa_test.yaml"), "variant=medusa2", "max_steps=4",
        "heads_warmup_ratio=0.5", "lora_r=4", "lora_learning_rate=1e-2", "eval_steps=4",
        "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out),
        "--resume_from_checkpoint", str(out / "checkpoint-2")])
    assert again.manifest["training"]["steps"] == 4
    assert any(name.startswith("adapter/") for name in manifest["weights"])
    assert set(load_file(str(artefact / "heads.safetensors"))) == {f"blocks.{k}.0.linear.{w}" for k in range(3)
                                                                    for w in ("weight", "bias")}
    assert 0 <= manifest["metrics"]["target_top1_agreement"] <= 1 and manifest["metrics"]["target_kl"] >= 0
    lora = load_file(str(next((artefact / "adapter").glob("*.safetensors"))))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in lora.items())  # the adapter trained after the warm-up
    target = random_model("llama", seed=0, layers=2)
    original = {k: v.clone() for k, v in target.state_dict().items()}
    verified = adapted_target(artefact, read_manifest(artefact), target)
    assert all(torch.equal(v, original[k]) for k, v in target.state_dict().items())  # the original is untouched
    assert any(not torch.equal(v, original[k]) for k, v in verified.state_dict().items() if k in original)
    proposer, _ = load_artefact(artefact, verified, None)
    adapter = ModelAdapter(verified)
    for seed in range(2):
        prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
        assert generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer).output_ids == \
            generate(adapter, prompt, GenerationConfig(max_new_tokens=20)).output_ids

    from draftsmith.data.tiny_models import char_tokenizer

    tok = char_tokenizer()
    report = evaluate(verified, tok, "medusa", lambda: proposer, [Question("q1", "x", ("hello there",))],
                      max_new_tokens=12, warmup=0, progress=False, original_model=target)
    drift = report["adapted_target"]
    assert drift["questions"] == 1 and drift["answers_identical_to_original"] in (0.0, 1.0)
    assert 0.0 <= drift["mean_shared_prefix_fraction"] <= 1.0 and report["summary"]["greedy_identical"] == 1.0
    assert "adapted target" in summary_table(report)
    # the vLLM export ships the adapted target beside the heads
    from transformers import AutoModelForCausalLM

    from draftsmith.launch.cli import main

    export = tmp_path / "vllm2"
    assert main(["export", "--artefact", str(artefact), "--format", "vllm-medusa", "--out", str(export),
                 "--target", str(tiny_pair["target"])]) == 0
    ids = torch.randint(3, 100, (1, 9))
    served = AutoModelForCausalLM.from_pretrained(export / "target")
    assert torch.allclose(served(input_ids=ids).logits, verified(input_ids=ids).logits, atol=1e-5)


@pytest.mark.parametrize("path", sorted((ROOT / "launch" / "configs" / "recipes").glob("medusa*.yaml")), ids=lambda p: p.name)
def test_every_shipped_medusa_config_parses(path, tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.medusa.trainer import MedusaConfig

    recipe, medusa, targs = parse_recipe_args(MedusaConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
    assert recipe.config == str(path) and targs.max_steps > 0 and medusa.heads >= 1


@pytest.mark.slow
def test_zoo_medusa_greedy_identical_on_the_dev_questions(zoo_identity):
    """Issue 12, done-when: Medusa-1 token-identical to AR on the bundled dev questions (tiny zoo;
    ``--dev-questions all`` for every one), with its default tree and with the chain."""
    result = zoo_identity.train("medusa")
    for tree in ("auto", "chain"):
        zoo_identity.check(result, "medusa", tree=tree)


def test_accelerate_two_cpu_processes(tiny_pair, tmp_path):
    """recipes/medusa.py under `accelerate launch` with 2 CPU processes (DDP): one heads artefact, world size 2."""
    import os
    import subprocess
    import sys

    out = tmp_path / "acc"
    cfg = ROOT / "launch" / "configs" / "accelerate" / "cpu_2proc.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(cfg), "--main_process_port",
           "29541", str(ROOT / "recipes" / "medusa.py"), "--config", str(ROOT / "launch" / "configs" / "recipes" / "medusa_test.yaml"),
           "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out),
           "ddp_find_unused_parameters=false"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    assert manifest["method"] == "medusa" and manifest["training"]["world_size"] == 2
    assert len(manifest["training"]["head_accuracy"]) == 3


def test_medusa2_under_deepspeed_zero2_two_cpu_processes(tiny_pair, tmp_path):
    """recipes/medusa.py --variant medusa2 under `deepspeed` (ZeRO-2, 2 CPU processes, gloo): the adapter's
    parameters sit out the warm-up with zero gradients, and one artefact with the adapter comes out."""
    import os
    import subprocess
    import sys

    out = tmp_path / "ds"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    cmd = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2", "--master_port", "29543",
           str(ROOT / "recipes" / "medusa.py"), "--config", str(ROOT / "launch" / "configs" / "recipes" / "medusa_test.yaml"),
           "--variant", "medusa2", "lora_r=4", "heads_warmup_ratio=0.5", "--max_steps", "4", "eval_steps=4",
           "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out),
           "--deepspeed", str(ROOT / "launch" / "configs" / "deepspeed" / "zero2.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    assert manifest["training"]["world_size"] == 2 and manifest["target_adapter"] == "adapter"
    assert manifest["training"]["config"]["medusa"]["variant"] == "medusa2"
