"""EAGLE-1: the head (the target's own layer class, cache-consistent), the loss's alignment and terms, the config,
and chain drafting token-identical to AR with a head in step with the accepted branch (the recipe end to end:
tests/launch/test_recipe_eagle.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError, UnsupportedModelError
from draftsmith.data.draft_vocab import draft_vocab_coverage
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.drafters.eagle import EagleHead
from draftsmith.inference.proposers.eagle import EagleProposer
from draftsmith.trainers.eagle.trainer import (
    EagleConfig,
    coverage_warning,
    eagle_losses,
    supervised_positions,
    target_features,
    top1_agreement,
    uniform_noise,
)
from draftsmith.trainers.losses import LinearHead


def test_head_is_the_targets_layer_class_and_its_cache_matches_a_full_forward():
    target = random_model("llama", seed=0, layers=2)
    head = EagleHead.for_target(target)
    assert type(head.layer) is type(target.model.layers[0]) and head.fc.in_features == 2 * head.fc.out_features
    assert not any(p is q for p in head.parameters() for q in target.parameters())  # the target is not in the head
    assert isinstance(head.layer.input_layernorm, torch.nn.Identity) and head.fc.bias is None  # as the engines load it
    torch.manual_seed(0)
    e, f = torch.randn(1, 9, 32), torch.randn(1, 9, 32)
    pos = torch.arange(9)[None]
    full = head(e, f, pos)
    cache = head.new_cache()
    parts = [head(e[:, a:b], f[:, a:b], pos[:, a:b], cache) for a, b in ((0, 5), (5, 6), (6, 9))]
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)
    cache.crop(5)  # a draft's entries dropped: the same positions again give the same features
    assert torch.allclose(head(e[:, 5:], f[:, 5:], pos[:, 5:], cache), full[:, 5:], atol=1e-5)


def test_gpt2_targets_are_refused():
    with pytest.raises(UnsupportedModelError, match="Llama-style"):
        EagleHead.for_target(random_model("gpt2", seed=0, layers=1))


def test_supervised_positions_and_losses():
    labels = torch.tensor([[-100, -100, 5, 6, 7, -100]])  # response 5 6 7, then padding
    assert supervised_positions(labels).tolist() == [[True, True, True, False]]  # t -> x_{t+2}
    lm_head = torch.nn.Linear(8, 11, bias=False)
    head = LinearHead(lm_head)
    f = torch.randn(4, 8)
    logits = lm_head(f).detach()
    reg, cls = eagle_losses(f, f, head)
    assert reg == 0 and torch.isclose(cls, -(logits.softmax(-1) * logits.log_softmax(-1)).sum())  # = the entropy
    reg, _ = eagle_losses(f + 3.0, f, head)
    assert torch.isclose(reg, torch.tensor(4 * 2.5))  # smooth-L1 of 3 = 3 - 0.5 per element, mean over H, sum over N
    noise = uniform_noise(torch.zeros(1000), 0.1)
    assert noise.abs().max() <= 0.1 and noise.std() > 0.04


@pytest.mark.parametrize("called", [False, True])
def test_token_loss_is_the_full_logits_cross_entropy_in_value_and_gradient(called):
    """L_cls through the target's LM head chunk by chunk (its weight, or checkpointed calls of a sharded head) equals
    ``- sum p log softmax(LMHead(f^))`` over the full [N, V] logits; only f^ trains."""
    target = random_model("llama", seed=0, layers=2)
    lm_head = target.get_output_embeddings()
    pred = torch.randn(9, 32, requires_grad=True)
    feats = torch.randn(9, 32)
    _, cls = eagle_losses(pred, feats, LinearHead(lm_head, called=called))
    p = lm_head(feats).detach().softmax(-1)
    want = -(p * lm_head(pred).log_softmax(-1)).sum()
    torch.testing.assert_close(cls, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.autograd.grad(cls, pred)[0], torch.autograd.grad(want, pred)[0], rtol=1e-5,
                               atol=1e-6)
    agree = top1_agreement(pred.detach(), feats, LinearHead(lm_head))
    assert agree == (lm_head(pred).argmax(-1) == lm_head(feats).argmax(-1)).sum()


def test_target_features_are_the_full_forwards_hidden_states_of_the_real_positions():
    """Only the layers asked for, no logits: the values of the masked transformers forward wherever a token is real
    (right padding)."""
    target = random_model("llama", seed=0, layers=4)
    ids = torch.randint(3, 100, (2, 11), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        out = target(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    feats = target_features(target, ids, (1, 3, -1))
    assert set(feats) == {1, 3, -1}
    real = mask.bool()
    for i in (1, 3, -1):
        assert torch.equal(feats[i][real], out.hidden_states[i][real]), i


def test_config_is_validated():
    with pytest.raises(ConfigError, match="variant"):
        EagleConfig(variant="eagle4")
    with pytest.raises(ConfigError, match="reg_weight"):
        EagleConfig(reg_weight=0.0, cls_weight=0.0)
    with pytest.raises(ConfigError, match="noise"):
        EagleConfig(noise=-0.1)
    with pytest.raises(ConfigError, match="layers"):
        EagleConfig(variant="eagle3", layers="1,2")
    with pytest.raises(ConfigError, match="ttt_steps"):
        EagleConfig(variant="eagle3", ttt_steps=0)


def _trained_like_head(target):
    head = EagleHead.for_target(target)
    torch.manual_seed(1)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return head


def _prefill(proposer: EagleProposer, target, seed: int) -> torch.Tensor:  # -> [8] the prompt
    """Start ``proposer`` on a random 8-token prompt with the target's features, as the decode loop's prefill does."""
    prompt = torch.randint(3, 100, (8,), generator=torch.Generator().manual_seed(seed))
    proposer.reset(prompt)
    with torch.no_grad():
        feats = target(input_ids=prompt[None, :-1], output_hidden_states=True).hidden_states[-1][0]
    proposer.prefill_hidden({-1: feats})
    return prompt


@pytest.mark.parametrize("length, tree", [(1, "chain"), (4, "chain"), (4, "dynamic")])
def test_drafting_is_token_identical_and_the_head_stays_in_step(length, tree):
    target = random_model("llama", seed=0, layers=2)
    adapter = ModelAdapter(target)
    proposer = EagleProposer(_trained_like_head(target), target.get_input_embeddings(),
                             target.get_output_embeddings(), length=length, tree=tree, depth=length, top_k=3,
                             total_tokens=10)
    for seed in range(3):
        prompt = torch.randint(3, 100, (11,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
        sp = generate(adapter, prompt, GenerationConfig(max_new_tokens=24), proposer)
        assert sp.output_ids == ar.output_ids
        assert proposer._true <= prompt.numel() + len(sp.output_ids) - 1  # never past the committed tokens
        assert max(sp.accept_lengths) <= length + 1


@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_head_cache_after_a_partial_accept_equals_a_fresh_prefill(tree):
    """After verification the head holds exactly the true features of the committed tokens: its next feature equals
    the one a fresh head computes from the target's features of the whole committed sequence."""
    target = random_model("llama", seed=0, layers=2)
    adapter = ModelAdapter(target)
    head = _trained_like_head(target)
    proposer = EagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(), length=4,
                             tree=tree, depth=4, top_k=3, total_tokens=10)
    prompt = torch.randint(3, 100, (10,), generator=torch.Generator().manual_seed(0))
    res = generate(adapter, prompt, GenerationConfig(max_new_tokens=9), proposer)
    assert any(a < 5 for a in res.accept_lengths)  # some step accepted only part of its draft
    assert proposer._cache.get_seq_length(0) == proposer._true  # the draft's own entries are gone
    seq = torch.cat([prompt, torch.tensor(res.output_ids)])
    committed = seq[: proposer._true + 1]
    with torch.no_grad():
        features = target(input_ids=committed[None, :-1], output_hidden_states=True).hidden_states[-1][0]
        fresh = head(target.get_input_embeddings()(committed[1:])[None], features[None],
                     torch.arange(committed.numel() - 1)[None])[0, -1]
    assert torch.allclose(proposer._feature, fresh, atol=1e-4)


