"""BiTA (Lin et al. 2024): learnable prompt and mask tokens that let a frozen target draft semi-autoregressively.

Two small sets of weights sit beside the unchanged target:

- the *prompt*: ``P`` tokens (16 in the reference code) of per-layer keys and values (deep prompt tuning, P-tuning v2, as the
  reference trains it; ``prompt_mode=deep``, peft's ``PrefixEncoder``) or of input embeddings (plain prompt tuning,
  ``prompt_mode=embeddings``, peft's ``PromptEmbedding``; their keys/values are what the frozen target computes
  for them);
- ``M`` *mask tokens* (3 in the reference code for 7B-13B targets, 4 for 33B-70B), each its own learnable input embedding.

A group of the ``M`` mask tokens placed after token ``x_t`` sits at positions ``t+1 .. t+M`` and mask ``k`` learns
to predict ``x_{t+k+1}``: the target's own logits at ``t`` already give ``x_{t+1}``, so one forward that carries a
group after the last verified token yields the next token *and* an ``M``-token draft after it. The masks of a
group attend to each other (``mask_attention``: bidirectional by default; causal, as the reference code runs:
docs/METHODS.md#bita), to the sequence up to their insertion point and to the prompt; **no sequence token ever sees the
prompt or a mask**, so the target's outputs are exactly its own and verification stays lossless.

The module lives in ``inference`` because the decode loop runs it; ``draftsmith.trainers.bita.trainer`` trains it.
"""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.sharding import whole
from draftsmith.inference.core.adapter import ModelAdapter

PROMPT_MODES = ("deep", "embeddings")
PROMPT_TOKENS = 16  # the reference code's P: the default of training (BitaConfig) and of ``--method bita`` alike
MASK_TOKENS = 3  # the reference code's M for 7B-13B targets: tokens drafted per step
MASK_ATTENTION = ("bidirectional", "causal")
CONFIG_FILE = "embeddings_config.json"
WEIGHTS_FILE = "embeddings.safetensors"


def kv_geometry(config) -> tuple[int, int, int, int]:
    """``(layers, kv_heads, head_dim, hidden)`` of a Llama-style or GPT-2 config."""
    hidden = int(getattr(config, "hidden_size", None) or config.n_embd)
    layers = int(getattr(config, "num_hidden_layers", None) or config.n_layer)
    heads = int(getattr(config, "num_attention_heads", None) or config.n_head)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return layers, kv_heads, head_dim, hidden


def group_visibility(groups: int, masks: int, mask_attention: str = "bidirectional") -> torch.Tensor:
    """``[G*M, G*M]`` bool: mask ``(g, k)`` sees the masks of its own group ``g`` only (all of them when
    bidirectional, ``0 .. k`` when causal)."""
    if mask_attention not in MASK_ATTENTION:
        raise ConfigError(f"mask_attention={mask_attention!r} is unknown: choose one of {', '.join(MASK_ATTENTION)}")
    block = torch.ones(masks, masks, dtype=torch.bool)
    if mask_attention == "causal":
        block = block.tril()
    return torch.block_diag(*([block] * groups)) if groups else torch.zeros(0, 0, dtype=torch.bool)


def training_layout(points: torch.Tensor, labels: torch.Tensor, masks: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor]:
    """Where the mask groups of a training batch sit and what they learn.

    ``points`` ``[B, G]``: the insertion points (group ``g`` follows token ``t = points[b, g]``; -1 = no group);
    ``labels`` ``[B, T]`` (-100 where not trained). Returns ``seen [B, G*M, T]`` (mask ``(g, k)`` sees tokens
    ``0 .. t``), ``positions [B, G*M]`` (``t + k`` for ``k = 1 .. M``) and ``targets [B, G*M]``
    (``x_{t+k+1}``, -100 past the end, where unlabelled, or for an absent group)."""
    b, g = points.shape
    t_len = labels.shape[1]
    k = torch.arange(1, masks + 1, device=points.device)  # [M]
    at = points[:, :, None].expand(b, g, masks)  # [B, G, M]
    positions = (at + k).reshape(b, g * masks)  # [B, G*M]
    ahead = (at + k + 1).reshape(b, g * masks)  # [B, G*M] the token each mask predicts
    valid = (points[:, :, None] >= 0).expand(b, g, masks).reshape(b, g * masks) & (ahead < t_len)
    targets = labels.gather(1, ahead.clamp(max=t_len - 1)).masked_fill(~valid, -100)
    present = (points >= 0)[:, :, None].expand(b, g, masks).reshape(b, g * masks)  # [B, G*M]
    seen = torch.arange(t_len, device=points.device)[None, None, :] <= at.reshape(b, g * masks)[:, :, None]
    return seen & present[:, :, None], positions.masked_fill(~present, 0), targets


