"""Backend choice for the fused linear + divergence loss: Triton on CUDA, the PyTorch reference elsewhere."""

from __future__ import annotations

import importlib.util
import os

import torch

from draftsmith.kernels.reference import chunked_linear_divergence, reference_divergence_rows

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
    chosen = resolve_backend(backend, hidden.device)
    if chosen == "triton":
        from draftsmith.kernels.triton_divergence import triton_divergence_rows

        rows_fn = triton_divergence_rows
    else:
        rows_fn = reference_divergence_rows
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
        rows_fn=rows_fn,
    )
