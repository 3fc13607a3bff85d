"""Static token trees from choice paths: buffers against hand-built ones, the greedy tree, and one verification
forward over a tree through the adapter giving the logits of each path run as a plain sequence."""

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.trees import (
    chain_choices,
    default_accuracy,
    default_choices,
    greedy_choices,
    rerank,
    tree_from_choices,
    tree_size_for_cost,
)

# root -> a (0,), b (1,); a -> c (0, 0), d (0, 1); b -> e (1, 0); c -> f (0, 0, 0)
CHOICES = [(1, 0), (0,), (0, 0, 0), (1,), (0, 1), (0, 0)]


def test_buffers_match_a_hand_built_tree():
    tree = tree_from_choices(CHOICES)
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))  # by depth, then by path
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1, 2]
    assert tree.depths.tolist() == [1, 1, 2, 2, 2, 3]
    assert tree.ranks.tolist() == [0, 1, 0, 1, 0, 0]
    assert tree.position_offsets.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert (tree.max_depth, tree.top_k) == (3, 2)
    # rows/cols: 0 = pending token, 1 + i = node i
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],  # a
        [1, 0, 1, 0, 0, 0, 0],  # b
        [1, 1, 0, 1, 0, 0, 0],  # c: a, c
        [1, 1, 0, 0, 1, 0, 0],  # d: a, d
        [1, 0, 1, 0, 0, 1, 0],  # e: b, e
        [1, 1, 0, 1, 0, 0, 1],  # f: a, c, f
    ], dtype=torch.bool)  # fmt: skip
    assert torch.equal(tree.mask, expected)
    # leaves d, e, f (node order) with their root-to-leaf node indices
    assert tree.retrieve.tolist() == [[0, 3, -1], [1, 4, -1], [0, 2, 5]]
    mask4 = tree.attention_mask(past=2)
    assert mask4.shape == (1, 1, 7, 9)
    assert bool((mask4[0, 0, :, :2] == 0).all())  # every row sees the cached prefix
    assert bool((mask4[0, 0, :, 2:] == 0).eq(expected).all())


def test_draft_takes_each_nodes_rank_from_its_head():
    tree = tree_from_choices(CHOICES)
    candidates = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])  # [heads, k]
    draft = tree.draft(candidates)
    assert draft.tokens.tolist() == [10, 11, 20, 21, 20, 30]
    assert draft.parents.tolist() == tree.parents.tolist()
    with pytest.raises(ConfigError, match="candidates"):
        tree.draft(candidates[:2])


def test_chain_is_a_chain():
    tree = tree_from_choices(chain_choices(4))
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert torch.equal(tree.mask, torch.ones(5, 5, dtype=torch.bool).tril())
    assert tree.retrieve.tolist() == [[0, 1, 2, 3]]
    assert tree.draft(torch.arange(8).view(4, 2)).tokens.tolist() == [0, 2, 4, 6]


@pytest.mark.parametrize("bad, match", [([], "at least one"), ([(0, 1)], "no parent"), ([(-1,)], "negative")])
def test_bad_choices_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        tree_from_choices(bad)


def test_greedy_choices_take_the_paths_most_likely_accepted():
    acc = torch.tensor([[0.9, 0.05], [0.5, 0.3], [0.4, 0.1]])
    # values: (0,) .9, (0,0) .45, (0,1) .27, (0,0,0) .18, (0,1,0) .108, (1,) .05, ...
    assert greedy_choices(acc, 5) == [(0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)]
    tree = tree_from_choices(greedy_choices(acc, 5))  # always a valid tree: parents come first
    assert len(tree) == 5
    assert greedy_choices(acc, 100) == greedy_choices(acc, 2 * 2 + 4 + 8 + 2)  # all 14 paths at most


def test_default_trees_grow_with_their_node_budget():
    for heads in (1, 3, 4):
        small, big = default_choices(heads, 8), default_choices(heads, 32)
        assert set(small) <= set(big)
        assert tree_from_choices(big).max_depth <= heads
    assert default_accuracy(4).shape == (4, 10)
    with pytest.raises(ConfigError):
        default_choices(0)


