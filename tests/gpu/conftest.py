"""The GPU suite's report: every test adds rows to runs/gpu/report.json and report.md."""

from __future__ import annotations

import pytest
from gpu_suite import DRY_RUN, GpuReport

if DRY_RUN:  # Triton's CPU interpreter must be chosen before triton is first imported
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def gpu_report():
    return GpuReport()