def decode_extras_layout(parents: list[int], masks: int, mask_attention: str = "bidirectional"
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask groups of a decoding step: one group after the pending token (group 0) and one after every draft
    node ``i`` (group ``i + 1``), so that whichever node ends the accepted path, the group after it drafts the next
    step. Returns ``visible [m, 1 + n + m]`` (group ``i + 1`` sees the pending token, node ``i`` and its ancestors,
    and its own group) and ``depths [m]`` (position offsets from the pending token: ``depth(node) + k``)."""
    from draftsmith.inference.core.masks import causal_tree_mask, tree_depths

    n = len(parents)
    groups = n + 1
    m = groups * masks
    anc = causal_tree_mask(parents) if n else torch.zeros(0, 0, dtype=torch.bool)  # [n, n]
    node_depth = tree_depths(parents) if n else torch.zeros(0, dtype=torch.long)  # [n]
    visible = torch.zeros(m, 1 + n + m, dtype=torch.bool)
    visible[:, 0] = True
    for g in range(1, groups):
        visible[g * masks:(g + 1) * masks, 1:1 + n] = anc[g - 1]
    visible[:, 1 + n:] = group_visibility(groups, masks, mask_attention)
    base = torch.cat([torch.zeros(1, dtype=torch.long), node_depth])  # [G] depth of the group's anchor
    depths = (base[:, None] + torch.arange(1, masks + 1)[None, :]).reshape(m)
    return visible, depths


class BitaEmbeddings(nn.Module):
    """The prompt (``P`` tokens, deep or plain) and the ``M`` mask-token embeddings of one target."""

    def __init__(self, hidden: int, layers: int, kv_heads: int, head_dim: int, prompt_tokens: int = 16,
                 mask_tokens: int = 3, prompt_mode: str = "deep", mask_attention: str = "bidirectional") -> None:
        super().__init__()
        from peft.tuners.prefix_tuning import PrefixEncoder, PrefixTuningConfig
        from peft.tuners.prompt_tuning import PromptEmbedding, PromptTuningConfig

        if prompt_mode not in PROMPT_MODES:
            raise ConfigError(f"prompt_mode={prompt_mode!r} is unknown: choose one of {', '.join(PROMPT_MODES)}")
        if mask_attention not in MASK_ATTENTION:
            raise ConfigError(f"mask_attention={mask_attention!r} is unknown: choose one of {', '.join(MASK_ATTENTION)}")
        if prompt_tokens < 1 or mask_tokens < 1:
            raise ConfigError(f"BiTA needs prompt_tokens >= 1 and mask_tokens >= 1, got {prompt_tokens} and {mask_tokens}")
        self.hidden, self.layers, self.kv_heads, self.head_dim = hidden, layers, kv_heads, head_dim
        self.prompt_tokens, self.mask_tokens = prompt_tokens, mask_tokens
        self.prompt_mode, self.mask_attention = prompt_mode, mask_attention
        if prompt_mode == "deep":  # an embedding of P rows of [layers * 2 * kv_heads * head_dim] (no projection)
            self.prompt = PrefixEncoder(PrefixTuningConfig(
                num_virtual_tokens=prompt_tokens, token_dim=kv_heads * head_dim, num_layers=layers,
                num_attention_heads=kv_heads, prefix_projection=False, task_type="CAUSAL_LM",
                num_transformer_submodules=1))
        else:  # P input embeddings the frozen target turns into keys/values
            self.prompt = PromptEmbedding(PromptTuningConfig(
                num_virtual_tokens=prompt_tokens, token_dim=hidden, task_type="CAUSAL_LM",
                num_transformer_submodules=1), None)
        self.masks = nn.Parameter(torch.zeros(mask_tokens, hidden))  # [M, H]

    @classmethod
    def for_target(cls, target_model, **settings) -> BitaEmbeddings:
        layers, kv_heads, head_dim, hidden = kv_geometry(target_model.config)
        return cls(hidden=hidden, layers=layers, kv_heads=kv_heads, head_dim=head_dim, **settings)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def init_from_target(self, adapter: ModelAdapter, seed: int = 0) -> None:
        """Start from the target's own vocabulary: each mask the embedding of a random token; the prompt the
        embeddings (plain) or the per-layer keys/values (deep) the target computes for random tokens (a target
        ZeRO-3 has partitioned is gathered meanwhile)."""
        with whole(list(adapter.model.parameters())):
            self._init_from_target(adapter, seed)

    def _init_from_target(self, adapter: ModelAdapter, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        vocab = adapter.embed_tokens.num_embeddings
        ids = torch.randint(0, vocab, (self.prompt_tokens + self.mask_tokens,), generator=gen).to(adapter.device)
        embeds = adapter.embed_tokens(ids).float()  # [P + M, H]
        self.masks.copy_(embeds[self.prompt_tokens:])
        if self.prompt_mode == "embeddings":
            self.prompt.embedding.weight.copy_(embeds[: self.prompt_tokens])
            return
        cache = adapter.new_cache(self.prompt_tokens)
        adapter.forward(ids[None, : self.prompt_tokens], cache, compute_logits=False)
        rows = [torch.stack(cache.layer(i))[:, 0] for i in range(self.layers)]  # L x [2, Hkv, P, D]
        table = torch.stack(rows).permute(3, 0, 1, 2, 4)  # [P, L, 2, Hkv, D]
        self.prompt.embedding.weight.copy_(table.reshape(self.prompt_tokens, -1).float())

    def prefix_kv(self, adapter: ModelAdapter) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer keys and values of the prompt, each ``[1, H_kv, P, D]`` (differentiable)."""
        index = torch.arange(self.prompt_tokens, device=self.masks.device)
        if self.prompt_mode == "deep":
            table = self.prompt(index).view(self.prompt_tokens, self.layers, 2, self.kv_heads, self.head_dim)
            table = table.permute(1, 2, 3, 0, 4)  # [L, 2, Hkv, P, D]
            return [table[i, 0][None] for i in range(self.layers)], [table[i, 1][None] for i in range(self.layers)]
        embeds = self.prompt(index[None]).to(adapter.dtype)  # [1, P, H]
        cache = adapter.new_cache(self.prompt_tokens)
        adapter.forward(inputs_embeds=embeds, cache=cache, compute_logits=False)
        pairs = [cache.layer(i) for i in range(self.layers)]
        return [k for k, _ in pairs], [v for _, v in pairs]

    def mask_inputs(self, groups: int) -> torch.Tensor:  # [G*M, H]
        return self.masks.repeat(groups, 1)

    def artefact_config(self) -> dict:
        return {"method": "bita", "hidden_size": self.hidden, "num_layers": self.layers, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "prompt_tokens": self.prompt_tokens, "mask_tokens": self.mask_tokens,
                "prompt_mode": self.prompt_mode, "mask_attention": self.mask_attention,
                "trained_parameters": self.num_parameters}

    @classmethod
    def from_artefact_config(cls, config: dict) -> BitaEmbeddings:
        return cls(hidden=int(config["hidden_size"]), layers=int(config["num_layers"]), kv_heads=int(config["kv_heads"]),
                   head_dim=int(config["head_dim"]), prompt_tokens=int(config["prompt_tokens"]),
                   mask_tokens=int(config["mask_tokens"]), prompt_mode=str(config["prompt_mode"]),
                   mask_attention=str(config.get("mask_attention", "bidirectional")))

    def check_target(self, target_model) -> None:
        """Refuse a target whose layers, key/value heads or width differ from the ones these embeddings were
        trained for."""
        got = kv_geometry(target_model.config)
        want = (self.layers, self.kv_heads, self.head_dim, self.hidden)
        if got != want:
            raise ArtefactError(f"these BiTA embeddings were trained for (layers, kv_heads, head_dim, hidden) = {want}, "
                                f"but the target has {got}: pass the target the artefact was trained on")


__all__ = ["BitaEmbeddings", "MASK_ATTENTION", "PROMPT_MODES", "decode_extras_layout", "group_visibility",
           "kv_geometry", "training_layout"]
