"""Recipe settings typed alike from YAML and the command line (draftsmith.launch.typed_settings): ``max_steps: 2.5`` in
YAML used to reach the Trainer as a float (a traceback deep in training), ``evaluate: "no"`` was true, and a type error
on the command line printed argparse's 120-line usage before it."""

from __future__ import annotations

import math
from enum import Enum

import pytest
import yaml

from draftsmith.common.errors import ConfigError
from draftsmith.common.registry import get_method
from draftsmith.launch.recipe import recipe_main
from draftsmith.launch.recipe_args import parse_recipe_args
from draftsmith.launch.typed_settings import coerce


class Color(Enum):
    RED = "red"


@pytest.mark.parametrize("value, tp, expected", [
    (3, int, 3), ("3", int, 3), (" -4 ", int, -4), (2, float, 2.0), ("1e-3", float, 1e-3), ("inf", float, math.inf),
    (True, bool, True), ("no", bool, False), ("Yes", bool, True), (None, int | None, None), ("5", int | None, 5),
    ("x", str, "x"), ("steps", Color | str, "steps"), ("red", Color | str, "red"), (Color.RED, Color, "red"),
    (["a"], list[str], ["a"]), ("none", None | str | list[str], "none"), ({"a": 1}, dict | str | None, {"a": 1})])
def test_values_are_taken_as_the_command_line_takes_them(value, tp, expected):
    assert coerce(value, tp) == expected


@pytest.mark.parametrize("value, tp", [
    (2.5, int), (2.0, int), ("2.5", int), (True, int), (None, int), ({"a": 1}, int), ([1], int), (float("nan"), float),
    ("nan", float), (True, float), ("maybe", bool), (1, bool), (3, str), (["x"], str), ("blue", Color), (1, list[str]),
    ([1], list[str]), ("x", dict), (10**400, float)])
def test_values_of_the_wrong_type_are_refused(value, tp):
    with pytest.raises(ValueError, match="^expected "):
        coerce(value, tp)


CASES = [("max_steps", 2.5, "expected a whole number"), ("max_length", "abc", "expected a whole number"),
         ("learning_rate", "fast", "expected a number"), ("evaluate", "maybe", "expected true or false"),
         ("draft_length", 1.5, "expected a whole number")]


@pytest.mark.parametrize("key, value, words", CASES)
def test_yaml_and_the_command_line_are_checked_alike(key, value, words, tmp_path):
    config = get_method("distillspec").config
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({key: value}))
    with pytest.raises(ConfigError) as from_yaml:
        parse_recipe_args(config, ["--config", str(path), "--output_dir", str(tmp_path / "o")])
    with pytest.raises(ConfigError) as from_cli:
        parse_recipe_args(config, [f"{key}={value}", "--output_dir", str(tmp_path / "o")])
    assert str(from_yaml.value) == f"{path}: {key}: {words}, got {value!r} (see --help)"
    assert str(from_cli.value) == f"--{key}: {words}, got {str(value)!r} (see --help)"


def test_a_yaml_number_for_a_text_setting_is_refused(tmp_path):
    """On the command line every value is text; in YAML ``divergence: 3`` is a number where text belongs."""
    path = tmp_path / "c.yaml"
    path.write_text("divergence: 3\n")
    with pytest.raises(ConfigError, match=r": divergence: expected text, got 3 \(see --help\)$"):
        parse_recipe_args(get_method("distillspec").config, ["--config", str(path)])


def test_yaml_text_is_converted_as_the_command_line_converts_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('max_length: "64"\nevaluate: "no"\nmax_steps: "3"\n')
    recipe, _, training = parse_recipe_args(get_method("distillspec").config,
                                            ["--config", str(path), "--output_dir", str(tmp_path / "o")])
    assert (recipe.max_length, recipe.evaluate, training.max_steps) == (64, False, 3)


@pytest.mark.parametrize("setting", ["per_device_train_batch_size=-1", "per_device_eval_batch_size=0",
                                     "gradient_accumulation_steps=0"])
def test_batch_sizes_must_be_positive(setting, tmp_path):
    with pytest.raises(ConfigError, match=r"must be at least 1$"):
        parse_recipe_args(get_method("distillspec").config, [setting, "--output_dir", str(tmp_path)])


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary", b"1: 2\n", b"max_steps: [3\n"])
def test_malformed_config_files_are_one_line(content, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        parse_recipe_args(get_method("distillspec").config, ["--config", str(path)])
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("argv", [["--max_steps", "2.5"], ["--max_steps"], ["--config"], ["--evaluate", "maybe"],
                                  ["--dtype", "int3"]])
def test_the_recipe_runner_prints_one_line_and_no_usage(argv, tmp_path, capsys):
    assert recipe_main("distillspec", [*argv, "--output_dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