def test_sampling_returns_the_heads_distribution_as_q():
    target = random_model("llama", seed=0, layers=2)
    proposer = EagleProposer(_trained_like_head(target), target.get_input_embeddings(),
                             target.get_output_embeddings(), length=3)
    prompt = _prefill(proposer, target, seed=0)
    draft = proposer.propose(prompt, 3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert draft.q is not None and draft.q.shape == (3, 128) and torch.allclose(draft.q.sum(-1), torch.ones(3))
    with torch.inference_mode():
        first = F.softmax(target.get_output_embeddings()(proposer._feature).float(), -1)
    assert torch.allclose(draft.q[0], first, atol=1e-5)


def test_rerank_keeps_the_best_nodes_closed_under_ancestors():
    from draftsmith.inference.core.trees import rerank

    scores = torch.tensor([-0.1, -0.5, -0.3, -0.2, -2.0, -0.35])
    parents = torch.tensor([-1, -1, 0, 0, 1, 2])
    depths = torch.tensor([1, 1, 2, 2, 2, 3])
    keep, new_parents = rerank(scores, parents, depths, 4)
    assert keep.tolist() == [0, 3, 2, 5] and new_parents.tolist() == [-1, 0, 0, 2]
    keep, _ = rerank(scores, parents, depths, 100)
    assert sorted(keep.tolist()) == list(range(6))
    with pytest.raises(ValueError, match="without its parent"):
        rerank(torch.tensor([-1.0, -0.5]), torch.tensor([-1, 0]), torch.tensor([1, 2]), 1)


@pytest.mark.parametrize("total, temperatures", [(9, None), (9, (0.5, 0.3, 0.2)), (4, None), (6, (2.0, 3.0, 4.0))])
def test_dynamic_tree_matches_a_brute_force_expansion(total, temperatures):
    """EAGLE-2's expansion and rerank, computed by the proposer in batched head forwards over the head cache with
    tree visibility, equal the same rule applied path by path with a fresh sequential head run per path: scores at
    each depth's calibrated temperature, and the top-1 chain always expanded and kept (a tree never loses to its
    own chain)."""
    import copy

    target = random_model("llama", seed=0, layers=2)
    head = _trained_like_head(target)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    k, depth = 3, 3
    temps = temperatures or (1.0,) * depth
    proposer = EagleProposer(head, embed, lm_head, tree="dynamic", depth=depth, top_k=k, total_tokens=total,
                             temperatures=temperatures)
    prompt = _prefill(proposer, target, seed=2)
    true_cache, root, p0 = copy.deepcopy(proposer._cache), proposer._feature.clone(), proposer._true

    @torch.inference_mode()
    def logprobs(path: tuple[int, ...]) -> torch.Tensor:  # the head's distribution after the path, run afresh
        cache, feature = copy.deepcopy(true_cache), root
        for i, tok in enumerate(path):
            feature = head(embed(torch.tensor([[tok]])), feature[None, None], torch.tensor([[p0 + i]]), cache)[0, -1]
        return torch.log_softmax(lm_head(feature).float() / temps[len(path)], -1)

    def children(path, score):
        top = logprobs(path).topk(k)
        return [(path + (int(t),), score + float(v)) for t, v in zip(top.indices, top.values)]

    level = children((), 0.0)
    chain = [level[0][0]]  # the top-1 chain, one path per depth
    candidates = list(level)
    for _ in range(depth - 1):
        expanded = sorted(level, key=lambda c: -c[1])[:k]
        if chain[-1] not in [p for p, _ in expanded]:
            expanded[-1] = next(c for c in level if c[0] == chain[-1])
        level = [c for path, score in expanded for c in children(path, score)]
        chain.append(next(p for p, _ in level if p[:-1] == chain[-1]))  # children come best first
        candidates += level
    rest = sorted((c for c in candidates if c[0] not in chain), key=lambda c: (-c[1], len(c[0])))
    want = (chain + [p for p, _ in rest])[:total]

    draft = proposer.propose(prompt, 100, SamplingParams(), None)
    paths = []
    for i, tok in enumerate(draft.tokens.tolist()):
        parent = int(draft.parents[i])
        paths.append((paths[parent] if parent >= 0 else ()) + (tok,))
    assert sorted(paths) == sorted(want)
    assert chain[min(depth, total) - 1] in paths  # the greedy chain to full depth (or to the tree's size)


def test_chain_logits_and_draft_index_feed_the_tree_calibration():
    target = random_model("llama", seed=0, layers=2)
    proposer = EagleProposer(_trained_like_head(target), target.get_input_embeddings(),
                             target.get_output_embeddings(), length=3)
    prompt = _prefill(proposer, target, seed=2)
    draft = proposer.propose(prompt, 100, SamplingParams(), None)
    assert proposer.last_draft_logits.shape == (3, target.config.vocab_size)
    assert draft.tokens.tolist() == proposer.last_draft_logits.argmax(-1).tolist()
    assert proposer.draft_index(torch.tensor([5, 7])).tolist() == [5, 7]  # EAGLE-1 drafts the whole vocabulary


# --------------------------------------------------------------------------------------------------- EAGLE-3


def test_draft_vocab_follows_the_contract():
    """../shared/contracts section 10: d2t int64 offsets [Vd], ids = arange + d2t strictly increasing in [0, V), t2d
    bool [V] marking exactly those ids; the most frequent answer tokens, unseen ids filled from the smallest."""
    from draftsmith.inference.drafters.eagle import draft_vocab

    counts = torch.zeros(50, dtype=torch.long)
    counts[[40, 7, 33]] = torch.tensor([9, 5, 5])
    d2t, t2d = draft_vocab(counts, 6)
    ids = torch.arange(6) + d2t
    assert d2t.dtype == torch.int64 and d2t.shape == (6,) and bool((d2t >= 0).all())
    assert ids.tolist() == [0, 1, 2, 7, 33, 40] and bool((ids[1:] > ids[:-1]).all())
    assert t2d.dtype == torch.bool and t2d.shape == (50,) and t2d.nonzero().squeeze().tolist() == ids.tolist()


def _eagle3(target, vd=96, seed=3, **eagle31):
    from draftsmith.inference.drafters.eagle import Eagle3Head, draft_vocab

    d2t, t2d = draft_vocab(torch.arange(128).flip(0), vd)
    head = Eagle3Head.for_target(target, d2t, t2d, **eagle31)
    torch.manual_seed(seed)
    for p in [*head.midlayer.parameters(), *(head.fc_norm.parameters() if head.fc_norm is not None else [])]:
        torch.nn.init.normal_(p, std=0.2)
    return head


def test_draft_vocab_coverage_counts_answer_tokens_only():
    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[[1, 2, 3]] = True
    rows = [{"input_ids": [5, 6, 1, 2, 9], "labels": [-100, -100, 1, 2, 9]},  # the prompt (5, 6) is not counted
            {"input_ids": [7, 3, 3], "labels": [-100, 3, 3]}]
    assert draft_vocab_coverage(rows, t2d) == pytest.approx(4 / 5)
    assert draft_vocab_coverage([], t2d) == 0.0
    assert coverage_warning(0.98, 8192) is None
    message = coverage_warning(0.934, 8192)  # SmolLM2's 8,192-token draft vocabulary on coding answers
    assert "93.4%" in message and "8192" in message and "raise draft_vocab_size" in message and "\n" not in message


def test_eagle3_head_shapes_and_layers():
    from draftsmith.inference.drafters.eagle import aux_layers

    assert aux_layers(30) == (2, 15, 27) and aux_layers(4) == (1, 2, 3)
    target = random_model("llama", seed=0, layers=4)
    head = _eagle3(target)
    assert head.hidden_layers == (1, 2, 3) and head.fc.weight.shape == (32, 96) and head.fc.bias is None
    assert head.midlayer.self_attn.q_proj.weight.shape[1] == 64 and head.lm_head.weight.shape == (96, 32)
    ids = torch.arange(96) + head.d2t
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[ids])  # starts as the target's rows


