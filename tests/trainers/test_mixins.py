"""The tuned copy of a target: float32 master weights over a 16-bit frozen original (the precision policy)."""

from __future__ import annotations

import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.trainers.mixins import tunable_copy


def test_a_full_copy_of_a_bfloat16_target_trains_float32_master_weights():
    target = random_model("llama", seed=0, layers=1).to(torch.bfloat16).requires_grad_(False)
    copy = tunable_copy(target, "full", 4, 8.0)
    assert all(p.dtype == torch.float32 and p.requires_grad for p in copy.parameters())
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in target.parameters())  # untouched
    assert torch.equal(copy.get_input_embeddings().weight.to(torch.bfloat16), target.get_input_embeddings().weight)


def test_a_lora_copy_keeps_the_16_bit_base_frozen_and_its_adapter_in_float32():
    target = random_model("llama", seed=0, layers=1).to(torch.bfloat16).requires_grad_(False)
    copy = tunable_copy(target, "lora", 4, 8.0)
    trained = [p for p in copy.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert all(p.dtype == torch.bfloat16 for p in copy.parameters() if not p.requires_grad)
