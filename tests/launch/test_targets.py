"""The one target loader of every command: the tokenizer it picks, the one error for a target without one, and the
one resolver of --target/--draft/--tokenizer (the zoo's layout, ``~``, GGUF files, hub ids), whose errors name the
option at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith.common.errors import ConfigError
from draftsmith.common.registry import get_method
from draftsmith.data.tiny_models import char_tokenizer, random_model
from draftsmith.launch.recipe import resolve_models
from draftsmith.launch.recipe_args import RecipeArguments
from draftsmith.launch.targets import load_target, resolve_model_arg, tokenizer_source


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


# ---------------------------------------------------------------------------------------- the one resolver


@pytest.fixture(scope="module")
def built_zoo(tmp_path_factory):
    """A zoo directory as ``draftsmith zoo build`` leaves it: manifest.json beside tokenizer/, target/ and draft/."""
    root = tmp_path_factory.mktemp("zoo") / "tiny"
    for role, seed in (("target", 0), ("draft", 1)):
        random_model("llama", seed=seed, layers=1).save_pretrained(root / role)
    char_tokenizer().save_pretrained(root / "tokenizer")
    (root / "manifest.json").write_text("{}")
    return root


def test_the_zoos_own_directories_and_the_zoo_itself_resolve(built_zoo):
    assert resolve_model_arg(built_zoo / "target") == str(built_zoo / "target")
    assert resolve_model_arg(built_zoo, "--target") == str(built_zoo / "target")
    assert resolve_model_arg(built_zoo, "--draft", "draft") == str(built_zoo / "draft")
    assert tokenizer_source(built_zoo / "draft") == str(built_zoo / "tokenizer")
    assert tokenizer_source(built_zoo / "target", built_zoo) == str(built_zoo / "tokenizer")


def test_a_home_relative_path_is_expanded(built_zoo, monkeypatch):
    """``target=~/...`` reaches the recipe unexpanded (no shell expands ``~`` after ``=``)."""
    monkeypatch.setenv("HOME", str(built_zoo.parent))
    assert resolve_model_arg("~/tiny/target") == str(built_zoo / "target")
    assert tokenizer_source("~/tiny/target") == str(built_zoo / "tokenizer")


def test_the_recipe_takes_the_zoos_directories_with_a_home_relative_path(built_zoo, monkeypatch):
    monkeypatch.setenv("HOME", str(built_zoo.parent))
    paths = resolve_models(RecipeArguments(target="~/tiny/target", draft="~/tiny"), get_method("distillspec"))
    assert paths == {"tokenizer": None, "target": str(built_zoo / "target"), "draft": str(built_zoo / "draft")}
    assert tokenizer_source(paths["target"], paths["tokenizer"]) == str(built_zoo / "tokenizer")


@pytest.mark.parametrize("value, words", [
    ("/no/such/dir", "does not exist"), ("./missing", "does not exist"), ("a/b/c", "does not exist"),
    ("model.gguf", "does not exist"), ("bad repo!", "does not exist"), ("", "is not a model")])
def test_what_is_no_model_is_one_config_error_naming_the_option(value, words):
    with pytest.raises(ConfigError) as err:
        resolve_model_arg(value, "--draft", "draft")
    assert str(err.value).startswith("--draft") and words in str(err.value)


def test_a_directory_without_a_config_and_a_file_that_is_no_gguf_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="without config.json"):
        resolve_model_arg(tmp_path)
    with pytest.raises(ConfigError, match="not a .gguf model"):
        resolve_model_arg(tmp_path / "notes.txt")
    with pytest.raises(ConfigError, match=r"--tokenizer .* holds no tokenizer"):
        tokenizer_source("x", tmp_path)


def test_a_hub_id_that_cannot_be_had_names_the_option(monkeypatch):
    import huggingface_hub
    import transformers

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(huggingface_hub, "model_info", lambda name, timeout: None)  # the probe passes, the load fails
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", offline)
    with pytest.raises(ConfigError, match=r"^--target some-org/some-model is not a local path, and as a hub id"):
        resolve_model_arg("some-org/some-model")
    assert resolve_model_arg("some-org/some-model", check_hub=False) == "some-org/some-model"
    assert resolve_model_arg("smollm2-135m") == "smollm2-135m"  # a named target, imported when it loads


def test_a_hub_id_is_probed_once_before_any_download(monkeypatch):
    """A mistyped --target without network took 23 s (the download's five retries): one probe request decides."""
    import huggingface_hub
    import transformers
    from huggingface_hub import errors

    calls = []

    def unreachable(name, timeout):
        calls.append((name, timeout))
        raise ConnectionError("[Errno -2] Name or service not known")

    def download(*args, **kwargs):
        raise AssertionError("no download after a failed probe")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", download)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: None)
    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    with pytest.raises(ConfigError, match=r"^--target tiny-targte is not a local path.*hub cannot be reached: \[Errno"):
        resolve_model_arg("tiny-targte")
    assert calls == [("tiny-targte", 10.0)]

    def missing(name, timeout):
        err = errors.RepositoryNotFoundError.__new__(errors.RepositoryNotFoundError)  # as the hub's 404 raises it
        Exception.__init__(err, "404 Client Error")
        raise err

    monkeypatch.setattr(huggingface_hub, "model_info", missing)
    with pytest.raises(ConfigError, match=r"\(no such model repository on the hub, or it is private\)"):
        resolve_model_arg("org/tiny-targte", "--draft")


def test_a_cached_hub_id_needs_no_network(monkeypatch, tmp_path):
    import huggingface_hub

    def no_network(name, timeout):
        raise AssertionError("a cached model must not be probed")

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: str(tmp_path / name))
    monkeypatch.setattr(huggingface_hub, "model_info", no_network)
    from draftsmith.launch.targets import hub_reason

    assert hub_reason("org/cached") is None


