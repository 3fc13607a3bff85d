"""P-EAGLE (Hui et al. 2026, "P-EAGLE: Parallel-Drafting EAGLE with Scalable Training"): an EAGLE-3 head that drafts
a block of ``K`` tokens in one forward.

The block's first position is an ordinary EAGLE-3 step (the committed token's embedding and the target's fused
features); positions ``1 .. K-1`` hold placeholders: the embedding of one mask token (``mask_token_id``, the target's
own row: the embedding is not trained) and one shared learned hidden state, ``fc(mask_hidden)`` (``mask_hidden`` lives
in the concatenated ``[k Ht]`` feature space, as vLLM loads it). Position ``k`` sits at RoPE position ``p + k`` and
attends causally: the committed context, the block's first position and the placeholders before it. Its output's
draft-vocabulary argmax is draft token ``k + 1``. Training is EAGLE-3's training-time test with those placeholder
inputs at every unrolled step after the first (:mod:`draftsmith.trainers.eagle.ttt`)."""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.common.errors import ConfigError
from draftsmith.inference.drafters.eagle import Eagle3Head


class PEagleHead(Eagle3Head):
    """:class:`Eagle3Head` with the parallel-drafting placeholder: ``mask_hidden`` ``[k Ht]`` (learned) and the mask
    token's id (module docstring)."""

    def __init__(self, *args, mask_token_id: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mask_token_id = int(mask_token_id)
        width = len(self.hidden_layers) * self.target_hidden
        self.mask_hidden = nn.Parameter(torch.randn(width))  # [k Ht], as the reference initialises it

    @classmethod
    def for_target(cls, target: nn.Module, d2t: torch.Tensor, t2d: torch.Tensor, layers: tuple[int, ...] | None = None,
                   mask_token_id: int = 0, fc_norm: bool = False, norm_output: bool = False,
                   layer: str = "llama", norm_before_residual: bool = False) -> PEagleHead:
        vocab = int(target.config.vocab_size)
        if not 0 <= int(mask_token_id) < vocab:
            raise ConfigError(f"mask_token_id={mask_token_id} is not a token of the target's vocabulary (0..{vocab - 1}):"
                              " pass one of its ids, or -1 for the tokenizer's mask token")
        head = super().for_target(target, d2t, t2d, layers, fc_norm=fc_norm, norm_output=norm_output, layer=layer,
                                  norm_before_residual=norm_before_residual)
        head.mask_token_id = int(mask_token_id)
        return head

    def mask_state(self) -> torch.Tensor:  # [H]
        """The placeholders' hidden input ``g_mask = fc(mask_hidden)`` (through EAGLE-3.1's ``fc_norm`` when on, as
        vLLM fuses it like the target's features)."""
        return self.fuse_concat(self.mask_hidden)

    def artefact_config(self) -> dict:
        return super().artefact_config() | {"variant": "peagle", "mask_token_id": self.mask_token_id}


def mask_token(tokenizer, config) -> int:
    """The placeholder's token id: the tokenizer's mask token, else its pad, unknown or end-of-sequence token (the
    reference's order after an explicit id)."""
    for name in ("mask_token_id", "pad_token_id", "unk_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None) if tokenizer is not None else None
        value = value if value is not None else getattr(config, name, None)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


__all__ = ["PEagleHead", "mask_token"]
