import json
import math

import pytest

from draftsmith.common.errors import ConfigError
from draftsmith.common.registry import get_method
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.evaluation.evaluator import evaluate
from draftsmith.inference.evaluation.metrics import SUMMARY_FIELDS
from draftsmith.inference.evaluation.questions import Question, read_questions
from draftsmith.inference.proposers.draft_model import DraftModelProposer
from draftsmith.inference.proposers.draft_verify import AdaptiveThreshold, DraftVerifyProposer
from draftsmith.inference.proposers.prompt_lookup import PromptLookupProposer

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTION_KEYS = {"question_id", "category", "new_tokens", "wall_time", "steps", "accept_lengths", "identical",
                 "output_ids", "output_text"}


def _run(lm_pair, tok, questions, method="draft", factory=None, **kw):
    target, draft = lm_pair
    if factory is None:
        factory = {
            "draft": lambda: DraftModelProposer(draft, DraftLengthPolicy(length=3)),
            "pld": lambda: PromptLookupProposer(num_draft_tokens=5),
            "ar": lambda: None,
        }[method]
    kw.setdefault("max_new_tokens", 12)
    kw.setdefault("warmup", 0)
    return evaluate(target, tok, method, factory, questions, progress=False, **kw)


def test_report_shape_and_metric_definitions(lm_pair, chat_tokenizer, questions_file):
    qs = read_questions(questions_file)
    rep = _run(lm_pair, chat_tokenizer, qs, warmup=1)
    json.dumps(rep)  # serialisable as is
    assert {"method", "target", "temperature", "max_new_tokens", "summary", "categories", "baselines", "questions",
            "lossless", "draftsmith_version", "environment"} <= rep.keys()
    assert set(SUMMARY_FIELDS) <= rep["summary"].keys()
    assert list(rep["categories"]) == ["chat", "code", "math"]
    for cat in rep["categories"].values():
        assert set(SUMMARY_FIELDS) <= cat.keys() and cat["num_questions"] == 1
    assert rep["method"] == "draft" and rep["lossless"] is True and rep["max_new_tokens"] == 12
    s = rep["summary"]
    records = rep["questions"]
    assert all(QUESTION_KEYS <= r.keys() for r in records)
    # tau: mean over all steps; speedup: ratio of mean per-question tokens/s
    steps = [a for r in records for a in r["accept_lengths"]]
    assert s["tau"] == pytest.approx(sum(steps) / len(steps))
    assert s["tokens_per_s"] == pytest.approx(sum(r["tokens_per_s"] for r in records) / len(records))
    assert s["ar_tokens_per_s"] == pytest.approx(sum(r["ar"]["tokens_per_s"] for r in records) / len(records))
    assert s["speedup"] == pytest.approx(s["tokens_per_s"] / s["ar_tokens_per_s"])
    assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["proposed"])
    assert s["steps"] == len(steps) and s["new_tokens"] == sum(steps)
    for r in records:
        assert sum(r["accept_lengths"]) == sum(r["new_tokens"]) == sum(len(o) for o in r["output_ids"])
        assert len(r["output_ids"]) == len(r["output_text"]) == len(r["new_tokens"]) == len(r["steps"])
    assert [len(r["output_ids"]) for r in records] == [2, 1, 1]  # multi-turn question answered turn by turn
    assert math.isfinite(s["predicted_speedup"]) and s["predicted_speedup"] > 0
    pad = rep["verify_padding"]  # the measured forward time of every row count 1..16 and the sizes padded up
    assert pad["enabled"] is True and list(pad["forward_seconds"]) == [str(n) for n in range(1, 17)]
    assert all(int(m) > int(n) >= 2 for n, m in pad["plan"].items())


def test_forwards_past_the_measured_sizes_are_measured_after_the_run_not_extrapolated(lm_pair, chat_tokenizer,
                                                                                        questions_file):
    target, _ = lm_pair  # the target as its own draft, 20 tokens a step: 21-token verifications
    rep = _run(lm_pair, chat_tokenizer, read_questions(questions_file)[:1],
               factory=lambda: DraftModelProposer(target, DraftLengthPolicy(length=20, max_length=20)), max_new_tokens=24)
    sizes = [int(n) for n in rep["verify_padding"]["forward_seconds"]]
    assert sizes == list(range(1, 17)) + [17, 18, 20, 21]  # 1..16 before the run, four sizes up to 21 after it
    assert list(rep["summary"]["cost_model"]["verify_seconds"])[-1] == "21"


@pytest.mark.parametrize("method", ["draft", "pld", "self_draft"])
def test_greedy_methods_are_token_identical_to_ar(lm_pair, chat_tokenizer, questions_file, method):
    target, _ = lm_pair
    qs = read_questions(questions_file) + [Question(9, "repeat", ("fox fox fox fox fox fox fox fox",))]
    factory = None
    if method == "self_draft":  # the target as its own draft: every token accepted
        factory = lambda: DraftModelProposer(target, DraftLengthPolicy(length=3))  # noqa: E731
    rep = _run(lm_pair, chat_tokenizer, qs, "draft" if method == "self_draft" else method, factory, max_new_tokens=16)
    assert rep["summary"]["greedy_identical"] == 1.0
    assert all(r["identical"] is True and "difference" not in r for r in rep["questions"])
    assert rep["summary"]["proposed"] > 0
    if method == "self_draft":
        assert rep["summary"]["acceptance_rate"] == 1.0 and rep["summary"]["tau"] > 2.5


def test_ar_method_is_the_reference(lm_pair, chat_tokenizer, questions_file):
    rep = _run(lm_pair, chat_tokenizer, read_questions(questions_file, limit=2), "ar")
    s = rep["summary"]
    assert s["tau"] == 1.0 and s["acceptance_rate"] is None and s["greedy_identical"] == 1.0
    assert s["predicted_speedup"] == 1.0 and rep["proposer"] is None


