"""Decode-time tree attention: the attention of ``T`` tree tokens (the pending token and the draft tree) over the
``P`` cached prefix keys plus the tree's own keys under the tree mask, with grouped-query attention.

    out[b, h, t] = sum_s softmax_s(q[b, h, t] . k[b, h // g, s] * scale  +  mask(t, s)) v[b, h // g, s]

with ``g = Hq / Hkv`` and ``mask(t, s) = 0`` where key ``s`` is visible to query ``t`` — every prefix key
``s < P``, and tree key ``s = P + j`` when ``tree[t, j]`` (``j`` is ``t`` or one of its ancestors) — ``-inf``
elsewhere. :func:`tree_attention_reference` is the PyTorch reference and the CPU path (the adapter's 4-D mask gives
the same result through the model's own attention); ``triton_tree_attention`` (:mod:`.triton_tree_attention`,
imported lazily) is the CUDA path, one program per (batch, query head, block of tree tokens), streaming the
keys in blocks with an online softmax.

The decode path reaches the kernel through transformers' own attention registry, nothing patched:
:func:`register_tree_attention` (called explicitly, idempotent) registers an attention function under
:data:`TREE_ATTENTION` (``AttentionInterface.register``, plus the ``sdpa`` mask builder under the same name so
the model's own forward builds the masks it always did) and returns that name. A model loaded with it
(``load_model(path, attn_implementation=register_tree_attention())``, or
``model.set_attn_implementation(register_tree_attention())``) runs ``sdpa`` exactly as before, except in the
calls where the adapter hands over the tree as the :data:`TREE_KWARG` attention keyword (a tree step, every
prefix key visible, no sliding window) and the tensors are on CUDA: there the Triton kernel runs on the
``[B, Hkv, P + T, D]`` cache views directly, without a 4-D mask or repeated key/value heads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from draftsmith.kernels.dispatch import BACKENDS, resolve_backend
from draftsmith.kernels.tree_attention_reference import check_shapes, tree_attention_reference, tree_visibility


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree: torch.Tensor, scale: float | None = None,
                   backend: str = "auto") -> torch.Tensor:
    """Tree attention through ``backend``: ``auto`` (Triton on CUDA, the reference elsewhere), ``reference`` or
    ``triton`` (CUDA, or the CPU interpreter under ``TRITON_INTERPRET=1``)."""
    if resolve_backend(backend, q.device) == "triton":
        from draftsmith.kernels.triton_tree_attention import triton_tree_attention

        return triton_tree_attention(q, k, v, tree, scale)
    return tree_attention_reference(q, k, v, tree, scale)


# -- transformers attention registry --------------------------------------------------------------------------------

TREE_ATTENTION = "draftsmith_tree"  # the attn_implementation name register_tree_attention() registers
TREE_KWARG = "tree_visibility"  # the attention keyword that carries the [T, T] bool tree
_MARKER = "draftsmith_tree_backend"  # attribute of our attention functions: the backend they use
# keywords some attention modules pass that the kernel does not implement: any of them set -> sdpa
_UNSUPPORTED_KWARGS = ("softcap", "sliding_window", "s_aux", "position_bias", "sinks")
_FORWARDS: dict[str, Callable] = {}


def _kernel_applies(query, key, value, tree, dropout, backend, kwargs) -> bool:
    """Whether this call can run the tree kernel and equal sdpa under the adapter's 4-D mask."""
    if tree is None or dropout or kwargs.get("output_attentions") or query.dim() != 4 or key.dim() != 4:
        return False
    if any(kwargs.get(name) is not None for name in _UNSUPPORTED_KWARGS):
        return False
    t, d = query.shape[2], query.shape[-1]
    if key.shape[2] < t or tuple(tree.shape) != (t, t) or key.shape[-1] != d \
            or value.shape[-1] != d or query.shape[1] % key.shape[1]:
        return False
    if backend == "auto":  # the CUDA path only, and only where the Triton kernel takes the head dim
        return query.device.type == "cuda" and resolve_backend("auto", query.device) == "triton" \
            and d >= 16 and not d & (d - 1)
    return True


def make_tree_attention_forward(backend: str = "auto") -> Callable:
    """A transformers attention function (``fn(module, query, key, value, attention_mask, dropout, scaling,
    **kwargs) -> ([B, T, Hq, D], None)``) that runs :func:`tree_attention` on ``backend`` when the call carries
    :data:`TREE_KWARG` and the kernel applies (``auto``: CUDA tensors; ``reference`` / ``triton`` on any device,
    for tests), and delegates to transformers' ``sdpa`` attention function otherwise."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend in _FORWARDS:
        return _FORWARDS[backend]

    def forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                **kwargs):
        tree = kwargs.pop(TREE_KWARG, None)
        if _kernel_applies(query, key, value, tree, dropout, backend, kwargs):
            out = tree_attention(query, key, value, tree, scaling, backend=backend)  # [B, Hq, T, D]
            return out.transpose(1, 2), None
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, dropout=dropout,
                                               scaling=scaling, **kwargs)

    forward.__name__ = forward.__qualname__ = f"tree_attention_forward_{backend}"
    setattr(forward, _MARKER, backend)
    _FORWARDS[backend] = forward
    return forward


def register_tree_attention(name: str = TREE_ATTENTION, backend: str = "auto") -> str:
    """Register the tree attention function of ``backend`` in transformers' ``AttentionInterface`` under
    ``name``, with the ``sdpa`` mask builder in ``AttentionMaskInterface``; returns ``name`` (for
    ``attn_implementation=``). Idempotent; refuses a name that holds another attention function (a built-in
    implementation, or this one with another backend)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    fn = make_tree_attention_forward(backend)
    held = ALL_ATTENTION_FUNCTIONS.get(name)
    if held is fn:
        return name
    if held is not None or name == "eager":
        raise ValueError(f"attention implementation {name!r} is already registered"
                         f"{f' with backend {getattr(held, _MARKER)!r}' if hasattr(held, _MARKER) else ''}: "
                         "register the tree attention under another name")
    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name


def tree_attention_backend(attn_implementation: str | None) -> str | None:
    """The backend of the tree attention function registered as ``attn_implementation``; None when that
    implementation is not one (the adapter then passes no tree to attention)."""
    if not isinstance(attn_implementation, str):  # None, or a per-sub-config dict
        return None
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return getattr(ALL_ATTENTION_FUNCTIONS.get(attn_implementation), _MARKER, None)


__all__ = ["TREE_ATTENTION", "TREE_KWARG", "check_shapes", "make_tree_attention_forward", "register_tree_attention",
           "tree_attention", "tree_attention_backend", "tree_attention_reference", "tree_visibility"]
