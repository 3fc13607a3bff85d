"""CLLM's collator and losses against hand-built ones."""

import math

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.trainers.cllm.trainer import (
    CllmConfig,
    ConsistencyTraining,
    TrajectoryCollator,
    TrajectoryDataset,
    ar_loss,
    block_kl,
    row_prompt,
)
from draftsmith.trainers.losses import LinearHead


def test_row_prompt():
    assert row_prompt([5, 6, 7, 8], [-100, -100, 7, 8], 2) == [5, 6]
    assert row_prompt([5, 6, 7, 8], [5, 6, 7, 8], 2) == [5, 6]  # plain text: the first prompt_tokens


def test_collator_against_a_hand_built_batch():
    items = [{"prefix": [1, 2], "state": [9, 4, 9], "next": [3, 4, 9], "fixed": [3, 4, 5]},
             {"prefix": [1], "state": [3, 7, 8], "next": [3, 7, 8], "fixed": [3, 7, 2]}]  # 2 = EOS
    batch = TrajectoryCollator(pad_token_id=0, eos_ids=(2,))(items)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [1, 3, 7, 2, 0]]
    assert batch["input_state"].tolist() == [[1, 2, 9, 4, 9], [1, 3, 7, 8, 0]]
    assert batch["input_next"].tolist() == [[1, 2, 3, 4, 9], [1, 3, 7, 8, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, 5], [-100, 3, 7, 2, -100]]
    # block position i counts when the state's first i tokens differ from the fixed point's
    assert batch["consistency_mask"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]


def test_dataset_draws_intermediate_states_only():
    rows = [{"prefix": [1], "states": [[5, 5], [3, 5], [3, 4]], "fixed_point": [3, 4]}]
    seen = {tuple(TrajectoryDataset(rows, seed=seed)[0]["state"]) for seed in range(50)}
    assert seen == {(5, 5), (3, 5)}
    data = TrajectoryDataset(rows, seed=3)  # a function of the seed, the epoch and the item: repeated on resume
    by_epoch = []
    for epoch in range(20):
        data.set_epoch(epoch)
        by_epoch.append(data[0]["state"])
        assert data[0]["state"] == by_epoch[-1]
    assert len({tuple(s) for s in by_epoch}) == 2
    single = TrajectoryDataset([{"prefix": [1], "states": [[3, 4]], "fixed_point": [3, 4]}])[0]
    assert single["state"] == [3, 4] and single["next"] == [3, 4]


def identity_head(width: int) -> LinearHead:
    """An LM head whose logits are its input: the losses below are then written on logits directly."""
    head = torch.nn.Linear(width, width, bias=False).requires_grad_(False)
    torch.nn.init.eye_(head.weight)
    return LinearHead(head)


def test_losses():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 6)
    head = identity_head(6)
    mask = torch.tensor([[0, 1, 1, 0]])
    assert block_kl(logits, logits, head, mask).abs() < 1e-6
    other = torch.randn(1, 4, 6)
    p, q = logits[0, :2].log_softmax(-1), other[0, :2].log_softmax(-1)  # rows 0 and 1 predict positions 1 and 2
    assert torch.allclose(block_kl(logits, other, head, mask), (p.exp() * (p - q)).sum(), atol=1e-5)
    labels = torch.tensor([[-100, 3, 4, -100]])
    want = torch.nn.functional.cross_entropy(logits[0, :2], torch.tensor([3, 4]), reduction="sum")
    assert torch.allclose(ar_loss(logits, head, labels), want)


@pytest.mark.parametrize("consistency", ["global", "local"])
def test_module_loss_is_the_full_logits_loss_in_value_and_gradients(consistency):
    """The chunked consistency KL and AR loss against the same terms over the full [B, T, V] logits; the teacher
    side is stop-gradient."""
    model = random_model("llama", seed=0, layers=1, hidden=32).train()
    module = ConsistencyTraining(model)
    batch = TrajectoryCollator(0)([{"prefix": [1, 2], "state": [9, 4, 9, 6], "next": [3, 7, 9, 6],
                                    "fixed": [3, 4, 5, 6]},
                                   {"prefix": [1], "state": [8, 8, 8, 8], "next": [3, 8, 8, 8],
                                    "fixed": [3, 9, 10, 2]}])
    got = module(batch["input_ids"], batch["input_state"], batch["input_next"], batch["attention_mask"],
                 batch["labels"], batch["consistency_mask"], consistency, 3.0, 0.1)
    logits = lambda ids: model(input_ids=ids, attention_mask=batch["attention_mask"]).logits  # noqa: E731
    fixed = logits(batch["input_ids"])
    with torch.no_grad():
        teacher = fixed.detach() if consistency == "global" else logits(batch["input_next"])
    student = logits(batch["input_state"])
    rows = batch["consistency_mask"][:, 1:].bool()
    p, q = teacher[:, :-1][rows].log_softmax(-1), student[:, :-1][rows].log_softmax(-1)
    lab = batch["labels"][:, 1:] != -100
    want = (p.exp() * (p - q)).sum() + 3.0 * torch.nn.functional.cross_entropy(
        fixed[:, :-1][lab], batch["labels"][:, 1:][lab], reduction="sum", label_smoothing=0.1)
    assert rows.sum() > 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    params = [p for p in model.parameters() if p.requires_grad]
    for g, w in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_a_model_that_post_processes_its_logits_is_refused():
    from draftsmith.trainers.cllm.trainer import build_cllm_model

    target = random_model("llama", seed=0, layers=1, hidden=32)
    target.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match="final_logit_softcapping=30.0"):
        build_cllm_model({"target": target}, CllmConfig())


