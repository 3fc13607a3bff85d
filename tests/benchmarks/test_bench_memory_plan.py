"""The memory-plan bench measures a real step of each method and reports it beside the plan; ``--replan`` reads it
back without measuring (slow: a process per method, about 40 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.data.tiny_models import random_model


@pytest.mark.slow
def test_the_bench_measures_each_method_beside_its_plan_and_replans_the_json(tmp_path):
    random_model("llama", seed=0, layers=4, vocab_size=512, hidden=64).save_pretrained(tmp_path / "target")
    script = Path(__file__).with_name("bench_memory_plan.py")
    out = tmp_path / "plan.json"
    cmd = [sys.executable, str(script), "--config", str(tmp_path / "target"), "--tokens", "32", "--methods",
           "medusa,eagle3", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [r["method"] for r in results] == ["medusa", "eagle3"]
    assert all(r["measured_gib"] > 0 and r["planned_gib"] > 0 and math_close(r) for r in results)
    replanned = subprocess.run([sys.executable, str(script), "--replan", str(out)], capture_output=True, text=True,
                               timeout=300)
    assert replanned.returncode == 0 and "| eagle3 |" in replanned.stdout


def math_close(r: dict) -> bool:
    """The planned components add up to the planned total."""
    parts = sum(v for k, v in r["planned"].items() if k != "total")
    return abs(parts - r["planned"]["total"]) < 1e-6 and abs(r["planned"]["total"] - r["planned_gib"]) < 1e-9
