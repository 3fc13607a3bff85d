"""The Triton kernels on the GPU at real sizes against their references, with time and peak memory: the fused
linear + divergence loss up to a 256k vocabulary (odd sizes, float32 and bfloat16) and tree attention at an 8B
model's shape (GQA 32/8, head dim 128, prefixes of 2k and 8k tokens)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpu_suite import DEVICE, GPU_MARKS, median_ms, peak_mib, sized

from draftsmith.inference.core.masks import causal_tree_mask
from draftsmith.kernels.dispatch import fused_linear_divergence
from draftsmith.kernels.reference import default_chunk_size, naive_linear_divergence
from draftsmith.kernels.tree_attention_reference import tree_attention_reference, tree_visibility

pytestmark = GPU_MARKS

VOCABS = sized([32000, 50257, 128256, 151936, 256000], [37, 301])  # 50257 and 151936 are not powers of two
TOKENS = sized(2048, 8)
HIDDEN = sized(1024, 16)
# relative error allowed: the loss against the float32 naive loss, gradients against the naive loss in the same dtype
LOSS_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}
GRAD_TOL = {torch.float32: 1e-3, torch.bfloat16: 3e-2}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest absolute error over the largest absolute value."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


def norm_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want|| / ||want||``: the TVD's gradient, ``sign(p - q)``, flips where p and q agree to the last bit,
    so a handful of entries differ by a whole step between any two correct computations; the norm sees them as the
    few entries they are."""
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def divergence_inputs(vocab: int, dtype: torch.dtype, hidden: int = HIDDEN, seed: int = 0) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)

    return {"hidden": rand(TOKENS, hidden), "weight": rand(vocab, hidden, scale=hidden ** -0.5),
            "teacher_hidden": rand(TOKENS, hidden), "teacher_weight": rand(vocab, hidden, scale=1.5 * hidden ** -0.5)}


def loss_and_grads(fn, inputs: dict, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = inputs["hidden"].detach().clone().requires_grad_()
    weight = inputs["weight"].detach().clone().requires_grad_()
    loss = fn(hidden, weight, teacher_hidden=inputs["teacher_hidden"], teacher_weight=inputs["teacher_weight"],
              **kwargs)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("vocab", VOCABS)
def test_fused_divergence_kernel_matches_the_naive_loss(vocab, dtype, gpu_report):
    inputs = divergence_inputs(vocab, dtype)
    kind = "tvd" if vocab == VOCABS[-2] else "forward_kl"
    exact = loss_and_grads(naive_linear_divergence, {k: v.float() for k, v in inputs.items()}, kind=kind)
    # gradients against the naive loss in the same dtype: in bfloat16 the TVD's sign(p - q) flips wherever the two
    # distributions nearly agree, so no bfloat16 computation of it is near float32's
    same = loss_and_grads(naive_linear_divergence, inputs, kind=kind)
    rows = {}
    for backend in ("triton", "reference"):
        got = loss_and_grads(fused_linear_divergence, inputs, kind=kind, backend=backend)
        grad_error = norm_error if kind == "tvd" else relative_error
        errors = [relative_error(got[0], exact[0])] + [grad_error(g, w) for g, w in zip(got[1:], same[1:])]
        assert torch.isfinite(got[0]) and errors[0] <= LOSS_TOL[dtype], (backend, errors)
        assert max(errors[1:]) <= GRAD_TOL[dtype], (backend, errors)
        rows[backend] = errors

    def step(fn, backend=None):
        extra = {} if backend is None else {"backend": backend}
        return lambda: loss_and_grads(fn, inputs, kind=kind, **extra)

    reps = sized(5, 1)
    gpu_report.add(
        "fused linear + divergence (forward and backward)", vocab=vocab, dtype=dtype, tokens=TOKENS, hidden=HIDDEN,
        kind=kind, triton_ms=median_ms(step(fused_linear_divergence, "triton"), reps),
        reference_ms=median_ms(step(fused_linear_divergence, "reference"), reps),
        naive_ms=median_ms(step(naive_linear_divergence), reps),
        triton_peak_mib=peak_mib(step(fused_linear_divergence, "triton")),
        reference_peak_mib=peak_mib(step(fused_linear_divergence, "reference")),
        naive_peak_mib=peak_mib(step(naive_linear_divergence)),
        triton_loss_rel_err=rows["triton"][0], triton_grad_rel_err=max(rows["triton"][1:]))


def random_parents(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [-1 if i == 0 else int(torch.randint(-1, i, (1,), generator=g)) for i in range(n)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("prefix", sized([2048, 8192], [24]))
def test_tree_attention_kernel_at_an_8b_shape(prefix, dtype, gpu_report):
    from draftsmith.kernels.triton_tree_attention import triton_tree_attention

    hq, hkv, d, nodes = sized((32, 8, 128, 64), (4, 2, 16, 8))
    tree = causal_tree_mask(random_parents(nodes)).to(DEVICE)  # [T, T]
    g = torch.Generator(device="cpu").manual_seed(1)
    q = torch.randn(1, hq, nodes, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(1, hkv, prefix + nodes, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(1, hkv, prefix + nodes, d, generator=g).to(DEVICE, dtype)
    mask = tree_visibility(prefix, tree).to(DEVICE)  # [T, P + T] bool

    def sdpa():  # what the model's own attention runs under the adapter's mask (keys repeated for GQA)
        group = hq // hkv
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                              attn_mask=mask)

    want = tree_attention_reference(q, k, v, tree)
    got = triton_tree_attention(q, k, v, tree)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    kernel_err, sdpa_err = relative_error(got, want), relative_error(sdpa(), want)
    assert torch.isfinite(got).all() and kernel_err <= tol, kernel_err
    reps = sized(20, 1)
    gpu_report.add("tree attention (8B shape: 32 query / 8 key-value heads, head dim 128)", prefix=prefix,
                   nodes=nodes, dtype=dtype, kernel_ms=median_ms(lambda: triton_tree_attention(q, k, v, tree), reps),
                   sdpa_mask_ms=median_ms(sdpa, reps), kernel_rel_err=kernel_err, sdpa_rel_err=sdpa_err,
                   kernel_peak_mib=peak_mib(lambda: triton_tree_attention(q, k, v, tree)),
                   sdpa_peak_mib=peak_mib(sdpa))


@pytest.mark.parametrize("vocab,hidden", sized([(128256, 4096), (256000, 1024)], [(301, 16)]))
def test_fused_divergence_chunk_sizes(vocab, hidden, gpu_report):
    """Time and memory of the Triton loss by rows per chunk (the default heuristic's and fixed ones): the same loss
    whatever the chunking."""
    inputs = divergence_inputs(vocab, torch.bfloat16, hidden)
    default = default_chunk_size(TOKENS, vocab, hidden)
    losses = {}
    for chunk in sorted({default, *sized([64, 256, 1024, 2048], [2, 8])}):
        step = lambda c=chunk: loss_and_grads(fused_linear_divergence, inputs, chunk_size=c)  # noqa: E731
        losses[chunk] = float(step()[0])
        gpu_report.add("fused linear + divergence by rows per chunk (bfloat16, forward and backward)", vocab=vocab,
                       hidden=hidden, tokens=TOKENS, chunk=chunk, default=chunk == default,
                       ms=median_ms(step, sized(5, 1)), peak_mib=peak_mib(step))
    first = next(iter(losses.values()))
    assert all(abs(v - first) <= 1e-4 * abs(first) for v in losses.values()), losses
