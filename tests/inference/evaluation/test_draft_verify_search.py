"""Draft & Verify: the adaptive threshold's updates (the reference's arithmetic), the search space, the skip-set
helpers, a few-trial search on a tiny model, and a killed study resuming from its storage without repeating
finished trials."""

from __future__ import annotations

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.evaluation.draft_verify import (
    SearchSettings,
    SkipSet,
    baselines,
    proposer_for,
    search,
    search_space,
    skip_set_of,
)
from draftsmith.inference.proposers.draft_verify import AdaptiveThreshold, DraftVerifyProposer


def _reference_update(th, matchness, accepted, drafted, max_step_draft, auto_parameters=(1, 0.5, 0.9, 1e-2, 0.9)):
    """decoding.py's threshold update after one verification (dilab-zju/self-speculative-decoding), transcribed."""
    matchness = auto_parameters[1] * matchness + (1 - auto_parameters[1]) * (accepted / drafted)
    if matchness < auto_parameters[2]:
        new_th = th + auto_parameters[3]
    elif drafted == max_step_draft:
        new_th = th
    else:
        new_th = th - auto_parameters[3]
    return auto_parameters[4] * th + (1 - auto_parameters[4]) * new_th, matchness


# (accepted, drafted) per verified step, drafts of up to 8: low acceptance, three full drafts (the last one with the
# estimate at the target: held), a short fully accepted draft (threshold lowered), a rejected draft (raised again)
STEPS = [(2, 4), (8, 8), (8, 8), (8, 8), (3, 3), (0, 5)]
# the threshold after each step, by hand: 0.8 -> 0.9*0.8 + 0.1*0.81, ...; the estimate 0 -> 0.25, 0.625, ...
HAND = [0.801, 0.802, 0.803, 0.803, 0.802, 0.803]


def test_reference_threshold_update_matches_the_reference_arithmetic():
    rule = AdaptiveThreshold()  # the default is the reference's rule
    assert rule.rule == "reference" and (rule.gamma, rule.acceptance) == (0.8, 0.0)
    th, matchness = 0.8, 0.0  # decoding.py: th_stop_draft=0.8, tmp_matchness=0
    for (accepted, drafted), hand in zip(STEPS, HAND, strict=True):
        th, matchness = _reference_update(th, matchness, accepted, drafted, 8)
        rule.observe(drafted, accepted, full=drafted == 8)
        assert rule.gamma == pytest.approx(th, abs=1e-12) and rule.acceptance == pytest.approx(matchness, abs=1e-12)
        assert rule.gamma == pytest.approx(hand, abs=1e-12)
    assert rule.acceptance == pytest.approx(0.4765625)
    rule.observe(0, 0)  # nothing proposed: no update
    assert rule.gamma == pytest.approx(HAND[-1])
    rule.reset()
    assert (rule.gamma, rule.acceptance) == (0.8, 0.0)
    every_other = AdaptiveThreshold(every=2)  # auto_parameters[0]: update on every 2nd verification only
    every_other.observe(4, 0)
    assert every_other.gamma == 0.8
    every_other.observe(4, 0)
    assert every_other.gamma == pytest.approx(0.801)


def test_unsmoothed_rule_is_draftsmiths_earlier_update():
    rule = AdaptiveThreshold.preset("unsmoothed", gamma=0.5, step=0.1, beta1=0.5)
    assert rule.acceptance == 0.8  # the estimate starts at the target
    rule.observe(4, 0, full=False)  # AR 0.8 -> 0.4: below target, the whole step up
    assert rule.acceptance == pytest.approx(0.4) and rule.gamma == pytest.approx(0.6)
    rule.observe(2, 2)  # AR 0.7: still below
    assert rule.gamma == pytest.approx(0.7)
    rule.observe(1, 1, full=True)
    rule.observe(1, 1, full=True)  # AR 0.85, 0.925: above, down even after full drafts (no hold)
    assert rule.acceptance == pytest.approx(0.925) and rule.gamma == pytest.approx(0.5)
    high = AdaptiveThreshold.preset("unsmoothed", gamma=0.95, step=0.1)
    high.observe(1, 0)
    assert high.gamma == 0.99  # clamped
    assert AdaptiveThreshold.preset("unsmoothed").rule == "unsmoothed"
    with pytest.raises(ConfigError, match="adaptive threshold"):
        AdaptiveThreshold(gamma=1.5)
    with pytest.raises(ConfigError, match="threshold rule"):
        AdaptiveThreshold.preset("paper")


def test_threshold_settings_round_trip_and_old_artefacts_keep_their_rule():
    for rule in ("reference", "unsmoothed"):
        again = AdaptiveThreshold.from_dict(AdaptiveThreshold.preset(rule).to_dict())
        assert again.rule == rule and again.settings() == AdaptiveThreshold.preset(rule).settings()
    assert AdaptiveThreshold.from_dict(None).rule == "reference"
    custom = AdaptiveThreshold.from_dict(AdaptiveThreshold(target=0.85).to_dict())
    assert custom.rule == "custom" and custom.target == 0.85 and custom.beta2 == 0.9
    # the dict an artefact searched with the earlier default holds
    old = AdaptiveThreshold.from_dict({"gamma": 0.6, "target": 0.8, "step": 0.01, "beta": 0.9, "low": 0.0,
                                       "high": 0.99})
    assert old.rule == "unsmoothed"


def test_the_threshold_holds_only_after_drafts_that_ran_to_their_longest():
    """The proposer tells the rule whether each draft ran to the policy's length; a threshold of 0 never stops a
    draft, one of 1 stops every draft after its first token (the draft's own probability of it is below 1)."""

    class Spy(AdaptiveThreshold):
        def observe(self, proposed, accepted, full=False):
            self.seen.append((proposed, full))
            super().observe(proposed, accepted, full)

    adapter = ModelAdapter(random_model("llama", seed=0, layers=4))
    prompt = torch.randint(3, 100, (10,), generator=torch.Generator().manual_seed(0))
    for gamma in (0.0, 1.0):
        stop = Spy(gamma=gamma)
        stop.seen = []
        proposer = DraftVerifyProposer(skip_attention=(1, 2), skip_mlp=(2,), policy=DraftLengthPolicy(3), stop=stop)
        generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer)
        assert stop.seen and all(full == (proposed == 3) for proposed, full in stop.seen)
        if gamma == 0.0:
            assert any(full for _, full in stop.seen)
        else:
            assert all(proposed <= 1 for proposed, _ in stop.seen)  # 0: nothing left to draft at the end


def test_the_search_space_includes_the_first_and_last_layers_by_default():
    assert SearchSettings().pin_ends is False
    space = search_space(4)
    assert len(space) == 8 and {"attn_0", "mlp_0", "attn_3", "mlp_3"} <= set(space)
    assert search_space(4, pin_ends=True) == ["attn_1", "mlp_1", "attn_2", "mlp_2"]
    assert search_space(2, pin_ends=True) == search_space(2)  # nothing left to search otherwise


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
    assert set(study.best_trial.params) == set(search_space(4))  # every sublayer, the first and last layers' too
    pinned = search(target, prompts, f"sqlite:///{tmp_path / 'pinned.db'}", 2,
                    SearchSettings(draft_length=3, max_new_tokens=6, pin_ends=True), progress=False)
    assert set(pinned.trials[0].params) == {"attn_1", "mlp_1", "attn_2", "mlp_2"}


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
    costs = sublayer_seconds(adapter, prefix_tokens=8, repeats=10)  # fastest of 10: steady on a busy box
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
