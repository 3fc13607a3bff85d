"""Choosing the exit layer: per-layer agreement against hand computation, the costs, the prediction's formula
(the command end to end: tests/launch/test_exit_cli.py)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.evaluation.exit_layer import exit_agreement, exit_costs, predict


def test_agreement_is_each_exits_argmax_against_the_full_models():
    target = random_model("llama", seed=0, layers=3)
    seq = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    agreement = exit_agreement(target, [seq], [5])
    assert len(agreement) == 3 and agreement[-1] == 1.0
    with torch.no_grad():
        out = target(input_ids=torch.tensor([seq]), output_hidden_states=True)
        final = out.logits[0, 4:11].argmax(-1)  # positions 4..10 predict the answer tokens 5..11
        exit1 = target.lm_head(target.model.norm(out.hidden_states[1][0, 4:11])).argmax(-1)
    assert agreement[0] == pytest.approx(float((exit1 == final).float().mean()))


def test_costs_cover_every_exit_and_the_verification_sizes():
    costs, verify = exit_costs(random_model("llama", seed=0, layers=3), prefix_tokens=8, repeats=2, verify_sizes=[3, 5])
    assert sorted(costs) == [1, 2, 3] and all(s > 0 for s in costs.values())
    assert sorted(verify) == [1, 3, 5] and verify[1] <= verify[3] <= verify[5]


def test_prediction_follows_the_formula():
    verify = {1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 5: 1.8}
    ranked = predict([0.5, 0.9, 1.0], {1: 0.2, 2: 0.5, 3: 1.0}, verify, num_layers=3, lengths=(1, 2))
    assert {(c.exit_layer, c.draft_length) for c in ranked} == {(1, 1), (1, 2), (2, 1), (2, 2)}  # never the last layer
    c = next(c for c in ranked if (c.exit_layer, c.draft_length) == (2, 2))
    tau = 1 + 0.9 + 0.81
    assert c.predicted_tau == pytest.approx(tau, abs=1e-4)
    assert c.predicted_speedup == pytest.approx(tau * 1.0 / (2 * 0.5 + (1 / 3) * 1.4), abs=1e-4)
    assert ranked[0].predicted_speedup == max(r.predicted_speedup for r in ranked)
