"""Medusa-1/2 declared: config, trainer and heads; the static-tree proposer; the ``vllm-medusa`` export."""

from __future__ import annotations

from functools import partial

from draftsmith.common.eval_options import defaults_from
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.artefacts.medusa import export_medusa_artefact
from draftsmith.inference.drafters.medusa import MedusaHeads
from draftsmith.inference.methods.medusa import MEDUSA_OPTIONS, medusa_proposer, vllm_engine
from draftsmith.trainers.medusa.trainer import MedusaConfig, MedusaTrainer, build_heads
from draftsmith.trainers.memory import MemoryShape, lora_parameters


def memory_shape(target, draft=None, medusa2: bool = False) -> MemoryShape:
    """The heads (default settings); Medusa-2 also runs every target layer with gradient through its LoRA adapter over
    a frozen copy of the target, and scores the target's own loss beside the heads'."""
    c, cfg = MedusaConfig(), target.config
    heads = MedusaHeads(int(cfg.hidden_size), int(cfg.vocab_size), c.heads, c.head_layers, c.shared_lm_head)
    return MemoryShape(heads, int(cfg.num_hidden_layers) if medusa2 else 0, 1, int(cfg.vocab_size),
                       loss_calls=c.heads + (1 if medusa2 else 0), frozen_copies=2 if medusa2 else 1,
                       extra_trained=lora_parameters(target, c.lora_r) if medusa2 else 0)


SPEC = MethodSpec(name="medusa", summary="Medusa-1 heads on the frozen target, static token tree (Cai et al. 2024)",
                  proposer=medusa_proposer, artefact_kind="heads", config=MedusaConfig, trainer=MedusaTrainer,
                  trainable=build_heads, export_formats={"vllm-medusa": export_medusa_artefact},
                  engine_configs={"vllm": vllm_engine},
                  eval_options=defaults_from(MedusaConfig, MEDUSA_OPTIONS, ("tree", "tree_nodes")), calibrated_tree=True,
                  memory={"medusa": memory_shape, "medusa2": partial(memory_shape, medusa2=True)},
                  default_config="medusa_tiny")
