"""BiTA's mask tokens at decoding time: the proposer builder and its options (without an artefact: untrained embeddings,
the reference before training)."""

from __future__ import annotations

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import SEED, TREE, TREE_TOP_K
from draftsmith.inference.methods.context import ProposerContext

OPTIONS = (TREE, TREE_TOP_K, SEED)  # tree and tree_top_k: BitaConfig's (the spec derives them)


def bita_proposer(ctx: ProposerContext):
    """BiTA's mask tokens from an ``embeddings`` artefact; without one (``--method bita``), embeddings started from the
    target's vocabulary and never trained: the "before training" reference. Drafts a chain of the masks' top-1
    tokens (default) or the upper-triangle tree (``--tree triangle``, ``--tree-top-k``)."""
    from draftsmith.inference.artefacts.bita import load_bita_artefact
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.drafters.bita import MASK_TOKENS, PROMPT_TOKENS, BitaEmbeddings
    from draftsmith.inference.proposers.bita import TREES, BitaProposer

    tree = str(ctx.option("tree"))
    if tree not in TREES:
        raise ConfigError(f"--tree {tree}: BiTA drafts a chain or the upper-triangle tree (--tree chain|triangle)")
    target = ctx.target_model
    if ctx.artefact_dir is not None:
        embeddings = load_bita_artefact(ctx.artefact_dir)
        embeddings.check_target(target)
    else:
        embeddings = BitaEmbeddings.for_target(target, prompt_tokens=PROMPT_TOKENS, mask_tokens=MASK_TOKENS)
        embeddings.init_from_target(ModelAdapter(target), seed=int(ctx.option("seed")))
    embeddings.to(target.device)
    return BitaProposer(embeddings, tree=tree, top_k=int(ctx.option("tree_top_k")))
