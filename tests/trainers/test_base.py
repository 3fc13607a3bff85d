"""The frozen-target trainer base: acceptance metrics and loss normalisation over gradient accumulation."""

import pytest
import torch

from draftsmith.trainers.base import acceptance_metrics


def test_acceptance_metrics_formula():
    m = acceptance_metrics(torch.tensor([30.0, 60.0, 100.0]), draft_length=4)
    assert m["eval_tvd"] == pytest.approx(0.3)
    assert m["eval_estimated_acceptance"] == pytest.approx(0.7)
    assert m["eval_predicted_tau"] == pytest.approx(sum(0.7**i for i in range(5)))
    assert m["eval_greedy_acceptance"] == pytest.approx(0.6)
    assert m["eval_predicted_tau_greedy"] == pytest.approx(sum(0.6**i for i in range(5)))
    assert acceptance_metrics(torch.zeros(3), 4) == {}



def _variable_length_rows(tokenizer) -> list[dict]:
    """8 chat rows whose answers differ in length (3 to 40 characters), so micro-batch means differ."""
    from draftsmith.data.chat import tokenize_messages

    answers = ["ok.", "yes it is.", "a" * 40, "no.", "that is " + "b" * 20, "x.", "maybe " * 4, "c" * 30]
    return [tokenize_messages(tokenizer, [{"role": "user", "content": f"q{i}?"},
                                         {"role": "assistant", "content": a}], 96) for i, a in enumerate(answers)]


def _one_sgd_step_delta(pair, tokenizer, tmp_path, batch: int, accumulation: int, fused: bool) -> list[torch.Tensor]:
    """The draft's parameter change after one SGD step (lr 1, no clipping): minus the accumulated gradient."""
    import copy

    import datasets
    import transformers

    from draftsmith.trainers.distillspec.trainer import DistillSpecConfig, DistillSpecTrainer

    target, draft = copy.deepcopy(pair[0]), copy.deepcopy(pair[1])
    before = [p.detach().clone() for p in draft.parameters()]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / f"b{batch}x{accumulation}"), report_to=[], use_cpu=True, max_steps=1,
        per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, optim="sgd",
        learning_rate=1.0, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, save_strategy="no",
        disable_tqdm=True, seed=0)
    trainer = DistillSpecTrainer(model=draft, teacher_model=target, method_config=DistillSpecConfig(use_fused_kernel=fused),
                                 args=args, train_dataset=datasets.Dataset.from_list(_variable_length_rows(tokenizer)),
                                 processing_class=tokenizer)
    trainer.train()
    return [p.detach() - b for p, b in zip(draft.parameters(), before)]


@pytest.mark.parametrize("fused", [False, True], ids=["full-logits", "fused"])
def test_gradient_accumulation_1x8_equals_4x2_on_variable_length_rows(pair, tokenizer, tmp_path, fused):
    """The loss is the mean over the loss tokens of the whole window, so splitting 8 rows into 4 micro-batches of
    2 gives the gradient of one batch of 8 (a mean of micro-batch means would weight short answers up)."""
    lengths = {sum(label != -100 for label in r["labels"]) for r in _variable_length_rows(tokenizer)}
    assert len(lengths) > 4  # the rows really differ in length
    whole = _one_sgd_step_delta(pair, tokenizer, tmp_path, batch=8, accumulation=1, fused=fused)
    split = _one_sgd_step_delta(pair, tokenizer, tmp_path, batch=2, accumulation=4, fused=fused)
    assert any(d.abs().max() > 1e-4 for d in whole)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("step", "max_steps", "planned", "finished"), [
    (4, 4, 4, True), (3, 4, 4, False), (5, 4, 4, True), (6, -1, 6, True), (5, -1, 6, False), (0, -1, 0, False)])
def test_a_checkpoint_at_the_last_step_is_finished(tmp_path, step, max_steps, planned, finished):
    """A resume from it trains no step more: ``max_steps`` when set, else the step count the checkpoint planned."""
    import transformers

    from draftsmith.trainers.base import finished_checkpoint

    transformers.TrainerState(global_step=step, max_steps=planned).save_to_json(str(tmp_path / "trainer_state.json"))
    assert finished_checkpoint(str(tmp_path), max_steps) is finished
    assert finished_checkpoint(None, max_steps) is False
    assert finished_checkpoint(str(tmp_path / "absent"), max_steps) is False


def test_under_zero3_the_target_generates_a_batch_from_one_whole_copy(pair, tokenizer, tmp_path, monkeypatch):
    """Target-generated data under ZeRO-3: the target is gathered into one plain copy per batch (one collective),
    which generates without ``synced_gpus`` — not the engine's layer-by-layer gathers for every generated token."""
    import copy

    import transformers

    import draftsmith.common.sharding as sharding
    import draftsmith.trainers.base as base
    from draftsmith.trainers.distillspec.trainer import DistillSpecConfig, DistillSpecTrainer

    class Zero3(DistillSpecTrainer):  # ZeRO-3's placement, without DeepSpeed
        def _zero_stage(self) -> int:
            return 3

        def _place_teacher(self, teacher):
            return teacher

    target, draft = copy.deepcopy(pair[0]), copy.deepcopy(pair[1])
    copies, calls = [], []
    real_copy, real_sample = sharding.whole_copy, base.sample_completions
    monkeypatch.setattr(sharding, "whole_copy", lambda m: copies.append(real_copy(m)) or copies[-1])
    monkeypatch.setattr(base, "sample_completions",
                        lambda model, *a, **k: calls.append((model, k["synced_gpus"])) or real_sample(model, *a, **k))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = Zero3(model=draft, teacher_model=target, method_config=DistillSpecConfig(), args=args,
                    processing_class=tokenizer)
    rows = trainer.data_collator(_variable_length_rows(tokenizer)[:2])
    with torch.no_grad():
        for _ in range(2):
            trainer.generated_batch(rows, max_new_tokens=4, prompt_tokens=8)
    assert len(copies) == 2 and [c for c, _ in calls] == copies  # one gathered copy per batch, which generates
    assert all(not synced for _, synced in calls) and all(c is not target for c in copies)
