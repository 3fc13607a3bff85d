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

EAGLE-3 (:class:`Eagle3Head`, Li et al. 2025) reads three target layers instead of the last: a low, a middle and a
high one (the input of decoder layers ``2, n//2, n-3``, as in EAGLE-3 and the engines; spread evenly on targets
of fewer than 6 layers), fused by ``fc`` (``3 Ht -> H``, no bias) into ``g_t``; its layer attends over
``[input_norm(E(x_{t+1})); hidden_norm(g_t)]`` (q/k/v read ``2H``) with ``g_t`` as the residual, and its own final
norm and LM head give logits over a reduced draft vocabulary (the ``Vd`` most frequent target tokens of the
answers it trains on; ``d2t``/``t2d`` map between the two vocabularies as in EAGLE-3's and the engines' checkpoints). While
drafting, the head's own output ``h`` takes the place of ``g`` (no fc). EAGLE-3.1 (speculators' and vLLM's options
against attention drift) adds two switches: ``fc_norm``, an RMSNorm on each fused layer before ``fc``, and
``norm_output``, the next step reading ``norm(h)`` rather than ``h`` (its logits read ``norm(h)`` either way).
``norm_before_residual`` (speculators' default, vLLM's ``norm_before_residual``) makes the layer's residual the normed
input ``hidden_norm(g)`` instead of ``g``.

Both heads answer the same calls, which is all the proposer uses: ``hidden_layers`` (the target layers they read),
``fuse`` (target features -> the head's input hidden), ``forward`` (one head step over new positions with a KV
cache), ``draft_logits`` (head output -> logits over the draft vocabulary) and ``to_target`` (draft ids -> target
ids).

