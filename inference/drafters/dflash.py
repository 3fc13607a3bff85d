"""The DFlash draft (Chen et al. 2026, "DFlash: Block Diffusion for Flash Speculative Decoding"): a few decoder
layers that fill a block of mask tokens in one forward, conditioned on the target's hidden states.

Context: the target's hidden states of the chosen layers at every committed position ``s < p`` (those the target has
processed), concatenated and fused::

    c_s = hidden_norm(fc([h^{l_1}_s; ...; h^{l_n}_s]))                    ([n Ht] -> [H], no bias)

enter every draft layer as extra keys and values only: layer ``i``'s own ``k_proj``/``v_proj`` (and its per-head
``k_norm``) applied to ``c_s``, rotated at position ``s``. They never pass through a layer's input norm, queries or
MLP. The block: the pending token ``x_p`` (the target's last output, not yet processed) and ``K`` mask tokens at
positions ``p .. p + K``, embedded by the target's own (frozen) embedding; every block position attends to all the
context keys and to the whole block (bidirectional inside the block). After the last layer, ``norm`` and the
target's own LM head give, at block slot ``k >= 1``, the draft's distribution of the token at position ``p + k``
(the same position: no shift). So one draft forward drafts ``K`` tokens.

The layers are Qwen3-shaped (pre-norm, per-head q/k norms, SiLU MLP, no biases) whatever the target's family, as
vLLM's DFlash model (``DFlashDraftModel``) requires, and built by transformers' own Qwen3 classes from a config
carrying the target's sizes. Training (:mod:`draftsmith.trainers.dflash.trainer`) runs the same forward over many blocks of a
sequence at once (:func:`block_visibility`); the proposer: :mod:`draftsmith.inference.proposers.dflash`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

from draftsmith.common.errors import ConfigError
from draftsmith.common.models import cache_keyword
from draftsmith.inference.core.masks import additive_mask
from draftsmith.inference.drafters.eagle import GrowingCache

DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def dflash_layers(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The target layers a DFlash draft of ``num_draft_layers`` reads, as transformers hidden-state indices (the
    *output* of decoder layer ``i - 1``): the reference's ``[L//2]`` for one draft layer, else one per draft layer
    spread evenly over the outputs of layers ``1 .. L-3``; on targets too shallow for that to give distinct layers,
    over the outputs of ``0 .. L-2`` (never the last layer's, whose hidden state is final-normed)."""
    n_target, n = int(num_target_layers), int(num_draft_layers)
    if n_target < 2 or n < 1:
        raise ConfigError(f"DFlash reads target layers below the last one: a target of {n_target} layers and "
                          f"{n} draft layers leaves none")
    if n == 1:
        return (min(n_target // 2 + 1, n_target - 1),)
    lo, hi = 1, n_target - 3
    if hi - lo + 1 < n:
        lo, hi = 0, n_target - 2
    if hi - lo + 1 < n:
        raise ConfigError(f"DFlash: {n} draft layers each read their own target layer; this target has only "
                          f"{hi - lo + 1} to choose from: lower draft_layers or give layers")
    return tuple(int(round(lo + i * (hi - lo) / (n - 1))) + 1 for i in range(n))


def draft_config(target_config, num_layers: int) -> Qwen3Config:
    """A Qwen3 config of ``num_layers`` layers with the target's width, heads, MLP size, norm epsilon and rotary
    embedding (vLLM's DFlash draft is a Qwen3 stack whatever the target)."""
    c = target_config
    hidden, heads = int(c.hidden_size), int(c.num_attention_heads)
    rope = dict(getattr(c, "rope_parameters", None) or DEFAULT_ROPE)
    config = Qwen3Config(vocab_size=int(c.vocab_size), hidden_size=hidden, num_hidden_layers=int(num_layers),
                         num_attention_heads=heads,
                         num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
                         head_dim=int(getattr(c, "head_dim", None) or hidden // heads),
                         intermediate_size=int(getattr(c, "intermediate_size", None) or 4 * hidden),
                         rms_norm_eps=float(getattr(c, "rms_norm_eps", None) or 1e-6),
                         max_position_embeddings=int(getattr(c, "max_position_embeddings", 4096)),
                         rope_parameters=rope, attention_bias=False, tie_word_embeddings=False,
                         layer_types=["full_attention"] * int(num_layers))
    config._attn_implementation = "sdpa"
    return config


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [B, h, S, D] -> same
    """RoPE of ``x`` with ``cos``/``sin`` ``[B, S, D]`` (the rotary embedding's output)."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


def block_visibility(anchors: torch.Tensor, valid: torch.Tensor, context: int,
                     block: int) -> torch.Tensor:  # [B, N] -> [B, N*blk, context + N*blk] bool
    """What the blocks of a training sequence see: block ``n`` (anchor ``a_n``, the pending token's position) sees the
    context keys ``s < a_n`` and its own ``block`` positions, nothing of the other blocks; an invalid block
    (``valid`` False) sees its own positions only (its rows are never trained)."""
    b, n = anchors.shape
    s = torch.arange(context, device=anchors.device)
    ctx = (s[None, None] < anchors[..., None]) & valid[..., None]  # [B, N, S]
    own = torch.eye(n, dtype=torch.bool, device=anchors.device)  # [N, N]
    own = own.repeat_interleave(block, 0).repeat_interleave(block, 1)  # [N*blk, N*blk]
    ctx = ctx.repeat_interleave(block, 1)  # [B, N*blk, S]
    return torch.cat([ctx, own[None].expand(b, -1, -1)], dim=-1)


class DFlashDraft(nn.Module):
    """``fc`` and ``hidden_norm`` over the target's layers, ``num_layers`` Qwen3 decoder layers, ``norm`` (module
    docstring); the embedding and LM head are the target's, passed in by the caller."""

    def __init__(self, config: Qwen3Config, layers: tuple[int, ...], target_hidden: int, block_size: int,
                 mask_token_id: int) -> None:
        super().__init__()
        if int(block_size) < 2:
            raise ConfigError(f"a DFlash block holds the pending token and at least one mask: block_size={block_size}")
        self.config = config
        hidden = int(config.hidden_size)
        self.hidden, self.target_hidden = hidden, int(target_hidden)
        self.hidden_layers = tuple(int(i) for i in layers)
        self.block_size, self.mask_token_id = int(block_size), int(mask_token_id)
        self.fc = nn.Linear(len(self.hidden_layers) * self.target_hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(config=config)

    @classmethod
    def for_target(cls, target: nn.Module, num_layers: int = 1, layers: tuple[int, ...] | None = None,
                   block_size: int = 8, mask_token_id: int = 0) -> DFlashDraft:
        """A fresh draft for ``target`` (float32, on the CPU) reading ``layers`` (default :func:`dflash_layers`)."""
        n_target = int(target.config.num_hidden_layers)
        layers = tuple(layers) if layers else dflash_layers(n_target, num_layers)
        bad = [i for i in layers if not 1 <= i < n_target]
        if bad:
            raise ConfigError(f"DFlash layers {list(layers)}: give hidden-state indices in 1..{n_target - 1} (the "
                              "last layer's output is final-normed)")
        if not 0 <= int(mask_token_id) < int(target.config.vocab_size):
            raise ConfigError(f"mask_token_id={mask_token_id} is not a token of the target's vocabulary (0.."
                              f"{int(target.config.vocab_size) - 1}): pass one of its ids, or -1 for the tokenizer's "
                              "mask token")
        config = draft_config(target.config, num_layers)
        return cls(config, layers, int(target.config.hidden_size), block_size, mask_token_id)

    def context(self, features: dict[int, torch.Tensor]) -> torch.Tensor:  # {layer: [..., S, Ht]} -> [..., S, H]
        """``c = hidden_norm(fc([h^{l_1}; ...]))`` of the committed positions."""
        return self.hidden_norm(self.fc(torch.cat([features[i] for i in self.hidden_layers], dim=-1)))

    def context_keys(self, context: torch.Tensor, position_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the keys and values ``[B, KV, S, D]`` of the context ``[B, S, H]`` at ``position_ids`` ``[B, S]``:
        the layer's ``k_proj``/``k_norm`` (rotated) and ``v_proj``, nothing else."""
        cos, sin = self.rotary(context, position_ids)
        out = []
        for layer in self.layers:
            attn = layer.self_attn
            shape = (*context.shape[:-1], -1, attn.head_dim)
            key = attn.k_norm(attn.k_proj(context).view(shape)).transpose(1, 2)
            value = attn.v_proj(context).view(shape).transpose(1, 2)
            out.append((rotate(key, cos, sin), value))
        return out

    def forward(self, embeds: torch.Tensor, position_ids: torch.Tensor, caches, visible: torch.Tensor) -> torch.Tensor:
        """The block ``embeds`` ``[B, Q, H]`` at ``position_ids`` ``[B, Q]`` through every layer -> ``norm``-ed states
        ``[B, Q, H]`` (the LM head's input). ``caches``: one multi-layer cache holding the context keys (the proposer's
        :class:`~draftsmith.inference.core.kv_cache.KVCache`, which the block's own keys are appended to), or per layer
        the context's ``(keys, values)`` (training). ``visible`` ``[Q, S + Q]`` or ``[B, Q, S + Q]`` bool."""
        hidden = embeds
        mask = additive_mask(visible.to(hidden.device), hidden.dtype)
        rope = self.rotary(hidden, position_ids)
        for i, layer in enumerate(self.layers):
            cache = GrowingCache(*caches[i]) if isinstance(caches, list) else caches
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=rope,
                           **{cache_keyword(layer): cache})
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.norm(hidden)

    def artefact_config(self) -> dict:
        return {"method": "dflash", "layers": list(self.hidden_layers), "draft_layers": len(self.layers),
                "block_size": self.block_size, "mask_token_id": self.mask_token_id, "hidden_size": self.hidden,
                "target_hidden_size": self.target_hidden}


__all__ = ["DFlashDraft", "block_visibility", "dflash_layers", "draft_config", "rotate"]
