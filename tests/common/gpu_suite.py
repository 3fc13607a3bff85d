"""Helpers of the GPU suite (tests/gpu, `make test-gpu`): where it runs, how it times, what it records.

Without CUDA the suite is skipped. ``DRAFTSMITH_GPU_DRY_RUN=1`` runs its logic on the CPU at toy sizes (Triton under
its interpreter) to check the suite itself before a GPU is at hand; its numbers then mean nothing. The report goes to
``DRAFTSMITH_GPU_REPORT_DIR`` (default ``runs/gpu``): ``report.json`` and ``report.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

DRY_RUN = os.environ.get("DRAFTSMITH_GPU_DRY_RUN", "0") == "1"
DEVICE = "cpu" if DRY_RUN else "cuda"
ROOT = Path(__file__).resolve().parents[2]
REPORT_DIR = Path(os.environ.get("DRAFTSMITH_GPU_REPORT_DIR", ROOT / "runs" / "gpu"))

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not DRY_RUN and not torch.cuda.is_available(),
                               reason="no CUDA device (DRAFTSMITH_GPU_DRY_RUN=1 checks the suite's logic on the CPU)")
GPU_MARKS = [gpu, needs_gpu]


def sized(real, dry):
    """``real`` on the GPU, ``dry`` in a dry run."""
    return dry if DRY_RUN else real


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], reps: int = 10, warmup: int = 2) -> float:
    """Median wall time of ``fn`` in milliseconds, the device synchronised around each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_mib(fn: Callable[[], object]) -> float | None:
    """Peak device memory ``fn`` allocates above what was allocated before it, in MiB (None off CUDA)."""
    if DEVICE != "cuda":
        fn()
        return None
    sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    sync()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def environment() -> dict:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "dry_run": DRY_RUN,
           "cuda": torch.version.cuda}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available() and not DRY_RUN:
        props = torch.cuda.get_device_properties(0)
        env |= {"device": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "multiprocessors": props.multi_processor_count}
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    return env


class GpuReport:
    """Rows per section, written as JSON and as markdown tables as they come."""

    def __init__(self) -> None:
        self.sections: dict[str, list[dict]] = {}
        self.started = time.time()

    def add(self, section: str, **row) -> None:
        """Add a row and rewrite the files (a run cut short keeps what it measured)."""
        self.sections.setdefault(section, []).append({k: _plain(v) for k, v in row.items()})
        self.write()

    def write(self, directory: Path = REPORT_DIR) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        data = {"environment": environment(), "seconds": round(time.time() - self.started, 1),
                "sections": self.sections}
        (directory / "report.json").write_text(json.dumps(data, indent=1) + "\n")
        (directory / "report.md").write_text(render_markdown(data))


def _plain(value):
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return value


def render_markdown(data: dict) -> str:
    env = data["environment"]
    lines = ["# GPU suite", "", " · ".join(f"{k} {v}" for k, v in env.items() if v is not None), ""]
    for name, rows in data["sections"].items():
        columns = list(dict.fromkeys(k for row in rows for k in row))
        lines += [f"## {name}", "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
        lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
        lines.append("")
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