@pytest.mark.parametrize("eagle31", [{}, {"fc_norm": True, "norm_output": True}, {"norm_output": True},
                                     {"norm_before_residual": True}])
def test_training_time_test_step_j_sees_what_decoding_sees(eagle31):
    """The unrolled step j's logits at every anchor t equal decoding's at draft depth j+1: the head fed true inputs
    up to t, then its own outputs with the next tokens x_{t+2}, x_{t+3}, ... — with EAGLE-3.1's fc norms and normed
    feedback too."""
    from draftsmith.trainers.eagle.ttt import Eagle3TTT, shifted

    target = random_model("llama", seed=0, layers=4)
    unrolled = Eagle3TTT(_eagle3(target, **eagle31)).eval()
    head = unrolled.head
    ids = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i][:, :-1] for i in head.hidden_layers], -1)  # [1, A, 96]
        embed = target.get_input_embeddings()
        steps = 3
        logits = unrolled(feats, torch.stack([embed(shifted(ids[:, 1:], j)) for j in range(steps)]))  # [K, 1, A, Vd]
        a = ids.shape[1] - 1
        for t in range(a - steps):
            cache = head.new_cache()
            g = head.fuse_concat(feats[:, : t + 1])
            h = head(embed(ids[:, 1: t + 2]), g, torch.arange(t + 1)[None], cache)[:, -1:]  # true inputs 0..t
            for j in range(steps):
                assert torch.allclose(head.draft_logits(h)[0, 0], logits[j, 0, t], atol=1e-4), (t, j)
                h = head(embed(ids[:, t + 2 + j: t + 3 + j]), h, torch.tensor([[t + 1 + j]]), cache)


