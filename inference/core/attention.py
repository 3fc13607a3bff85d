"""Which scaled-dot-product attention kernels a decode loop runs, and which attention calls need no 4-D mask.

A causal block of ``T`` new tokens after ``past`` cached keys (prefill, chain verification) is causal attention
aligned to the last key (bottom-right): query ``t`` sees keys ``0 .. past + t``. The attention functions below
take that without an explicit ``[1, 1, T, past + T]`` mask, so SDPA keeps its flash and efficient kernels (and,
with no mask at all, transformers' native grouped-query path):

- ``sdpa``: with no cache, ``attention_mask=None`` (transformers then passes ``is_causal=True``, whose top-left
  alignment is bottom-right when queries and keys are as many); after a cache, PyTorch's lower-right
  :class:`~torch.nn.attention.bias.CausalBias`, which transformers' SDPA function hands to SDPA unchanged and
  SDPA dispatches to its flash or memory-efficient kernel (materialising the mask only where neither applies).
  ``attention_mask=None`` after a cache would be wrong there: transformers then drops the cached keys.
- flash attention (any implementation named ``*flash*``, as transformers tells them apart): ``None`` always; the
  kernel is causal bottom-right and applies the module's own sliding window.

Everything else (``eager``, ``flex_attention``, ...) gets the explicit additive mask, as do sliding-window layers
under ``sdpa``, token trees and KV prefixes.
"""

from __future__ import annotations

from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right

# cuDNN's fused attention is left out: PyTorch prefers it for 16-bit inputs on Hopper GPUs, and it builds an execution
# plan for every new query/key length, which a decode loop (keys growing every step) meets at every step. Flash,
# memory-efficient and math attention build nothing (docs/GPU.md).
DECODE_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)

SDPA = "sdpa"  # transformers' SDPA attention function (also behind a registered draftsmith tree attention)
FLASH = "flash"  # a flash-attention kernel: causal bottom-right by itself, never takes a 4-D mask


def decode_attention():
    """Context in which SDPA picks among :data:`DECODE_BACKENDS` only."""
    return sdpa_kernel(list(DECODE_BACKENDS))


def causal_attention_kind(implementation: str | None) -> str | None:
    """How the attention implementation ``implementation`` (a model's ``config._attn_implementation``) runs a
    causal block without an explicit mask: :data:`SDPA`, :data:`FLASH`, or None (explicit masks only)."""
    if not isinstance(implementation, str):  # None, or a per-sub-config dict
        return None
    if "flash" in implementation:
        return FLASH
    return SDPA if implementation == "sdpa" else None


def causal_mask(kind: str, past: int, t: int) -> CausalBias | None:
    """The ``attention_mask`` under which ``t`` queries see the ``past`` cached keys and, causally, the ``t``
    new keys (``[t, past + t]``, aligned to the last key), for an attention of ``kind`` (:data:`SDPA` or
    :data:`FLASH`): None where the attention function is causal that way by itself, else the lower-right
    :class:`~torch.nn.attention.bias.CausalBias` that SDPA runs in its fused kernels."""
    if kind == FLASH or past == 0 or t == 1:
        return None
    return causal_lower_right(t, past + t)
