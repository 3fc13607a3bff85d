"""Which missing keys of a resumed checkpoint are news (draftsmith.trainers.base.unrestored_keys)."""

from __future__ import annotations

import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.trainers.base import unrestored_keys


def tied_model():
    model = random_model("llama", layers=1)
    model.lm_head.weight = model.model.embed_tokens.weight
    return model


def test_a_tied_lm_head_saved_under_its_embedding_is_not_missing():
    model = tied_model()
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # safetensors keeps one name
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == ["lm_head.weight"]
    assert unrestored_keys(model, result.missing_keys) == []


def test_really_missing_keys_are_still_reported():
    model = tied_model()
    state = {k: v for k, v in model.state_dict().items() if k not in ("lm_head.weight", "model.embed_tokens.weight",
                                                                     "model.norm.weight")}
    result = model.load_state_dict(state, strict=False)  # neither name of the tied tensor: nothing restored it
    assert sorted(unrestored_keys(model, result.missing_keys)) == ["lm_head.weight", "model.embed_tokens.weight",
                                                                   "model.norm.weight"]


def test_frozen_parameters_left_out_of_a_checkpoint_are_not_missing():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[0].requires_grad_(False)
    assert unrestored_keys(model, ["0.weight", "0.bias", "1.bias"]) == ["1.bias"]
