"""Medusa's heads at decoding time: the proposer builder, the decoding options (the static tree, typical acceptance)
and vLLM's ``medusa`` (vLLM 0.32; 0.33 dropped it)."""

from __future__ import annotations

import json

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import TREE, TREE_CALIBRATION, TREE_NODES, EvalOption
from draftsmith.inference.engines.vllm import DEFAULT_LENGTH, EngineMethod, EngineSetup, need_artefact
from draftsmith.inference.methods.context import ProposerContext
from draftsmith.inference.methods.trees import static_tree

MEDUSA_OPTIONS = (
    TREE, TREE_NODES, TREE_CALIBRATION,  # tree and tree_nodes: MedusaConfig's (the spec derives them)
    EvalOption("acceptance", str, "exact", choices=("exact", "typical"),
               help="head drafters: exact (lossless) or typical (Medusa's typical acceptance: the longest candidate "
                    "whose tokens pass p > min(E, D exp(-entropy)), ties by likelihood, then the target's argmax; "
                    "LOSSY under sampling, labelled so in the report)"),
    EvalOption("typical_epsilon", float, 0.09, metavar="E",
               help="typical acceptance: epsilon, the hard probability threshold"),
    EvalOption("typical_delta", float, metavar="D",
               help="typical acceptance: delta, the entropy-scaled threshold (unset: sqrt(epsilon), the reference's "
                    "recommendation, 0.3 at epsilon 0.09)"),
)



def medusa_proposer(ctx: ProposerContext):
    """Medusa heads from a ``heads`` artefact over the target's last hidden state, drafting a static tree."""
    from draftsmith.inference.artefacts.medusa import load_heads_artefact
    from draftsmith.inference.proposers.medusa import MedusaProposer

    if ctx.artefact_dir is None:
        raise ConfigError("medusa runs from its trained heads: pass --artefact DIR (from recipes/medusa.py)")
    heads = load_heads_artefact(ctx.artefact_dir)
    target = ctx.target_model
    heads.to(target.device, target.dtype)
    acceptance = ctx.option("acceptance")
    if acceptance not in ("exact", "typical"):
        raise ConfigError(f"acceptance must be exact (lossless) or typical (Medusa's, lossy), got {acceptance!r}")
    typical = None
    if acceptance == "typical":
        delta = ctx.option("typical_delta")  # None: sqrt(epsilon)
        typical = (float(ctx.option("typical_epsilon")), None if delta is None else float(delta))
    return MedusaProposer(heads, target.get_output_embeddings(), static_tree(ctx, heads.num_heads), typical=typical)


def vllm_engine(setup: EngineSetup) -> EngineMethod:
    """Medusa heads (``vllm-medusa`` export, method ``medusa``): at most one draft token per head; a Medusa-2
    artefact's adapted target is served as the model."""
    from draftsmith.inference.artefacts.medusa import ADAPTED_TARGET, export_medusa_artefact

    artefact = need_artefact(setup, "medusa")
    out = export_medusa_artefact(artefact, setup.manifest or {}, "vllm-medusa", setup.export_dir / "medusa",
                                 setup.target_model)
    heads = int(json.loads((out / "config.json").read_text())["num_heads"])
    k = setup.length or min(heads, DEFAULT_LENGTH)
    if k > heads:
        raise ConfigError(f"these Medusa heads draft at most {heads} tokens: pass --draft-length {heads} or fewer")
    served = str(out / ADAPTED_TARGET) if (out / ADAPTED_TARGET).is_dir() else None
    chain = setup.export_dir / f"medusa_chain_{k}.json"  # the top-1 of the first k heads
    chain.write_text(json.dumps([[0] * depth for depth in range(1, k + 1)]))
    config = {"method": "medusa", "model": str(out), "num_speculative_tokens": k}
    return EngineMethod(config, {"tree": str(chain), "acceptance": "exact"}, served_model=served)
