"""The teacher-forced agreement benchmark: agreement along hand-made answers, the summary, and a run on a tiny model."""

import copy
import json

import pytest
import torch


@pytest.fixture(scope="module")
def bench(script_loader):
    return script_loader("bench_agreement")


@pytest.fixture(scope="module")
def target():
    from draftsmith.data.tiny_models import random_model

    return random_model("llama", seed=0, layers=1).eval()


def greedy_answer(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_the_target_agrees_with_its_own_greedy_answer_and_a_vocabulary_without_a_token_cannot(bench, target):
    prompt = [1, 5, 6, 7]
    answer = greedy_answer(target, prompt, 6)
    assert bench.agreement(target, prompt, answer, None).tolist() == [True] * 6
    draft = copy.deepcopy(target)
    missing = answer[2]
    vocab = torch.tensor([t for t in range(128) if t != missing])
    expected = [t != missing for t in answer]
    assert bench.agreement(draft, prompt, answer, vocab).tolist() == expected


def test_summary_weighs_tokens_and_reports_the_first_ones_and_each_category(bench):
    t, f = True, False
    matches = {"math": [torch.tensor([t, t, f, f])], "coding": [torch.tensor([f] * 10 + [t] * 2)]}
    s = bench.summarise(matches)
    assert s["agreement"] == pytest.approx(4 / 16) and s["tokens"] == 16
    assert s["agreement_first_8"] == pytest.approx(2 / 12)  # 4 of math's, the first 8 of coding's
    assert s["categories"] == {"math": 0.5, "coding": round(2 / 12, 4)}


def test_runs_on_a_greedy_report_of_a_tiny_target(bench, target, tmp_path, capsys):
    from draftsmith.data.tiny_models import char_tokenizer
    from draftsmith.inference.evaluation.runs import chat_prompt_ids

    tokenizer = char_tokenizer()
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    questions = [{"question_id": i, "category": c, "turns": [f"question {i}?"]}
                 for i, c in enumerate(["math", "math", "writing"])]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    rows = []
    for q in questions:
        prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": q["turns"][0]}])
        rows.append({"question_id": q["question_id"], "category": q["category"], "prompt_tokens": [len(prompt)],
                     "output_ids": [greedy_answer(target, prompt, 5)]})
    report = {"target": str(tmp_path / "target"), "temperature": 0.0, "question_file": str(tmp_path / "q.jsonl"),
              "questions": rows}
    (tmp_path / "report.json").write_text(json.dumps(report))
    out = tmp_path / "agreement.json"
    assert bench.main(["--draft", str(tmp_path / "target"), "--report", str(tmp_path / "report.json"),
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["agreement"] == 1.0 and result["tokens"] == 15 and set(result["categories"]) == {"math", "writing"}
    assert "teacher-forced agreement 1.000" in capsys.readouterr().out
    rows[0]["prompt_tokens"] = [rows[0]["prompt_tokens"][0] + 1]  # another tokenizer's prompt
    (tmp_path / "report.json").write_text(json.dumps(report))
    with pytest.raises(SystemExit, match="pass the target's --tokenizer"):
        bench.main(["--draft", str(tmp_path / "target"), "--report", str(tmp_path / "report.json")])
