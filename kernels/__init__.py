"""Fused kernels, each with a pure-PyTorch reference that is also the CPU path.

Triton kernels live in ``triton_<op>.py`` modules that are imported lazily by the dispatcher, never here.
"""

from draftsmith.kernels.cross_entropy import chunked_linear_cross_entropy, chunked_linear_soft_cross_entropy
from draftsmith.kernels.dispatch import (
    fused_linear_cross_entropy,
    fused_linear_divergence,
    fused_linear_loss,
    fused_linear_soft_cross_entropy,
    resolve_backend,
)
from draftsmith.kernels.head_calls import checkpointed_head_loss, chunked_head_rows
from draftsmith.kernels.reference import chunked_linear_divergence, chunked_linear_loss, naive_linear_divergence

__all__ = ["checkpointed_head_loss", "chunked_head_rows", "chunked_linear_cross_entropy", "chunked_linear_divergence",
           "chunked_linear_loss", "chunked_linear_soft_cross_entropy", "fused_linear_cross_entropy",
           "fused_linear_divergence", "fused_linear_loss", "fused_linear_soft_cross_entropy", "naive_linear_divergence",
           "resolve_backend"]
