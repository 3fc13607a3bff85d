"""The distribution check: speculative sampling must match plain sampling, and a broken verifier must not.

Models have a 32-token vocabulary and a scaled-up LM head, so next-token distributions are peaky
(top token ~0.4-0.6) and a wrong sampler moves a lot of mass: the test has power with a few hundred
samples. The draft is the target with a noisy LM head (total variation ~0.4 from the target), so
steps see both acceptances and rejections."""

import copy

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.sampling import SamplingParams, sample
from draftsmith.inference.core.verify import Verdict, verify_accept_all
from draftsmith.inference.evaluation.distribution import (
    check_distribution,
    chi_square_homogeneity,
    compare_samples,
    merge_rare,
)
from draftsmith.inference.proposers.draft_model import DraftModelProposer
from draftsmith.inference.proposers.prompt_lookup import PromptLookupProposer

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[1, 5, 9, 3], [1, 20, 7, 7, 11]]
SAMPLES = 500


@pytest.fixture(scope="module")
def peaky_pair():
    target = random_model("llama", seed=0, vocab_size=32, layers=2, hidden=32)
    with torch.no_grad():
        target.lm_head.weight.mul_(25.0)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        w = draft.lm_head.weight
        w.add_(torch.randn(w.shape, generator=g) * w.std() * 0.7)
    return target, draft


def _check(pair, sampling, verifier=None, factory=None, samples=SAMPLES):
    target, draft = pair
    factory = factory or (lambda: DraftModelProposer(draft, DraftLengthPolicy(length=3)))
    return check_distribution(target, factory, PROMPTS, sampling, num_samples=samples, num_positions=3, seed=0,
                              verifier=verifier)


def test_chi_square_matches_scipy():
    from scipy.stats import chi2_contingency

    table = [[30, 12, 50, 8], [25, 20, 41, 14]]
    stat, dof, p = chi_square_homogeneity(table)
    ref = chi2_contingency(table, correction=False)
    assert stat == pytest.approx(ref.statistic) and dof == ref.dof and p == pytest.approx(ref.pvalue)
    assert chi_square_homogeneity([[5], [7]]) == (0.0, 0, 1.0)


def test_merge_rare_reaches_the_expected_count():
    table = [[100, 50, 3, 2, 1, 0], [90, 60, 1, 4, 2, 1]]
    merged = merge_rare(table, 5.0)
    assert sum(map(sum, merged)) == sum(map(sum, table))
    n, rows = sum(map(sum, merged)), [sum(r) for r in merged]
    cols = [a + b for a, b in zip(*merged)]
    assert len(cols) == 3 and min(r * c / n for r in rows for c in cols) >= 5.0


def test_identical_samples_pass_and_disjoint_fail():
    same = [1, 2, 3, 1, 2, 3] * 40
    assert compare_samples(same, same)[2] == pytest.approx(1.0)
    assert compare_samples([1] * 200, [2] * 200)[2] < 1e-30


def test_passes_at_temperature_1(peaky_pair):
    res = _check(peaky_pair, SamplingParams(temperature=1.0))
    assert res.passed, res.summary()
    assert len(res.tests) == 2 * 4 and res.threshold == 1e-3 and res.verifier == "default"
    assert "Bonferroni" in res.test and "chi-square" in res.test
    d = res.to_dict()
    assert d["passed"] is True and len(d["tests"]) == 8 and {"statistic", "dof", "p_value", "p_adjusted"} <= d["tests"][0].keys()


def test_passes_at_temperature_07_top_p_09(peaky_pair):
    res = _check(peaky_pair, SamplingParams(temperature=0.7, top_p=0.9))
    assert res.passed, res.summary()


def test_passes_with_a_confidence_stopped_draft(peaky_pair):
    _, draft = peaky_pair  # whether to stop depends on the drafted tokens only: still exact
    stopped = lambda: DraftModelProposer(draft, DraftLengthPolicy(length=3), confidence_threshold=0.5)  # noqa: E731
    res = _check(peaky_pair, SamplingParams(temperature=1.0), factory=stopped)
    assert res.passed, res.summary()


def test_broken_verifier_fails(peaky_pair):
    res = _check(peaky_pair, SamplingParams(temperature=1.0), verifier=verify_accept_all)
    assert not res.passed
    assert res.min_p_adjusted < 1e-10 and res.verifier == "verify_accept_all"
    assert "FAIL" in res.summary()


def test_greedy_is_refused(peaky_pair):
    with pytest.raises(ConfigError, match="temperature"):
        _check(peaky_pair, SamplingParams(temperature=0.0))


