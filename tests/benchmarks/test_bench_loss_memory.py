"""Every method's training step needs at most 1.5x the memory of DistillSpec's chunked step (slow), while the
unchunked DistillSpec step, which holds [tokens, vocabulary] float32 tables, needs several times it. The full-size
run (V=128,256, H=512, 4,096 tokens) is ``python tests/benchmarks/bench_loss_memory.py``; this one is small (V=32,000,
H=64, 2,048 tokens) to stay a few minutes on one core. A chunked step holds a fixed handful of ``[C, V]`` chunks
(on the CPU at least 128 rows each, ``kernels.reference.CPU_MIN_CHUNK_ROWS``: about 300 MB at this V), so the batch
has to be long enough for that to be small against its ``[N, V]`` tables (at 1,024 tokens it is 2.4 of them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(script_loader):
    return script_loader("bench_loss_memory")


@pytest.mark.slow
def test_every_methods_step_is_within_1_5x_of_distillspecs_chunked_step(bench, tmp_path):
    script = Path(__file__).with_name("bench_loss_memory.py")
    out_json = tmp_path / "memory.json"
    methods = ",".join(bench.METHODS + bench.BASELINES)
    cmd = [sys.executable, str(script), "--vocab", "32000", "--hidden", "64", "--tokens", "2048", "--rows", "8",
           "--methods", methods, "--json", str(out_json)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    results = {r["method"]: r for r in json.loads(out_json.read_text())["results"]}
    assert set(results) == set(bench.METHODS + bench.BASELINES)
    base = results["distillspec"]["step_mb"]
    table = 2048 * 32000 * 4 / 2**20  # one float32 [N, V] table: 250 MB
    assert base < 2 * table  # the chunked step holds no pair of tables
    ratios = {m: r["step_mb"] / base for m, r in results.items() if m in bench.METHODS}
    assert all(r <= 1.5 for r in ratios.values()), ratios
    assert results["distillspec-unchunked"]["step_mb"] > 2 * base  # what the bound would catch


def test_the_markdown_table_reports_each_ratio_to_distillspec(bench):
    rows = [{"method": "distillspec", "step_mb": 200.0, "peak_rss_mb": 900.0, "seconds": 1.0, "loss_tokens": 10},
            {"method": "medusa", "step_mb": 100.0, "peak_rss_mb": 800.0, "seconds": 2.0, "loss_tokens": 10}]
    text = bench.table(rows)
    assert "| distillspec | 200 | 1.00 |" in text and "| medusa | 100 | 0.50 |" in text
