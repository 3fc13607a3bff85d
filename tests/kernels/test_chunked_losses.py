"""The chunked cross-entropy, soft cross-entropy, generic per-row loss, checkpointed head loss and per-row map against
the same losses over the full ``[N, V]`` logits (float32 values and gradients)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from draftsmith.kernels import (
    checkpointed_head_loss,
    chunked_head_rows,
    chunked_linear_cross_entropy,
    chunked_linear_loss,
    chunked_linear_soft_cross_entropy,
    fused_linear_cross_entropy,
    fused_linear_loss,
    fused_linear_soft_cross_entropy,
)
from draftsmith.kernels.cross_entropy import cross_entropy_rows, soft_cross_entropy_rows, teacher_entropy_rows
from draftsmith.kernels.divergences import divergence_per_token
from draftsmith.kernels.reference import reference_divergence_rows

N, V, H, HT = 37, 600, 24, 20
TOL = dict(rtol=1e-5, atol=1e-6)


def make(seed=0, n=N, v=V, h=H, ht=HT, bias=True):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, scale=1.0: torch.randn(*shape, generator=gen) * scale  # noqa: E731
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::5] = -100  # prompt / padding positions
    return dict(
        hidden=rnd(n, h).requires_grad_(),
        weight=rnd(v, h, scale=h**-0.5 * 2).requires_grad_(),
        bias=rnd(v, scale=0.5).requires_grad_() if bias else None,
        labels=labels,
        teacher_hidden=rnd(n, ht),
        teacher_weight=rnd(v, ht, scale=ht**-0.5 * 2),
        teacher_bias=rnd(v, scale=0.5),
    )


def full_logits(x):  # [N, V] the unchunked student logits
    z = x["hidden"] @ x["weight"].t()
    return z if x["bias"] is None else z + x["bias"]


def teacher_logits(x):  # [N, V]
    return x["teacher_hidden"] @ x["teacher_weight"].t() + x["teacher_bias"]


def params(x):
    return [t for t in (x["hidden"], x["weight"], x["bias"]) if t is not None]


def assert_same(got, want, tensors):
    torch.testing.assert_close(got, want, **TOL)
    for g, w in zip(torch.autograd.grad(got, tensors), torch.autograd.grad(want, tensors)):
        scale = max(w.abs().max().item(), 1e-3)
        torch.testing.assert_close(g, w, rtol=TOL["rtol"], atol=TOL["atol"] * scale)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk_size", [1, 8, None])
def test_cross_entropy_matches_torch_over_the_full_logits(reduction, label_smoothing, chunk_size):
    x = make()
    want = F.cross_entropy(full_logits(x), x["labels"], ignore_index=-100, label_smoothing=label_smoothing,
                           reduction=reduction)
    got = chunked_linear_cross_entropy(x["hidden"], x["weight"], x["labels"], bias=x["bias"],
                                       label_smoothing=label_smoothing, reduction=reduction, chunk_size=chunk_size)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert_same(got, want, params(x))


def test_cross_entropy_with_leading_dims_a_mask_and_another_ignore_index():
    x = make(seed=1, n=2 * 9, bias=False)
    hidden = x["hidden"].detach().reshape(2, 9, H).requires_grad_()
    labels = x["labels"].reshape(2, 9).clamp(min=0)
    labels[0, 3] = 7
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    keep = mask & (labels != 7)
    want = F.cross_entropy((hidden @ x["weight"].t())[keep], labels[keep], reduction="sum")
    got = chunked_linear_cross_entropy(hidden, x["weight"], labels, ignore_index=7, mask=mask, reduction="sum",
                                       chunk_size=4)
    assert_same(got, want, [hidden, x["weight"]])


def test_cross_entropy_rows_is_torchs_per_row_loss():
    z, y = torch.randn(5, 11), torch.randint(0, 11, (5,))
    torch.testing.assert_close(cross_entropy_rows(z, y, 0.2), F.cross_entropy(z, y, reduction="none",
                                                                               label_smoothing=0.2))
    assert cross_entropy_rows(z.bfloat16(), y).dtype == torch.float32


@pytest.mark.parametrize("temperature", [1.0, 1.7])
@pytest.mark.parametrize("via_divergence_rows", [False, True])
def test_soft_cross_entropy_matches_the_naive_loss(temperature, via_divergence_rows):
    """``- sum p log q`` over the full logits; through the divergence rows (the Triton kernel's contract) it is the
    forward KL plus the teacher's entropy: the same value and gradients."""
    x = make(seed=2)
    mask = torch.rand(N, generator=torch.Generator().manual_seed(3)) > 0.3
    p = torch.softmax(teacher_logits(x) / temperature, -1)
    want = -(p * torch.log_softmax(full_logits(x) / temperature, -1)).sum(-1)[mask].sum()
    teacher = dict(teacher_hidden=x["teacher_hidden"], teacher_weight=x["teacher_weight"],
                   teacher_bias=x["teacher_bias"])
    got = chunked_linear_soft_cross_entropy(x["hidden"], x["weight"], bias=x["bias"], **teacher,
                                            temperature=temperature, mask=mask, reduction="sum", chunk_size=6,
                                            rows_fn=reference_divergence_rows if via_divergence_rows else None)
    assert_same(got, want, params(x))


def test_soft_cross_entropy_with_teacher_logits_and_the_rows_functions():
    x = make(seed=4, bias=False)
    t = teacher_logits(x)
    want = -(t.softmax(-1) * full_logits(x).log_softmax(-1)).sum(-1).mean()
    got = fused_linear_soft_cross_entropy(x["hidden"], x["weight"], t, chunk_size=10)
    assert_same(got, want, params(x))
    z = torch.randn(4, 9)
    kl = divergence_per_token(z, t[:4, :9], "forward_kl")
    torch.testing.assert_close(soft_cross_entropy_rows(z, t[:4, :9]), kl + teacher_entropy_rows(t[:4, :9]))
    t_masked = t[:4, :9].clone()
    t_masked[:, -2:] = float("-inf")  # zero-probability entries add nothing to the entropy
    assert torch.isfinite(teacher_entropy_rows(t_masked)).all()


def test_a_combined_row_loss_runs_in_one_pass():
    """Medusa-2's ``w_lm CE + w_kl KL(teacher || student)`` as one per-row loss: labels and teacher together."""
    x = make(seed=5)
    keep = x["labels"] != -100

    def row_loss(z, y, t):
        return 0.5 * cross_entropy_rows(z, y) + 2.0 * divergence_per_token(z, t, "forward_kl")

    z, t = full_logits(x), teacher_logits(x)
    want = row_loss(z[keep], x["labels"][keep], t[keep]).sum()
    teacher = dict(teacher_hidden=x["teacher_hidden"], teacher_weight=x["teacher_weight"],
                   teacher_bias=x["teacher_bias"])
    got = chunked_linear_loss(x["hidden"], x["weight"], row_loss, bias=x["bias"], labels=x["labels"], **teacher,
                              mask=keep, reduction="sum", chunk_size=7)
    assert_same(got, want, params(x))
    fused = fused_linear_loss(x["hidden"], x["weight"], row_loss, bias=x["bias"], labels=x["labels"], **teacher,
                              mask=keep, reduction="sum", chunk_size=7)
    torch.testing.assert_close(fused, got.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_checkpointed_head_loss_matches_the_full_loss_and_trains_the_heads_parameters(reduction):
    """The path for heads that can only be called: the same value, and gradients for the hidden states and the head's
    own weight and bias (not for the frozen teacher head)."""
    torch.manual_seed(6)
    head = torch.nn.Linear(H, V)
    teacher_head = torch.nn.Linear(HT, V).requires_grad_(False)
    x = make(seed=6)
    keep = x["labels"] != -100

    def row_loss(z, y, t):
        return cross_entropy_rows(z, y, 0.1) + divergence_per_token(z, t, "jsd", 0.3)

    want = row_loss(head(x["hidden"])[keep], x["labels"][keep], teacher_head(x["teacher_hidden"])[keep])
    want = want.sum() if reduction == "sum" else want.mean()
    got = checkpointed_head_loss(x["hidden"], head, row_loss, vocab=V, labels=x["labels"],
                                 teacher_hidden=x["teacher_hidden"], teacher_head=teacher_head, mask=keep,
                                 reduction=reduction, chunk_size=5)
    assert_same(got, want, [x["hidden"], head.weight, head.bias])
    nothing = checkpointed_head_loss(x["hidden"], head, row_loss, vocab=V, labels=x["labels"],
                                     teacher_hidden=x["teacher_hidden"], teacher_head=teacher_head,
                                     mask=torch.zeros(N, dtype=torch.bool))
    assert nothing.item() == 0.0 and nothing.requires_grad


def test_the_reentrant_checkpoint_for_zero3_heads_gives_the_same_loss_and_gradients():
    """reentrant=True (what a head whose ZeRO-3 shards are released after its forward needs): the value and the
    gradients of the non-reentrant path, through .backward() (the reentrant checkpoint does not take .grad())."""
    teacher_head = torch.nn.Linear(HT, V).requires_grad_(False)
    x = make(seed=8)
    keep = x["labels"] != -100
    grads = []
    for reentrant in (False, True):
        torch.manual_seed(8)
        head = torch.nn.Linear(H, V)
        hidden = x["hidden"].detach().clone().requires_grad_(True)
        loss = checkpointed_head_loss(hidden, head, lambda z, y, t: cross_entropy_rows(z, y, 0.1) +
                                      divergence_per_token(z, t, "jsd", 0.3), vocab=V, labels=x["labels"],
                                      teacher_hidden=x["teacher_hidden"], teacher_head=teacher_head, mask=keep,
                                      chunk_size=5, reentrant=reentrant)
        loss.backward()
        grads.append((loss.detach(), hidden.grad, head.weight.grad, head.bias.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_chunked_rows_map_equals_the_full_statistic():
    torch.manual_seed(7)
    head, teacher_head = torch.nn.Linear(H, V), torch.nn.Linear(HT, V)
    x = make(seed=7)

    def agree_and_ce(z, y, t):  # [C, 2]
        return torch.stack([(z.argmax(-1) == t.argmax(-1)).float(), F.cross_entropy(z, y.clamp(min=0),
                                                                                   reduction="none")], -1)

    got = chunked_head_rows(x["hidden"], head, agree_and_ce, vocab=V, labels=x["labels"],
                            teacher_hidden=x["teacher_hidden"], teacher_head=teacher_head, chunk_size=4)
    with torch.no_grad():
        want = agree_and_ce(head(x["hidden"]), x["labels"], teacher_head(x["teacher_hidden"]))
    assert got.shape == (N, 2) and not got.requires_grad
    torch.testing.assert_close(got, want, **TOL)
    empty = chunked_head_rows(x["hidden"][:0], head, lambda z, _, __: z.argmax(-1), vocab=V)
    assert empty.shape == (0,)


def test_dispatch_runs_the_reference_on_cpu_and_checks_the_backend():
    x = make(seed=8, n=9, v=40, h=8, ht=8)
    ce = fused_linear_cross_entropy(x["hidden"], x["weight"], x["labels"], bias=x["bias"], label_smoothing=0.1)
    ref = chunked_linear_cross_entropy(x["hidden"], x["weight"], x["labels"], bias=x["bias"], label_smoothing=0.1)
    assert ce.item() == ref.item()
    with pytest.raises(ValueError, match="backend"):
        fused_linear_cross_entropy(x["hidden"], x["weight"], x["labels"], backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        fused_linear_soft_cross_entropy(x["hidden"], x["weight"], teacher_hidden=x["teacher_hidden"],
                                        teacher_weight=x["teacher_weight"], backend="cuda")
    assert "draftsmith.kernels.triton_divergence" not in sys.modules  # never imported on the CPU path


def test_argument_errors_name_the_problem():
    x = make(seed=9, n=5, v=30, h=8, ht=6)
    h, w = x["hidden"], x["weight"]
    with pytest.raises(ValueError, match="labels"):
        chunked_linear_cross_entropy(h, w, x["labels"][:4])
    with pytest.raises(ValueError, match="label_smoothing"):
        chunked_linear_cross_entropy(h, w, x["labels"], label_smoothing=1.0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_linear_soft_cross_entropy(h, w, teacher_logits(x), temperature=0.0)
    with pytest.raises(ValueError, match="exactly one"):
        chunked_linear_soft_cross_entropy(h, w)
    with pytest.raises(ValueError, match="go together"):
        checkpointed_head_loss(h, torch.nn.Linear(8, 30), lambda z, y, t: z.sum(-1), vocab=30,
                               teacher_hidden=x["teacher_hidden"])


def test_a_sharded_head_is_called_as_often_on_every_process_and_one_process_keeps_its_count():
    """lockstep_calls: alone (no process group) the chunk count is what it is; the 2-process runs of
    tests/launch/test_scale_out.py (slow) are where unequal counts would hang."""
    from draftsmith.kernels.head_calls import lockstep_calls

    assert lockstep_calls(3, "cpu") == 3 and lockstep_calls(0, "cpu") == 0
