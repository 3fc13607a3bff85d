"""EAGLE-1/3 and P-EAGLE heads at decoding time: the proposer builder (EAGLE-2's dynamic tree, chains, P-EAGLE's block),
the decoding options and vLLM's ``eagle``/``eagle3`` (P-EAGLE: ``parallel_drafting``)."""

from __future__ import annotations

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import DRAFT_LENGTH, TREE, TREE_CALIBRATION, TREE_NODES, TREE_TOP_K, EvalOption
from draftsmith.inference.drafters.peagle import PEagleHead
from draftsmith.inference.engines.vllm import DEFAULT_LENGTH, EngineMethod, EngineSetup, need_artefact
from draftsmith.inference.methods.context import ProposerContext, tree_calibration
from draftsmith.inference.methods.trees import static_tree, tree_verify_cost

AUTO_TREE_TOKENS = 64  # the most tokens a cost-sized EAGLE tree (--tree-nodes auto) verifies in one forward
EAGLE_OPTIONS = (
    TREE, TREE_NODES, DRAFT_LENGTH, TREE_TOP_K,  # these and tree_depth: EagleConfig's (the spec derives them)
    TREE_CALIBRATION,
    EvalOption("tree_depth", int, metavar="D", help="eagle --tree dynamic: levels the head expands"),
)



def eagle_proposer(ctx: ProposerContext):
    """An EAGLE-1 or EAGLE-3 head from a ``heads`` artefact over the target's features, drafting EAGLE-2's dynamic tree
    (``tree_depth`` levels of ``tree_top_k``, ``tree_nodes`` kept; the default) or a chain of ``draft_length``; a
    P-EAGLE head drafts its block of ``draft_length`` in one forward, as a chain or a static tree over the block's top-k
    (:func:`static_tree`)."""
    from draftsmith.inference.artefacts.eagle import load_eagle_head
    from draftsmith.inference.proposers.eagle import TREES, EagleProposer
    from draftsmith.inference.proposers.peagle import PEagleProposer

    if ctx.artefact_dir is None:
        raise ConfigError("eagle runs from its trained head: pass --artefact DIR (from recipes/eagle.py)")
    tree = str(ctx.option("tree"))
    target = ctx.target_model
    head = load_eagle_head(ctx.artefact_dir, target)
    head.to(target.device)
    if isinstance(head, PEagleHead):  # P-EAGLE: the block from one head forward per step, a chain or a static tree
        if tree == "dynamic":
            raise ConfigError("--tree dynamic: P-EAGLE drafts its block as a chain or a static tree over the block's "
                              "top-k (--tree chain|auto|FILE.json)")
        length = int(ctx.option("draft_length"))
        shape = None if tree == "chain" else static_tree(ctx, length)
        return PEagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(), length=length,
                              tree=shape)
    if tree not in TREES:
        raise ConfigError(f"--tree {tree}: EAGLE drafts a chain or EAGLE-2's dynamic tree (--tree chain|dynamic)")
    total = str(ctx.option("tree_nodes"))
    if total != "auto" and (not total.isdigit() or int(total) < 1):
        raise ConfigError(f"--tree-nodes {total}: EAGLE's dynamic tree keeps a number of tokens (e.g. 32) or auto")
    cost = None
    if total == "auto":  # sized per step on the measured verification cost, up to AUTO_TREE_TOKENS
        total = AUTO_TREE_TOKENS
        cost = tree_verify_cost(target, total) if tree == "dynamic" else None
    return EagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(),
                         length=int(ctx.option("draft_length")), tree=tree, depth=int(ctx.option("tree_depth")),
                         top_k=int(ctx.option("tree_top_k")), total_tokens=int(total), verify_cost=cost,
                         temperatures=(tree_calibration(ctx) or {}).get("temperatures"))


def vllm_engine(setup: EngineSetup) -> EngineMethod:
    """An EAGLE-1 head (``vllm-eagle`` export, method ``eagle``) or an EAGLE-3 head (``eagle3``, method ``eagle3``; a
    P-EAGLE head with ``parallel_drafting``)."""
    from draftsmith.inference.artefacts.eagle import export_eagle, load_eagle_head
    from draftsmith.inference.drafters.eagle import Eagle3Head

    head = load_eagle_head(need_artefact(setup, "eagle"), setup.target_model)
    k = setup.length or DEFAULT_LENGTH
    fmt, method = ("eagle3", "eagle3") if isinstance(head, Eagle3Head) else ("vllm-eagle", "eagle")
    if setup.export_format == "speculators":
        if method != "eagle3":
            raise ConfigError("the speculators layout holds EAGLE-3 heads; this artefact is EAGLE-1: leave "
                              "--engine-export auto")
        fmt = "speculators"
    out = export_eagle(head, setup.target_model.config, fmt, setup.export_dir / fmt, speculative_tokens=k)
    config = {"method": method, "model": str(out), "num_speculative_tokens": k}
    if isinstance(head, PEagleHead):  # P-EAGLE: the block in one draft forward
        config["parallel_drafting"] = True
    return EngineMethod(config, {"tree": "chain", "draft_length": k})
