"""DFlash's block draft at decoding time: the proposer builder, the decoding options and vLLM's ``dflash``."""

from __future__ import annotations

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import DRAFT_LENGTH, TREE, TREE_CALIBRATION, TREE_NODES
from draftsmith.inference.engines.vllm import EngineMethod, EngineSetup, need_artefact
from draftsmith.inference.methods.context import ProposerContext
from draftsmith.inference.methods.trees import static_tree

OPTIONS = (DRAFT_LENGTH, TREE.default_to("chain"), TREE_NODES.default_to(32), TREE_CALIBRATION)


def dflash_proposer(ctx: ProposerContext):
    """A DFlash draft from a ``heads`` artefact: each step one draft forward fills the block's ``draft_length`` masks
    (0: all of them, ``block_size - 1``), verified as a chain (``--tree chain``, default) or as a static tree over the
    slots' top-k (``--tree auto|FILE``, :func:`static_tree`)."""
    from draftsmith.inference.artefacts.dflash import load_dflash_draft
    from draftsmith.inference.proposers.dflash import DFlashProposer

    if ctx.artefact_dir is None:
        raise ConfigError("dflash runs from its trained draft: pass --artefact DIR (from recipes/dflash.py)")
    target = ctx.target_model
    draft = load_dflash_draft(ctx.artefact_dir, target).to(target.device, target.dtype)
    length = int(ctx.option("draft_length") or 0) or draft.block_size - 1
    tree = str(ctx.option("tree"))
    shape = None if tree == "chain" else static_tree(ctx, length)
    return DFlashProposer(draft, target.get_input_embeddings(), target.get_output_embeddings(), length=length,
                          tree=shape)


def vllm_engine(setup: EngineSetup) -> EngineMethod:
    """A DFlash draft (``vllm-dflash`` export, method ``dflash``): the block's first ``num_speculative_tokens``
    masks, at most ``block_size - 1``."""
    from draftsmith.inference.artefacts.dflash import export_dflash, load_dflash_draft

    draft = load_dflash_draft(need_artefact(setup, "dflash"), setup.target_model)
    k = setup.length or int(setup.option("draft_length", 0)) or draft.block_size - 1
    if k > draft.block_size - 1:
        raise ConfigError(f"this DFlash draft fills blocks of {draft.block_size}: pass --draft-length "
                          f"{draft.block_size - 1} or fewer")
    out = export_dflash(draft, setup.target_model.config, "vllm-dflash", setup.export_dir / "dflash")
    config = {"method": "dflash", "model": str(out), "num_speculative_tokens": k}
    return EngineMethod(config, {"tree": "chain", "draft_length": k})
