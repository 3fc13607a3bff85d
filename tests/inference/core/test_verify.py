import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from draftsmith.common.errors import ProposerError
from draftsmith.inference.core.sampling import SamplingParams, draw, process_logits, residual
from draftsmith.inference.core.typical import typical_threshold, typical_verifier
from draftsmith.inference.core.verify import (
    Draft,
    ExtraInputs,
    Resume,
    Verdict,
    verify_accept_all,
    verify_greedy,
    verify_sampling,
)

V = 6


def _dist(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(V, generator=g) * 1.5).softmax(-1)


def _first_token(verdict, draft):
    return int(draft.tokens[verdict.accepted[0]]) if verdict.accepted else verdict.next_token


def _empirical(samples):
    return torch.bincount(torch.tensor(samples), minlength=V).float() / len(samples)


@pytest.mark.parametrize("replacement", [True, False])
def test_multi_branch_sampling_keeps_target_distribution(replacement):
    p_root, q_root = _dist(0), _dist(1)
    g = torch.Generator().manual_seed(0)
    n = 20000
    firsts = []
    for _ in range(n):
        # three root children drawn from q (i.i.d. or without replacement), no deeper nodes
        toks, qs, q = [], [], q_root.clone()
        for _ in range(3):
            x = int(torch.multinomial(q, 1, generator=g))
            toks.append(x)
            qs.append(q.clone())
            if not replacement:
                q[x] = 0
                q = q / q.sum()
        draft = Draft(tokens=torch.tensor(toks), parents=torch.tensor([-1, -1, -1]), q=torch.stack(qs))
        target = torch.stack([p_root, _dist(2), _dist(3), _dist(4)])
        firsts.append(_first_token(verify_sampling(target, draft, g), draft))
    assert (_empirical(firsts) - p_root).abs().max() < 0.015


def test_chain_sampling_second_token_is_exact():
    # two-token chain: the committed pair (x1, x2) must follow p(x1) p(x2 | x1)
    p1 = _dist(10)
    p2 = torch.stack([_dist(20 + i) for i in range(V)])  # p2[x1] = p(. | x1)
    q1 = _dist(11)
    q2 = torch.stack([_dist(40 + i) for i in range(V)])
    g = torch.Generator().manual_seed(1)
    n = 30000
    counts = torch.zeros(V, V)
    for _ in range(n):
        x1 = int(torch.multinomial(q1, 1, generator=g))
        x2 = int(torch.multinomial(q2[x1], 1, generator=g))
        draft = Draft.chain([x1, x2], q=torch.stack([q1, q2[x1]]))
        target = torch.stack([p1, p2[x1], _dist(99)])
        v = verify_sampling(target, draft, g)
        toks = draft.tokens[v.accepted].tolist() + [v.next_token]
        if len(toks) >= 2:
            counts[toks[0], toks[1]] += 1
        else:  # rejected at depth 1: sample the second token from the target itself
            counts[toks[0], int(torch.multinomial(p2[toks[0]], 1, generator=g))] += 1
    joint = p1[:, None] * p2
    assert (counts / n - joint).abs().max() < 0.012


def test_broken_verifier_differs():
    """The negative control: accepting every draft token commits tokens distributed as the draft's q, far from
    the target's p, where speculative sampling on the same draws commits tokens distributed as p."""
    p, q = _dist(0), _dist(1)
    g = torch.Generator().manual_seed(0)
    broken, exact = [], []
    for _ in range(4000):
        tok = int(torch.multinomial(q, 1, generator=g))
        draft = Draft.chain([tok], q=q[None])
        probs = torch.stack([p, p])
        broken.append(_first_token(verify_accept_all(probs, draft), draft))
        exact.append(_first_token(verify_sampling(probs, draft, g), draft))
    tvd = lambda emp: 0.5 * float((emp - p).abs().sum())  # noqa: E731
    assert 0.5 * float((p - q).abs().sum()) > 0.3  # the draft really is far from the target
    assert tvd(_empirical(broken)) > 0.25
    assert tvd(_empirical(exact)) < 0.05


