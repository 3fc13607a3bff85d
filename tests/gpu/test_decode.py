"""The decode loop on the GPU, through `draftsmith eval` on the tiny zoo: identical to AR in float32, different only
at near ties in bfloat16 (the tie tolerance from bfloat16's spacing), the target as its own draft accepted almost
always, AR against transformers' generate, the verification cost for 1-64 tokens (tiny zoo target and a random
1B-shaped Llama in bfloat16) and the host synchronisations per decoding step (``torch.cuda.set_sync_debug_mode``).

The tiny zoo must be built (``draftsmith zoo build --size tiny``) under ``$DRAFTSMITH_HOME``: a GPU machine without
network gets a copy of ``~/.cache/draftsmith/zoo/tiny`` (docs/GPU.md)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from gpu_suite import DEVICE, DRY_RUN, GPU_MARKS, sized

from draftsmith.common.errors import DraftsmithError
from draftsmith.common.paths import zoo_dir

pytestmark = GPU_MARKS

QUESTIONS = sized(16, 2)
NEW_TOKENS = sized(64, 12)
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
SELF_DRAFT_ACCEPTANCE = {"fp32": 0.995, "bf16": sized(0.97, 0.9)}  # dry run: 2 short answers, a few dozen drafts


@pytest.fixture(scope="module")
def zoo():
    from draftsmith.data.zoo import read_zoo_manifest

    try:
        read_zoo_manifest("tiny")
    except DraftsmithError as err:
        pytest.fail(f"the GPU suite decodes with the tiny zoo: {err} (copy ~/.cache/draftsmith/zoo/tiny and set "
                    "DRAFTSMITH_HOME, docs/GPU.md)")
    return zoo_dir("tiny")


def run_eval(tmp_path, name: str, *args: str) -> dict:
    from draftsmith.launch.cli import main

    out = tmp_path / name / "report.json"
    argv = ["eval", "--zoo", "tiny", "--device", DEVICE, "--no-progress", "--questions", "dev", "--limit",
            str(QUESTIONS), "--max-new-tokens", str(NEW_TOKENS), "--warmup", "1", "--out", str(out), *args]
    assert main(argv) == 0, argv
    return json.loads(out.read_text())


def summary_row(report: dict) -> dict:
    s = report["summary"]
    return {"tau": s["tau"], "acceptance": s["acceptance_rate"], "tokens_per_s": s["tokens_per_s"],
            "ar_tokens_per_s": s["ar_tokens_per_s"], "speedup": s["speedup"], "identical": s["greedy_identical"]}


def differences(report: dict) -> list[dict]:
    return [q["difference"] for q in report["questions"] if q.get("difference")]


@pytest.mark.parametrize("method", ["draft", "pld"])
def test_float32_decoding_is_identical_to_ar(method, zoo, tmp_path, gpu_report):
    report = run_eval(tmp_path, method, "--method", method, "--dtype", "float32")
    gpu_report.add("decode loop against AR (tiny zoo)", method=method, dtype="float32", **summary_row(report),
                   near_ties=0)
    assert report["summary"]["greedy_identical"] == 1.0, differences(report)[:2]


@pytest.mark.parametrize("method", ["draft", "pld"])
def test_bfloat16_decoding_differs_from_ar_only_at_near_ties(method, zoo, tmp_path, gpu_report):
    report = run_eval(tmp_path, method, "--method", method, "--dtype", "bfloat16")
    diffs = differences(report)
    gpu_report.add("decode loop against AR (tiny zoo)", method=method, dtype="bfloat16", **summary_row(report),
                   near_ties=sum(bool(d.get("near_tie")) for d in diffs))
    assert "units in the last place of bfloat16" in report["near_tie_rule"]
    beyond = [d for d in diffs if not d.get("near_tie")]
    assert not beyond, [{k: d.get(k) for k in ("position", "top1_logit", "top2_gap", "tie_tolerance")} for d in beyond]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_target_as_its_own_draft_is_accepted(precision, zoo, tmp_path, gpu_report):
    report = run_eval(tmp_path, f"self-{precision}", "--method", "draft", "--draft", str(zoo / "target"),
                      "--dtype", DTYPES[precision])
    gpu_report.add("target as its own draft (tiny zoo)", dtype=DTYPES[precision], **summary_row(report),
                   floor=SELF_DRAFT_ACCEPTANCE[precision])
    assert report["summary"]["acceptance_rate"] >= SELF_DRAFT_ACCEPTANCE[precision]


def test_ar_against_transformers_generate(zoo, tmp_path, gpu_report):
    report = run_eval(tmp_path, "hf", "--method", "draft", "--dtype", "float32", "--compare", "hf")
    hf = {name: row for name, row in report["baselines"].items() if name.startswith("hf_")}
    assert hf["hf_ar"]["identical_to_ar"] == 1.0
    ar = report["summary"]["ar_tokens_per_s"]
    for name, row in hf.items():
        gpu_report.add("AR and transformers' generate (tiny zoo, float32)", variant=name,
                       tokens_per_s=row["tokens_per_s"], draftsmith_ar_tokens_per_s=ar, tau=row["tau"],
                       identical_to_ar=row["identical_to_ar"])


def llama_1b(dtype: torch.dtype):
    """A random Llama of a 1B model's shape (Llama-3.2-1B: 16 layers, width 2048, GQA 32/8, vocabulary 128,256)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=sized(128256, 512), hidden_size=sized(2048, 64), intermediate_size=sized(8192, 128),
        num_hidden_layers=sized(16, 2), num_attention_heads=sized(32, 4), num_key_value_heads=sized(8, 2),
        max_position_embeddings=4096, tie_word_embeddings=True)
    with torch.device(DEVICE):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


