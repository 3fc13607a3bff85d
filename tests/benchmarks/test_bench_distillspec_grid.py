"""The DistillSpec grid driver: every cell's overrides are valid recipe settings, and the table is right."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith.launch.recipe_args import parse_recipe_args
from draftsmith.trainers.distillspec.trainer import DistillSpecConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def grid(script_loader):
    return script_loader("bench_distillspec_grid")


@pytest.mark.parametrize("mode", ["fixed", "onpolicy", "mixed", "target"])
@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd", "tvd"])
def test_every_cell_parses_as_the_recipe_would(grid, divergence, mode, tmp_path):
    overrides = grid.cell_overrides(divergence, mode, steps=300, lmbda=0.5, generation_temperature=0.0)
    recipe, distill, targs = parse_recipe_args(
        DistillSpecConfig,
        [f"output_dir={tmp_path}", *overrides], ROOT / "launch" / "configs" / "recipes" / "distillspec_tiny.yaml",
    )
    assert (distill.divergence, distill.data_mode, distill.lmbda) == (divergence, mode, 0.5)
    assert distill.mixed_with == "fixed" and distill.generation_temperature == 0.0
    assert targs.max_steps == 300 and recipe.evaluate is False
    # the budget is the shipped config's apart from the step count: same batch, learning rate and seed
    assert (targs.per_device_train_batch_size, targs.learning_rate, targs.seed) == (8, 3e-4, 0)


def test_eval_command_measures_the_draft_alone(grid, tmp_path):
    cmd = grid.eval_command(tmp_path / "artefact", tmp_path / "r.json", limit=40, max_new_tokens=96, draft_length=4)
    assert cmd[1:4] == ["eval", "--artefact", str(tmp_path / "artefact")]
    assert cmd[cmd.index("--draft-confidence") + 1] == "0" and cmd[cmd.index("--draft-length") + 1] == "4"
    assert grid.eval_command(None, tmp_path / "r.json", 40, 96, 4)[2:4] == ["--method", "draft"]


def test_markdown_table(grid):
    cell = {"tau": 3.25, "speedup": 1.4}
    table = grid.markdown_table({"tvd/fixed": cell, "tvd/mixed": {"tau": 2.5, "speedup": 1.1}},
                                {"tau": 2.0, "speedup": 0.9})
    lines = table.splitlines()
    assert lines[0] == "| divergence | fixed: tau (speedup) | mixed: tau (speedup) |"
    assert lines[2] == "| tvd | 3.250 (1.40x) | 2.500 (1.10x) |"
    assert lines[3].startswith("| zoo draft, not distilled | 2.000 (0.90x) |")


def test_summarize_cell_reads_report_and_manifest(grid):
    report = {"summary": {"tau": 3.0, "acceptance_rate": 0.6, "speedup": 1.2, "greedy_identical": 1.0}}
    manifest = {"metrics": {"predicted_tau_greedy": 2.9, "estimated_acceptance": 0.7}, "training": {"tokens": 1000}}
    cell = grid.summarize_cell(report, manifest, 12.5)
    assert cell["tau"] == 3.0 and cell["predicted_tau_greedy"] == 2.9 and cell["tokens"] == 1000
    assert cell["train_seconds"] == 12.5
