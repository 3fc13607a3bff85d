"""The precision bench runs each method's step in float32 and under ``auto`` and the target's verification forward
in both, and writes its table (slow: a process per method and dtype)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.data.tiny_models import random_model


@pytest.mark.slow
def test_the_bench_compares_float32_with_auto_per_method_and_for_verification(tmp_path):
    random_model("llama", seed=0, layers=4, vocab_size=512, hidden=64).save_pretrained(tmp_path / "target")
    out = tmp_path / "precision.json"
    cmd = [sys.executable, str(Path(__file__).with_name("bench_precision.py")), "--config", str(tmp_path / "target"),
           "--methods", "eagle3,distillspec", "--tokens", "64", "--rows", "2", "--steps", "1", "--cached", "32",
           "--json", str(out)]
    env = {**os.environ, "DRAFTSMITH_NATIVE_BF16": "1"}  # auto is bfloat16 whatever this CPU reports
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["method"], r["resolved"]) for r in result["training"]] == [
        ("eagle3", "float32"), ("eagle3", "bfloat16"), ("distillspec", "float32"), ("distillspec", "bfloat16")]
    assert all(r["tokens_per_s"] > 0 and r["matmul_gflop"] > 0 for r in result["training"])
    assert [v["resolved"] for v in result["verification"]] == ["float32", "bfloat16"]
    assert set(result["verification"][0]["ms"]) == {"1", "2", "4", "8", "16", "32", "64"}
    assert "| eagle3 | 64 |" in result["table"] and "auto (bfloat16), ms" in result["table"]
