"""engine_evaluate: the plain-decoding references (vLLM's AR and draftsmith's) are decoded once for several methods
judged on the same questions, when the caller keeps them."""

from __future__ import annotations

from types import SimpleNamespace

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.engines import evaluate
from draftsmith.inference.engines.vllm import EngineMethod
from draftsmith.inference.evaluation.questions import Question


def test_the_plain_references_are_decoded_once_for_every_head(monkeypatch, tmp_path):
    calls = {"ar": 0, "spec": 0, "ours": 0}

    def fake_engine(request, python, threads=None, log=None):  # the runner's result shape, one prompt
        kind = "spec" if request["speculative_config"] else "ar"
        calls[kind] += 1
        counters = {"drafts": 2, "draft_tokens": 4, "accepted": 3, "per_pos": [2, 1]} if kind == "spec" else \
            {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
        return {"results": [{"token_ids": [5, 6, 7], "seconds": 0.1, "spec": counters}], "throughput": [],
                "versions": {"vllm": "test"}, "load_seconds": 0.0}

    def fake_ours(target, prompts, max_new_tokens, eos):
        calls["ours"] += 1
        return [[5, 6, 7] for _ in prompts]

    monkeypatch.setattr(evaluate, "run_engine", fake_engine)
    monkeypatch.setattr(evaluate, "draftsmith_ar", fake_ours)
    monkeypatch.setattr(evaluate, "first_turn_prompts", lambda tokenizer, questions, room: [[3, 4] for _ in questions])
    target = random_model("llama", seed=0)
    questions = [Question(question_id="q", category="qa", turns=["hi"])]
    tokenizer, references = SimpleNamespace(eos_token_id=2), {}
    for head in ("a", "b", "c"):
        method = EngineMethod({"method": "eagle3", "model": head, "num_speculative_tokens": 2}, {})
        report = evaluate.engine_evaluate(target, tokenizer, questions, method, python=tmp_path, model_dir="m",
                                          tokenizer_dir="t", max_new_tokens=3, references=references)
        assert report["summary"]["identical_to_draftsmith_ar"] == 1.0
        assert report["summary"]["acceptance_by_position"] == [1.0, 0.5]
    assert calls == {"ar": 1, "spec": 3, "ours": 1}
    evaluate.engine_evaluate(target, tokenizer, questions, method, python=tmp_path, model_dir="m", tokenizer_dir="t",
                             max_new_tokens=3)
    assert calls == {"ar": 2, "spec": 4, "ours": 2}  # without the caller's references, decoded again
