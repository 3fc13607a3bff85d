"""DFlash drafting (:mod:`draftsmith.inference.drafters.dflash`): each step one draft forward over the block
``[x_p, MASK x K]`` fills ``K`` draft tokens, verified as a chain in one target forward.

The draft keeps a KV cache of *context* keys and values only: after the prefill, those of the prompt's processed
positions ``0 .. L-2``; after each verification, those of the pending token and the accepted drafts (the target's
hidden states at them, which the loop hands over), appended at their positions. A block's own keys are appended for
the forward and cropped at once, so the cache always holds exactly the positions the target has processed, as vLLM's
DFlash proposer keeps it. Greedy drafts are each mask slot's argmax; sampled drafts draw each slot from its own
distribution and return it as ``q`` (one proposal per slot, none depending on the drafts before it), so the loop's
rejection sampling keeps the target's distribution exactly. A static tree
(:class:`~draftsmith.inference.core.trees.StaticTree`, as Medusa's: slot ``d`` plays head ``d``'s part) holds each
slot's top-k candidates instead, deterministic nodes the loop's multi-branch verification keeps exact."""

from __future__ import annotations

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.kv_cache import KVCache
from draftsmith.inference.core.proposer import StepFeedback
from draftsmith.inference.core.sampling import SamplingParams, process_logits
from draftsmith.inference.core.trees import StaticTree
from draftsmith.inference.core.verify import Draft


class DFlashProposer:
    """Drafts a chain of up to ``length`` tokens (the block's mask slots, at most ``block_size - 1``) with a
    :class:`~draftsmith.inference.drafters.dflash.DFlashDraft` over the target's embedding and LM head."""

    name = "dflash"
    lossless = True

    def __init__(self, draft, embed: torch.nn.Module, lm_head: torch.nn.Module, length: int | None = None,
                 tree: StaticTree | None = None) -> None:
        length = draft.block_size - 1 if length is None else int(length)
        if not 1 <= length <= draft.block_size - 1:
            raise ConfigError(f"a DFlash draft of block size {draft.block_size} drafts 1 to {draft.block_size - 1} "
                              f"tokens per step, not {length}: pass --draft-length {draft.block_size - 1} or fewer")
        if tree is not None and tree.max_depth > length:
            raise ConfigError(f"the tree is {tree.max_depth} deep but the block drafts {length} tokens: use a "
                              "shallower tree or a longer --draft-length")
        self.draft, self.embed, self.lm_head, self.length, self.tree = draft.eval(), embed, lm_head, length, tree
        if tree is not None:
            self.name = "dflash (static tree)"
        self.last_draft_logits: torch.Tensor | None = None  # [k, V] the block's logits per drafted slot
        self.hidden_layers = tuple(draft.hidden_layers)  # the target layers the loop hands over
        self._cache: KVCache | None = None
        self._true = 0  # context positions in the cache (= committed tokens - 1)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.stats = {"draft_forwards": 0, "committed": 0}

    def report_section(self) -> tuple[str, dict]:
        """``("block", {...})``: the block drafted per step and the draft's forwards per committed token."""
        s = self.stats
        tree = {} if self.tree is None else {"tree_nodes": len(self.tree), "tree_top_k": self.tree.top_k}
        return "block", {"block_size": self.draft.block_size, "draft_length": self.length,
                         "draft_forwards": s["draft_forwards"], "committed_tokens": s["committed"],
                         "draft_forwards_per_token": s["draft_forwards"] / max(1, s["committed"])} | tree

    def draft_index(self, tokens: torch.Tensor) -> torch.Tensor:  # [m] target ids: the draft's vocabulary too
        return tokens

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._cache = KVCache(len(self.draft.layers), capacity=max(256, 2 * prompt_ids.numel()))
        self._true = 0

    @torch.inference_mode()
    def _add_context(self, features: dict[int, torch.Tensor], m: int) -> None:
        """The context keys of the next ``m`` positions (the target's ``features`` {layer: [>= m, Ht]})."""
        dtype = self.embed.weight.dtype
        context = self.draft.context({i: f[:m].to(dtype) for i, f in features.items()})[None]  # [1, m, H]
        pos = torch.arange(self._true, self._true + m, device=context.device)[None]  # [1, m]
        for i, (key, value) in enumerate(self.draft.context_keys(context, pos)):
            self._cache.update(key, value, i)
        self._true += m

    def prefill_hidden(self, hidden_states: dict[int, torch.Tensor]) -> None:
        rows = next(iter(hidden_states.values()))  # [L - 1, Ht]: the prompt's processed positions
        if rows.shape[0]:
            self._add_context(hidden_states, rows.shape[0])

    def observe(self, feedback: StepFeedback) -> None:
        self._cache.crop(self._true)
        self.stats["committed"] += len(feedback.committed)
        if feedback.committed:  # the pending token and the accepted drafts are processed now
            self._add_context(feedback.hidden_states, len(feedback.committed))

    def _block_states(self, tokens: torch.Tensor, q_len: int) -> torch.Tensor:  # -> [Q, H]
        """One draft forward over the block ``[x_p, MASK x (q_len - 1)]`` at positions ``p ..`` seeing all the
        context and the whole block; its keys are cropped from the cache at once."""
        ids = torch.full((q_len,), self.draft.mask_token_id, dtype=torch.long, device=tokens.device)
        ids[0] = tokens[-1]
        pos = torch.arange(self._true, self._true + q_len, device=tokens.device)[None]  # [1, Q]
        visible = torch.ones(q_len, self._true + q_len, dtype=torch.bool, device=tokens.device)  # all context, block
        states = self.draft(self.embed(ids)[None], pos, self._cache, visible)[0]  # [Q, H]
        self._cache.crop(self._true)
        self.stats["draft_forwards"] += 1
        return states

    def _drafted_states(self, tokens: torch.Tensor, max_tokens: int, queries: int,
                        first: int) -> torch.Tensor | None:  # -> [k, H]
        """The states of the ``k = min(length, max_tokens)`` drafted rows, from row ``first`` of a ``queries``-row block
        forward; None when there is nothing to draft (no prefill yet, no room, or a sequence the cache does not hold)."""
        k = min(self.length, max_tokens)
        if self._cache is None or k <= 0 or tokens.numel() - 1 != self._true:
            return None
        return self._block_states(tokens, queries)[first: first + k]

    @torch.inference_mode()
    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        states = self._drafted_states(tokens, max_tokens, 1 + self.length, 1)  # [k, H]: the block as trained and as vLLM
        if states is None:
            return Draft.empty()
        k = states.shape[0]
        logits = self.lm_head(states).float()  # [k, V]
        self.last_draft_logits = logits
        if self.tree is not None:  # each slot's top-k (deterministic nodes: exact under sampling too)
            return self.tree.draft(logits.topk(self.tree.top_k, dim=-1).indices, max_depth=k)
        if sampling.greedy:
            return Draft.chain(logits.argmax(-1))
        q = torch.stack([process_logits(row, sampling) for row in logits])  # [k, V]
        return Draft.chain(torch.multinomial(q, 1, generator=generator)[:, 0], q=q)


__all__ = ["DFlashProposer"]
