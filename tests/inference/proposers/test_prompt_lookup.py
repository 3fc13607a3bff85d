"""Prompt lookup: candidates on hand-made contexts (a voted chain or a tree), the adaptive draft length, and greedy
identity with AR."""

from __future__ import annotations

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.proposer import StepFeedback
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.methods import ProposerContext
from draftsmith.inference.methods.prompt_lookup import prompt_lookup_proposer
from draftsmith.inference.proposers.prompt_lookup import (
    CopyAcceptance,
    NgramTable,
    PromptLookupProposer,
    candidate_tree,
    continuation,
    continuations,
    copy_trie,
)

GREEDY = SamplingParams()


def _propose(proposer: PromptLookupProposer, tokens: list[int], max_tokens: int = 100) -> list[int]:
    proposer.reset(torch.tensor(tokens[:1]))
    draft = proposer.propose(torch.tensor(tokens), max_tokens, GREEDY)
    assert draft.q is None  # deterministic proposals: one-hot q, exact speculative sampling
    assert draft.parents.tolist() == list(range(-1, len(draft) - 1))  # a chain
    return draft.tokens.tolist()


def _feedback(proposed: int, accepted: int, path: list[int] | None = None) -> StepFeedback:
    return StepFeedback(num_proposed=proposed, num_accepted=accepted, draft_seconds=0.0, target_seconds=0.0,
                        accepted=path if path is not None else list(range(accepted)))


def _propose_tree(proposer: PromptLookupProposer, tokens: list[int], max_tokens: int = 100) -> list[tuple[int, ...]]:
    """The drafted tree as its root-to-node token paths, in the draft's order."""
    proposer.reset(torch.tensor(tokens[:1]))
    draft = proposer.propose(torch.tensor(tokens), max_tokens, GREEDY)
    assert draft.q is None
    paths: list[tuple[int, ...]] = []
    for t, parent in zip(draft.tokens.tolist(), draft.parents.tolist(), strict=True):
        assert parent < len(paths)  # topological: the parent came first
        paths.append((paths[parent] if parent >= 0 else ()) + (t,))
    return paths


def fixed(k: int = 4, **kw) -> PromptLookupProposer:
    return PromptLookupProposer(num_draft_tokens=k, adaptive=False, **kw)


# ---------------------------------------------------------------------------------------------- candidates


def test_proposer_members():
    p = PromptLookupProposer()
    assert all(callable(getattr(p, m)) for m in ("reset", "propose", "observe"))
    assert p.name == "pld" and p.lossless and p.hidden_layers == ()


def test_longest_match_wins_over_a_shorter_more_recent_one():
    # "6 7 8" occurred once, followed by 100; "7 8" occurred later, followed by 200
    ctx = [5, 6, 7, 8, 100, 101, 102, 9, 7, 8, 200, 201, 202, 6, 7, 8]
    assert _propose(fixed(3, max_ngram=3), ctx) == [100, 101, 102]
    # matching at most 2 tokens finds the more recent "7 8" instead
    assert _propose(fixed(3, max_ngram=2), ctx) == [200, 201, 202]


def test_min_ngram_is_respected():
    ctx = [10, 11, 12, 13, 20, 21, 11]  # only the last token (11) occurred before
    assert _propose(fixed(3, min_ngram=2), ctx) == []
    assert _propose(fixed(3, min_ngram=1), ctx) == [12, 13, 20]
    # a 2-gram that occurred earlier is found again with min_ngram 2
    assert _propose(fixed(3, min_ngram=2), [10, 11, 12, 13, 20, 10, 11]) == [12, 13, 20]


def test_several_occurrences_vote_for_the_continuation():
    # "1 2" is followed by 30 twice and by 40 once, the 40 most recently
    ctx = [1, 2, 30, 31, 9, 1, 2, 30, 31, 8, 1, 2, 40, 41, 7, 1, 2]
    assert _propose(fixed(2, max_ngram=2), ctx) == [30, 31]
    # a tie goes to the most recent occurrence
    tie = [1, 2, 30, 31, 9, 1, 2, 40, 41, 8, 1, 2]
    assert _propose(fixed(2, max_ngram=2), tie) == [40, 41]


