"""Property tests for the DistillSpec divergences (draftsmith.trainers.losses)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsmith.inference.core.draft_length import expected_tau
from draftsmith.trainers.losses import (
    DIVERGENCES,
    acceptance_from_tvd,
    divergence,
    divergence_per_token,
)

KINDS = sorted(DIVERGENCES)
SETTINGS = settings(max_examples=30, deadline=None)


@st.composite
def logit_pairs(draw, max_n: int = 6, max_v: int = 40, scale: float = 6.0):
    """Two float64 logit matrices [N, V] drawn from a seed (fast, covers peaked and flat rows)."""
    n = draw(st.integers(1, max_n))
    v = draw(st.integers(2, max_v))
    seed = draw(st.integers(0, 2**31 - 1))
    s_scale = draw(st.floats(0.01, scale))
    t_scale = draw(st.floats(0.01, scale))
    gen = torch.Generator().manual_seed(seed)
    student = torch.randn(n, v, generator=gen, dtype=torch.float64) * s_scale
    teacher = torch.randn(n, v, generator=gen, dtype=torch.float64) * t_scale
    return student, teacher


betas = st.floats(0.0, 1.0)
temperatures = st.floats(0.25, 4.0)


def numpy_divergence(student: np.ndarray, teacher: np.ndarray, kind: str, beta: float, temperature: float):
    """Brute-force float64 definitions, written independently of the module under test."""

    def softmax(x):
        z = x / temperature
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    q, p = softmax(student), softmax(teacher)

    def kl(a, b):
        return np.sum(np.where(a > 0, a * (np.log(np.where(a > 0, a, 1)) - np.log(b)), 0.0), -1)

    if kind == "forward_kl":
        return kl(p, q)
    if kind == "reverse_kl":
        return kl(q, p)
    if kind == "tvd":
        return 0.5 * np.abs(p - q).sum(-1)
    alpha = np.minimum(p, q).sum(-1)  # the acceptance rate, for the LK losses (Samarin et al. 2026)
    if kind == "nla":
        return -np.log(np.maximum(alpha, 1e-5))
    if kind == "lk_hybrid":
        weight = np.exp(-3.0 * alpha)
        return weight * kl(p, q) + (1 - weight) * (1 - alpha)
    if beta == 0.0:
        return kl(p, q)
    if beta == 1.0:
        return kl(q, p)
    m = beta * p + (1 - beta) * q
    return beta * kl(p, m) + (1 - beta) * kl(q, m)


@SETTINGS
@given(logit_pairs(), st.sampled_from(KINDS), betas, temperatures)
def test_matches_numpy_brute_force(pair, kind, beta, temperature):
    student, teacher = pair
    got = divergence_per_token(student, teacher, kind, beta=beta, temperature=temperature)
    want = numpy_divergence(student.numpy(), teacher.numpy(), kind, beta, temperature)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12)
    mean = divergence(student, teacher, kind, beta=beta, temperature=temperature)
    assert mean.item() == pytest.approx(float(want.mean()), rel=1e-9, abs=1e-12)


@SETTINGS
@given(logit_pairs(), st.sampled_from(KINDS), betas, temperatures, st.floats(-5, 5))
def test_zero_for_identical_inputs_and_shift_invariant(pair, kind, beta, temperature, shift):
    student, _ = pair
    # identical distributions (a constant shift of the logits does not change the softmax)
    values = divergence_per_token(student, student + shift, kind, beta=beta, temperature=temperature)
    np.testing.assert_allclose(values.numpy(), 0.0, atol=1e-10)


@SETTINGS
@given(logit_pairs(), st.sampled_from(KINDS), betas, temperatures)
def test_non_negative_and_tvd_within_unit_interval(pair, kind, beta, temperature):
    student, teacher = pair
    values = divergence_per_token(student, teacher, kind, beta=beta, temperature=temperature)
    assert (values >= -1e-12).all()
    if kind == "tvd":
        assert (values <= 1 + 1e-12).all()
    if kind == "jsd" and 0 < beta < 1:
        # generalised JSD is bounded by the binary entropy H(beta) (Lin 1991); log 2 at beta = 1/2
        bound = -(beta * math.log(beta) + (1 - beta) * math.log1p(-beta))
        assert (values <= bound + 1e-9).all()


def test_tvd_reaches_one_for_disjoint_supports():
    student = torch.tensor([[0.0, -math.inf, -math.inf]])
    teacher = torch.tensor([[-math.inf, 0.0, 0.0]])
    assert divergence(student, teacher, "tvd").item() == pytest.approx(1.0)
    assert divergence(student, teacher, "jsd", beta=0.5).item() == pytest.approx(math.log(2))
    assert math.isinf(divergence(student, teacher, "forward_kl").item())


@SETTINGS
@given(logit_pairs(), temperatures)
def test_symmetry_of_tvd_and_jsd_half(pair, temperature):
    student, teacher = pair
    for kind in ("tvd", "jsd"):
        ab = divergence_per_token(student, teacher, kind, beta=0.5, temperature=temperature)
        ba = divergence_per_token(teacher, student, kind, beta=0.5, temperature=temperature)
        np.testing.assert_allclose(ab.numpy(), ba.numpy(), rtol=1e-10, atol=1e-13)


@SETTINGS
@given(logit_pairs(), st.one_of(st.sampled_from([0.0, 1.0]), st.floats(1e-6, 1 - 1e-6)))
def test_kl_directions_and_jsd_beta_mirror(pair, beta):
    student, teacher = pair
    fkl = divergence_per_token(student, teacher, "forward_kl")
    rkl = divergence_per_token(teacher, student, "reverse_kl")
    np.testing.assert_allclose(fkl.numpy(), rkl.numpy(), rtol=1e-10, atol=1e-13)  # KL(p||q) both ways round
    # swapping the models mirrors beta: JSD_beta(p, q) = JSD_{1-beta}(q, p) (beta away from the float
    # rounding of 1 - beta to exactly 0 or 1, where the endpoint convention jumps to a KL)
    a = divergence_per_token(student, teacher, "jsd", beta=beta)
    b = divergence_per_token(teacher, student, "jsd", beta=1 - beta)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12)


@SETTINGS
@given(logit_pairs(scale=2.0))
def test_jsd_beta_limits(pair):
    """JSD(beta) -> 0 at both ends, JSD/beta -> forward KL and JSD/(1-beta) -> reverse KL; the exact
    endpoints return the KLs themselves (TRL's convention)."""
    student, teacher = pair
    fkl = divergence_per_token(student, teacher, "forward_kl")
    rkl = divergence_per_token(student, teacher, "reverse_kl")
    # The first-order expansion of m needs beta * max(p/q, q/p) << 1, so pick beta from the largest ratio.
    log_ratio = (torch.log_softmax(student, -1) - torch.log_softmax(teacher, -1)).abs().max().item()
    eps = min(1e-6, 1e-5 * math.exp(-log_ratio))
    hi = 1.0 - eps
    eps_hi = 1.0 - hi  # exact in float64 (Sterbenz), unlike eps itself
    near_zero = divergence_per_token(student, teacher, "jsd", beta=eps)
    near_one = divergence_per_token(student, teacher, "jsd", beta=hi)
    np.testing.assert_allclose(near_zero.numpy() / eps, fkl.numpy(), rtol=1e-3, atol=1e-9)
    np.testing.assert_allclose(near_one.numpy() / eps_hi, rkl.numpy(), rtol=1e-3, atol=1e-9)
    assert (near_zero <= 1e-4).all() and (near_one <= 1e-4).all()  # the formula itself vanishes
    assert torch.equal(divergence_per_token(student, teacher, "jsd", beta=0.0), fkl)
    assert torch.equal(divergence_per_token(student, teacher, "jsd", beta=1.0), rkl)


@SETTINGS
@given(logit_pairs(), temperatures)
def test_acceptance_is_sum_of_min(pair, temperature):
    student, teacher = pair
    tvd = divergence_per_token(student, teacher, "tvd", temperature=temperature)
    q = torch.softmax(student / temperature, -1)
    p = torch.softmax(teacher / temperature, -1)
    np.testing.assert_allclose(acceptance_from_tvd(tvd).numpy(), torch.minimum(p, q).sum(-1).numpy(), atol=1e-12)


@pytest.mark.parametrize(
    ("kind", "beta"), [("forward_kl", 0.5), ("reverse_kl", 0.5), ("tvd", 0.5), ("jsd", 0.0), ("jsd", 0.3), ("jsd", 1.0)]
)
def test_gradients_finite_and_correct(kind, beta):
    gen = torch.Generator().manual_seed(0)
    student = (torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    teacher = torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2
    fn = lambda s: divergence(s, teacher, kind, beta=beta, temperature=1.5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (student,))
    (grad,) = torch.autograd.grad(fn(student), student)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    # softmax is shift invariant, so each row's gradient sums to zero
    np.testing.assert_allclose(grad.sum(-1).numpy(), 0.0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_neg_inf_logits_are_zero_probability(kind, beta, dtype):
    gen = torch.Generator().manual_seed(1)
    student = torch.randn(3, 8, generator=gen).to(dtype)
    teacher = torch.randn(3, 8, generator=gen).to(dtype)
    blocked = torch.zeros(3, 8, dtype=torch.bool)
    blocked[:, 5:] = True  # e.g. padded vocabulary entries, masked in both models
    s_inf = torch.where(blocked, -math.inf, student).requires_grad_()
    t_inf = torch.where(blocked, -math.inf, teacher)
    value = divergence(s_inf, t_inf, kind, beta=beta)
    want = divergence(student[:, :5], teacher[:, :5], kind, beta=beta)
    assert value.dtype == torch.float32
    assert value.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-7)
    (grad,) = torch.autograd.grad(value, s_inf)
    assert torch.isfinite(grad).all()
    assert (grad[blocked] == 0).all()


def test_infinite_divergence_when_support_is_missing():
    student = torch.tensor([[0.0, -math.inf]])
    teacher = torch.tensor([[0.0, 0.0]])
    assert math.isinf(divergence(student, teacher, "forward_kl").item())
    assert divergence(student, teacher, "reverse_kl").item() == pytest.approx(math.log(2))
    assert divergence(student, teacher, "tvd").item() == pytest.approx(0.5)


@pytest.mark.parametrize("kind", KINDS)
def test_mask_excludes_tokens_from_value_and_gradient(kind):
    gen = torch.Generator().manual_seed(2)
    student = torch.randn(6, 10, generator=gen, requires_grad=True)
    teacher = torch.randn(6, 10, generator=gen)
    mask = torch.tensor([True, False, True, True, False, True])
    poisoned = torch.where(~mask[:, None], torch.full_like(student, math.nan), student)  # masked rows are garbage
    value = divergence(poisoned, teacher, kind, beta=0.4, mask=mask)
    want = divergence_per_token(student, teacher, kind, beta=0.4)[mask].mean()
    assert value.item() == pytest.approx(want.item(), rel=1e-6)
    (grad,) = torch.autograd.grad(value, student)
    assert torch.isfinite(grad).all()
    assert (grad[~mask] == 0).all() and (grad[mask] != 0).any()
    total = divergence(poisoned, teacher, kind, beta=0.4, mask=mask, reduction="sum")
    assert total.item() == pytest.approx(want.item() * int(mask.sum()), rel=1e-6)
    nothing = divergence(student, teacher, kind, mask=torch.zeros(6, dtype=torch.bool))
    assert nothing.item() == 0.0


def test_leading_dims_and_argument_errors():
    student = torch.randn(2, 3, 7)
    teacher = torch.randn(2, 3, 7)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert divergence_per_token(student, teacher, "tvd").shape == (2, 3)
    flat = divergence(student.reshape(6, 7), teacher.reshape(6, 7), "tvd", mask=mask.reshape(6))
    assert divergence(student, teacher, "tvd", mask=mask).item() == pytest.approx(flat.item())
    with pytest.raises(ValueError, match="unknown divergence"):
        divergence(student, teacher, "kl")
    with pytest.raises(ValueError, match="beta"):
        divergence(student, teacher, "jsd", beta=1.5)
    with pytest.raises(ValueError, match="temperature"):
        divergence(student, teacher, "jsd", temperature=0.0)
    with pytest.raises(ValueError, match="same shape"):
        divergence(student, teacher[..., :6], "jsd")
    with pytest.raises(ValueError, match="mask"):
        divergence(student, teacher, "jsd", mask=mask[:, :2])


def test_expected_tau():
    assert expected_tau(0.0, 4) == 1.0
    assert expected_tau(1.0, 4) == 5.0
    assert expected_tau(0.5, 0) == 1.0
    for alpha in (0.1, 0.5, 0.9, 0.999999):
        assert expected_tau(alpha, 5) == pytest.approx((1 - alpha**6) / (1 - alpha), rel=1e-9)
    alphas = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    np.testing.assert_allclose(expected_tau(alphas, 3).numpy(), [1.0, 1.875, 4.0])
    assert acceptance_from_tvd(0.25) == 0.75
    with pytest.raises(ValueError):
        expected_tau(1.5, 3)
    with pytest.raises(ValueError):
        expected_tau(0.5, -1)


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_jsd_matches_trl_gkd_trainer(beta):
    """Same convention as TRL's GKDTrainer.generalized_jsd_loss (slow: importing trl takes ~10 s)."""
    gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    gen = torch.Generator().manual_seed(3)
    student = torch.randn(2, 5, 17, generator=gen)
    teacher = torch.randn(2, 5, 17, generator=gen)
    trl_loss = gkd.GKDTrainer.generalized_jsd_loss(student, teacher, beta=beta, temperature=1.7)  # sum / batch
    ours = divergence(student, teacher, "jsd", beta=beta, temperature=1.7, reduction="sum") / 2
    assert ours.item() == pytest.approx(trl_loss.item(), rel=1e-5)


def test_lk_losses_against_their_definitions():
    """LK losses (Samarin et al. 2026): nla's gradient is TVD's divided by alpha, nla is the cross-entropy of the
    target's token when the target is a point mass, and lk_hybrid's gradient blends KL's and TVD's with the weight
    exp(-3 alpha) held constant."""
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(4, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    grad = lambda kind: torch.autograd.grad(divergence_per_token(student, teacher, kind).sum(), student)[0]  # noqa: E731
    alpha = 1 - divergence_per_token(student, teacher, "tvd").detach()  # [4]
    assert torch.allclose(grad("nla"), grad("tvd") / alpha[:, None])
    weight = torch.exp(-3.0 * alpha)[:, None]
    assert torch.allclose(grad("lk_hybrid"), weight * grad("forward_kl") + (1 - weight) * grad("tvd"))
    point = torch.full((4, 7), -math.inf, dtype=torch.float64)
    point[torch.arange(4), torch.tensor([0, 3, 6, 2])] = 0.0  # one-hot targets
    ce = torch.nn.functional.cross_entropy(student, torch.tensor([0, 3, 6, 2]), reduction="none")
    assert torch.allclose(divergence_per_token(student, point, "nla"), ce)