def test_training_time_test_on_the_labelled_anchors_only_gives_their_rows_of_the_full_unroll():
    from draftsmith.trainers.eagle.ttt import Eagle3TTT, shifted, ttt_anchors

    target = random_model("llama", seed=0, layers=4)
    unrolled = Eagle3TTT(_eagle3(target)).eval()
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :7], labels[1, :4] = -100, -100  # prompts of 7 and 4 tokens
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i][:, :-1] for i in unrolled.hidden_layers], -1)  # [2, 11, 96]
        embeds = torch.stack([target.get_input_embeddings()(shifted(ids[:, 1:], j)) for j in range(3)])
        keep = torch.stack([ttt_anchors(labels, j) for j in range(3)])  # [3, 2, 11]
        full = unrolled(feats, embeds)  # [3, 2, 11, Vd]
        kept = unrolled(feats, embeds, keep)
    assert keep[0, 0].nonzero().squeeze().tolist() == list(range(5, 10))  # x_{t+2} in the answer, t + 2 < 12
    assert keep[2, 1].nonzero().squeeze().tolist() == list(range(0, 8))
    assert torch.allclose(kept, torch.cat([full[j][keep[j]] for j in range(3)]), atol=1e-5)


@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_eagle3_drafting_is_token_identical(tree):
    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    proposer = EagleProposer(_eagle3(target), target.get_input_embeddings(), target.get_output_embeddings(),
                             length=3, tree=tree, depth=3, top_k=3, total_tokens=8)
    for seed in range(2):
        prompt = torch.randint(3, 100, (11,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=20))
        proposer.reset_stats()
        assert generate(adapter, prompt, GenerationConfig(max_new_tokens=20), proposer).output_ids == ar.output_ids
        assert proposer._cache.get_seq_length(0) == proposer._true
        vocab = proposer.report_section()[1]["draft_vocab"]  # every committed token: which could a draft propose?
        outside = [t for t in ar.output_ids if not proposer.head.t2d[t]]
        assert vocab["size"] == proposer.head.d2t.numel() and vocab["committed_tokens"] == len(ar.output_ids)
        assert vocab["outside_fraction"] == pytest.approx(len(outside) / len(ar.output_ids))


@pytest.mark.parametrize("slope", [0.0, 5.0])
def test_a_cost_sized_dynamic_tree_follows_the_verification_cost_and_stays_identical(slope):
    """``--tree-nodes auto``: with free verification every step keeps as many nodes as a fixed tree of the cap;
    when each verified token costs five plain steps, one node; either way the answer is AR's."""
    from draftsmith.inference.evaluation.cost import CostModel

    target = random_model("llama", seed=0, layers=2)
    adapter = ModelAdapter(target)
    head = _trained_like_head(target)
    prompt = torch.randint(3, 100, (11,), generator=torch.Generator().manual_seed(0))
    ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
    sections = {}
    for cost in (None, CostModel({n: 1.0 + slope * (n - 1) for n in (1, 2, 4, 8, 16)})):
        proposer = EagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(), tree="dynamic",
                                 depth=3, top_k=3, total_tokens=10, verify_cost=cost)
        sp = generate(adapter, prompt, GenerationConfig(max_new_tokens=24), proposer)
        assert sp.output_ids == ar.output_ids
        key, sections[cost is None] = proposer.report_section()
        assert key == "tree_size"
    fixed, sized = sections[True], sections[False]
    assert (fixed["rule"], sized["rule"], sized["total_tokens"]) == ("fixed", "cost", 10)
    assert sized["draft_cost_in_steps"] > 0
    if slope == 0.0:  # the same steps, each capped alike by the tokens left to generate
        assert sized["mean_nodes"] == fixed["mean_nodes"]
    else:
        assert sized["mean_nodes"] == 1.0


# ------------------------------------------------------------------------ EAGLE-3: loss mask and draft vocabulary


def _unroll_inputs(target, steps: int, anchors: int, seed: int, keep_above: float = 0.3):
    """Random training-time-test inputs for ``target``: features ``[B, A, 3Ht]``, step embeddings ``[K, B, A, H]``,
    the trained anchors ``[K, B, A]`` and the target's states at ``t + 1`` ``[B, A, Ht]`` (B = 2)."""
    gen = torch.Generator().manual_seed(seed)
    h = target.config.hidden_size
    feats = torch.randn(2, anchors, 3 * h, generator=gen)
    embeds = torch.randn(steps, 2, anchors, h, generator=gen)
    keep = torch.rand(steps, 2, anchors, generator=gen) > keep_above
    following = torch.randn(2, anchors, h, generator=gen)
    return feats, embeds, keep, following


