"""Self-speculation through the target's own cache: early exit (LayerSkip) and layer skipping
(Draft & Verify) must reproduce AR greedy exactly, leave the cache as the loop expects after every
proposal, and (early exit) never run the first E layers twice over the same row."""

import pytest
import torch

from draftsmith.common.errors import ConfigError, ProposerError
from draftsmith.data.tiny_models import (
    LAYOUT_FAMILIES,
    random_model,
)
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.proposer import TargetView
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.verify import Draft
from draftsmith.inference.evaluation.distribution import check_distribution
from draftsmith.inference.proposers.draft_verify import AdaptiveThreshold, DraftVerifyProposer
from draftsmith.inference.proposers.layerskip import EarlyExitProposer


@pytest.fixture(params=LAYOUT_FAMILIES)
def family(request):  # the proposers' logic on one family of each layout
    return request.param

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = 4


def _prompt(seed, n=10):
    return torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(seed))


class Recording:
    """Wraps a self-drafting proposer; records the target's cache lengths around every call."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.lossless, self.hidden_layers = inner.name, inner.lossless, inner.hidden_layers
        self.before, self.after, self.observed = [], [], []

    def bind(self, target: TargetView):
        self.view = target
        self.inner.bind(target)

    def reset(self, prompt_ids):
        self.inner.reset(prompt_ids)

    def propose(self, tokens, max_tokens, sampling, generator=None):
        past = tokens.numel() - 1
        self.before.append((past, self.view.cache.lengths()))
        draft = self.inner.propose(tokens, max_tokens, sampling, generator)
        self.after.append((past, len(draft), self.view.cache.lengths()))
        return draft

    def observe(self, feedback):
        self.observed.append((feedback, self.view.cache.lengths()))
        self.inner.observe(feedback)


def _check_cache_history(rec, layers, resumed_layers):
    for past, lengths in rec.before:
        assert lengths == [past] * layers  # every committed token but the pending one, in every layer
    for past, n, lengths in rec.after:
        e = resumed_layers if n else 0
        assert lengths == [past + 1 + n] * e + [past] * (layers - e)
    for (past, _), (fb, lengths) in zip(rec.before, rec.observed, strict=True):
        assert lengths == [past + len(fb.committed)] * layers  # pending + accepted committed, the rest dropped


@pytest.mark.parametrize("exit_layer", [1, 3, LAYERS])
def test_early_exit_greedy_is_token_identical(family, exit_layer):
    adapter = ModelAdapter(random_model(family, layers=LAYERS))
    for seed in range(2):
        p = _prompt(seed)
        ar = generate(adapter, p, GenerationConfig(max_new_tokens=24))
        rec = Recording(EarlyExitProposer(exit_layer, DraftLengthPolicy(length=3)))
        sp = generate(adapter, p, GenerationConfig(max_new_tokens=24), rec)
        assert sp.output_ids == ar.output_ids
        assert sp.num_proposed > 0
        _check_cache_history(rec, LAYERS, exit_layer)
    if exit_layer == LAYERS:  # the whole model drafts: everything is accepted
        assert sp.acceptance_rate == 1.0


@pytest.mark.parametrize(
    "skips",
    [dict(skip_layers=[1]), dict(skip_layers=[0, 2]), dict(skip_attention=[0], skip_mlp=[2]), dict(skip_mlp=[1, 3])],
    ids=["layer", "layers", "sublayers", "mlps"],
)
def test_skip_layer_greedy_is_token_identical(family, skips):
    adapter = ModelAdapter(random_model(family, layers=LAYERS))
    for seed in range(2):
        p = _prompt(seed)
        ar = generate(adapter, p, GenerationConfig(max_new_tokens=24))
        rec = Recording(DraftVerifyProposer(**skips, policy=DraftLengthPolicy(length=3)))
        sp = generate(adapter, p, GenerationConfig(max_new_tokens=24), rec)
        assert sp.output_ids == ar.output_ids
        assert sp.num_proposed > 0
        _check_cache_history(rec, LAYERS, 0)


@pytest.mark.parametrize("exit_layer", [1, 2])
def test_early_exit_runs_no_layer_twice_over_a_row(family, exit_layer):
    """Forward hooks count the tokens each layer processes: with the verification resuming at layer
    E, every layer sees the prompt once and each step's pending token and draft nodes once, so the
    first E layers are never re-run for drafted tokens (re-running them would roughly double
    their count)."""
    model = random_model(family, layers=LAYERS)
    adapter = ModelAdapter(model)
    tokens_seen = [0] * LAYERS
    calls = [0] * LAYERS

    def hook(i):
        def count(module, args, output):
            tokens_seen[i] += args[0].shape[1]  # hidden [B, T, H]
            calls[i] += 1

        return count

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(adapter.layers)]
    try:
        p = _prompt(3)
        res = generate(adapter, p, GenerationConfig(max_new_tokens=20), EarlyExitProposer(exit_layer, DraftLengthPolicy(3)))
    finally:
        for h in handles:
            h.remove()
    rows = (p.numel() - 1) + res.steps + res.num_proposed  # prompt + per step: pending + nodes
    assert res.num_proposed > res.steps  # drafts of several tokens: reuse matters
    assert tokens_seen == [rows] * LAYERS
    # first E layers: one call per drafted row (draft forwards); the rest: one verification call per step
    assert calls == [1 + res.steps + res.num_proposed] * exit_layer + [1 + res.steps] * (LAYERS - exit_layer)


class Dirty:
    """Drafts with the target but forgets to crop what it wrote."""

    name, lossless, hidden_layers = "dirty", True, ()

    def bind(self, target):
        self.view = target

    def reset(self, prompt_ids):
        pass

    def propose(self, tokens, max_tokens, sampling, generator=None):
        self.view.adapter.forward(tokens[-1:][None], self.view.cache)
        return Draft.chain([5])

    def observe(self, feedback):
        pass


def test_a_proposer_that_leaves_the_cache_dirty_is_refused():
    adapter = ModelAdapter(random_model("llama", layers=2))
    with pytest.raises(ProposerError, match="left 10 entries in layer 0 .* expects 9"):
        generate(adapter, _prompt(0), GenerationConfig(max_new_tokens=5), Dirty())


def test_settings_are_validated():
    adapter = ModelAdapter(random_model("llama", layers=2))
    with pytest.raises(ConfigError, match="exit_layer"):
        EarlyExitProposer(0)
    with pytest.raises(ConfigError, match="past the target"):
        generate(adapter, _prompt(0), GenerationConfig(max_new_tokens=3), EarlyExitProposer(3))
    with pytest.raises(ConfigError, match="outside"):
        generate(adapter, _prompt(0), GenerationConfig(max_new_tokens=3), DraftVerifyProposer(skip_mlp=[5]))
    with pytest.raises(ConfigError, match="something to skip"):
        DraftVerifyProposer()
    with pytest.raises(ConfigError, match="bind"):
        EarlyExitProposer(1).reset(_prompt(0))


@pytest.fixture(scope="module")
def peaky_target():
    """32 tokens and a scaled-up head: peaky distributions, so the check below has power."""
    target = random_model("llama", seed=0, vocab_size=32, layers=3, hidden=32)
    with torch.no_grad():
        target.lm_head.weight.mul_(25.0)
    return target


@pytest.mark.parametrize(
    "factory",
    [lambda: EarlyExitProposer(1, DraftLengthPolicy(3)), lambda: DraftVerifyProposer(skip_layers=[1], policy=DraftLengthPolicy(3)),
     lambda: DraftVerifyProposer(skip_attention=[1], skip_mlp=[2], policy=DraftLengthPolicy(3), stop=AdaptiveThreshold())],
    ids=["early-exit", "skip-layers", "draft-verify-adaptive"],
)
def test_sampling_keeps_the_target_distribution(peaky_target, factory):
    res = check_distribution(
        peaky_target, factory, [[1, 5, 9, 3], [1, 20, 7, 7, 11]], SamplingParams(temperature=1.0), num_samples=400,
        num_positions=3,
    )
    assert res.passed, res.summary()
