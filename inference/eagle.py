"""The EAGLE-1 draft head (Li et al. 2024): feature-level drafting on top of the target.

The head reads the target's feature ``f_t`` (its final-normed last hidden state at position ``t``, the input of
its LM head) and the embedding of the next token ``x_{t+1}``, and predicts the next feature::

    f^_{t+1} = Layer(fc([E(x_{t+1}); f_t]))          (EAGLE eq. 1: fc is a (2H -> H) linear map)
    p^_{t+2} = softmax(LMHead(f^_{t+1}))

``Layer`` is one decoder layer of the target's own architecture, built from the target's config by the target's
own layer class (no copied modeling code), with its own rotary embedding and KV cache; its input norm is the
identity, as in EAGLE's own head and in vLLM's and SGLang's EAGLE models (so an exported head computes what
draftsmith trained); ``E`` and ``LMHead`` are
the target's, frozen and shared, passed in at call time (never parameters of the head, so never trained, saved
or given to an optimizer). Drafting feeds the head its own predicted features (``f^`` for ``f``) to go further
ahead; after verification the true features of the accepted tokens replace them in the head's cache.

Llama-style targets only (Llama, Qwen2, Mistral, ...): the head needs the target's decoder layer and rotary
embedding classes. The module lives in ``inference`` because the decode loop runs it; the trainer
(``draftsmith.trainers.eagle``) builds and trains it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from draftsmith.common.errors import UnsupportedModelError
from draftsmith.inference.adapter import ModelAdapter, additive_mask, visibility
from draftsmith.inference.kv_cache import KVCache


def head_config(target_config):
    """A copy of the target's config for a one-layer head (the layer index 0 of a one-layer stack)."""
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = ["full_attention"]
    return config


class EagleHead(nn.Module):
    """``fc`` over ``[E(x_{t+1}); f_t]`` then one decoder layer of the target's architecture (module docstring)."""

    def __init__(self, config, layer_cls: type[nn.Module], rotary_cls: type[nn.Module], fc_bias: bool = False) -> None:
        super().__init__()
        self.config = config
        hidden = int(config.hidden_size)
        self.hidden = hidden
        self.fc_bias = fc_bias
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)
        self.layer = layer_cls(config, layer_idx=0)
        # as in EAGLE and in the engines that serve its heads (vLLM, SGLang): the layer reads the fc output without
        # an input norm (module docstring)
        self.layer.input_layernorm = nn.Identity()
        self.rotary = rotary_cls(config=config)

    @classmethod
    def for_target(cls, target: nn.Module, fc_bias: bool = False) -> EagleHead:
        """A fresh head for ``target`` (its dtype; on the CPU)."""
        adapter = ModelAdapter(target)
        if adapter.family != "llama":
            raise UnsupportedModelError(f"EAGLE heads need a Llama-style target (Llama, Qwen2, Mistral, ...), not "
                                        f"{adapter.model_type!r}")
        config = head_config(target.config)
        head = cls(config, type(adapter.layers[0]), type(adapter.rotary), fc_bias=fc_bias)
        return head.to(adapter.dtype)

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(1, capacity)

    def forward(
        self,
        embeds: torch.Tensor,  # [B, T, H]  E(x_{t+1})
        features: torch.Tensor,  # [B, T, H]  f_t (true, or the head's own f^ while drafting)
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None = None,
        key_padding: torch.Tensor | None = None,  # [B, T] 1 = real token (training batches without a cache)
        tree: torch.Tensor | None = None,  # [T, T] bool visibility among the new positions; None = causal
        visible: torch.Tensor | None = None,  # [T, past + T] bool: which cached and new keys each query sees
    ) -> torch.Tensor:  # [B, T, H]  f^_{t+1}
        hidden = self.fc(torch.cat([embeds, features], dim=-1))
        t = hidden.shape[1]
        past = cache.get_seq_length(0) if cache is not None else 0
        if visible is None:  # every cached key, and the new ones causally (or as the tree allows)
            new = tree if tree is not None else torch.ones(t, t, dtype=torch.bool, device=hidden.device).tril()
            visible = visibility(past, new.to(hidden.device), position_ids[0])  # [T, past + T]
        elif tuple(visible.shape) != (t, past + t):
            raise ValueError(f"visible is {tuple(visible.shape)}; the head needs [{t}, {past + t}] here")
        mask = additive_mask(visible, hidden.dtype)  # [1, 1, T, past + T]
        if key_padding is not None:  # [B, 1, 1, T]: padded keys hidden from every query
            pad = (key_padding[:, None, None, :] == 0).to(device=hidden.device)
            mask = mask.masked_fill(pad, torch.finfo(hidden.dtype).min)
        rope = self.rotary(hidden, position_ids)
        out = self.layer(hidden, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                         use_cache=cache is not None, position_embeddings=rope)
        return out[0] if isinstance(out, tuple) else out

    def artefact_config(self) -> dict:
        return {"method": "eagle", "variant": "eagle1", "hidden_size": self.hidden, "fc_bias": self.fc_bias}


__all__ = ["EagleHead", "head_config"]
