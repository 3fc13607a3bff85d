"""The DSpark draft (deepseek-ai/DeepSpec): a DFlash block draft (:mod:`draftsmith.inference.drafters.dflash`) whose
``N`` queries ``[x_p, MASK x (N-1)]`` each predict the *next* token (query ``k`` at position ``p+k`` drafts
``x_{p+k+1}``: vLLM's ``sample_from_anchor``), plus two small heads:

- a first-order Markov head, a low-rank bias from the token before each slot::

      e_k = W1[prev_k]                  ([V, r] embedding, indexed by a target-vocabulary id)
      z_k = LMHead(h_k) + W2 e_k        ([V, r] projection; LMHead the target's, shared)

  ``prev_0`` is the pending token ``x_p``, ``prev_k`` the token drafted (or, in training, the true token) before slot
  ``k``: one backbone forward per step, then a cheap sequential pass over the block;
- a confidence head ``c_k = sigmoid(w . [h_k; e_k] + b)`` (``[h_k]`` without ``confidence_with_markov``), trained to
  predict the chance that slot ``k`` is accepted; the proposer may stop a draft where the running product of the
  confidences falls below a threshold (vLLM's adaptive verification budgets the batch with it).

The tensors carry vLLM 0.32's names (``markov_head.markov_w1.weight`` ``[V, r]``, ``markov_head.markov_w2.weight``
``[V, r]``, ``confidence_head.proj.weight`` ``[1, H (+ r)]`` and its bias), so the ``vllm-dspark`` export writes
the state dict as it is. The draft drafts over the target's whole vocabulary with the target's LM head, as
draftsmith's DFlash.
"""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.common.errors import ConfigError
from draftsmith.inference.drafters.dflash import DFlashDraft, draft_config

MARKOV_INIT_STD = 0.01  # W1's initial spread (speculators' DSpark; W2 keeps nn.Linear's initialisation)


class MarkovHead(nn.Module):
    """``W2 W1[prev]``: the low-rank bias of the token before each slot (module docstring)."""

    def __init__(self, vocab: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(int(vocab), int(rank))
        self.markov_w2 = nn.Linear(int(rank), int(vocab), bias=False)
        nn.init.normal_(self.markov_w1.weight, std=MARKOV_INIT_STD)

    def forward(self, embedded: torch.Tensor) -> torch.Tensor:  # [..., r] -> [..., V]
        return self.markov_w2(embedded)


class ConfidenceHead(nn.Module):
    """``w . x + b``: one logit per slot (the confidence ``sigmoid`` of it)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(int(width), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., W] -> [...]
        return self.proj(x.to(self.proj.weight.dtype)).squeeze(-1)


class DSparkDraft(DFlashDraft):
    """A DFlash draft of ``block_size`` next-token queries with the Markov head of ``markov_rank`` and, with
    ``confidence``, the confidence head (module docstring)."""

    def __init__(self, config, layers: tuple[int, ...], target_hidden: int, block_size: int, mask_token_id: int,
                 markov_rank: int = 256, confidence: bool = True, confidence_with_markov: bool = True) -> None:
        super().__init__(config, layers, target_hidden, block_size, mask_token_id)
        if int(markov_rank) < 1:
            raise ConfigError(f"markov_rank={markov_rank}: DSpark's Markov head needs a rank >= 1")
        self.markov_rank, self.confidence_with_markov = int(markov_rank), bool(confidence_with_markov)
        self.markov_head = MarkovHead(int(config.vocab_size), self.markov_rank)
        width = self.hidden + (self.markov_rank if self.confidence_with_markov else 0)
        self.confidence_head = ConfidenceHead(width) if confidence else None

    @classmethod
    def for_target(cls, target: nn.Module, num_layers: int = 1, layers: tuple[int, ...] | None = None,
                   block_size: int = 8, mask_token_id: int = 0, markov_rank: int = 256, confidence: bool = True,
                   confidence_with_markov: bool = True) -> DSparkDraft:
        """A fresh draft for ``target`` (float32, on the CPU) reading ``layers`` (default: DFlash's)."""
        base = DFlashDraft.for_target(target, num_layers, layers, block_size, mask_token_id)  # the same checks
        return cls(draft_config(target.config, num_layers), base.hidden_layers, base.target_hidden, block_size,
                   mask_token_id, markov_rank, confidence, confidence_with_markov)

    def markov_embed(self, prev: torch.Tensor) -> torch.Tensor:  # [...] long -> [..., r]
        """``e = W1[prev]`` of the tokens before the slots (target-vocabulary ids)."""
        return self.markov_head.markov_w1(prev)

    def slot_logits(self, base: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:  # [..., V], [..., r] -> [..., V]
        """``z = LMHead(h) + W2 e``: the LM head's logits ``base`` with the Markov bias."""
        return base + self.markov_head(embedded).to(base.dtype)

    def confidence_logits(self, states: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:  # [..., H], [..., r]
        """The confidence head's logit ``[...]`` (float32) of each slot; refused for a draft trained without it."""
        if self.confidence_head is None:
            raise ConfigError("this DSpark draft has no confidence head (trained with confidence_head=false)")
        x = torch.cat([states, embedded.to(states.dtype)], dim=-1) if self.confidence_with_markov else states
        return self.confidence_head(x.float()).float()

    def artefact_config(self) -> dict:
        return super().artefact_config() | {"method": "dspark", "markov_rank": self.markov_rank,
                                            "confidence_head": self.confidence_head is not None,
                                            "confidence_with_markov": self.confidence_with_markov}


__all__ = ["ConfidenceHead", "DSparkDraft", "MarkovHead"]
