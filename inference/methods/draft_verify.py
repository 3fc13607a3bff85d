"""Draft & Verify (Zhang et al. 2023): the target drafts with searched attention/MLP sublayers skipped. The search is
``draftsmith train draft-verify`` (:mod:`draftsmith.launch.draft_verify`); its artefact holds the skip set alone."""

from __future__ import annotations

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import DRAFT_LENGTH, EvalOption
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.methods.context import ProposerContext

SKIP_ATTENTION = EvalOption("skip_attention", str, metavar="L,L",
                            help="draft-verify: the layers whose attention the draft skips (e.g. 1,3,5)")

SKIP_MLP = EvalOption("skip_mlp", str, metavar="L,L", help="draft-verify: the layers whose MLP the draft skips")

ADAPTIVE_THRESHOLD = EvalOption("threshold", dict, flag=None)  # the searched artefact's adaptive-exit rule

THRESHOLD_RULE = EvalOption("threshold_rule", str, choices=("reference", "unsmoothed"),
                            help="draft-verify: the adaptive draft-exiting rule: reference (the reference code's: "
                                 "threshold from 0.8 towards acceptance 0.9, both smoothed, held after a full-length "
                                 "draft) or unsmoothed (draftsmith's earlier rule: from 0.6 towards 0.8, whole steps); "
                                 "unset: the artefact's rule, else reference")



def _layer_list(value) -> list[int]:
    """Layer numbers from a list or a comma-separated string ("1,3,5")."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            return [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"layer list {value!r}: give comma-separated layer numbers, e.g. 1,3,5") from None
    return [int(x) for x in value]


def draft_verify_proposer(ctx: ProposerContext):
    """Draft & Verify's self-speculation from a searched artefact (``recipes/draft_verify.py``) or from skip lists
    on the command line: the target minus its skip set drafts, stopping adaptively by the rule ``--threshold-rule``
    names, else the artefact's threshold rule, else the reference code's rule (which the search drafts with too)."""
    from draftsmith.inference.core.draft_length import DraftLengthPolicy
    from draftsmith.inference.proposers.draft_verify import AdaptiveThreshold, DraftVerifyProposer

    attention, mlp = _layer_list(ctx.option("skip_attention")), _layer_list(ctx.option("skip_mlp"))
    if not attention and not mlp:
        if ctx.manifest is not None:  # the search found no skip set faster than plain decoding on this target
            return None
        raise ConfigError("draft-verify needs a skip set: pass --artefact DIR (from recipes/draft_verify.py), or "
                          "--skip-attention/--skip-mlp with layer numbers")
    length = int(ctx.option("draft_length"))
    rule = ctx.option("threshold_rule")
    stop = AdaptiveThreshold.preset(rule) if rule else AdaptiveThreshold.from_dict(ctx.option("threshold"))
    return DraftVerifyProposer(skip_attention=attention or (), skip_mlp=mlp or (),
                             policy=DraftLengthPolicy(length=length, max_length=max(16, length)), stop=stop)


SPEC = MethodSpec(name="draft-verify", summary="the target drafts with searched attention/MLP sublayers skipped "
                  "(Draft & Verify, Zhang et al. 2023)", proposer=draft_verify_proposer, artefact_kind="none",
                  eval_method=True,
                  eval_options=(SKIP_ATTENTION, SKIP_MLP, DRAFT_LENGTH.default_to(8), ADAPTIVE_THRESHOLD, THRESHOLD_RULE),
                  train="draftsmith.launch.draft_verify:main")
