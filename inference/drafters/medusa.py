"""Medusa heads (Cai et al. 2024): K extra decoding heads on the target's last hidden state.

Head ``k`` (0-based) reads the final-normed hidden state ``h_t`` of position ``t`` — the one whose LM-head output
is the token ``x_{t+1}`` — and predicts ``x_{t+k+2}``: a stack of residual blocks ``h + SiLU(W h + b)``
(Medusa eq. 1; ``W`` zero-initialised, so a fresh head returns ``h`` and starts as the target's own LM head),
then an LM head: the target's own (frozen, shared; the default, and the only sane one with a 49,152-token
vocabulary) or a per-head copy initialised from it.

The module lives in ``inference`` because the decode loop runs it; the trainer (``draftsmith.trainers.medusa.trainer``)
builds and trains it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from draftsmith.common.sharding import whole


class ResBlock(nn.Module):
    """``h + SiLU(W h + b)`` with ``W`` and ``b`` zero-initialised (the block starts as the identity)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        return h + F.silu(self.linear(h))


class MedusaHeads(nn.Module):
    """``heads`` Medusa heads of ``layers`` residual blocks each over a width-``hidden`` target.

    With ``shared_lm_head`` the heads use the target's LM head, passed to :meth:`forward` (not a parameter here,
    so not trained nor saved); otherwise each head owns a copy, initialised by :meth:`init_lm_heads`."""

    def __init__(self, hidden: int, vocab: int, heads: int = 4, layers: int = 1, shared_lm_head: bool = True) -> None:
        super().__init__()
        if heads < 1 or layers < 1:
            raise ValueError(f"Medusa needs heads >= 1 and layers >= 1, got {heads} and {layers}")
        self.hidden, self.vocab, self.num_heads, self.layers = hidden, vocab, heads, layers
        self.shared_lm_head = shared_lm_head
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(hidden) for _ in range(layers))) for _ in range(heads))
        self.lm_heads = None if shared_lm_head else nn.ModuleList(nn.Linear(hidden, vocab, bias=False)
                                                                    for _ in range(heads))

    @torch.no_grad()
    def init_lm_heads(self, target_head: nn.Module) -> None:
        """Copy the target's LM head into every per-head LM head (no-op when shared)."""
        if self.lm_heads is not None:
            with whole([target_head.weight]):  # ZeRO-3: gathered
                for head in self.lm_heads:
                    head.weight.copy_(target_head.weight[: self.vocab])

    def features(self, hidden: torch.Tensor, k: int) -> torch.Tensor:  # [..., H] -> [..., H]
        return self.blocks[k](hidden)

    def head_logits(self, hidden: torch.Tensor, k: int, lm_head: nn.Module | None = None) -> torch.Tensor:
        """Head ``k``'s logits ``[..., V]`` from final-normed target hidden states ``[..., H]``."""
        head = lm_head if self.lm_heads is None else self.lm_heads[k]
        if head is None:
            raise ValueError("these Medusa heads share the target's LM head: pass lm_head=")
        return head(self.features(hidden, k))

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """Every head's logits: ``[..., H] -> [K, ..., V]``."""
        return torch.stack([self.head_logits(hidden, k, lm_head) for k in range(self.num_heads)])

    def artefact_config(self) -> dict:
        return {"method": "medusa", "hidden_size": self.hidden, "vocab_size": self.vocab, "heads": self.num_heads,
                "layers": self.layers, "shared_lm_head": self.shared_lm_head}

    @classmethod
    def from_artefact_config(cls, config: dict) -> MedusaHeads:
        return cls(hidden=int(config["hidden_size"]), vocab=int(config["vocab_size"]), heads=int(config["heads"]),
                   layers=int(config["layers"]), shared_lm_head=bool(config["shared_lm_head"]))


__all__ = ["ResBlock", "MedusaHeads"]
