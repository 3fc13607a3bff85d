"""DistillSpec declared: its config, trainer and draft; it drafts as any separate draft model does."""

from __future__ import annotations

from draftsmith.common.eval_options import defaults_from
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.methods.draft_model import OPTIONS, draft_model_proposer, vllm_engine
from draftsmith.trainers.distillspec.trainer import DistillSpecConfig, DistillSpecTrainer, build_draft
from draftsmith.trainers.memory import MemoryShape


def memory_shape(target, draft) -> MemoryShape:
    """The draft trains whole, its LM head included; the fused divergence holds two [C, V] tensors per chunk."""
    if draft is None:
        raise ValueError("distillspec trains a draft model: give its config (--draft)")
    return MemoryShape(draft, int(draft.config.num_hidden_layers), 1, int(target.config.vocab_size),
                       trained_config=draft.config, chunk_tensors=2, loss_head_trained=True)


SPEC = MethodSpec(name="distillspec", summary="a draft model distilled into its target (Zhou et al. 2023)",
                  proposer=draft_model_proposer, artefact_kind="draft_model", models=("target", "draft"),
                  config=DistillSpecConfig, trainer=DistillSpecTrainer, trainable=build_draft,
                  eval_options=defaults_from(DistillSpecConfig, OPTIONS, ("draft_length",)),
                  engine_configs={"vllm": vllm_engine}, memory={"distillspec": memory_shape},
                  default_config="distillspec_tiny")
