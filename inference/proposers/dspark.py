"""DSpark drafting (:mod:`draftsmith.inference.drafters.dspark`): each step one draft forward over the block
``[x_p, MASK x (K-1)]`` (``K`` next-token queries at positions ``p .. p+K-1``, as vLLM's ``sample_from_anchor``
runs them), then a sequential pass over its slots adding the Markov bias of the token before each: ``prev_0 = x_p``,
``z_k = LMHead(h_k) + W2 W1[prev_k]``, ``d_k`` drawn from ``z_k``, ``prev_{k+1} = d_k``.

Greedy drafts take each slot's argmax; sampled drafts draw each slot from ``softmax(z_k)`` after the request's
processing and return those conditionals as ``q`` (each exactly the distribution its token was drawn from, given the
drafts before it), so the loop's rejection sampling keeps the target's distribution. With a ``confidence_threshold``
``P > 0`` the draft stops before the first slot whose running product of the confidence head's ``sigmoid`` outputs
falls below ``P`` (at least one token is drafted): the draft's own choice of length, so verification stays exact. The
context cache is DFlash's (:class:`~draftsmith.inference.proposers.dflash.DFlashProposer`)."""

from __future__ import annotations

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.sampling import SamplingParams, process_logits
from draftsmith.inference.core.verify import Draft
from draftsmith.inference.proposers.dflash import DFlashProposer


class DSparkProposer(DFlashProposer):
    """Drafts a chain of up to ``length`` tokens (at most ``block_size``) with a
    :class:`~draftsmith.inference.drafters.dspark.DSparkDraft` over the target's embedding and LM head."""

    name = "dspark"

    def __init__(self, draft, embed: torch.nn.Module, lm_head: torch.nn.Module, length: int | None = None,
                 confidence_threshold: float = 0.0) -> None:
        length = draft.block_size if length is None else int(length)
        if not 1 <= length <= draft.block_size:
            raise ConfigError(f"a DSpark draft of block size {draft.block_size} drafts 1 to {draft.block_size} tokens "
                              f"per step, not {length}: pass --draft-length {draft.block_size} or fewer")
        if float(confidence_threshold) > 0 and draft.confidence_head is None:
            raise ConfigError("--draft-confidence needs the draft's confidence head; this draft was trained without "
                              "it (confidence_head=false)")
        super().__init__(draft, embed, lm_head, length=1)
        self.length, self.threshold = length, float(confidence_threshold)

    def reset_stats(self) -> None:
        self.stats = {"draft_forwards": 0, "committed": 0, "drafted": 0, "stopped_by_confidence": 0}

    def report_section(self) -> tuple[str, dict]:
        name, section = super().report_section()
        s = self.stats
        return name, section | {"confidence_threshold": self.threshold, "drafted_tokens": s["drafted"],
                                "stopped_by_confidence": s["stopped_by_confidence"]}

    @torch.inference_mode()
    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        states = self._drafted_states(tokens, max_tokens, self.length, 0)  # [k, H]: length next-token queries, as vLLM
        if states is None:
            return Draft.empty()
        k = states.shape[0]
        base = self.lm_head(states).float()  # [k, V]
        drafted, conditionals, rows = [], [], []
        prev, survival = tokens[-1], 1.0
        for i in range(k):
            embedded = self.draft.markov_embed(prev)  # [r]
            if self.threshold > 0:
                survival *= float(torch.sigmoid(self.draft.confidence_logits(states[i], embedded)))
                if i and survival < self.threshold:
                    self.stats["stopped_by_confidence"] += 1
                    break
            z = self.draft.slot_logits(base[i], embedded)  # [V]
            rows.append(z)
            if sampling.greedy:
                prev = z.argmax(-1)
            else:
                q = process_logits(z, sampling)
                conditionals.append(q)
                prev = torch.multinomial(q, 1, generator=generator)[0]
            drafted.append(prev)
        self.last_draft_logits = torch.stack(rows)
        self.stats["drafted"] += len(drafted)
        chain = torch.stack(drafted)
        return Draft.chain(chain) if sampling.greedy else Draft.chain(chain, q=torch.stack(conditionals))


__all__ = ["DSparkProposer"]
