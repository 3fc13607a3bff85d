"""Shared fixtures for the test suite."""

from __future__ import annotations

import os

import pytest
import torch

from draftsmith.data.tiny_models import FAMILIES

pytest_plugins = ["reliability_ledger"]  # the reliability suite's counts, summed over pytest-xdist's workers

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


def pytest_addoption(parser):
    parser.addoption("--dev-questions", default="36", metavar="N|all",
                     help="how many bundled dev questions the slow tiny-zoo identity tests decode: N spread evenly over "
                          "the file (every category; default 36, what fits CI), or `all` (the 324 of the benchmarks)")


def spread(items: list, count: str) -> list:
    """``count`` of ``items`` at even spacing from the first ("all", or a count past the end: every one)."""
    if count == "all":
        return list(items)
    if not count.isdigit() or int(count) < 1:
        raise pytest.UsageError(f"--dev-questions {count!r}: give a positive number or `all`")
    n = min(int(count), len(items))
    return [items[i * len(items) // n] for i in range(n)]


@pytest.fixture(scope="session")
def dev_questions(request) -> list:
    """The bundled dev questions the zoo identity tests decode (``--dev-questions``)."""
    from draftsmith.inference.evaluation.questions import read_questions

    return spread(read_questions(), request.config.getoption("--dev-questions"))
