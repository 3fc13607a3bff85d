"""Every target family through vLLM (`make test-engine`; skipped without the vLLM environment): on each family's tiny
zoo (built on first use, minutes), an EAGLE-3 head, a P-EAGLE head and a DFlash draft trained briefly, exported, and
served by vLLM draft as in draftsmith's loop (acceptance within 0.01 at every position) and change no answer.
The same run at the bench's budget: ``tests/benchmarks/bench_families.py`` (docs/BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from draftsmith.common.errors import EngineError
from draftsmith.data.zoo import ZOO_FAMILIES
from draftsmith.inference.engines.environment import engine_python

pytestmark = pytest.mark.engine
BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_families.py"


@pytest.fixture(scope="module")
def bench():
    try:
        engine_python()
    except EngineError as err:
        pytest.skip(str(err))
    spec = importlib.util.spec_from_file_location("draftsmith_bench_families", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("family", ZOO_FAMILIES)
def test_every_familys_drafters_draft_in_vllm_as_in_draftsmith(bench, family, tmp_path):
    for method in bench.METHODS:
        result = bench.round_trip(family, method, steps=40, examples=256, limit=8, max_new_tokens=32, out=tmp_path)
        assert result["identical_to_engine_ar"] == 1.0 and result["differs_from_draftsmith_ar"] == 0, result
        assert sum(result["vllm"]) > 0 and result["max_abs_difference"] <= 0.01, result
