"""`draftsmith eval` end to end on a tiny random target/draft pair (tiny_pair from conftest.py)."""

import json
import shutil

import pytest
import torch
import transformers

from draftsmith.data.tiny_models import random_model
from draftsmith.launch.cli import main

QUESTIONS = [
    {"question_id": 1, "category": "chat", "turns": ["What is 1 plus 1?", "And 2 plus 2?"]},
    {"question_id": 2, "category": "math", "turns": ["What is 3 plus 3?"], "reference": ["6"]},
]


@pytest.fixture
def qfile(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def _eval(pair, *extra):
    return main(["eval", "--target", str(pair["target"]), "--max-new-tokens", "8", "--warmup", "0", "--no-progress",
                 "--threads", "1", *map(str, extra)])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_draft_method_with_hf_comparison(tiny_pair, qfile, tmp_path, capsys):
    out = tmp_path / "run" / "report.json"
    assert _eval(tiny_pair, "--draft", tiny_pair["draft"], "--questions", qfile, "--compare", "hf", "--out", out) == 0
    rep = json.loads(out.read_text())
    assert rep["method"] == "draft" and rep["num_questions"] == 2 and rep["draft"] == str(tiny_pair["draft"])
    assert rep["summary"]["greedy_identical"] == 1.0
    assert [len(q["output_ids"]) for q in rep["questions"]] == [2, 1]  # two turns, one turn
    for name in ("hf_assisted", "hf_prompt_lookup"):
        assert {"speedup", "tau", "tokens_per_s"} <= rep["baselines"][name].keys()
        assert rep["baselines"][name]["tau"] >= 1.0
    assert rep["command"].startswith("draftsmith eval --target") and "--compare hf" in rep["command"]
    for name in ("report.md", "report_accept_lengths.png", "report_categories.png"):
        assert (out.parent / name).is_file()
    stdout = capsys.readouterr().out
    assert "speedup vs AR" in stdout and "hf_assisted speedup / tau" in stdout and str(out) in stdout


@pytest.mark.parametrize("method", ["pld", "ar"])
def test_other_methods(tiny_pair, qfile, tmp_path, method):
    out = tmp_path / "r.json"
    assert _eval(tiny_pair, "--method", method, "--questions", qfile, "--limit", "1", "--out", out) == 0
    rep = json.loads(out.read_text())
    assert rep["method"] == method and rep["num_questions"] == 1 and rep["summary"]["greedy_identical"] == 1.0
    if method == "ar":
        assert rep["summary"]["tau"] == 1.0


def test_adaptive_draft_length_grows_up_to_its_cap(tiny_pair, qfile, tmp_path):
    out = tmp_path / "r.json"
    assert _eval(tiny_pair, "--draft", tiny_pair["draft"], "--draft-length-mode", "heuristic", "--draft-length", "2",
                 "--draft-max-length", "3", "--draft-confidence", "0", "--questions", qfile, "--out", out) == 0
    rep = json.loads(out.read_text())
    assert rep["proposer"]["draft_length_mode"] == "heuristic" and rep["proposer"]["draft_max_length"] == 3
    assert rep["summary"]["greedy_identical"] == 1.0
    assert 1 <= rep["summary"]["mean_draft_length"] <= 3
    assert max(a for q in rep["questions"] for a in q["accept_lengths"]) <= 4  # 3 drafted + the target's own token


def test_draft_max_length_below_the_draft_length_is_one_line(tiny_pair, qfile, capsys):
    assert _eval(tiny_pair, "--draft", tiny_pair["draft"], "--draft-length", "4", "--draft-max-length", "2",
                 "--questions", qfile) == 2
    assert "--draft-max-length" in _one_line_error(capsys)


def test_tree_attention_kernel_option_loads_the_registered_attention(tiny_pair, qfile, tmp_path):
    """--tree-attention kernel loads the target with the registered tree attention (the kernel on CUDA; sdpa here)
    and stays token-identical."""
    out = tmp_path / "k.json"
    assert _eval(tiny_pair, "--method", "pld", "--tree-attention", "kernel", "--questions", qfile, "--limit", "1",
                 "--out", out) == 0
    assert json.loads(out.read_text())["summary"]["greedy_identical"] == 1.0


def test_early_exit_method_on_any_target(tiny_pair, qfile, tmp_path, capsys):
    """--method early-exit --exit-layer E: LayerSkip self-speculation on a target as it is, token-identical, with
    the exit layer's top-1 agreement in the report; a missing exit layer is a one-line error."""
    out = tmp_path / "ee.json"
    assert _eval(tiny_pair, "--method", "early-exit", "--exit-layer", "1", "--draft-length", "3", "--questions", qfile,
                 "--out", out) == 0
    rep = json.loads(out.read_text())
    assert rep["method"] == "early-exit" and rep["summary"]["greedy_identical"] == 1.0
    assert rep["early_exit"]["exit_layer"] == 1 and rep["early_exit"]["num_layers"] == 2
    assert 0.0 <= rep["early_exit"]["top1_agreement"] <= 1.0
    assert _eval(tiny_pair, "--method", "early-exit", "--questions", qfile) == 2
    assert "--exit-layer" in _one_line_error(capsys)


def test_jacobi_method_reports_its_counts(tiny_pair, qfile, tmp_path, capsys):
    """--method jacobi: Jacobi decoding of the target as it is, token-identical, with CLLM's fast-forwarded and
    stationary tokens in the report; sampling is refused in one line."""
    out = tmp_path / "j.json"
    assert _eval(tiny_pair, "--method", "jacobi", "--draft-length", "4", "--questions", qfile, "--out", out) == 0
    rep = json.loads(out.read_text())
    assert rep["summary"]["greedy_identical"] == 1.0 and rep["jacobi"]["block"] == 4
    j = rep["jacobi"]
    assert j["committed"] == j["steps"] + j["accepted"] and j["fast_forwarded"] + j["stationary"] == j["accepted"]
    assert _eval(tiny_pair, "--method", "jacobi", "--temperature", "1.0", "--questions", qfile) == 2
    assert "greedy" in _one_line_error(capsys)


@pytest.mark.parametrize("tree", ["chain", "triangle"])
def test_bita_method_with_untrained_embeddings(tiny_pair, qfile, tmp_path, tree):
    out = tmp_path / "b.json"
    assert _eval(tiny_pair, "--method", "bita", "--tree", tree, "--tree-top-k", "3", "--questions", qfile,
                 "--out", out) == 0
    rep = json.loads(out.read_text())
    assert rep["method"] == "bita" and rep["summary"]["greedy_identical"] == 1.0


@pytest.mark.parametrize("rule", [None, "unsmoothed"])
def test_draft_verify_with_a_skip_set_on_the_command_line(tiny_pair, qfile, tmp_path, rule):
    out = tmp_path / "dv.json"
    chosen = ("--threshold-rule", rule) if rule else ()
    assert _eval(tiny_pair, "--method", "draft-verify", "--skip-attention", "1", "--skip-mlp", "1", "--questions", qfile,
                 "--limit", "1", *chosen, "--out", out) == 0
    rep = json.loads(out.read_text())
    assert rep["skip_set"] == {"attention": ".x", "mlp": ".x"} and rep["summary"]["greedy_identical"] == 1.0
    # adaptive draft-exiting, by default with the reference code's rule (the search drafts with it too)
    assert rep["draft_stop"]["rule"] == "adaptive" and rep["draft_stop"]["threshold_rule"] == (rule or "reference")


def test_sampling_run(tiny_pair, qfile, tmp_path):
    out = tmp_path / "s.json"
    args = ("--draft", tiny_pair["draft"], "--questions", qfile, "--temperature", "0.7", "--top-p", "0.9", "--out", out)
    assert _eval(tiny_pair, *args) == 0
    rep = json.loads(out.read_text())
    assert rep["temperature"] == 0.7 and rep["summary"]["greedy_identical"] is None


def test_artefact_method_comes_from_the_manifest(tiny_pair, qfile, tmp_path):
    from draftsmith.common.models import target_identity
    from draftsmith.inference.artefacts.manifest import write_manifest

    art = tmp_path / "artefact"
    shutil.copytree(tiny_pair["draft"], art / "draft")
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_pair["target"])
    write_manifest(art, "distillspec", target_identity(target, tokenizer), {"draft_length": 3})
    out = tmp_path / "a.json"
    assert _eval(tiny_pair, "--artefact", art, "--questions", qfile, "--out", out) == 0
    rep = json.loads(out.read_text())
    assert rep["method"] == "distillspec" and rep["artefact"]["proposer"] == {"draft_length": 3}
    assert rep["proposer"]["draft_length"] == 3 and rep["summary"]["greedy_identical"] == 1.0


