"""EAGLE drafting (Li et al. 2024): the head extrapolates the target's features token by token, as a chain
(EAGLE-1) or as EAGLE-2's dynamic tree.

Head position ``t`` reads ``[E(x_{t+1}); f_t]`` and predicts ``f^_{t+1}``, whose LM-head distribution guesses
``x_{t+2}``. The head keeps its own KV cache over the committed sequence, filled only from *true* target
features: after the prefill it holds positions ``0 .. L-2`` (the prompt's features, the pending token as the last
``x_{t+1}``). A draft continues from there on the head's own predicted features (``f^`` for ``f``), writing
entries the next :meth:`EagleProposer.observe` crops away; ``observe`` then feeds the verification's true
features at the pending token and the accepted nodes, with the committed tokens as ``x_{t+1}``, so the cache is
always in step with the accepted branch. Chain drafts: greedy drafts are argmax tokens; under sampling each
token is drawn from the head's distribution, which is returned as ``q`` so that the loop's rejection sampling
keeps the target's distribution exactly.

Dynamic tree (EAGLE-2, ``tree="dynamic"``): the root's children are the head's ``top_k`` tokens; for ``depth - 1``
more levels, the ``top_k`` nodes of the newest level with the highest cumulative draft log-probability (the
product of the head's probabilities along the path, EAGLE-2's confidence estimate of acceptance) are expanded in
one head forward (each sees the true prefix and its own ancestors in the head cache), each giving ``top_k``
children; then all candidates are reranked and the best ``total_tokens`` (closed under ancestors) form the tree
verified in one target forward (:func:`~draftsmith.inference.core.trees.rerank`). With a measured verification cost
(``verify_cost``, ``--tree-nodes auto``) the number kept is chosen per step instead: the count whose expected
committed tokens per second of the step is highest (:func:`~draftsmith.inference.core.trees.size_for_step`), at most
``total_tokens``. A node's chance of acceptance is its path probability scaled by how the draft's confidence has
held up so far (accepted nodes over the summed probability of the nodes verified: a head that is under- or
over-confident is corrected; both kept across answers), and the step's drafting time (a running mean of the loop's
measurements) is counted. The tree's tokens are deterministic functions of the head's outputs (one-hot proposals),
so the loop's multi-branch verification keeps greedy decoding identical and sampling exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.proposer import StepFeedback
from draftsmith.inference.core.sampling import SamplingParams, process_logits
from draftsmith.inference.core.trees import forced_ranks, kept_parents, rerank_order, size_for_step
from draftsmith.inference.core.verify import Draft

TREES = ("chain", "dynamic")


class EagleProposer:
    """Drafts with an EAGLE head (:class:`~draftsmith.inference.drafters.eagle.EagleHead` or
    :class:`~draftsmith.inference.drafters.eagle.Eagle3Head`) over the target's embedding (and, for EAGLE-1, its LM head): a
    chain of up to ``length`` tokens, or EAGLE-2's dynamic tree of ``total_tokens`` (or, with ``verify_cost``, a
    :class:`~draftsmith.inference.evaluation.cost.CostModel` of the target, a per-step count up to ``total_tokens``)."""

    name = "eagle"
    lossless = True

    def __init__(self, head, embed: torch.nn.Module, lm_head: torch.nn.Module, length: int = 5,
                 tree: str = "chain", depth: int = 5, top_k: int = 8, total_tokens: int = 32, verify_cost=None,
                 temperatures: Sequence[float] | None = None) -> None:
        if min(length, depth, top_k, total_tokens) < 1:
            raise ConfigError(f"EAGLE needs draft length, tree depth, top-k and total tokens >= 1, got {length}, "
                              f"{depth}, {top_k}, {total_tokens}")
        if tree not in TREES:
            raise ConfigError(f"EAGLE tree {tree!r} is unknown: choose one of {', '.join(TREES)}")
        self.head, self.embed, self.lm_head, self.length = head.eval(), embed, lm_head, int(length)
        self.hidden_layers = tuple(head.hidden_layers)  # the target layers the loop hands over
        self._t2d = getattr(head, "t2d", None)  # EAGLE-3's [V] bool draft vocabulary (None: EAGLE-1 drafts any token)
        # [V] target id -> draft id (-1: not in the draft vocabulary); None: the identity
        self._draft_of = None if self._t2d is None else torch.where(self._t2d, self._t2d.long().cumsum(0) - 1, -1)
        # per tree depth, the temperature that calibrates the head's probabilities (tree_calibration); 1 = as trained
        self.temperatures = tuple(float(t) for t in (temperatures or ()))
        if any(t <= 0 for t in self.temperatures):
            raise ConfigError(f"EAGLE tree temperatures must be > 0, got {list(self.temperatures)}")
        self.last_draft_logits: torch.Tensor | None = None  # [k, Vd] the last chain's logits per drafted depth
        self.vocab_size = int(lm_head.weight.shape[0])
        self.tree, self.depth, self.top_k, self.total_tokens = tree, int(depth), int(top_k), int(total_tokens)
        if tree == "dynamic":
            self.name = "eagle (dynamic tree)"
        self.verify_cost = verify_cost
        if verify_cost is not None:  # [N] V(n + 1) / V(1) for n = 1 .. total_tokens kept nodes
            self._relative = torch.tensor([verify_cost.relative_verify(n + 1) for n in range(1, self.total_tokens + 1)],
                                          dtype=torch.float64)
        self._draft_seconds: float | None = None  # running mean of one step's drafting time (cost-sized trees)
        self._verified_mass, self._verified_hits = 0.0, 0  # summed path probability of verified nodes, accepted ones
        self._pending_mass: float | None = None  # the last tree's, until its verification is observed
        self.reset_stats()
        self._prompt: torch.Tensor | None = None  # [L] the sequence's prompt (for the prefill)
        self._cache = None
        self._true = 0  # head positions filled from true target features (= committed tokens - 1)
        self._feature: torch.Tensor | None = None  # [H] the head's output at the last true position

    def reset_stats(self) -> None:
        self.stats = {"trees": 0, "nodes": 0, "committed": 0, "outside": 0}  # outside: committed, not draftable
        self._outside: torch.Tensor | None = None  # [] the outside count summed on the device, read when reported

    def report_section(self) -> tuple[str, dict]:
        """``("tree_size", {...})``: how the dynamic tree's size was set (a fixed count, or per step on the measured
        cost, with the mean kept and the drafting cost in plain steps); for EAGLE-3, ``draft_vocab``: the share of
        committed tokens outside the draft vocabulary, which no draft could have proposed."""
        s = self.stats
        if self._outside is not None:  # the one read of the count, at report time
            s["outside"] += int(self._outside)
            self._outside = None
        vocab = {}
        if self._t2d is not None:  # EAGLE-3: how often the target chose a token it cannot draft
            vocab = {"draft_vocab": {"size": int(self._t2d.sum()), "committed_tokens": s["committed"],
                                     "outside_fraction": s["outside"] / max(1, s["committed"])}}
        if self.tree != "dynamic":
            return "tree_size", {"rule": "chain", "draft_length": self.length} | vocab
        section = {"rule": "cost" if self.verify_cost is not None else "fixed", "total_tokens": self.total_tokens,
                   "depth": self.depth, "top_k": self.top_k, "mean_nodes": s["nodes"] / max(1, s["trees"])} | vocab
        if self.verify_cost is not None:
            section["draft_cost_in_steps"] = (self._draft_seconds or 0.0) / self.verify_cost.verify(1)
            section["confidence_scale"] = (self._verified_hits + 1.0) / (self._verified_mass + 1.0)
        return "tree_size", section

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = prompt_ids
        self._cache = self.head.new_cache(capacity=max(256, 2 * prompt_ids.numel()))
        self._true, self._feature = 0, None

    @torch.inference_mode()
    def _feed(self, next_tokens: torch.Tensor, features: dict[int, torch.Tensor]) -> torch.Tensor:  # -> [m, H]
        """Run the head on true inputs (``next_tokens`` [m] and the target's ``features`` {layer: [m, Ht]}) at
        positions ``_true .. _true + m - 1`` and advance ``_true``."""
        m = next_tokens.numel()
        dtype = self.embed.weight.dtype
        hidden = self.head.fuse({i: f[:m].to(dtype) for i, f in features.items()})  # [m, H]
        pos = torch.arange(self._true, self._true + m, device=hidden.device)[None]  # [1, m]
        out = self.head(self.embed(next_tokens)[None], hidden[None], pos, self._cache)
        self._true += m
        return out[0]

    def prefill_hidden(self, hidden_states: dict[int, torch.Tensor]) -> None:
        rows = next(iter(hidden_states.values()))  # [L - 1, Ht]: the features of x_0 .. x_{L-2}
        if rows.shape[0] == 0:
            return
        self._feature = self._feed(self._prompt[1:].to(rows.device), hidden_states)[-1]

    def observe(self, feedback: StepFeedback) -> None:
        if self._pending_mass is not None:  # a cost-sized tree was verified: calibrate the confidence and the cost
            self._verified_mass += self._pending_mass
            self._verified_hits += feedback.num_accepted
            s = feedback.draft_seconds
            self._draft_seconds = s if self._draft_seconds is None else 0.9 * self._draft_seconds + 0.1 * s
            self._pending_mass = None
        if self._feature is None:
            return
        self._cache.crop(self._true)  # drop the draft's own entries
        if not feedback.committed:
            return
        committed = feedback.committed_ids  # [a + 1] on the device, from the verdict
        if committed is None:
            committed = torch.tensor(feedback.committed, dtype=torch.long, device=self._feature.device)
        if self._t2d is not None:
            self.stats["committed"] += committed.numel()
            outside = (~self._t2d[committed]).sum()  # [] kept on the device until reported
            self._outside = outside if self._outside is None else self._outside + outside
        self._feature = self._feed(committed, feedback.hidden_states)[-1]  # features at the pending token + accepted

    @torch.inference_mode()
    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        k = min(self.length, max_tokens)
        if self._feature is None or k <= 0 or tokens.numel() - 1 != self._true:
            return Draft.empty()  # no features yet, or the head fell out of step (a step that drafted nothing)
        if self.tree == "dynamic":
            return self._dynamic_tree(self.total_tokens, min(self.depth, max_tokens))
        feature, pos = self._feature, self._true
        drafted: list[torch.Tensor] = []  # [] target ids, on the device: the chain is read once, with the verdict
        qs: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            logits = self.head.draft_logits(feature, self.lm_head).float()  # [Vd]
            rows.append(logits)
            if sampling.greedy:
                idx = logits.argmax()
            else:
                q = process_logits(logits, sampling)  # [Vd]
                idx = torch.multinomial(q, 1, generator=generator)[0]
                qs.append(self._on_target_vocab(q))
            tok = self.head.to_target(idx)  # []
            drafted.append(tok)
            if i + 1 < k:  # the head's next position reads its own feature
                p = torch.arange(pos, pos + 1, device=feature.device)[None]  # [1, 1]
                feature = self.head(self.embed(tok.reshape(1, 1)), feature[None, None], p, self._cache)[0, -1]
                pos += 1
        self.last_draft_logits = torch.stack(rows)
        return Draft.chain(torch.stack(drafted), q=torch.stack(qs) if qs else None)

    def draft_index(self, tokens: torch.Tensor) -> torch.Tensor:  # [m] target ids -> [m] draft ids (-1: outside)
        """Target token ids as indices into the vocabulary the head drafts from (tree calibration)."""
        return tokens if self._draft_of is None else self._draft_of.to(tokens.device)[tokens]

    def _on_target_vocab(self, q: torch.Tensor) -> torch.Tensor:  # [Vd] -> [V]
        """A draft-vocabulary distribution as one over the target's vocabulary (zero outside the draft's)."""
        if q.numel() == self.vocab_size:
            return q
        full = q.new_zeros(self.vocab_size)
        full[self.head.to_target(torch.arange(q.numel(), device=q.device))] = q
        return full

    def _logprobs(self, features: torch.Tensor, depth: int) -> torch.Tensor:  # [m, H] -> [m, Vd]
        """The head's log-probabilities for tree depth ``depth`` (1 = the root's children), at that depth's
        calibrated temperature."""
        logits = self.head.draft_logits(features, self.lm_head).float()
        t = self.temperatures[min(depth, len(self.temperatures)) - 1] if self.temperatures else 1.0
        return torch.log_softmax(logits / t, dim=-1)

    def _dynamic_tree(self, total: int, depth: int) -> Draft:
        """EAGLE-2's expansion and rerank (module docstring), ``depth`` levels (fewer than the tree's near the end of
        an answer). The host reads each level's expanded nodes once (not the first level's: the root's children, in
        their order) and the kept nodes once; the tokens, features, scores and head-cache visibility stay on the
        device."""
        device, k = self._feature.device, self.top_k
        top = self._logprobs(self._feature[None], 1)[0].topk(k)  # the root's children, best first
        tokens, scores = [self.head.to_target(top.indices)], [top.values]  # per level: [c] target ids, log-probs
        depths = [torch.ones(k, dtype=torch.long, device=device)]  # per level: [c]
        parents: list[int] = [-1] * k  # candidate index of each node's parent (-1 = root), on the host
        offset = 0  # candidate index of the first node of the newest level
        spine = [0]  # candidate index of the top-1 chain's node at each level: always expanded and kept
        feats = self._feature[None]  # [e, H] the head's output at the last expanded nodes (first: the root)
        seen = torch.zeros(1, 0, dtype=torch.bool, device=device)  # [e, slots] the draft slots each of them sees
        for level in range(1, depth):
            level_scores = scores[-1]
            if level == 1:  # all k children of the root, already best first: no read
                chosen, picked = torch.arange(k, device=device), list(range(k))
            else:
                chosen = level_scores.topk(min(k, level_scores.numel())).indices  # [e] within the level
                picked = chosen.tolist()  # the level's one device-to-host read
            if spine[-1] - offset not in picked:  # the chain's node ranks below the level's top-k
                picked[-1] = chosen[-1] = spine[-1] - offset
            cands = [offset + i for i in picked]
            e = len(cands)
            rows = chosen // k if level > 1 else torch.zeros(e, dtype=torch.long, device=device)  # [e] parent rows
            seen = torch.cat([seen.index_select(0, rows), torch.eye(e, dtype=torch.bool, device=device)], dim=1)
            past = self._cache.get_seq_length(0)
            visible = torch.cat([seen.new_ones(e, past + e - seen.shape[1]), seen], dim=1)  # [e, past + e]
            ids = tokens[-1].index_select(0, chosen)  # [e]
            pos = torch.full((1, e), self._true + level - 1, device=device)
            out = self.head(self.embed(ids)[None], feats.index_select(0, rows)[None], pos, self._cache,
                            visible=visible)[0]  # [e, H]
            feats = out
            child = self._logprobs(out, level + 1).topk(k, dim=-1)  # [e, k]
            offset += level_scores.numel()
            spine.append(offset + cands.index(spine[-1]) * k)  # the chain node's top-1 child
            tokens.append(self.head.to_target(child.indices).reshape(-1))
            scores.append((level_scores[chosen][:, None] + child.values).reshape(-1))
            parents += [c for c in cands for _ in range(k)]
            depths.append(torch.full((e * k,), level + 1, dtype=torch.long, device=device))
        all_scores = torch.cat(scores)  # [c] on the device
        host_scores = None
        if self.verify_cost is not None:  # the cost-sized count needs the scores on the host: one more read
            host_scores = all_scores.cpu()
            total = min(total, self._size(host_scores))
        order = rerank_order(all_scores, torch.cat(depths), total, forced_ranks(all_scores.numel(), spine, device))
        keep = order.tolist()  # the kept nodes: the tree's last read
        new_parents = torch.tensor(kept_parents(keep, parents), dtype=torch.long)
        if host_scores is not None:
            self._pending_mass = float(host_scores[keep].double().exp().sum())
        self.stats["trees"] += 1
        self.stats["nodes"] += len(keep)
        return Draft(tokens=torch.cat(tokens).index_select(0, order), parents=new_parents)

    def _size(self, scores: torch.Tensor) -> int:  # scores [c]: cumulative draft log-probabilities
        """Nodes to keep this step (:func:`~draftsmith.inference.core.trees.size_for_step`) from the calibrated path
        probabilities and the drafting cost in plain decoding steps (module docstring)."""
        scale = (self._verified_hits + 1.0) / (self._verified_mass + 1.0)  # observed ÷ expected accepted nodes
        draft = (self._draft_seconds or 0.0) / self.verify_cost.verify(1)
        return size_for_step((scores.double().exp() * scale).clamp(max=1.0), draft + self._relative)


__all__ = ["EagleProposer"]