def test_greedy_chain_and_tree():
    logits = torch.full((4, V), -1.0)
    for row, tok in enumerate([3, 1, 4, 5]):
        logits[row, tok] = 1.0
    assert verify_greedy(logits, Draft.chain([3, 1, 0])).accepted == [0, 1]
    assert verify_greedy(logits, Draft.chain([3, 1, 0])).next_token == 4
    assert verify_greedy(logits, Draft.chain([2])).accepted == []
    assert verify_greedy(logits, Draft.chain([2])).next_token == 3
    # tree: root children 0 (tok 2) and 1 (tok 3); node 2 (tok 5) under node 1 ... rows follow node index + 1
    tree = Draft(tokens=torch.tensor([2, 3, 5]), parents=torch.tensor([-1, -1, 1]))
    logits = torch.zeros(4, V)
    logits[0, 3] = logits[2, 5] = logits[3, 0] = 5.0
    v = verify_greedy(logits, tree)
    assert v.accepted == [1, 2] and v.next_token == 0


@pytest.mark.parametrize("rule", ["greedy", "sampling", "typical"])
def test_the_verdict_keeps_the_path_and_the_committed_tokens_for_the_device(rule):
    """Besides the host lists, a verdict holds the accepted node indices and the committed tokens as tensors (the
    loop indexes the cache and extends the sequence with them: no upload) and every draft token as read."""
    tree = Draft(tokens=torch.tensor([1, 2, 3, 4]), parents=torch.tensor([-1, -1, 1, 1]))
    logits = torch.full((5, V), -20.0)
    logits[0, 2] = logits[2, 4] = logits[4, 5] = logits[1, 0] = logits[3, 0] = 20.0  # path 1 -> 3, then token 5
    probs = process_logits(logits, SamplingParams(temperature=1.0))
    verify = {"greedy": lambda d: verify_greedy(logits, d),
              "sampling": lambda d: verify_sampling(probs, d, torch.Generator().manual_seed(0)),
              "typical": lambda d: typical_verifier()(probs, d)}[rule]
    for draft, path in ((tree, [1, 3]), (Draft.chain([2, 0, 3, 1]), [0, 1])):
        v = verify(draft)
        committed = [int(draft.tokens[i]) for i in path] + [v.next_token]
        assert v.accepted == path and v.path.tolist() == path and v.committed.tolist() == committed
        assert v.drafted == draft.tokens.tolist() and v.tokens == committed[:-1]
    empty = verify(Draft.empty())
    assert empty.accepted == [] and empty.path.tolist() == [] and empty.committed.tolist() == [2]


def test_a_tree_shape_reaches_a_device_once_and_is_shared_by_the_drafts_made_with_it():
    from draftsmith.inference.core.tree_shape import TreeShape

    shape = TreeShape(torch.tensor([-1, -1, 0, 2]))
    a = Draft(tokens=torch.tensor([1, 2, 3, 4]), parents=shape.parents, shape=shape)
    b = Draft(tokens=torch.tensor([5, 6, 7, 8]), parents=shape.parents, shape=shape)
    on = a.on("cpu")
    assert b.on("cpu") is on and on.parents.tolist() == [-1, -1, 0, 2] and on.depths.tolist() == [1, 1, 2, 3]
    assert torch.equal(on.ancestors, a.ancestors) and torch.equal(on.verify_mask, a.verify_mask)
    assert [(n.tolist(), r.tolist()) for n, r in on.sibling_groups] == [
        (n.tolist(), r.tolist()) for n, r in a.sibling_groups]
    pos, mask = a.forward_inputs(10, torch.device("cpu"))
    assert pos.tolist() == [10, 11, 11, 12, 13] and torch.equal(mask, a.verify_mask)
    chain = Draft.chain([1, 2, 3]).on("cpu")  # made on the device: nothing to upload
    assert chain.verify_mask is None and chain.position_offsets.tolist() == [0, 1, 2, 3]
    assert [(n.tolist(), r.tolist()) for n, r in chain.sibling_groups] == [([0, 1, 2], [0, 1, 2])]
    with pytest.raises(ProposerError, match="shape"):
        Draft(tokens=torch.tensor([1, 2, 3, 4]), parents=torch.tensor([-1, 0, 1, 2]), shape=shape)


