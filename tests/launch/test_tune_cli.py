"""`draftsmith tune` on a tiny random pair: the manifest gets the chosen settings and the tuning record, and
`draftsmith eval --artefact` uses them."""

import json

import transformers

from draftsmith.common.models import target_identity
from draftsmith.inference.artefacts.manifest import write_artefact
from draftsmith.launch.cli import main
from draftsmith.launch.tune_cli import calibration_questions


def test_calibration_prompts_are_held_out_and_cover_every_source():
    questions = calibration_questions(12)
    assert len(questions) == 12 and len({q.category for q in questions}) >= 4
    from draftsmith.data.corpus import load_corpus

    train_prompts = {r["messages"][0]["content"] for r in load_corpus("train") if "messages" in r}
    assert not {q.turns[0] for q in questions} & train_prompts


def test_tune_writes_the_choice_into_the_manifest(tiny_pair, tmp_path, capsys):
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    draft = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["draft"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_pair["target"])
    out = tmp_path / "artefact"
    write_artefact(out, "draft_model", method="distillspec", target=target_identity(target, tokenizer),
                   proposer={"draft_length": 4, "model_dir": "draft"}, model=draft, tokenizer=tokenizer)
    assert main(["tune", "--artefact", str(out), "--target", str(tiny_pair["target"]), "--prompts", "3",
                 "--max-new-tokens", "8", "--max-length", "4", "--measure-top", "2", "--threads", "1"]) == 0
    assert "chosen: " in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    tuning = manifest["tuning"]
    chosen = tuning["chosen"]
    assert manifest["proposer"]["draft_length"] == chosen["draft_length"] <= 4
    assert manifest["proposer"]["confidence_threshold"] == chosen["confidence_threshold"]
    assert manifest["proposer"]["draft_length_mode"] == chosen["draft_length_mode"]
    assert [c["draft_length_mode"] for c in tuning["top_predicted"]]  # every policy was ranked
    assert chosen["measured_speedup"] is not None and tuning["runner_up"]["measured_speedup"] is not None
    assert tuning["calibration"]["prompts"] == 3 and tuning["cost_model"]["verify_seconds"]["1"] > 0

    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["What is 3 plus 4?"]}) + "\n")
    report = tmp_path / "eval" / "report.json"
    assert main(["eval", "--artefact", str(out), "--target", str(tiny_pair["target"]), "--questions", str(qfile),
                 "--max-new-tokens", "8", "--warmup", "0", "--no-progress", "--out", str(report)]) == 0
    rep = json.loads(report.read_text())
    assert rep["proposer"]["draft_length"] == chosen["draft_length"]
    assert rep["proposer"]["confidence_threshold"] == chosen["confidence_threshold"]
    assert rep["proposer"]["draft_length_mode"] == chosen["draft_length_mode"]
    assert "Draft settings chosen for this artefact" in report.with_suffix(".md").read_text()
    # --draft-length K on a tuned artefact drafts K tokens a step, whatever policy the tuning chose
    assert main(["eval", "--artefact", str(out), "--target", str(tiny_pair["target"]), "--questions", str(qfile),
                 "--max-new-tokens", "8", "--warmup", "0", "--no-progress", "--draft-length", "2", "--out",
                 str(report)]) == 0
    rep = json.loads(report.read_text())
    assert rep["proposer"]["draft_length"] == 2 and rep["proposer"]["draft_length_mode"] == "fixed"


def test_tune_calibrates_a_medusa_artefacts_tree_and_eval_grows_the_tree_from_it(tiny_pair, tmp_path, capsys):
    """A heads artefact is calibrated instead of tuned: per-depth temperatures and conditional rank accuracies go into
    ``proposer.tree_calibration``; the auto tree then keeps the full top-1 chain and stays identical to AR."""
    import torch

    from draftsmith.inference.drafters.medusa import MedusaHeads

    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_pair["target"])
    torch.manual_seed(0)
    heads = MedusaHeads(target.config.hidden_size, target.config.vocab_size, heads=3)
    out = tmp_path / "artefact"
    write_artefact(out, "heads", method="medusa", target=target_identity(target, tokenizer),
                   proposer={"tree": "auto", "tree_nodes": 8}, tensors=heads.state_dict(),
                   config=heads.artefact_config())
    assert main(["tune", "--artefact", str(out), "--target", str(tiny_pair["target"]), "--prompts", "3",
                 "--max-new-tokens", "12", "--threads", "1"]) == 0
    assert "tree calibration on " in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    calibration = manifest["proposer"]["tree_calibration"]
    assert len(calibration["temperatures"]) == 3 and len(calibration["rank_accuracy"]) == 3
    assert manifest["tuning"]["tree_calibration"]["steps"] > 0
    report = tmp_path / "report.json"
    assert main(["eval", "--artefact", str(out), "--target", str(tiny_pair["target"]), "--limit", "2",
                 "--max-new-tokens", "12", "--threads", "1", "--no-progress", "--out", str(report)]) == 0
    assert json.loads(report.read_text())["summary"]["greedy_identical"] == 1.0