def test_the_recomputed_unroll_gives_the_same_loss_and_gradients_and_keeps_fewer_tensors():
    """ttt_recompute (activation checkpointing of each unrolled step): the loss and every gradient as without it,
    while the forward keeps far fewer bytes for the backward (one step's outputs, not every step's attention)."""
    from draftsmith.inference.drafters.eagle import Eagle3Head, draft_vocab
    from draftsmith.trainers.eagle.loss import Eagle3Training

    target = random_model("llama", seed=0, layers=4)
    d2t, t2d = draft_vocab(torch.arange(128), 64)
    feats, embeds, keep, following = _unroll_inputs(target, steps=4, anchors=24, seed=4)
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        module = Eagle3Training(Eagle3Head.for_target(target, d2t, t2d), recompute=recompute).train()
        saved: list[int] = []

        def keep_size(t, saved=saved):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep_size, lambda t: t):
            total, ce, _ = module(feats, embeds, keep, following, target.get_output_embeddings(), 0.8)
        total.backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        results.append((total.detach(), ce, grads, sum(saved)))
    (plain, plain_ce, plain_grads, plain_bytes), (again, again_ce, again_grads, again_bytes) = results
    assert torch.allclose(plain, again, rtol=1e-6) and torch.allclose(plain_ce, again_ce, rtol=1e-6)
    assert plain_grads.keys() == again_grads.keys() and len(plain_grads) > 5
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, again_grads[name], rtol=1e-5, atol=1e-7), name
    assert again_bytes < 0.5 * plain_bytes


def test_ttt_anchors_keep_only_labels_the_draft_vocabulary_holds():
    """EAGLE-3's position_mask = t2d[target_argmax] * loss_mask, shifted with the labels at every unrolled step."""
    from draftsmith.trainers.eagle.ttt import ttt_anchors

    labels = torch.tensor([[-100, -100, 5, 6, 7, 8, -100]])  # answer x_2..x_5; anchors t = 0..5
    draftable = torch.tensor([[True, False, True, True, False, True]])  # argmax p_{t+2} inside the draft vocabulary
    assert ttt_anchors(labels, 0).tolist() == [[True, True, True, True, False, False]]  # x_{t+2} an answer token
    assert ttt_anchors(labels, 0, draftable).tolist() == [[True, False, True, True, False, False]]
    assert ttt_anchors(labels, 1).tolist() == [[True, True, True, False, False, False]]  # x_{t+3}
    assert ttt_anchors(labels, 1, draftable).tolist() == [[False, True, True, False, False, False]]  # argmax p_{t+3}


def _eagle3_trainer(target, head, tokenizer, tmp_path, **config):
    import transformers

    from draftsmith.trainers.eagle.loss import Eagle3Training
    from draftsmith.trainers.eagle.trainer import EagleTrainer

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                                          disable_tqdm=True)
    return EagleTrainer(model=Eagle3Training(head), teacher_model=target, args=args, processing_class=tokenizer,
                        method_config=EagleConfig(variant="eagle3", data_mode="fixed", **config))


