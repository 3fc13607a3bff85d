"""Jacobi decoding (Santilli et al. 2023): the target refines a guess of the next block in the forward that verifies
it. CLLM's artefacts draft through the same builder."""

from __future__ import annotations

from draftsmith.common.eval_options import DRAFT_LENGTH, SEED
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.methods.context import ProposerContext


def jacobi_proposer(ctx: ProposerContext):
    """Jacobi decoding: each step's draft is the current guess of the next ``draft_length`` tokens (CLLM's block,
    16 by default), refined by the same forward that verifies it. Any target (``--method jacobi``: the reference
    before consistency training) or a CLLM artefact's fine-tuned model."""
    from draftsmith.inference.proposers.jacobi import JacobiProposer

    return JacobiProposer(block=int(ctx.option("draft_length")), seed=int(ctx.option("seed")))


OPTIONS = (DRAFT_LENGTH.default_to(16), SEED)
SPEC = MethodSpec(name="jacobi", summary="Jacobi decoding: the target refines a guess of the next block in the forward "
                  "that verifies it (Santilli et al. 2023)", proposer=jacobi_proposer, eval_method=True,
                  eval_options=OPTIONS)
