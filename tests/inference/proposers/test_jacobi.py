"""Jacobi decoding as a proposer: exact greedy output, the Jacobi update from the verification forward, and the
fast-forwarded / stationary counts against hand-made steps."""

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import (
    LAYOUT_FAMILIES,
    random_model,
)
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.proposer import StepFeedback
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.proposers.jacobi import JacobiProposer


@pytest.fixture(params=LAYOUT_FAMILIES)
def family(request):  # the proposers' logic on one family of each layout
    return request.param


def _prompt(seed, n=10):
    return torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("block", [1, 4, 16])
def test_greedy_is_token_identical(family, block):
    model = random_model(family, seed=0, layers=2, hidden=48)
    adapter = ModelAdapter(model)
    proposer = JacobiProposer(block=block)
    for seed in range(3):
        p = _prompt(seed)
        ar = generate(adapter, p, GenerationConfig(max_new_tokens=24))
        sp = generate(adapter, p, GenerationConfig(max_new_tokens=24), proposer)
        assert sp.output_ids == ar.output_ids
    assert proposer.stats["committed"] == proposer.stats["steps"] + proposer.stats["accepted"]


def test_a_repetitive_target_fast_forwards():
    """A model that only ever predicts one token: after the first update the whole block is right."""
    model = random_model("llama", seed=0, layers=1, hidden=32)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[7] = 1.0
        model.model.norm.weight.fill_(1.0)
    adapter = ModelAdapter(model)
    p = torch.tensor([7, 7, 7, 7])  # every hidden state's sum-like projection: token 7's logit dominates
    ar = generate(adapter, p, GenerationConfig(max_new_tokens=20))
    proposer = JacobiProposer(block=4)
    sp = generate(adapter, p, GenerationConfig(max_new_tokens=20), proposer)
    assert sp.output_ids == ar.output_ids
    assert sp.steps < ar.steps and proposer.stats["fast_forwarded"] + proposer.stats["stationary"] > 0


def _feedback(accepted, proposed, next_guess_rows, committed):
    logits = torch.zeros(proposed + 1, 50)
    for r, tok in enumerate(next_guess_rows):
        logits[r, tok] = 1.0
    return StepFeedback(num_proposed=proposed, num_accepted=accepted, draft_seconds=0.0, target_seconds=0.0,
                        accepted=list(range(accepted)), committed=committed, target_logits=logits)


def test_counts_stationary_and_fast_forwarded_tokens():
    """Three iterations on prompt [1, 2, 3] (pending token at position 2), block 3: two updates that fix one token
    each, then a step that accepts 12 and 13 (unchanged at positions 5 and 6 since the previous guess: stationary)
    and 14 (new at position 7: fast-forwarded)."""
    prop = JacobiProposer(block=3, seed=0)
    greedy = SamplingParams()
    tokens = torch.tensor([1, 2, 3])
    prop.reset(tokens)
    assert len(prop.propose(tokens, 3, greedy)) == 3  # a random guess from the context
    prop.observe(_feedback(0, 3, [10, 11, 12, 13], committed=[10]))
    tokens = torch.tensor([1, 2, 3, 10])
    assert prop.propose(tokens, 3, greedy).tokens.tolist() == [11, 12, 13]  # the Jacobi update, positions 4..6
    prop.observe(_feedback(0, 3, [11, 12, 13, 14], committed=[11]))
    tokens = torch.tensor([1, 2, 3, 10, 11])
    assert prop.propose(tokens, 3, greedy).tokens.tolist() == [12, 13, 14]  # positions 5..7
    prop.observe(_feedback(3, 3, [12, 13, 14, 15], committed=[12, 13, 14, 15]))
    assert prop.stats == {"steps": 3, "committed": 6, "accepted": 3, "fast_forwarded": 1, "stationary": 2}
    key, section = prop.report_section()
    assert key == "jacobi" and section["block"] == 3
    assert section["stationary_per_block"] == pytest.approx(2 / (6 / 3))


def test_sampling_is_refused():
    prop = JacobiProposer(block=2)
    prop.reset(torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="greedy"):
        prop.propose(torch.tensor([1, 2]), 2, SamplingParams(temperature=1.0))
