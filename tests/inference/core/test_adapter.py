import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter, UnsupportedModelError
from draftsmith.inference.core.masks import causal_tree_mask, tree_depths

torch.manual_seed(0)


def _ids(n, vocab=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, n), generator=g)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_full_forward_matches_model(family, attn):
    model = random_model(family, attn=attn)
    adapter = ModelAdapter(model)
    ids = _ids(17)
    with torch.no_grad():
        ref = model(ids).logits
        out = adapter.forward(ids)
    assert out.logits.shape == ref.shape
    assert (out.logits - ref).abs().max() <= 1e-5


def test_incremental_cache_matches_full(family):
    model = random_model(family)
    adapter = ModelAdapter(model)
    ids = _ids(20)
    with torch.no_grad():
        ref = adapter.forward(ids).logits
        cache = adapter.new_cache(capacity=4)  # forces growth
        parts = [adapter.forward(ids[:, :9], cache).logits]
        for t in range(9, 20):
            parts.append(adapter.forward(ids[:, t : t + 1], cache).logits)
    assert (torch.cat(parts, 1) - ref).abs().max() <= 1e-5
    assert cache.get_seq_length() == 20


def test_hidden_states_match_transformers(family):
    model = random_model(family)
    adapter = ModelAdapter(model)
    ids = _ids(9)
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True).hidden_states
        out = adapter.forward(ids, output_hidden_states=[0, 1, 2])
    for i in (0, 1, 2):
        assert (out.hidden_states[i] - ref[i]).abs().max() <= 1e-5


def test_skipped_layers_equal_manual(family):
    model = random_model(family, layers=4)
    adapter = ModelAdapter(model)
    ids = _ids(11)
    pos = torch.arange(11)[None]
    with torch.no_grad():
        out = adapter.forward(ids, skip_layers={1, 2})
        # by hand: embed, layer 0, layer 3, norm, head
        h = adapter.embed(ids, pos)
        h, _ = adapter.forward_layers(h, pos, start=0, end=1)
        h, _ = adapter.forward_layers(h, pos, start=3, end=4)
        manual = adapter.logits(adapter.norm(h))
        early = adapter.forward(ids, exit_layer=2)
        h2, _ = adapter.forward_layers(adapter.embed(ids, pos), pos, end=2)
    assert (out.logits - manual).abs().max() <= 1e-6
    assert (early.logits - adapter.logits(adapter.norm(h2))).abs().max() <= 1e-6
    assert (out.logits - adapter.forward(ids).logits).abs().max() > 1e-4  # skipping changed something


def test_skipped_layers_with_cache_match_full_recompute(family):
    model = random_model(family, layers=4)
    adapter = ModelAdapter(model)
    ids = _ids(12)
    with torch.no_grad():
        ref = adapter.forward(ids, skip_layers={2}).logits
        cache = adapter.new_cache()
        a = adapter.forward(ids[:, :7], cache, skip_layers={2}).logits
        b = adapter.forward(ids[:, 7:], cache, skip_layers={2}).logits
    assert cache.get_seq_length(2) == 0 and cache.get_seq_length(1) == 12
    assert (torch.cat([a, b], 1) - ref).abs().max() <= 1e-5


# tree:   root ─ 0 ─ 1 ─ 3
#              │   └ 2
#              └ 4 ─ 5
PARENTS = [-1, 0, 0, 1, -1, 4]


def _branch(i):
    path = []
    while i >= 0:
        path.append(i)
        i = PARENTS[i]
    return path[::-1]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_forward_matches_branch_forwards(family, attn):
    model = random_model(family, attn=attn)
    adapter = ModelAdapter(model)
    prefix = _ids(10, seed=1)
    nodes = _ids(len(PARENTS), seed=2)[0]
    with torch.no_grad():
        cache = adapter.new_cache()
        adapter.forward(prefix, cache)
        pos = 10 + tree_depths(PARENTS) - 1
        tree_logits = adapter.forward(nodes[None], cache, position_ids=pos[None], tree=causal_tree_mask(PARENTS)).logits[0]
        for i in range(len(PARENTS)):
            branch = torch.cat([prefix[0], nodes[_branch(i)]])[None]
            plain = model(branch).logits[0, -1]
            assert (tree_logits[i] - plain).abs().max() <= 1e-5, f"node {i}"


def test_select_and_crop_continue_like_fresh_prefill(family):
    model = random_model(family)
    adapter = ModelAdapter(model)
    prefix = _ids(8, seed=3)
    nodes = _ids(len(PARENTS), seed=4)[0]
    nxt = _ids(3, seed=5)
    with torch.no_grad():
        cache = adapter.new_cache()
        adapter.forward(prefix, cache)
        pos = 8 + tree_depths(PARENTS) - 1
        adapter.forward(nodes[None], cache, position_ids=pos[None], tree=causal_tree_mask(PARENTS))
        keep = torch.tensor(_branch(3))  # [0, 1, 3]: a non-contiguous branch
        cache.select(8, keep)
        assert cache.get_seq_length() == 11
        cont = adapter.forward(nxt, cache).logits
        fresh = adapter.forward(torch.cat([prefix, nodes[keep][None], nxt], 1)).logits[:, -3:]
        assert (cont - fresh).abs().max() <= 1e-5
        # crop back to the prefix and continue differently
        cache.crop(8)
        cont2 = adapter.forward(nxt, cache).logits
        fresh2 = adapter.forward(torch.cat([prefix, nxt], 1)).logits[:, -3:]
        assert (cont2 - fresh2).abs().max() <= 1e-5