def test_ar_loss_is_label_smoothed_by_0_1_by_default_as_in_the_reference():
    """The reference (hao-ai-lab/Consistency_LLM, cllm/cllm_trainer_global.py) computes its AR loss with
    LabelSmoother(epsilon=0.1): per position (1 - eps) * (-log p_label) + eps * mean_v(-log p_v)."""
    assert CllmConfig().ar_label_smoothing == 0.1
    probs = torch.tensor([0.5, 0.25, 0.25])
    logits = torch.stack([probs.log(), torch.zeros(3)])[None]  # [1, 2, 3]: position 0 predicts position 1
    labels = torch.tensor([[-100, 0]])
    # -log p_0 = ln 2, mean_v(-log p_v) = (ln 2 + ln 4 + ln 4) / 3 = 5 ln 2 / 3: 0.9 ln 2 + 0.1 * 5 ln 2 / 3 = 16/15 ln 2
    head = identity_head(3)
    assert float(ar_loss(logits, head, labels, 0.1)) == pytest.approx(16 / 15 * math.log(2), rel=1e-6)
    assert float(ar_loss(logits, head, labels)) == pytest.approx(math.log(2), rel=1e-6)  # eps 0: the paper's eq. 6
    from transformers.trainer_pt_utils import LabelSmoother  # the reference's own call, a mean over the labels

    wide = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))  # [B, T, V]
    marks = torch.tensor([[-100, 1, 2, 3, -100], [-100, -100, 4, 5, 6]])  # 6 labelled positions
    reference = LabelSmoother(epsilon=0.1, ignore_index=-100)({"logits": wide}, marks, shift_labels=True)
    assert float(ar_loss(wide, identity_head(7), marks, 0.1)) == pytest.approx(6 * float(reference), rel=1e-5)
    # the module's AR term (ar_weight 1, no consistency positions) uses the smoothing it is given, 0.1 by default
    model = random_model("llama", seed=0, layers=1, hidden=32)
    module = ConsistencyTraining(model)
    batch = TrajectoryCollator(0)([{"prefix": [1, 2], "state": [3, 4, 5], "next": [3, 4, 5], "fixed": [3, 4, 5]}])
    args = (batch["input_ids"], batch["input_state"], batch["input_next"], batch["attention_mask"], batch["labels"],
            batch["consistency_mask"], "global", 1.0)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        vocab = identity_head(logits.shape[-1])
        assert torch.allclose(module(*args), ar_loss(logits, vocab, batch["labels"], 0.1), atol=1e-5)
        assert torch.allclose(module(*args, 0.0), ar_loss(logits, vocab, batch["labels"]), atol=1e-5)
    with pytest.raises(ConfigError, match="ar_label_smoothing"):
        CllmConfig(ar_label_smoothing=1.0)


def test_global_consistency_trains_the_student_side_only():
    model = random_model("llama", seed=0, layers=1, hidden=32)
    module = ConsistencyTraining(model)
    batch = TrajectoryCollator(0)([{"prefix": [1, 2], "state": [9, 4, 9], "next": [3, 7, 9], "fixed": [3, 4, 5]}])
    loss = module(batch["input_ids"], batch["input_state"], batch["input_next"], batch["attention_mask"],
                  batch["labels"], batch["consistency_mask"], "global", ar_weight=0.0)
    assert loss > 0
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    local = module(batch["input_ids"], batch["input_state"], batch["input_next"], batch["attention_mask"],
                   batch["labels"], batch["consistency_mask"], "local", ar_weight=0.0)
    assert local > 0 and not torch.isclose(local, loss)


def test_consistency_training_raises_jacobi_tau():
    """On a random tiny model's own trajectories, the global consistency loss alone makes Jacobi decoding of those
    prompts commit several tokens per forward (the method's point), still token-identical to the model's AR."""
    import copy
    import random

    from draftsmith.data.jacobi import batch_trajectories
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.generate import GenerationConfig, generate
    from draftsmith.inference.proposers.jacobi import JacobiProposer

    random.seed(0)
    torch.manual_seed(0)
    model = random_model("llama", seed=0, layers=2, hidden=64)
    prompts = [torch.randint(3, 128, (8,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(8)]
    rows = [r for rs in batch_trajectories(model, [str(i) for i in range(8)], prompts, block=8, max_new_tokens=24,
                                           eos_ids=(), seed=0) for r in rs]

    def jacobi_tau(m):
        adapter, taus = ModelAdapter(m), []
        for p in prompts:
            ar = generate(adapter, torch.tensor(p), GenerationConfig(max_new_tokens=24))
            res = generate(adapter, torch.tensor(p), GenerationConfig(max_new_tokens=24), JacobiProposer(block=8))
            assert res.output_ids == ar.output_ids
            taus.append(res.tau)
        return sum(taus) / len(taus)

    tuned = copy.deepcopy(model).requires_grad_(True)
    module, data, collate = ConsistencyTraining(tuned), TrajectoryDataset(rows), TrajectoryCollator(0)
    opt = torch.optim.AdamW(tuned.parameters(), lr=1e-3)
    for _ in range(100):
        b = collate([data[random.randrange(len(data))] for _ in range(8)])
        loss = module(b["input_ids"], b["input_state"], b["input_next"], b["attention_mask"], b["labels"],
                      b["consistency_mask"], "global", ar_weight=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    before, after = jacobi_tau(model), jacobi_tau(tuned.eval())
    assert after > 1.5 * before, (before, after)
