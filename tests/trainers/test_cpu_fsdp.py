"""FSDP2 on CPU processes (draftsmith.trainers.cpu_fsdp): which settings ask for it (the Trainer's ``--fsdp``, or an
accelerate FSDP config passed as environment variables), which submodules become units, and (slow, 2 processes)
the sharding itself: frozen weights left whole, the whole state gathered and loaded back exactly. The recipes
under it: tests/launch/test_scale_out.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from two_processes import two_process_result

from draftsmith.data.tiny_models import random_model
from draftsmith.trainers.cpu_fsdp import fsdp_settings, shard_units

COMMON = Path(__file__).resolve().parents[1] / "common"


def test_the_trainer_flag_asks_for_fsdp_with_its_config():
    args = SimpleNamespace(fsdp=True, fsdp_config={"reshard_after_forward": False, "version": 2})
    assert fsdp_settings(args, environ={}) == {"reshard_after_forward": False, "version": 2}


def test_an_accelerate_fsdp_config_asks_for_it_through_the_environment():
    args = SimpleNamespace(fsdp=False, fsdp_config=None)
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_RESHARD_AFTER_FORWARD": "false",
           "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer"}
    assert fsdp_settings(args, environ=env) == {"reshard_after_forward": "false",
                                                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                                "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    assert fsdp_settings(args, environ={}) is None
    assert fsdp_settings(args, environ={"ACCELERATE_USE_FSDP": "false"}) is None


def test_units_are_the_trained_decoder_layers_unless_told_otherwise():
    model = random_model("llama", seed=0, layers=3)
    assert shard_units(model, {}) == list(model.model.layers)
    model.model.layers[1].requires_grad_(False)  # a frozen layer stays out of the units
    assert shard_units(model, {}) == [model.model.layers[0], model.model.layers[2]]
    assert shard_units(model, {"auto_wrap_policy": "NO_WRAP"}) == []
    assert shard_units(model, {"transformer_layer_cls_to_wrap": ["LlamaMLP"]}) == [model.model.layers[0].mlp,
                                                                                   model.model.layers[2].mlp]


@pytest.mark.slow
def test_two_processes_shard_gather_and_reload_exactly(tmp_path):
    result = two_process_result(COMMON / "fsdp_shards.py", tmp_path / "shards.json", 29691, timeout=600)
    assert result == {"units": ["FSDPLlamaDecoderLayer", "FSDPLlamaForCausalLM"], "frozen_plain": True,
                      "trained_sharded": True, "gathered_equal": True, "reloaded_equal": True,
                      "other_rank_empty": True}
