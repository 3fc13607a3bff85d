"""Drafts made of a target's own layers: a shallow draft that starts as the target's first layers (the zoo's
draft for an imported real target, :func:`draft_from_target`), and a draft deepened with the target's next layers
by block expansion (DistillSpec's ``draft_layers``, :func:`grow_layers`). Both copy weights; neither trains."""

from __future__ import annotations

import torch
import transformers

from draftsmith.common.errors import ConfigError
from draftsmith.data.zoo import ModelSpec


def model_with_layers(config: transformers.PretrainedConfig, layers: int) -> transformers.PreTrainedModel:
    """A freshly initialised model of ``config``'s architecture with ``layers`` decoder layers (unquantized)."""
    settings = {k: v for k, v in config.to_dict().items() if k != "quantization_config"}
    return transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**{**settings, "num_hidden_layers": layers}))


def draft_from_target(target: transformers.PreTrainedModel, m: ModelSpec) -> transformers.PreTrainedModel:
    """A ``m.layers``-layer model of the target's architecture and width holding the target's embedding (tied
    LM head), first ``m.layers`` decoder layers and final norm; the embedding is frozen when
    ``m.freeze_embeddings``."""
    cfg = target.config
    if (m.hidden, m.intermediate, m.heads, m.kv_heads) != (cfg.hidden_size, cfg.intermediate_size,
                                                          cfg.num_attention_heads, cfg.num_key_value_heads):
        raise ConfigError("draft.init_from_target needs the draft's hidden/intermediate/heads/kv_heads to equal the "
                          f"target's ({cfg.hidden_size}/{cfg.intermediate_size}/{cfg.num_attention_heads}/"
                          f"{cfg.num_key_value_heads})")
    draft = model_with_layers(cfg, m.layers)
    keep = {}
    for key, value in target.state_dict().items():
        parts = key.split(".")
        if "layers" in parts and int(parts[parts.index("layers") + 1]) >= m.layers:
            continue
        keep[key] = value.detach().clone()
    draft.load_state_dict(keep, strict=True)
    draft.tie_weights()
    if m.freeze_embeddings:
        draft.get_input_embeddings().weight.requires_grad_(False)
    return draft


# The projections that write a Llama-style decoder layer's two sublayers back into the residual stream.
RESIDUAL_WRITERS = ("self_attn.o_proj", "mlp.down_proj")


def grow_layers(draft: transformers.PreTrainedModel, target: transformers.PreTrainedModel,
                layers: int) -> transformers.PreTrainedModel:
    """The draft deepened to ``layers`` decoder layers by block expansion (LLaMA Pro, Wu et al. 2024, Sec. 2.2):
    new layer i (``draft layers <= i < layers``) is a copy of the target's layer i with the projections that
    write into the residual stream zeroed (:data:`RESIDUAL_WRITERS`), so each new block starts as the identity,
    h_{i+1} = h_i + 0, and the grown draft computes exactly the logits of the draft it grew from. Everything
    else (embedding, earlier layers, final norm, LM head, ``config.draft_vocab``) is the draft's; which
    parameters train is the caller's choice (all of them here)."""
    have, cfg = draft.config.num_hidden_layers, draft.config
    if layers <= have:
        raise ConfigError(f"draft_layers={layers} does not grow the draft, which has {have} layers: pass more than "
                          f"{have}, or leave draft_layers unset")
    if layers > target.config.num_hidden_layers:
        raise ConfigError(f"draft_layers={layers} exceeds the target's {target.config.num_hidden_layers} layers, "
                          "whose layers the new ones copy: pass at most that many")
    shape = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    if [getattr(cfg, k) for k in shape] != [getattr(target.config, k) for k in shape]:
        raise ConfigError("draft_layers grows the draft with the target's own layers, so the draft needs the "
                          f"target's {'/'.join(shape)}; this draft has a different shape: leave draft_layers unset")
    grown = model_with_layers(cfg, layers)
    state = {k: v.detach().clone() for k, v in draft.state_dict().items()}
    prefix = layer_prefix(target)
    for key, value in target.state_dict().items():
        if not key.startswith(prefix):
            continue
        index, name = key[len(prefix):].split(".", 1)
        if have <= int(index) < layers:
            zero = any(name.startswith(w + ".") for w in RESIDUAL_WRITERS)
            state[key] = torch.zeros_like(value) if zero else value.detach().clone()
    missing = [f"{prefix}{have}.{w}.weight" for w in RESIDUAL_WRITERS if f"{prefix}{have}.{w}.weight" not in state]
    if missing:
        raise ConfigError(f"draft_layers needs Llama-style decoder layers ({', '.join(RESIDUAL_WRITERS)}); the target "
                          f"has no {missing[0]}: leave draft_layers unset")
    grown.load_state_dict(state, strict=True)
    grown.tie_weights()
    return grown


def layer_prefix(model: transformers.PreTrainedModel) -> str:
    """The state-dict prefix of ``model``'s decoder layers, e.g. ``"model.layers."``."""
    for key in model.state_dict():
        parts = key.split(".")
        if "layers" in parts:
            at = parts.index("layers")
            if parts[at + 1].isdigit():
                return ".".join(parts[:at + 1]) + "."
    raise ConfigError(f"{type(model).__name__} has no numbered decoder layers: draft_layers cannot grow it")


__all__ = ["RESIDUAL_WRITERS", "draft_from_target", "grow_layers", "layer_prefix", "model_with_layers"]
