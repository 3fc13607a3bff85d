"""Triton-versus-reference comparisons, run in a fresh process under ``TRITON_INTERPRET=1``.

Not a test module: ``test_triton_divergence.py`` runs ``python triton_interpreter_checks.py``, which
sets the environment variable *before* anything imports triton (``@triton.jit`` — including triton's own
``tl.max``/``tl.sum`` helpers — picks compiled or interpreted at decoration time, and in a full test
session transformers imports triton early). It takes the cases as one JSON argument and prints one JSON
object of measured errors; the cases, assertions and tolerances live in the test module.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before torch, transformers or anything else can import triton

import json  # noqa: E402
import math  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from draftsmith.kernels import fused_linear_divergence, fused_linear_soft_cross_entropy, triton_divergence  # noqa: E402
from draftsmith.kernels.reference import reference_divergence_rows  # noqa: E402
from draftsmith.kernels.triton_divergence import triton_divergence_rows  # noqa: E402


def _errors(got, want) -> dict:
    got, want = got.float(), want.float()
    return {
        "max_abs_err": (got - want).abs().max().item(),
        "max_abs_ref": want.abs().max().item(),
        "finite": bool(torch.isfinite(got).all()),
    }


def rows_case(kind: str, beta: float, dtype) -> dict:
    """One chunk of 4 rows, V = 1000 in blocks of 256 (the last one partial), -inf entries included."""
    gen = torch.Generator().manual_seed(0)
    student = (torch.randn(4, 1000, generator=gen) * 3).to(dtype)
    teacher = (torch.randn(4, 1000, generator=gen) * 3).to(dtype)
    student[:, -9:] = -math.inf  # outside both supports
    teacher[:, -9:] = -math.inf
    if kind not in ("reverse_kl",) and not (kind == "jsd" and beta == 1.0):
        teacher[0, :50] = -math.inf  # teacher-only zeros: finite unless the reverse KL is asked for
    want_loss, want_grad = reference_divergence_rows(student.clone(), teacher, kind, beta, 1.7, 0.25, True)
    buffer = student.clone()
    loss, grad = triton_divergence_rows(buffer, teacher, kind, beta, 1.7, 0.25, True, block_v=256)
    loss_only, no_grad = triton_divergence_rows(student.clone(), teacher, kind, beta, 1.7, 0.25, False)
    return {
        "loss": _errors(loss, want_loss),
        "grad": _errors(grad, want_grad.to(dtype)),  # the driver casts the reference gradient the same way
        "loss_only": _errors(loss_only, want_loss),
        "in_place": grad.data_ptr() == buffer.data_ptr() and grad.dtype == dtype,
        "no_grad_is_none": no_grad is None,
        "padding_grad_zero": bool((grad[:, -9:] == 0).all()),
        "loss_value": want_loss.mean().item(),
    }


def fused_case(kind: str, beta: float, dtype) -> dict:
    """The whole chunked loss, N = 37 tokens (some masked), H = 24, V = 1000, chunks of 16 rows."""
    n, vocab, hidden, teacher_hidden = 37, 1000, 24, 20
    gen = torch.Generator().manual_seed(1)
    rnd = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(dtype)  # noqa: E731
    h = rnd(n, hidden).requires_grad_()
    w = rnd(vocab, hidden, scale=0.4).requires_grad_()
    b = rnd(vocab, scale=0.5).requires_grad_()
    th, tw = rnd(n, teacher_hidden), rnd(vocab, teacher_hidden, scale=0.45)
    mask = torch.rand(n, generator=gen) > 0.25
    args = dict(bias=b, teacher_hidden=th, teacher_weight=tw, kind=kind, beta=beta, temperature=1.3, mask=mask)
    want = fused_linear_divergence(h, w, chunk_size=16, backend="reference", **args)
    got = fused_linear_divergence(h, w, chunk_size=16, backend="triton", **args)
    grads = torch.autograd.grad(got, (h, w, b))
    ref_grads = torch.autograd.grad(want, (h, w, b))
    return {
        "loss": _errors(got, want),
        "loss_value": want.item(),
        "grads": [_errors(g, r) for g, r in zip(grads, ref_grads)],
        "grad_dtypes_ok": all(g.dtype == dtype for g in grads),
    }


def soft_case(dtype) -> dict:
    """The soft cross-entropy through the Triton backend (the kernel's forward KL plus the teacher's entropy) against
    the reference's autograd rows: N = 37 tokens (some masked), H = 24, V = 1000, chunks of 16, temperature 1.3."""
    n, vocab, hidden, teacher_hidden = 37, 1000, 24, 20
    gen = torch.Generator().manual_seed(2)
    rnd = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(dtype)  # noqa: E731
    h = rnd(n, hidden).requires_grad_()
    w = rnd(vocab, hidden, scale=0.4).requires_grad_()
    th, tw = rnd(n, teacher_hidden), rnd(vocab, teacher_hidden, scale=0.45)
    mask = torch.rand(n, generator=gen) > 0.25
    args = dict(teacher_hidden=th, teacher_weight=tw, temperature=1.3, mask=mask, chunk_size=16)
    want = fused_linear_soft_cross_entropy(h, w, backend="reference", **args)
    got = fused_linear_soft_cross_entropy(h, w, backend="triton", **args)
    grads = torch.autograd.grad(got, (h, w))
    ref_grads = torch.autograd.grad(want, (h, w))
    return {
        "loss": _errors(got, want),
        "loss_value": want.item(),
        "grads": [_errors(g, r) for g, r in zip(grads, ref_grads)],
    }


def main(cases: dict) -> int:
    """``cases``: {"rows": [[kind, beta], ...], "fused": [[kind, beta], ...], "dtypes": [name, ...]}, the test's."""
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy evaluates both branches of tl.where
    torch.set_num_threads(1)
    results = {"interpreted": isinstance(triton_divergence._divergence_rows_kernel, InterpretedFunction)}
    for name in cases["dtypes"]:
        dtype = getattr(torch, name)
        for kind, beta in cases["rows"]:
            results[f"rows-{kind}-{beta}-{name}"] = rows_case(kind, beta, dtype)
        for kind, beta in cases["fused"]:
            results[f"fused-{kind}-{beta}-{name}"] = fused_case(kind, beta, dtype)
        results[f"soft-{name}"] = soft_case(dtype)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