The head's decoder layer is Llama's whatever the target's family (``layer="llama"``, the default): vLLM and SGLang
load every EAGLE head as Llama layers (so do speculators' and SpecForge's heads for Qwen3, Gemma and gpt-oss targets),
so the layer's sizes, rope and norm eps come from the target's config (:func:`llama_head_config`) and its math is
Llama's — no Qwen2 biases, no Qwen3/OLMo2 q/k norms, no Gemma (1 + w) norms or GELU. ``layer="target"`` builds the
target family's own layer, norm and rotary classes instead, which only draftsmith's loop loads (the export refuses it
for families whose layer is not Llama's). Llama-style targets (Llama, Qwen2/3, Mistral, Gemma, OLMo2, ...). The module lives in ``inference`` because the decode loop runs it; the trainer
(``draftsmith.trainers.eagle.trainer``) builds and trains it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from draftsmith.common.errors import ConfigError, UnsupportedModelError
from draftsmith.common.models import cache_keyword
from draftsmith.common.sharding import whole
from draftsmith.data.draft_vocab import draft_vocabulary
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.kv_cache import KVCache
from draftsmith.inference.core.masks import additive_mask, visibility


def aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default target layers as transformers hidden-state indices (the input of decoder layer ``i``):
    ``(2, n//2, n-3)`` as EAGLE-3, vLLM and SGLang capture them; on targets of fewer than 6 layers, where those
    collide, ``(1, n//2, n-1)`` (distinct from 4 layers on)."""
    n = int(num_layers)
    if n < 3:
        raise UnsupportedModelError(f"EAGLE-3 fuses three target layers; this target has {n}")
    return (2, n // 2, n - 3) if n >= 6 else (1, max(2, n // 2), n - 1)


def draft_vocab(counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:  # [V] -> [Vd], [V]
    """EAGLE-3's reduced draft vocabulary from target-token counts ``[V]`` over the answers it trains on: the ``size``
    most frequent ids (ties and unseen ids: the smaller id first; :func:`draftsmith.data.draft_vocab.draft_vocabulary`),
    as EAGLE-3's checkpoints store it: ``d2t`` ``[Vd]`` int64 (the offset ``target_id - draft_id``) and ``t2d``
    ``[V]`` bool (which target ids are in)."""
    used = draft_vocabulary(counts, size)  # [Vd] ascending
    t2d = torch.zeros(counts.numel(), dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(used.numel()), t2d


class GrowingCache:
    """A one-layer key/value cache that concatenates (so gradients flow through every cached key): the unrolled
    training-time test of EAGLE-3 keeps each step's keys for the next steps. It may start from earlier steps' keys
    and values ``[B, KV, S, D]``; ``new`` holds the keys and values of the latest ``update``."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
        self.keys, self.values = keys, values
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states, value_states, layer_idx: int = 0, *_, **__):  # extras as KVCache.update's
        self.new = (key_states, value_states)
        if self.keys is None:
            self.keys, self.values = key_states, value_states
        else:
            self.keys = torch.cat([self.keys, key_states], dim=2)
            self.values = torch.cat([self.values, value_states], dim=2)
        return self.keys, self.values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])


def head_mask(hidden: torch.Tensor, position_ids: torch.Tensor, past: int, tree: torch.Tensor | None,
              visible: torch.Tensor | None) -> torch.Tensor:  # [1, 1, T, past + T] additive
    """The head's attention mask: ``visible`` ``[T, past + T]`` when given, else every cached key and the new ones
    causally (or as ``tree`` ``[T, T]`` allows)."""
    t = hidden.shape[1]
    if visible is None:
        new = tree if tree is not None else torch.ones(t, t, dtype=torch.bool, device=hidden.device).tril()
        visible = visibility(past, new.to(hidden.device), position_ids[0])
    elif tuple(visible.shape) != (t, past + t):
        raise ValueError(f"visible is {tuple(visible.shape)}; the head needs [{t}, {past + t}] here")
    return additive_mask(visible.to(hidden.device), hidden.dtype)


def _llama_adapter(target: nn.Module) -> ModelAdapter:
    adapter = ModelAdapter(target)
    if adapter.family != "llama":
        raise UnsupportedModelError(f"EAGLE heads need a Llama-style target (Llama, Qwen2, Mistral, ...), not "
                                    f"{adapter.model_type!r}")
    return adapter


HEAD_LAYERS = ("llama", "target")  # the head's decoder layer: Llama's (what the engines load), or the target family's


def head_rope(config) -> dict:
    """The target's rope settings for a full-attention layer (a model with per-layer-type rope, e.g. Gemma 3: its
    ``full_attention`` entry)."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if isinstance(rope.get("full_attention"), dict):
        rope = dict(rope["full_attention"])
    if not rope:
        rope = {"rope_type": "default", "rope_theta": float(getattr(config, "rope_theta", 10000.0))}
    return rope


def llama_head_config(target_config):
    """A one-layer ``LlamaConfig`` of the target's shape (hidden size, heads, KV heads, head dim, MLP size, norm eps,
    full-attention rope, positions, vocabulary): the layer the engines build an EAGLE head of, whatever the target's
    family (no biases, SiLU MLP: vLLM's Llama MLP takes no other activation)."""
    from transformers import LlamaConfig

    c = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    heads = int(c.num_attention_heads)
    return LlamaConfig(vocab_size=int(c.vocab_size), hidden_size=int(c.hidden_size),
                       intermediate_size=int(c.intermediate_size), num_hidden_layers=1, num_attention_heads=heads,
                       num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
                       head_dim=int(getattr(c, "head_dim", None) or int(c.hidden_size) // heads),
                       rms_norm_eps=float(getattr(c, "rms_norm_eps", None) or 1e-6),
                       max_position_embeddings=int(getattr(c, "max_position_embeddings", None) or 2048),
                       hidden_act="silu", attention_bias=False, mlp_bias=False, rope_parameters=head_rope(c),
                       tie_word_embeddings=False)


def head_classes(adapter: ModelAdapter, layer: str) -> tuple:
    """``(config, layer class, rotary class, norm class)`` of a head's decoder layer: Llama's of the target's shape,
    or (``layer="target"``) the target family's own (:data:`HEAD_LAYERS`)."""
    if layer == "llama":
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

        return llama_head_config(adapter.model.config), LlamaDecoderLayer, LlamaRotaryEmbedding, LlamaRMSNorm
    if layer != "target":
        raise ConfigError(f"head layer {layer!r}: choose llama (what vLLM and SGLang load) or target")
    return head_config(adapter.model.config), type(adapter.layers[0]), type(adapter.rotary), type(adapter.final_norm)


def norm_scale(norm: nn.Module, width: int) -> torch.Tensor:  # [H] float32, on the CPU
    """What an RMSNorm multiplies the normalised input by, whatever its parametrisation (Llama's ``w``, Gemma's
    ``1 + w``): its output on a constant input (root mean square 1), its ``eps`` undone."""
    eps = float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 0.0)
    with torch.no_grad(), whole(list(norm.parameters())):  # ZeRO-3: gathered
        out = copy.deepcopy(norm).float().cpu()(torch.ones(1, width))
    return out[0] * (1.0 + eps) ** 0.5


def head_config(target_config):
    """A copy of the target's config for a one-layer head (the layer index 0 of a one-layer stack)."""
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = ["full_attention"]
    return config


class EagleHead(nn.Module):
    """``fc`` over ``[E(x_{t+1}); f_t]`` then one decoder layer of the target's architecture (module docstring)."""

    def __init__(self, config, layer_cls: type[nn.Module], rotary_cls: type[nn.Module], fc_bias: bool = False,
                 layer: str = "target") -> None:
        super().__init__()
        self.config = config
        hidden = int(config.hidden_size)
        self.hidden = hidden
        self.fc_bias = fc_bias
        self.layer_kind = layer  # HEAD_LAYERS: which class built the decoder layer (artefact_config records it)
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)
        self.layer = layer_cls(config, layer_idx=0)
        # as in EAGLE and in the engines that serve its heads (vLLM, SGLang): the layer reads the fc output without
        # an input norm (module docstring)
        self.layer.input_layernorm = nn.Identity()
        self.rotary = rotary_cls(config=config)

    @classmethod
    def for_target(cls, target: nn.Module, fc_bias: bool = False, layer: str = "llama") -> EagleHead:
        """A fresh head for ``target`` (its dtype; on the CPU); ``layer``: :data:`HEAD_LAYERS`."""
        adapter = _llama_adapter(target)
        config, layer_cls, rotary_cls, _ = head_classes(adapter, layer)
        head = cls(config, layer_cls, rotary_cls, fc_bias=fc_bias, layer=layer)
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
        past = cache.get_seq_length(0) if cache is not None else 0
        mask = head_mask(hidden, position_ids, past, tree, visible)  # [1, 1, T, past + T]
        if key_padding is not None:  # [B, 1, 1, T]: padded keys hidden from every query
            pad = (key_padding[:, None, None, :] == 0).to(device=hidden.device)
            mask = mask.masked_fill(pad, torch.finfo(hidden.dtype).min)
        rope = self.rotary(hidden, position_ids)
        out = self.layer(hidden, attention_mask=mask, position_ids=position_ids, use_cache=cache is not None,
                         position_embeddings=rope, **{cache_keyword(self.layer): cache})
        return out[0] if isinstance(out, tuple) else out

    # -- what the proposer uses -------------------------------------------------------------------------
    hidden_layers: tuple[int, ...] = (-1,)  # the target's final-normed last hidden state

    def fuse(self, features: dict[int, torch.Tensor]) -> torch.Tensor:  # -> [..., H]
        return features[-1]

    def draft_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:  # [..., V]
        return lm_head(hidden)

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def artefact_config(self) -> dict:
        return {"method": "eagle", "variant": "eagle1", "hidden_size": self.hidden, "fc_bias": self.fc_bias,
                "layer": self.layer_kind}


class Eagle3Head(nn.Module):
    """EAGLE-3's head (module docstring): ``fc`` over three target layers, one decoder layer of the target's
    architecture whose q/k/v read ``[input_norm(E(x)); hidden_norm(g)]``, its own norm and draft-vocabulary LM head."""

    def __init__(self, config, layer_cls: type[nn.Module], rotary_cls: type[nn.Module], norm_cls: type[nn.Module],
                 layers: tuple[int, ...], d2t: torch.Tensor, t2d: torch.Tensor, target_hidden: int | None = None,
                 fc_norm: bool = False, norm_output: bool = False, layer: str = "target",
                 norm_before_residual: bool = False) -> None:
        super().__init__()
        self.config = config
        self.layer_kind = layer  # HEAD_LAYERS: which class built the decoder layer (artefact_config records it)
        hidden = int(config.hidden_size)
        eps = float(getattr(config, "rms_norm_eps", 1e-6))
        self.hidden, self.target_hidden = hidden, int(target_hidden or hidden)
        self.hidden_layers = tuple(int(i) for i in layers)
        self.fc = nn.Linear(len(self.hidden_layers) * self.target_hidden, hidden, bias=False)
        # EAGLE-3.1: an RMSNorm per fused target layer before fc, and the normed output fed back between steps
        self.fc_norm = nn.ModuleList([norm_cls(self.target_hidden, eps=eps) for _ in self.hidden_layers]) \
            if fc_norm else None
        self.norm_output = bool(norm_output)
        self.norm_before_residual = bool(norm_before_residual)  # the residual is hidden_norm(g), not g
        self.midlayer = layer_cls(config, layer_idx=0)
        attn = self.midlayer.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):  # our layer instance reads [E(x); g]: 2H wide
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))
        self.midlayer.hidden_norm = norm_cls(hidden, eps=eps)
        self.norm = norm_cls(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, int(d2t.numel()), bias=False)
        self.register_buffer("d2t", d2t.to(torch.long).clone())  # [Vd] target id - draft id
        self.register_buffer("t2d", t2d.to(torch.bool).clone())  # [V]
        self.rotary = rotary_cls(config=config)

    @classmethod
    def for_target(cls, target: nn.Module, d2t: torch.Tensor, t2d: torch.Tensor,
                   layers: tuple[int, ...] | None = None, fc_norm: bool = False,
                   norm_output: bool = False, layer: str = "llama", norm_before_residual: bool = False) -> Eagle3Head:
        """A fresh head for ``target`` (its dtype, on the CPU); its LM head starts as the target's rows of the draft
        vocabulary, its final norm as the target's (the same scale, in the head's norm's parametrisation).
        ``fc_norm``, ``norm_output``: EAGLE-3.1's options, ``norm_before_residual`` the normed residual (module
        docstring); ``layer``: :data:`HEAD_LAYERS`."""
        adapter = _llama_adapter(target)
        layers = tuple(layers) if layers else aux_layers(adapter.num_layers)
        bad = [i for i in layers if not 1 <= i < adapter.num_layers]
        if bad or len(layers) != 3:
            raise ConfigError(f"EAGLE-3 layers {list(layers)}: give three hidden-state indices in 1..{adapter.num_layers - 1}")
        if t2d.numel() != adapter.vocab_size:
            raise ConfigError(f"t2d covers {t2d.numel()} target tokens; the target has {adapter.vocab_size}")
        config, layer_cls, rotary_cls, norm_cls = head_classes(adapter, layer)
        head = cls(config, layer_cls, rotary_cls, norm_cls, layers, d2t, t2d, fc_norm=fc_norm, norm_output=norm_output,
                   layer=layer, norm_before_residual=norm_before_residual)
        with torch.no_grad(), whole([adapter.lm_head.weight, adapter.final_norm.weight]):  # ZeRO-3: gathered
            ids = torch.arange(d2t.numel()) + d2t
            head.lm_head.weight.copy_(adapter.lm_head.weight[ids.to(adapter.device)].cpu())
            scale = adapter.final_norm.weight.cpu() if layer == "target" else norm_scale(adapter.final_norm,
                                                                                          head.hidden)
            head.norm.weight.copy_(scale)
        return head.to(adapter.dtype)

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(1, capacity)

    def fuse(self, features: dict[int, torch.Tensor]) -> torch.Tensor:  # {layer: [..., Ht]} -> [..., H]
        return self.fuse_concat(torch.cat([features[i] for i in self.hidden_layers], dim=-1))

    def fuse_concat(self, x: torch.Tensor) -> torch.Tensor:  # [..., k Ht] (hidden_layers' order) -> [..., H]
        """``g = fc([f_1; ...; f_k])``; EAGLE-3.1 (``fc_norm``): ``fc([norm_1(f_1); ...; norm_k(f_k)])``."""
        if self.fc_norm is not None:
            x = torch.cat([norm(part) for norm, part in zip(self.fc_norm, x.chunk(len(self.fc_norm), dim=-1))], -1)
        return self.fc(x)

    def fed_back(self, h: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        """The state the next draft step reads: the layer's output ``h`` (pre-norm), or EAGLE-3.1's ``norm(h)``."""
        return self.norm(h) if self.norm_output else h

    def layer_inputs(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``([input_norm(E(x)); hidden_norm(g)] [..., 2H], residual [..., H])`` of the layer: ``g``, or
        ``hidden_norm(g)`` under ``norm_before_residual``."""
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        return torch.cat([layer.input_layernorm(embeds), normed], dim=-1), \
            (normed if self.norm_before_residual else hidden)

    def logits_input(self, out: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        """What the draft LM head reads from :meth:`forward`'s output: ``norm(h)`` (already so under ``norm_output``)."""
        return out if self.norm_output else self.norm(out)

    def forward(
        self,
        embeds: torch.Tensor,  # [B, T, H]  E(x_{t+1})
        hidden: torch.Tensor,  # [B, T, H]  g_t = fuse(target features), or the head's own output while drafting
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | GrowingCache | None = None,
        key_padding: torch.Tensor | None = None,  # unused with right padding; accepted like EagleHead's
        tree: torch.Tensor | None = None,
        visible: torch.Tensor | None = None,  # [T, past + T] bool
    ) -> torch.Tensor:  # [B, T, H]  the head's output h (pre-norm; the next step's input hidden)
        past = cache.get_seq_length(0) if cache is not None else 0
        mask = head_mask(hidden, position_ids, past, tree, visible)
        rope = self.rotary(hidden, position_ids)
        layer = self.midlayer
        x, residual = self.layer_inputs(embeds, hidden)  # [B, T, 2H], [B, T, H]
        attn = layer.self_attn(x, position_embeddings=rope, attention_mask=mask, position_ids=position_ids,
                               **{cache_keyword(layer.self_attn): cache})
        h = residual + (attn[0] if isinstance(attn, tuple) else attn)
        return self.fed_back(h + layer.mlp(layer.post_attention_layernorm(h)))

    def draft_logits(self, hidden: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:  # [..., Vd]
        return self.lm_head(self.logits_input(hidden))

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.d2t[ids]

    def artefact_config(self) -> dict:
        return {"method": "eagle", "variant": "eagle3", "hidden_size": self.hidden, "layers": list(self.hidden_layers),
                "draft_vocab_size": int(self.d2t.numel()), "vocab_size": int(self.t2d.numel()),
                "fc_norm": self.fc_norm is not None, "norm_output": self.norm_output, "layer": self.layer_kind,
                "norm_before_residual": self.norm_before_residual}


__all__ = ["HEAD_LAYERS", "Eagle3Head", "EagleHead", "GrowingCache", "aux_layers", "draft_vocab", "head_classes",
           "head_config", "head_mask", "head_rope", "llama_head_config", "norm_scale"]
