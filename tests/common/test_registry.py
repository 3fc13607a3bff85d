"""The method registry: built-in entries, references, registration and refusals."""

import ast
from pathlib import Path

import pytest

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import DRAFT_LENGTH, TREE, EvalOption, merge_options, resolve_option
from draftsmith.common.registry import (
    ARTEFACT_KINDS,
    MODEL_ROLES,
    REGISTRY,
    MethodSpec,
    Registry,
    default_method,
    eval_flags,
    export_formats,
    method_commands,
    registered,
    resolve,
)
from draftsmith.launch.recipe_args import RECIPE_CONFIGS as SHIPPED

ROOT = Path(__file__).resolve().parents[2]


def test_builtin_methods_are_declared_with_real_objects():
    assert {"ar", "draft", "pld", "distillspec", "peagle"} <= set(REGISTRY.names())
    assert set(REGISTRY.names(eval_method=True)) >= {"ar", "draft", "pld"}
    assert {"distillspec", "medusa", "peagle"} <= set(REGISTRY.names(trained=True))
    assert not {"ar", "draft", "pld"} & set(REGISTRY.names(trained=True))
    for name in REGISTRY.names():
        spec = REGISTRY.get(name)
        assert callable(spec.proposer) and spec.artefact_kind in ARTEFACT_KINDS
        if spec.trained:
            assert isinstance(spec.config, type) and isinstance(spec.trainer, type) and callable(spec.trainable)
            assert spec.memory and all(callable(shape) for shape in spec.memory.values())
            assert (SHIPPED / f"{spec.default_config}.yaml").is_file()
        assert all(callable(f) for f in (*spec.export_formats.values(), *spec.engine_configs.values()))
        if spec.train is not None:
            assert callable(resolve(spec.train))
    assert default_method() == "draft"


def test_no_shared_module_names_a_method():
    """Shared layers never switch on a method: no string constant in common/, launch/, inference/core, inference/
    evaluation, kernels/ or data/ is a method's (or a memory variant's) name. Exempt: the composition root, a method's
    own command modules (named by its spec), and the words that are also model roles or the AR baseline's label."""
    names = set(REGISTRY.names()) | {v for n in REGISTRY.names() for v in REGISTRY.get(n).memory}
    names -= {*MODEL_ROLES, "ar"}
    own = {"draftsmith.launch.methods"} | {
        ref.split(":")[0] for n in REGISTRY.names() for spec in [REGISTRY.get(n)]
        for ref in (*spec.commands.values(), *spec.data_commands.values(), *([spec.train] if spec.train else []))}
    found = []
    for folder in ("common", "launch", "inference/core", "inference/evaluation", "kernels", "data"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = "draftsmith." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if module in own:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}" for node in ast.walk(ast.parse(
                path.read_text())) if isinstance(node, ast.Constant) and node.value in names]
    assert not found, "shared modules name methods: " + "; ".join(found)


def test_registration_is_scoped_and_refuses_duplicates():
    spec = MethodSpec(name="scoped", summary="", proposer=lambda ctx: None)
    with registered(spec):
        assert REGISTRY.get("scoped") is spec
        with pytest.raises(ConfigError, match="already registered"):
            REGISTRY.register(spec)
    with pytest.raises(ConfigError, match="not known"):
        REGISTRY.get("scoped")


@pytest.mark.parametrize("kwargs, match", [
    ({"artefact_kind": "tarball"}, "artefact_kind"),
    ({"models": ("draft",)}, "must include 'target'"),
    ({"config": object}, "both config and trainer"),
])
def test_bad_specs_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MethodSpec(name="bad", summary="", proposer=lambda ctx: None, **kwargs)


def test_references_name_module_and_attribute():
    assert resolve("draftsmith.common.registry:Registry") is Registry
    with pytest.raises(ConfigError, match="package.module:attribute"):
        resolve("draftsmith.common.registry")


def test_every_eval_option_resolves_command_line_then_artefact_then_declared_default():
    declared = {o.name: o for o in (DRAFT_LENGTH.default_to(5), TREE.default_to("dynamic"))}
    assert resolve_option("draft_length", declared, {}, None, "m") == 5
    assert resolve_option("draft_length", declared, {"draft_length": None}, {"proposer": {"draft_length": 3}}, "m") == 3
    assert resolve_option("draft_length", declared, {"draft_length": 2}, {"proposer": {"draft_length": 3}}, "m") == 2
    with pytest.raises(ConfigError, match="does not declare"):
        resolve_option("tree_depth", declared, {}, None, "m")


def test_builtin_options_make_one_flag_per_name_with_each_methods_default():
    flags = eval_flags()
    assert flags["draft_length"].defaults["jacobi"] == 16 and flags["draft_length"].defaults["eagle"] == 5
    assert flags["confidence_threshold"].option.cli_flag == "--draft-confidence"
    assert "seed" not in flags and "threshold" not in flags  # artefact-only settings have no flag
    assert "jacobi 16" in flags["draft_length"].help()
    every = {o.name for n in REGISTRY.names() for o in REGISTRY.get(n).eval_options}
    assert every - set(flags) == {"seed", "threshold"}


def test_methods_that_share_an_option_name_must_declare_it_alike():
    with pytest.raises(ConfigError, match="declare it alike"):
        merge_options([("a", (EvalOption("k", int),)), ("b", (EvalOption("k", float),))])
    merged = merge_options([("a", (EvalOption("k", str, choices=("x",)),)), ("b", (EvalOption("k", str, choices=("y",)),))])
    assert merged["k"].choices == ("x", "y")
    with pytest.raises(ConfigError, match="declared twice"):
        MethodSpec(name="bad", summary="", proposer=lambda ctx: None, eval_options=(DRAFT_LENGTH, DRAFT_LENGTH))


def test_method_commands_and_export_formats_come_from_the_entries():
    assert method_commands() == {"exit-layer": "draftsmith.launch.exit_cli"}
    assert method_commands("data_commands") == {"jacobi": "draftsmith.launch.jacobi_cli"}
    eagles = ("eagle", "peagle")
    assert export_formats() == {"vllm-medusa": ("medusa",), "eagle3": eagles, "vllm-eagle": eagles,
                                "sglang-eagle": eagles, "speculators": eagles, "vllm-dflash": ("dflash",),
                                "vllm-dspark": ("dspark",)}
    clash = MethodSpec(name="clash", summary="", proposer=lambda ctx: None, commands={"exit-layer": "elsewhere"})
    with registered(clash), pytest.raises(ConfigError, match="another method adds too"):
        method_commands()


# an evaluation option that shares a name with a config field but not its meaning or encoding
DIFFERENT = {("distillspec", "draft_vocab"): "training: keep or refit the draft's vocabulary; decoding: auto or full",
             ("layerskip", "exit_layer"): "training: 0 = choose after training; decoding: unset = the artefact's",
             ("dflash", "draft_length"): "training: 0 = the whole block; decoding: unset = the artefact's",
             ("dspark", "draft_length"): "training: 0 = the whole block; decoding: unset = the artefact's",
             ("peagle", "tree"): "EagleConfig's dynamic tree is EAGLE's; a P-EAGLE block decodes as a chain"}


def test_a_trained_methods_decoding_defaults_come_from_its_config():
    import dataclasses

    for name in REGISTRY.names(trained=True):
        spec = REGISTRY.get(name)
        fields = {f.name: f.default for f in dataclasses.fields(spec.config)}
        for option in spec.eval_options:
            if option.name in fields and (name, option.name) not in DIFFERENT:
                assert option.default == fields[option.name], (name, option.name)