def test_the_vote_narrows_to_the_occurrences_that_agree():
    # after "1 2": 30 wins (2 of 3); of the two 30s, one goes on with 50 and one with 60 (the more recent)
    ctx = [1, 2, 30, 50, 9, 1, 2, 40, 41, 9, 1, 2, 30, 60, 9, 1, 2]
    assert continuation(ctx, [2, 7, 12], 2) == [30, 60]
    assert _propose(fixed(2, max_ngram=2), ctx) == [30, 60]


def test_no_match_gives_an_empty_draft():
    assert _propose(PromptLookupProposer(), [1, 2, 3, 4, 5, 6]) == []
    assert _propose(PromptLookupProposer(), [7]) == []  # a lone token: nothing to match


def test_max_tokens_is_respected():
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]
    p = fixed(8)
    assert _propose(p, ctx, max_tokens=100) == [3, 4, 5, 6, 7, 8, 9, 10]
    assert _propose(p, ctx, max_tokens=3) == [3, 4, 5]
    assert _propose(p, ctx, max_tokens=0) == []
    assert len(_propose(PromptLookupProposer(num_draft_tokens=5), ctx * 3)) <= 5


def test_a_repeating_span_is_drafted_past_the_end_of_the_context():
    ctx = [9, 1, 2, 3, 1, 2, 3, 1, 2]  # the continuation of the last "3 1 2" runs into the end
    assert _propose(fixed(7, max_ngram=3), ctx) == [3, 1, 2, 3, 1, 2, 3]


def test_proposals_are_deterministic_and_follow_the_context():
    p = fixed(4)
    ctx = [4, 5, 6, 7, 8, 4, 5]
    first = p.propose(torch.tensor(ctx), 10, GREEDY).tokens.tolist()
    again = p.propose(torch.tensor(ctx), 10, GREEDY).tokens.tolist()
    assert first == again == [6, 7, 8, 4]
    # committed tokens extend the context: the table follows incrementally ...
    assert p.propose(torch.tensor(ctx + [6, 7]), 10, GREEDY).tokens.tolist() == [8, 4, 5, 6]
    # ... and starts over when given tokens that do not continue what it has seen
    assert p.propose(torch.tensor([1, 2, 3, 1, 2]), 10, GREEDY).tokens.tolist() == [3, 1, 2, 3]


def test_ngram_table_indexes_every_length():
    t = NgramTable(1, 3)
    t.sync([1, 2, 1, 2])
    assert t.after[(1, 2)] == [2, 4] and t.after[(2,)] == [2, 4] and t.after[(2, 1, 2)] == [4]
    assert t.occurrences() == (2, [2])  # "1 2" ends at 2 before; the 3-gram "2 1 2" is new
    t.sync([1, 2, 1, 2, 1])
    assert t.occurrences() == (3, [3])  # "1 2 1" occurred at 0..2


def test_invalid_settings_are_refused():
    for kw in ({"min_ngram": 0}, {"min_ngram": 3, "max_ngram": 2}, {"num_draft_tokens": 0},
               {"threshold": 0.0}, {"threshold": 1.0}, {"max_candidates": 0}):
        with pytest.raises(ValueError):
            PromptLookupProposer(**kw)


# ---------------------------------------------------------------------------------------------- candidate tree


SPLIT = [1, 2, 30, 50, 9, 1, 2, 40, 41, 9, 1, 2, 30, 60, 9, 1, 2]  # after "1 2": 30 50 9 / 40 41 9 / 30 60 9


