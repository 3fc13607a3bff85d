"""Which scaled-dot-product attention kernels a decode loop runs."""

from __future__ import annotations

from torch.nn.attention import SDPBackend, sdpa_kernel

# cuDNN's fused attention is left out: PyTorch prefers it for 16-bit inputs on Hopper GPUs, and it builds an execution
# plan for every new query/key length, which a decode loop (keys growing every step) meets at every step. Flash,
# memory-efficient and math attention build nothing (docs/GPU.md).
DECODE_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def decode_attention():
    """Context in which SDPA picks among :data:`DECODE_BACKENDS` only."""
    return sdpa_kernel(list(DECODE_BACKENDS))
