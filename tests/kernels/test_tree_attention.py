"""Tree attention: the reference against the adapter's 4-D-mask attention of a real model layer's math, and the
Triton kernel against the reference in Triton's CPU interpreter (odd tree sizes, GQA, float32 and bfloat16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.kernels.tree_attention import tree_attention, tree_attention_reference, tree_visibility

CASES = ["gqa-odd-tree", "mha-chain-no-prefix", "gqa-wide-tree"]
RTOL = {"float32": 1e-5, "bfloat16": 2**-7}  # bf16 output rounding of a float32 result


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    script = Path(__file__).with_name("tree_attention_interpreter_checks.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_kernel_ran_in_the_interpreter(interpreted):
    assert interpreted["interpreted"] is True


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES)
def test_triton_matches_the_reference(interpreted, case, dtype):
    r = interpreted[f"{case}-{dtype}"]
    assert r["finite"] and r["dtype_ok"] and r["shape_ok"]
    assert r["max_abs_err"] <= RTOL[dtype] * r["max_abs_ref"], r


def test_reference_equals_masked_sdpa_with_gqa():
    torch.manual_seed(0)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    q = torch.randn(2, 4, 4, 8)
    k, v = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)  # 5 prefix keys + 4 tree keys, 2 kv heads
    visible = tree_visibility(5, tree)
    assert visible.shape == (4, 9) and bool(visible[:, :5].all()) and torch.equal(visible[:, 5:], tree)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=visible)
    assert torch.allclose(tree_attention_reference(q, k, v, tree), want, atol=1e-6)
    assert torch.equal(tree_attention(q, k, v, tree), tree_attention_reference(q, k, v, tree))  # CPU: the reference


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="divisible"):
        tree_attention_reference(torch.randn(1, 3, 2, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8),
                                 torch.ones(2, 2, dtype=torch.bool))


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 1, 2, 16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        tree_attention(x, x, x, torch.ones(2, 2, dtype=torch.bool).tril(), backend="triton")


def test_the_adapter_runs_the_registered_triton_kernel_on_a_tree_step(interpreted):
    """A tiny Llama through ModelAdapter with the Triton tree attention (interpreter) registered: the kernel runs
    once per layer in the tree step, the prefill (no tree) falls back to sdpa bit for bit, and the tree step's
    logits equal the default 4-D-mask path's."""
    r = interpreted["adapter-llama"]
    assert r["kernel_calls"] == ["triton"] * r["layers"]
    assert r["prefill_max_abs_err"] == 0.0
    assert r["tree_max_abs_err"] <= 1e-5 * max(1.0, r["tree_max_abs_logit"]), r
