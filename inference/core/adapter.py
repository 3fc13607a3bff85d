"""One interface over Hugging Face decoder-only causal LMs, without copying modeling code.

The adapter finds the embedding, the decoder layers, the final norm and the LM head of a loaded
model and runs them itself, layer by layer. That gives every drafting method what it needs from
the target: a forward over a range of layers with an explicit set of skipped layers (LayerSkip,
Draft & Verify), hidden states of chosen layers (EAGLE, Medusa), a forward over a token tree with a
custom 4-D mask and explicit position ids (tree verification), and a KV cache that can be cropped
and branch-selected (:class:`~draftsmith.inference.core.kv_cache.KVCache`).

Masks: a causal forward (prefill, chain verification) builds no 4-D mask under ``sdpa`` and flash attention
(:func:`~draftsmith.inference.core.attention.causal_mask`: SDPA keeps its fused kernels); token trees, KV
prefixes, sliding-window layers under ``sdpa`` and every forward under other implementations (``eager``) get the
explicit additive mask of :func:`visibility`. Flash attention takes no explicit mask: a tree or a KV prefix under
it is refused before anything runs.

Supported layouts: Llama-style (Llama, Qwen2, Mistral and their relatives: ``model.embed_tokens``,
``model.layers``, ``model.norm``, ``model.rotary_emb``) and GPT-2 (``transformer.wte``/``wpe``,
``transformer.h``, ``transformer.ln_f``). Nothing is patched or set on the wrapped modules; only
their public forwards are called.

Hidden-state indices follow transformers: index 0 is the embedding output, index ``i`` the output
of decoder layer ``i - 1`` (before the final norm). :meth:`ModelAdapter.forward_from` starts a
forward at any layer from given hidden states (early exit hands verification the layer-E states of
its draft), and ``inputs_embeds`` replaces token ids by embeddings (BiTA's prompt and mask tokens).
Sublayer skipping (the attention or the MLP of a layer, Draft & Verify) composes the layer's own
public submodules, for the layouts listed in :data:`SUBLAYER_LAYOUTS`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import nn

from draftsmith.common.errors import ConfigError, UnsupportedModelError
from draftsmith.common.models import cache_keyword
from draftsmith.common.sharding import full_shape
from draftsmith.inference.core.attention import FLASH, SDPA, causal_attention_kind, causal_mask, decode_attention
from draftsmith.inference.core.kv_cache import KVCache, KVPrefix, PrefixedCache
from draftsmith.inference.core.masks import additive_mask, visibility
from draftsmith.kernels.tree_attention import TREE_KWARG, tree_attention_backend

LLAMA_LIKE = ("llama", "qwen2", "mistral", "qwen3", "mixtral", "gemma", "gemma3_text", "phi3", "olmo", "olmo2")
# Model types whose decoder layer is ``h + post1(attn(pre1(h)))`` then ``h + post2(mlp(pre2(h)))``, so one sublayer
# can run without the other; value: (pre1, attention, post1, pre2, mlp, post2) attribute names, None where the
# layer has no such norm (Llama's are pre-norms only, OLMo2's post-norms only, Gemma 3 has both).
_LLAMA_SUBLAYERS = ("input_layernorm", "self_attn", None, "post_attention_layernorm", "mlp", None)
SUBLAYER_LAYOUTS = MappingProxyType(
    {
        "llama": _LLAMA_SUBLAYERS,
        "qwen2": _LLAMA_SUBLAYERS,
        "qwen3": _LLAMA_SUBLAYERS,
        "mistral": _LLAMA_SUBLAYERS,
        "olmo2": (None, "self_attn", "post_attention_layernorm", None, "mlp", "post_feedforward_layernorm"),
        "gemma3_text": ("input_layernorm", "self_attn", "post_attention_layernorm", "pre_feedforward_layernorm", "mlp",
                        "post_feedforward_layernorm"),
        "gpt2": ("ln_1", "attn", None, "ln_2", "mlp", None),
    }
)


@dataclass
class AdapterOutput:
    logits: torch.Tensor | None  # [B, T, V] (float32 unless keep_dtype)
    last_hidden: torch.Tensor  # [B, T, H], after the final norm
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)  # index -> [B, T, H]


class ModelAdapter:
    """Wraps a loaded ``*ForCausalLM`` and runs it piece by piece.

    >>> adapter = ModelAdapter(model)
    >>> cache = adapter.new_cache()
    >>> out = adapter.forward(prompt_ids, cache=cache)   # prefill
    >>> out.logits[:, -1]                                 # next-token logits
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.config = model.config
        model_type = getattr(self.config, "model_type", "")
        self.model_type = model_type
        self.family: str
        if model_type == "gpt2":
            body = model.transformer
            self.family = "gpt2"
            self._embed, self._wpe = body.wte, body.wpe
            self._layers, self._norm, self._rotary = body.h, body.ln_f, None
        elif hasattr(model, "model") and hasattr(model.model, "layers") and hasattr(model.model, "embed_tokens"):
            body = model.model
            self.family = "llama" if model_type in LLAMA_LIKE else model_type
            self._embed, self._wpe = body.embed_tokens, None
            self._layers, self._norm = body.layers, body.norm
            self._rotary = getattr(body, "rotary_emb", None)
            if self._rotary is None:
                raise UnsupportedModelError(f"{model_type}: no rotary embedding module found at model.rotary_emb")
        else:
            raise UnsupportedModelError(
                f"model type {model_type!r} ({type(model).__name__}) is not supported: draftsmith handles "
                "Llama-style (Llama, Qwen2, Mistral) and GPT-2 decoder-only models"
            )
        self._head = model.get_output_embeddings()
        self.num_layers = len(self._layers)
        self.vocab_size, self.hidden_size = map(int, full_shape(self._head.weight))  # also where ZeRO-3 partitions it
        window = getattr(self.config, "sliding_window", None)
        layer_types = getattr(self.config, "layer_types", None)
        self._windows: list[int | None] = [
            window if (window and (layer_types is None or layer_types[i] == "sliding_attention")) else None
            for i in range(self.num_layers)
        ]
        # rotary tables by layer type where the model keeps one per type (Gemma 3: local and global bases)
        takes_type = self._rotary is not None and "layer_type" in inspect.signature(self._rotary.forward).parameters
        self._rope_types: list[str] | None = list(layer_types) if takes_type and layer_types else None
        self.max_positions = int(
            getattr(self.config, "max_position_embeddings", None) or getattr(self.config, "n_positions", 0) or 1 << 30
        )

    # -- the pieces --------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self._head.weight.dtype

    @property
    def layers(self) -> nn.ModuleList:
        return self._layers

    @property
    def rotary(self) -> nn.Module | None:
        """The model's rotary embedding module (None for GPT-2's learned positions)."""
        return self._rotary

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._embed

    @property
    def final_norm(self) -> nn.Module:
        return self._norm

    @property
    def lm_head(self) -> nn.Module:
        return self._head

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.num_layers, capacity)

    def embed(
        self,
        input_ids: torch.Tensor,  # [B, T]
        position_ids: torch.Tensor,  # [B, T]
    ) -> torch.Tensor:  # [B, T, H], the input of layer 0
        return self.add_positions(self._embed(input_ids), position_ids)

    def add_positions(
        self,
        inputs_embeds: torch.Tensor,  # [B, T, H] token embeddings, as ``embed_tokens`` returns them
        position_ids: torch.Tensor,  # [B, T]
    ) -> torch.Tensor:  # [B, T, H], the input of layer 0
        """Add learned position embeddings (GPT-2); rotary layouts apply positions inside attention."""
        if self._wpe is not None:
            return inputs_embeds + self._wpe(position_ids)
        return inputs_embeds

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._norm(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, V] float32
        return self._head(hidden).float()

    # -- masks -------------------------------------------------------------------------------
    def _layer_mask(
        self,
        past: int,
        new_visible: torch.Tensor,
        position_ids: torch.Tensor,
        window: int | None,
        dtype: torch.dtype,
        prefix: KVPrefix | None = None,
        causal: str | None = None,
    ) -> torch.Tensor | None:  # [1 or B, 1, T, (P +) past + T], a CausalBias, or None
        """The ``attention_mask`` of one layer. ``causal``: the attention kind (:data:`SDPA`, :data:`FLASH`) when
        ``new_visible`` is the causal mask and there is no prefix, so that a layer without a sliding window (any
        layer, for flash attention) needs no 4-D mask; None builds the explicit one."""
        t = new_visible.shape[0]
        if t == 1 and window is None and prefix is None:
            return None  # a single query sees the whole cache
        if causal == FLASH or (causal == SDPA and window is None):
            return causal_mask(causal, past, t)
        vis = visibility(past, new_visible, position_ids[0], window)  # [T, past + T]
        if prefix is not None:  # the prefix's columns come first, as PrefixedCache returns its keys
            seen = prefix.visible.to(vis.device)  # [B or 1, T, P]
            vis = torch.cat([seen, vis[None].expand(seen.shape[0], -1, -1)], dim=2)
        return additive_mask(vis, dtype)

    # -- forwards ----------------------------------------------------------------------------
    def forward_layers(
        self,
        hidden: torch.Tensor,  # [B, T, H]
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None = None,
        *,
        tree: torch.Tensor | None = None,  # [T, T] bool visibility among the new tokens
        start: int = 0,
        end: int | None = None,
        skip: Iterable[int] = (),
        skip_attention: Iterable[int] = (),
        skip_mlp: Iterable[int] = (),
        output_hidden_states: Iterable[int] = (),
        kv_prefix: KVPrefix | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run decoder layers ``start .. end-1`` except those in ``skip``; in the layers listed in
        ``skip_attention`` / ``skip_mlp`` only the other sublayer runs (both listed = skipped).
        Returns the hidden state after the last layer run (no final norm) and the requested
        hidden states (indices as in transformers; a skipped layer passes its input through).
        ``kv_prefix`` puts keys/values before the cache in every layer, seen only by the queries its
        ``visible`` names (BiTA's prompt; :class:`~draftsmith.inference.core.kv_cache.KVPrefix`)."""
        end = self.num_layers if end is None else end
        if not 0 <= start <= end <= self.num_layers:
            raise ValueError(f"layer range {start}..{end} is outside 0..{self.num_layers}")
        no_attn, no_mlp = frozenset(skip_attention), frozenset(skip_mlp)
        skip = frozenset(skip) | (no_attn & no_mlp)
        partial = (no_attn | no_mlp) - skip
        if partial:
            self._check_sublayers(partial)
        want = frozenset(output_hidden_states)
        t = hidden.shape[1]
        kind = self._attention_kind()
        if kind == FLASH and (tree is not None or kv_prefix is not None):
            raise UnsupportedModelError(
                f"attn_implementation {self.config._attn_implementation!r} takes no attention mask, and token trees "
                "and KV prefixes need one: load the target with attn_implementation='sdpa' (or 'eager')"
            )
        causal = kind if tree is None and kv_prefix is None else None  # a causal block: no 4-D mask under `kind`
        # a model loaded with a registered tree attention (draftsmith.kernels.tree_attention) gets the tree of a
        # tree step as an attention keyword in the layers without a sliding window, where every prefix key is
        # visible and the one [1, 1, T, L] mask holds for every batch row: its kernel replaces the 4-D mask there
        kernel_tree = tree is not None and kv_prefix is None and self._tree_attention()
        layer_cache = PrefixedCache(cache, kv_prefix) if kv_prefix is not None else cache
        if tree is None:
            tree = torch.ones(t, t, dtype=torch.bool, device=hidden.device).tril()
        else:
            tree = tree.to(hidden.device)
        rope = self._rope(hidden, position_ids)
        states: dict[int, torch.Tensor] = {}
        if start in want:
            states[start] = hidden
        with decode_attention():
            hidden = self._layer_loop(hidden, position_ids, cache, layer_cache, tree, kernel_tree, rope, start, end,
                                      skip, partial, no_attn, no_mlp, kv_prefix, want, states, causal)
        return hidden, states

    def _rope(self, hidden: torch.Tensor, position_ids: torch.Tensor):
        """The rotary ``(cos, sin)`` of ``position_ids`` (None: learned positions), or a dict of them by layer type
        where the model keeps a table per type."""
        if self._rotary is None:
            return None
        if self._rope_types is None:
            return self._rotary(hidden, position_ids)
        return {kind: self._rotary(hidden, position_ids, kind) for kind in dict.fromkeys(self._rope_types)}

    def _layer_loop(self, hidden, position_ids, cache, layer_cache, tree, kernel_tree, rope, start, end, skip, partial,
                    no_attn, no_mlp, kv_prefix, want, states, causal=None) -> torch.Tensor:
        masks: dict[tuple[int, int | None], torch.Tensor | None] = {}
        for i in range(start, end):
            if i not in skip:
                past = cache.get_seq_length(i) if cache is not None else 0
                key = (past, self._windows[i])
                if key not in masks:
                    masks[key] = self._layer_mask(past, tree, position_ids, self._windows[i], hidden.dtype, kv_prefix,
                                                  causal)
                layer_tree = tree if kernel_tree and self._windows[i] is None else None
                layer_rope = rope[self._rope_types[i]] if isinstance(rope, dict) else rope
                if i in partial:
                    hidden = self._run_sublayers(
                        i, hidden, masks[key], position_ids, layer_cache, layer_rope, attn=i not in no_attn,
                        mlp=i not in no_mlp, tree=layer_tree,
                    )
                else:
                    hidden = self._run_layer(i, hidden, masks[key], position_ids, layer_cache, layer_rope, layer_tree)
            if i + 1 in want:
                states[i + 1] = hidden
        return hidden

    def _attention_kind(self) -> str | None:
        """How the model's attention runs a causal block without a 4-D mask (:data:`SDPA`, :data:`FLASH`), None
        when it needs the explicit one; a registered tree attention delegates such calls to ``sdpa``."""
        implementation = getattr(self.config, "_attn_implementation", None)
        return SDPA if tree_attention_backend(implementation) is not None else causal_attention_kind(implementation)

    def _tree_attention(self) -> bool:
        """Whether the model's attention implementation is a registered tree attention, which takes the tree."""
        return tree_attention_backend(getattr(self.config, "_attn_implementation", None)) is not None

    def _attention_kwargs(self, mask, position_ids, cache, rope, tree=None) -> dict:
        kwargs = {"attention_mask": mask, cache_keyword(self._layers[0]): cache, "use_cache": cache is not None}
        if self.family != "gpt2":
            kwargs.update(position_ids=position_ids, position_embeddings=rope)
        if tree is not None:  # reaches the attention function through the layer's and the attention's **kwargs
            kwargs[TREE_KWARG] = tree
        return kwargs

    def _run_layer(self, i, hidden, mask, position_ids, cache, rope, tree=None):
        out = self._layers[i](hidden, **self._attention_kwargs(mask, position_ids, cache, rope, tree))
        return out[0] if isinstance(out, tuple) else out

    def _check_sublayers(self, layers: Iterable[int]) -> None:
        names = SUBLAYER_LAYOUTS.get(self.model_type)
        if names is None:
            raise UnsupportedModelError(
                f"skipping only the attention or only the MLP of a layer is not supported for {self.model_type!r} "
                f"(supported: {', '.join(SUBLAYER_LAYOUTS)}); skip whole layers instead"
            )
        bad = sorted(i for i in layers if not 0 <= i < self.num_layers)
        if bad:
            raise ConfigError(f"sublayer skip lists name layers {bad} outside 0..{self.num_layers - 1}")

    def _run_sublayers(self, i, hidden, mask, position_ids, cache, rope, *, attn: bool, mlp: bool, tree=None):
        """``h + post1(attn(pre1(h)))`` and/or ``h + post2(mlp(pre2(h)))``: the layer's own submodules, either half
        alone (a norm the layout lacks is the identity)."""
        pre1, attention, post1, pre2, ffn, post2 = (getattr(self._layers[i], name) if name else nn.Identity()
                                                    for name in SUBLAYER_LAYOUTS[self.model_type])
        if attn:
            kwargs = self._attention_kwargs(mask, position_ids, cache, rope, tree)
            hidden = hidden + post1(attention(pre1(hidden), **kwargs)[0])
        if mlp:
            hidden = hidden + post2(ffn(pre2(hidden)))
        return hidden

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        cache: KVCache | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,  # [B, T, H] instead of input_ids (token embeddings)
        position_ids: torch.Tensor | None = None,  # [B, T]; default: cached tokens + arange(T)
        tree: torch.Tensor | None = None,  # [T, T] bool; default: causal
        skip_layers: Iterable[int] = (),
        skip_attention: Iterable[int] = (),
        skip_mlp: Iterable[int] = (),
        exit_layer: int | None = None,  # stop after this many layers (early exit), then norm + head
        output_hidden_states: Iterable[int] = (),
        compute_logits: bool | slice = True,
        kv_prefix: KVPrefix | None = None,
    ) -> AdapterOutput:
        """Embed, run the layers (minus ``skip_layers``, up to ``exit_layer``), norm, LM head.

        ``inputs_embeds`` are token embeddings as :attr:`embed_tokens` returns them (GPT-2's
        position embeddings are still added), as in transformers. ``compute_logits`` may be a slice
        of positions (e.g. ``slice(-1, None)`` for the last token only) to save the ``[T, V]`` head
        matmul during prefill."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ConfigError("give exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            if input_ids.dim() == 1:
                input_ids = input_ids[None]
            t, device = input_ids.shape[1], input_ids.device
        else:
            if inputs_embeds.dim() == 2:
                inputs_embeds = inputs_embeds[None]
            t, device = inputs_embeds.shape[1], inputs_embeds.device
        if position_ids is None:
            past = self._cached_length(cache, exit_layer, frozenset(skip_layers) | frozenset(skip_attention))
            position_ids = torch.arange(past, past + t, device=device)[None]
        elif position_ids.dim() == 1:
            position_ids = position_ids[None]
        if input_ids is not None:
            hidden = self.embed(input_ids, position_ids)
        else:
            hidden = self.add_positions(inputs_embeds, position_ids)
        return self.forward_from(
            hidden,
            0,
            cache,
            position_ids=position_ids,
            tree=tree,
            end=exit_layer,
            skip_layers=skip_layers,
            skip_attention=skip_attention,
            skip_mlp=skip_mlp,
            output_hidden_states=output_hidden_states,
            compute_logits=compute_logits,
            kv_prefix=kv_prefix,
        )

    def _cached_length(self, cache: KVCache | None, end: int | None, no_attention: frozenset[int]) -> int:
        """Tokens already cached, read from the first layer this forward runs attention in."""
        if cache is None:
            return 0
        end = self.num_layers if end is None else end
        first = next((i for i in range(end) if i not in no_attention), 0)
        return cache.get_seq_length(first)

    def forward_from(
        self,
        hidden: torch.Tensor,  # [B, T, H] the input of decoder layer `start`
        start: int,
        cache: KVCache | None = None,
        *,
        position_ids: torch.Tensor,  # [B, T] absolute positions of the T tokens
        tree: torch.Tensor | None = None,  # [T, T] bool; default: causal
        end: int | None = None,
        skip_layers: Iterable[int] = (),
        skip_attention: Iterable[int] = (),
        skip_mlp: Iterable[int] = (),
        output_hidden_states: Iterable[int] = (),
        compute_logits: bool | slice = True,
        kv_prefix: KVPrefix | None = None,
    ) -> AdapterOutput:
        """Layers ``start .. end-1`` from given hidden states, then norm and LM head.

        ``forward_from(h, E, cache, ...)`` continues a forward whose layers ``0 .. E-1`` already
        ran (their keys/values in ``cache``): the early-exit draft hands its layer-E states to the
        verification, which then never re-runs the first E layers. Layers before ``start`` are not
        touched, so their cache lengths do not affect the masks here."""
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        hidden, states = self.forward_layers(
            hidden,
            position_ids,
            cache,
            tree=tree,
            start=start,
            end=end,
            skip=skip_layers,
            skip_attention=skip_attention,
            skip_mlp=skip_mlp,
            output_hidden_states=output_hidden_states,
            kv_prefix=kv_prefix,
        )
        last = self.norm(hidden)
        logits = None
        if compute_logits is not False:
            picked = last if compute_logits is True else last[:, compute_logits]
            logits = self.logits(picked)
        return AdapterOutput(logits=logits, last_hidden=last, hidden_states=states)
