import pytest
import torch

from draftsmith.inference.sampling import SamplingParams, process_logits, residual
from draftsmith.inference.verify import Draft, verify_accept_all, verify_greedy, verify_sampling

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
    p, q = _dist(0), _dist(1)
    draft = Draft.chain([int(q.argmax())], q=q[None])
    v = verify_accept_all(torch.stack([p, p]), draft)
    assert v.accepted == [0]


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
