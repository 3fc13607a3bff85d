"""Plain autoregressive decoding: the reference every method is measured against (no proposer)."""

from __future__ import annotations

from draftsmith.common.registry import MethodSpec
from draftsmith.inference.methods.context import ProposerContext


def no_proposer(ctx: ProposerContext) -> None:
    return None


SPEC = MethodSpec(name="ar", summary="plain autoregressive decoding (the reference)", proposer=no_proposer,
                  eval_method=True)
