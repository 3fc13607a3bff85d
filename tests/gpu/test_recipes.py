"""One short bfloat16 training run of every recipe on the GPU (a tiny random Llama pair, each recipe's test
settings): finite losses, an artefact that loads onto the GPU target and decodes.

The Draft & Verify search trains nothing: it is in ``test_commands.py``, with the other commands that time the
target on the device."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from gpu_suite import DEVICE, GPU_MARKS, ROOT
from tiny_pair import write_pair

pytestmark = GPU_MARKS

RUNS = {  # id -> (recipe, settings beyond its <recipe>_test.yaml)
    "distillspec": ("distillspec", ["--draft", "{draft}"]),
    "medusa1": ("medusa", []),
    "medusa2": ("medusa", ["variant=medusa2"]),
    "eagle1": ("eagle", ["variant=eagle1"]),
    "eagle3": ("eagle", ["variant=eagle3"]),
    "eagle31": ("eagle", ["variant=eagle3", "fc_norm=true", "norm_output=true", "ttt_recompute=false"]),
    "peagle": ("eagle", ["variant=peagle", "ttt_steps=3", "draft_length=3"]),
    "dflash": ("dflash", []),
    "layerskip": ("layerskip", []),
    "bita": ("bita", []),
    "cllm": ("cllm", []),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    return write_pair(tmp_path_factory.mktemp("gpu_pair"), target_layers=4)  # EAGLE-3 fuses three layers


def logged_losses(out: Path) -> list[float]:
    """Training losses of the run's last checkpoint's ``trainer_state.json``."""
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    history = json.loads((last / "trainer_state.json").read_text())["log_history"]
    return [h["loss"] for h in history if "loss" in h]


@pytest.mark.parametrize("run_id", list(RUNS))
def test_bfloat16_training_gives_finite_losses_and_a_loadable_artefact(run_id, pair, tmp_path, gpu_report):
    import transformers

    from draftsmith.inference.artefacts.manifest import adapted_target
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.generate import GenerationConfig, generate
    from draftsmith.inference.methods import load_artefact
    from draftsmith.launch.recipe import run_recipe

    recipe, extra = RUNS[run_id]
    out = tmp_path / run_id
    argv = ["--config", str(ROOT / "launch" / "configs" / "recipes" / f"{recipe}_test.yaml"), "--target", str(pair["target"]),
            "--dataset", str(pair["dataset"]), "--output_dir", str(out), "--dtype", "bfloat16",
            *[x.format(draft=pair["draft"]) for x in extra]]
    start = time.perf_counter()
    result = run_recipe(recipe, argv)
    seconds = time.perf_counter() - start
    losses = logged_losses(out)
    assert losses and all(math.isfinite(x) for x in losses), losses

    tokenizer = transformers.AutoTokenizer.from_pretrained(pair["target"])
    target = transformers.AutoModelForCausalLM.from_pretrained(pair["target"], dtype=torch.bfloat16).to(DEVICE).eval()
    verified = adapted_target(result.artefact, result.manifest, target).to(DEVICE)
    proposer, manifest = load_artefact(result.artefact, verified, tokenizer)
    prompt = tokenizer("What is 7 plus 7? 7 plus 7 is", return_tensors="pt").input_ids[0]  # [L]
    decoded = generate(ModelAdapter(verified), prompt, GenerationConfig(max_new_tokens=16), proposer)
    assert len(decoded.output_ids) > 0
    gpu_report.add("bfloat16 training, one short run per recipe (tiny random pair)", run=run_id,
                   steps=manifest["training"].get("steps"), seconds=seconds, first_loss=losses[0],
                   last_loss=losses[-1], param_dtype=str(next(verified.parameters()).dtype),
                   decoded_tokens=len(decoded.output_ids),
                   tau=len(decoded.output_ids) / max(1, len(decoded.accept_lengths)))


def test_the_unrolled_attentions_agree_on_the_device(gpu_report):
    """EAGLE-3's training-time test attends through SDPA under the visibility mask on CUDA and through the structured
    scores elsewhere: the same values and gradients on the device, in float32 and bfloat16. TF32 products are off
    for the comparison (the recipes' training policy turns them on: errors of 1e-3 in float32)."""
    from draftsmith.trainers.eagle.ttt import ttt_attention

    tf32 = torch.backends.cuda.matmul.allow_tf32 if DEVICE == "cuda" else None
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _compare_unrolled_attentions(ttt_attention, gpu_report)
    finally:
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = tf32


def _compare_unrolled_attentions(ttt_attention, gpu_report) -> None:
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        q = torch.randn(2, 8, 96, 64, generator=gen, device=DEVICE, dtype=dtype, requires_grad=True)
        keys = [torch.randn(2, 2, 96, 64, generator=gen, device=DEVICE, dtype=dtype, requires_grad=True)
                for _ in range(5)]
        values = [torch.randn_like(k, requires_grad=True) for k in keys]
        outs = [ttt_attention(q, keys, values, 64**-0.5, masked=m) for m in (True, False)]
        grads = [torch.autograd.grad(o.float().square().sum(), [q, *keys, *values]) for o in outs]
        error = float((outs[0].detach().float() - outs[1].detach().float()).abs().max())
        grad_error = max(float((a.float() - b.float()).abs().max()) for a, b in zip(*grads))
        assert error <= tol and grad_error <= 10 * tol, (dtype, error, grad_error)
        gpu_report.add("EAGLE-3's unrolled attention, masked SDPA against the structured scores", dtype=str(dtype),
                       max_abs_error=error, max_abs_grad_error=grad_error)
