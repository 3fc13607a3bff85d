"""`draftsmith eval --engine vllm|both` end to end through a stand-in engine (tests/common/fake_engine.py): the
report's identity, acceptance and parity, and the refusals. The real round trip is `make test-engine`."""

from __future__ import annotations

import json

import pytest
from fake_engine import counters, make_fake_engine

from draftsmith.launch.cli import main


@pytest.fixture
def questions(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"question_id": i, "category": "ab"[i % 2], "turns": [f"What is {i} plus {i}?",
                                                                                        "And twice that?"]}) + "\n"
                         for i in range(4)))
    return q


def test_engine_both_reports_identity_acceptance_and_parity(tiny_pair, questions, tmp_path, capsys):
    fake, out = make_fake_engine(tmp_path), tmp_path / "eval" / "report.json"
    assert main(["eval", "--engine", "both", "--method", "pld", "--target", str(tiny_pair["target"]),
                 "--questions", str(questions), "--max-new-tokens", "12", "--warmup", "0", "--no-progress",
                 "--draft-length", "3", "--concurrency", "1,2", "--engine-python", str(fake), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    s = report["summary"]
    assert report["engine_method"] == "ngram" and report["num_speculative_tokens"] == 3
    assert s["identical_to_draftsmith_ar"] == 1.0 and s["engine_ar_identical_to_draftsmith_ar"] == 1.0
    assert report["differences"]["speculative_vs_draftsmith_ar"]["identical"] == 4
    expected = [sum(counters(q["tokens"], 3)["per_pos"][i] for q in report["questions"]) /
                sum(counters(q["tokens"], 3)["drafts"] for q in report["questions"]) for i in range(3)]
    assert s["acceptance_by_position"] == pytest.approx(expected)
    assert set(report["categories"]) == {"a", "b"} and [r["concurrency"] for r in report["throughput"]] == [1, 2]
    ds = json.loads((tmp_path / "eval" / "report_draftsmith.json").read_text())
    assert ds["summary"]["num_questions"] == 4
    # first turns only, as the engine answered them: the same answer lengths question by question
    assert [len(q["output_ids"]) for q in ds["questions"]] == [1] * 4  # one turn each
    assert [q["new_tokens"] for q in ds["questions"]] == [[q["tokens"]] for q in report["questions"]]
    assert report["parity"]["draftsmith"][: len(ds["summary"]["acceptance_by_position"])] == pytest.approx(
        ds["summary"]["acceptance_by_position"])
    assert "vLLM - draftsmith" in capsys.readouterr().out


def test_engine_refusals_are_one_line(tiny_pair, questions, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    base = ["eval", "--target", str(tiny_pair["target"]), "--questions", str(questions), "--max-new-tokens", "4"]
    assert main([*base, "--engine", "vllm", "--method", "pld"]) == 2
    assert "make engine" in capsys.readouterr().err
    fake = make_fake_engine(tmp_path)
    assert main([*base, "--engine", "vllm", "--method", "jacobi", "--engine-python", str(fake)]) == 2
    assert "no vLLM counterpart" in capsys.readouterr().err
    assert main([*base, "--engine", "vllm", "--method", "pld", "--temperature", "0.7", "--engine-python", str(fake)]) == 2
    assert "greedy" in capsys.readouterr().err

