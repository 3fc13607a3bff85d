"""Reliability suite (tests/reliability): fuzzed inputs against every command, and injected faults (read-only
directories, full disks, kill -9), each held to the promises of docs/RELIABILITY.md.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/reliability -q           # fast tier (`make test`)
    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/reliability -q -m slow   # >= 1,000 inputs + kills (`make test-slow`)

Commands run in process (``draftsmith.launch.cli.main``, the recipe runner and the recipe scripts); kills run
subprocesses. An outcome must be exit 2 with exactly one ``error:`` line on stderr and no traceback (or success where
the input is valid), with nothing half-written under the output directory. A pytest run ends with the counts the
reliability page quotes (inputs tried, faults injected, tracebacks, rows and steps lost).
``DRAFTSMITH_RELIABILITY_SURVEY=1`` records every broken promise instead of stopping at the first and lists them by
class at the end; ``DRAFTSMITH_RELIABILITY_SUMMARY=FILE`` also writes the counts as JSON.

The fixtures hand out one :class:`Harness` (running a command and checking its outcome, stubs, Hypothesis settings)
and the inputs the fuzzers mutate: the tiny pair, a real artefact and a tiny GGUF file.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from reliability_ledger import LEDGER, Ledger

HERE = Path(__file__).parent


def _helper(name: str):
    """A helper module of this folder (pytest imports test modules only, and puts no folder on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location(f"draftsmith_reliability_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


H = _helper("harness")
S = _helper("scenarios")


# --------------------------------------------------------------------------------------------------- fixtures


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "fuzz(fast, slow): a fuzz test taking `examples`, run with `fast` inputs by "
                                       "`make test` and with `slow` inputs (marked slow) by `make test-slow`")


def pytest_generate_tests(metafunc) -> None:
    mark = metafunc.definition.get_closest_marker("fuzz")
    if mark is not None and "examples" in metafunc.fixturenames:
        fast, slow = mark.args
        metafunc.parametrize("examples", [pytest.param(fast, id="fast"),
                                          pytest.param(slow, id="slow", marks=pytest.mark.slow)])


@pytest.fixture(scope="session")
def ledger(request) -> Ledger:
    return request.config.stash[LEDGER]


@pytest.fixture(scope="session")
def scratch():
    """One directory for the run's inputs and outputs (pytest's tmp_path is per test; Hypothesis examples need many)."""
    root = Path(tempfile.mkdtemp(prefix="draftsmith-reliability-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _working_directory(scratch, monkeypatch):
    """Every command runs from a scratch folder: a fuzzed relative path (``logging_dir: 2``) lands there, not in the
    checkout."""
    cwd = scratch / "cwd"
    cwd.mkdir(exist_ok=True)
    monkeypatch.chdir(cwd)


@pytest.fixture(scope="session")
def harness(ledger, scratch) -> H.Harness:
    return H.Harness(ledger, scratch)


@pytest.fixture(scope="session")
def scenarios():
    """``scenarios.py``: the commands the fault tests break (``SCENARIOS``, by name) and ``difference``."""
    return S


@pytest.fixture(scope="session")
def pair(scratch) -> dict[str, Path]:
    from tiny_pair import write_pair

    return write_pair(scratch / "pair")


@pytest.fixture(scope="session")
def artefact(pair, scratch) -> Path:
    """A real DistillSpec artefact: two steps of ``launch/configs/recipes/distillspec_test.yaml`` on the tiny pair."""
    from draftsmith.launch.recipe import run_recipe

    out = scratch / "artefact-run"
    argv = H.recipe_argv(pair, out, "distillspec") + ["max_steps=2", "save_steps=2", "eval_steps=2", "report_to=none"]
    return run_recipe("distillspec", argv, None).artefact


@pytest.fixture(scope="session")
def gguf_file(scratch) -> Path:
    import gguf_fixture as gg

    return gg.write_tiny_gguf(scratch / "gguf" / "tiny.gguf").path