def test_one_forward_over_the_tree_equals_each_path_alone():
    torch.manual_seed(0)
    model = random_model("llama", seed=0, layers=2, hidden=32)
    adapter = ModelAdapter(model)
    tree = tree_from_choices(CHOICES)
    prefix = torch.randint(3, 100, (6,))
    draft = tree.draft(torch.randint(3, 100, (3, 2)))
    pending = prefix[-1:]
    with torch.inference_mode():
        cache = adapter.new_cache()
        adapter.forward(prefix[None, :-1], cache, compute_logits=False)
        past = prefix.numel() - 1
        ids = torch.cat([pending, draft.tokens])[None]  # [1, 1 + n]
        pos = (past + tree.position_offsets)[None]
        tree_logits = adapter.forward(ids, cache, position_ids=pos, tree=tree.mask).logits[0]  # [1 + n, V]
        for leaf_path in tree.retrieve.tolist():
            nodes = [i for i in leaf_path if i >= 0]
            seq = torch.cat([prefix, draft.tokens[nodes]])[None]
            plain = adapter.forward(seq).logits[0, past:]  # [1 + len(nodes), V]
            assert torch.allclose(tree_logits[[0, *[1 + i for i in nodes]]], plain, atol=1e-5)


def test_tree_size_for_cost_trades_tau_against_the_measured_verification_cost():
    from draftsmith.inference.core.trees import greedy_choices, tree_size_for_cost

    accuracy = torch.tensor([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.1, 0.05]])
    flat = tree_size_for_cost(accuracy, lambda n: 1.0, max_nodes=12)  # verification free: the biggest tree wins
    assert flat["nodes"] == 12
    values = []
    for path in greedy_choices(accuracy, 12):
        v = 1.0
        for depth, rank in enumerate(path):
            v *= float(accuracy[depth, rank])
        values.append(v)
    assert flat["predicted_tau"] == pytest.approx(1 + sum(values), abs=1e-4)
    steep = tree_size_for_cost(accuracy, lambda n: 1.0 + 0.3 * (n - 1), max_nodes=12)  # every token costs 30%
    assert steep["nodes"] < 4
    row = steep["table"][steep["nodes"] - 1]
    assert row[2] == pytest.approx(row[1] / (1.0 + 0.3 * steep["nodes"]), abs=1e-4)
    assert steep["predicted_speedup"] == max(r[2] for r in steep["table"])


def test_size_for_step_keeps_the_count_with_the_most_tokens_per_second():
    from itertools import accumulate

    from draftsmith.inference.core.trees import size_for_step

    probs = torch.tensor([0.05, 0.9, 0.3, 0.6, 0.01, 0.2])  # any order: the most probable nodes are kept first
    assert size_for_step(probs, torch.ones(10)) == 6  # verification free: every node with a chance is worth it
    assert size_for_step(probs, torch.ones(3)) == 3  # at most as many as the cost is given for
    for slope in (0.0, 0.05, 0.2, 0.5, 2.0):
        for draft in (0.0, 0.5, 3.0):
            cost = draft + 1.0 + slope * torch.arange(1, 7, dtype=torch.float64)  # n kept -> draft + V(n + 1)
            tau = [1 + t for t in accumulate(sorted(probs.tolist(), reverse=True))]
            brute = max(range(6), key=lambda n: tau[n] / float(cost[n])) + 1
            assert size_for_step(probs, cost) == brute
    assert size_for_step(probs, 1.0 + 2.0 * torch.arange(1, 7)) == 1  # every token costs two steps: the best one
    assert size_for_step(torch.tensor([]), torch.ones(4)) == 0