def test_eagle3_loss_leaves_out_anchors_whose_target_token_is_outside_the_draft_vocabulary(tokenizer, tmp_path):
    """A hand-made vocabulary without the target's argmax at anchors 4 and 6: those anchors (and wherever else the
    target's next token is one of those two) add nothing to any unrolled step's loss, the normaliser still counts
    them, and top-1 counts them as misses."""
    from draftsmith.inference.drafters.eagle import Eagle3Head
    from draftsmith.trainers.eagle.ttt import Eagle3TTT, shifted

    target = random_model("llama", seed=0, layers=4)
    ids = torch.randint(3, 100, (1, 12), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[0, :3] = -100  # a 3-token prompt
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    p_logits = out.logits[0]  # [T, V]: row t + 1 is p_{t+2}, anchor t's step-0 label
    t2d = torch.ones(128, dtype=torch.bool)
    t2d[p_logits[[5, 7]].argmax(-1)] = False  # anchors 4 and 6: their target token is not in the draft vocabulary
    used = t2d.nonzero().squeeze(1)
    head = Eagle3Head.for_target(target, used - torch.arange(used.numel()), t2d)
    torch.manual_seed(3)
    for p in head.midlayer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    steps, decay = 3, 0.8
    trainer = _eagle3_trainer(target, head, tokenizer, tmp_path, ttt_steps=steps, step_decay=decay)
    batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        total, ce, hits = trainer._ttt(trainer.model, batch, top1=True)
        feats = torch.cat([out.hidden_states[i][:, :-1] for i in head.hidden_layers], -1)
        embeds = torch.stack([target.get_input_embeddings()(shifted(ids[:, 1:], j)) for j in range(steps)])
        full = Eagle3TTT.forward(trainer.model, feats, embeds)  # [K, 1, A, Vd]: every anchor, every step, unchunked
    want, with_outside, skipped = 0.0, 0.0, 0
    for j in range(steps):
        for t in range(ids.shape[1] - 1):
            if t + 2 + j >= ids.shape[1] or labels[0, t + 2 + j] == -100:
                continue
            logits = p_logits[t + 1 + j]  # p_{t+2+j}
            term = -(logits[t2d].softmax(-1) * full[j, 0, t].log_softmax(-1)).sum().item() * decay ** j
            with_outside += term
            if not t2d[logits.argmax()]:
                skipped += 1
                continue
            want += term
    assert skipped >= 2 and total.item() == pytest.approx(want, rel=1e-4) and with_outside > want + 1e-3
    labelled = [sum(1 for t in range(11) if t + 2 + j < 12 and labels[0, t + 2 + j] != -100) for j in range(steps)]
    assert hits[:, 1].tolist() == labelled  # top-1 over every labelled anchor: the skipped ones are misses
    assert int(trainer.count_loss_tokens(batch)) == labelled[0]  # the normaliser keeps them too


@pytest.mark.parametrize("called", [False, True])
def test_eagle3_chunked_loss_has_the_unchunked_gradients(tokenizer, tmp_path, called, monkeypatch):
    """The unrolled token loss chunked over the draft vocabulary (through the heads' weights, or checkpointed calls
    of sharded heads) gives the value and the head's gradients of the loss over full [N_j, Vd] logits."""
    from draftsmith.trainers.eagle.ttt import Eagle3TTT, shifted, ttt_anchors

    target = random_model("llama", seed=0, layers=4)
    head = _eagle3(target)
    torch.manual_seed(5)
    for p in head.midlayer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    trainer = _eagle3_trainer(target, head, tokenizer, tmp_path, ttt_steps=3)
    monkeypatch.setattr(trainer, "sharded", lambda: called)
    ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(6))
    labels = ids.clone()
    labels[:, :3] = -100
    batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    total, _, _ = trainer._ttt(trainer.model, batch)
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i][:, :-1] for i in head.hidden_layers], -1)
        embeds = torch.stack([target.get_input_embeddings()(shifted(ids[:, 1:], j)) for j in range(3)])
        following = out.logits[:, 1:]  # [B, A, V]
        probs = following[..., head.t2d].softmax(-1)  # p|Vd
        draftable = head.t2d[following.argmax(-1)]
        keep = torch.stack([ttt_anchors(labels, j, draftable) for j in range(3)])
    logits = Eagle3TTT.forward(trainer.model, feats, embeds, keep)  # [sum_j N_j, Vd], unchunked
    want = 0.0
    for j, part in enumerate(logits.split(keep.sum((1, 2)).tolist())):
        want = want + 0.8 ** j * -(shifted(probs, j)[keep[j]] * part.log_softmax(-1)).sum()
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)
    params = [p for p in head.parameters() if p.requires_grad]
    for g, w in zip(torch.autograd.grad(total, params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_draft_vocabulary_is_counted_on_the_targets_answers_with_data_mode_target(tokenizer):
    """data_mode=target: the draft vocabulary ranks the target's greedy answers to the first draft_vocab_prompts
    training prompts (the dataset's responses only break ties); data_mode=fixed: the dataset's responses."""
    import datasets

    from draftsmith.data.chat import tokenize_messages
    from draftsmith.data.draft_vocab import answer_token_counts, ranked_counts
    from draftsmith.data.generation import cut_at_eos
    from draftsmith.trainers.eagle.trainer import build_eagle_head, draft_vocab_counts

    target = random_model("llama", seed=0, layers=4)
    rows = [tokenize_messages(tokenizer, [{"role": "user", "content": f"question {i}?"},
                                          {"role": "assistant", "content": "zzzz"}], 64) for i in range(5)]
    train = datasets.Dataset.from_list(rows)
    answers = torch.zeros(128, dtype=torch.long)
    for row in rows[:3]:  # the first draft_vocab_prompts prompts, answered greedily, one at a time
        prompt = [i for i, lab in zip(row["input_ids"], row["labels"]) if lab == -100]
        out = target.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=2,
                              pad_token_id=0)
        answers += torch.bincount(torch.tensor(cut_at_eos(out[0, len(prompt):].tolist(), [2])), minlength=128)
    responses = answer_token_counts(train, 128)  # "zzzz</s>" five times
    cfg = EagleConfig(variant="eagle3", data_mode="target", max_new_tokens=6, draft_vocab_prompts=3)
    assert torch.equal(draft_vocab_counts(target, cfg, train, tokenizer), ranked_counts(answers, responses))
    cfg.draft_vocab_size = int((answers > 0).sum())
    head = build_eagle_head({"target": target}, cfg, train_dataset=train, tokenizer=tokenizer).head
    assert set(head.t2d.nonzero().squeeze(1).tolist()) == set(answers.nonzero().squeeze(1).tolist())
    fixed = EagleConfig(variant="eagle3", data_mode="fixed")
    assert torch.equal(draft_vocab_counts(target, fixed, train, tokenizer), responses)


def test_fc_bias_defaults_to_the_references():
    """EAGLE-1's reference head builds fc = nn.Linear(2H, H, bias=True) unless its config says bias: false."""
    from draftsmith.trainers.eagle.trainer import build_eagle_head

    target = random_model("llama", seed=0, layers=2)
    assert EagleConfig().fc_bias is True
    assert build_eagle_head({"target": target}, EagleConfig()).fc.bias is not None
    assert build_eagle_head({"target": target}, EagleConfig(fc_bias=False)).fc.bias is None


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_a_head_for_a_bfloat16_target_trains_in_float32_master_weights(variant):
    """The precision policy: trained weights are float32 whatever the frozen target's dtype (AdamW's updates on
    bfloat16 weights round away below 2^-8 of each weight); the draft vocabulary's index maps stay integers."""
    from draftsmith.trainers.eagle.trainer import build_eagle_head

    target = random_model("llama", seed=0, layers=4).to(torch.bfloat16)
    config = EagleConfig(variant=variant, data_mode="fixed", draft_vocab_size=64)
    module = build_eagle_head({"target": target}, config, train_dataset=[{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}])
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert all(not b.is_floating_point() for n, b in module.named_buffers() if "d2t" in n or "t2d" in n)


def trainer_and_backward(module, target, tokenizer, config: EagleConfig, tmp_path):
    """An EagleTrainer over ``module`` and one training loss on two random 12-token rows (the first 3 tokens
    unlabelled), backpropagated: ``(trainer, loss)``."""
    import transformers

    from draftsmith.trainers.eagle.trainer import EagleTrainer

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                                          disable_tqdm=True)
    trainer = EagleTrainer(model=module, teacher_model=target, args=args, processing_class=tokenizer,
                           method_config=config)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :3] = -100
    loss, _ = trainer.loss_sum(module, {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)})
    loss.backward()
    return trainer, loss


