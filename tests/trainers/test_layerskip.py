"""LayerSkip: the dropout schedule, the curricula's enabled exits and the exit-loss scales against the paper's
formulas (module docstring of draftsmith.trainers.layerskip.trainer), and the layer-by-layer forward against the model's own
(the recipe end to end: tests/launch/test_recipe_layerskip.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.trainers.layerskip.trainer import (
    LayerSkipConfig,
    dropout_rates,
    enabled_exits,
    exit_losses,
    exit_scales,
    layer_forward,
)


def test_dropout_time_is_constant_by_default_as_the_paper_sets_it_for_fine_tuning():
    """LayerSkip sec. 4.1.1: S(t) = 1 for continual pretraining and fine-tuning (what draftsmith does), so every step
    drops layer l at D(l) p_max, D(l) = e^{l ln 2 / (L - 1)} - 1."""
    assert LayerSkipConfig().dropout_time == "constant"
    L, T, p = 5, 11, 0.2
    want = [0.0, (2 ** 0.25 - 1) * p, (2 ** 0.5 - 1) * p, (2 ** 0.75 - 1) * p, p]  # D(l) p_max by hand
    for step in (0, 5, T - 1):
        assert dropout_rates(L, step, T, p).tolist() == pytest.approx(want, abs=1e-6)


def test_increasing_dropout_time_is_the_papers_exponential_curriculum():
    """The option for pretraining from scratch: S_exp(t) = e^{t ln 2 / (T - 1)} - 1 (sec. 4.1.1, eq. 4)."""
    L, T, p = 5, 11, 0.2
    last = dropout_rates(L, T - 1, T, p, time="increasing")  # S(T-1) = 1
    want = [(math.exp(i * math.log(2) / (L - 1)) - 1) * p for i in range(L)]
    assert last.tolist() == pytest.approx(want, abs=1e-6) and last[0] == 0 and last[-1] == pytest.approx(p)
    assert dropout_rates(L, 0, T, p, time="increasing").sum() == 0  # S(0) = 0: training starts with every layer
    mid = dropout_rates(L, 5, T, p, time="increasing")
    assert mid.tolist() == pytest.approx([w * (2 ** 0.5 - 1) for w in want], abs=1e-6)  # S(5) = 2^{5/10} - 1
    assert dropout_rates(L, 0, T, p, time="constant").tolist() == pytest.approx(want, abs=1e-6)
    assert dropout_rates(L, T - 1, T, p, shape="linear").tolist() == pytest.approx([i / 4 * p for i in range(L)])
    assert dropout_rates(L, T - 1, T, p, shape="uniform").tolist() == pytest.approx([p] * L)
    assert LayerSkipConfig(dropout_time="increasing").dropout_time == "increasing"


def test_rotational_curriculum_rotates_every_rth_exit_and_keeps_the_last():
    assert enabled_exits(6, 0, 100, "rotational", rotation=3).tolist() == [True, False, False, True, False, True]
    assert enabled_exits(6, 1, 100, "rotational", rotation=3).tolist() == [False, True, False, False, True, True]
    assert enabled_exits(6, 2, 100, "rotational", rotation=3).tolist() == [False, False, True, False, False, True]
    assert enabled_exits(6, 3, 100, "rotational", rotation=3).tolist() == enabled_exits(6, 0, 100, "rotational", 3).tolist()


def test_gradual_curriculum_enables_exits_from_the_last_layer_down():
    L, T, f = 4, 100, 0.5  # layer l joins once t/T >= f (L - l) / L
    assert enabled_exits(L, 0, T, "gradual", fraction=f).tolist() == [False, False, False, True]
    assert enabled_exits(L, 25, T, "gradual", fraction=f).tolist() == [False, False, True, True]  # 0.25 >= 0.25
    assert enabled_exits(L, 38, T, "gradual", fraction=f).tolist() == [False, True, True, True]
    assert enabled_exits(L, 50, T, "gradual", fraction=f).tolist() == [True, True, True, True]
    assert enabled_exits(L, 7, T, "all").all()


def test_exit_scales_are_the_papers_sums_of_i_normalised_over_enabled_exits():
    """LayerSkip sec. 4.1.2: e(l) = e_scale sum_{i=0..l} i for l < L - 1, e(L - 1) = L - 1 + e_scale sum_{i=0..L-2} i,
    e~(t, l) = C(t, l) e(l) / sum_i C(t, i) e(i)."""
    # L = 5, e_scale = 0.5: e = [0, 0.5 * 1, 0.5 * 3, 0.5 * 6, 4 + 0.5 * 6] = [0, 0.5, 1.5, 3, 7]
    scales = exit_scales(torch.tensor([True, False, True, True, True]), e_scale=0.5)
    assert scales.tolist() == pytest.approx([0.0, 0.0, 3 / 23, 6 / 23, 14 / 23])  # / (1.5 + 3 + 7)
    # e_scale = 1: e(l) = sum_{i<=l} i = [0, 1, 3, 6], every exit on
    assert exit_scales(torch.ones(4, dtype=torch.bool), 1.0).tolist() == pytest.approx([0.0, 0.1, 0.3, 0.6])
    assert exit_scales(torch.tensor([True, False, False, True]), 1.0).tolist() == [0.0, 0.0, 0.0, 1.0]  # e(0) = 0
    assert exit_scales(torch.ones(3, dtype=torch.bool), 0.0).tolist() == [0.0, 0.0, 1.0]  # e_scale 0: last only
    assert exit_scales(torch.tensor([False, False, True]), 1.0).tolist() == [0.0, 0.0, 1.0]
    assert exit_scales(torch.tensor([True]), 1.0).tolist() == [1.0]  # one layer: e(0) = 0, its exit takes it all


def test_layer_forward_is_the_models_own_and_dropout_passes_rows_through():
    model = random_model("llama", seed=0, layers=3)
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        states = layer_forward(model, ids, None, torch.ones(3, dtype=torch.bool))
        assert torch.allclose(states[0], out.hidden_states[1], atol=1e-5)
        assert torch.allclose(model.model.norm(states[2]), out.hidden_states[3], atol=1e-5)  # HF's last is normed
        keep = torch.tensor([[True, True, True], [True, False, True]])  # row 1 skips layer 1
        dropped = layer_forward(model, ids, keep, torch.ones(3, dtype=torch.bool))
        assert torch.equal(dropped[1][1], dropped[0][1]) and torch.allclose(dropped[1][0], states[1][0], atol=1e-6)


def test_config_is_validated():
    with pytest.raises(ConfigError, match="curriculum"):
        LayerSkipConfig(curriculum="random")
    with pytest.raises(ConfigError, match="dropout_max"):
        LayerSkipConfig(dropout_max=1.0)
    assert LayerSkipConfig(exit_layer=0).proposer_settings()["exit_layer"] is None


@pytest.mark.parametrize("called", [False, True])
def test_exit_losses_are_the_full_logits_cross_entropies_in_value_and_gradients(called):
    """Each exit's CE chunked over the vocabulary (through the LM head's weight, or checkpointed calls of a sharded
    head) equals ``cross_entropy(LMHead(norm(h_l)))`` over the full [N, V] logits, gradients included."""
    model = random_model("llama", seed=0, layers=3).train()
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :3] = -100
    exits = torch.tensor([False, True, True])
    got = exit_losses(model, ids, labels, None, exits, called=called)
    states = layer_forward(model, ids, None, exits)
    mask = labels[:, 1:] != -100
    want = {layer: F.cross_entropy(model.lm_head(model.model.norm(h[:, :-1][mask])), labels[:, 1:][mask],
                                   reduction="sum") for layer, h in states.items()}
    assert set(got) == {1, 2}
    params = [p for p in model.parameters() if p.requires_grad]
    total_got, total_want = got[1] + 0.5 * got[2], want[1] + 0.5 * want[2]
    torch.testing.assert_close(total_got, total_want, rtol=1e-5, atol=1e-6)
    for g, w in zip(torch.autograd.grad(total_got, params, allow_unused=True),
                    torch.autograd.grad(total_want, params, allow_unused=True)):
        if w is None:
            assert g is None or not g.any()
            continue
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_held_out_figures_are_the_full_logits_ones(tokenizer, tmp_path):
    """The evaluation's per-exit CE and agreement and the original target's CE, chunked, against the full logits."""
    import transformers

    from draftsmith.trainers.layerskip.trainer import LayerSkipTrainer, build_layerskip_model

    target = random_model("llama", seed=0, layers=3)
    cfg = LayerSkipConfig(dropout_max=0.0, curriculum="all")
    module = build_layerskip_model({"target": target}, cfg)
    torch.manual_seed(2)
    with torch.no_grad():
        for p in module.model.model.layers[0].parameters():
            p.add_(torch.randn_like(p) * 0.1)  # the copy drifts from the original
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                                          disable_tqdm=True)
    trainer = LayerSkipTrainer(model=module, teacher_model=target, args=args, processing_class=tokenizer,
                               method_config=cfg)
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[:, :4] = -100
    batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    trainer.prediction_step(trainer.model, batch, prediction_loss_only=False)
    sums = trainer._eval_sums
    with torch.no_grad():
        out = module.model(input_ids=ids, output_hidden_states=True)
        mask = labels[:, 1:] != -100
        y = labels[:, 1:][mask]
        final = out.logits[:, :-1][mask]
        want = []
        for layer in range(3):
            h = out.hidden_states[layer + 1] if layer < 2 else out.hidden_states[3]
            logits = module.model.lm_head(h[:, :-1][mask] if layer == 2 else module.model.model.norm(h[:, :-1][mask]))
            want += [F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(-1) == final.argmax(-1)).sum()]
        original = F.cross_entropy(target(input_ids=ids).logits[:, :-1][mask], y, reduction="sum")
    torch.testing.assert_close(sums[:-2], torch.stack(want).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sums[-2], original, rtol=1e-5, atol=1e-5)
    assert sums[-1] == mask.sum()