def test_continuations_run_on_past_the_end_of_the_context():
    assert continuations(SPLIT, [2, 7, 12], 3) == [[30, 60, 9], [40, 41, 9], [30, 50, 9]]  # most recent first
    assert continuations(SPLIT, [2, 7, 12], 3, max_candidates=2) == [[30, 60, 9], [40, 41, 9]]
    ctx = [9, 1, 2, 3, 1, 2]  # "1 2" at 1..2 is followed by 3 1 2, then by its own copy again
    assert continuations(ctx, [3], 7) == [[3, 1, 2, 3, 1, 2, 3]]


def test_copy_trie_merges_shared_prefixes():
    tokens, parents, depths, counts = copy_trie([[30, 60, 9], [40, 41, 9], [30, 50, 9]])
    assert tokens == [30, 60, 9, 40, 41, 9, 50, 9]
    assert parents == [-1, 0, 1, -1, 3, 4, 0, 6]
    assert depths == [1, 2, 3, 1, 2, 3, 2, 3]
    assert counts == [2, 1, 1, 1, 1, 1, 1, 1]


def test_the_voted_chain_is_the_trie_path_most_occurrences_take():
    rng = torch.Generator().manual_seed(1)
    for _ in range(300):
        toks = torch.randint(0, 3, (int(torch.randint(4, 30, (1,), generator=rng)),), generator=rng).tolist()
        table = NgramTable(1, 3)
        table.sync(toks)
        _, starts = table.occurrences()
        if not starts:
            continue
        tokens, parents, _, counts = copy_trie(continuations(toks, starts, 6))
        path, node = [], -1
        while True:  # the child most continuations pass through; ties: the first created (the most recent)
            children = [i for i, q in enumerate(parents) if q == node]
            if not children:
                break
            node = max(children, key=lambda i: (counts[i], -i))
            path.append(tokens[node])
        assert continuation(toks, starts, 6) == path


def _brute_force_scores(conts: list[list[int]], alpha: float) -> dict[tuple[int, ...], float]:
    """Every distinct prefix of the continuations -> alpha ** len * (share of the continuations it starts)."""
    prefixes = {tuple(c[:d]) for c in conts for d in range(1, len(c) + 1)}
    return {p: alpha ** len(p) * sum(tuple(c[: len(p)]) == p for c in conts) / len(conts) for p in prefixes}


@pytest.mark.parametrize("alpha,threshold,max_nodes", [(1.0, 0.0, 5), (0.9, 0.15, 24), (0.8, 0.3, 24), (0.95, 0.1, 6)])
def test_candidate_tree_keeps_the_likeliest_nodes_closed_under_parents(alpha, threshold, max_nodes):
    gen = torch.Generator().manual_seed(0)
    conts = [torch.randint(0, 3, (6,), generator=gen).tolist() for _ in range(8)]  # small alphabet: many splits
    tokens, parents = candidate_tree(conts, alpha, threshold, max_nodes)
    paths: list[tuple[int, ...]] = []
    for t, parent in zip(tokens, parents, strict=True):
        assert -1 <= parent < len(paths)
        paths.append((paths[parent] if parent >= 0 else ()) + (t,))
    assert len(set(paths)) == len(paths) <= max_nodes  # siblings differ
    scores = _brute_force_scores(conts, alpha)
    eligible = sorted((x for x in scores.values() if x >= threshold), reverse=True)[:max_nodes]
    assert sorted((scores[p] for p in paths), reverse=True) == pytest.approx(eligible)  # the best ones


def test_candidate_tree_is_the_chain_where_the_occurrences_agree():
    conts = [[5, 6, 7, 8]] * 3
    assert candidate_tree(conts, 1.0, 0.0, 10) == ([5, 6, 7, 8], [-1, 0, 1, 2])
    assert candidate_tree(conts, 0.5, 0.2, 10) == ([5, 6], [-1, 0])  # 0.5 ** 3 < 0.2
    # always the best first token, even below the threshold (the chain drafts at least one)
    assert candidate_tree([[5, 6], [7, 6], [7, 8]], 0.1, 0.5, 10) == ([7], [-1])


