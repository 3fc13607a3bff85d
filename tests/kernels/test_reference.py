"""The chunked linear + divergence reference against the naive unfused loss (values and gradients)."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from draftsmith.kernels import (
    chunked_linear_divergence,
    fused_linear_divergence,
    naive_linear_divergence,
    resolve_backend,
)
from draftsmith.kernels.reference import default_chunk_size

N, V, H, HT = 37, 1000, 24, 20
CASES = [("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.5), ("jsd", 0.1), ("jsd", 1.0), ("tvd", 0.5), ("nla", 0.5),
         ("lk_hybrid", 0.5)]
TOL = {torch.float32: dict(rtol=2e-5, atol=1e-6), torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def make_inputs(dtype, seed=0, n=N, v=V, h=H, ht=HT, bias=True):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(dtype)  # noqa: E731
    return dict(
        hidden=rnd(n, h).requires_grad_(),
        weight=rnd(v, h, scale=h**-0.5 * 2).requires_grad_(),
        bias=rnd(v, scale=0.5).requires_grad_() if bias else None,
        teacher_hidden=rnd(n, ht),
        teacher_weight=rnd(v, ht, scale=ht**-0.5 * 2),
        teacher_bias=rnd(v, scale=0.5),
    )


def grads_of(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


def assert_grads_close(got, want, dtype):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        scale = w.float().abs().max().item()
        torch.testing.assert_close(
            g.float(), w.float(), rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] * max(scale, 1e-3)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("kind", "beta"), CASES)
def test_chunked_matches_naive_with_teacher_head(kind, beta, dtype):
    x = make_inputs(dtype)
    mask = torch.rand(N, generator=torch.Generator().manual_seed(9)) > 0.3
    args = dict(kind=kind, beta=beta, temperature=1.3, mask=mask)
    teacher = dict(
        teacher_hidden=x["teacher_hidden"], teacher_weight=x["teacher_weight"], teacher_bias=x["teacher_bias"]
    )
    params = (x["hidden"], x["weight"], x["bias"])
    want = naive_linear_divergence(x["hidden"], x["weight"], bias=x["bias"], **teacher, **args)
    got = chunked_linear_divergence(x["hidden"], x["weight"], bias=x["bias"], chunk_size=8, **teacher, **args)
    assert got.dtype == torch.float32 and got.dim() == 0
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert want.item() > 0
    assert_grads_close(grads_of(got, params), grads_of(want, params), dtype)


@pytest.mark.parametrize(("kind", "beta"), CASES)
def test_chunked_matches_naive_with_teacher_logits(kind, beta):
    x = make_inputs(torch.float32, seed=1, bias=False)
    teacher_logits = x["teacher_hidden"] @ x["teacher_weight"].t()  # [N, V]
    teacher_logits[:, -7:] = -math.inf  # padded vocabulary entries, masked in both models
    weight = x["weight"].detach().clone()
    weight[-7:] = 0.0
    weight.requires_grad_()
    student_bias = torch.zeros(V)
    student_bias[-7:] = -math.inf
    args = dict(kind=kind, beta=beta, temperature=0.7)
    want = naive_linear_divergence(x["hidden"], weight, teacher_logits, bias=student_bias, **args)
    got = chunked_linear_divergence(x["hidden"], weight, teacher_logits, bias=student_bias, chunk_size=5, **args)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    got_g, want_g = grads_of(got, (x["hidden"], weight)), grads_of(want, (x["hidden"], weight))
    assert all(torch.isfinite(g).all() for g in got_g)
    assert_grads_close(got_g, want_g, torch.float32)


@pytest.mark.parametrize("chunk_size", [1, 16, 37, 64, None])
def test_chunk_size_does_not_change_the_result(chunk_size):
    x = make_inputs(torch.float32, seed=2)
    teacher = dict(teacher_hidden=x["teacher_hidden"], teacher_weight=x["teacher_weight"])
    params = (x["hidden"], x["weight"], x["bias"])
    want = naive_linear_divergence(x["hidden"], x["weight"], bias=x["bias"], kind="jsd", **teacher)
    got = chunked_linear_divergence(
        x["hidden"], x["weight"], bias=x["bias"], kind="jsd", chunk_size=chunk_size, **teacher
    )
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert_grads_close(grads_of(got, params), grads_of(want, params), torch.float32)


def test_leading_dims_sum_reduction_and_upstream_gradient():
    x = make_inputs(torch.float32, seed=3, n=2 * 9, bias=False)
    hidden = x["hidden"].detach().reshape(2, 9, H).requires_grad_()
    teacher_logits = (x["teacher_hidden"] @ x["teacher_weight"].t()).reshape(2, 9, V)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    args = dict(kind="tvd", mask=mask, reduction="sum")
    want = 2.5 * naive_linear_divergence(hidden, x["weight"], teacher_logits, **args)
    got = 2.5 * chunked_linear_divergence(hidden, x["weight"], teacher_logits, chunk_size=4, **args)
    torch.testing.assert_close(got, want)
    g_got, g_want = grads_of(got, (hidden, x["weight"])), grads_of(want, (hidden, x["weight"]))
    assert g_got[0].shape == (2, 9, H)
    assert (g_got[0][1, 5:] == 0).all()
    assert_grads_close(g_got, g_want, torch.float32)


def test_gradients_only_where_required_and_teacher_is_frozen():
    x = make_inputs(torch.float32, seed=4)
    teacher_hidden = x["teacher_hidden"].requires_grad_()
    hidden = x["hidden"].detach()  # e.g. a frozen trunk: only the LM head trains
    loss = chunked_linear_divergence(
        hidden, x["weight"], teacher_hidden=teacher_hidden, teacher_weight=x["teacher_weight"], kind="reverse_kl"
    )
    loss.backward()
    assert x["weight"].grad is not None and x["weight"].grad.abs().sum() > 0
    assert teacher_hidden.grad is None and hidden.grad is None
    with torch.no_grad():
        value = chunked_linear_divergence(
            x["hidden"],
            x["weight"],
            teacher_hidden=teacher_hidden,
            teacher_weight=x["teacher_weight"],
            kind="reverse_kl",
        )
    assert not value.requires_grad
    torch.testing.assert_close(value, loss.detach())


def test_all_tokens_masked_gives_zero_loss_and_gradients():
    x = make_inputs(torch.float32, seed=5)
    mask = torch.zeros(N, dtype=torch.bool)
    loss = chunked_linear_divergence(
        x["hidden"], x["weight"], teacher_hidden=x["teacher_hidden"], teacher_weight=x["teacher_weight"], mask=mask
    )
    assert loss.item() == 0.0
    g_h, g_w = grads_of(loss, (x["hidden"], x["weight"]))
    assert (g_h == 0).all() and (g_w == 0).all()


def test_dispatch_uses_the_reference_on_cpu():
    x = make_inputs(torch.float32, seed=6, n=11, v=50, h=8, ht=8)
    teacher = dict(teacher_hidden=x["teacher_hidden"], teacher_weight=x["teacher_weight"])
    auto = fused_linear_divergence(x["hidden"], x["weight"], **teacher, kind="tvd")
    ref = fused_linear_divergence(x["hidden"], x["weight"], **teacher, kind="tvd", backend="reference")
    assert auto.item() == ref.item()
    with pytest.raises(ValueError, match="backend"):
        fused_linear_divergence(x["hidden"], x["weight"], **teacher, backend="cuda")
    assert "draftsmith.kernels.triton_divergence" not in sys.modules  # never imported on the CPU path


def test_auto_backend_picks_triton_for_cuda_tensors():
    assert resolve_backend("auto", torch.device("cpu")) == "reference"
    assert resolve_backend("auto", torch.device("cuda", 0)) == "triton"
    assert resolve_backend("reference", torch.device("cuda", 0)) == "reference"


def test_argument_errors_name_the_problem():
    x = make_inputs(torch.float32, seed=7, n=5, v=30, h=8, ht=6)
    h, w = x["hidden"], x["weight"]
    teacher_logits = torch.randn(5, 30)
    with pytest.raises(ValueError, match="exactly one"):
        chunked_linear_divergence(h, w)
    with pytest.raises(ValueError, match="exactly one"):
        chunked_linear_divergence(h, w, teacher_logits, teacher_hidden=x["teacher_hidden"])
    with pytest.raises(ValueError, match="teacher logits"):
        chunked_linear_divergence(h, w, teacher_logits[:, :29])
    with pytest.raises(ValueError, match="share tokens and vocabulary"):
        chunked_linear_divergence(h, w, teacher_hidden=x["teacher_hidden"], teacher_weight=x["teacher_weight"][:29])
    with pytest.raises(ValueError, match="needs teacher_weight"):
        chunked_linear_divergence(h, w, teacher_hidden=x["teacher_hidden"])
    with pytest.raises(ValueError, match="LM-head weight"):
        chunked_linear_divergence(h, w[:, :7], teacher_logits)
    with pytest.raises(ValueError, match="mask"):
        chunked_linear_divergence(h, w, teacher_logits, mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="unknown divergence"):
        chunked_linear_divergence(h, w, teacher_logits, kind="kl")
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_linear_divergence(h, w, teacher_logits, chunk_size=0)


def test_default_chunk_size_follows_the_liger_heuristic():
    assert default_chunk_size(4096, 32000, 512) == 128  # ceil(32000/512) = 63 -> ceil(4096/63) = 66 -> 128
    assert default_chunk_size(37, 1000, 24) == 1  # ceil(1000/24) = 42 > 37 tokens
    assert default_chunk_size(10, 8, 16) == 10  # never more than the tokens
    assert default_chunk_size(0, 10, 10) == 1


def test_a_gpu_budget_raises_the_rows_per_chunk_to_a_float32_chunk_of_that_size():
    gib = 2**30
    assert default_chunk_size(2048, 256000, 1024, gib) == 1024  # 1,024 x 256,000 x 4 bytes <= 1 GiB
    assert default_chunk_size(2048, 128256, 4096, gib) == 2048  # the heuristic alone: 64
    assert default_chunk_size(100, 32000, 512, gib) == 100  # never more than the tokens
    assert default_chunk_size(4096, 32000, 512, 1) == 128  # a budget below one row leaves the heuristic


def test_under_autocast_the_chunked_loss_runs_in_its_dtype_and_keeps_the_master_weights_dtype():
    """Mixed precision: float32 hidden states and head (master weights), bfloat16 products (autocast), a bfloat16
    teacher; the loss equals the naive loss under the same autocast, gradients come in float32."""
    inputs = make_inputs(torch.float32, bias=False)
    teacher = {k: inputs[k].to(torch.bfloat16) for k in ("teacher_hidden", "teacher_weight", "teacher_bias")}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = chunked_linear_divergence(inputs["hidden"], inputs["weight"], **teacher, chunk_size=3)
        want = naive_linear_divergence(inputs["hidden"], inputs["weight"], **teacher)
    got = grads_of(loss, [inputs["hidden"], inputs["weight"]])
    assert all(g.dtype == torch.float32 for g in got)
    torch.testing.assert_close(loss, want.float(), rtol=2e-2, atol=1e-3)
    assert_grads_close(got, grads_of(want, [inputs["hidden"], inputs["weight"]]), torch.bfloat16)


def test_the_cpu_takes_at_least_128_rows_or_16_mib_a_chunk_and_cuda_keeps_its_budget():
    from draftsmith.kernels.reference import CPU_MIN_CHUNK_ROWS, resolve_chunk_size

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert default_chunk_size(1024, 49152, 576) == 16  # the heuristic alone: a fixed [V, H] cost every 16 rows
    assert resolve_chunk_size(None, 1024, 49152, 576, cpu) == CPU_MIN_CHUNK_ROWS == 128
    assert resolve_chunk_size(None, 40, 49152, 576, cpu) == 40  # never more than the tokens
    assert resolve_chunk_size(None, 4096, 512, 64, cpu) == 4096  # a small vocabulary: as many rows as 16 MiB hold
    assert resolve_chunk_size(None, 4096, 8192, 576, cpu) == 512  # 512 x 8,192 x 4 bytes = 16 MiB
    assert resolve_chunk_size(None, 900, 2048, 256, cpu) == 900  # EAGLE-3's tiny draft vocabulary: one chunk
    assert resolve_chunk_size(None, 1024, 49152, 576, cuda) == 1024  # the GPU's budget: 1 GiB
    assert resolve_chunk_size(8, 1024, 49152, 576, cpu) == 8  # an explicit size is kept
