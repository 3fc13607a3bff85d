"""Medusa-1: the heads, the loss's targets, the config, and decoding with heads token-identical to AR
(the recipe end to end: tests/launch/test_recipe_medusa.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.trees import chain_choices, tree_from_choices
from draftsmith.inference.drafters.medusa import MedusaHeads
from draftsmith.inference.proposers.medusa import MedusaProposer
from draftsmith.trainers.losses import LinearHead
from draftsmith.trainers.medusa.trainer import (
    MedusaConfig,
    build_heads,
    head_targets,
    heads_loss,
    rank_of_true,
    target_agreement,
    target_loss,
)


def test_fresh_heads_start_as_the_targets_lm_head():
    target = random_model("llama", seed=0, layers=2)
    heads = MedusaHeads(hidden=32, vocab=128, heads=3)
    h = torch.randn(5, 32)
    lm_head = target.get_output_embeddings()
    assert torch.equal(heads(h, lm_head), lm_head(h).expand(3, 5, 128))
    own = MedusaHeads(hidden=32, vocab=128, heads=2, shared_lm_head=False)
    own.init_lm_heads(lm_head)
    assert torch.allclose(own(h), lm_head(h).expand(2, 5, 128))
    with pytest.raises(ValueError, match="lm_head"):
        heads(h)


def test_head_k_learns_the_token_k_plus_2_ahead():
    labels = torch.tensor([[-100, -100, -100, 6, 7, 8]])  # a 3-token prompt, then the response 6 7 8
    positions, tokens = head_targets(labels, 0)  # position t -> x_{t+2}
    assert positions.tolist() == [[False, True, True, True]]
    assert tokens[positions].tolist() == [6, 7, 8]
    positions, tokens = head_targets(labels, 2)  # position t -> x_{t+4}
    assert tokens[positions].tolist() == [7, 8] and positions.tolist() == [[True, True]]


def test_rank_of_true_counts_each_rank():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0], [5.0, 0.0, 1.0, 2.0]])
    assert rank_of_true(logits, torch.tensor([2, 2]), ranks=3).tolist() == [0.0, 1.0, 1.0]  # ranks 1 and 2


def _full_heads_loss(heads, hidden, labels, lm_head, decay):
    """Medusa eq. 2 over the full [N, V] logits of every head (the unchunked definition)."""
    total = torch.zeros(())
    for k in range(heads.num_heads):
        positions, tokens = head_targets(labels, k)
        logits = heads.head_logits(hidden[:, : positions.shape[1]][positions], k, lm_head).float()
        total = total + decay ** k * F.cross_entropy(logits, tokens[positions], reduction="sum")
    return total


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("called", [False, True])
def test_heads_loss_is_the_full_logits_cross_entropy_in_value_and_gradients(shared, called):
    """Chunked through the LM head's weight, or (``called``: a sharded head) through checkpointed calls of it."""
    target = random_model("llama", seed=0, layers=2)
    lm_head = target.get_output_embeddings()
    heads = MedusaHeads(hidden=32, vocab=128, heads=3, shared_lm_head=shared)
    heads.init_lm_heads(lm_head)
    torch.manual_seed(1)
    for block in heads.blocks:
        torch.nn.init.normal_(block[0].linear.weight, std=0.3)
    hidden = torch.randn(2, 9, 32, requires_grad=True)
    labels = torch.randint(3, 128, (2, 9))
    labels[:, :3] = -100
    labels[1, 7:] = -100
    got = heads_loss(heads, hidden, labels, lm_head, 0.8, called=called)
    want = _full_heads_loss(heads, hidden, labels, lm_head, 0.8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    trained = [hidden] + [p for p in heads.parameters()]
    for g, w in zip(torch.autograd.grad(got, trained), torch.autograd.grad(want, trained)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_config_is_validated():
    with pytest.raises(ConfigError, match="data_mode"):
        MedusaConfig(data_mode="onpolicy")
    with pytest.raises(ConfigError, match="loss_decay"):
        MedusaConfig(loss_decay=0.0)


def test_medusa2_config():
    with pytest.raises(ConfigError, match="variant"):
        MedusaConfig(variant="medusa3")
    with pytest.raises(ConfigError, match="heads_weight"):
        MedusaConfig(variant="medusa2", heads_weight=0.0)
    with pytest.raises(ConfigError, match="heads_warmup_ratio"):
        MedusaConfig(variant="medusa2", heads_warmup_ratio=1.0)


def test_medusa2_refuses_a_lora_wrapped_lm_head_and_logit_post_processing():
    target = random_model("llama", seed=0, layers=2).requires_grad_(False)
    with pytest.raises(ConfigError, match="lora_target_modules"):
        build_heads({"target": target}, MedusaConfig(variant="medusa2", heads=2, lora_r=4,
                                                     lora_target_modules="q_proj,lm_head"))
    target.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match="final_logit_softcapping=30.0"):
        build_heads({"target": target}, MedusaConfig(variant="medusa2", heads=2, lora_r=4))


def test_medusa2_module_adapts_a_copy_and_starts_as_the_target():
    target = random_model("llama", seed=0, layers=2).requires_grad_(False)  # as the recipe loads it
    module = build_heads({"target": target}, MedusaConfig(variant="medusa2", heads=2, lora_r=4))
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("heads.") for n in trainable)
    assert not any(p.requires_grad for p in target.parameters()) and not any("lora" in n for n, _ in target.named_parameters())
    ids = torch.randint(3, 100, (1, 9))
    assert torch.allclose(module.target(input_ids=ids).logits, target(input_ids=ids).logits, atol=1e-6)  # B = 0
    assert set(module.artefact_tensors(module.state_dict())) == set(module.heads.state_dict())