def test_the_proposer_drafts_both_sides_of_a_split():
    p = fixed(4, max_ngram=2, tree=True)
    # 30 (2 of 3) and 40 (1 of 3) at depth 1, then the branches below them, ties going to the shallower, then the
    # more recent occurrence
    assert _propose_tree(p, SPLIT) == [(30,), (40,), (30, 60), (40, 41)]
    assert _propose_tree(fixed(4, max_ngram=2), SPLIT) == [(30,), (30, 60), (30, 60, 9), (30, 60, 9, 1)]  # the chain
    assert max(len(path) for path in _propose_tree(p, SPLIT, max_tokens=1)) == 1
    # one occurrence: the tree is the chain
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]
    assert _propose_tree(fixed(4, tree=True), ctx) == [(3,), (3, 4), (3, 4, 5), (3, 4, 5, 6)]


def test_a_tree_counts_a_rejection_only_where_the_accepted_branch_had_children():
    p = PromptLookupProposer(num_draft_tokens=8, max_ngram=2, tree=True, threshold=0.05)
    paths = _propose_tree(p, SPLIT)
    leaf = max(range(len(paths)), key=lambda i: len(paths[i]))  # the deepest node has no children
    branch = [i for i in range(len(paths)) if paths[i] == paths[leaf][: len(paths[i])]]
    p.observe(_feedback(len(paths), len(branch), branch))
    assert p.acceptance.counts[2] == (len(branch), 0.0)
    _propose_tree(p, SPLIT)
    p.observe(_feedback(len(paths), 1, [0]))  # stopped at the first node, which has children
    accepted, rejected = p.acceptance.counts[2]
    assert rejected == 1.0 and accepted == pytest.approx(len(branch) * p.acceptance.decay + 1)


class _Cost:
    """A synthetic target whose forward over ``n`` tokens costs ``1 + slope * (n - 1)`` plain steps."""

    def __init__(self, slope: float) -> None:
        self.slope = slope

    def relative_verify(self, n: float) -> float:
        return 1.0 + self.slope * (n - 1)


def test_the_cost_model_sizes_the_chain():
    ctx = list(range(10, 40)) + [10, 11]  # one occurrence: 28 tokens to copy
    flat = PromptLookupProposer(num_draft_tokens=12, verify_cost=_Cost(0.0))
    assert len(_propose(flat, ctx)) == 12  # verifying more costs nothing: draft all the budget
    steep = PromptLookupProposer(num_draft_tokens=12, verify_cost=_Cost(1.0))
    assert len(_propose(steep, ctx)) == 1  # each token costs a whole step: only the likeliest pays
    # alpha 0.8 (the prior) and a forward over n tokens costing 1 + 0.1 (n - 1) steps: the best n by brute force
    mid = PromptLookupProposer(num_draft_tokens=12, verify_cost=_Cost(0.1))
    alpha = mid.acceptance.alpha(2)
    rate = [(1 + sum(alpha ** d for d in range(1, n + 1))) / (1 + 0.1 * n) for n in range(1, 13)]
    assert len(_propose(mid, ctx)) == rate.index(max(rate)) + 1


def test_the_cost_model_sizes_the_tree():
    flat = PromptLookupProposer(num_draft_tokens=6, max_ngram=2, tree=True, verify_cost=_Cost(0.0))
    assert len(_propose_tree(flat, SPLIT)) == 6
    steep = PromptLookupProposer(num_draft_tokens=6, max_ngram=2, tree=True, verify_cost=_Cost(1.0))
    assert _propose_tree(steep, SPLIT) == [(30,)]  # the likeliest node alone
    # candidate_tree with a cost keeps the likeliest nodes the brute-force rate prefers
    conts = continuations(SPLIT, [2, 7, 12], 3)
    scores = sorted(_brute_force_scores(conts, 0.9).values(), reverse=True)
    cost = torch.tensor([1.0 + 0.3 * n for n in range(1, 9)], dtype=torch.float64)
    rate = [(1 + sum(scores[:n])) / float(cost[n - 1]) for n in range(1, len(scores) + 1)]
    assert len(candidate_tree(conts, 0.9, 0.0, 8, cost)[0]) == rate.index(max(rate)) + 1


