"""The commands that time the target on the GPU it will run on (``--device``/``--dtype``): the exit-layer choice and
the Draft & Verify search, on a tiny random target in bfloat16. Each finishes, its choice is recorded, and its
report says what it picked."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gpu_suite import DEVICE, GPU_MARKS
from tiny_pair import write_pair

pytestmark = GPU_MARKS


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    return write_pair(tmp_path_factory.mktemp("gpu_commands"), target_layers=4)


def test_the_exit_layer_choice_runs_on_the_device(pair, tmp_path, gpu_report):
    from draftsmith.launch.cli import main

    out = tmp_path / "exits.json"
    start = time.perf_counter()
    assert main(["exit-layer", "--target", str(pair["target"]), "--device", DEVICE, "--dtype", "bfloat16",
                 "--prompts", "2", "--max-new-tokens", "8", "--out", str(out)]) == 0
    chosen = json.loads(out.read_text())["chosen"]
    gpu_report.add("commands that time the target, on the device (bfloat16)", command="exit-layer",
                   seconds=time.perf_counter() - start, choice=f"exit {chosen['exit_layer']}, "
                                                            f"length {chosen['draft_length']}")


def test_the_draft_and_verify_search_runs_on_the_device(pair, tmp_path, gpu_report):
    from draftsmith.launch.draft_verify import main

    out = tmp_path / "dv"
    start = time.perf_counter()
    assert main(["--target", str(pair["target"]), "--device", DEVICE, "--dtype", "bfloat16", "--n-trials", "3",
                 "--prompts", "2", "--max-new-tokens", "8", "--output_dir", str(out), "--no-progress"]) == 0
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    gpu_report.add("commands that time the target, on the device (bfloat16)", command="draft-verify search",
                   seconds=time.perf_counter() - start,
                   choice=json.dumps(manifest["training"]["skip_picture"])[:80])
