"""The logits a distillation loss compares, as pure functions: an LM head's rows (a draft's reduced vocabulary, a
padded head's real rows), the target's tokens as indices into the draft's vocabulary, the draft's greedy token over
it and the distribution it samples from, and what keeps the fused kernel (:mod:`draftsmith.kernels`) from computing
a loss exactly."""

from __future__ import annotations

import torch

from draftsmith.common.errors import ConfigError, TokenizerMismatchError
from draftsmith.common.models import lm_head_rows
from draftsmith.common.precision import first_argmax
from draftsmith.data.chat import IGNORE_INDEX

# config attributes that make the logits more than `last hidden state @ LM head.T (+ bias)`
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def draft_labels(labels: torch.Tensor, rows: torch.Tensor, vocab_size: int) -> torch.Tensor:  # [N], [K] -> [N]
    """Target token ids as indices into the draft's vocabulary ``rows``; a token outside it becomes -100."""
    index = torch.full((vocab_size,), IGNORE_INDEX, dtype=torch.long, device=labels.device)
    index[rows] = torch.arange(rows.numel(), device=labels.device)
    return index[labels]


def draft_argmax(logits: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:  # [N, V] -> [N]
    """The token the draft proposes greedily: the argmax over its vocabulary ``rows`` (all tokens when None)."""
    if rows is None:
        return first_argmax(logits)
    rows = rows.to(logits.device)
    return rows[first_argmax(logits[:, rows])]


def proposal_logits(logits: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:  # [..., V] -> [..., V]
    """The logits of the distribution the draft proposes from: over its vocabulary ``rows`` only, every other
    column ``-inf``, so that a softmax renormalises over ``rows``, ``q_K(v) = q(v) / sum_{u in K} q(u)`` and zero
    outside, as the draft-model proposer samples (:class:`~draftsmith.inference.proposers.draft_model.DraftModelProposer`
    with ``vocab``); ``logits`` itself when ``rows`` is None (every token)."""
    if rows is None:
        return logits
    rows = rows.to(logits.device)
    out = torch.full_like(logits, float("-inf"))
    out[..., rows] = logits[..., rows]
    return out


def check_same_vocabulary(draft, target) -> None:
    """Refuse to distil a draft whose vocabulary differs from the target's (inference refuses to run it)."""
    v_draft, v_target = lm_head_rows(draft), lm_head_rows(target)
    if v_draft != v_target:
        raise TokenizerMismatchError(
            f"the draft has a vocabulary of {v_draft} tokens but the target has {v_target}: a draft must use the "
            "target's tokenizer (train or pick a draft from the same tokenizer family)")


def logit_transform(config) -> str | None:
    """The config attribute (e.g. Gemma's final_logit_softcapping) that post-processes the LM head output, if any."""
    for name in LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0, 0, 0.0, False):
            return f"{name}={value}"
    return None


def head_rows(head, vocab: int, rows: torch.Tensor | None = None,
              dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:  # [V|K, H], [V|K]
    """An LM head's weight and bias (None without one) restricted to ``rows`` (token ids), or to the first ``vocab``
    rows when ``rows`` is None (a padded head's extra rows are no tokens), optionally cast to ``dtype``."""
    pick = (lambda t: t[:vocab]) if rows is None else (lambda t: t[rows.to(t.device)])
    weight, bias = pick(head.weight), getattr(head, "bias", None)
    bias = None if bias is None else pick(bias)
    if dtype is not None:
        weight, bias = weight.to(dtype), None if bias is None else bias.to(dtype)
    return weight, bias


def fused_kernel_blocker(model, teacher_model) -> str | None:
    """Why the fused kernel cannot compute the loss of ``model`` (the draft) against ``teacher_model`` exactly, or
    None when it can (sharded LM heads are called chunk by chunk instead: :mod:`draftsmith.kernels.head_calls`)."""
    for who, m in (("draft", model), ("target", teacher_model)):
        transform = logit_transform(m.config)
        if transform:
            return f"computes logits as hidden @ LM head, but the {who} also applies {transform}"
    if getattr(teacher_model, "is_quantized", False):
        return "needs the target's LM head in floating point, and the target is quantized"
    return None


def check_offline_logits(teacher_model, sharded: bool) -> None:
    """Refuse ``features=offline`` where the target's cached last hidden state through its LM head is not its logits
    (a logit transform), or where that LM head is sharded (``sharded``: ZeRO-3, FSDP)."""
    transform = logit_transform(teacher_model.config)
    if transform:
        raise ConfigError(f"features=offline takes the target's logits as its cached last hidden state through its "
                          f"LM head, and the target also applies {transform}: use features=online")
    if sharded:
        raise ConfigError("features=offline reads the target's LM head outside its forward, which ZeRO-3 and FSDP "
                          "shard: use ZeRO-2 / DDP, or features=online")


def check_triton_backend() -> None:
    """Raise :class:`ConfigError` unless the Triton kernel can run here (CUDA, or Triton's CPU interpreter)."""
    from draftsmith.kernels import resolve_backend

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolve_backend("triton", device)
    except RuntimeError as err:
        raise ConfigError(f"kernel_backend=triton: {err}") from None


__all__ = ["LOGIT_TRANSFORMS", "check_offline_logits", "check_same_vocabulary", "check_triton_backend", "draft_argmax", "draft_labels",
           "fused_kernel_blocker", "head_rows", "logit_transform", "proposal_logits"]
