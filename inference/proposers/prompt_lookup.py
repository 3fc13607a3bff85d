"""Prompt lookup decoding (Saxena 2023): copy what followed an earlier occurrence of the context's last n-gram.

Training-free and deterministic. At every step the proposer

1. **matches longest first**: it looks the context's final ``n`` tokens up among the committed tokens for
   ``n = max_ngram`` down to ``min_ngram`` and stops at the first ``n`` that occurred before. It never
   matches fewer than ``min_ngram`` tokens (default 2): a lone token occurs almost everywhere, and its
   copies are mostly rejected;
2. **builds one chain from every earlier occurrence** of that n-gram (the ``max_candidates`` most
   recent): at each depth it drafts the token that most of the occurrences still agreeing with the chain
   continue with (ties: the most recent occurrence's), and drops the occurrences that disagree. With one
   occurrence left it copies that one. A continuation that runs into the end of the context goes on
   copying the chain itself, so a span that repeats (``a b c a b c a b``) is drafted at full length
   rather than cut where the context ends;
3. **adapts the draft length to how often copies are accepted**, per match length ``n``: it keeps decayed
   counts of the copied tokens that were accepted (``A``) and of the drafts that met a rejection (``R``),
   whose ratio ``alpha = A / (A + R)`` (with a prior) is the per-token acceptance of a geometric model
   (Leviathan et al. 2023). The draft is as long as the copied tokens stay likely to be accepted, the
   largest ``k`` with ``alpha ** k >= threshold``, within ``[1, num_draft_tokens]``: a fully accepted draft
   raises ``alpha`` and lengthens the next ones, a rejection lowers it and shortens them. The estimates
   live as long as the proposer (``reset`` starts a sequence, not the statistics), like the running
   estimates of :class:`~draftsmith.inference.core.draft_length.DraftLengthPolicy`. ``adaptive=False`` always
   drafts up to ``num_draft_tokens``.

With ``tree=True`` the candidates are not voted into one chain but drafted as a small token tree, verified
in the same single forward: the trie of the occurrences' continuations, each node scored by its estimated
chance of acceptance, ``alpha ** depth * share`` (``share``: the fraction of the occurrences whose
continuation passes through it), keeping the nodes that score at least ``threshold`` — the chain's length
rule, node by node — and at most ``num_draft_tokens`` of the best (EAGLE-2's rerank). Where the occurrences
agree the tree is the chain; where they split, the likelier branches of the split replace the chain's least
likely deep tokens, so the rows verified buy more expected accepted tokens.

With a measured verification cost (``verify_cost``, a :class:`~draftsmith.inference.evaluation.cost.CostModel`; ``draftsmith
eval --pld-length cost``) the size of each step's draft comes from the cost model instead of the fixed threshold:
of the candidates (the chain's tokens, each accepted with chance ``alpha ** depth``, or the tree's nodes, scored
as above) it keeps the ``n`` likeliest that maximise the expected tokens committed per unit of verification time,
``(1 + sum of their chances) / V(n + 1)`` (:func:`~draftsmith.inference.core.trees.size_for_step`; copying itself costs
nothing next to a target forward), so a target whose forward over 16 tokens costs what one does drafts long, and
this CPU, where it costs about twice as much, drafts short.

The n-gram table is built incrementally from the committed tokens (each new token indexes
``max_ngram - min_ngram + 1`` n-grams), so a proposal costs a few dictionary look-ups however long the
context. Proposals are a deterministic function of the committed tokens and of the acceptance counts,
so under sampling each node's ``q`` is one-hot (``Draft.q`` is None), which keeps speculative sampling
exact.
"""

from __future__ import annotations

import math

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.trees import rerank, size_for_step
from draftsmith.inference.core.verify import Draft

DEFAULT_NUM_DRAFT_TOKENS = 24
DEFAULT_MAX_NGRAM = 4
DEFAULT_MIN_NGRAM = 2
DEFAULT_THRESHOLD = 0.15