def verify_without_residual(target_probs, draft, generator=None):
    """A subtler bug: after a rejection, resample from p instead of norm(max(0, p - q))."""
    tokens, path, row = draft.tokens.tolist(), [], 0
    while True:
        p, accepted = target_probs[row], None
        for c in draft.children[row]:
            x = tokens[c]
            if float(torch.rand((), generator=generator)) < min(1.0, float(p[x]) / max(float(draft.q[c][x]), 1e-30)):
                accepted = c
                break
        if accepted is None:
            return Verdict(path, sample(p, generator))
        path.append(accepted)
        row = accepted + 1


@pytest.mark.slow
def test_missing_residual_fails(peaky_pair):
    res = _check(peaky_pair, SamplingParams(temperature=1.0), verifier=verify_without_residual)
    assert not res.passed, res.summary()


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=8)])
def test_prompt_lookup_and_heuristic_lengths_pass(peaky_pair, sampling):
    _, draft = peaky_pair
    assert _check(peaky_pair, sampling, factory=lambda: PromptLookupProposer(num_draft_tokens=3)).passed
    tree = lambda: PromptLookupProposer(num_draft_tokens=4, min_ngram=1, tree=True, threshold=0.05)  # noqa: E731
    assert _check(peaky_pair, sampling, factory=tree).passed
    heuristic = lambda: DraftModelProposer(draft, DraftLengthPolicy(length=2, mode="heuristic"))  # noqa: E731
    assert _check(peaky_pair, sampling, factory=heuristic).passed


def _medusa(target, typical=None):
    """Medusa heads with random blocks over the peaky target, drafting a 2-level tree with siblings."""
    from draftsmith.inference.core.trees import tree_from_choices
    from draftsmith.inference.drafters.medusa import MedusaHeads
    from draftsmith.inference.proposers.medusa import MedusaProposer

    torch.manual_seed(3)
    heads = MedusaHeads(hidden=32, vocab=32, heads=2)
    for block in heads.blocks:
        torch.nn.init.normal_(block[0].linear.weight, std=0.3)
    tree = tree_from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0)])
    return lambda: MedusaProposer(heads, target.get_output_embeddings(), tree, typical=typical)


def test_medusa_tree_sampling_passes(peaky_pair):
    res = _check(peaky_pair, SamplingParams(temperature=1.0), factory=_medusa(peaky_pair[0]))
    assert res.passed, res.summary()


@pytest.mark.parametrize("tree", ["dynamic", pytest.param("chain", marks=pytest.mark.slow)])
def test_eagle3_sampling_passes(peaky_pair, tree):
    """EAGLE-3's dynamic tree (one-hot nodes, multi-branch verification) and its sampled chain (q over the reduced
    draft vocabulary, scattered onto the target's) keep the target's distribution."""
    from draftsmith.inference.drafters.eagle import Eagle3Head, draft_vocab
    from draftsmith.inference.proposers.eagle import EagleProposer

    target = peaky_pair[0]
    target3 = random_model("llama", seed=0, vocab_size=32, layers=4, hidden=32)
    with torch.no_grad():
        target3.lm_head.weight.mul_(25.0)
    d2t, t2d = draft_vocab(torch.arange(32).flip(0), 20)  # a 20-token draft vocabulary: some tokens never drafted
    torch.manual_seed(4)
    head = Eagle3Head.for_target(target3, d2t, t2d)
    for p in head.midlayer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    factory = lambda: EagleProposer(head, target3.get_input_embeddings(), target3.get_output_embeddings(),  # noqa: E731
                                    length=3, tree=tree, depth=3, top_k=2, total_tokens=5)
    res = _check((target3, None), SamplingParams(temperature=1.0), factory=factory)
    assert res.passed, res.summary()
    assert target is not None


def test_typical_acceptance_at_a_loose_threshold_fails(peaky_pair):
    """The negative control: Medusa's typical acceptance with a loose threshold is lossy, and the check sees it."""
    res = _check(peaky_pair, SamplingParams(temperature=1.0), factory=_medusa(peaky_pair[0], typical=(0.02, 0.01)))
    assert not res.passed, res.summary()
    assert res.verifier.startswith("typical_acceptance") and "lossy" in res.method


def test_typical_acceptance_is_exact_under_greedy_and_labelled_lossy(peaky_pair):
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.generate import GenerationConfig, generate

    target = peaky_pair[0]
    adapter = ModelAdapter(target)
    proposer = _medusa(target, typical=(0.09, 0.3))()
    assert proposer.lossless is False and "lossy" in proposer.name
    for prompt in PROMPTS:
        ids = torch.tensor(prompt)
        ar = generate(adapter, ids, GenerationConfig(max_new_tokens=16))
        assert generate(adapter, ids, GenerationConfig(max_new_tokens=16), proposer).output_ids == ar.output_ids
