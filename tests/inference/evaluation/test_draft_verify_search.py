"""Draft & Verify: the adaptive threshold's updates, the skip-set helpers, a few-trial search on a tiny model, and
a killed study resuming from its storage without repeating finished trials."""

from __future__ import annotations

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.evaluation.draft_verify import (
    SearchSettings,
    SkipSet,
    baselines,
    proposer_for,
    search,
    skip_set_of,
)
from draftsmith.inference.proposers.draft_verify import AdaptiveThreshold


def test_adaptive_threshold_follows_the_measured_acceptance():
    rule = AdaptiveThreshold(gamma=0.5, target=0.8, step=0.1, beta=0.5)
    rule.observe(4, 0)  # AR 0.8 -> 0.4: below target, stop earlier
    assert rule.acceptance == pytest.approx(0.4) and rule.gamma == pytest.approx(0.6)
    rule.observe(2, 2)  # AR 0.7: still below
    assert rule.gamma == pytest.approx(0.7)
    rule.observe(1, 1)
    rule.observe(1, 1)  # AR 0.85, 0.925: above, let drafts run longer
    assert rule.acceptance == pytest.approx(0.925) and rule.gamma == pytest.approx(0.5)
    rule.observe(0, 0)  # nothing proposed: no update
    assert rule.gamma == pytest.approx(0.5)
    rule.reset()
    assert rule.gamma == 0.5 and rule.acceptance == 0.8
    high = AdaptiveThreshold(gamma=0.95, step=0.1, high=0.99)
    high.observe(1, 0)
    assert high.gamma == 0.99  # clamped
    with pytest.raises(ConfigError, match="adaptive threshold"):
        AdaptiveThreshold(gamma=1.0)


def test_skip_sets_and_baselines():
    assert skip_set_of({"attn_1": True, "mlp_1": False, "mlp_2": True}, 4) == SkipSet((1,), (2,))
    b = baselines(6)
    assert b["every_other_layer"] == SkipSet((1, 3, 5), (1, 3, 5)) and b["last_half"] == SkipSet((3, 4, 5), (3, 4, 5))
    assert SkipSet((1,), ()).picture(3) == {"attention": ".x.", "mlp": "..."}
    assert proposer_for(SkipSet(), SearchSettings()) is None


def test_searched_skip_set_decodes_identically_with_adaptive_stopping():
    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    proposer = proposer_for(SkipSet((1, 2), (2,)), SearchSettings(draft_length=6))
    for seed in range(3):
        prompt = torch.randint(3, 100, (10,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
        assert generate(adapter, prompt, GenerationConfig(max_new_tokens=24), proposer).output_ids == ar.output_ids


def test_a_killed_study_resumes_without_repeating_finished_trials(tmp_path):
    import optuna

    target = random_model("llama", seed=0, layers=4)
    prompts = [torch.randint(3, 100, (8,), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    settings = SearchSettings(draft_length=3, max_new_tokens=6, seed=0)
    first = search(target, prompts, storage, 3, settings, progress=False)  # "killed" after 3 trials
    numbers = [(t.number, t.params) for t in first.trials]
    study = search(target, prompts, storage, 5, settings, progress=False)  # rerun: continues to 5
    assert len(study.trials) == 5 and [(t.number, t.params) for t in study.trials[:3]] == numbers
    done = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(done) == 5
    assert search(target, prompts, storage, 5, settings, progress=False).trials == study.trials  # nothing left to do
    assert all(k.startswith(("attn_", "mlp_")) and k.split("_")[1] in ("1", "2") for k in study.best_trial.params)


def test_predicted_objective_from_agreement_and_sublayer_costs(tmp_path):
    from draftsmith.inference.evaluation.draft_verify import (
        predicted_seconds_per_token,
        skip_agreement,
        sublayer_seconds,
    )

    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    seq = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(0))
    assert skip_agreement(adapter, [seq], [5], SkipSet((), ())) == 1.0  # skipping nothing is the full model
    a = skip_agreement(adapter, [seq], [5], SkipSet((1, 2), (1, 2)))
    assert 0.0 <= a <= 1.0
    costs = sublayer_seconds(adapter, prefix_tokens=8, repeats=2)
    assert costs["full"] > 0 and set(costs) == {"full"} | {f"{k}_{i}" for k in ("attn", "mlp") for i in range(4)}
    assert len({costs[f"attn_{i}"] for i in range(4)}) == 1 and len({costs[f"mlp_{i}"] for i in range(4)}) == 1
    assert sum(costs[f"{k}_{i}"] for k in ("attn", "mlp") for i in range(4)) <= costs["full"] * 1.5  # not 2L noises
    flat = {"full": 1.0} | {f"{k}_{i}": 0.1 for k in ("attn", "mlp") for i in range(4)}
    verify = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    got = predicted_seconds_per_token(0.5, SkipSet((1, 2), (1, 2)), flat, verify, 3)
    want = min((k * 0.6 + 1.0) / ((1 - 0.5 ** (k + 1)) / 0.5) for k in (1, 2, 3))
    assert got == pytest.approx(want)
    study = search(target, [seq[:6]], f"sqlite:///{tmp_path / 'p.db'}", 3,
                   SearchSettings(draft_length=3, max_new_tokens=6, objective="predicted"), progress=False)
    assert len(study.trials) == 3 and all("agreement" in t.user_attrs or t.params == {} for t in study.trials)