class _Loaded(Exception):
    """Raised by the stand-in loader: the command got as far as loading its target."""


@pytest.mark.parametrize("argv", [["tune", "--artefact", "ART"], ["exit-layer"], ["draft-verify"]],
                         ids=["tune", "exit-layer", "draft-verify"])
def test_commands_that_measure_load_their_target_where_and_as_asked(monkeypatch, tmp_path, argv):
    """tune, the exit-layer choice and the Draft & Verify search time the target: they take --device and --dtype as
    eval does (a tuning on CPU timings would be applied on the GPU), and refuse a device that is not there."""
    from draftsmith.launch import draft_verify, targets
    from draftsmith.launch.cli import main

    got = {}

    def loader(*args, **kwargs):
        got.update(kwargs)
        raise _Loaded

    def run(extra):
        args = [a.replace("ART", str(tmp_path)) for a in argv] + extra
        if args[0] == "draft-verify":
            return draft_verify.main([*args[1:], "--output_dir", str(tmp_path / "dv")])
        return main(args)

    monkeypatch.setattr(targets, "load_target", loader)
    monkeypatch.setattr("draftsmith.launch.eval_cli.artefact_target", lambda artefact, target: None)  # no artefact read
    with pytest.raises(_Loaded):
        run(["--device", "cpu", "--dtype", "bfloat16"])
    assert (got["device"], got["dtype"]) == ("cpu", "bfloat16")
    with pytest.raises(_Loaded):
        run([])
    assert (got["device"], got["dtype"]) == ("cpu", "float32")  # auto on a machine without CUDA
    assert run(["--device", "tpu9"]) == 2


def test_a_relative_model_directory_resolves_to_an_absolute_path(tiny_pair, tmp_path, monkeypatch):
    """A manifest records the target as resolved, so an export or eval run from another directory finds it."""
    from draftsmith.launch.targets import resolve_model_arg

    monkeypatch.chdir(tiny_pair["target"].parent)
    resolved = resolve_model_arg(tiny_pair["target"].name)
    assert resolved == str(tiny_pair["target"].absolute())
    monkeypatch.chdir(tmp_path)
    assert Path(resolved).is_dir()
