"""What a method's training step holds, for ``draftsmith memory``: each method's spec maps its variants to a
``shape(target, draft) -> MemoryShape`` (built on the meta device, with the method's default settings);
:mod:`draftsmith.launch.memory_plan` turns a shape into bytes per GPU by sharding mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn


@dataclass(frozen=True)
class MemoryShape:
    """One method's trained module and the step terms that depend on the method."""

    module: nn.Module  # the trained module, on the meta device
    trained_layers: int  # decoder layers run with gradient in a step (a head: 1; a fine-tuned target: all)
    kept_features: int  # [tokens, H] hidden states of the target kept for the loss
    loss_vocab: int  # rows of the LM head the chunked loss scores
    loss_calls: int = 1  # chunked-loss calls a step makes (EAGLE-3: one per unrolled step; Medusa: one per head)
    unrolled: int = 0  # EAGLE-3: steps of the training-time test, each keeping its [tokens, H] input (recomputed)
    frozen_copies: int = 1  # copies of the frozen target held (Medusa-2: the target and the copy under its adapter)
    extra_trained: int = 0  # trained parameters outside ``module`` (Medusa-2's LoRA adapter)
    trained_config: Any = None  # the config whose layers train (None: the target's; DistillSpec: the draft's)
    trained_hidden: int | None = None  # the trained layers' input width when not their config's (EAGLE-3: 2 H)
    frozen_grad_layers: int = 0  # frozen decoder layers a gradient passes through (BiTA's prompt reaches every layer)
    chunk_tensors: int = 4  # float32 [C, V] tensors a loss chunk holds at once (the fused Triton divergence: 2)
    loss_rows: int = 0  # rows the loss scores per micro-batch, 0 = every token (BiTA: its mask tokens only)
    loss_head_trained: bool = False  # the scored LM head trains: each call keeps its float32 [V, H] gradient


def meta_model(config):
    """The causal LM of ``config`` on the meta device (no memory, exact parameter shapes)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def lora_parameters(target, rank: int) -> int:
    """Parameters of a LoRA adapter of rank ``rank`` on every linear layer of the decoder (``all-linear``)."""
    head = target.get_output_embeddings()
    return sum(rank * (m.in_features + m.out_features) for m in target.modules()
               if isinstance(m, nn.Linear) and m is not head)


__all__ = ["MemoryShape", "lora_parameters", "meta_model"]