def test_long_prompt_is_truncated_from_the_left_with_a_warning(chat_tokenizer):
    target = random_model("llama", seed=0, vocab_size=len(chat_tokenizer), layers=1, hidden=32, max_positions=48)
    long = Question(1, "long", (" ".join(["The quick brown fox jumps over the lazy dog."] * 8),))
    with pytest.warns(UserWarning, match="left truncation"):
        rep = evaluate(target, chat_tokenizer, "ar", None, [long], max_new_tokens=8, warmup=0, progress=False)
    r = rep["questions"][0]
    assert r["prompt_tokens"] == [40] and r["truncated_prompt_tokens"][0] > 0 and r["new_tokens"] == [8]
    assert any("truncated" in n for n in rep["notes"])
    with pytest.raises(ConfigError, match="max-new-tokens"):
        evaluate(target, chat_tokenizer, "ar", None, [long], max_new_tokens=48, warmup=0, progress=False)


def test_sampling_reports_null_identity_and_is_seeded(lm_pair, chat_tokenizer, questions_file):
    qs = read_questions(questions_file, limit=2)
    sampling = SamplingParams(temperature=1.0, top_p=0.9)
    a = _run(lm_pair, chat_tokenizer, qs, sampling=sampling, seed=3)
    b = _run(lm_pair, chat_tokenizer, qs, sampling=sampling, seed=3)
    assert a["summary"]["greedy_identical"] is None and all(r["identical"] is None for r in a["questions"])
    assert any("greedy_identical is null" in n for n in a["notes"])
    assert a["verification"] == "speculative sampling" and a["top_p"] == 0.9
    assert [r["output_ids"] for r in a["questions"]] == [r["output_ids"] for r in b["questions"]]


class LossyLookup(PromptLookupProposer):
    lossless = False


def test_a_lossy_rule_is_labelled(lm_pair, chat_tokenizer, questions_file):
    rep = _run(lm_pair, chat_tokenizer, read_questions(questions_file, limit=1), "pld", LossyLookup)
    assert rep["lossless"] is False and rep["proposer"]["lossless"] is False
    assert any(n.startswith("LOSSY") for n in rep["notes"])


def test_compare_hf_baselines(lm_pair, chat_tokenizer, questions_file):
    qs = read_questions(questions_file)
    rep = _run(lm_pair, chat_tokenizer, qs, compare_hf=True)
    b = rep["baselines"]
    for name in ("hf_assisted", "hf_prompt_lookup", "hf_ar"):
        assert {"speedup", "tau", "tokens_per_s", "speedup_vs_hf_ar", "identical_to_ar"} <= b[name].keys()
        assert b[name]["identical_to_ar"] == 1.0  # greedy transformers decoding agrees with draftsmith's AR
        assert b[name]["tau"] >= 1.0 and b[name]["speedup"] > 0
    assert b["hf_ar"]["tau"] == 1.0 and b["hf_ar"]["target_forwards"] == b["hf_ar"]["new_tokens"]
    assert b["hf_ar"]["speedup_vs_hf_ar"] == 1.0
    assert b["hf_prompt_lookup"]["target_forwards"] <= b["hf_prompt_lookup"]["new_tokens"]
    assert "hf" in rep["questions"][0]
    assert b["draftsmith_vs_hf_assisted"] == pytest.approx(rep["summary"]["speedup"] / b["hf_assisted"]["speedup"])
    # without a draft model there is no assisted baseline, and that is said
    pld = _run(lm_pair, chat_tokenizer, qs[:1], "pld", compare_hf=True)
    assert pld["baselines"]["hf_assisted"]["speedup"] is None and "skipped" in pld["baselines"]["hf_assisted"]
    with pytest.raises(ConfigError, match="greedy"):
        _run(lm_pair, chat_tokenizer, qs[:1], compare_hf=True, sampling=SamplingParams(temperature=1.0))


def test_tensorboard_logging(lm_pair, chat_tokenizer, questions_file, tmp_path):
    _run(lm_pair, chat_tokenizer, read_questions(questions_file, limit=1), tensorboard_dir=tmp_path / "tb")
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft", "draft-confident", "pld", "draft-verify"])
def test_zoo_greedy_identical_on_the_dev_questions(method, dev_questions):
    """Issues 3 and 15, done-when: token-identical to AR on the bundled dev questions with the tiny zoo
    (``--dev-questions all`` for every one; Draft &
    Verify: the skip set the first tiny-zoo study chose, both sublayers of layers 1-2, with adaptive draft-exiting)."""
    from draftsmith.data.zoo import load_zoo
    from draftsmith.trainers.zoo import ensure_zoo

    ensure_zoo("tiny")
    tokenizer, target, draft = load_zoo("tiny")
    factory = {
        "draft": lambda: DraftModelProposer(draft, DraftLengthPolicy(length=4)),
        "draft-confident": lambda: DraftModelProposer(draft, DraftLengthPolicy(length=4),
                                                        get_method("draft").option_declarations()["confidence_threshold"].default),
        "pld": lambda: PromptLookupProposer(),
        "draft-verify": lambda: DraftVerifyProposer(skip_attention=(1, 2), skip_mlp=(1, 2),
                                                  policy=DraftLengthPolicy(length=8, max_length=16),
                                                  stop=AdaptiveThreshold()),
    }[method]
    rep = evaluate(target, tokenizer, method, factory, dev_questions, max_new_tokens=64, warmup=1, progress=False)
    assert rep["num_questions"] == len(dev_questions)
    differing = [(r["question_id"], r["difference"]) for r in rep["questions"] if not r["identical"]]
    assert rep["summary"]["greedy_identical"] == 1.0, differing[:3]
