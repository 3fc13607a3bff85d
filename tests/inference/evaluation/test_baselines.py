import pytest
import torch

from draftsmith.inference.evaluation.baselines import (
    HF_PROMPT_LOOKUP_TOKENS,
    count_forwards,
    hf_generate,
    hf_pad_id,
    hf_variants,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_count_forwards_hook_is_removed(lm_pair):
    target, _ = lm_pair
    ids = torch.tensor([[1, 5, 7]])
    with torch.no_grad(), count_forwards(target) as n:
        target(ids)
        target(ids)
    target(ids)
    assert n[0] == 2 and not target._forward_hooks


def test_hf_variants_need_a_separate_draft_for_assisted_generation(lm_pair):
    target, draft = lm_pair
    assert hf_variants(None, HF_PROMPT_LOOKUP_TOKENS) == {
        "hf_ar": {}, "hf_prompt_lookup": {"prompt_lookup_num_tokens": HF_PROMPT_LOOKUP_TOKENS}}
    assert "hf_assisted" not in hf_variants(target, 10, target)
    assert hf_variants(draft, 10, target)["hf_assisted"] == {"assistant_model": draft}


def test_hf_generate_counts_one_forward_per_token(lm_pair):
    target, _ = lm_pair
    ids, seconds, forwards = hf_generate(target, [1, 5, 7], 5, (), 0)
    assert 1 <= len(ids) == forwards <= 5 and seconds > 0
    assert not target._forward_hooks


def test_hf_pad_id_falls_back_to_eos_then_zero():
    class Tok:
        def __init__(self, pad, eos):
            self.pad_token_id, self.eos_token_id = pad, eos

    assert hf_pad_id(Tok(3, 2)) == 3 and hf_pad_id(Tok(None, 2)) == 2 and hf_pad_id(Tok(None, None)) == 0
