"""Recipe settings: the method's config parsed apart from RecipeArguments and TrainingArguments."""

from dataclasses import dataclass, field, fields

import pytest
import transformers
import yaml

from draftsmith.common.errors import ConfigError
from draftsmith.common.registry import REGISTRY
from draftsmith.launch.recipe_args import (
    RECIPE_CONFIGS,
    RecipeArguments,
    config_path,
    parse_recipe_args,
    shipped_configs,
    split_argv,
)


@dataclass
class Clashing:
    learning_rate: float = field(default=0.5, metadata={"help": "the method's own rate (clashes with the trainer's)"})
    width: int = field(default=3, metadata={"help": "a method-only field"})


def test_flat_method_fields_and_prefixed_clashes(tmp_path):
    recipe, method, targs = parse_recipe_args(Clashing, ["--output_dir", str(tmp_path), "learning_rate=0.1",
                                                         "method.learning_rate=0.25", "width=7", "max_length=32"])
    assert targs.learning_rate == pytest.approx(0.1) and method.learning_rate == 0.25
    assert method.width == 7 and recipe.max_length == 32


def test_yaml_flat_keys_go_to_the_trainer_and_the_method_mapping_to_the_method(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"learning_rate": 0.01, "width": 5, "method": {"learning_rate": 0.3},
                                   "output_dir": str(tmp_path)}))
    _, method, targs = parse_recipe_args(Clashing, ["--config", str(cfg)])
    assert targs.learning_rate == pytest.approx(0.01) and method.learning_rate == 0.3 and method.width == 5
    _, method, _ = parse_recipe_args(Clashing, ["--config", str(cfg), "--method.width", "9"])
    assert method.width == 9  # the command line beats the file
    cfg.write_text(yaml.safe_dump({"method": {"depth": 2}}))
    with pytest.raises(ConfigError, match="unknown setting.*depth"):
        parse_recipe_args(Clashing, ["--config", str(cfg), "--output_dir", str(tmp_path)])


def test_split_argv_keeps_values_with_their_flags():
    main, method = split_argv(["--output_dir", "o", "--width", "4", "--method.learning_rate", "1e-3", "--evaluate"],
                              {"width", "learning_rate"}, {"output_dir", "learning_rate", "evaluate"})
    assert main == ["--output_dir", "o", "--evaluate"] and method == ["--width", "4", "--learning_rate", "1e-3"]


def test_no_registered_method_field_shadows_a_trainer_flag_unnoticed():
    """Built-in methods keep their fields distinct from RecipeArguments and TrainingArguments, so their flat
    form always reaches them (a clash would still work, but only prefixed)."""
    main = {f.name for f in fields(RecipeArguments)} | {f.name for f in fields(transformers.TrainingArguments)}
    assert not {f.name for f in fields(RecipeArguments)} & {f.name for f in fields(transformers.TrainingArguments)}
    for name in REGISTRY.names(trained=True):
        clash = {f.name for f in fields(REGISTRY.get(name).config)} & main
        assert not clash, f"{name}: {clash}"


def test_dtype_auto_resolves_to_float32_on_the_cpu_without_mixed_precision(tmp_path):
    recipe, _, targs = parse_recipe_args(None, ["--output_dir", str(tmp_path)])
    assert recipe.dtype == "float32" and not targs.bf16 and not targs.fp16


def test_a_16_bit_dtype_trains_under_its_mixed_precision(tmp_path):
    recipe, _, targs = parse_recipe_args(None, ["--output_dir", str(tmp_path), "dtype=bfloat16"])
    assert recipe.dtype == "bfloat16" and targs.bf16 and targs.mixed_precision == "bf16"
    with pytest.raises(ConfigError, match="dtype=bfloat16 with fp16=true"):
        parse_recipe_args(None, ["--output_dir", str(tmp_path), "dtype=bfloat16", "--fp16", "true"])


def test_a_config_that_sets_a_key_twice_is_refused_with_both_lines(tmp_path):
    from draftsmith.launch.recipe_args import read_yaml_config

    path = tmp_path / "twice.yaml"
    path.write_text("max_steps: 10\nlearning_rate: 1.0e-3\nmax_steps: 20\n")
    with pytest.raises(ConfigError, match=r"sets 'max_steps' twice \(lines 1 and 3\): keep one"):
        read_yaml_config(path)
    path.write_text("max_steps: 10\nnested: {a: 1, b: 2}\n")
    assert read_yaml_config(path) == {"max_steps": 10, "nested": {"a": 1, "b": 2}}


def test_a_value_that_starts_with_a_dash_is_a_value(tmp_path):
    from draftsmith.launch.recipe_args import parse_recipe_args
    from draftsmith.trainers.dflash.trainer import DFlashConfig

    _, method, _ = parse_recipe_args(DFlashConfig, ["layers=-50,1", "--output_dir", str(tmp_path)])
    assert method.layers == "-50,1"  # refused later, naming the layers, not "expected one argument"


@pytest.mark.parametrize("name", shipped_configs())
def test_every_shipped_config_resolves_by_name_and_its_header_runs_it(name, tmp_path):
    """The header's first line is the command that runs the config; the named method's settings parse from it."""
    path = config_path(name)
    assert path == RECIPE_CONFIGS / f"{name}.yaml"
    header = path.read_text().splitlines()[0]
    words = header.split()
    assert words[:3] == ["#", "draftsmith", "train"] and words[4:6] == ["--config", name], header
    spec = REGISTRY.get(words[3])
    _, method, _ = parse_recipe_args(spec.config, ["--config", name, "--output_dir", str(tmp_path)],
                                     fixed=spec.config_defaults)
    assert all(getattr(method, k) == v for k, v in spec.config_defaults.items())


def test_a_config_name_that_is_neither_a_file_nor_shipped_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="no such file.*medusa_tiny"):
        config_path("medusa_tinyy")


def test_a_setting_the_method_fixes_is_refused_when_set_otherwise(tmp_path):
    spec = REGISTRY.get("peagle")
    with pytest.raises(ConfigError, match="fixes to peagle"):
        parse_recipe_args(spec.config, ["--config", "eagle3_tiny", "--output_dir", str(tmp_path)],
                          fixed=spec.config_defaults)
    with pytest.raises(ConfigError, match="variant=eagle3.*fixes variant=peagle"):
        parse_recipe_args(spec.config, ["--config", "peagle_tiny", "--output_dir", str(tmp_path), "variant=eagle3"],
                          fixed=spec.config_defaults)
