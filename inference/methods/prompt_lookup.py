"""Prompt lookup decoding (training-free n-gram copying): its proposer builder, options and vLLM's ``ngram``."""

from __future__ import annotations

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import TREE, EvalOption
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.engines.vllm import DEFAULT_LENGTH, EngineMethod, EngineSetup
from draftsmith.inference.methods.context import ProposerContext
from draftsmith.inference.methods.trees import tree_verify_cost

PROMPT_LOOKUP_OPTIONS = (
    EvalOption("pld_tokens", int, 24, metavar="N", help="prompt lookup: longest draft, tokens copied per step"),
    EvalOption("pld_max_ngram", int, 4, metavar="N", help="prompt lookup: longest n-gram matched, tried first"),
    EvalOption("pld_min_ngram", int, 2, metavar="N",
               help="prompt lookup: shortest n-gram matched (1 also copies after a lone matching token)"),
    EvalOption("pld_length", str, "cost", choices=("adaptive", "fixed", "cost"),
               help="prompt lookup: from how often copies are accepted, the draft size that commits the most tokens "
                    "per second on the target's verification cost, measured at the start (cost), or the longest draft "
                    "whose copies stay above --pld-threshold (adaptive), or always --pld-tokens (fixed)"),
    EvalOption("pld_threshold", float, 0.15, metavar="P",
               help="prompt lookup, --pld-length adaptive: draft a copied token (a tree node) only while its estimated "
                    "chance of acceptance is at least P (lower where verifying more tokens is cheap, e.g. on a GPU)"),
    TREE.default_to("chain"),
)



def prompt_lookup_proposer(ctx: ProposerContext):
    """Prompt lookup: longest-match-first n-gram copying, each draft sized from the copies' measured acceptance on the
    target's verification cost, measured now (``--pld-length cost``, default; ``adaptive``: a fixed acceptance
    threshold instead; ``fixed``: always ``--pld-tokens``), as one voted chain (``--tree chain``, default) or as a
    tree of the several occurrences' candidates (``--tree dynamic``)."""
    from draftsmith.inference.proposers.prompt_lookup import PromptLookupProposer

    length = ctx.option("pld_length")
    if length not in ("adaptive", "fixed", "cost"):
        raise ConfigError(f"prompt lookup draft length must be adaptive, fixed or cost, got {length!r}")
    tree = str(ctx.option("tree"))
    if tree not in ("chain", "dynamic"):
        raise ConfigError(f"prompt lookup --tree {tree}: give chain (one voted chain) or dynamic (the candidates of "
                          "several occurrences as a token tree)")
    tokens = int(ctx.option("pld_tokens"))
    cost = tree_verify_cost(ctx.target_model, tokens) if length == "cost" else None  # measured now
    try:
        return PromptLookupProposer(num_draft_tokens=tokens,
                                    max_ngram=int(ctx.option("pld_max_ngram")),
                                    min_ngram=int(ctx.option("pld_min_ngram")),
                                    adaptive=length != "fixed",
                                    threshold=float(ctx.option("pld_threshold")),
                                    tree=tree == "dynamic", verify_cost=cost)
    except ValueError as e:
        raise ConfigError(f"prompt lookup: {e}") from None


def vllm_engine(setup: EngineSetup) -> EngineMethod:
    """Prompt lookup: vLLM's ``ngram`` proposer with draftsmith's n-gram bounds."""
    lo, hi = int(setup.option("pld_min_ngram", 2)), int(setup.option("pld_max_ngram", 4))
    k = setup.length or DEFAULT_LENGTH
    config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    return EngineMethod(config, {"pld_tokens": k, "pld_length": "fixed", "pld_min_ngram": lo, "pld_max_ngram": hi,
                                 "tree": "chain"})


SPEC = MethodSpec(name="pld", summary="prompt lookup decoding (training-free n-gram copying)",
                  proposer=prompt_lookup_proposer, eval_method=True, eval_options=PROMPT_LOOKUP_OPTIONS,
                  engine_configs={"vllm": vllm_engine})
