"""Every command that reads an artefact (eval, tune, export, exit-layer) refuses a changed, incomplete, mislabelled or
malformed one, or one for another target, with exit status 2 and one line on stderr."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from draftsmith.common.models import target_identity
from draftsmith.inference.artefacts.manifest import write_artefact
from draftsmith.inference.drafters.eagle import EagleHead
from draftsmith.inference.drafters.medusa import MedusaHeads
from draftsmith.launch.cli import main


@pytest.fixture(scope="module")
def artefacts(tiny_pair, tmp_path_factory) -> dict[str, Path]:
    """Artefacts of the tiny pair's target: a draft model, Medusa heads (sharing its LM head), an EAGLE head and an
    adapted target (LayerSkip's kind)."""
    root = tmp_path_factory.mktemp("artefacts")
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_pair["target"])
    ident = target_identity(target, tokenizer, str(tiny_pair["target"]))
    draft = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["draft"])
    write_artefact(root / "distillspec", "draft_model", method="distillspec", target=ident,
                   proposer={"draft_length": 3, "model_dir": "draft"}, model=draft, tokenizer=tokenizer)
    torch.manual_seed(0)
    heads = MedusaHeads(target.config.hidden_size, target.config.vocab_size, heads=2, shared_lm_head=True)
    write_artefact(root / "medusa", "heads", method="medusa", target=ident, proposer={"tree": "chain"},
                   tensors=heads.state_dict(), config=heads.artefact_config())
    head = EagleHead.for_target(target)
    write_artefact(root / "eagle", "heads", method="eagle", target=ident, proposer={"tree": "chain"},
                   tensors=head.state_dict(), config=head.artefact_config())
    write_artefact(root / "layerskip", "adapted_target", method="layerskip", target=ident,
                   proposer={"exit_layer": 1, "draft_length": 2}, model=target, tokenizer=tokenizer)
    return {name: root / name for name in ("distillspec", "medusa", "eagle", "layerskip")}


@pytest.fixture
def copy(artefacts, tmp_path):
    return lambda name: Path(shutil.copytree(artefacts[name], tmp_path / name))


