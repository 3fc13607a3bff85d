"""The one target loader of every command: the tokenizer it picks, the one error for a target without one."""

from __future__ import annotations

import pytest

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import char_tokenizer, random_model
from draftsmith.launch.targets import load_target, tokenizer_source


@pytest.fixture(scope="module")
def zoo_layout(tmp_path_factory):
    """``<root>/target`` (a model without tokenizer files) beside ``<root>/tokenizer``, as a zoo lays them out."""
    root = tmp_path_factory.mktemp("zoo_layout")
    random_model("llama", seed=0, layers=1).save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "tokenizer")
    return root


def test_tokenizer_source_prefers_the_option_then_the_targets_own(tiny_pair, zoo_layout):
    assert tokenizer_source(tiny_pair["target"], "elsewhere") == "elsewhere"
    assert tokenizer_source(tiny_pair["target"]) == str(tiny_pair["target"])
    assert tokenizer_source(zoo_layout / "target") == str(zoo_layout / "tokenizer")
    assert tokenizer_source("some-org/some-model") == "some-org/some-model"  # a hub id: its own tokenizer


def test_a_local_target_without_a_tokenizer_is_one_config_error(tmp_path):
    random_model("llama", seed=0, layers=1).save_pretrained(tmp_path / "bare")
    with pytest.raises(ConfigError, match="holds no tokenizer: pass --tokenizer DIR"):
        load_target(str(tmp_path / "bare"))


def test_load_target_returns_the_directory_the_model_in_eval_mode_and_its_tokenizer(zoo_layout):
    target_dir, model, tokenizer = load_target(str(zoo_layout / "target"), dtype="float32", device="cpu")
    assert target_dir == zoo_layout / "target" and not model.training
    assert tokenizer.get_vocab() == char_tokenizer().get_vocab()
