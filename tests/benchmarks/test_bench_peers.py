"""bench_peers.py at a toy budget (slow): the three trainers train, vLLM serves every head and the table is made;
then DFlash against speculators' dflash on the same rows.
Skips, with the reason, where a peer's or vLLM's environment is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


def bench():
    spec = importlib.util.spec_from_file_location("draftsmith_bench_peers", HERE / "bench_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_trainer_trains_and_vllm_serves_every_head(tmp_path):
    from draftsmith.common.errors import EngineError
    from draftsmith.common.paths import zoo_dir
    from draftsmith.inference.engines.environment import engine_python, engine_versions

    module = bench()
    for peer in module.PEERS:
        if not (module.peer_dir(peer) / "bin" / "python").is_file():
            pytest.skip(f"no {peer} environment at {module.peer_dir(peer)}: `python {HERE / 'bench_peers.py'} setup`")
    try:
        engine_versions(engine_python())
    except EngineError as err:
        pytest.skip(f"no vLLM environment: {err}")
    if not (zoo_dir("tiny") / "target" / "config.json").is_file():
        pytest.skip("no tiny zoo: `draftsmith zoo build --size tiny`")
    assert module.main(["run", "--steps", "4", "--examples", "32", "--limit", "2", "--max-new-tokens", "8",
                        "--draft-length", "2", "--out", str(tmp_path)]) == 0
    import json

    result = json.loads((tmp_path / "steps4" / "result.json").read_text())
    for name in ("draftsmith", *module.PEERS):
        served = result["served"][name]
        assert served["drafts"] > 0 and len(served["acceptance_by_position"]) == 2
        assert result[name]["tokens_per_s"] > 0 and result[name]["process"]["peak_rss_mib"] > 0
    assert module.main(["run", "--method", "dflash", "--steps", "4", "--examples", "32", "--limit", "2",
                        "--max-new-tokens", "8", "--out", str(tmp_path)]) == 0
    dflash = json.loads((tmp_path / "dflash" / "steps4" / "result.json").read_text())
    for name in ("draftsmith", "speculators"):  # DFlash against speculators' dflash, on the same rows
        assert dflash["served"][name]["drafts"] > 0 and dflash[name]["tokens_per_s"] > 0
