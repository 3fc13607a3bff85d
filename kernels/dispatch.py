"""Backend choice for the fused linear + loss functions: Triton on CUDA, the PyTorch reference elsewhere.

The Triton kernel computes the four divergences (and, through the forward KL, the soft cross-entropy); the hard
cross-entropy with labels and any other per-row loss run the reference's per-chunk math on every device, inside
the same chunked driver (so no ``[N, V]`` table exists on any backend; only the softmax of a chunk is not fused).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from draftsmith.kernels.cross_entropy import chunked_linear_cross_entropy, chunked_linear_soft_cross_entropy
from draftsmith.kernels.reference import (
    RowLoss,
    RowsFn,
    chunked_linear_divergence,
    chunked_linear_loss,
    reference_divergence_rows,
)

BACKENDS = ("auto", "reference", "triton")


def triton_interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET=1`` asks Triton to run kernels on CPU tensors (read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def resolve_backend(backend: str, device: torch.device) -> str:
    """``"auto"`` -> ``"triton"`` for CUDA tensors when Triton is installed, else ``"reference"``.

    An explicit ``"triton"`` needs CUDA tensors, or CPU tensors with ``TRITON_INTERPRET=1`` set before
    Triton was first imported (the interpreter, used by the tests).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    has_triton = importlib.util.find_spec("triton") is not None
    if backend == "auto":
        return "triton" if device.type == "cuda" and has_triton else "reference"
    if backend == "triton":
        if not has_triton:
            raise RuntimeError(
                "backend='triton' needs the triton package: pip install triton, or use backend='reference'"
            )
        if device.type != "cuda" and not triton_interpreter_enabled():
            raise RuntimeError(
                f"backend='triton' needs CUDA tensors (got {device.type}); set TRITON_INTERPRET=1 before importing "
                "triton to run the kernel in Triton's CPU interpreter, or use backend='reference'"
            )
    return backend


TRITON_KINDS = ("forward_kl", "reverse_kl", "jsd", "tvd")  # what the Triton kernel computes (its KIND_IDS)


def divergence_rows_fn(backend: str, device: torch.device, kind: str = "forward_kl") -> RowsFn:
    """The per-chunk divergence rows of ``backend`` on ``device``: the Triton kernel's, or the reference's (also for
    a ``kind`` the kernel does not compute: the LK losses)."""
    if resolve_backend(backend, device) == "triton" and kind in TRITON_KINDS:
        from draftsmith.kernels.triton_divergence import triton_divergence_rows

        return triton_divergence_rows
    return reference_divergence_rows


def fused_linear_divergence(
    hidden: torch.Tensor,  # [..., H] student last hidden states
    weight: torch.Tensor,  # [V, H] student LM head
    teacher_logits: torch.Tensor | None = None,  # [..., V]
    *,
    bias: torch.Tensor | None = None,  # [V]
    teacher_hidden: torch.Tensor | None = None,  # [..., Ht]
    teacher_weight: torch.Tensor | None = None,  # [V, Ht]
    teacher_bias: torch.Tensor | None = None,  # [V]
    kind: str = "forward_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,  # [...] bool, True = token counts
    reduction: str = "mean",
    chunk_size: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:  # scalar float32
    """Distillation loss of ``softmax(h @ W.T + b)`` against the frozen teacher, chunked over tokens.

    ``kind`` is one of ``draftsmith.kernels.divergences.DIVERGENCES`` (``forward_kl``, ``reverse_kl``,
    ``jsd`` with ``beta``, ``tvd``). Pass the teacher as ``teacher_logits`` or as ``teacher_hidden`` +
    ``teacher_weight`` (+ ``teacher_bias``). ``backend``: ``"auto"`` (Triton on CUDA, the reference
    elsewhere), ``"reference"`` or ``"triton"``. Equals :func:`naive_linear_divergence` in value and
    gradients; see :mod:`draftsmith.kernels.reference` for the memory argument.
    """
    return chunked_linear_divergence(
        hidden,
        weight,
        teacher_logits,
        bias=bias,
        teacher_hidden=teacher_hidden,
        teacher_weight=teacher_weight,
        teacher_bias=teacher_bias,
        kind=kind,
        beta=beta,
        temperature=temperature,
        mask=mask,
        reduction=reduction,
        chunk_size=chunk_size,
        rows_fn=divergence_rows_fn(backend, hidden.device, kind),
    )


def fused_linear_soft_cross_entropy(
    hidden: torch.Tensor,  # [..., H] student
    weight: torch.Tensor,  # [V, H]
    teacher_logits: torch.Tensor | None = None,  # [..., V]
    *,
    bias: torch.Tensor | None = None,
    teacher_hidden: torch.Tensor | None = None,  # [..., Ht]
    teacher_weight: torch.Tensor | None = None,  # [V, Ht]
    teacher_bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
    chunk_size: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:  # scalar float32
    """Cross-entropy ``- sum_v p_v log q_v`` to the frozen teacher's distribution, chunked
    (:func:`~draftsmith.kernels.cross_entropy.chunked_linear_soft_cross_entropy`): on the Triton backend each chunk
    is the kernel's forward KL plus the teacher's entropy, elsewhere the reference's autograd rows."""
    rows_fn = None if resolve_backend(backend, hidden.device) == "reference" else divergence_rows_fn(backend,
                                                                                                      hidden.device)
    return chunked_linear_soft_cross_entropy(
        hidden, weight, teacher_logits, bias=bias, teacher_hidden=teacher_hidden, teacher_weight=teacher_weight,
        teacher_bias=teacher_bias, temperature=temperature, mask=mask, reduction=reduction, chunk_size=chunk_size,
        rows_fn=rows_fn,
    )


def fused_linear_cross_entropy(
    hidden: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [V, H]
    labels: torch.Tensor,  # [...] long
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
    chunk_size: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:  # scalar float32
    """``cross_entropy(h @ W.T + b, labels)`` chunked
    (:func:`~draftsmith.kernels.cross_entropy.chunked_linear_cross_entropy`). ``backend`` is checked, but every
    backend runs the reference's per-chunk math: the Triton kernel has no labels."""
    resolve_backend(backend, hidden.device)
    return chunked_linear_cross_entropy(hidden, weight, labels, bias=bias, ignore_index=ignore_index,
                                        label_smoothing=label_smoothing, mask=mask, reduction=reduction,
                                        chunk_size=chunk_size)


def fused_linear_loss(
    hidden: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [V, H]
    row_loss: RowLoss,
    *,
    bias: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    teacher_hidden: torch.Tensor | None = None,
    teacher_weight: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
    chunk_size: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:  # scalar float32
    """Any per-row loss of the logits, chunked (:func:`~draftsmith.kernels.reference.chunked_linear_loss`); every
    backend runs the reference's per-chunk autograd (``backend`` is checked)."""
    resolve_backend(backend, hidden.device)
    return chunked_linear_loss(hidden, weight, row_loss, bias=bias, labels=labels, teacher_hidden=teacher_hidden,
                               teacher_weight=teacher_weight, teacher_bias=teacher_bias, mask=mask,
                               reduction=reduction, chunk_size=chunk_size)
