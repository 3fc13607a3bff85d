"""Fuzzed recipe settings (reliability suite; see conftest.py): YAML configs with wrong types, unknown keys,
negative/zero numbers and wrong nesting, and the same through ``key=value`` / ``--key value`` overrides, given to
``draftsmith train``, ``recipe_main`` and the ``recipes/<method>.py`` scripts. Every outcome is exit 2 with one
``error:`` line, or an accepted config; the expensive part (loading the models) is stubbed away."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("distillspec", "medusa", "eagle", "dflash", "layerskip", "bita", "cllm")
ENTRIES = ("train", "recipe_main", "script")
RARE_TRAINER_KEYS = ("gradient_accumulation_steps", "warmup_steps", "weight_decay", "max_grad_norm", "num_train_epochs",
                     "lr_scheduler_type", "optim", "seed", "data_seed", "save_total_limit", "logging_dir", "bf16", "fp16",
                     "deepspeed", "resume_from_checkpoint", "dataloader_num_workers", "label_names", "eval_delay",
                     "save_strategy", "report_to", "gradient_checkpointing", "torch_compile", "use_cpu")


def junk_values():
    """Values of every YAML type, edge numbers first."""
    numbers = st.one_of(st.sampled_from([0, -1, -2, 1, 2**31, -(2**63), 10**30]), st.integers(-10**6, 10**6),
                        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, -1e-9, 1e308]))
    words = st.one_of(st.sampled_from(["", "abc", "1e-3", "-5", "none", "null", "yes", "~", "[1]", "{a: 1}", "nan",
                                       "tvd", "latest", "auto", "cpu", "../../etc/passwd", "\x00", "é"]),
                      st.text(max_size=12))
    scalars = st.one_of(numbers, words, st.booleans(), st.none())
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=6)


def base_config(method: str) -> dict:
    return yaml.safe_load((ROOT / "launch" / "configs" / "recipes" / f"{method}_test.yaml").read_text())


def method_fields(method: str) -> list[str]:
    from draftsmith.common.registry import get_method

    return sorted(f.name for f in dataclasses.fields(get_method(method).config))


def recipe_fields() -> list[str]:
    from draftsmith.launch.recipe_args import RecipeArguments

    return sorted(f.name for f in dataclasses.fields(RecipeArguments) if f.name not in ("config", "target", "draft",
                                                                                        "dataset", "tokenizer"))


@st.composite
def settings_edits(draw, method: str):
    """``[(key, value, where)]``: a known key (the config's own, a recipe or method field, a trainer flag) or an
    unknown one; ``where`` is top (flat), method (the ``method:`` mapping) or nested (under another key)."""
    known = sorted(base_config(method)) + recipe_fields() + method_fields(method)
    key = st.one_of(st.sampled_from(known), st.sampled_from(RARE_TRAINER_KEYS),
                    st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
                    st.sampled_from(["method", "method.divergence", "Max_Steps", "max-steps", "", "-", "--x"]))
    edit = st.tuples(key, junk_values(), st.sampled_from(["top", "top", "top", "method", "nested"]))
    return draw(st.lists(edit, min_size=1, max_size=3))


@st.composite
def yaml_files(draw, method: str) -> bytes:
    """A recipe config: the method's test config with a few edits, or a whole file gone wrong."""
    shape = draw(st.sampled_from(["edited"] * 6 + ["not a mapping", "bad yaml", "binary", "empty", "tagged"]))
    if shape == "not a mapping":
        return yaml.safe_dump(draw(st.one_of(st.lists(junk_values(), max_size=3), junk_values()))).encode()
    if shape == "bad yaml":
        return draw(st.sampled_from([b"max_steps: [3\n", b"a: b: c\n", b"\tmax_steps: 3\n", b"{", b"- :\n  - ]",
                                     b"max_steps: 3\nmax_steps: 4\n", b"key: *missing\n", b"%YAML 9.9\n---\na: 1\n"]))
    if shape == "binary":
        return draw(st.binary(min_size=1, max_size=64))
    if shape == "empty":
        return draw(st.sampled_from([b"", b"\n", b"# only a comment\n", b"---\n", b"null\n"]))
    if shape == "tagged":
        return b"max_steps: !!python/object/apply:os.system ['true']\n"
    config = base_config(method)
    for key, value, where in draw(settings_edits(method)):
        if where == "method":
            config.setdefault("method", {})
            if isinstance(config["method"], dict):
                config["method"][key] = value
            else:
                config["method"] = value
        elif where == "nested":
            config[key] = {draw(st.sampled_from(sorted(base_config(method)))): value}
        else:
            config[key] = value
    try:
        return yaml.safe_dump(config, allow_unicode=True).encode()
    except yaml.YAMLError:
        return b"max_steps: [3\n"


@st.composite
def overrides(draw, method: str) -> list[str]:
    """Command-line settings: ``key=value`` and ``--key value`` forms, with junk values and malformed tokens."""
    tokens = []
    for key, value, _ in draw(settings_edits(method)):
        text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
        text = text.removesuffix("\n...").strip()
        form = draw(st.sampled_from(["kv", "flag", "prefixed", "bare", "orphan"]))
        tokens += {"kv": [f"{key}={text}"], "flag": [f"--{key}", text], "prefixed": [f"method.{key}={text}"],
                   "bare": [f"--{key}"], "orphan": [text]}[form]
    return tokens


_SCRIPTS: dict[str, object] = {}


def script_main(method: str):
    if method not in _SCRIPTS:
        spec = importlib.util.spec_from_file_location(f"reliability_recipe_{method}", ROOT / "recipes" / f"{method}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SCRIPTS[method] = module.main
    return _SCRIPTS[method]


def run_entry(harness, entry: str, method: str, argv: list[str]):
    """One recipe run through ``entry``: ``draftsmith train``, ``recipe_main`` or the script (``sys.argv``)."""
    from draftsmith.launch.cli import main
    from draftsmith.launch.recipe import recipe_main

    if entry == "train":
        return harness.run_captured(lambda: main(["train", method, *argv]))
    if entry == "recipe_main":
        return harness.run_captured(lambda: recipe_main(method, argv))

    def script():
        saved = sys.argv
        sys.argv = [f"recipes/{method}.py", *argv]
        try:
            return script_main(method)()
        finally:
            sys.argv = saved

    return harness.run_captured(script)


def reproducer(harness, entry: str, method: str, argv: list[str], pair: dict, case: Path,
               files: dict[Path, bytes]) -> str:
    prefix = {"train": f"draftsmith train {method}", "recipe_main": f"python recipes/{method}.py",
              "script": f"python recipes/{method}.py"}[entry]
    line = harness.command_line(argv, prefix=prefix).replace(str(pair["target"].parent), "$PAIR")
    line = line.replace(f"{case}/", "")
    return " && ".join([*(harness.file_recipe(p, d) for p, d in files.items()), line]) + \
        "   # $PAIR: tests/common/tiny_pair.py's write_pair"


@pytest.mark.fuzz(60, 400)
def test_recipe_configs_fail_in_one_line_or_are_accepted(harness, pair, examples):
    from draftsmith.common.models import load_model

    @given(method=st.sampled_from(METHODS), entry=st.sampled_from(ENTRIES), data=st.data())
    def one(method, entry, data):
        text = data.draw(yaml_files(method), label="config")
        case = harness.fresh("config")
        config = case / "config.yaml"
        config.write_bytes(text)
        argv = harness.recipe_argv(pair, case / "out", method, config)
        outcome = run_entry(harness, entry, method, argv)
        harness.check("recipe config", outcome, case / "out", reproducer(harness, entry, method, argv, pair, case,
                                                                         {Path("config.yaml"): text}))

    with harness.swapped(load_model, harness.accept):
        harness.explore(one, examples)


@pytest.mark.fuzz(40, 300)
def test_recipe_overrides_fail_in_one_line_or_are_accepted(harness, pair, examples):
    from draftsmith.common.models import load_model

    @given(method=st.sampled_from(METHODS), entry=st.sampled_from(ENTRIES), data=st.data())
    def one(method, entry, data):
        extra = data.draw(overrides(method), label="overrides")
        case = harness.fresh("override")
        argv = [*harness.recipe_argv(pair, case / "out", method), *extra]
        outcome = run_entry(harness, entry, method, argv)
        harness.check("recipe override", outcome, case / "out", reproducer(harness, entry, method, argv, pair, case, {}))

    with harness.swapped(load_model, harness.accept):
        harness.explore(one, examples)