@pytest.mark.parametrize("model", ["tiny zoo target fp32", "random 1B bf16"])
def test_verification_cost_for_1_to_64_tokens(model, zoo, gpu_report):
    from draftsmith.data.zoo import load_zoo
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.evaluation.cost import measure_verify_samples

    if model.startswith("tiny"):
        net = load_zoo("tiny")[1].to(DEVICE)
    else:
        net = llama_1b(torch.bfloat16)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    samples = measure_verify_samples(ModelAdapter(net), prefix_tokens=sized(512, 32), sizes=sizes,
                                     repeats=sized(9, 2))
    ms = {n: 1e3 * sorted(samples[n])[len(samples[n]) // 2] for n in sizes}
    gpu_report.add("verification cost: one target forward over n new tokens after 512 cached (ms)", model=model,
                   **{f"n={n}": ms[n] for n in sizes}, ratio_64_to_1=ms[64] / ms[1])
    assert all(v > 0 for v in ms.values())
    if not DRY_RUN:  # the point of verification on a GPU: 64 tokens cost far less than 64 single-token steps
        assert ms[64] < 16 * ms[1], ms


def count_syncs(fn) -> int:
    """Host synchronisations ``fn`` makes on CUDA (``torch.cuda.set_sync_debug_mode('warn')``); 0 off CUDA."""
    if DEVICE != "cuda":
        fn()
        return 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


@pytest.mark.parametrize("method", ["ar", "draft", "pld"])
def test_host_synchronisations_per_step(method, zoo, gpu_report):
    """Step timing off (``GenerationConfig(timing=False)``): the verdict, the draft model's chain (its confidence stop
    off; with it, one read per drafted token) and the committed tokens' upload, at most 2 per step plus a draft's
    upload on the steps prompt lookup drafts (tests/inference/core/test_host_reads.py counts the same on the CPU)."""
    from draftsmith.data.zoo import load_zoo
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.generate import GenerationConfig, generate
    from draftsmith.inference.methods import ProposerContext
    from draftsmith.inference.methods.draft_model import draft_model_proposer
    from draftsmith.inference.methods.prompt_lookup import prompt_lookup_proposer

    tokenizer, target, draft = load_zoo("tiny")
    target = target.to(DEVICE)
    ctx = ProposerContext(target_model=target, method=method, tokenizer=tokenizer, draft_model=draft,
                          options={"confidence_threshold": 0.0})
    build = {"ar": lambda: None, "draft": lambda: draft_model_proposer(ctx), "pld": lambda: prompt_lookup_proposer(ctx)}
    proposer = build[method]()
    prompt = tokenizer("def fibonacci(n):\n    # return the n-th Fibonacci number\n", return_tensors="pt").input_ids[0]
    config = GenerationConfig(max_new_tokens=sized(64, 8), timing=False)
    adapter = ModelAdapter(target)
    generate(adapter, prompt, config, proposer)  # warm-up (kernels, caches)
    result = []
    syncs = count_syncs(lambda: result.append(generate(adapter, prompt, config, proposer)))
    steps = len(result[0].accept_lengths)
    gpu_report.add("host synchronisations per decoding step (tiny zoo, float32, 64 tokens, step timing off)",
                   method=method, steps=steps, syncs=syncs, per_step=syncs / steps,
                   tau=len(result[0].output_ids) / steps)
    assert steps > 0
    if DEVICE == "cuda":  # every step reads its verdict on the host at least once: the counter sees it
        assert steps <= syncs <= 2.2 * steps + 2
