"""A separate draft model (Leviathan et al. 2023): its proposer builder, decoding options and vLLM counterpart;
DistillSpec's artefacts draft through the same builder."""

from __future__ import annotations

from pathlib import Path

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.eval_options import draft_model_options
from draftsmith.common.models import load_model
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.engines.vllm import DEFAULT_LENGTH, EngineMethod, EngineSetup
from draftsmith.inference.methods.context import ProposerContext, draft_length, max_length, relative_verify

OPTIONS = draft_model_options(length=4, confidence=0.4)


def _artefact_draft(ctx: ProposerContext):
    """The draft model of a ``draft_model`` artefact, on the target's device and dtype."""
    sub = ctx.artefact_dir / ctx.manifest["proposer"].get("model_dir", "draft")
    if not (sub / "config.json").is_file():
        raise ArtefactError(f"{sub}/config.json is missing: the artefact's draft model directory is incomplete")
    draft = load_model(sub, ctx.target_model.dtype, ctx.target_model.device, what="artefact's draft",
                       use_safetensors=True)
    return draft.eval(), str(sub)


def draft_model_proposer(ctx: ProposerContext):
    """A separate draft model: the caller's, else the artefact's; refused unless it shares the target's
    vocabulary."""
    from draftsmith.inference.core.draft_length import DraftLengthPolicy
    from draftsmith.inference.proposers.draft_model import DraftModelProposer, check_same_tokenizer, draft_vocab_of

    if ctx.draft_model is not None:
        draft = ctx.draft_model.to(ctx.target_model.device, ctx.target_model.dtype).eval()
        name = str(getattr(draft.config, "_name_or_path", "") or "draft")
    elif ctx.artefact_dir is not None:
        draft, name = _artefact_draft(ctx)
    else:
        raise ConfigError("the draft method needs a draft model: pass --draft PATH (a draft sharing the target's "
                          "tokenizer)")
    check_same_tokenizer(ctx.target_model, draft, draft_name=name)
    length = draft_length(ctx)
    policy = DraftLengthPolicy(length=length, mode=ctx.option("draft_length_mode"),
                               max_length=max_length(ctx, length), relative_verify=relative_verify(ctx))
    vocab = ctx.option("draft_vocab")
    if vocab not in ("auto", "full"):
        raise ConfigError(f"draft vocabulary must be auto (the draft's config.draft_vocab when it has one) or full, "
                          f"got {vocab!r}")
    return DraftModelProposer(draft, policy, confidence_threshold=float(ctx.option("confidence_threshold")),
                              vocab=draft_vocab_of(draft) if vocab == "auto" else None)


def vllm_engine(setup: EngineSetup) -> EngineMethod:
    """A separate draft model (plain or distilled): vLLM's ``draft_model`` with the same directory."""
    if setup.artefact_dir is not None:
        draft = setup.artefact_dir / (setup.manifest or {}).get("proposer", {}).get("model_dir", "draft")
    elif setup.draft_dir is not None:
        draft = Path(setup.draft_dir)
    else:
        raise ConfigError("the draft method needs a draft model: pass --draft PATH or --artefact DIR")
    k = setup.length or DEFAULT_LENGTH
    config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}
    return EngineMethod(config, {"draft_length": k, "draft_length_mode": "fixed", "confidence_threshold": 0.0,
                                 "draft_vocab": "full"})


SPEC = MethodSpec(name="draft", summary="a separate draft model, untrained (Leviathan et al. 2023)",
                  proposer=draft_model_proposer, artefact_kind="draft_model", models=("target", "draft"),
                  eval_method=True, eval_default=True, eval_options=OPTIONS, engine_configs={"vllm": vllm_engine})