def test_deterministic_proposals_under_sampling_use_one_hot_q():
    p = _dist(5)
    g = torch.Generator().manual_seed(0)
    x = int(p.argmin())
    out = []
    for _ in range(20000):
        v = verify_sampling(torch.stack([p, p]), Draft.chain([x]), g)
        out.append(x if v.accepted else v.next_token)
    assert (_empirical(out) - p).abs().max() < 0.012


def test_process_logits_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    greedy = process_logits(logits, SamplingParams())
    assert greedy.tolist() == [1, 0, 0, 0, 0, 0]
    topk = process_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (topk[2:] == 0).all() and torch.isclose(topk.sum(), torch.tensor(1.0))
    full = logits.softmax(-1)
    topp = process_logits(logits, SamplingParams(temperature=1.0, top_p=0.7))
    keep = int((topp > 0).sum())
    assert full[: keep - 1].sum() < 0.7 <= full[:keep].sum()
    hot = process_logits(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(hot, (logits / 0.5).softmax(-1))


def test_residual():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.6, 0.1, 0.3])
    r = residual(p, q)
    assert torch.allclose(r, torch.tensor([0.0, 1.0, 0.0]))
    assert torch.equal(residual(p, p), p)


def test_sampling_params_validation():
    from draftsmith.common.errors import ConfigError

    for bad in (dict(temperature=-1), dict(top_p=0.0), dict(top_k=-2)):
        with pytest.raises(ConfigError):
            SamplingParams(**bad)


# ------------------------------------------------------------------------- greedy trees vs a per-node walk
def _reference_greedy(logits, draft):
    """The per-node walk on the host: from the root, follow the first child whose token is the argmax."""
    choice = logits.argmax(-1).tolist()
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    path, row = [], 0
    while True:
        kids = [c for c in range(len(tokens)) if parents[c] + 1 == row]
        nxt = next((c for c in kids if tokens[c] == choice[row]), None)
        if nxt is None:
            return Verdict(path, choice[row])
        path.append(nxt)
        row = nxt + 1


def _random_tree(g, n, vocab):
    parents = [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, n)]
    tokens = torch.randint(0, vocab, (n,), generator=g)
    return Draft(tokens=tokens, parents=torch.tensor(parents))


def _logits_following(draft, g, vocab, p_follow=0.7):
    """Target logits whose argmax often agrees with some child, so that paths get long."""
    n = len(draft)
    logits = torch.randn(1 + n, vocab, generator=g)
    for row, kids in enumerate(draft.children):
        if kids and float(torch.rand((), generator=g)) < p_follow:
            pick = kids[int(torch.randint(0, len(kids), (), generator=g))]
            logits[row, int(draft.tokens[pick])] = 10.0
    return logits


def test_greedy_tree_matches_the_per_node_walk_on_random_trees():
    g = torch.Generator().manual_seed(0)
    depths_seen = set()
    for trial in range(400):
        vocab = 3 if trial % 2 else 8  # a tiny vocabulary makes duplicate sibling tokens common
        draft = _random_tree(g, int(torch.randint(1, 16, (), generator=g)), vocab)
        logits = _logits_following(draft, g, vocab)
        got, want = verify_greedy(logits, draft), _reference_greedy(logits, draft)
        assert (got.accepted, got.next_token) == (want.accepted, want.next_token), f"trial {trial}"
        assert got.tokens == draft.tokens[want.accepted].tolist()
        depths_seen.add(len(got.accepted))
    assert max(depths_seen) >= 4  # the trees were deep enough to exercise long paths


def test_greedy_chain_matches_the_per_node_walk():
    g = torch.Generator().manual_seed(1)
    for _ in range(100):
        chain = Draft.chain(torch.randint(0, 4, (int(torch.randint(1, 8, (), generator=g)),), generator=g))
        logits = _logits_following(chain, g, 4, p_follow=0.8)
        got, want = verify_greedy(logits, chain), _reference_greedy(logits, chain)
        assert (got.accepted, got.next_token, got.tokens) == (want.accepted, want.next_token, chain.tokens[want.accepted].tolist())


# ---------------------------------------------------------------------------------- one transfer per step
HOST_SYNCS = {"tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy", "nonzero", "masked_select"}


