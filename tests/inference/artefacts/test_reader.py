"""The one artefact reader: every file of an artefact hashed when it is saved and verified when it is read, the
manifest's fields and kind checked against the method registry, the target's identity checked where one is given,
and each fault one line naming the file or field and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.models import target_identity
from draftsmith.data.tiny_models import char_tokenizer, random_model
from draftsmith.inference.artefacts.export import export_artefact
from draftsmith.inference.artefacts.manifest import (
    resave_manifest,
    rewrite_manifest,
    write_artefact,
)
from draftsmith.inference.artefacts.medusa import load_heads_artefact
from draftsmith.inference.artefacts.reader import FORMAT, PREVIOUS_FORMAT, read_manifest
from draftsmith.inference.drafters.eagle import EagleHead
from draftsmith.inference.drafters.medusa import MedusaHeads
from draftsmith.inference.methods import load_artefact


@pytest.fixture(scope="module")
def target():
    return random_model("llama", 0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, target) -> dict[str, Path]:
    """A draft-model, a Medusa and an EAGLE artefact of ``target``, written once; tests edit copies."""
    root = tmp_path_factory.mktemp("saved")
    tokenizer = char_tokenizer()
    ident = target_identity(target, tokenizer, "tiny-target")
    write_artefact(root / "draft", "draft_model", method="distillspec", target=ident,
                   proposer={"draft_length": 3, "model_dir": "draft"}, model=random_model("llama", 1, layers=1),
                   tokenizer=tokenizer)
    torch.manual_seed(0)
    heads = MedusaHeads(hidden=32, vocab=128, heads=2, layers=1, shared_lm_head=True)
    write_artefact(root / "medusa", "heads", method="medusa", target=ident, proposer={"tree": "chain"},
                   tensors=heads.state_dict(), config=heads.artefact_config())
    head = EagleHead.for_target(target)
    write_artefact(root / "eagle", "heads", method="eagle", target=ident, proposer={"tree": "chain"},
                   tensors=head.state_dict(), config=head.artefact_config())
    return {name: root / name for name in ("draft", "medusa", "eagle")}


@pytest.fixture
def copy(saved, tmp_path):
    def make(name: str) -> Path:
        return Path(shutil.copytree(saved[name], tmp_path / name))
    return make


def edit_manifest(directory: Path, **changes) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def flip_byte(path: Path, at: int = -3) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


# -- every file hashed at save time, verified at read time -----------------------------------------------------------


def test_every_file_is_hashed_configs_and_tokenizer_included(saved):
    manifest = read_manifest(saved["draft"])
    assert manifest["format"] == FORMAT
    assert {"draft/config.json", "draft/model.safetensors", "draft/tokenizer.json",
            "draft/generation_config.json"} <= set(manifest["files"])
    assert set(manifest["weights"]) == {"draft/model.safetensors"}
    assert set(read_manifest(saved["medusa"])["files"]) == {"heads.safetensors", "heads_config.json"}


@pytest.mark.parametrize("name", ["draft/config.json", "draft/tokenizer.json", "draft/model.safetensors"])
def test_an_edited_file_is_refused_naming_it(copy, target, name):
    art = copy("draft")
    path = art / name
    if name.endswith(".json"):  # an edited norm eps: loaded silently before, tau halved
        path.write_text(path.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 0.5').replace("<unk>", "<UNK>"))
    else:
        flip_byte(path)
    with pytest.raises(ArtefactError, match="does not match its sha256") as err:
        load_artefact(art, target)
    assert name in one_line(err) and "re-run the training" in str(err.value) and "restore" in str(err.value)


def test_a_missing_file_is_refused_naming_it(copy):
    art = copy("draft")
    (art / "draft" / "tokenizer_config.json").unlink()
    with pytest.raises(ArtefactError, match="missing") as err:
        read_manifest(art)
    assert "draft/tokenizer_config.json" in one_line(err)


@pytest.mark.parametrize("added, refused", [("draft/extra.safetensors", True), ("draft/custom.py", True),
                                            ("heads_config.json", True), ("notes.md", False),
                                            ("eval/report.json", False), (".DS_Store", False)])
def test_an_added_file_is_refused_where_a_loader_would_read_it(copy, added, refused):
    art = copy("draft")
    (art / added).parent.mkdir(parents=True, exist_ok=True)
    (art / added).write_text("{}")
    if not refused:
        read_manifest(art)
        return
    with pytest.raises(ArtefactError, match="not in the artefact's manifest") as err:
        read_manifest(art)
    assert added in one_line(err)


# -- the weights map: empty or missing is refused where the kind carries weights ------------------------------------


@pytest.mark.parametrize("changes", [{"weights": {}}, {"weights": {}, "files": {}}, {"files": {}}])
def test_an_emptied_weights_or_files_map_does_not_switch_verification_off(copy, target, changes):
    art = copy("draft")
    edit_manifest(art, **changes)
    flip_byte(art / "draft" / "model.safetensors")
    with pytest.raises(ArtefactError) as err:
        load_artefact(art, target)
    assert "weights" in one_line(err)


def test_a_missing_weights_field_is_refused(copy):
    art = copy("medusa")
    manifest = json.loads((art / "manifest.json").read_text())
    del manifest["weights"]
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtefactError, match="'weights'"):
        read_manifest(art)


def test_a_weightless_kind_reads_with_no_files(tmp_path, target):
    art = tmp_path / "dv"
    write_artefact(art, "none", method="draft-verify", target=target_identity(target, None),
                   proposer={"skip_attention": [1], "skip_mlp": [], "draft_length": 4})
    assert read_manifest(art)["files"] == {}
    (art / "stray.json").write_text("{}")
    with pytest.raises(ArtefactError, match="stray.json"):
        read_manifest(art)


# -- kind and method against the registry; the manifest's shape ------------------------------------------------------


def test_an_edited_kind_is_refused(copy, target):
    art = copy("eagle")
    edit_manifest(art, kind="none")
    with pytest.raises(ArtefactError, match="'kind' is 'none', but eagle artefacts are 'heads'") as err:
        load_artefact(art, target)
    one_line(err)


def test_a_method_of_another_kind_is_refused(copy):
    art = copy("eagle")
    edit_manifest(art, method="distillspec")
    with pytest.raises(ArtefactError, match="distillspec artefacts are 'draft_model'"):
        read_manifest(art)


def test_writing_a_kind_the_method_does_not_declare_is_refused_before_anything_is_written(tmp_path, target):
    with pytest.raises(ArtefactError, match="medusa artefacts are 'heads'"):
        write_artefact(tmp_path / "x", "embeddings", method="medusa", target=target_identity(target, None),
                       proposer={}, tensors={"w": torch.ones(2)})
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("manifest, field", [
    ([1, 2], "JSON list"), ("text", "JSON str"), (None, "JSON NoneType"),
])
def test_a_manifest_that_is_not_an_object_is_refused(copy, manifest, field):
    art = copy("eagle")
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtefactError, match=field) as err:
        read_manifest(art)
    one_line(err)


@pytest.mark.parametrize("changes, field", [
    ({"proposer": 3}, "'proposer'"), ({"proposer": [1]}, "'proposer'"), ({"target": "tiny"}, "'target'"),
    ({"method": 5}, "'method'"), ({"kind": ["heads"]}, "'kind'"), ({"format": 2}, "'format'"),
    ({"files": ["heads.safetensors"]}, "'files'"), ({"weights": {"heads.safetensors": 7}}, "'weights.heads.safetensors'"),
    ({"files": {"../outside.json": "0" * 64}}, "'files.../outside.json'"), ({"training": []}, "'training'"),
    ({"target": {"vocab_size": "128"}}, "'target.vocab_size'"), ({"target": {"config_sha256": 1}}, "'target.config_sha256'"),
    ({"proposer": {"draft_length": "four"}}, "'proposer.draft_length'"),
    ({"proposer": {"tree_depth": 2.5}}, "'proposer.tree_depth'"), ({"target_adapter": "nowhere"}, "'target_adapter'"),
    ({"tuning": 1}, "'tuning'"), ({"metrics": "good"}, "'metrics'"),
])
def test_a_field_of_the_wrong_type_is_refused_naming_it(copy, changes, field):
    art = copy("eagle")
    edit_manifest(art, **changes)
    with pytest.raises(ArtefactError) as err:
        read_manifest(art)
    assert field in one_line(err)


def test_a_draft_dir_outside_the_artefact_is_refused(copy):
    art = copy("draft")
    edit_manifest(art, proposer={"model_dir": "/etc"})
    with pytest.raises(ArtefactError, match="'proposer.model_dir'"):
        read_manifest(art)


# -- the previous format -----------------------------------------------------------------------------------------------


def previous_format(art: Path) -> None:
    """``art`` as the previous format wrote it: no ``files``, the safetensors alone hashed."""
    manifest = json.loads((art / "manifest.json").read_text())
    del manifest["files"]
    manifest["format"] = PREVIOUS_FORMAT
    (art / "manifest.json").write_text(json.dumps(manifest))


def test_the_previous_format_is_refused_with_the_fix_and_resaved_on_request(copy, target):
    art = copy("medusa")
    previous_format(art)
    with pytest.raises(ArtefactError, match="re-run the training") as err:
        load_artefact(art, target)
    assert "resave_manifest" in one_line(err)
    manifest = resave_manifest(art)
    assert manifest["format"] == FORMAT and set(manifest["files"]) == {"heads.safetensors", "heads_config.json"}
    load_artefact(art, target)


def test_resaving_refuses_weights_that_do_not_match_the_old_manifest(copy):
    art = copy("medusa")
    previous_format(art)
    flip_byte(art / "heads.safetensors")
    with pytest.raises(ArtefactError, match="heads.safetensors"):
        resave_manifest(art)
    edit_manifest(art, weights={})
    with pytest.raises(ArtefactError, match="lists no weights"):
        resave_manifest(art)


# -- head configs -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, edit", [("medusa", {"heads": 5}), ("eagle", {"variant": "eagle3", "layers": [1, 1, 1]}),
                                        ("medusa", {"hidden_size": "wide"})])
def test_an_edited_head_config_is_refused_in_one_line(copy, target, name, edit):
    art = copy(name)
    config = json.loads((art / "heads_config.json").read_text())
    (art / "heads_config.json").write_text(json.dumps(config | edit))
    with pytest.raises(ArtefactError, match="heads_config.json") as err:
        load_artefact(art, target)
    one_line(err)


@pytest.mark.parametrize("edit", [{"heads": 5}, {"hidden_size": "wide"}, {"layers": None}, {"shared_lm_head": False}])
def test_a_head_config_that_does_not_fit_its_weights_is_one_line_not_a_traceback(copy, edit):
    """Even past the hashes (a manifest rewritten to match), the loader answers in one line."""
    art = copy("medusa")
    config = json.loads((art / "heads_config.json").read_text())
    (art / "heads_config.json").write_text(json.dumps(config | edit))
    with pytest.raises(ArtefactError, match="does not describe the weights beside it") as err:
        load_heads_artefact(art)
    one_line(err)


# -- export: the artefact read like everywhere else, the target's identity checked ---------------------------------------


def test_export_refuses_a_flipped_weight_byte_and_an_edited_config(copy, target, tmp_path):
    art = copy("medusa")
    flip_byte(art / "heads.safetensors")
    with pytest.raises(ArtefactError, match="heads.safetensors"):
        export_artefact(art, "vllm-medusa", tmp_path / "out", target_model=target)
    art = copy("eagle")
    (art / "heads_config.json").write_text(json.dumps({"method": "eagle", "variant": "eagle1", "fc_bias": True}))
    with pytest.raises(ArtefactError, match="heads_config.json"):
        export_artefact(art, "vllm-eagle", tmp_path / "out2", target_model=target)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_export_refuses_another_target(saved, target, tmp_path):
    other = random_model("llama", 0, hidden=64)
    with pytest.raises(ArtefactError, match="does not match") as err:
        export_artefact(saved["medusa"], "vllm-medusa", tmp_path / "out", target_model=other)
    assert "--allow-target-mismatch" not in one_line(err) and "--target" in str(err.value)
    assert not (tmp_path / "out").exists()
    export_artefact(saved["medusa"], "vllm-medusa", tmp_path / "ok", target_model=target)


# -- settings written back keep the files' hashes -------------------------------------------------------------------------


def test_rewritten_settings_keep_the_hashes_and_are_checked(copy):
    art = copy("draft")
    manifest = read_manifest(art)
    manifest["proposer"]["draft_length"] = 5
    rewrite_manifest(art, manifest)
    assert read_manifest(art)["proposer"]["draft_length"] == 5
    manifest["proposer"]["draft_length"] = "five"
    with pytest.raises(ArtefactError, match="proposer.draft_length"):
        rewrite_manifest(art, manifest)
    assert read_manifest(art)["proposer"]["draft_length"] == 5


def test_an_unknown_format_for_the_method_stays_a_config_error(saved, tmp_path):
    with pytest.raises(ConfigError, match="exports medusa artefacts"):
        export_artefact(saved["eagle"], "vllm-medusa", tmp_path / "out")