def test_peagle_trains_its_placeholder_with_the_depth_weights_of_the_reference(tokenizer, tmp_path):
    """The recipe builds a P-EAGLE head (float32, the tokenizer's placeholder token); one loss of the trainer is the
    unrolled placeholder steps' CE weighted max(0.7**j, 0.2), and its gradient reaches mask_hidden."""
    from draftsmith.inference.drafters.peagle import PEagleHead
    from draftsmith.trainers.eagle.trainer import build_eagle_head

    target = random_model("llama", seed=0, layers=4)
    config = EagleConfig(variant="peagle", data_mode="fixed", draft_vocab_size=64, ttt_steps=5, draft_length=5)
    assert config.step_weights(5) == pytest.approx([1.0, 0.7, 0.49, 0.343, 0.2401])
    assert config.step_weights(7)[-1] == 0.2 and config.proposer_settings()["tree"] == "chain"
    module = build_eagle_head({"target": target}, config, train_dataset=[{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}],
                              tokenizer=tokenizer)
    assert isinstance(module.head, PEagleHead) and module.head.mask_token_id == tokenizer.pad_token_id
    _, loss = trainer_and_backward(module, target, tokenizer, config, tmp_path)
    assert torch.isfinite(loss) and module.head.mask_hidden.grad.abs().sum() > 0


@pytest.mark.parametrize("variant", ["eagle3", "peagle"])
def test_a_frozen_draft_lm_head_keeps_the_targets_rows_while_the_layer_trains(tokenizer, tmp_path, variant):
    """``train_lm_head=false`` (speculators' head): the draft vocabulary's LM head starts at the target's rows and
    gets no gradient, so the Trainer's optimizer never updates it; the layer still trains. EAGLE-1 has no such head."""
    from draftsmith.trainers.eagle.trainer import build_eagle_head

    target = random_model("llama", seed=0, layers=4)
    config = EagleConfig(variant=variant, data_mode="fixed", draft_vocab_size=64, ttt_steps=3, draft_length=3,
                         train_lm_head=False)
    module = build_eagle_head({"target": target}, config, train_dataset=[{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}],
                              tokenizer=tokenizer)
    head = module.head
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[head.d2t + torch.arange(head.d2t.numel())])
    trainer, loss = trainer_and_backward(module, target, tokenizer, config, tmp_path)
    assert head.lm_head.weight.grad is None and head.fc.weight.grad.abs().sum() > 0
    trainer.create_optimizer()
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert id(head.lm_head.weight) not in optimized and id(head.fc.weight) in optimized
    with pytest.raises(ConfigError, match="train_lm_head=false are EAGLE-3"):
        EagleConfig(variant="eagle1", train_lm_head=False)


def test_peagle_draft_length_is_capped_by_its_trained_depths():
    with pytest.raises(ConfigError, match="P-EAGLE drafts at most its trained depths"):
        EagleConfig(variant="peagle", ttt_steps=3, draft_length=5)


@pytest.mark.parametrize(("step", "start"), [(0, 0), (1, 0), (4, 0), (3, 2)])
def test_ttt_attention_equals_attention_under_the_visibility_mask(step, start):
    """The training-time test's structured attention (step 0's keys causally, each later step's key at its own anchor)
    equals SDPA over every step's keys under :func:`ttt_visibility`, grouped-query heads included, in value and
    gradient."""
    from draftsmith.trainers.eagle.ttt import ttt_attention, ttt_visibility

    gen = torch.Generator().manual_seed(step)
    rows = 6 - start  # queries at anchors start .. 5; step 0's keys at all 6, later steps' at the same rows
    q = torch.randn(2, 4, rows, 8, generator=gen, requires_grad=True)  # [B, N, A', D]
    keys = [torch.randn(2, 2, 6 if i == 0 else rows, 8, generator=gen, requires_grad=True) for i in range(step + 1)]
    values = [torch.randn(k.shape, generator=gen).requires_grad_() for k in keys]
    ours = ttt_attention(q, keys, values, 8**-0.5, start=start)
    expand = lambda ts: torch.cat(ts, dim=2).repeat_interleave(2, dim=1)  # noqa: E731  [B, N, A + jA', D]
    ref = torch.nn.functional.scaled_dot_product_attention(q, expand(keys), expand(values),
                                                          attn_mask=ttt_visibility(6, step, start=start))
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.allclose(ttt_attention(q, keys, values, 8**-0.5, masked=True, start=start), ref, atol=1e-6)
    weights = torch.randn(ours.shape, generator=gen)
    grads = torch.autograd.grad((ours * weights).sum(), [q, *keys, *values])
    ref_grads = torch.autograd.grad((ref * weights).sum(), [q, *keys, *values])
    assert all(torch.allclose(g, r, atol=1e-5) for g, r in zip(grads, ref_grads))