def refused(capsys, argv: list[str], *expected: str) -> str:
    """Run ``draftsmith ARGV``: exit status 2, one ``error:`` line on stderr (no traceback) holding ``expected``."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def edit_manifest(art: Path, **changes) -> None:
    manifest = json.loads((art / "manifest.json").read_text())
    (art / "manifest.json").write_text(json.dumps(manifest | changes))


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))


def evaluate(tiny_pair, art: Path, tmp_path: Path) -> list:
    return ["eval", "--artefact", art, "--target", tiny_pair["target"], "--limit", "1", "--max-new-tokens", "4",
            "--warmup", "0", "--no-progress", "--threads", "1", "--out", tmp_path / "report.json"]


def test_export_refuses_a_flipped_weight_byte(copy, tmp_path, capsys):
    art = copy("medusa")
    flip_byte(art / "heads.safetensors")
    refused(capsys, ["export", "--artefact", art, "--format", "vllm-medusa", "--out", tmp_path / "out"],
            "heads.safetensors", "does not match its sha256")
    assert not (tmp_path / "out" / "model.safetensors").exists()  # nothing exported


def test_export_refuses_another_target(artefacts, tiny_pair, tmp_path, capsys):
    refused(capsys, ["export", "--artefact", artefacts["medusa"], "--format", "vllm-medusa", "--out", tmp_path / "out",
                     "--target", tiny_pair["draft"]], "does not match", str(tiny_pair["target"]))
    assert not (tmp_path / "out" / "model.safetensors").exists()  # nothing exported
    assert main(["export", "--artefact", str(artefacts["medusa"]), "--format", "vllm-medusa", "--out",
                 str(tmp_path / "ok"), "--target", str(tiny_pair["target"])]) == 0


@pytest.mark.parametrize("name, file", [("distillspec", "draft/config.json"), ("distillspec", "draft/tokenizer.json")])
def test_eval_refuses_an_edited_config(copy, tiny_pair, tmp_path, capsys, name, file):
    art = copy(name)
    config = json.loads((art / file).read_text())
    config["rms_norm_eps" if "config" in file else "version"] = 0.5  # a norm eps that halved tau, loaded silently
    (art / file).write_text(json.dumps(config))
    refused(capsys, evaluate(tiny_pair, art, tmp_path), file, "re-run the training")


@pytest.mark.parametrize("changes", [{"weights": {}}, {"weights": {}, "files": {}}])
def test_eval_refuses_an_emptied_weights_map(copy, tiny_pair, tmp_path, capsys, changes):
    art = copy("distillspec")
    edit_manifest(art, **changes)
    flip_byte(art / "draft" / "model.safetensors")
    refused(capsys, evaluate(tiny_pair, art, tmp_path), "weights")


def test_eval_refuses_an_edited_kind(copy, tiny_pair, tmp_path, capsys):
    art = copy("eagle")
    edit_manifest(art, kind="none")
    refused(capsys, evaluate(tiny_pair, art, tmp_path), "'kind'", "eagle artefacts are 'heads'")


@pytest.mark.parametrize("manifest, expected", [([1, 2], "JSON list"), ({"proposer": 3}, "'proposer'"),
                                                ({"target": None}, "'target'"), ({"files": "all"}, "'files'")])
def test_eval_refuses_a_manifest_of_the_wrong_shape(copy, tiny_pair, tmp_path, capsys, manifest, expected):
    art = copy("eagle")
    if isinstance(manifest, dict):
        edit_manifest(art, **manifest)
    else:
        (art / "manifest.json").write_text(json.dumps(manifest))
    refused(capsys, evaluate(tiny_pair, art, tmp_path), expected)


def test_an_edited_head_config_is_one_line_in_eval_and_export(copy, tiny_pair, tmp_path, capsys):
    art = copy("medusa")
    config = json.loads((art / "heads_config.json").read_text())
    (art / "heads_config.json").write_text(json.dumps(config | {"heads": 5}))
    refused(capsys, evaluate(tiny_pair, art, tmp_path), "heads_config.json")
    art = copy("eagle")
    config = json.loads((art / "heads_config.json").read_text())
    (art / "heads_config.json").write_text(json.dumps(config | {"variant": "eagle3", "layers": [1, 1, 1]}))
    refused(capsys, ["export", "--artefact", art, "--format", "vllm-eagle", "--out", tmp_path / "out"],
            "heads_config.json")


def test_tune_refuses_an_edited_artefact(copy, tiny_pair, capsys):
    art = copy("distillspec")
    flip_byte(art / "draft" / "model.safetensors")
    before = (art / "manifest.json").read_text()
    refused(capsys, ["tune", "--artefact", art, "--target", tiny_pair["target"], "--prompts", "1",
                     "--max-new-tokens", "4", "--threads", "1"], "draft/model.safetensors")
    assert (art / "manifest.json").read_text() == before


def test_exit_layer_refuses_an_edited_artefact_and_a_second_target(copy, tiny_pair, capsys):
    art = copy("layerskip")
    refused(capsys, ["exit-layer", "--artefact", art, "--target", tiny_pair["target"], "--prompts", "1"],
            "--target and --artefact")
    config = json.loads((art / "model" / "config.json").read_text())
    (art / "model" / "config.json").write_text(json.dumps(config | {"rope_theta": 10.0}))
    refused(capsys, ["exit-layer", "--artefact", art, "--prompts", "1", "--max-new-tokens", "4", "--threads", "1"],
            "model/config.json")


def test_eval_checks_the_given_target_of_an_adapted_target_artefact(artefacts, tiny_pair, tmp_path, capsys):
    """An adapted-target artefact decodes with its own model, but the given target is still its reference (drift):
    another one is refused, unless allowed."""
    argv = evaluate(tiny_pair, artefacts["layerskip"], tmp_path)
    argv[argv.index("--target") + 1] = tiny_pair["draft"]
    refused(capsys, argv, "does not match", "--allow-target-mismatch")


@pytest.mark.parametrize("name", ["distillspec", "layerskip"])
def test_eval_hashes_an_artefact_once(artefacts, tiny_pair, tmp_path, monkeypatch, name):
    """An adapted target is a whole model: ``eval --artefact`` verifies its files once (it read and hashed the
    manifest three times: to find the target, to check it, to build the proposer)."""
    from draftsmith.inference.artefacts import reader

    calls = []
    verify = reader.verify_files
    monkeypatch.setattr(reader, "verify_files", lambda directory, manifest: calls.append(directory) or
                        verify(directory, manifest))
    assert main([str(a) for a in evaluate(tiny_pair, artefacts[name], tmp_path)]) == 0
    assert len(calls) == 1


def test_export_never_replaces_what_it_did_not_make_and_checks_its_inputs_first(artefacts, tmp_path, capsys):
    """A directory of other files (even a model's config.json and model.safetensors) is never replaced; an earlier
    export of the same format only with --overwrite; one of another format never; a refused export creates nothing."""
    export = ["export", "--artefact", artefacts["medusa"], "--format", "vllm-medusa", "--out"]
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name, text in (("config.json", "{}"), ("model.safetensors", "weights"), ("notes.txt", "precious\n")):
        (model_dir / name).write_text(text)
    refused(capsys, [*export, model_dir, "--overwrite"], "did not export", "pass a new or empty directory")
    assert sorted(p.name for p in model_dir.iterdir()) == ["config.json", "model.safetensors", "notes.txt"]
    assert (model_dir / "notes.txt").read_text() == "precious\n"

    out = tmp_path / "new" / "medusa"  # an export into a new directory, then over itself
    assert main([str(a) for a in [*export, out]]) == 0
    assert (out / "draftsmith-export.json").is_file()
    refused(capsys, [*export, out], "holds an earlier vllm-medusa export", "--overwrite")
    assert main([str(a) for a in [*export, out, "--overwrite"]]) == 0
    refused(capsys, ["export", "--artefact", artefacts["eagle"], "--format", "vllm-eagle", "--out", out, "--overwrite"],
            "holds a vllm-medusa export, not vllm-eagle")
    (out / "README.md").write_text("my notes\n")  # a user's file inside an earlier export: never deleted
    refused(capsys, [*export, out, "--overwrite"], "files it did not write (README.md)", "move them")
    assert (out / "README.md").read_text() == "my notes\n" and (out / "draftsmith-export.json").is_file()
    (out / "README.md").unlink()
    (out / "config.json").write_text('{"edited": "by hand"}')  # an export file edited since: never replaced
    refused(capsys, [*export, out, "--overwrite"], "whose config.json was changed since it was written")
    assert (out / "config.json").read_text() == '{"edited": "by hand"}'
    (tmp_path / "link").symlink_to(model_dir)
    refused(capsys, [*export, tmp_path / "link", "--overwrite"], "is a symbolic link")

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    refused(capsys, [*export, a_file], "is a file")
    for bad in ([*export[:4], "vllm-eagle", "--out", tmp_path / "never"],  # the wrong format for the artefact
                ["export", "--artefact", tmp_path / "missing", "--format", "vllm-medusa", "--out", tmp_path / "never"]):
        refused(capsys, bad)
        assert not (tmp_path / "never").exists() and not list(tmp_path.glob(".never*"))


@pytest.mark.parametrize("name, fmt", [("medusa", "vllm-medusa"), ("eagle", "vllm-eagle")])
@pytest.mark.parametrize("keep", [7, 100, 0.5])
def test_a_truncated_weight_file_with_a_rehashed_manifest_is_one_line(copy, tiny_pair, tmp_path, capsys, name, fmt,
                                                                       keep):
    """The manifest's sums cannot catch a weight file cut short by someone who also re-hashed it: reading it is one
    line naming the file, for export and eval alike (it was safetensors' traceback)."""
    import hashlib

    art = copy(name)
    weights = art / "heads.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(keep * len(data)) if keep < 1 else keep])
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    manifest = json.loads((art / "manifest.json").read_text())
    edit_manifest(art, weights={**manifest["weights"], "heads.safetensors": digest},
                  files={**manifest["files"], "heads.safetensors": digest})
    expected = ("heads.safetensors is not a readable safetensors file", "re-run the training")
    refused(capsys, ["export", "--artefact", art, "--format", fmt, "--out", tmp_path / "export"], *expected)
    refused(capsys, evaluate(tiny_pair, art, tmp_path), *expected)
    assert not (tmp_path / "export").exists()


def test_a_bad_value_read_from_a_manifest_says_so(copy, tiny_pair, tmp_path, capsys):
    art = copy("distillspec")
    edit_manifest(art, proposer={"draft_length": -3, "model_dir": "draft"})
    refused(capsys, evaluate(tiny_pair, art, tmp_path), "draft length must be at least 1, got -3 from the artefact's "
            "manifest.json (proposer.draft_length; --draft-length overrides it)")


def test_the_speculators_layout_of_an_eagle1_head_names_the_format_asked_for(artefacts, tiny_pair, tmp_path, capsys):
    refused(capsys, ["export", "--artefact", artefacts["eagle"], "--format", "speculators", "--out", tmp_path / "out",
                     "--target", tiny_pair["target"]], "--format speculators exports EAGLE-3 heads", "use vllm-eagle")
    assert not (tmp_path / "out").exists()
