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


def test_typical_acceptance_is_reported_as_lossy_with_its_rule(lm_pair, chat_tokenizer, questions_file):
    """A Medusa run under typical acceptance: the report names the rule as the verification, and says LOSSY."""
    from draftsmith.inference.core.sampling import SamplingParams
    from draftsmith.inference.core.trees import tree_from_choices
    from draftsmith.inference.drafters.medusa import MedusaHeads
    from draftsmith.inference.proposers.medusa import MedusaProposer

    target, _ = lm_pair
    heads = MedusaHeads(hidden=48, vocab=target.config.vocab_size, heads=2)
    tree = tree_from_choices([(0,), (1,), (0, 0)])
    factory = lambda: MedusaProposer(heads, target.get_output_embeddings(), tree, typical=(0.09, None))  # noqa: E731
    rep = evaluate(target, chat_tokenizer, "medusa", factory, read_questions(questions_file)[:1], max_new_tokens=8,
                   sampling=SamplingParams(temperature=0.8), warmup=0, progress=False)
    assert rep["lossless"] is False
    assert rep["verification"] == "typical_acceptance(epsilon=0.09, delta=0.3) (LOSSY)"
    assert any(n.startswith("LOSSY") for n in rep["notes"])
    assert "LOSSY METHOD" in render_markdown(rep)