def test_eagle3_token_loss_choices_against_the_cross_entropy():
    """token_loss: forward_kl has the cross-entropy's gradients (they differ by the target's entropy, a constant);
    nla and lk_hybrid are their divergences of the same two distributions over the draft vocabulary, step by step."""
    from draftsmith.inference.drafters.eagle import Eagle3Head, draft_vocab
    from draftsmith.kernels.divergences import divergence_per_token
    from draftsmith.trainers.eagle.loss import Eagle3Training
    from draftsmith.trainers.eagle.ttt import shifted, unrolled_states

    target = random_model("llama", seed=0, layers=4)
    d2t, t2d = draft_vocab(torch.arange(128), 64)
    feats, embeds, keep, following = _unroll_inputs(target, steps=3, anchors=16, seed=5)
    lm_head = target.get_output_embeddings()
    runs = {}
    for loss in ("ce", "forward_kl", "nla", "lk_hybrid"):
        torch.manual_seed(0)
        module = Eagle3Training(Eagle3Head.for_target(target, d2t, t2d), recompute=False).train()
        total, per_step, _ = module(feats, embeds, keep, following, lm_head, 0.8, token_loss=loss)
        total.backward()
        runs[loss] = (total.detach(), per_step, {n: p.grad for n, p in module.named_parameters() if p.grad is not None})
    for name, grad in runs["ce"][2].items():
        assert torch.allclose(grad, runs["forward_kl"][2][name], rtol=1e-4, atol=1e-6), name
    with torch.no_grad():
        rows = t2d.nonzero().squeeze(1)
        for loss in ("nla", "lk_hybrid"):
            for j, hidden in enumerate(unrolled_states(module.head, feats, embeds)):
                draft_logits = module.head.draft_logits(hidden[keep[j]])  # [N_j, Vd]
                target_logits = lm_head(shifted(following, j)[keep[j]])[:, rows]  # [N_j, Vd]
                want = divergence_per_token(draft_logits, target_logits, loss).sum()
                assert float(runs[loss][1][j]) == pytest.approx(float(want), rel=1e-4), (loss, j)
    with pytest.raises(Exception, match="token_loss"):
        from draftsmith.trainers.eagle.config import EagleConfig

        EagleConfig(variant="eagle3", token_loss="hinge")


@pytest.mark.parametrize("variant", ["eagle3", "peagle"])
def test_later_steps_run_at_the_anchors_they_train_on_with_the_full_unrolls_values_and_gradients(variant):
    """Steps after the first run packed at the anchors some of them train on (ttt_rows: not a prompt, not the gaps
    between trained anchors): the trained rows' logits, the loss and every gradient are those of the unroll over
    every anchor."""
    from draftsmith.inference.drafters.eagle import Eagle3Head, draft_vocab
    from draftsmith.inference.drafters.peagle import PEagleHead
    from draftsmith.trainers.eagle.ttt import Eagle3TTT, ttt_rows

    target = random_model("llama", seed=0, layers=4)
    d2t, t2d = draft_vocab(torch.arange(128), 64)
    feats, embeds, keep, _ = _unroll_inputs(target, steps=4, anchors=20, seed=6, keep_above=0.4)
    keep[1:, 0, :7] = False  # a prompt: the later steps train from anchor 7 on in row 0, and from 3 in row 1
    keep[1:, 1, :3] = False
    keep[1:, 1, 12:15] = False  # untrained anchors between trained ones
    rows = ttt_rows(keep)
    assert not rows[0, :7].any() and rows[0, 7:].any() and not rows[1, 12:15].any() and bool(keep[0, :, :7].any())
    torch.manual_seed(0)
    head = PEagleHead.for_target(target, d2t, t2d, mask_token_id=0) if variant == "peagle" else \
        Eagle3Head.for_target(target, d2t, t2d)
    module = Eagle3TTT(head, recompute=False)
    cropped = module(feats, embeds, keep)  # [rows, Vd]
    full = torch.cat([logits[keep[j]] for j, logits in enumerate(module(feats, embeds))])  # every anchor, then picked
    assert torch.allclose(cropped, full, atol=1e-5)
    grads = [torch.autograd.grad(x.square().sum(), list(module.parameters())) for x in (cropped, full)]
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(*grads))


def test_the_teacher_table_made_once_gives_the_per_step_teachers_loss_and_gradients(monkeypatch):
    """The target's draft-vocabulary logits made once for every unrolled step (teacher_table) give the loss, each
    step's sum and every gradient of the teacher computed per step and chunk; it steps aside over its budget or for
    an anchor whose label lies past the row."""
    import draftsmith.trainers.eagle.loss as eagle_loss
    from draftsmith.inference.drafters.eagle import Eagle3Head, draft_vocab
    from draftsmith.trainers.losses import LinearHead

    target = random_model("llama", seed=0, layers=4)
    d2t, t2d = draft_vocab(torch.arange(128), 64)
    feats, embeds, keep, following = _unroll_inputs(target, steps=4, anchors=18, seed=9)
    for j in range(1, 4):
        keep[j][:, 18 - j:] = False  # as ttt_anchors: no label past the row
    lm_head = target.get_output_embeddings()
    label_head = LinearHead(lm_head, rows=t2d.nonzero().squeeze(1))
    table, index = eagle_loss.teacher_table(following, keep, label_head)
    assert table.shape == (int(index.max()) + 1, 64)
    assert eagle_loss.teacher_table(following, keep, label_head, budget=table.numel() * 4 - 1) is None
    past = keep.clone()
    past[2, 0, 17] = True
    assert eagle_loss.teacher_table(following, past, label_head) is None
    runs = []
    for made_once in (True, False):
        if not made_once:
            monkeypatch.setattr(eagle_loss, "teacher_table", lambda *args, **kwargs: None)
        for loss in ("ce", "nla"):
            torch.manual_seed(0)
            module = eagle_loss.Eagle3Training(Eagle3Head.for_target(target, d2t, t2d), recompute=False).train()
            total, per_step, _ = module(feats, embeds, keep, following, lm_head, 0.8, token_loss=loss)
            total.backward()
            runs.append((total.detach(), per_step, [p.grad for p in module.parameters() if p.grad is not None]))
    for once, per_step in zip(runs[:2], runs[2:]):
        assert torch.allclose(once[0], per_step[0], rtol=1e-5) and torch.allclose(once[1], per_step[1], rtol=1e-5)
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(once[2], per_step[2]))
