import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.adapter import ModelAdapter, UnsupportedModelError, causal_tree_mask, tree_depths

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
