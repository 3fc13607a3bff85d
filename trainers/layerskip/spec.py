"""LayerSkip declared: config, trainer and the adapted target; it drafts by early exit (``early-exit``'s builder)."""

from __future__ import annotations

from draftsmith.common.eval_options import defaults_from
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.methods.early_exit import OPTIONS, early_exit_proposer
from draftsmith.trainers.layerskip.trainer import LayerSkipConfig, LayerSkipTrainer, build_layerskip_model
from draftsmith.trainers.memory import MemoryShape, meta_model


def memory_shape(target, draft=None) -> MemoryShape:
    """The whole target trains; the rotational curriculum scores every R-th exit and the last layer's."""
    layers = int(target.config.num_hidden_layers)
    return MemoryShape(meta_model(target.config), layers, 0, int(target.config.vocab_size),
                       loss_calls=-(-layers // LayerSkipConfig().rotation) + 1, loss_head_trained=True)


SPEC = MethodSpec(name="layerskip", summary="layer dropout and early-exit losses so the target drafts with its first "
                  "layers (LayerSkip, Elhoushi et al. 2024)", proposer=early_exit_proposer,
                  artefact_kind="adapted_target", config=LayerSkipConfig, trainer=LayerSkipTrainer,
                  trainable=build_layerskip_model, commands={"exit-layer": "draftsmith.launch.exit_cli"},
                  eval_options=defaults_from(LayerSkipConfig, OPTIONS, ("draft_length",)), memory={"layerskip": memory_shape}, default_config="layerskip_tiny")