def test_tree_mask_and_depths():
    m = causal_tree_mask(PARENTS)
    assert m[3].tolist() == [True, True, False, True, False, False]
    assert tree_depths(PARENTS).tolist() == [1, 2, 2, 3, 1, 2]
    with pytest.raises(ValueError):
        causal_tree_mask([1, -1])


def test_unsupported_model_is_refused():
    class Fake(torch.nn.Module):
        config = type("C", (), {"model_type": "t5"})()

    with pytest.raises(UnsupportedModelError, match="not supported"):
        ModelAdapter(Fake())


def test_inputs_embeds_match_input_ids_and_transformers(family):
    model = random_model(family)
    adapter = ModelAdapter(model)
    ids = _ids(9)
    with torch.no_grad():
        embeds = adapter.embed_tokens(ids)  # [1, 9, H]
        by_ids = adapter.forward(ids).logits
        by_embeds = adapter.forward(inputs_embeds=embeds).logits
        ref = model(inputs_embeds=embeds).logits
    assert (by_embeds - by_ids).abs().max() <= 1e-6
    assert (by_embeds - ref).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="exactly one"):
        adapter.forward(ids, inputs_embeds=embeds)


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
def test_forward_from_a_layer_continues_an_early_exit(family, exit_layer):
    """Layers 0..E-1 run with the cache (the early-exit draft), then forward_from(E) runs the rest:
    the logits are the full model's, and every layer ends up caching every token."""
    model = random_model(family)
    adapter = ModelAdapter(model)
    ids = _ids(13)
    with torch.no_grad():
        ref = adapter.forward(ids).logits[:, 8:]
        cache = adapter.new_cache()
        adapter.forward(ids[:, :8], cache)
        early = adapter.forward(ids[:, 8:], cache, exit_layer=exit_layer, output_hidden_states=[exit_layer])
        assert cache.lengths() == [13] * exit_layer + [8] * (3 - exit_layer)
        pos = torch.arange(8, 13)[None]
        out = adapter.forward_from(early.hidden_states[exit_layer], exit_layer, cache, position_ids=pos)
    assert cache.lengths() == [13, 13, 13]
    assert (out.logits - ref).abs().max() <= 1e-5


def _zero_sublayer(model, family, layer, part):
    """A copy of ``model`` whose ``part`` ("attn" or "mlp") of ``layer`` outputs zeros."""
    import copy

    model = copy.deepcopy(model)
    block = (model.transformer.h if family == "gpt2" else model.model.layers)[layer]
    if family == "gpt2":
        proj = block.attn.c_proj if part == "attn" else block.mlp.c_proj
    else:
        proj = block.self_attn.o_proj if part == "attn" else block.mlp.down_proj
    with torch.no_grad():
        for p in proj.parameters():
            p.zero_()
    return model


@pytest.mark.parametrize("part", ["attn", "mlp"])
def test_skipping_a_sublayer_equals_zeroing_its_output(family, part):
    model = random_model(family, layers=3)
    adapter = ModelAdapter(model)
    ids = _ids(10)
    with torch.no_grad():
        ref = _zero_sublayer(model, family, 1, part)(ids).logits
        kwargs = {"skip_attention": [1]} if part == "attn" else {"skip_mlp": [1]}
        out = adapter.forward(ids, **kwargs).logits
        full = adapter.forward(ids).logits
        both = adapter.forward(ids, skip_attention=[1], skip_mlp=[1]).logits
        whole = adapter.forward(ids, skip_layers=[1]).logits
    assert (out - ref).abs().max() <= 1e-5
    assert (out - full).abs().max() > 1e-4
    assert (both - whole).abs().max() == 0


def test_sublayer_skipping_with_cache_and_default_positions(family):
    """With layer 0's attention skipped, layer 0 caches nothing; positions come from a layer that does."""
    model = random_model(family, layers=3)
    adapter = ModelAdapter(model)
    ids = _ids(12)
    with torch.no_grad():
        ref = adapter.forward(ids, skip_attention=[0]).logits
        cache = adapter.new_cache()
        a = adapter.forward(ids[:, :7], cache, skip_attention=[0]).logits
        b = adapter.forward(ids[:, 7:], cache, skip_attention=[0]).logits
    assert cache.lengths() == [0, 12, 12]
    assert (torch.cat([a, b], 1) - ref).abs().max() <= 1e-5


def test_sublayer_skipping_refuses_unknown_layouts_and_layers():
    adapter = ModelAdapter(random_model("llama"))
    with pytest.raises(ValueError, match="outside"):
        adapter.forward(_ids(3), skip_mlp=[7])
    adapter.model_type = "gemma"  # the adapter's own record of the layout, not a transformers module
    with pytest.raises(UnsupportedModelError, match="whole layers"):
        adapter.forward(_ids(3), skip_mlp=[1])


def test_decoding_attention_leaves_out_cudnn_and_changes_nothing_on_the_cpu():
    from draftsmith.inference.core.attention import decode_attention

    with decode_attention():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    q, k, v = (torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with decode_attention():
        assert torch.equal(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), plain)
