"""A named real target (``smollm2-135m``) as ``--target``: the recipe and ``draftsmith eval`` default its draft to
the smollm2 zoo's. A fake zoo in a temporary home stands in for the real one (nothing is built or downloaded)."""

from __future__ import annotations

import pytest

from draftsmith.common.errors import ConfigError
from draftsmith.common.io import atomic_write_json
from draftsmith.common.paths import zoo_dir
from draftsmith.common.registry import get_method
from draftsmith.data.zoo import ZOO_FOR_TARGET, ZOO_SIZES, zoo_size_for_target
from draftsmith.launch.cli import build_parser
from draftsmith.launch.eval_cli import default_draft_zoo
from draftsmith.launch.recipe import resolve_models
from draftsmith.launch.recipe_args import RecipeArguments
from draftsmith.launch.zoo_cli import SIZES


@pytest.fixture
def fake_smollm2_zoo(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    out = zoo_dir("smollm2")
    (out / "draft").mkdir(parents=True)
    atomic_write_json(out / "manifest.json", {"size": "smollm2"})
    return out


def test_the_recipe_takes_the_named_targets_zoo_draft(fake_smollm2_zoo):
    paths = resolve_models(RecipeArguments(target="smollm2-135m"), get_method("distillspec"))
    assert paths == {"tokenizer": None, "target": "smollm2-135m", "draft": str(fake_smollm2_zoo / "draft")}
    mine = fake_smollm2_zoo.parent / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    explicit = resolve_models(RecipeArguments(target="smollm2-135m", draft=str(mine)), get_method("distillspec"))
    assert explicit["draft"] == str(mine)


def test_other_targets_still_need_a_draft(tmp_path):
    with pytest.raises(ConfigError, match="--draft"):
        resolve_models(RecipeArguments(target=str(tmp_path)), get_method("distillspec"))


def test_zoo_sizes_and_named_targets_agree():
    from draftsmith.data.zoo import ZOO_FAMILIES, family_size
    from draftsmith.launch.zoo_cli import FAMILIES

    assert FAMILIES == ZOO_FAMILIES  # the CLI's families without importing the zoo
    assert set(SIZES) | {family_size("tiny", f) for f in FAMILIES} == set(ZOO_SIZES)  # every built-in zoo by a flag
    with pytest.raises(ConfigError, match="size tiny"):
        family_size("small", "qwen3")
    assert all(size in ZOO_SIZES for size in ZOO_FOR_TARGET.values())
    assert zoo_size_for_target("smollm2-135m") == "smollm2" and zoo_size_for_target("/some/dir") is None
    args = build_parser().parse_args(["eval", "--zoo", "smollm2", "--draft-vocab", "full"])
    assert args.zoo == "smollm2" and args.draft_vocab == "full"


@pytest.mark.parametrize("argv, zoo", [
    ([], "smollm2"), (["--method", "draft"], "smollm2"), (["--artefact", "runs/eagle/artefact"], None),
    (["--method", "pld"], None), (["--draft", "/d"], None)])
def test_eval_builds_the_named_targets_zoo_only_for_its_default_draft(argv, zoo):
    """An artefact (EAGLE heads, a distilled draft) or another method never waits on the zoo draft's build."""
    args = build_parser().parse_args(["eval", "--target", "smollm2-135m", *argv])
    assert default_draft_zoo(args, "smollm2-135m") == zoo
    assert default_draft_zoo(build_parser().parse_args(["eval"]), None) is None
