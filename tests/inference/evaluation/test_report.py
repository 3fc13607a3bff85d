import json

import pytest
import torch

from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.evaluation.evaluator import evaluate
from draftsmith.inference.evaluation.questions import read_questions
from draftsmith.inference.evaluation.report import render_markdown, report_paths, summary_table, write_report
from draftsmith.inference.proposers.draft_model import DraftModelProposer

pytestmark = pytest.mark.usefixtures("one_thread")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(lm_pair, chat_tokenizer, questions_file):
    target, draft = lm_pair
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return evaluate(
            target, chat_tokenizer, "draft", lambda: DraftModelProposer(draft, DraftLengthPolicy(length=3)),
            read_questions(questions_file), max_new_tokens=10, warmup=0, progress=False, compare_hf=True,
            command="draftsmith eval --method draft --limit 3", question_file=str(questions_file),
        )
    finally:
        torch.set_num_threads(threads)


def test_paths_sit_beside_the_json(tmp_path):
    p = report_paths(tmp_path / "runs" / "r1.json")
    assert p["markdown"] == tmp_path / "runs" / "r1.md"
    assert p["accept_lengths_png"] == tmp_path / "runs" / "r1_accept_lengths.png"
    assert p["categories_png"] == tmp_path / "runs" / "r1_categories.png"
    assert report_paths(tmp_path / "r2")["json"] == tmp_path / "r2.json"


def test_writes_json_markdown_and_plots(report, tmp_path):
    paths = write_report(report, tmp_path / "out" / "report.json")
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(report))
    for key in ("accept_lengths_png", "categories_png"):
        data = paths[key].read_bytes()
        assert data[:8] == PNG and len(data) > 2000
    md = paths["markdown"].read_text()
    assert "## Summary" in md and "## By category" in md and "transformers baselines" in md
    assert "| chat | 1 |" in md and "| code | 1 |" in md and "| math | 1 |" in md
    assert "hf_assisted" in md and "hf_prompt_lookup" in md
    assert "lossless rule; 3/3 answers token-identical to AR" in md
    assert "draftsmith eval --method draft --limit 3" in md
    assert "report_accept_lengths.png" in md
    assert not list(paths["json"].parent.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_lossy_and_differing_answers_are_shown(report):
    lossy = dict(report, lossless=False)
    md = render_markdown(lossy)
    assert "LOSSY METHOD" in md and "LOSSY" in summary_table(lossy)
    differing = json.loads(json.dumps(report))
    differing["questions"][0]["difference"] = {"turn": 0, "position": 4, "top2_gap": 2e-7, "near_tie": True}
    md = render_markdown(differing)
    assert "## Answers that differ from AR" in md and "| 1 | 1 | 4 |" in md
    assert "1 differ at a near-tie" in md


def test_sampling_report_says_identity_is_not_checked(report):
    sampled = json.loads(json.dumps(report))
    sampled["summary"]["greedy_identical"] = None
    assert "check-distribution" in render_markdown(sampled)


def test_summary_table_lists_baselines(report):
    table = summary_table(report)
    assert "speedup vs AR" in table and "hf_assisted speedup / tau" in table