def test_grown_trees_keep_the_full_depth_top1_chain_whatever_its_estimated_value():
    """Independent per-head accuracies make deep paths look worthless; the chain is kept first all the same, so a
    tree never loses to its own chain, and the rest grows greedily from the chain's and the root's frontier."""
    acc = torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.1, 0.1], [0.2, 0.1, 0.1]], dtype=torch.float64)
    assert (0, 0, 0) not in greedy_choices(acc, 5)  # plain greedy growth: value 0.02 loses to rank-2 roots
    paths = greedy_choices(acc, 5, chain=3)
    assert paths[:3] == [(0,), (0, 0), (0, 0, 0)]
    assert paths[3:] == [(1,), (2,)]  # then the best of the frontier: 0.4, 0.3 (beats (0, 1) at 0.05)
    assert greedy_choices(acc, 2, chain=3) == [(0,), (0, 0)]  # fewer nodes than the chain: its prefix
    tree_from_choices(greedy_choices(acc, 9, chain=3))  # a valid tree
    assert default_choices(4, 8)[:4] == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]


def test_tree_size_for_cost_counts_the_chain_first():
    acc = torch.tensor([[0.9, 0.05], [0.9, 0.05]], dtype=torch.float64)
    out = tree_size_for_cost(acc, lambda n: 1.0, max_nodes=3, chain=2)
    assert [row[1] for row in out["table"]] == [1.9, 2.71, 2.76]  # 1 + 0.9, + 0.81, + 0.05 (the root's rank 1)


def test_rerank_keeps_the_forced_chain_before_any_higher_scored_node():
    scores = torch.tensor([-0.1, -0.2, -3.0, -0.3])  # node 2 (child of 0) scores lowest
    parents, depths = torch.tensor([-1, -1, 0, 1]), torch.tensor([1, 1, 2, 2])
    keep, new_parents = rerank(scores, parents, depths, total=3, keep=[0, 2])
    assert sorted(keep.tolist()) == [0, 1, 2]
    keep, _ = rerank(scores, parents, depths, total=1, keep=[0, 2])
    assert keep.tolist() == [0]  # a prefix of the chain when the tree is smaller than it


def test_within_depth_keeps_the_shallow_branches_of_a_tree_near_the_end_of_an_answer():
    """A tree is cut by depth, not by node count: with two tokens left every depth-1 and depth-2 node stays."""
    from draftsmith.inference.core.trees import within_depth
    from draftsmith.inference.core.verify import Draft

    tree = tree_from_choices([(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)])
    draft = tree.draft(torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]]))
    cut = within_depth(draft, 2)
    assert cut.tokens.tolist() == [10, 11, 12, 20, 20] and cut.parents.tolist() == [-1, -1, -1, 0, 1]
    assert within_depth(draft, 3) is draft
    chain = within_depth(Draft.chain([5, 6, 7]), 1)
    assert chain.tokens.tolist() == [5] and chain.parents.tolist() == [-1]


def test_rerank_order_is_the_host_rule_as_stable_sorts():
    """On scores with ties, the device-side choice equals the rule written out: forced candidates first in their
    order, then by (-score, depth, index), cut at ``total``, and the kept ones by (depth, -score, index)."""
    from draftsmith.inference.core.trees import forced_ranks, rerank_order

    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        n = 12
        scores = -torch.randint(0, 4, (n,), generator=g).float() / 2  # many ties
        depths = torch.randint(1, 4, (n,), generator=g)
        forced = [int(i) for i in torch.randperm(n, generator=g)[: trial % 4]]
        total = 1 + trial % n
        rest = sorted(set(range(n)) - set(forced), key=lambda i: (-float(scores[i]), int(depths[i]), i))
        want = sorted((forced + rest)[:total], key=lambda i: (int(depths[i]), -float(scores[i]), i))
        assert rerank_order(scores, depths, total, forced_ranks(n, forced)).tolist() == want


def test_a_static_tree_cut_by_depth_is_a_kept_prefix_of_its_nodes_sharing_one_shape_per_depth():
    from draftsmith.inference.core.trees import within_depth

    tree = tree_from_choices([(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)])
    candidates = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    cut = tree.draft(candidates, max_depth=2)
    want = within_depth(tree.draft(candidates), 2)
    assert cut.tokens.tolist() == want.tokens.tolist() and cut.parents.tolist() == want.parents.tolist()
    assert tree.draft(candidates, max_depth=2).shape is cut.shape  # kept for the next step near the end
    assert tree.draft(candidates).shape is tree.draft(candidates, max_depth=3).shape is tree.shape
