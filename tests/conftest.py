"""Shared fixtures for the test suite."""

from __future__ import annotations

import os

import pytest
import torch

from draftsmith.data.tiny_models import FAMILIES

# pytest-xdist's workers share the cores: each gets its share of threads, and so do the commands it launches.
_THREADS = max(1, min(2, os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
torch.set_num_threads(_THREADS)
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
# The suite checks exact (float32) identity on every CPU, with or without native bfloat16, in this process and in
# the commands it launches; the bfloat16 policy's tests set it themselves. DRAFTSMITH_NATIVE_BF16=1 runs the suite
# as a bfloat16 machine's defaults would.
os.environ.setdefault("DRAFTSMITH_NATIVE_BF16", "0")


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and much faster on a machine shared with other jobs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
