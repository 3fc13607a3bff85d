"""Early exit (LayerSkip's self-speculation): the target's first E layers draft, the rest verify with the draft's cache
reused. ``early-exit`` runs it on any target; LayerSkip's artefacts draft through the same builder."""

from __future__ import annotations

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import EvalOption, self_drafting_options
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.methods.context import ProposerContext, draft_length, max_length, relative_verify

EXIT_LAYER = EvalOption("exit_layer", int, metavar="E",
                        help="early exit: draft with the target's first E layers (LayerSkip self-speculation; a "
                             "LayerSkip artefact's chosen E, else a quarter of the layers)")



def early_exit_proposer(ctx: ProposerContext):
    """LayerSkip's self-speculation on any Llama-style or GPT-2 target: the first ``exit_layer`` layers draft a chain
    of ``draft_length`` tokens, the verification runs the remaining layers only, reusing the draft's cache."""
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.draft_length import DraftLengthPolicy
    from draftsmith.inference.proposers.layerskip import EarlyExitProposer

    exit_layer = ctx.option("exit_layer")
    if exit_layer is None and ctx.manifest is not None:  # a LayerSkip artefact trained without a chosen E
        exit_layer = max(1, ModelAdapter(ctx.target_model).num_layers // 4)
    if exit_layer is None:
        raise ConfigError("early-exit drafts with the target's first E layers: pass --exit-layer E")
    length = draft_length(ctx)
    policy = DraftLengthPolicy(length=length, mode=ctx.option("draft_length_mode"),
                               max_length=max_length(ctx, length), relative_verify=relative_verify(ctx))
    return EarlyExitProposer(int(exit_layer), policy)


OPTIONS = (EXIT_LAYER, *self_drafting_options(4))
SPEC = MethodSpec(name="early-exit", summary="the target's first E layers draft for it, verified by the rest with the "
                  "draft's cache reused (LayerSkip, Elhoushi et al. 2024)", proposer=early_exit_proposer,
                  eval_method=True, eval_options=OPTIONS)
