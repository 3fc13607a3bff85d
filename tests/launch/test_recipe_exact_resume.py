"""Resume is exact for every recipe: a run stopped after its step-2 checkpoint (as a kill -9 leaves it: the
checkpoints alone, the global random generators elsewhere) and resumed gives the uninterrupted run's logged losses and
final weights bit for bit. One in-process run of 4 steps per recipe and variant on the tiny pair of
tests/common/tiny_pair.py, then a resume from a copy of its checkpoint-2; the slower recipes are marked slow
(tests/reliability/test_faults_kill.py kills real processes at random points, in the slow tier)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.launch.recipe import run_recipe

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "launch" / "configs" / "recipes"

# (method, its test config, settings of the variant); slow ones: a target copy (Medusa-2), Jacobi trajectories (CLLM),
# calibration runs
CASES = [
    pytest.param("distillspec", "distillspec_test.yaml", [], id="distillspec"),
    pytest.param("medusa", "medusa_test.yaml", [], id="medusa1"),
    pytest.param("eagle", "eagle_test.yaml", [], id="eagle1"),
    pytest.param("eagle", "eagle_test.yaml", ["variant=eagle3", "ttt_steps=2", "draft_vocab_size=64"], id="eagle3"),
    pytest.param("dflash", "dflash_test.yaml", [], id="dflash"),
    pytest.param("eagle", "eagle_test.yaml", ["variant=peagle", "ttt_steps=3", "draft_length=3", "tree_depth=3"],
                 id="peagle", marks=pytest.mark.slow),
    pytest.param("medusa", "medusa_test.yaml", ["variant=medusa2"], id="medusa2", marks=pytest.mark.slow),
    pytest.param("layerskip", "layerskip_test.yaml", [], id="layerskip", marks=pytest.mark.slow),
    pytest.param("bita", "bita_test.yaml", [], id="bita", marks=pytest.mark.slow),
    pytest.param("cllm", "cllm_test.yaml", [], id="cllm", marks=pytest.mark.slow),
]


def logged_losses(checkpoint: Path) -> list[tuple[int, float]]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [(h["step"], h["loss"]) for h in state["log_history"] if "loss" in h]


@pytest.mark.parametrize("method, config, extra", CASES)
def test_a_run_resumed_from_its_checkpoint_is_the_uninterrupted_run_bit_for_bit(tiny_pair, tmp_path, method, config,
                                                                               extra):
    from tiny_pair import write_target

    from draftsmith.common.registry import get_method

    torch.set_num_threads(1)
    # EAGLE-3 and P-EAGLE fuse three target layers, DFlash reads two: a 4-layer target of the pair's shape
    target = write_target(tmp_path, 4) if method == "dflash" or extra else tiny_pair["target"]

    def run(out: Path, *more: str):
        argv = ["--config", str(CONFIGS / config), "--target", str(target), "--dataset",
                str(tiny_pair["dataset"]), "--output_dir", str(out), "max_steps=4", "save_steps=2", "logging_steps=1",
                "eval_strategy=no", "report_to=none", "evaluate=false", "tune=false", "calibrate_tree=false",
                "save_total_limit=3", *extra, *more]
        if "draft" in get_method(method).models:
            argv += ["--draft", str(tiny_pair["draft"])]
        return run_recipe(method, argv, None)

    whole = tmp_path / "whole"
    run(whole)
    cut = tmp_path / "cut"
    shutil.copytree(whole / "checkpoint-2", cut / "checkpoint-2")  # what a kill after checkpoint-2 leaves
    torch.manual_seed(1234), random.seed(1234), torch.rand(1000)  # the process's generators are elsewhere
    run(cut, "--resume_from_checkpoint", "latest")

    assert len(logged_losses(whole / "checkpoint-4")) == 4
    assert logged_losses(cut / "checkpoint-4") == logged_losses(whole / "checkpoint-4")
    for weights in sorted((whole / "checkpoint-4").glob("*.safetensors")):
        expected, got = load_file(str(weights)), load_file(str(cut / "checkpoint-4" / weights.name))
        assert expected.keys() == got.keys()
        assert all(torch.equal(expected[k], got[k]) for k in expected), f"{weights.name} differs after the resume"