class _HostTransfers(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_SYNCS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_verification_moves_one_tensor_to_the_host(shape):
    g = torch.Generator().manual_seed(2)
    draft = Draft.chain([1, 2, 3, 4]) if shape == "chain" else _random_tree(g, 9, V)
    draft.q = torch.stack([_dist(i) for i in range(len(draft))])
    _ = draft.ancestors, draft.depths, draft.sibling_groups, draft.is_chain  # structure: built by the proposer
    logits = torch.randn(1 + len(draft), V, generator=g)
    with _HostTransfers() as greedy:
        verify_greedy(logits, draft)
    with _HostTransfers() as sampling:
        verify_sampling(logits.softmax(-1), draft, g)
    with _HostTransfers() as typical:
        typical_verifier()(logits.softmax(-1), draft, g)
    assert greedy.calls == ["tolist"] and sampling.calls == ["tolist"] and typical.calls == ["tolist"]


# ------------------------------------------------------------------------------- sampling on a deeper tree
def test_two_level_tree_sampling_keeps_the_joint_distribution():
    """Root with two sampled children, each with two sampled children: the first two committed
    tokens must follow p(x1) p(x2 | x1)."""
    p1 = _dist(50)
    p2 = torch.stack([_dist(60 + i) for i in range(V)])
    q1 = _dist(51)
    q2 = torch.stack([_dist(80 + i) for i in range(V)])
    g = torch.Generator().manual_seed(3)
    n = 10000
    counts = torch.zeros(V, V)
    for _ in range(n):
        a, b = (int(x) for x in torch.multinomial(q1, 2, replacement=True, generator=g))
        toks, qs, rows = [a, b], [q1, q1], [p1]
        for parent in (a, b):
            toks += [int(x) for x in torch.multinomial(q2[parent], 2, replacement=True, generator=g)]
            qs += [q2[parent], q2[parent]]
        draft = Draft(tokens=torch.tensor(toks), parents=torch.tensor([-1, -1, 0, 0, 1, 1]), q=torch.stack(qs))
        rows = [p1, p2[a], p2[b], _dist(97), _dist(97), _dist(97), _dist(97)]
        v = verify_sampling(torch.stack(rows), draft, g)
        out = v.tokens + [v.next_token]
        if len(out) < 2:
            out.append(int(torch.multinomial(p2[out[0]], 1, generator=g)))
        counts[out[0], out[1]] += 1
    assert (counts / n - p1[:, None] * p2).abs().max() < 0.015  # about 5 standard errors


def test_draw_follows_probs_and_never_picks_zero_mass():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    g = torch.Generator().manual_seed(4)
    got = torch.stack([draw(probs, g) for _ in range(20000)])
    assert (torch.bincount(got, minlength=V).float() / 20000 - probs).abs().max() < 0.012
    assert set(got.tolist()) <= {1, 3, 4}


def test_residual_is_row_wise():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.6, 0.1, 0.3], [0.2, 0.2, 0.6]])
    assert torch.allclose(residual(p, q), torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.2, 0.6]]))


# ------------------------------------------------------------------------------------ draft validation
def test_draft_contract_is_checked():
    with pytest.raises(ProposerError, match="1 \\+ 2"):
        Draft.chain([1, 2], resume=Resume(start=1, hidden=torch.zeros(2, 4)))
    extra = ExtraInputs.after_chain(2, input_ids=torch.tensor([5, 6, 7]))
    assert extra.visible.shape == (3, 6) and extra.depths.tolist() == [3, 4, 5]
    Draft.chain([1, 2], extra_inputs=extra)
    with pytest.raises(ProposerError, match="need 3 inputs"):
        Draft.chain([1], extra_inputs=extra)
    with pytest.raises(ProposerError, match="both"):
        Draft.chain([1, 2], resume=Resume(1, torch.zeros(3, 4)), extra_inputs=extra)
    with pytest.raises(ProposerError, match="exactly one"):
        Draft.chain([1, 2], extra_inputs=ExtraInputs(extra.visible, extra.depths))


