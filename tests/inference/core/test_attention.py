"""Attention kernels of the decode loop and the mask-free causal attention: which implementations take a causal
block without a 4-D mask, and that the lower-right CausalBias, through transformers' own SDPA function, equals
the explicit bottom-right mask."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.bias import CausalBias
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from draftsmith.inference.core.attention import FLASH, SDPA, causal_attention_kind, causal_mask
from draftsmith.inference.core.masks import additive_mask, visibility


@pytest.mark.parametrize(("name", "kind"), [("sdpa", SDPA), ("flash_attention_2", FLASH), ("flash_attention_3", FLASH),
                                            ("kernels-community/flash-attn2", FLASH), ("eager", None),
                                            ("flex_attention", None), (None, None), ({"text_config": "sdpa"}, None)])
def test_which_implementations_run_a_causal_block_without_a_mask(name, kind):
    assert causal_attention_kind(name) == kind


def test_no_mask_where_the_attention_is_causal_by_itself():
    assert causal_mask(FLASH, 0, 8) is None and causal_mask(FLASH, 512, 8) is None  # the kernel aligns bottom-right
    assert causal_mask(SDPA, 0, 8) is None  # is_causal: top-left is bottom-right when queries = keys
    assert causal_mask(SDPA, 512, 1) is None  # one query sees everything
    bias = causal_mask(SDPA, 512, 8)
    assert isinstance(bias, CausalBias) and (bias.seq_len_q, bias.seq_len_kv) == (8, 520)


class _Attention(torch.nn.Module):
    """What transformers' SDPA function reads from an attention module (grouped-query: 2 query heads per key head)."""

    num_key_value_groups = 2
    is_causal = True


def _qkv(past: int, t: int):  # q [1, 4, T, 8], k/v [1, 2, past + T, 8]
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, 4, t, 8, generator=g), torch.randn(1, 2, past + t, 8, generator=g),
            torch.randn(1, 2, past + t, 8, generator=g))


@pytest.mark.parametrize(("past", "t"), [(0, 6), (5, 6), (9, 1)])
def test_the_mask_free_call_equals_the_explicit_bottom_right_mask_through_transformers_sdpa(past, t):
    q, k, v = _qkv(past, t)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    explicit = additive_mask(visibility(past, causal, torch.arange(past, past + t)), q.dtype)  # [1, 1, T, past + T]
    ref, _ = sdpa_attention_forward(_Attention(), q, k, v, explicit)
    got, _ = sdpa_attention_forward(_Attention(), q, k, v, causal_mask(SDPA, past, t))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


def test_no_mask_after_a_cache_would_be_wrong_under_sdpa():
    """Why the CausalBias: with no mask transformers sets a top-left ``is_causal`` and keeps only the first T keys."""
    q, k, v = _qkv(5, 6)
    explicit = additive_mask(visibility(5, torch.ones(6, 6, dtype=torch.bool).tril(), torch.arange(5, 11)), q.dtype)
    ref, _ = sdpa_attention_forward(_Attention(), q, k, v, explicit)
    wrong, _ = sdpa_attention_forward(_Attention(), q, k, v, None)
    assert (wrong - ref).abs().max() > 1e-3
