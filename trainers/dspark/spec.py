"""DSpark declared: config, trainer and draft; the Markov-chain proposer; the ``vllm-dspark`` export."""

from __future__ import annotations

from draftsmith.common.registry import MethodSpec
from draftsmith.inference.artefacts.dspark import export_dspark_artefact
from draftsmith.inference.drafters.dspark import DSparkDraft
from draftsmith.inference.methods.dspark import OPTIONS, dspark_proposer, vllm_engine
from draftsmith.trainers.dspark.trainer import DSparkConfig, DSparkTrainer, build_dspark
from draftsmith.trainers.memory import MemoryShape


def memory_shape(target, draft=None) -> MemoryShape:
    """The draft's layers and heads (default settings) over the target's kept hidden states; one loss call per block
    slot (every slot drafts)."""
    c = DSparkConfig()
    block = DSparkDraft.for_target(target, c.draft_layers, block_size=c.block_size, markov_rank=c.markov_rank)
    return MemoryShape(block, c.draft_layers, len(block.hidden_layers), int(target.config.vocab_size),
                       loss_calls=c.block_size)


SPEC = MethodSpec(name="dspark", summary="DFlash's block draft with next-token queries, a low-rank Markov head over "
                  "the token before each slot and a confidence head (DSpark, deepseek-ai/DeepSpec)",
                  proposer=dspark_proposer, artefact_kind="heads", config=DSparkConfig, trainer=DSparkTrainer,
                  trainable=build_dspark, export_formats={"vllm-dspark": export_dspark_artefact},
                  engine_configs={"vllm": vllm_engine}, eval_options=OPTIONS, calibrated_tree=False,
                  memory={"dspark": memory_shape}, default_config="dspark_tiny")
