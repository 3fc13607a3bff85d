"""The Triton divergence kernel against the PyTorch reference, on the CPU under ``TRITON_INTERPRET=1``.

``@triton.jit`` (also for triton's own ``tl.max``/``tl.sum`` helpers) chooses compiled or interpreted
when it decorates, i.e. when triton is first imported, and in a full test session transformers
imports triton long before this module. So the comparisons run once, in a fresh child process that
sets ``TRITON_INTERPRET=1`` before any import (``triton_interpreter_checks.py``), and report measured
errors as JSON; the assertions are here. Shapes are small (4 x 1000 rows in 256-wide vocabulary
blocks; 37 tokens x H 24 x V 1000 end to end): the whole child run takes about 10 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.kernels import fused_linear_divergence

ROW_CASES = [
    ("forward_kl", 0.5),
    ("reverse_kl", 0.5),
    ("jsd", 0.5),
    ("jsd", 0.2),
    ("jsd", 0.0),
    ("jsd", 1.0),
    ("tvd", 0.5),
]
FUSED_CASES = [("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.3), ("tvd", 0.5)]
DTYPES = ["float32", "bfloat16"]
# loss: float32 accumulation in both; gradients: float32, or bfloat16 (the kernel writes bfloat16 gradients,
# compared with the reference's float32 gradient rounded to bfloat16: within 4 ulps of the largest entry)
LOSS_RTOL = 2e-6
GRAD_RTOL = {"float32": 2e-6, "bfloat16": 2**-6}


@pytest.fixture(scope="module")
def interpreted_results() -> dict:
    pytest.importorskip("triton")
    script = Path(__file__).with_name("triton_interpreter_checks.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cases = json.dumps({"rows": ROW_CASES, "fused": FUSED_CASES, "dtypes": DTYPES})
    out = subprocess.run([sys.executable, str(script), cases], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def assert_close(err: dict, rtol: float) -> None:
    assert err["finite"]
    assert err["max_abs_ref"] > 0
    assert err["max_abs_err"] <= rtol * err["max_abs_ref"], err


def test_the_kernel_ran_in_the_interpreter(interpreted_results):
    assert interpreted_results["interpreted"] is True


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("kind", "beta"), ROW_CASES)
def test_rows_match_reference(interpreted_results, kind, beta, dtype):
    """One chunk: V = 1000 in four 256-wide blocks (last partial), -inf entries, temperature 1.7."""
    r = interpreted_results[f"rows-{kind}-{beta}-{dtype}"]
    assert r["loss_value"] > 0.1
    assert_close(r["loss"], LOSS_RTOL * 4)
    assert_close(r["loss_only"], LOSS_RTOL * 4)
    assert_close(r["grad"], GRAD_RTOL[dtype] * 4 if dtype == "float32" else GRAD_RTOL[dtype])
    assert r["in_place"] and r["no_grad_is_none"] and r["padding_grad_zero"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("kind", "beta"), FUSED_CASES)
def test_fused_triton_backend_matches_reference(interpreted_results, kind, beta, dtype):
    """End to end through the chunked driver: N = 37 (masked), H = 24, V = 1000, chunks of 16, bias."""
    r = interpreted_results[f"fused-{kind}-{beta}-{dtype}"]
    assert r["loss_value"] > 0.1
    assert_close(r["loss"], LOSS_RTOL)
    for grad in r["grads"]:  # hidden, weight, bias
        assert_close(grad, GRAD_RTOL[dtype])
    assert r["grad_dtypes_ok"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_soft_cross_entropy_on_the_triton_backend_matches_reference(interpreted_results, dtype):
    """EAGLE's soft cross-entropy as the kernel's forward KL plus the teacher's entropy, end to end."""
    r = interpreted_results[f"soft-{dtype}"]
    assert r["loss_value"] > 0.1
    assert_close(r["loss"], LOSS_RTOL if dtype == "float32" else GRAD_RTOL[dtype])
    for grad in r["grads"]:  # hidden, weight
        assert_close(grad, GRAD_RTOL[dtype])


def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    h, w, t = torch.randn(3, 4), torch.randn(6, 4), torch.randn(3, 6)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        fused_linear_divergence(h, w, t, backend="triton")
