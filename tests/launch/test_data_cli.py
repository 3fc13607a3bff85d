"""`draftsmith data generate` end to end on the tiny random target saved to disk (tiny_pair from conftest.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from draftsmith.inference.engines.environment import VLLM_VERSION
from draftsmith.launch.cli import main
from draftsmith.launch.data_cli import load_prompts

QUESTIONS = [
    {"question_id": 7, "category": "math", "turns": ["What is 1 plus 1?", "And 2 plus 2?"]},
    {"question_id": "b", "category": "chat", "turns": ["Say hi."]},
]


def _generate(target, prompts, out, *extra):
    return main(["data", "generate", "--target", str(target), "--prompts", str(prompts), "--out", str(out),
                 "--max-new-tokens", "8", "--threads", "1", "--no-progress", *map(str, extra)])


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_generate_a_dataset_then_resume_and_compare_with_sequential(tiny_pair, tmp_path, capsys):
    out = tmp_path / "sd" / "answers.jsonl"
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], out, "--limit", 6, "--batch-size", 4) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith(f"{out}: 6 rows (6 new)") and "tokens/s" in summary
    rows = _rows(out)
    assert [r["messages"][0]["content"] for r in rows] == [f"What is {i} plus {i}?" for i in range(6)]
    assert all(r["messages"][-1]["role"] == "assistant" and len(r["messages"]) == 2 for r in rows)
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    assert meta["prompts"]["source"] == str(tiny_pair["dataset"]) and meta["target"]["name_or_path"] == str(
        tiny_pair["target"])
    assert meta["settings"] == {"temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new_tokens": 8}

    assert _generate(tiny_pair["target"], tiny_pair["dataset"], out, "--limit", 8) == 0  # resume, 2 more
    assert "8 rows (2 new)" in capsys.readouterr().out
    assert _rows(out)[:6] == rows and len(_rows(out)) == 8

    seq = tmp_path / "seq.jsonl"
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], seq, "--limit", 8, "--sequential") == 0
    assert seq.read_text() == out.read_text()  # one at a time gives the same answers
    assert json.loads(Path(f"{seq}.meta.json").read_text())["runs"][0]["batch_size"] == 1


def test_question_sets_and_files(tiny_pair, tmp_path, capsys):
    qfile = tmp_path / "question.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    out = tmp_path / "q.jsonl"
    assert _generate(tiny_pair["target"], qfile, out, "--temperature", 0.8, "--top-p", 0.9, "--seed", 2) == 0
    rows = _rows(out)
    assert [r["id"] for r in rows] == ["7", "b"]
    assert rows[0]["messages"][0] == {"role": "user", "content": "What is 1 plus 1?"}  # the first turn
    ids, prompts, source = load_prompts("dev", limit=3)
    assert len(ids) == 3 == len(prompts) and source == "questions:dev"
    assert all(len(p) == 1 and p[0]["role"] == "user" for p in prompts)


def test_corpus_prompts_are_user_turns():
    ids, prompts, source = load_prompts("corpus", limit=4)
    assert source == "corpus:train" and len(set(ids)) == 4
    assert all(len(p) == 1 and p[0]["role"] == "user" and p[0]["content"].strip() for p in prompts)


def test_corpus_prompts_with_a_limit_share_it_among_the_sources():
    from collections import Counter

    from draftsmith.data.corpus import load_corpus
    from draftsmith.data.self_distill import corpus_prompts, prompt_turns

    source_of = {json.dumps(prompt_turns(ex["messages"])): ex["source"] for ex in load_corpus("train") if "messages" in ex}
    counts = Counter(source_of[json.dumps(p)] for p in corpus_prompts("train", limit=40))
    assert len(counts) == 4 and set(counts.values()) == {10}  # not the first 40 rows of the file, all code prompts
    assert corpus_prompts("train", limit=40) == corpus_prompts("train", limit=40)  # seeded


def test_other_settings_on_resume_is_a_one_line_error(tiny_pair, tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], out, "--limit", 2) == 0
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], out, "--limit", 2, "--temperature", 0.5) == 2
    line = _one_line_error(capsys)
    assert "other settings" in line and "--overwrite" in line
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], out, "--limit", 2, "--temperature", 0.5,
                     "--overwrite") == 0
    bad = tmp_path / "text.jsonl"
    bad.write_text('{"text": "just text"}\n')
    assert _generate(tiny_pair["target"], bad, tmp_path / "b.jsonl") == 2
    assert "plain text" in _one_line_error(capsys)
    assert _generate(tiny_pair["target"], tmp_path / "missing.jsonl", tmp_path / "b.jsonl") == 2
    assert "not found" in _one_line_error(capsys)


def test_benchmark_script_reports_both_speeds(tiny_pair, tmp_path):
    path = Path(__file__).parents[1] / "benchmarks" / "bench_self_distill.py"
    spec = importlib.util.spec_from_file_location("bench_self_distill", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--target", str(tiny_pair["target"]), "--prompts", str(tiny_pair["dataset"]), "--n", "4",
                         "--batch-size", "4", "--max-new-tokens", "6", "--threads", "1",
                         "--json", str(tmp_path / "bench.json")])
    assert {"sequential", "batched", "speedup", "identical_rows"} <= result.keys()
    assert result["batched"]["tokens_per_s"] > 0 and result["identical_rows"] == 1.0
    assert json.loads((tmp_path / "bench.json").read_text())["speedup"] == pytest.approx(result["speedup"])


def test_jacobi_trajectories_from_the_command_line(tiny_pair, tmp_path, capsys):
    """`draftsmith data jacobi`: every prompt's blocks, ending at the target's greedy answer; a rerun adds nothing;
    other settings on the same file are a one-line error."""
    from draftsmith.data.jacobi import read_trajectories

    out = tmp_path / "traj.jsonl"
    args = ["data", "jacobi", "--target", str(tiny_pair["target"]), "--prompts", str(tiny_pair["dataset"]), "--out",
            str(out), "--limit", "5", "--block", "4", "--max-new-tokens", "8", "--batch-size", "2", "--threads", "1",
            "--no-progress"]
    assert main(args) == 0
    rows = read_trajectories(out)
    assert len({r["id"] for r in rows}) == 5 and all(r["states"][-1] == r["fixed_point"] for r in rows)
    assert "5 prompts" in capsys.readouterr().out
    before = out.read_bytes()
    assert main(args) == 0 and out.read_bytes() == before
    assert main([*args[:-5], "--block", "8", "--threads", "1", "--no-progress"]) == 2
    assert "other settings" in _one_line_error(capsys)


def test_the_target_writes_prompts_then_answers_them_beside_another_set(tiny_pair, tmp_path, capsys):
    """`draftsmith data prompts` (Magpie) writes a prompt set; `data generate` answers it and a second --prompts set
    into one file; a repeated run adds nothing."""
    prompts = tmp_path / "prompts.jsonl"
    args = ["data", "prompts", "--target", str(tiny_pair["target"]), "--out", str(prompts), "--count", "3",
            "--max-new-tokens", "48", "--min-words", "1", "--threads", "1", "--no-progress"]
    assert main(args) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith(f"{prompts}: 3 prompts of ") and "attempts" in summary
    mine = _rows(prompts)
    out = tmp_path / "answers.jsonl"
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], out, "--limit", 2, "--prompts", prompts) == 0
    rows = _rows(out)
    assert [r["messages"][0]["content"] for r in rows] == ["What is 0 plus 0?", "What is 1 plus 1?",  # --limit: each
                                                          *(m["messages"][0]["content"] for m in mine[:2])]
    assert [r["id"] for r in rows[2:]] == [m["id"] for m in mine[:2]] and all(len(r["messages"]) == 2 for r in rows)
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    assert meta["prompts"]["source"] == f"{tiny_pair['dataset']}+{prompts}" and meta["prompts"]["count"] == 4
    # one --limit per set: the dataset stays cut at 2, the Magpie set is answered whole (the file resumes)
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], out, "--limit", 2, "--prompts", prompts,
                     "--limit", "all") == 0
    assert [r["id"] for r in _rows(out)] == [*(r["id"] for r in rows), mine[2]["id"]]
    capsys.readouterr()
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], out, "--limit", 2, "--prompts", prompts,
                     "--limit", 1, "--limit", 1) == 2
    assert "3 --limit values for 2 --prompts sets" in _one_line_error(capsys)
    assert main(args) == 0 and _rows(prompts) == mine
    assert main([*args, "--temperature", "0"]) == 2
    assert "greedy" in _one_line_error(capsys)


def test_data_prompts_openers_steer_each_request(tiny_pair, tmp_path, capsys):
    """`--openers tasks` starts every request with a built-in opener in turn; an unknown set is a one-line error."""
    from draftsmith.data.synthetic_prompts import TASK_OPENERS

    prompts = tmp_path / "tasks.jsonl"
    args = ["data", "prompts", "--target", str(tiny_pair["target"]), "--out", str(prompts), "--count", "3",
            "--max-new-tokens", "48", "--min-words", "1", "--threads", "1", "--no-progress"]
    assert main([*args, "--openers", "tasks"]) == 0
    for row in _rows(prompts):
        assert row["opener"] == row["attempt"] % len(TASK_OPENERS)
        assert row["messages"][0]["content"].startswith(TASK_OPENERS[row["opener"]].strip())
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "x.jsonl"), "--openers", "no-such-set"]) == 2
    assert "neither a built-in set" in _one_line_error(capsys)


def test_generate_through_the_engine_writes_the_same_rows_and_a_killed_run_resumes(tiny_pair, tmp_path, capsys,
                                                                                     monkeypatch):
    """`data generate --engine vllm` through the stand-in engine (tests/common/fake_engine.py): the same file as the
    built-in generator's; an engine that dies after one batch keeps that batch's rows, and a rerun adds the rest
    with none lost or duplicated."""
    from fake_engine import make_fake_engine

    fake = make_fake_engine(tmp_path)
    ours, theirs = tmp_path / "ours.jsonl", tmp_path / "engine.jsonl"
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], ours, "--limit", 6, "--batch-size", 2) == 0
    monkeypatch.setenv("FAKE_ENGINE_STOP_AFTER", "1")
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], theirs, "--limit", 6, "--batch-size", 2,
                     "--engine", "vllm", "--engine-python", fake) == 2
    assert "rerun to answer the rest" in _one_line_error(capsys) and len(_rows(theirs)) == 2
    monkeypatch.delenv("FAKE_ENGINE_STOP_AFTER")
    assert _generate(tiny_pair["target"], tiny_pair["dataset"], theirs, "--limit", 6, "--batch-size", 2,
                     "--engine", "vllm", "--engine-python", fake) == 0
    assert "6 rows (4 new)" in capsys.readouterr().out
    assert _rows(theirs) == _rows(ours)  # greedy: the engine's answers are the target's, row for row, in prompt order
    runs = json.loads(Path(f"{theirs}.meta.json").read_text())["runs"]
    assert [r["generator"] for r in runs] == [f"vllm {VLLM_VERSION}"] * 2
