"""DistillSpecConfig validation, the loss against a hand computation, the data modes and the acceptance metric."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections import Counter

import datasets
import pytest
import torch
import transformers

from draftsmith.common.errors import ConfigError
from draftsmith.data.chat import tokenize_messages
from draftsmith.data.collate import PadCollator, response_mask
from draftsmith.data.generation import cut_at_eos, split_prompts
from draftsmith.inference.core.draft_length import expected_tau
from draftsmith.trainers.distillspec.trainer import DistillSpecConfig, DistillSpecTrainer
from draftsmith.trainers.logits import draft_argmax, draft_labels

KINDS = ("forward_kl", "reverse_kl", "jsd", "tvd")


def chat_rows(tokenizer, n: int = 12) -> list[dict]:
    return [
        tokenize_messages(tokenizer, [{"role": "user", "content": f"q{i}?"},
                                      {"role": "assistant", "content": f"answer {i}."}], 64)
        for i in range(n)
    ]


def make_trainer(pair, tokenizer, tmp_path, config=None, train_rows=None, eval_rows=None, **args):
    target, draft = pair
    defaults = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_train_batch_size=4,
                    per_device_eval_batch_size=4, max_steps=2, save_strategy="no", disable_tqdm=True, seed=0)
    defaults.update(args)
    return DistillSpecTrainer(
        model=draft, teacher_model=target, method_config=config or DistillSpecConfig(),
        args=transformers.TrainingArguments(**defaults),
        train_dataset=datasets.Dataset.from_list(train_rows) if train_rows else None,
        eval_dataset=datasets.Dataset.from_list(eval_rows) if eval_rows else None,
        processing_class=tokenizer,
    )


@contextlib.contextmanager
def target_refused(target):
    """Fail the test if ``target``'s forward runs inside the block."""
    def refuse(*_):
        raise AssertionError("the target ran")

    hook = target.register_forward_pre_hook(refuse)
    try:
        yield
    finally:
        hook.remove()


