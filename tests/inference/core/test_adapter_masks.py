"""The adapter's attention masks: a causal block (prefill, chain verification after a cache) runs without a 4-D
mask under ``sdpa`` and flash attention, with logits equal to the explicit-mask path; trees, KV prefixes, sliding
windows under ``sdpa`` and ``eager`` keep the explicit mask; flash attention refuses what needs one."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.bias import CausalBias

from draftsmith.common.errors import UnsupportedModelError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import SUBLAYER_LAYOUTS, ModelAdapter
from draftsmith.inference.core.kv_cache import KVPrefix

PAST, T = 12, 8


def _ids(n: int, seed: int = 0) -> torch.Tensor:  # [1, n]
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def _causal(t: int) -> torch.Tensor:  # [t, t]: passed as a tree, it forces the explicit 4-D mask
    return torch.ones(t, t, dtype=torch.bool).tril()


def _prefill_and_chain(adapter: ModelAdapter, explicit: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a PAST-token prefill and of a T-token chain verification after it."""
    ids = _ids(PAST + T)
    cache = adapter.new_cache(capacity=8)
    with torch.no_grad():
        prefill = adapter.forward(ids[:, :PAST], cache, tree=_causal(PAST) if explicit else None).logits
        chain = adapter.forward(ids[:, PAST:], cache, tree=_causal(T) if explicit else None).logits
    return prefill, chain


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_mask_free_prefill_and_chain_verification_equal_the_explicit_mask(family, attn):
    model = random_model(family, attn=attn)
    adapter = ModelAdapter(model)
    fast, masked = _prefill_and_chain(adapter, False), _prefill_and_chain(adapter, True)
    with torch.no_grad():
        full = model(_ids(PAST + T)).logits  # [1, PAST + T, V]
    for got, ref, whole in zip(fast, masked, (full[:, :PAST], full[:, PAST:])):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
        torch.testing.assert_close(got, whole, rtol=0, atol=1e-5)


class _Stop(Exception):
    """Ends a forward once every attention module's mask is seen (flash attention is not installed here)."""


def _masks_seen(model, run, stop_after: int | None = None) -> list:
    """The ``attention_mask`` every attention module receives during ``run()``."""
    seen: list = []

    def hook(module, args, kwargs):
        seen.append(kwargs["attention_mask"])
        if stop_after is not None and len(seen) == stop_after:
            raise _Stop

    attention = SUBLAYER_LAYOUTS[model.config.model_type][1]
    handles = [getattr(layer, attention).register_forward_pre_hook(hook, with_kwargs=True)
               for layer in ModelAdapter(model).layers]
    try:
        with torch.no_grad():
            run()
    except _Stop:
        assert stop_after is not None
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_no_4d_mask_is_built_for_a_causal_block_under_sdpa(family):
    model = random_model(family)
    adapter = ModelAdapter(model)
    cache = adapter.new_cache()
    assert _masks_seen(model, lambda: adapter.forward(_ids(PAST), cache)) == [None] * 3  # prefill: is_causal
    chain = _masks_seen(model, lambda: adapter.forward(_ids(T, 1), cache))
    assert all(isinstance(m, CausalBias) for m in chain), chain  # after a cache: causal aligned to the last key
    assert [(m.seq_len_q, m.seq_len_kv) for m in chain] == [(T, PAST + T)] * 3
    tree = _masks_seen(model, lambda: adapter.forward(_ids(T, 2), cache, tree=_causal(T)))
    assert [tuple(m.shape) for m in tree] == [(1, 1, T, PAST + 2 * T)] * 3  # a tree: the explicit mask


@pytest.mark.parametrize(("family", "attn"), [("llama", "eager"), ("mistral", "sdpa")])
def test_eager_and_sliding_windows_keep_the_explicit_mask(family, attn):
    model = random_model(family, attn=attn)  # mistral: every layer has a sliding window
    adapter = ModelAdapter(model)
    cache = adapter.new_cache()
    prefill = _masks_seen(model, lambda: adapter.forward(_ids(PAST), cache))
    chain = _masks_seen(model, lambda: adapter.forward(_ids(T, 1), cache))
    assert [type(m) for m in prefill + chain] == [torch.Tensor] * 6
    assert [tuple(m.shape) for m in chain] == [(1, 1, T, PAST + T)] * 3


def _as_flash(family: str):
    model = random_model(family)  # built with sdpa: the flash-attn package is not needed to read the config
    model.config._attn_implementation = "flash_attention_2"
    return model


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_flash_attention_gets_no_mask_for_a_causal_block(family):
    model = _as_flash(family)
    adapter = ModelAdapter(model)
    cache = adapter.new_cache()
    assert _masks_seen(model, lambda: adapter.forward(_ids(T), cache), stop_after=1) == [None]
    cache = adapter.new_cache()
    cache.update(*(torch.zeros(1, 2, PAST, 8),) * 2, layer_idx=0)  # a filled first layer: a chain after a cache
    assert _masks_seen(model, lambda: adapter.forward(_ids(T), cache), stop_after=1) == [None]


def test_flash_attention_refuses_trees_and_kv_prefixes_before_running():
    adapter = ModelAdapter(_as_flash("llama"))
    cache = adapter.new_cache()
    with pytest.raises(UnsupportedModelError, match="flash_attention_2.*attn_implementation='sdpa'") as err:
        adapter.forward(_ids(T), cache, tree=_causal(T))
    assert "\n" not in str(err.value)
    prefix = KVPrefix([torch.zeros(1, 2, 3, 8)] * 3, [torch.zeros(1, 2, 3, 8)] * 3, torch.ones(1, T, 3, dtype=bool))
    with pytest.raises(UnsupportedModelError, match="KV prefixes"):
        adapter.forward(_ids(T), cache, kv_prefix=prefix)
    assert cache.lengths() == [0, 0, 0]  # nothing ran
