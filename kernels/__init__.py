"""Fused kernels, each with a pure-PyTorch reference that is also the CPU path.

Triton kernels live in ``triton_<op>.py`` modules that are imported lazily by the dispatcher, never here.
"""

from draftsmith.kernels.dispatch import fused_linear_divergence, resolve_backend
from draftsmith.kernels.reference import chunked_linear_divergence, naive_linear_divergence

__all__ = ["chunked_linear_divergence", "fused_linear_divergence", "naive_linear_divergence", "resolve_backend"]