class NgramTable:
    """Every n-gram (``min_n`` .. ``max_n`` tokens) of a growing token list -> the positions right after
    its occurrences, ascending."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], list[int]] = {}

    def sync(self, tokens: list[int]) -> None:
        """Make the table describe ``tokens``: index the new tail, or start over if they do not continue
        the tokens indexed so far."""
        have = len(self.tokens)
        if len(tokens) < have or tokens[:have] != self.tokens:
            self.tokens, self.after, have = [], {}, 0
        toks, after, lo, hi = self.tokens, self.after, self.min_n, self.max_n
        for t in tokens[have:]:
            toks.append(t)
            end = len(toks)
            for n in range(lo, min(hi, end) + 1):
                key = tuple(toks[end - n :])
                hits = after.get(key)
                if hits is None:
                    after[key] = [end]
                else:
                    hits.append(end)

    def occurrences(self) -> tuple[int, list[int]]:
        """``(n, starts)``: the longest ``n`` whose final n-gram occurred earlier, and the positions right
        after those earlier occurrences (ascending); ``(0, [])`` when none did."""
        toks, end = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            hits = self.after.get(tuple(toks[end - n :]))
            if hits is not None and len(hits) > 1:  # the last hit is the final n-gram itself
                return n, hits[:-1]
        return 0, []


def continuation(tokens: list[int], starts: list[int], length: int, max_candidates: int = 8) -> list[int]:
    """One chain of up to ``length`` tokens continuing the occurrences that end right before ``starts``
    (ascending positions < ``len(tokens)``): at each depth the token most still-agreeing occurrences
    continue with, ties going to the most recent; only the ``max_candidates`` most recent occurrences
    vote. Positions at or past the end of ``tokens`` continue with the chain itself (an occurrence still
    agreeing with the chain continues with its own copy, which is the chain, :func:`continuations`)."""
    alive = continuations(tokens, starts, length, max_candidates)  # most recent first
    out: list[int] = []
    for d in range(length if alive else 0):
        votes: dict[int, int] = {}
        for c in alive:  # insertion order = recency, so max() keeps the most recent among equals
            votes[c[d]] = votes.get(c[d], 0) + 1
        out.append(max(votes, key=votes.__getitem__))
        alive = [c for c in alive if c[d] == out[-1]]
    return out


def continuations(tokens: list[int], starts: list[int], length: int, max_candidates: int = 8) -> list[list[int]]:
    """The next ``length`` tokens after each of the ``max_candidates`` most recent occurrences ending right before
    ``starts`` (ascending positions < ``len(tokens)``), most recent first. An occurrence whose continuation runs
    past the end of ``tokens`` goes on copying its own continuation (position ``len(tokens) + j`` is its ``j``-th
    token), as :func:`continuation` does for the chain."""
    end = len(tokens)
    out = []
    for s in starts[::-1][:max_candidates]:
        c: list[int] = []
        for d in range(length):
            p = s + d
            c.append(tokens[p] if p < end else c[p - end])  # p - end < d since s < end
        out.append(c)
    return out


def copy_trie(conts: list[list[int]]) -> tuple[list[int], list[int], list[int], list[int]]:
    """The trie of ``conts``: ``(tokens, parents, depths, counts)`` per node, in creation order (parents first,
    siblings in the order their first continuation came: most recent first). ``parents`` -1 = the root (the
    pending token), ``depths`` 1 = a child of the root, ``counts`` = continuations through the node."""
    index: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    counts: list[int] = []
    for c in conts:
        node = -1
        for d, t in enumerate(c):
            j = index.get((node, t))
            if j is None:
                j = index[(node, t)] = len(tokens)
                tokens.append(t)
                parents.append(node)
                depths.append(d + 1)
                counts.append(0)
            counts[j] += 1
            node = j
    return tokens, parents, depths, counts


def candidate_tree(conts: list[list[int]], alpha: float, threshold: float, max_nodes: int,
                   step_cost: torch.Tensor | None = None) -> tuple[list[int], list[int]]:
    """The copy candidates as a token tree: of the trie of ``conts`` (:func:`copy_trie`), the nodes whose estimated
    chance of acceptance ``alpha ** depth * count / len(conts)`` is at least ``threshold`` (always the best first
    token), at most ``max_nodes`` of the likeliest — and with ``step_cost`` (``[N]``, the relative cost of verifying
    ``n = 1 .. N`` nodes) as many of them as :func:`~draftsmith.inference.core.trees.size_for_step` finds best. A node
    never scores above its parent (``alpha <= 1``), so the kept nodes are closed under parents. Returns ``(tokens,
    parents)`` in topological order (``parents`` index into the kept nodes, -1 = the root)."""
    tokens, parents, depths, counts = copy_trie(conts)
    if not tokens:
        return [], []
    # log of the estimated acceptance chance; -inf drops a node below the threshold
    log_alpha = math.log(alpha) if alpha > 0 else -math.inf
    score = [d * log_alpha + math.log(c / len(conts)) for d, c in zip(depths, counts, strict=True)]
    floor = math.log(threshold) if threshold > 0 else -math.inf
    best_first = max((i for i, d in enumerate(depths) if d == 1), key=lambda i: (score[i], -i))
    score = [x if x >= floor or i == best_first else -math.inf for i, x in enumerate(score)]
    scores = torch.tensor(score, dtype=torch.float64)  # [c]
    total = min(max_nodes, int(torch.isfinite(scores).sum()))
    if step_cost is not None:
        total = min(total, size_for_step(scores[torch.isfinite(scores)].exp(), step_cost))
    keep, new_parents = rerank(scores, torch.tensor(parents), torch.tensor(depths), total)
    return [tokens[i] for i in keep.tolist()], new_parents.tolist()


class CopyAcceptance:
    """Per match class: decayed counts of accepted copied tokens and of rejections -> the per-token
    acceptance ``alpha`` of a geometric model, and the draft length ``floor(log(threshold) / log(alpha))``."""

    def __init__(self, max_length: int, threshold: float = DEFAULT_THRESHOLD, prior: float = 0.8,
                 prior_weight: float = 2.0, decay: float = 0.995) -> None:
        if not 0.0 < threshold < 1.0:
            raise ConfigError(f"threshold must lie in (0, 1), got {threshold}")
        self.max_length, self.threshold = max_length, threshold
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.counts: dict[int, tuple[float, float]] = {}  # class -> (accepted tokens, rejections)

    def alpha(self, cls: int) -> float:
        accepted, rejected = self.counts.get(cls, (0.0, 0.0))
        return (accepted + self.prior * self.prior_weight) / (accepted + rejected + self.prior_weight)

    def length(self, cls: int) -> int:
        a = self.alpha(cls)
        if a >= 1.0:
            return self.max_length
        if a <= self.threshold:
            return 1
        return max(1, min(self.max_length, int(math.log(self.threshold) / math.log(a))))

    def observe(self, cls: int, proposed: int, accepted: int) -> None:
        """A chain of ``proposed`` copies of which the first ``accepted`` were accepted."""
        self.record(cls, accepted, accepted < proposed)

    def record(self, cls: int, accepted: int, rejected: bool) -> None:
        """``accepted`` copied tokens accepted, and whether the draft met a rejection (a tree: the accepted branch
        stopped at a node that had children)."""
        a, r = self.counts.get(cls, (0.0, 0.0))
        self.counts[cls] = (a * self.decay + accepted, r * self.decay + rejected)


class PromptLookupProposer:
    """Prompt lookup (see the module docstring). ``num_draft_tokens``: the longest draft; ``max_ngram`` /
    ``min_ngram``: the n-gram lengths matched, longest first; ``adaptive``: the draft length follows the
    acceptance of copies (else always ``num_draft_tokens``); ``threshold``: the acceptance chance below
    which a copied token is not drafted (lower it where verifying more tokens costs little, on GPUs);
    ``tree``: draft the candidates of the several occurrences as a token tree of at most ``num_draft_tokens``
    nodes instead of one voted chain; ``verify_cost``: size each draft on this measured cost model rather than by
    ``threshold`` (see the module docstring; the acceptance estimates still adapt)."""

    name = "pld"
    lossless = True
    hidden_layers: tuple[int, ...] = ()

    def __init__(
        self,
        num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        *,
        adaptive: bool = True,
        threshold: float = DEFAULT_THRESHOLD,
        max_candidates: int = 8,
        tree: bool = False,
        verify_cost=None,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if num_draft_tokens < 1:
            raise ConfigError(f"num_draft_tokens must be at least 1, got {num_draft_tokens}")
        if max_candidates < 1:
            raise ConfigError(f"max_candidates must be at least 1, got {max_candidates}")
        self.num_draft_tokens = num_draft_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.adaptive = adaptive
        self.threshold = threshold
        self.max_candidates = max_candidates
        self.tree = tree
        self.verify_cost = verify_cost
        self._step_cost = None  # [N] V(n + 1) / V(1) for n = 1 .. num_draft_tokens drafted tokens
        if verify_cost is not None:
            self._step_cost = torch.tensor([verify_cost.relative_verify(n + 1) for n in range(1, num_draft_tokens + 1)],
                                           dtype=torch.float64)
        self.acceptance = CopyAcceptance(num_draft_tokens, threshold)
        self._table = NgramTable(min_ngram, max_ngram)
        self._host: list[int] = []  # the sequence on the host (reset, then observe)
        self._last_n = 0  # match length behind the pending proposal (0: none)
        self._inner: set[int] = set()  # nodes of the pending tree proposal that have children (-1: the root)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.stats = {"drafts": 0, "nodes": 0, "branched": 0}  # branched: drafts with a node of two children

    def report_section(self) -> tuple[str, dict]:
        """``("prompt_lookup", {...})``: the draft's shape (chain or tree) and sizing rule (threshold, fixed or the
        measured cost), and per draft the mean nodes and the share that branched."""
        s = self.stats
        rule = "fixed" if not self.adaptive else ("cost" if self.verify_cost is not None else "threshold")
        section = {"shape": "tree" if self.tree else "chain", "size_rule": rule, "drafts": s["drafts"],
                   "mean_nodes": s["nodes"] / max(1, s["drafts"]), "branched_fraction": s["branched"] / max(1, s["drafts"])}
        if self._step_cost is not None:  # V(n + 1) / V(1) for n = 1 .. num_draft_tokens, as measured
            section["relative_verify"] = [round(float(x), 4) for x in self._step_cost]
        return "prompt_lookup", section

    def reset(self, prompt_ids: torch.Tensor) -> None:
        """Start a sequence: index the prompt. The acceptance estimates carry over."""
        self._last_n = 0
        self._table = NgramTable(self.min_ngram, self.max_ngram)
        self._host = prompt_ids.reshape(-1).tolist()  # the sequence on the host, extended by observe()
        self._table.sync(self._host)

    def draft_length(self, n: int) -> int:
        """The longest draft for a match of ``n`` tokens (sized on the cost model: up to ``num_draft_tokens``)."""
        return self.acceptance.length(n) if self.adaptive and self.verify_cost is None else self.num_draft_tokens

    def _scoring(self, n: int) -> tuple[float, float]:
        """``(alpha, threshold)`` that score a match of ``n`` tokens' candidates: the fixed length ranks them by share
        alone and fills the node budget; the cost model sizes them with no threshold."""
        if not self.adaptive:
            return 1.0, 0.0
        return self.acceptance.alpha(n), (0.0 if self.verify_cost is not None else self.threshold)

    def _match(self, tokens: torch.Tensor | list[int], max_depth: int | None) -> tuple[int, list[int], int]:
        """``(n, starts, depth)``: the longest match after ``tokens`` (:meth:`NgramTable.occurrences`; ``n = 0``: none)
        and how deep to draft from it, at most ``max_depth``."""
        self._table.sync(tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens))
        n, starts = self._table.occurrences()
        depth = self.draft_length(n) if max_depth is None else min(self.draft_length(n), max_depth)
        return n, starts, depth

    def lookup(self, tokens: torch.Tensor | list[int], max_tokens: int | None = None) -> tuple[int, list[int]]:
        """``(n, chain)``: the match length and the chain drafted after ``tokens`` (``(0, [])``: no match)."""
        n, starts, k = self._match(tokens, max_tokens)
        if not starts:
            return 0, []
        chain = continuation(self._table.tokens, starts, k, self.max_candidates)
        if self._step_cost is not None and chain:  # token d of the chain is accepted with chance alpha ** d
            chances = self.acceptance.alpha(n) ** torch.arange(1, len(chain) + 1, dtype=torch.float64)
            chain = chain[: size_for_step(chances, self._step_cost)]
        return n, chain

    def lookup_tree(self, tokens: torch.Tensor | list[int], max_depth: int | None = None) -> tuple[int, list[int],
                                                                                                  list[int]]:
        """``(n, tokens, parents)``: the match length and the candidate tree drafted after ``tokens``, at most
        ``max_depth`` deep (``(0, [], [])``: no match)."""
        n, starts, depth = self._match(tokens, max_depth)
        if not starts:
            return 0, [], []
        conts = continuations(self._table.tokens, starts, depth, self.max_candidates)
        nodes, parents = candidate_tree(conts, *self._scoring(n), self.num_draft_tokens, self._step_cost)
        return n, nodes, parents

    def propose(self, tokens, max_tokens, sampling: SamplingParams, generator=None) -> Draft:
        self._last_n = 0
        if max_tokens <= 0:
            return Draft.empty()
        device = tokens.device
        if len(self._host) == tokens.numel():  # kept in step by observe(): no device read of the context
            tokens = self._host
        if self.tree:
            n, nodes, parents = self.lookup_tree(tokens, max_tokens)
        else:
            n, nodes = self.lookup(tokens, max_tokens)
            parents = list(range(-1, len(nodes) - 1))
        if not nodes:
            return Draft.empty()
        self._last_n, self._inner = n, set(parents)
        self.stats["drafts"] += 1
        self.stats["nodes"] += len(nodes)
        self.stats["branched"] += len(self._inner) < len(parents)
        return Draft(tokens=torch.tensor(nodes, dtype=torch.long, device=device),
                     parents=torch.tensor(parents, dtype=torch.long))

    def observe(self, feedback) -> None:
        """Count the step's accepted copies and its rejection (if any) for the match length it drafted from: the
        accepted branch stopped at a node with children (in a chain: before its last token)."""
        self._host.extend(feedback.committed)
        n, self._last_n = self._last_n, 0
        if not n or feedback.num_proposed <= 0:
            return
        if self.tree:
            last = feedback.accepted[-1] if feedback.accepted else -1
            self.acceptance.record(n, feedback.num_accepted, last in self._inner)
        else:
            self.acceptance.observe(n, feedback.num_proposed, feedback.num_accepted)
