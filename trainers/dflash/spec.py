"""DFlash declared: config, trainer and block draft; the block proposer; the ``vllm-dflash`` export."""

from __future__ import annotations

from draftsmith.common.registry import MethodSpec
from draftsmith.inference.artefacts.dflash import export_dflash_artefact
from draftsmith.inference.drafters.dflash import DFlashDraft
from draftsmith.inference.methods.dflash import OPTIONS, dflash_proposer, vllm_engine
from draftsmith.trainers.dflash.trainer import DFlashConfig, DFlashTrainer, build_dflash
from draftsmith.trainers.memory import MemoryShape


def memory_shape(target, draft=None) -> MemoryShape:
    """The draft's layers (default settings) over the target's kept hidden states; one loss call per block slot (the
    anchor slot drafts nothing)."""
    c = DFlashConfig()
    block = DFlashDraft.for_target(target, c.draft_layers, block_size=c.block_size)
    return MemoryShape(block, c.draft_layers, len(block.hidden_layers), int(target.config.vocab_size),
                       loss_calls=c.block_size - 1)


SPEC = MethodSpec(name="dflash", summary="a block-diffusion draft that fills a block of mask tokens in one forward "
                  "from the target's hidden states (DFlash, Chen et al. 2026)", proposer=dflash_proposer,
                  artefact_kind="heads", config=DFlashConfig, trainer=DFlashTrainer, trainable=build_dflash,
                  export_formats={"vllm-dflash": export_dflash_artefact}, engine_configs={"vllm": vllm_engine},
                  eval_options=OPTIONS, calibrated_tree=True, memory={"dflash": memory_shape},
                  default_config="dflash_tiny")