def test_artefact_without_target_runs_on_the_target_its_manifest_names(tiny_pair, qfile, tmp_path):
    from draftsmith.common.models import target_identity
    from draftsmith.inference.artefacts.manifest import write_manifest
    from draftsmith.launch.eval_cli import artefact_target

    art = tmp_path / "artefact"
    shutil.copytree(tiny_pair["draft"], art / "draft")
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_pair["target"])
    write_manifest(art, "distillspec", target_identity(target, tokenizer, str(tiny_pair["target"])), {"draft_length": 2})
    assert artefact_target(str(art), None) == str(tiny_pair["target"])
    assert artefact_target(str(art), "other") == "other" and artefact_target(None, None) is None
    out = tmp_path / "a.json"
    assert main(["eval", "--artefact", str(art), "--questions", str(qfile), "--max-new-tokens", "4", "--warmup", "0",
                 "--no-progress", "--threads", "1", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["target"] == str(tiny_pair["target"]) and rep["summary"]["greedy_identical"] == 1.0
    gone = tmp_path / "gone"
    shutil.copytree(tiny_pair["draft"], gone / "draft")
    write_manifest(gone, "distillspec", target_identity(target, tokenizer, str(tmp_path / "moved")), {"draft_length": 2})
    assert artefact_target(str(gone), None) is None  # a target no longer there: the zoo's, as before


def test_check_distribution(tiny_pair, qfile, tmp_path, capsys):
    out = tmp_path / "dist.json"
    args = ("--draft", tiny_pair["draft"], "--questions", qfile, "--check-distribution", "--samples", "60",
            "--positions", "2", "--prompts", "1", "--out", out)
    assert _eval(tiny_pair, *args) == 0
    res = json.loads(out.read_text())
    assert res["passed"] is True and res["sampling"]["temperature"] == 1.0 and len(res["tests"]) == 3
    stdout = capsys.readouterr().out
    assert "distribution check PASS" in stdout and "ran at temperature 1.0" in stdout


def _bad_questions(tmp_path, text):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    return path


def test_malformed_questions_file(tiny_pair, tmp_path, capsys):
    path = _bad_questions(tmp_path, json.dumps(QUESTIONS[0]) + "\n{not json\n")
    assert _eval(tiny_pair, "--method", "ar", "--questions", path) == 2
    line = _one_line_error(capsys)
    assert f"{path}:2" in line and "not valid JSON" in line


def test_empty_turn(tiny_pair, tmp_path, capsys):
    path = _bad_questions(tmp_path, json.dumps({"question_id": 7, "category": "x", "turns": ["hi", ""]}) + "\n")
    assert _eval(tiny_pair, "--method", "ar", "--questions", path) == 2
    assert "question 7" in _one_line_error(capsys)


def test_draft_with_another_vocabulary(tiny_pair, qfile, tmp_path, capsys):
    other = tmp_path / "other_draft"
    random_model("llama", seed=3, vocab_size=64, layers=1).save_pretrained(other)
    assert _eval(tiny_pair, "--draft", other, "--questions", qfile) == 2
    line = _one_line_error(capsys)
    assert "vocabulary of 64" in line and "128" in line and str(other) in line and str(tiny_pair["target"]) in line


def test_missing_artefact_manifest(tiny_pair, qfile, tmp_path, capsys):
    (tmp_path / "art").mkdir()
    assert _eval(tiny_pair, "--artefact", tmp_path / "art", "--questions", qfile) == 2
    assert "manifest.json is missing" in _one_line_error(capsys)


@pytest.mark.parametrize(
    "args, pattern",
    [
        (("--method", "draft"), "needs --draft"),
        (("--method", "ar", "--artefact", "x"), "either --artefact"),
        (("--method", "ar", "--max-new-tokens", "0"), "--max-new-tokens"),
        (("--method", "ar", "--temperature", "-1"), "temperature"),
        (("--method", "ar", "--limit", "0"), "--limit"),
    ],
)
def test_bad_options(tiny_pair, qfile, capsys, args, pattern):
    assert _eval(tiny_pair, "--questions", qfile, *args) == 2
    assert pattern in _one_line_error(capsys)


def test_bad_model_directories(tiny_pair, qfile, tmp_path, capsys):
    assert main(["eval", "--target", str(tmp_path / "nope"), "--method", "ar", "--questions", str(qfile)]) == 2
    assert "--target" in (line := _one_line_error(capsys)) and "does not exist" in line
    bare = tmp_path / "bare" / "target"
    random_model("llama", seed=0).save_pretrained(bare)
    assert main(["eval", "--target", str(bare), "--method", "ar", "--questions", str(qfile)]) == 2
    assert "--tokenizer" in _one_line_error(capsys)


def test_threads_are_restored(tiny_pair, qfile, tmp_path):
    before = torch.get_num_threads()
    _eval(tiny_pair, "--method", "ar", "--questions", qfile, "--limit", "1", "--out", tmp_path / "t.json")
    assert torch.get_num_threads() == before


def test_unsupported_model_is_one_line(tiny_pair, qfile, tmp_path, capsys):
    import transformers

    from draftsmith.data.tiny_models import char_tokenizer

    opt = tmp_path / "opt"
    config = transformers.OPTConfig(vocab_size=128, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                                    num_attention_heads=2, word_embed_proj_dim=16, max_position_embeddings=64)
    transformers.OPTForCausalLM(config).save_pretrained(opt)
    char_tokenizer().save_pretrained(opt)
    assert main(["eval", "--target", str(opt), "--method", "ar", "--questions", str(qfile), "--no-progress",
                 "--max-new-tokens", "4", "--warmup", "0"]) == 2
    assert "is not supported" in _one_line_error(capsys)


def test_an_interrupted_eval_resumes_on_the_same_command_and_refuses_another(tiny_pair, qfile, tmp_path, capsys):
    out = tmp_path / "r" / "report.json"
    args = ("--method", "pld", "--questions", qfile, "--out", out)
    assert _eval(tiny_pair, *args, "--limit", "1") == 0
    assert not (out.parent / "report.partial.jsonl").exists()  # a finished evaluation leaves no journal
    first = json.loads(out.read_text())["questions"][0]
    journal = out.parent / "report.partial.jsonl"  # as a run killed after its first question leaves it
    head = {"format": "draftsmith-eval-journal/1", "settings": {}}
    journal.write_text(json.dumps(head) + "\n")
    assert _eval(tiny_pair, *args) == 2
    assert "other settings" in _one_line_error(capsys) and journal.exists()
    journal.unlink()
    assert _eval(tiny_pair, *args) == 0
    rep = json.loads(out.read_text())
    assert rep["num_questions"] == 2 and "resumed_questions" not in rep
    assert rep["questions"][0]["output_ids"] == first["output_ids"]
