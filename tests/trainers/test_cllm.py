"""CLLM's collator and losses against hand-built ones."""

import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.trainers.cllm import (
    ConsistencyTraining,
    TrajectoryCollator,
    TrajectoryDataset,
    ar_loss,
    block_kl,
    row_prompt,
)


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
    seen = {tuple(TrajectoryDataset(rows)[0]["state"]) for _ in range(50)}
    assert seen == {(5, 5), (3, 5)}
    single = TrajectoryDataset([{"prefix": [1], "states": [[3, 4]], "fixed_point": [3, 4]}])[0]
    assert single["state"] == [3, 4] and single["next"] == [3, 4]


def test_losses():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 6)
    mask = torch.tensor([[0, 1, 1, 0]])
    assert block_kl(logits, logits, mask).abs() < 1e-6
    other = torch.randn(1, 4, 6)
    p, q = logits[0, :2].log_softmax(-1), other[0, :2].log_softmax(-1)  # rows 0 and 1 predict positions 1 and 2
    assert torch.allclose(block_kl(logits, other, mask), (p.exp() * (p - q)).sum(), atol=1e-5)
    labels = torch.tensor([[-100, 3, 4, -100]])
    want = torch.nn.functional.cross_entropy(logits[0, :2], torch.tensor([3, 4]), reduction="sum")
    assert torch.allclose(ar_loss(logits, labels), want)


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
