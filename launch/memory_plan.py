"""Per-GPU training memory of a recipe, by sharding mode, from the target's config (``draftsmith memory``).

Parameters are counted, not guessed: the target and the method's trained module are built on the meta device from
the target's config (and the draft's, for DistillSpec), with the method's default settings. Bytes per GPU:

- **frozen weights**: the target (and Medusa-2's frozen copy under its adapter) in the frozen dtype. ZeRO-3
  partitions them (``/ N``, plus one decoder layer gathered at a time); DDP, ZeRO-2 and FSDP2 hold them whole
  (FSDP2, accelerate's on GPUs and draftsmith's on CPU processes, shards the trained module only).
- **trained state**: float32 master weights, float32 gradients and AdamW's two moments, 16 bytes a parameter
  (:mod:`draftsmith.common.precision`). DDP: whole; ZeRO-2: weights whole, the rest ``/ N``; ZeRO-3 and FSDP2: all
  ``/ N``; ZeRO-3 with optimizer offload: weights and gradients ``/ N`` on the GPU, the moments in host memory.
  FSDP2 also holds its root unit (a head; a model's embeddings and LM head) and one decoder layer whole during a step:
  weights, gradient and the reduce-scatter's copy, 12 bytes a parameter (:func:`fsdp_gathered`).
- **step**: what one step's forward and backward hold for ``tokens`` tokens per GPU (the micro-batch): the frozen
  target's forward (one layer's working set and the hidden states the method keeps), the trained module's saved
  activations (:func:`layer_activation_bytes` per decoder layer with gradient) and the chunked loss's logits
  (:func:`draftsmith.kernels.reference.resolve_chunk_size` rows, as the loss chunks them).

The step is an estimate from the dominant terms; docs/LAUNCHING.md (memory table) sets it against measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.trainers.memory import lora_parameters, meta_model

MODES = ("ddp", "zero2", "zero3", "zero3-offload", "fsdp2")
TRAINED_BYTES = 16  # float32 weights + float32 gradients + AdamW's two float32 moments, per trained parameter
GATHERED_BYTES = 12  # FSDP2, per parameter it holds whole: float32 weights, gradient and the reduce-scatter's copy
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
def memory_variants() -> dict:
    """Every trained method's variants (``draftsmith memory``'s methods) -> their ``shape(target, draft)``."""
    from draftsmith.common.registry import REGISTRY

    return {variant: shape for name in REGISTRY.names(trained=True) for variant, shape in REGISTRY.get(name).memory.items()}


def needs_draft(variant: str) -> bool:
    """The variant trains a separate draft model (its config is needed: ``--draft``)."""
    from draftsmith.common.registry import REGISTRY

    return any(variant in REGISTRY.get(n).memory and "draft" in REGISTRY.get(n).models
               for n in REGISTRY.names(trained=True))
_LLAMA3 = dict(num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072)
PRESETS = {  # the published config.json shapes, for planning without the weights
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         head_dim=64, tie_word_embeddings=True, **_LLAMA3),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         head_dim=128, tie_word_embeddings=False, **_LLAMA3),
    "llama-3.1-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                          head_dim=128, tie_word_embeddings=False, **_LLAMA3),
}


@dataclass(frozen=True)
class Counts:
    """Parameters of one plan: the frozen target (and frozen copies), the trained module, the target's largest
    decoder layer (what ZeRO-3 gathers at a time), and the shapes the step terms need."""

    frozen: int
    trained: int
    layer: int
    hidden: int
    intermediate: int
    vocab: int
    layers: int
    attention: int  # width of q, k and v together: (heads + 2 kv heads) x head dim
    trained_layers: int  # decoder layers run with gradient in a step (a head: 1; a fine-tuned target: all)
    trained_hidden: int
    trained_intermediate: int
    kept_features: int  # [tokens, H] hidden states of the target kept for the loss
    loss_vocab: int  # rows of the LM head the chunked loss scores
    frozen_grad_layers: int = 0  # frozen decoder layers a gradient passes through (BiTA's prompt reaches every layer)
    unrolled: int = 0  # EAGLE-3: steps of the training-time test, each keeping its [tokens, H] input (recomputed)
    loss_calls: int = 1  # chunked-loss calls a step makes (EAGLE-3: one per unrolled step; Medusa: one per head)
    loss_head_trained: bool = False  # the scored LM head trains: each call keeps its float32 [V, H] gradient
    chunk_tensors: int = 4  # float32 [C, V] tensors a loss chunk holds at once (the fused Triton divergence: 2)
    loss_rows: int = 0  # rows the loss scores per micro-batch, 0 = every token (BiTA: its mask tokens only)
    gathered: int = 0  # trained parameters FSDP2 holds whole at once: its root unit and its largest layer unit


def _numel(module, trainable: bool | None = None) -> int:
    return sum(p.numel() for p in module.parameters() if trainable is None or p.requires_grad == trainable)


def _shape(config) -> dict:
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    return {"hidden": int(config.hidden_size), "intermediate": int(config.intermediate_size),
            "vocab": int(config.vocab_size), "layers": int(config.num_hidden_layers),
            "attention": (heads + 2 * kv) * head_dim}


def trained_module(method: str, target, draft=None):
    """The :class:`~draftsmith.trainers.memory.MemoryShape` of ``method`` (a variant its spec declares) on the meta
    ``target``, with the method's default settings; built from the drafters' own classes."""
    import torch

    variants = memory_variants()
    if method not in variants:
        raise ValueError(f"method {method!r} is unknown: choose one of {', '.join(variants)}")
    with torch.device("meta"):
        return variants[method](target, draft)


def fsdp_gathered(module) -> int:
    """Trained parameters FSDP2 holds whole at once in a step: the root unit's (every trained parameter outside the
    decoder-layer units; a root is not resharded between its forward and backward) and the largest unit's, as
    :func:`draftsmith.trainers.cpu_fsdp.shard_units` (and accelerate's transformer-based wrap) makes them."""
    from draftsmith.trainers.cpu_fsdp import shard_units

    units = shard_units(module, {})
    inside = {id(p) for unit in units for p in unit.parameters()}
    root = sum(p.numel() for p in module.parameters() if p.requires_grad and id(p) not in inside)
    return root + max((_numel(unit, True) for unit in units), default=0)


def count(method: str, target_config, draft_config=None) -> Counts:
    """The :class:`Counts` of ``method`` on a target of ``target_config`` (a transformers config)."""
    target = meta_model(target_config)
    draft = meta_model(draft_config) if draft_config is not None else None
    m = trained_module(method, target, draft)
    shape = _shape(target_config)
    layer = max(_numel(block) for block in target.model.layers) if hasattr(target, "model") else 0
    inner = _shape(m.trained_config or target_config)
    return Counts(frozen=m.frozen_copies * _numel(target), trained=_numel(m.module) + m.extra_trained, layer=layer,
                  **shape, trained_layers=m.trained_layers, gathered=fsdp_gathered(m.module),
                  trained_hidden=m.trained_hidden or inner["hidden"], trained_intermediate=inner["intermediate"],
                  kept_features=m.kept_features, loss_vocab=m.loss_vocab, unrolled=m.unrolled, loss_calls=m.loss_calls,
                  frozen_grad_layers=m.frozen_grad_layers, chunk_tensors=m.chunk_tensors, loss_rows=m.loss_rows,
                  loss_head_trained=m.loss_head_trained)


def layer_activation_bytes(tokens: int, hidden: int, intermediate: int, attention: int, act_bytes: int) -> int:
    """What one decoder layer with gradient saves for its backward, per micro-batch: the two norms' inputs and the
    residual (float32), q/k/v and the attention output, and the MLP's gate, up and activated product (in the
    activation dtype); memory-efficient attention keeps no ``T x T`` scores."""
    return tokens * (3 * hidden * 4 + (attention + hidden) * act_bytes + 3 * intermediate * act_bytes)


def step_bytes(c: Counts, tokens: int, act_bytes: int, chunk_rows: int) -> dict[str, int]:
    """The step's terms (bytes): the frozen target's forward, the trained module's activations, the loss's chunk."""
    target = tokens * (2 * c.hidden + 2 * c.intermediate + c.attention) * act_bytes  # one layer's working set
    target += c.kept_features * tokens * c.hidden * act_bytes
    trained = c.trained_layers * layer_activation_bytes(tokens, c.trained_hidden, c.trained_intermediate,
                                                        c.attention, act_bytes)
    trained += c.unrolled * tokens * c.hidden * 4  # the recomputed unroll keeps each step's float32 input
    # a frozen layer's products need no saved inputs for weight gradients: q/k/v, the attention output and the
    # MLP's activated product remain
    trained += c.frozen_grad_layers * tokens * (c.attention + c.hidden + c.intermediate) * act_bytes
    # one chunk's logits, the teacher's distribution and their gradients (float32), a trained head cast once per
    # call; kept by every call until the backward: the hidden states' gradient, and the head's float32 gradient when
    # it trains (kernels.reference)
    scored = min(tokens, c.loss_rows) if c.loss_rows else tokens
    loss = c.chunk_tensors * min(chunk_rows, scored) * c.loss_vocab * 4
    if c.loss_head_trained and act_bytes < 4:  # float32 master weights cast for the products
        loss += c.loss_vocab * c.hidden * act_bytes
    loss += c.loss_calls * (tokens * c.hidden * 4 + (c.loss_vocab * c.hidden * 4 if c.loss_head_trained else 0))
    return {"target_forward": target, "trained_activations": trained, "loss_chunk": loss}


def plan(c: Counts, mode: str, gpus: int, tokens: int, frozen_bytes: int, act_bytes: int,
         chunk_rows: int) -> dict[str, int]:
    """Bytes per GPU by component for ``mode`` on ``gpus`` GPUs (module docstring), and their ``total``."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is unknown: choose one of {', '.join(MODES)}")
    n = max(1, gpus) if mode != "ddp" else 1
    if mode.startswith("zero3"):
        frozen = c.frozen * frozen_bytes // n + c.layer * frozen_bytes
    else:
        frozen = c.frozen * frozen_bytes
    p = c.trained
    trained = {"ddp": TRAINED_BYTES * p, "zero2": 4 * p + (TRAINED_BYTES - 4) * p // n, "zero3": TRAINED_BYTES * p // n,
               "zero3-offload": 8 * p // n, "fsdp2": TRAINED_BYTES * p // n + GATHERED_BYTES * c.gathered}[mode]
    out = {"frozen_weights": frozen, "trained_state": trained, **step_bytes(c, tokens, act_bytes, chunk_rows)}
    out["total"] = sum(out.values())
    return out


__all__ = ["Counts", "MODES", "PRESETS", "count", "fsdp_gathered", "layer_activation_bytes", "lora_parameters",
           "memory_variants", "meta_model", "needs_draft", "plan", "step_bytes", "trained_module"]