def test_forward_layout_of_a_tree_with_extras():
    # rows: pending, nodes 0 1 2 (node 2 under node 0), extras 0 1
    visible = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 0, 1, 0, 1, 1]], dtype=torch.bool)  # [2, 1 + 3 + 2]
    extra = ExtraInputs(visible, torch.tensor([3, 2]), input_ids=torch.tensor([8, 9]))
    tree = Draft(tokens=torch.tensor([4, 5, 6]), parents=torch.tensor([-1, -1, 0]), extra_inputs=extra)
    m = tree.forward_mask
    assert m.shape == (6, 6)
    assert m[:4, :4].tolist() == tree.verify_mask.tolist()
    assert not m[:4, 4:].any()  # the tree never sees the extras
    assert m[4:].tolist() == visible.tolist()
    assert tree.position_offsets.tolist() == [0, 1, 1, 2, 3, 2]


# ------------------------------------------------------------------------- Medusa's typical acceptance
# A hand-made tree over V = 6 tokens (rows: 0 = the root, i + 1 = after node i):
#   node 0 (tok 1) and node 1 (tok 2) under the root; node 2 (tok 3) and node 4 (tok 5) under node 0;
#   node 3 (tok 4) under node 1; node 5 (tok 0) under node 3.
# Candidates (root-to-leaf paths): [0, 2], [0, 4], [1, 3, 5].
TYPICAL_TREE = Draft(tokens=torch.tensor([1, 2, 3, 4, 5, 0]), parents=torch.tensor([-1, -1, 0, 1, 0, 3]))
PEAKED = [0.95, 0.01, 0.01, 0.01, 0.01, 0.01]  # low entropy: the threshold is epsilon, p = 0.01 fails


def _rows(**rows) -> torch.Tensor:  # [7, 6]; unnamed rows are PEAKED
    probs = torch.tensor([PEAKED] * 7)
    for name, row in rows.items():
        probs[int(name[1:])] = torch.tensor(row)
    assert torch.allclose(probs.sum(-1), torch.ones(7))
    return probs


def test_typical_threshold_is_min_of_epsilon_and_entropy_scaled_delta():
    """min(epsilon, delta * exp(-H)): H = ln 2 gives 0.3 / 2 = 0.15 -> epsilon 0.09; uniform over 6 gives 0.3 / 6."""
    probs = torch.tensor([[0.5, 0.5, 0, 0, 0, 0], [1 / 6] * 6, [1.0, 0, 0, 0, 0, 0]])
    assert torch.allclose(typical_threshold(probs, 0.09, 0.3), torch.tensor([0.09, 0.05, 0.09]))
    assert typical_verifier(0.09).__name__ == "typical_acceptance(epsilon=0.09, delta=0.3)"  # delta = sqrt(epsilon)
    assert typical_verifier(0.04).__name__ == "typical_acceptance(epsilon=0.04, delta=0.2)"
    with pytest.raises(ValueError, match="epsilon"):
        typical_verifier(0.0)


def test_typical_acceptance_takes_the_longest_candidate_not_the_first_passing_child():
    """Node 0 passes first at the root but both its children fail; node 1 -> 3 -> 5 all pass: the longest wins."""
    probs = _rows(r0=[0.05, 0.5, 0.2, 0.1, 0.1, 0.05],  # tok 1 (node 0) and tok 2 (node 1) pass
                  r2=[0.05, 0.05, 0.05, 0.05, 0.75, 0.05],  # node 3 (tok 4) passes under node 1
                  r4=[0.6, 0.1, 0.1, 0.1, 0.05, 0.05],  # node 5 (tok 0) passes under node 3
                  r6=[0.1, 0.1, 0.1, 0.4, 0.2, 0.1])  # after node 5: argmax tok 3
    v = typical_verifier(0.09, 0.3)(probs, TYPICAL_TREE)
    assert v.accepted == [1, 3, 5] and v.tokens == [2, 4, 0] and v.next_token == 3


