"""The memory plan (``draftsmith memory``): parameter counts equal the modules the recipes build, and each sharding
mode divides what it shards."""

from __future__ import annotations

import json

import pytest

from draftsmith.data.tiny_models import random_model, tiny_config
from draftsmith.launch.cli import main
from draftsmith.launch.memory_plan import MODES, count, plan


def _trainable(module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


@pytest.fixture(scope="module")
def target():
    return random_model("llama", seed=0, layers=4, vocab_size=128, hidden=32)


def test_counts_are_those_of_the_modules_the_recipes_build(target):
    from draftsmith.trainers.eagle.trainer import EagleConfig, build_eagle_head
    from draftsmith.trainers.medusa.trainer import MedusaConfig, build_heads

    cfg = target.config
    total = sum(p.numel() for p in target.parameters())
    medusa = count("medusa", cfg)
    assert medusa.frozen == total and medusa.trained == _trainable(build_heads({"target": target}, MedusaConfig()))
    assert count("eagle", cfg).trained == _trainable(build_eagle_head({"target": target}, EagleConfig()))
    eagle3 = EagleConfig(variant="eagle3", data_mode="fixed", draft_vocab_size=EagleConfig().draft_vocab_size)
    built = build_eagle_head({"target": target}, eagle3, train_dataset=[{"input_ids": [5, 6], "labels": [5, 6]}])
    assert count("eagle3", cfg).trained == _trainable(built)
    assert count("layerskip", cfg).trained == total
    draft = tiny_config("llama", layers=1, vocab_size=128, hidden=32)
    assert count("distillspec", cfg, draft).trained == sum(p.numel() for p in random_model("llama", layers=1,
                                                                                             vocab_size=128,
                                                                                             hidden=32).parameters())
    medusa2 = count("medusa2", cfg)
    assert medusa2.frozen == 2 * total and medusa2.trained > medusa.trained  # the frozen copy; the adapter trains


def test_fsdp2_holds_its_root_unit_and_one_layer_whole(target):
    """A fine-tuned target: its embeddings, LM head and final norm (the root unit) and one decoder layer; a head,
    which has no layer units: all of it."""
    layers = target.model.layers
    outside = sum(p.numel() for p in target.parameters()) - sum(p.numel() for p in layers.parameters())
    assert count("layerskip", target.config).gathered == outside + sum(p.numel() for p in layers[0].parameters())
    eagle3 = count("eagle3", target.config)
    assert eagle3.gathered == eagle3.trained


def test_each_mode_divides_what_it_shards(target):
    c = count("eagle3", target.config)
    plans = {m: plan(c, m, 8, 1024, 2, 2, 64) for m in MODES}
    assert plans["ddp"]["trained_state"] == 16 * c.trained
    assert plans["zero3"]["trained_state"] == 16 * c.trained // 8
    assert plans["fsdp2"]["trained_state"] == 16 * c.trained // 8 + 12 * c.gathered  # the root unit held whole
    assert plans["zero3"]["trained_state"] < plans["zero2"]["trained_state"] < plans["ddp"]["trained_state"]
    assert plans["zero3-offload"]["trained_state"] == 8 * c.trained // 8
    assert plans["zero3"]["frozen_weights"] == 2 * c.frozen // 8 + 2 * c.layer  # partitioned, one layer gathered
    assert plans["ddp"]["frozen_weights"] == plans["zero2"]["frozen_weights"] == plans["fsdp2"]["frozen_weights"]
    assert all(p["total"] == sum(v for k, v in p.items() if k != "total") for p in plans.values())
    one = plan(c, "zero3", 1, 1024, 2, 2, 64)
    assert one["trained_state"] == plans["ddp"]["trained_state"]  # one GPU shards nothing


def test_the_command_prints_every_method_and_mode_and_writes_the_json(tmp_path, capsys, target):
    target.save_pretrained(tmp_path / "t")
    out = tmp_path / "plan.json"
    assert main(["memory", "--target", str(tmp_path / "t"), "--gpus", "2", "--tokens", "64", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("| method |"))
    assert header.split(" | ")[3:] == ["ddp", "zero2", "zero3", "zero3-offload", "fsdp2 |"] and "| eagle3 |" in printed
    plans = json.loads(out.read_text())["plans"]
    assert set(plans) >= {"distillspec", "medusa", "eagle3", "layerskip", "bita"}
    assert plans["eagle3"]["modes"]["zero3"]["total"] < plans["eagle3"]["modes"]["ddp"]["total"]


def test_the_preset_shapes_count_as_published():
    from draftsmith.launch.memory_cli import model_config

    assert round(count("medusa", model_config("llama-3.1-8b", "--target")).frozen / 1e9, 2) == 8.03
    assert round(count("medusa", model_config("llama-3.2-1b", "--target")).frozen / 1e9, 2) == 1.24


def test_a_bad_target_or_method_is_one_line(tmp_path, capsys):
    assert main(["memory", "--target", str(tmp_path / "none")]) == 2
    assert main(["memory", "--target", "llama-3.2-1b", "--method", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error:") for line in err)




LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}


@pytest.mark.parametrize("text, expected", [
    ("{not json", "is not a JSON config"),
    ("", "is not a JSON config"),
    ("[1, 2]", "is not a model config"),
    (json.dumps({"hidden_size": 64}), "is not a model config"),
    (json.dumps({**LLAMA, "model_type": "no-such-model"}), "transformers refuses it"),
    (json.dumps({**LLAMA, "hidden_size": 0}), "hidden_size=0"),
    (json.dumps({**LLAMA, "num_hidden_layers": -2}), "num_hidden_layers=-2"),
    (json.dumps({**LLAMA, "hidden_size": 66}), "is not a multiple of the number of attention heads (4)"),
    (json.dumps({**LLAMA, "head_dim": 0}), "head_dim=0: every size must be a whole number >= 1"),
    (json.dumps({**LLAMA, "num_key_value_heads": 3}), "not divisible by num_key_value_heads=3"),
])
def test_a_broken_config_is_one_line(tmp_path, capsys, text, expected):
    (tmp_path / "config.json").write_text(text)
    assert main(["memory", "--target", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and expected in err[0], err


@pytest.mark.parametrize("extra, expected", [(["--draft-layers", "0"], "--draft-layers 0: must be >= 1"),
                                             (["--draft-layers", "-3"], "--draft-layers -3: must be >= 1"),
                                             (["--modes", ""], "names no mode")])
def test_non_positive_counts_and_no_modes_are_refused(capsys, extra, expected):
    assert main(["memory", "--target", "llama-3.2-1b", *extra]) == 2
    assert expected in capsys.readouterr().err
