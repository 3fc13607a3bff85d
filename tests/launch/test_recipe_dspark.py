"""The DSpark recipe end to end on a tiny random target: a draft trained through the recipe runner, the heads
artefact, the artefact drafting token-identically to AR (whole block, shorter drafts, the confidence stop), and the
command-line ``vllm-dspark`` export read back to the same draft."""

from __future__ import annotations

import json
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
CONFIG = ROOT / "launch" / "configs" / "recipes" / "dspark_test.yaml"


def test_recipe_trains_a_dspark_draft_that_decodes_identically_and_exports_for_vllm(tiny_pair, tmp_path):
    torch.set_num_threads(1)
    target_dir = write_target(tmp_path, 4)
    result = run_recipe("dspark", ["--config", str(CONFIG), "--target", str(target_dir),
                                   "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(tmp_path / "run")])
    artefact, manifest = result.artefact, result.manifest
    assert manifest["kind"] == "heads" and manifest["method"] == "dspark"
    config = json.loads((artefact / "heads_config.json").read_text())
    assert config["method"] == "dspark" and config["block_size"] == 4 and config["markov_rank"] == 8
    assert config["confidence_head"] and config["confidence_with_markov"]
    assert {"slot1_top1", "slot4_top1", "block_tau", "confidence_error"} <= manifest["metrics"].keys()
    assert manifest["proposer"]["draft_length"] == 4  # every query drafts: the whole block
    target = random_model("llama", seed=0, layers=4)  # the recipe's target (same seed)
    adapter = ModelAdapter(target)
    for length, confidence in ((None, 0.0), (2, 0.0), (None, 0.5)):
        proposer, _ = load_artefact(artefact, target, None, draft_length=length, confidence_threshold=confidence)
        assert proposer.length == (length or 4) and proposer.threshold == confidence
        for seed in range(2):
            prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(seed))
            ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
            assert generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer).output_ids == ar.output_ids
    from draftsmith.inference.artefacts.dspark import load_dspark_draft, read_dspark_export
    from draftsmith.launch.cli import main

    export = tmp_path / "export"
    assert main(["export", "--artefact", str(artefact), "--format", "vllm-dspark", "--out", str(export),
                 "--target", str(target_dir)]) == 0
    written = json.loads((export / "config.json").read_text())
    assert written["architectures"] == ["Qwen3DSparkModel"] and "dflash_config" not in written
    assert written["sample_from_anchor"] is True and written["markov_rank"] == 8
    assert written["enable_confidence_head"] is True and written["confidence_head_with_markov"] is True
    assert written["target_layer_ids"] == [i - 1 for i in written["eagle_aux_hidden_state_layer_ids"]]
    back, draft = read_dspark_export(export, target), load_dspark_draft(artefact, target)
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in draft.state_dict().items())


@pytest.mark.parametrize("path", sorted((ROOT / "launch" / "configs" / "recipes").glob("dspark*.yaml")), ids=lambda p: p.name)
def test_every_shipped_dspark_config_parses(path, tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.dspark.trainer import DSparkConfig

    recipe, dspark, targs = parse_recipe_args(DSparkConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
    assert recipe.config == str(path) and targs.max_steps > 0 and dspark.markov_rank >= 1