# ---------------------------------------------------------------------------------------------- adaptive length


def test_draft_length_grows_after_full_accepts_and_shrinks_after_rejections():
    p = PromptLookupProposer(num_draft_tokens=16)
    ctx = list(range(10, 30)) + list(range(10, 14))  # a 4-gram match with 16 tokens to copy after it
    start = p.draft_length(4)
    for _ in range(20):  # copies rejected at once
        assert len(_propose(p, ctx)) == p.draft_length(4)
        p.observe(_feedback(p.draft_length(4), 0))
    short = p.draft_length(4)
    assert short == 1 < start
    lengths = []
    while len(lengths) < 60 and p.draft_length(4) < 16:  # copies accepted in full
        k = len(_propose(p, ctx))
        p.observe(_feedback(k, k))
        lengths.append(p.draft_length(4))
    assert lengths == sorted(lengths) and lengths[-1] == 16  # grows, up to num_draft_tokens
    lengths = []
    while len(lengths) < 20 and p.draft_length(4) == 16:  # copies rejected again
        k = len(_propose(p, ctx))
        p.observe(_feedback(k, 0))
        lengths.append(p.draft_length(4))
    assert 1 <= lengths[-1] < 16  # shrinks


def test_lengths_are_kept_per_match_length_and_across_sequences():
    p = PromptLookupProposer(num_draft_tokens=16)
    for _ in range(10):
        p._last_n = 2  # a step that drafted from a 2-gram match ...
        p.observe(_feedback(8, 0))  # ... and was rejected at once
    assert p.draft_length(2) == 1 and p.draft_length(4) > 1
    p.reset(torch.tensor([1, 2, 3]))
    assert p.draft_length(2) == 1  # estimates outlive the sequence


def test_steps_without_a_draft_change_nothing():
    p = PromptLookupProposer()
    before = p.draft_length(3)
    p.observe(_feedback(0, 0))  # nothing proposed
    _propose(p, [1, 2, 3, 4])  # no match: nothing to attribute the next feedback to
    p.observe(_feedback(0, 0))
    assert p.acceptance.counts == {} and p.draft_length(3) == before


def test_fixed_length_ignores_feedback():
    p = fixed(6)
    ctx = list(range(10, 30)) + [10, 11]
    for _ in range(5):
        assert len(_propose(p, ctx)) == 6
        p.observe(_feedback(6, 0))


def test_copy_acceptance_length_follows_alpha():
    acc = CopyAcceptance(max_length=20, threshold=0.15)
    acc.counts[1] = (90.0, 10.0)  # alpha ~ 0.9: 0.9 ** 18 ~ 0.15
    assert 15 <= acc.length(1) <= 18
    acc.counts[1] = (10.0, 90.0)  # alpha ~ 0.1 < threshold
    assert acc.length(1) == 1
    acc.counts[1] = (1e6, 0.0)
    assert acc.length(1) == 20


# ---------------------------------------------------------------------------------------------- settings


