"""The pretraining loop: learning-rate schedule, batch order, losses, loop state, and a resumed run that is
bit-identical to an uninterrupted one (tiny random llama, seconds)."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.data.zoo import ModelSpec, ZooSpec
from draftsmith.trainers import pretrain

MODEL = ModelSpec(layers=1, hidden=32, intermediate=64, heads=4, kv_heads=2, tokens=16 * 6, lr=1e-2, warmup_steps=2)


def spec(**changes) -> ZooSpec:
    base = dict(size="tiny", target=MODEL, draft=MODEL, vocab_size=512, seq_len=8, batch_size=2, max_positions=64,
                checkpoint_every=2, precision="fp32")  # fmt: skip
    return ZooSpec(**{**base, **changes})


def test_learning_rate_schedule_warms_up_then_decays():
    m = MODEL  # lr 1e-2, 2 warmup steps, min ratio 0.1
    lrs = [pretrain.lr_at(s, 20, m) for s in range(20)]
    assert lrs[0] == pytest.approx(5e-3) and lrs[1] == pytest.approx(1e-2) and lrs[2] == pytest.approx(1e-2)
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))
    assert pretrain.lr_at(20, 20, m) == pytest.approx(1e-3)


def test_batches_cover_every_row_once_per_epoch_and_depend_on_the_step_only():
    n_rows, batch = 10, 4
    seen = torch.cat([pretrain.batch_rows(step, batch, n_rows, seed=3) for step in range(5)])  # 2 epochs
    assert sorted(seen[:10].tolist()) == list(range(10)) and sorted(seen[10:20].tolist()) == list(range(10))
    assert torch.equal(pretrain.batch_rows(3, batch, n_rows, seed=3), seen[12:16])
    other_seed = torch.cat([pretrain.batch_rows(step, batch, n_rows, seed=4) for step in range(3)])
    assert not torch.equal(other_seed[:10], seen[:10])


def test_lm_loss_sums_next_token_cross_entropy_and_skips_padding():
    logits = torch.randn(2, 5, 7)  # [B, T, V]
    ids = torch.randint(0, 7, (2, 5))
    logp = logits.log_softmax(-1)
    by_hand = -logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
    assert pretrain.lm_loss(logits, ids).item() == pytest.approx(by_hand.sum().item(), rel=1e-5)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    assert pretrain.lm_loss(logits, ids, pad).item() == pytest.approx(by_hand.sum().item() - by_hand[1, 2:].sum().item(), rel=1e-5)


def test_heldout_loss_scores_only_real_tokens():
    model = random_model("llama", seed=0, layers=1)
    rows = torch.tensor([list(range(6, 70))] * 3)  # [3, 64]
    loss, count = pretrain.heldout_loss(model, rows, n_real=150, batch_size=2, device="cpu")
    assert count == 150 - 3 and math.isfinite(loss) and 0 < loss < math.log(128) + 2


def test_optimizer_decays_matrices_only_and_precision_choice():
    model = random_model("llama", seed=0, layers=1)
    decay, no_decay = pretrain.make_optimizer(model, MODEL).param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert decay["weight_decay"] == MODEL.weight_decay and no_decay["weight_decay"] == 0.0
    assert pretrain.autocast_dtype("fp32", "cpu") is None and pretrain.autocast_dtype("bf16", "cpu") is torch.bfloat16
    assert pretrain.autocast_dtype("auto", "cpu") in (None, torch.bfloat16)


def test_loop_state_and_stats():
    state = pretrain.next_state(pretrain.fresh_state(), loss=2.0, seconds=0.5)
    assert state == {"step": 1, "train_seconds": 0.5, "loss_ema": 2.0}
    state = pretrain.next_state(state, loss=1.0, seconds=0.25)
    assert state["step"] == 2 and state["loss_ema"] == pytest.approx(1.95) and state["train_seconds"] == 0.75
    stats = pretrain.train_stats(state, total=2, tokens_per_step=16, dtype=None)
    assert stats == {"steps": 2, "tokens_seen": 32, "train_seconds": 0.75, "final_train_loss": 1.95,
                     "precision": "fp32"}  # fmt: skip


class Interrupt(Exception):
    pass


def train(tmp_path, on_step=None) -> tuple[torch.nn.Module, dict]:
    tmp_path.mkdir(exist_ok=True)
    model = random_model("llama", seed=0, layers=1).train()
    rows = torch.randint(3, 128, (10, 8), generator=torch.Generator().manual_seed(0))  # [N, T]
    stats = pretrain.train_model(model, rows, MODEL, spec(), "target", seed=1, checkpoint=tmp_path / "ckpt.pt",
                                 device="cpu", on_step=on_step, progress=False)  # fmt: skip
    return model, stats


def test_a_resumed_run_is_identical_to_an_uninterrupted_one(tmp_path):
    full, stats = train(tmp_path / "a")
    assert stats["steps"] == spec().steps("target") == 6 and stats["tokens_seen"] == 6 * 16
    assert math.isfinite(stats["final_train_loss"]) and stats["precision"] == "fp32"

    def crash_at_step_3(stage, step):
        if step == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(tmp_path / "b", on_step=crash_at_step_3)
    checkpoint = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=False)
    assert checkpoint["state"]["step"] == 2 and not [p for p in (tmp_path / "b").iterdir() if ".tmp" in p.name]
    steps = []
    resumed, _ = train(tmp_path / "b", on_step=lambda stage, step: steps.append(step))
    assert steps == [3, 4, 5, 6]
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