def test_typical_acceptance_breaks_a_length_tie_by_the_likelihood_of_the_whole_prefix():
    """Depth-2 candidates [0, 2] (0.2 * 0.6 = 0.12) and [1, 3] (0.5 * 0.3 = 0.15); node 5 fails. The whole prefix's
    likelihood picks [1, 3], though the first passing child (node 0) and the likelier last token (0.6) point at [0, 2]."""
    probs = _rows(r0=[0.05, 0.2, 0.5, 0.1, 0.1, 0.05],
                  r1=[0.1, 0.1, 0.1, 0.6, 0.05, 0.05],  # node 2 (tok 3) passes under node 0; node 4 (tok 5) fails
                  r2=[0.2, 0.1, 0.1, 0.1, 0.3, 0.2],  # node 3 (tok 4) passes under node 1
                  r4=[0.01, 0.95, 0.01, 0.01, 0.01, 0.01])  # node 5 (tok 0) fails; argmax tok 1
    v = typical_verifier(0.09, 0.3)(probs, TYPICAL_TREE)
    assert v.accepted == [1, 3] and v.next_token == 1


def test_typical_acceptance_appends_the_targets_argmax_whatever_the_generator():
    """The token after the accepted prefix is the target's argmax there (the reference takes the next step's first
    token greedily), never a sample; with nothing accepted it is the root row's argmax."""
    probs = _rows(r0=[0.05, 0.5, 0.2, 0.1, 0.1, 0.05],
                  r2=[0.2, 0.05, 0.05, 0.05, 0.45, 0.2],  # node 3 (tok 4) passes
                  r4=[0.05, 0.3, 0.35, 0.1, 0.1, 0.1])  # node 5 (tok 0): 0.05 < 0.3 exp(-1.569) = 0.0625 fails
    rule = typical_verifier(0.09, 0.3)
    for seed in range(20):  # a sample from row 4 would differ from its argmax (tok 2) 65% of the time
        v = rule(probs, TYPICAL_TREE, torch.Generator().manual_seed(seed))
        assert v.accepted == [1, 3] and v.next_token == 2
    nothing = _rows(r0=[0.01, 0.01, 0.01, 0.01, 0.95, 0.01])
    assert rule(nothing, TYPICAL_TREE).accepted == [] and rule(nothing, TYPICAL_TREE).next_token == 4


def _reference_typical(probs, draft, epsilon, delta):
    """The reference's selection spelled out over candidate paths: each root-to-leaf path's accept length is its
    leading run of passing nodes; the longest wins, ties by the summed log-likelihood of the accepted prefix (the
    first such path); then the argmax of the row after the prefix."""
    thr = typical_threshold(probs, epsilon, delta)
    parents = draft.parents.tolist()
    leaves = [i for i in range(len(draft)) if i not in parents]
    best, best_key = [], (0, 0.0)
    for leaf in leaves:
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        p = [float(probs[parents[i] + 1, draft.tokens[i]]) for i in path]
        ok = [p[d] > float(thr[parents[i] + 1]) for d, i in enumerate(path)]
        length = next((d for d, good in enumerate(ok) if not good), len(path))
        key = (length, sum(math.log(x) for x in p[:length]))
        if length and key > best_key:
            best, best_key = path[:length], key
    return best, int(probs[best[-1] + 1 if best else 0].argmax())


def test_typical_acceptance_matches_the_candidate_path_rule_on_random_trees():
    g = torch.Generator().manual_seed(5)
    depths_seen = set()
    for trial in range(100):
        n, vocab = int(torch.randint(1, 16, (), generator=g)), 16
        draft = _random_tree(g, n, vocab)
        draft.tokens = torch.randperm(vocab, generator=g)[:n]  # distinct siblings, as the heads' top-k are
        logits = _logits_following(draft, g, vocab) * float(torch.rand((), generator=g) * 2 + 0.3)
        probs = logits.softmax(-1)
        got = typical_verifier(0.09, 0.3)(probs, draft, g)
        path, nxt = _reference_typical(probs, draft, 0.09, 0.3)
        assert (got.accepted, got.next_token) == (path, nxt), f"trial {trial}"
        depths_seen.add(len(path))
        one_hot = process_logits(logits, SamplingParams())  # greedy: the rule is exact matching
        greedy = verify_greedy(logits, draft)
        typical = typical_verifier(0.09, 0.3)(one_hot, draft)
        assert (typical.accepted, typical.next_token) == (greedy.accepted, greedy.next_token)
    assert max(depths_seen) >= 3