# ------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"divergence": "kl"}, "divergence"),
        ({"beta": 1.5}, "beta"),
        ({"beta": -0.1}, "beta"),
        ({"temperature": 0.0}, "temperature"),
        ({"data_mode": "offline"}, "data_mode"),
        ({"draft_layers": 0}, "draft_layers"),
        ({"lmbda": 2.0}, "lmbda"),
        ({"mixed_with": "onpolicy"}, "mixed_with"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"generation_temperature": -1.0}, "generation_temperature"),
        ({"generation_top_p": 0.0}, "generation_top_p"),
        ({"generation_top_p": 1.1}, "generation_top_p"),
        ({"prompt_tokens": 0}, "prompt_tokens"),
        ({"draft_length": 0}, "draft_length"),
        ({"eval_responses": "draft"}, "eval_responses"),
        ({"kernel_backend": "cuda"}, "kernel_backend"),
        ({"kernel_chunk_size": 0}, "kernel_chunk_size"),
        ({"target_quantization": "2bit"}, "target_quantization"),
        ({"target_signal": "hidden"}, "target_signal"),
        ({"target_signal": "tokens", "data_mode": "onpolicy"}, "data_mode=onpolicy"),
        ({"target_signal": "tokens", "data_mode": "mixed"}, "data_mode=mixed"),
        ({"target_signal": "tokens", "use_fused_kernel": True}, "leave use_fused_kernel unset"),
        ({"draft_vocab": "corpus"}, "draft_vocab"),
        ({"logits_vocab": "answers"}, "logits_vocab"),
        ({"features": "disk"}, "features"),
        ({"features": "offline", "target_signal": "tokens"}, "features=offline.*target_signal=tokens"),
        ({"features": "offline", "data_mode": "onpolicy"}, "features=offline.*data_mode=onpolicy"),
        ({"draft_vocab": "answers"}, "target_signal=tokens and data_mode=fixed"),
        ({"draft_vocab": "answers", "target_signal": "tokens", "data_mode": "target"}, "data_mode=fixed"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        DistillSpecConfig(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
@pytest.mark.parametrize("bits", ["8bit", "4bit"])
def test_quantized_target_needs_cuda(bits):
    with pytest.raises(ConfigError, match="needs a CUDA GPU.*target_quantization=none"):
        DistillSpecConfig(target_quantization=bits)


def test_config_defaults_are_valid_and_serialisable():
    cfg = DistillSpecConfig()
    d = dataclasses.asdict(cfg)
    assert d["divergence"] == "forward_kl" and d["data_mode"] == "fixed" and d["draft_length"] == 4
    assert DistillSpecConfig(**d) == cfg
    for f in DistillSpecConfig.__dataclass_fields__.values():
        assert f.metadata.get("help"), f"{f.name} has no help text"


# ------------------------------------------------------------------------------------------------- the loss


def hand_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor, kind: str, beta: float, temp: float) -> float:
    """One token, written out from the definitions (teacher p, student q), in float64."""
    p = torch.softmax(p_logits.double() / temp, -1)
    q = torch.softmax(q_logits.double() / temp, -1)
    if kind == "forward_kl":
        return float((p * (p.log() - q.log())).sum())
    if kind == "reverse_kl":
        return float((q * (q.log() - p.log())).sum())
    if kind == "tvd":
        return float(0.5 * (p - q).abs().sum())
    m = beta * p + (1 - beta) * q
    return float(beta * (p * (p.log() - m.log())).sum() + (1 - beta) * (q * (q.log() - m.log())).sum())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fused", [False, True])
def test_compute_loss_equals_hand_computed_divergence(pair, tokenizer, tmp_path, kind, fused):
    target, draft = pair
    cfg = DistillSpecConfig(divergence=kind, beta=0.3, temperature=1.7, use_fused_kernel=fused)
    trainer = make_trainer(pair, tokenizer, tmp_path, cfg)
    batch = PadCollator(0)([
        {"input_ids": [1, 5, 6, 7, 8, 9], "labels": [-100, -100, 6, 7, 8, 9]},
        {"input_ids": [1, 10, 11, 12], "labels": [-100, -100, -100, 12]},
    ])
    loss = trainer.compute_loss(draft, batch)
    with torch.no_grad():
        t_logits = target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        s_logits = draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    values = [
        hand_divergence(t_logits[b, t], s_logits[b, t], kind, 0.3, 1.7)
        for b in range(2) for t in range(batch["input_ids"].shape[1] - 1) if batch["labels"][b, t + 1] != -100
    ]
    assert len(values) == 5  # 4 labelled tokens in row 0, 1 in row 1; never a pad or prompt position
    assert loss.item() == pytest.approx(sum(values) / len(values), rel=1e-3)  # float32 vs float64 (near-uniform)


def test_fused_and_plain_losses_have_the_same_gradients(pair, tokenizer, tmp_path):
    draft = pair[1]
    batch = PadCollator(0)([{"input_ids": [1, 5, 6, 7, 8], "labels": [-100, -100, 6, 7, 8]}])
    grads = []
    for fused in (False, True):
        trainer = make_trainer(pair, tokenizer, tmp_path, DistillSpecConfig(divergence="jsd", use_fused_kernel=fused))
        draft.zero_grad()
        trainer.compute_loss(draft, batch).backward()
        grads.append([p.grad.clone() for p in draft.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_fused_kernel_is_used_wherever_it_applies(pair, tokenizer, tmp_path):
    assert make_trainer(pair, tokenizer, tmp_path).use_fused_kernel is True  # unset: on for plain LM heads
    assert make_trainer(pair, tokenizer, tmp_path, DistillSpecConfig(use_fused_kernel=False)).use_fused_kernel is False


def test_fused_kernel_steps_aside_for_a_soft_capped_head_unless_required(pair, tokenizer, tmp_path):
    target, draft = copy.deepcopy(pair[0]), pair[1]
    target.config.final_logit_softcapping = 30.0  # Gemma-2 style: logits are not hidden @ LM head
    assert make_trainer((target, draft), tokenizer, tmp_path).use_fused_kernel is False
    with pytest.raises(ConfigError, match=r"the target also applies final_logit_softcapping=30.0: set use_fused_kernel=false"):
        make_trainer((target, draft), tokenizer, tmp_path, DistillSpecConfig(use_fused_kernel=True))


@pytest.mark.parametrize("fused", [False, True])
def test_logits_vocab_draft_is_the_divergence_between_the_distributions_over_the_drafts_rows(pair, tokenizer, tmp_path,
                                                                                            fused):
    target, draft = pair
    draft = copy.deepcopy(draft)
    rows = [3, 5, 6, 7, 9, 40]
    draft.config.draft_vocab = rows
    cfg = DistillSpecConfig(divergence="forward_kl", logits_vocab="draft", use_fused_kernel=fused)
    trainer = make_trainer((target, draft), tokenizer, tmp_path, cfg)
    batch = PadCollator(0)([{"input_ids": [1, 5, 6, 7, 8, 9], "labels": [-100, -100, 6, 7, 8, 9]}])
    loss = trainer.compute_loss(draft, batch)
    with torch.no_grad():
        t_logits = target(input_ids=batch["input_ids"]).logits[0]  # [T, V]
        s_logits = draft(input_ids=batch["input_ids"]).logits[0]
    values = [hand_divergence(t_logits[t, rows], s_logits[t, rows], "forward_kl", 0.5, 1.0) for t in range(1, 5)]
    assert loss.item() == pytest.approx(sum(values) / 4, rel=1e-4)
    full = make_trainer((target, draft), tokenizer, tmp_path, DistillSpecConfig(use_fused_kernel=fused))
    assert full.compute_loss(draft, batch).item() != pytest.approx(loss.item(), rel=1e-2)  # the default: every token
    draft.config.draft_vocab = None
    with pytest.raises(ConfigError, match="proposes every token.*logits_vocab=full"):
        make_trainer((target, draft), tokenizer, tmp_path, cfg)


def cached_batch(pair, tokenizer, tmp_path, rows: list[dict], dtype: str = "float32") -> dict[str, torch.Tensor]:
    """``rows`` collated as ``features=offline`` training sees them: through the recipe's cache of the target's
    final-normed last hidden state."""
    cfg = DistillSpecConfig(features="offline", feature_cache_dir=str(tmp_path / "cache"), feature_cache_dtype=dtype)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    train, _, collator = DistillSpecTrainer.prepare_datasets({"target": pair[0]}, cfg, datasets.Dataset.from_list(rows),
                                                             None, tokenizer, args)
    assert train.layers == (-1,)
    return collator([train[i] for i in range(len(train))])


@pytest.mark.parametrize("fused", [False, True])
def test_offline_features_give_the_online_loss_and_gradients_without_the_targets_layers(pair, tokenizer, tmp_path,
                                                                                       fused):
    target, draft = pair
    rows = [{"input_ids": [1, 5, 6, 7, 8, 9], "labels": [-100, -100, 6, 7, 8, 9]},
            {"input_ids": [1, 10, 11, 12], "labels": [-100, -100, -100, 12]}]
    plain = PadCollator(0)(rows)
    cached = cached_batch(pair, tokenizer, tmp_path, rows)
    assert cached["feat_-1"].shape == (2, 6, target.config.hidden_size)
    results = {}
    for features, batch in (("online", plain), ("offline", cached)):
        cfg = DistillSpecConfig(divergence="jsd", features=features, use_fused_kernel=fused)
        trainer = make_trainer(pair, tokenizer, tmp_path, cfg)
        draft.zero_grad()
        with target_refused(target) if features == "offline" else contextlib.nullcontext():
            loss = trainer.compute_loss(draft, batch)
        loss.backward()
        results[features] = (loss.item(), [p.grad.clone() for p in draft.parameters()])
    assert results["offline"][0] == pytest.approx(results["online"][0], rel=1e-5)
    for a, b in zip(results["online"][1], results["offline"][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    offline = make_trainer(pair, tokenizer, tmp_path, DistillSpecConfig(features="offline", use_fused_kernel=fused))
    with pytest.raises(ConfigError, match="no cached features.*prepare_datasets.*features=online"):
        offline.compute_loss(draft, plain)


def test_offline_features_are_refused_where_the_lm_head_is_not_the_whole_logit(pair, tokenizer, tmp_path):
    target = copy.deepcopy(pair[0])
    target.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match="final_logit_softcapping=30.0: use features=online"):
        make_trainer((target, pair[1]), tokenizer, tmp_path, DistillSpecConfig(features="offline"))


def test_token_signal_is_the_cross_entropy_over_the_drafts_vocabulary_without_the_target(pair, tokenizer, tmp_path):
    target, draft = pair
    draft = copy.deepcopy(draft)
    draft.config.draft_vocab = [3, 5, 6, 7, 9, 40]  # the tokens it proposes (the zoo build writes this); 8 is not one
    trainer = make_trainer((target, draft), tokenizer, tmp_path, DistillSpecConfig(target_signal="tokens"))
    assert trainer.use_fused_kernel is False
    batch = PadCollator(0)([
        {"input_ids": [1, 5, 6, 7, 8, 9], "labels": [-100, -100, 6, 7, 8, 9]},
        {"input_ids": [1, 10, 11, 40], "labels": [-100, -100, -100, 40]},
    ])
    with target_refused(target):
        total, _ = trainer.loss_sum(draft, batch)
    with torch.no_grad():
        logits = draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    rows = [3, 5, 6, 7, 9, 40]
    hand = 0.0
    for b, t in [(0, 1), (0, 2), (0, 4), (1, 2)]:  # labels 6, 7, 9 and 40; label 8 (position (0, 3)) has no row
        logp = torch.log_softmax(logits[b, t, rows].double(), -1)
        hand -= float(logp[rows.index(int(batch["input_ids"][b, t + 1]))])
    assert total.item() == pytest.approx(hand, rel=1e-4)


def test_token_signal_training_raises_greedy_agreement_on_the_answers(pair, tokenizer, tmp_path):
    target, draft = pair
    rows = chat_rows(tokenizer, 8)
    with torch.no_grad():  # the target's own greedy answers as the fixed data (what `draftsmith data generate` writes)
        for row in rows:
            prompt = [i for i, lab in zip(row["input_ids"], row["labels"]) if lab == -100]
            out = target.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0)
            answer = out[0, len(prompt):].tolist()
            row.update(input_ids=prompt + answer, labels=[-100] * len(prompt) + answer,
                       attention_mask=[1] * (len(prompt) + len(answer)))
    cfg = DistillSpecConfig(target_signal="tokens", data_mode="fixed")
    trainer = make_trainer(pair, tokenizer, tmp_path, cfg, train_rows=rows, eval_rows=rows, max_steps=40,
                           learning_rate=3e-3, lr_scheduler_type="constant")
    before = trainer.evaluate()["eval_greedy_acceptance"]
    trainer.train()
    after = trainer.evaluate()["eval_greedy_acceptance"]
    assert after > before + 0.3 and after > 0.8


def test_draft_vocab_answers_refits_the_vocabulary_to_the_training_answers(pair, tokenizer, tmp_path):
    target, draft = pair
    draft = copy.deepcopy(draft)
    rows = chat_rows(tokenizer, 8)
    seen = Counter(t for r in rows for t, lab in zip(r["input_ids"], r["labels"]) if lab != -100)
    before = [t for t in range(4, 128) if t not in seen][:20]  # none of the answer tokens
    draft.config.draft_vocab = before
    cfg = DistillSpecConfig(target_signal="tokens", data_mode="fixed", draft_vocab="answers")
    trainer = make_trainer((target, draft), tokenizer, tmp_path, cfg, train_rows=rows, eval_rows=rows)
    vocab = draft.config.draft_vocab  # what the artefact's draft carries to the proposer
    assert len(vocab) == 20 and trainer.draft_ids.tolist() == vocab  # the same size: the same cost per draft step
    assert {t for t, n in seen.items() if n >= 2} <= set(vocab) and set(tokenizer.all_special_ids) <= set(vocab)
    record = trainer.manifest_training()
    assert record["draft_vocab_heldout_coverage_before"] == 0.0 and record["draft_vocab_heldout_coverage"] > 0.5
    assert record["draft_vocab"] == "answers" and record["draft_vocab_replaced"] == len(set(vocab) - set(before)) > 0
    kept = make_trainer((target, copy.deepcopy(draft)), tokenizer, tmp_path, DistillSpecConfig(target_signal="tokens"),
                        train_rows=rows)
    assert kept.draft_ids.tolist() == vocab and "draft_vocab" not in kept.manifest_training()  # keep: untouched
    full = copy.deepcopy(draft)
    full.config.draft_vocab = None
    with pytest.raises(ConfigError, match="whole vocabulary.*draft_vocab=keep"):
        make_trainer((target, full), tokenizer, tmp_path, cfg, train_rows=rows)


def test_proposal_logits_give_the_distribution_the_draft_proposer_samples():
    """A draft with a reduced vocabulary proposes from its softmax over those tokens, renormalised (zero elsewhere):
    on a hand-made case where that distribution is the target's, the TVD is 0, not the full softmax's 0.5."""
    from draftsmith.inference.proposers.draft_model import scatter_rows
    from draftsmith.trainers.logits import proposal_logits
    from draftsmith.trainers.losses import divergence_per_token

    rows = torch.tensor([0, 1])
    student = torch.zeros(1, 4)  # uniform over 4 tokens; over its vocabulary {0, 1}: 1/2, 1/2
    teacher = torch.tensor([[0.0, 0.0, -1e9, -1e9]])  # the target: 1/2, 1/2, 0, 0
    proposed = proposal_logits(student, rows)
    assert torch.equal(proposed.softmax(-1)[0], scatter_rows(student[0, rows].softmax(-1), rows, 4))  # the proposer's q
    assert divergence_per_token(proposed, teacher, "tvd").item() == pytest.approx(0.0, abs=1e-7)
    assert divergence_per_token(student, teacher, "tvd").item() == pytest.approx(0.5)  # the full softmax's
    assert proposal_logits(student, None) is student


def test_evaluation_tvd_and_acceptance_are_of_the_distribution_the_proposer_samples(pair, tokenizer, tmp_path):
    target, draft = pair
    draft = copy.deepcopy(draft)
    vocab = [2, 3, 5, 6, 7, 9, 40, 97]
    draft.config.draft_vocab = vocab  # the proposer drafts among these only, renormalised
    rows = chat_rows(tokenizer, 5)
    metrics = make_trainer((target, draft), tokenizer, tmp_path, DistillSpecConfig(), eval_rows=rows).evaluate()
    batch = PadCollator(0)(rows)
    with torch.no_grad():
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
        p = torch.softmax(target(**inputs).logits[:, :-1], -1)  # [B, T-1, V] the target, every token
        s = draft(**inputs).logits[:, :-1]
    q = torch.zeros_like(p)
    q[..., vocab] = torch.softmax(s[..., vocab], -1)  # the draft's proposal distribution
    mask = response_mask(batch["labels"])
    tvd = (0.5 * (p - q).abs().sum(-1))[mask].mean().item()
    full = (0.5 * (p - torch.softmax(s, -1)).abs().sum(-1))[mask].mean().item()
    assert metrics["eval_tvd"] == pytest.approx(tvd, rel=1e-4) and abs(tvd - full) > 1e-3
    assert metrics["eval_estimated_acceptance"] == pytest.approx(1 - tvd, rel=1e-4)


def test_draft_labels_and_argmax_use_the_drafts_vocabulary():
    rows = torch.tensor([2, 5, 7])
    assert draft_labels(torch.tensor([5, 3, 7, 2]), rows, 10).tolist() == [1, -100, 2, 0]
    logits = torch.tensor([[0.0, 9.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]])  # token 1 wins overall, 5 in rows
    assert draft_argmax(logits, rows).tolist() == [5] and draft_argmax(logits, None).tolist() == [1]


def test_loss_is_zero_when_the_draft_is_the_target(pair, tokenizer, tmp_path):
    target = pair[0]
    twin = copy.deepcopy(target)
    trainer = make_trainer((target, twin), tokenizer, tmp_path, DistillSpecConfig(divergence="tvd"))
    batch = PadCollator(0)([{"input_ids": [1, 5, 6, 7], "labels": [-100, 5, 6, 7]}])
    assert trainer.compute_loss(twin, batch).item() == pytest.approx(0.0, abs=1e-6)


def test_training_moves_only_the_draft_and_lowers_the_loss(pair, tokenizer, tmp_path):
    target, draft = pair
    before_t = [p.detach().clone() for p in target.parameters()]
    before_d = [p.detach().clone() for p in draft.parameters()]
    rows = chat_rows(tokenizer, 8)
    trainer = make_trainer(pair, tokenizer, tmp_path, DistillSpecConfig(divergence="forward_kl"), rows,
                           max_steps=10, learning_rate=3e-2, per_device_train_batch_size=8, logging_steps=1)
    batch = PadCollator(0)(rows)
    with torch.no_grad():
        start = trainer.compute_loss(draft, batch).item()
    trainer.train()
    with torch.no_grad():
        end = trainer.compute_loss(draft.eval(), batch).item()
    assert end < 0.75 * start
    assert all(torch.equal(a, b) for a, b in zip(before_t, target.parameters()))
    assert not any(p.requires_grad for p in target.parameters()) and not target.training
    assert any(not torch.equal(a, b) for a, b in zip(before_d, draft.parameters()))
    labelled = sum(int((torch.tensor(r["labels"][1:]) != -100).sum()) for r in rows)
    assert trainer.trained_tokens == 10 * labelled  # every step sees all 8 rows


# ------------------------------------------------------------------------------------------------ data modes


@pytest.mark.parametrize("source", ["onpolicy", "target"])
def test_generated_batches_carry_labels_on_generated_tokens(pair, tokenizer, tmp_path, source):
    target, draft = pair
    cfg = DistillSpecConfig(data_mode=source, max_new_tokens=6, generation_temperature=0.0)
    trainer = make_trainer(pair, tokenizer, tmp_path, cfg)
    rows = chat_rows(tokenizer, 3)
    batch = PadCollator(0)(rows)
    out = trainer.generate_batch(draft, batch, source)
    generator = draft if source == "onpolicy" else target
    prompts = split_prompts(batch["input_ids"], batch["labels"], batch["attention_mask"], cfg.prompt_tokens)
    for i, prompt in enumerate(prompts):
        n = int(out["attention_mask"][i].sum())
        ids, labels = out["input_ids"][i, :n].tolist(), out["labels"][i, :n].tolist()
        assert ids[: len(prompt)] == prompt
        assert labels[: len(prompt)] == [-100] * len(prompt)
        completion = ids[len(prompt):]
        assert 1 <= len(completion) <= 6 and labels[len(prompt):] == completion
        with torch.no_grad():  # greedy generations are the generator's own greedy continuation
            ref = generator.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0,
                                     eos_token_id=2)[0, len(prompt):].tolist()
        assert completion == cut_at_eos(ref, [2])
        assert all(label == -100 for label in out["labels"][i, n:].tolist())


def test_sampled_generations_respect_top_p_one_token(pair, tokenizer, tmp_path):
    """top_p -> 0 keeps only the most likely token: sampling then equals greedy decoding."""
    draft = pair[1]
    trainer = make_trainer(pair, tokenizer, tmp_path, DistillSpecConfig(max_new_tokens=5, generation_top_p=1e-6))
    batch = PadCollator(0)(chat_rows(tokenizer, 2))
    sampled = trainer.generate_batch(draft, batch, "onpolicy")
    trainer.method_config.generation_temperature = 0.0
    greedy = trainer.generate_batch(draft, batch, "onpolicy")
    assert torch.equal(sampled["input_ids"], greedy["input_ids"])


@pytest.mark.parametrize("mode, lmbda, expected", [("fixed", 0.5, {"fixed"}), ("onpolicy", 0.5, {"onpolicy"}),
                                                   ("target", 0.5, {"target"}), ("mixed", 0.0, {"fixed"}),
                                                   ("mixed", 1.0, {"onpolicy"})])
def test_batch_source_by_mode(pair, tokenizer, tmp_path, mode, lmbda, expected):
    trainer = make_trainer(pair, tokenizer, tmp_path, DistillSpecConfig(data_mode=mode, lmbda=lmbda))
    seen = set()
    for step in range(20):
        trainer.state.global_step = step
        seen.add(trainer.batch_source())
    assert seen == expected


def test_mixed_mode_fraction_and_determinism(pair, tokenizer, tmp_path):
    cfg = DistillSpecConfig(data_mode="mixed", lmbda=0.3, mixed_with="target")

    def draws(trainer):
        out = []
        for step in range(400):
            trainer.state.global_step = step
            out.append(trainer.batch_source())
        return out

    a = draws(make_trainer(pair, tokenizer, tmp_path, cfg))
    b = draws(make_trainer(pair, tokenizer, tmp_path, cfg))
    assert a == b  # same seed and steps -> same choices (every rank agrees; a resumed run repeats them)
    assert set(a) == {"onpolicy", "target"}
    assert 0.22 < a.count("onpolicy") / len(a) < 0.38


def test_onpolicy_training_runs_and_counts_generated_tokens(pair, tokenizer, tmp_path):
    cfg = DistillSpecConfig(data_mode="onpolicy", max_new_tokens=4)
    trainer = make_trainer(pair, tokenizer, tmp_path, cfg, chat_rows(tokenizer, 8), max_steps=2, logging_steps=1)
    trainer.train()
    # labels are exactly the generated tokens: 1..4 per row, 4 rows a step
    assert 2 * 4 <= trainer.trained_tokens <= 2 * 4 * 4
    assert [h["trained_tokens"] for h in trainer.state.log_history if "loss" in h][-1] == trainer.trained_tokens


# ------------------------------------------------------------------------------------------- acceptance metric




def test_evaluation_logs_acceptance_beside_eval_loss(pair, tokenizer, tmp_path):
    target, draft = pair
    rows = chat_rows(tokenizer, 6)
    cfg = DistillSpecConfig(divergence="tvd", draft_length=3)
    trainer = make_trainer(pair, tokenizer, tmp_path, cfg, rows, rows[:5], max_steps=2, eval_strategy="steps",
                           eval_steps=2, report_to=["tensorboard"], logging_steps=1)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "eval_loss" in h][-1]
    # by hand: mean TVD over the response positions of the held-out rows
    batch = PadCollator(0)(rows[:5])
    with torch.no_grad():
        t = torch.softmax(target(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits, -1)
        s = torch.softmax(draft(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits, -1)
    mask = response_mask(batch["labels"])
    tvd = (0.5 * (t[:, :-1] - s[:, :-1]).abs().sum(-1))[mask]
    agree = (t[:, :-1].argmax(-1) == s[:, :-1].argmax(-1))[mask].double().mean().item()
    assert logged["eval_tvd"] == pytest.approx(tvd.mean().item(), rel=1e-4)
    assert logged["eval_loss"] == pytest.approx(logged["eval_tvd"], rel=1e-3)  # tvd is also the loss here
    assert logged["eval_estimated_acceptance"] == pytest.approx(1 - logged["eval_tvd"])
    assert logged["eval_predicted_tau"] == pytest.approx(expected_tau(logged["eval_estimated_acceptance"], 3))
    assert logged["eval_greedy_acceptance"] == pytest.approx(agree)
    assert logged["eval_tokens"] == int(mask.sum())
    assert math.isfinite(logged["eval_predicted_tau_greedy"])
    # and in TensorBoard, beside the loss
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [p for p in (tmp_path / "runs").rglob("events.out.tfevents*")]
    assert events
    tags = set()
    for e in events:
        acc = EventAccumulator(str(e.parent))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"eval/loss", "eval/estimated_acceptance", "eval/predicted_tau", "train/loss"} <= tags


def test_eval_on_target_responses_measures_the_targets_greedy_answers(pair, tokenizer, tmp_path):
    rows = chat_rows(tokenizer, 4)
    cfg = DistillSpecConfig(eval_responses="target", max_new_tokens=5, generation_temperature=1.0)
    trainer = make_trainer(pair, tokenizer, tmp_path, cfg, eval_rows=rows)
    on_target = trainer.evaluate()
    # the same numbers as evaluating, on the dataset setting, rows that hold the target's greedy answers
    generated = trainer.generate_batch(pair[1], PadCollator(0)(rows), "target", greedy=True)
    regenerated = [{k: generated[k][i][: int(generated["attention_mask"][i].sum())].tolist() for k in generated}
                   for i in range(len(rows))]
    trainer.method_config = DistillSpecConfig(eval_responses="dataset")
    reference = trainer.evaluate(eval_dataset=datasets.Dataset.from_list(regenerated))
    for key in ("eval_loss", "eval_tvd", "eval_greedy_acceptance", "eval_tokens"):
        assert on_target[key] == pytest.approx(reference[key], rel=1e-5)
    assert on_target["eval_tokens"] <= 4 * 5


def test_triton_backend_without_cuda_fails_when_the_config_is_checked(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("checks the message on machines without CUDA")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="kernel_backend=triton.*CUDA"):
        DistillSpecConfig(kernel_backend="triton")
    DistillSpecConfig(kernel_backend="triton", use_fused_kernel=False)  # the kernel is off: nothing to check


def test_a_draft_with_another_vocabulary_is_refused(tokenizer, tmp_path):
    from draftsmith.common.errors import TokenizerMismatchError
    from draftsmith.data.tiny_models import random_model

    target = random_model("llama", seed=0, layers=1)
    draft = random_model("llama", seed=1, layers=1, vocab_size=160)
    with pytest.raises(TokenizerMismatchError, match="vocabulary of 160 tokens but the target has 128"):
        make_trainer((target, draft), tokenizer, tmp_path)


@pytest.mark.parametrize("config", [dict(divergence="jsd"), dict(divergence="tvd", logits_vocab="draft"),
                                    dict(target_signal="tokens")])
def test_sharded_heads_are_called_chunk_by_chunk_with_the_same_loss_and_gradients(pair, tokenizer, tmp_path,
                                                                                     monkeypatch, config):
    """Under ZeRO-3 / FSDP (the LM heads readable only inside their own calls) the divergence and the sequence-level
    KD run through checkpointed calls of the heads: the unsharded chunked loss, value and gradients."""
    target, draft = pair
    draft = copy.deepcopy(draft)
    draft.config.draft_vocab = list(range(3, 100))
    batch = PadCollator(0)([{"input_ids": [1, 5, 6, 7, 8, 9], "labels": [-100, -100, 6, 7, 8, 9]},
                            {"input_ids": [1, 10, 11, 12], "labels": [-100, -100, -100, 12]}])
    results = []
    for sharded in (False, True):
        trainer = make_trainer((target, draft), tokenizer, tmp_path, DistillSpecConfig(**config))
        monkeypatch.setattr(trainer, "sharded", lambda sharded=sharded: sharded)
        draft.zero_grad()
        loss = trainer.compute_loss(draft, batch)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in draft.parameters()]))
    (loss, grads), (sharded_loss, sharded_grads) = results
    torch.testing.assert_close(sharded_loss, loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(sharded_grads, grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_chunked_evaluation_equals_the_full_logits_one(pair, tokenizer, tmp_path):
    """The held-out loss, TVD and greedy agreement read chunk by chunk from the hidden states and LM heads equal the
    full-logits evaluation (the one a model with post-processed logits still runs)."""
    target, draft = pair
    draft = copy.deepcopy(draft)
    draft.config.draft_vocab = [2, 3, 5, 6, 7, 9, 40, 97]
    rows = chat_rows(tokenizer, 5)
    cfg = DistillSpecConfig(divergence="jsd", beta=0.3, temperature=1.5)
    chunked = make_trainer((target, draft), tokenizer, tmp_path, cfg, eval_rows=rows)
    full = make_trainer((target, draft), tokenizer, tmp_path, cfg, eval_rows=rows)
    full.heads_are_logits = False
    assert chunked.heads_are_logits
    a, b = chunked.evaluate(), full.evaluate()
    for key in ("eval_loss", "eval_tvd", "eval_greedy_acceptance", "eval_tokens"):
        assert a[key] == pytest.approx(b[key], rel=1e-5), key


@pytest.mark.parametrize("order", ["shard", "random"])
def test_cached_features_train_in_shard_order_unless_asked_for_the_uniform_one(pair, tokenizer, tmp_path, order):
    from draftsmith.data.feature_order import ShardOrderSampler

    rows = [{"input_ids": [1, 5, 6, 7, 8, 9], "labels": [-100, -100, 6, 7, 8, 9]}] * 6
    cfg = DistillSpecConfig(features="offline", feature_cache_dir=str(tmp_path / "cache"), feature_order=order)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    train, _, _ = DistillSpecTrainer.prepare_datasets({"target": pair[0]}, cfg, datasets.Dataset.from_list(rows), None,
                                                      tokenizer, args)
    trainer = make_trainer(pair, tokenizer, tmp_path, cfg)
    sampler = trainer._get_train_sampler(train)
    assert isinstance(sampler, ShardOrderSampler) == (order == "shard")
    if order == "shard":  # each step's rows (batch x accumulation x processes) sorted by length
        trainer.args.gradient_accumulation_steps = 3
        assert trainer._get_train_sampler(train).window == 3 * trainer.args.per_device_train_batch_size
