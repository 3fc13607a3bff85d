"""The static token trees the head and block drafters verify (Medusa's heads; P-EAGLE's and DFlash's block slots), sized
on the target's verification cost measured now."""

from __future__ import annotations

from pathlib import Path

from draftsmith.common.errors import ConfigError
from draftsmith.inference.methods.context import ProposerContext, tree_calibration


def static_tree(ctx: ProposerContext, heads: int):
    """The static tree of a Medusa artefact, or of a block drafter (P-EAGLE, DFlash: block slot ``d`` plays head ``d``'s
    part): ``--tree chain`` (top-1 of each head), a JSON file of choice paths,
    or ``auto`` (default): the top-1 chain through every head, then grown greedily from the heads' top-k accuracies
    — conditional ones measured in the decode loop on held-out prompts when the artefact is calibrated
    (:func:`tree_calibration`), else those the trainer measured per head on held-out data (the manifest's
    ``training.head_accuracy``), else a typical profile — ``tree_nodes`` nodes, or, with ``--tree-nodes auto``, the
    count with the best predicted speedup on the target's measured verification cost."""
    import json

    import torch

    from draftsmith.inference.core.trees import chain_choices, default_accuracy, greedy_choices, tree_from_choices

    tree = str(ctx.option("tree"))
    nodes = ctx.option("tree_nodes")
    if tree == "chain":
        return tree_from_choices(chain_choices(heads))
    if tree == "auto":
        calibration = tree_calibration(ctx)
        accuracy = (calibration or {}).get("rank_accuracy") or \
            ((ctx.manifest or {}).get("training") or {}).get("head_accuracy")
        accuracy = torch.tensor(accuracy)[:heads] if accuracy else default_accuracy(heads)
        if str(nodes) == "auto":  # the size whose predicted speedup is best on this target's measured cost
            nodes = medusa_tree_size(ctx.target_model, accuracy, chain=heads)["nodes"]
        if not str(nodes).isdigit() or int(nodes) < 1:
            raise ConfigError(f"--tree-nodes {nodes}: give a number of nodes >= 1, or auto")
        return tree_from_choices(greedy_choices(accuracy, int(nodes), chain=heads))
    path = Path(tree)
    try:
        choices = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--tree {tree}: not chain, auto or a readable JSON file of choice paths ({err})") from None
    return tree_from_choices(choices)


def tree_verify_cost(target_model, max_nodes: int = 64):
    """The target's verification cost for trees of up to ``max_nodes`` nodes, measured now (a
    :class:`~draftsmith.inference.evaluation.cost.CostModel` over 1 .. ``max_nodes + 1`` tokens, interpolated between powers of
    two)."""
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.evaluation.cost import CostModel, measure_verify_curve

    sizes = sorted(n for n in {1, 2, 3, 5, 9, 17, 33, max_nodes + 1} if n <= max_nodes + 1)
    return CostModel(measure_verify_curve(ModelAdapter(target_model), sizes=sizes, repeats=5))


def medusa_tree_size(target_model, accuracy, max_nodes: int = 64, chain: int = 0) -> dict:
    """:func:`~draftsmith.inference.core.trees.tree_size_for_cost` on the target's verification cost, measured now."""
    from draftsmith.inference.core.trees import tree_size_for_cost

    return tree_size_for_cost(accuracy, tree_verify_cost(target_model, max_nodes).relative_verify, max_nodes, chain)