def test_builder_reads_the_pld_options():
    target = random_model("llama", seed=0)
    ctx = ProposerContext(target_model=target, method="pld", options={"pld_tokens": 7, "pld_min_ngram": 1, "pld_length": "fixed",
                                                        "pld_max_ngram": None})
    p = prompt_lookup_proposer(ctx)
    assert (p.num_draft_tokens, p.min_ngram, p.max_ngram, p.adaptive) == (7, 1, 4, False)
    with pytest.raises(ConfigError):
        prompt_lookup_proposer(ProposerContext(target_model=target, method="pld", options={"pld_min_ngram": 5, "pld_max_ngram": 3}))
    with pytest.raises(ConfigError):
        prompt_lookup_proposer(ProposerContext(target_model=target, method="pld", options={"pld_length": "sometimes"}))
    assert not p.tree and p.verify_cost is None
    costed = prompt_lookup_proposer(ProposerContext(target_model=target, method="pld", options={"pld_tokens": 5}))  # the default
    assert costed.adaptive and costed.verify_cost.relative_verify(6) > 0  # measured on the target now
    assert prompt_lookup_proposer(ProposerContext(target_model=target, method="pld", options={"pld_length": "adaptive"})).verify_cost is None
    assert prompt_lookup_proposer(ProposerContext(target_model=target, method="pld", options={"tree": "dynamic"})).tree
    with pytest.raises(ConfigError, match="chain .* or dynamic"):
        prompt_lookup_proposer(ProposerContext(target_model=target, method="pld", options={"tree": "auto"}))


# ---------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def target():
    return ModelAdapter(random_model("llama"))


def _prompt(seed: int, n: int = 8) -> torch.Tensor:
    return torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("proposer", [PromptLookupProposer(), PromptLookupProposer(num_draft_tokens=5, min_ngram=1),
                                      fixed(10), PromptLookupProposer(tree=True, min_ngram=1, threshold=0.05),
                                      fixed(10, min_ngram=1, tree=True),
                                      PromptLookupProposer(tree=True, min_ngram=1, verify_cost=_Cost(0.05))],
                         ids=["default", "min1", "fixed10", "tree", "tree-fixed10", "tree-cost"])
def test_greedy_is_token_identical_to_ar(target, proposer, one_thread):
    drafted = 0
    for seed in range(4):  # one proposer across sequences, as the evaluator uses it
        p = torch.cat([_prompt(seed)] * 3)  # a repetitive prompt, so lookups hit
        ar = generate(target, p, GenerationConfig(max_new_tokens=40))
        sp = generate(target, p, GenerationConfig(max_new_tokens=40), proposer)
        assert sp.output_ids == ar.output_ids
        assert sp.num_accepted <= sp.num_proposed
        drafted += sp.num_proposed
    assert drafted > 0


class _BranchCounter(PromptLookupProposer):
    """Counts the drafts that branched (some node with two children)."""

    branched = 0

    def propose(self, tokens, max_tokens, sampling, generator=None):
        draft = super().propose(tokens, max_tokens, sampling, generator)
        self.branched += len(set(draft.parents.tolist())) < len(draft)
        return draft


def test_branching_trees_are_token_identical_to_ar(target, one_thread):
    proposer = _BranchCounter(tree=True, min_ngram=1, threshold=0.05)
    for seed in range(4):
        p = torch.cat([_prompt(seed)] * 3)
        ar = generate(target, p, GenerationConfig(max_new_tokens=40))
        assert generate(target, p, GenerationConfig(max_new_tokens=40), proposer).output_ids == ar.output_ids
    assert proposer.branched > 0
    key, section = proposer.report_section()
    assert key == "prompt_lookup" and section["shape"] == "tree" and section["size_rule"] == "threshold"
    assert section["drafts"] >= proposer.branched and 0 < section["branched_fraction"] <= 1
    proposer.reset_stats()
    assert proposer.report_section()[1]["drafts"] == 0


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sampling_runs_with_one_hot_drafts(target, one_thread, tree):
    p = torch.cat([_prompt(0)] * 3)
    g = torch.Generator().manual_seed(0)
    res = generate(target, p, GenerationConfig(max_new_tokens=30, sampling=SamplingParams(temperature=0.8)),
                   PromptLookupProposer(tree=tree, min_ngram=1), generator=g)
    assert len(res.output_ids) == 30 and res.num_proposed > 0
