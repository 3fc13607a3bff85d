"""CLLM declared: config, trainer and the adapted target; it drafts by Jacobi decoding (``jacobi``'s builder)."""

from __future__ import annotations

from draftsmith.common.registry import MethodSpec
from draftsmith.inference.methods.jacobi import OPTIONS, jacobi_proposer
from draftsmith.trainers.cllm.trainer import CllmConfig, CllmTrainer, build_cllm_model
from draftsmith.trainers.memory import MemoryShape, meta_model


def memory_shape(target, draft=None) -> MemoryShape:
    """Two passes with gradient through the whole target: the Jacobi state (consistency) and the fixed answer (AR)."""
    layers = int(target.config.num_hidden_layers)
    return MemoryShape(meta_model(target.config), 2 * layers, 0, int(target.config.vocab_size), loss_calls=2,
                       loss_head_trained=True)


SPEC = MethodSpec(name="cllm", summary="consistency training on the target's Jacobi trajectories so Jacobi decoding "
                  "converges in few steps (CLLM, Kou et al. 2024)", proposer=jacobi_proposer,
                  artefact_kind="adapted_target", config=CllmConfig, trainer=CllmTrainer, trainable=build_cllm_model,
                  data_commands={"jacobi": "draftsmith.launch.jacobi_cli"}, eval_options=OPTIONS,
                  memory={"cllm": memory_shape}, default_config="cllm_tiny")
