"""Prompt lookup decoding (Saxena 2023): copy what followed the last n-gram's earlier occurrence.

Training-free: the draft is the continuation of the most recent earlier match of the context's
final n-gram (longest n first). Its proposals are deterministic, so under sampling each node's
``q`` is one-hot (``Draft.q`` is None), which keeps speculative sampling exact.
"""

from __future__ import annotations

import torch

from draftsmith.inference.sampling import SamplingParams
from draftsmith.inference.verify import Draft


def lookup_continuation(
    tokens: torch.Tensor,  # [L]
    max_ngram: int,
    min_ngram: int,
    length: int,
) -> torch.Tensor:  # [<= length]
    """Tokens that followed the most recent earlier occurrence of the last n-gram."""
    L = tokens.numel()
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        pattern = tokens[L - n :]  # [n]
        windows = tokens[: L - 1].unfold(0, n, 1)  # [L - n, n]: windows ending before the last token
        hits = (windows == pattern).all(-1).nonzero().flatten()
        for start in reversed(hits.tolist()):
            cont = tokens[start + n : start + n + length]
            if cont.numel():
                return cont
    return tokens.new_empty(0)


class PromptLookupProposer:
    name = "pld"
    lossless = True
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, num_draft_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.num_draft_tokens = num_draft_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def reset(self, prompt_ids: torch.Tensor) -> None:
        """Stateless: every proposal is computed from the committed tokens alone."""

    def propose(self, tokens, max_tokens, sampling: SamplingParams, generator=None) -> Draft:
        k = min(self.num_draft_tokens, max_tokens)
        if k <= 0:
            return Draft.empty()
        return Draft.chain(lookup_continuation(tokens, self.max_ngram, self.min_ngram, k))

    def observe(self, feedback) -> None:
        """Stateless: the draft length is fixed, so step feedback changes nothing."""