def test_medusa2_default_loss_is_self_distillation_the_kl_replacing_the_lm_loss():
    """Medusa sec. 2.3.2 (and the reference's medusa_self_distillation): the target's loss is KL(original || adapted)
    in place of its CE, so the default joint loss is KL + lambda_0 * heads loss; lm_weight=1 keeps the earlier sum."""
    cfg = MedusaConfig(variant="medusa2", heads=2, lora_r=4)
    assert cfg.loss_weights == (0.0, 1.0, 0.2)
    target = random_model("llama", seed=0, layers=2).requires_grad_(False)
    module = build_heads({"target": target}, cfg)
    torch.manual_seed(0)
    for name, p in module.target.named_parameters():
        if "lora_B" in name:  # move the adapter off the identity, so that the KL is not zero
            torch.nn.init.normal_(p, std=0.05)
    ids = torch.randint(3, 100, (2, 10))
    mask = torch.ones_like(ids)
    labels = ids.clone()
    labels[:, :4] = -100  # a 4-token prompt
    lm_head = target.get_output_embeddings()
    with torch.no_grad():
        original_out = target(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        original_hidden = original_out.hidden_states[-1]
        adapted_logits = module.target(input_ids=ids, attention_mask=mask).logits
        hidden = module.adapted(ids, mask, grad=False)
        rows = labels[:, 1:] != -100
        adapted, reference = adapted_logits[:, :-1][rows].float(), original_out.logits[:, :-1][rows].float()
        ce = F.cross_entropy(adapted, labels[:, 1:][rows], reduction="sum")  # the full [N, V] definitions
        kl = (reference.softmax(-1) * (reference.log_softmax(-1) - adapted.log_softmax(-1))).sum()
        agree = (adapted.argmax(-1) == reference.argmax(-1)).sum().float()
        heads = heads_loss(module.heads, hidden, labels, lm_head, cfg.loss_decay)
        total = module(ids, mask, labels, lm_head, cfg.loss_decay, original_hidden, cfg.loss_weights, joint=True)
        old = module(ids, mask, labels, lm_head, cfg.loss_decay, original_hidden, (1.0, 1.0, 0.2), joint=True)
        own, original = LinearHead(module.target.get_output_embeddings()), LinearHead(lm_head)
        got_kl, got_agree = target_agreement(labels, hidden, own, original_hidden, original)
        lm_only = target_loss(labels, hidden, own, original_hidden, original, 1.0, 0.0)
    assert float(kl) > 1e-4 and float(ce) > 1.0
    assert torch.allclose(total, kl + 0.2 * heads, rtol=1e-5)
    assert torch.allclose(old, ce + kl + 0.2 * heads, rtol=1e-5)
    assert torch.allclose(lm_only, ce, rtol=1e-5) and torch.allclose(got_kl, kl, rtol=1e-5)
    assert got_agree == agree
    with pytest.raises(ConfigError, match="kl_weight=1"):
        MedusaConfig(variant="medusa2", kl_weight=0.0)


def test_medusa2_target_terms_have_the_full_logits_gradients():
    """One chunked pass of ``w_lm CE + w_kl KL`` gives the gradients of the two full-logit terms (the adapted
    target's last hidden state is what trains)."""
    target = random_model("llama", seed=0, layers=2)
    lm_head = target.get_output_embeddings()
    hidden = torch.randn(2, 8, 32, requires_grad=True)
    original_hidden = torch.randn(2, 8, 32)
    labels = torch.randint(3, 128, (2, 8))
    labels[:, :3] = -100
    got = target_loss(labels, hidden, LinearHead(lm_head), original_hidden, LinearHead(lm_head), 0.7, 1.3)
    rows = labels[:, 1:] != -100
    adapted, reference = lm_head(hidden[:, :-1][rows]), lm_head(original_hidden[:, :-1][rows]).detach()
    want = 0.7 * F.cross_entropy(adapted, labels[:, 1:][rows], reduction="sum") + 1.3 * (
        reference.softmax(-1) * (reference.log_softmax(-1) - adapted.log_softmax(-1))).sum()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    params = [hidden, lm_head.weight]
    for g, w in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_proposer_refuses_a_tree_deeper_than_its_heads():
    target = random_model("llama", seed=0, layers=2)
    with pytest.raises(Exception, match="deep"):
        MedusaProposer(MedusaHeads(32, 128, heads=2), target.get_output_embeddings(),
                       tree_from_choices(chain_choices(3)))


@pytest.mark.parametrize("choices", [chain_choices(3), [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]])
def test_untrained_heads_decode_token_identically(choices):
    torch.manual_seed(0)
    target = random_model("llama", seed=0, layers=2)
    heads = MedusaHeads(hidden=32, vocab=128, heads=3)
    for block in heads.blocks:  # random blocks: many rejections
        torch.nn.init.normal_(block[0].linear.weight, std=0.5)
    adapter = ModelAdapter(target)
    for seed in range(3):
        prompt = torch.randint(3, 128, (10,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
        prop = MedusaProposer(heads, target.get_output_embeddings(), tree_from_choices(choices))
        sp = generate(adapter, prompt, GenerationConfig(max_new_tokens=24), prop)
        assert sp.output_ids == ar.output_ids
        assert sum(sp.accept_lengths) == 24
