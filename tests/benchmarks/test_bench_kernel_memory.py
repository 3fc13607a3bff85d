"""The kernel memory benchmark script runs and shows the chunked loss needing less memory (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_chunked_reference_needs_less_memory_than_naive(tmp_path):
    script = Path(__file__).with_name("bench_kernel_memory.py")
    out_json = tmp_path / "memory.json"
    # chunks of 128 rows: the CPU's default budget (kernels/reference.CPU_CHUNK_BYTES) takes this small table whole
    cmd = [sys.executable, str(script), "--tokens", "512", "--hidden", "64", "--vocab", "8000", "--chunk-size", "128"]
    cmd += ["--variants", "naive,chunked", "--json", str(out_json)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results = {r["variant"]: r for r in json.loads(out_json.read_text())["results"]}
    naive, chunked = results["naive"], results["chunked"]
    assert chunked["loss"] == pytest.approx(naive["loss"], rel=1e-5)
    assert chunked["grad_weight_norm"] == pytest.approx(naive["grad_weight_norm"], rel=1e-4)
    # one [512, 8000] float32 table is 16 MB; the naive loss holds about ten of them, a chunk a quarter of one
    assert chunked["loss_peak_mb"] * 2 < naive["loss_peak_mb"]
