"""DSpark's block draft at decoding time: the proposer builder, the decoding options and vLLM's ``dspark``."""

from __future__ import annotations

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import CONFIDENCE, DRAFT_LENGTH
from draftsmith.inference.engines.vllm import EngineMethod, EngineSetup, need_artefact
from draftsmith.inference.methods.context import ProposerContext

OPTIONS = (DRAFT_LENGTH, CONFIDENCE.default_to(0.0))


def dspark_proposer(ctx: ProposerContext):
    """A DSpark draft from a ``heads`` artefact: each step one draft forward over ``draft_length`` next-token queries
    (0: the block, ``block_size``) and the Markov head's pass over them, verified as a chain; ``--draft-confidence
    P`` stops a draft where the confidence head's running product falls below ``P``."""
    from draftsmith.inference.artefacts.dspark import load_dspark_draft
    from draftsmith.inference.proposers.dspark import DSparkProposer

    if ctx.artefact_dir is None:
        raise ConfigError("dspark runs from its trained draft: pass --artefact DIR (from draftsmith train dspark)")
    target = ctx.target_model
    draft = load_dspark_draft(ctx.artefact_dir, target).to(target.device, target.dtype)
    length = int(ctx.option("draft_length") or 0) or draft.block_size
    return DSparkProposer(draft, target.get_input_embeddings(), target.get_output_embeddings(), length=length,
                          confidence_threshold=float(ctx.option("confidence_threshold") or 0.0))


def vllm_engine(setup: EngineSetup) -> EngineMethod:
    """A DSpark draft (``vllm-dspark`` export, method ``dspark``): ``num_speculative_tokens`` next-token queries, at
    most ``block_size``, every one verified (vLLM uses the confidence head only under its adaptive verification)."""
    from draftsmith.inference.artefacts.dspark import export_dspark, load_dspark_draft

    draft = load_dspark_draft(need_artefact(setup, "dspark"), setup.target_model)
    k = setup.length or int(setup.option("draft_length", 0)) or draft.block_size
    if k > draft.block_size:
        raise ConfigError(f"this DSpark draft has blocks of {draft.block_size}: pass --draft-length "
                          f"{draft.block_size} or fewer")
    out = export_dspark(draft, setup.target_model.config, "vllm-dspark", setup.export_dir / "dspark")
    config = {"method": "dspark", "model": str(out), "num_speculative_tokens": k}
    return EngineMethod(config, {"draft_length": k, "confidence_threshold": 0.0})
