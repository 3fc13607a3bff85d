import json

import pytest
import torch

from draftsmith.common.errors import ArtefactError
from draftsmith.common.models import target_identity
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.artefacts.manifest import FORMAT, read_manifest, write_manifest
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.methods import load_artefact


def _export(tmp_path, target, draft):
    out = tmp_path / "art"
    draft.save_pretrained(out / "draft")
    write_manifest(out, "distillspec", target_identity(target, None, "tiny-target"), {"draft_length": 3, "model_dir": "draft"},
                   training={"steps": 0}, metrics={"eval_loss": 1.0})
    return out


def test_round_trip_builds_a_working_proposer(tmp_path):
    target, draft = random_model("llama", 0), random_model("llama", 1, layers=1)
    out = _export(tmp_path, target, draft)
    manifest = read_manifest(out)
    assert manifest["format"] == FORMAT and manifest["method"] == "distillspec"
    assert set(manifest["weights"]) == {"draft/model.safetensors"}
    for key in ("draftsmith_version", "created", "target", "proposer", "training", "metrics", "environment"):
        assert key in manifest
    proposer, _ = load_artefact(out, target)
    p = torch.arange(3, 13)
    ar = generate(ModelAdapter(target), p, GenerationConfig(max_new_tokens=12))
    sp = generate(ModelAdapter(target), p, GenerationConfig(max_new_tokens=12), proposer)
    assert sp.output_ids == ar.output_ids and sp.num_proposed > 0


def test_target_mismatch_is_refused_unless_allowed(tmp_path):
    target, draft = random_model("llama", 0), random_model("llama", 1, layers=1)
    out = _export(tmp_path, target, draft)
    other = random_model("llama", 0, layers=2)
    with pytest.raises(ArtefactError, match="allow-target-mismatch"):
        load_artefact(out, other)
    load_artefact(out, other, allow_target_mismatch=True)


def test_pickles_missing_files_and_corruption_are_refused(tmp_path):
    target, draft = random_model("llama", 0), random_model("llama", 1, layers=1)
    with pytest.raises(ArtefactError, match="does not exist"):
        read_manifest(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtefactError, match="manifest.json is missing"):
        read_manifest(tmp_path / "empty")
    out = _export(tmp_path, target, draft)
    torch.save({}, out / "extra.bin")
    with pytest.raises(ArtefactError, match="pickle"):
        read_manifest(out)
    (out / "extra.bin").unlink()
    weights = out / "draft" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ArtefactError, match="corrupt"):
        read_manifest(out)
    weights.unlink()
    with pytest.raises(ArtefactError, match="missing"):
        read_manifest(out)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(ArtefactError, match="not valid JSON"):
        read_manifest(out)


def test_unknown_method_is_refused(tmp_path):
    target, draft = random_model("llama", 0), random_model("llama", 1, layers=1)
    out = _export(tmp_path, target, draft)
    m = json.loads((out / "manifest.json").read_text())
    m["method"] = "telepathy"
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtefactError, match="telepathy"):
        load_artefact(out, target)


@pytest.mark.parametrize("kind", ["draft_model", "adapted_target", "lora_adapter", "heads", "embeddings", "none"])
def test_every_artefact_kind_is_written_with_a_manifest_over_its_weights(kind, tmp_path):
    import torch
    from safetensors.torch import load_file

    from draftsmith.common.models import target_identity
    from draftsmith.data.tiny_models import char_tokenizer
    from draftsmith.inference.artefacts.manifest import WEIGHT_PATHS, write_artefact

    target, tokenizer = random_model("llama", 0), char_tokenizer()
    weights: dict = {}
    if kind in ("draft_model", "adapted_target"):
        weights = {"model": random_model("llama", 1, layers=1), "tokenizer": tokenizer}
    elif kind == "lora_adapter":
        import peft

        lora = peft.get_peft_model(random_model("llama", 1, layers=1),
                                   peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
        weights = {"model": lora}
    elif kind in ("heads", "embeddings"):
        weights = {"tensors": {"w": torch.ones(3, 4)}, "config": {"rows": 3}}
    out = tmp_path / kind
    from draftsmith.common.registry import REGISTRY, MethodSpec, registered

    method = next((n for n in REGISTRY.names() if REGISTRY.get(n).artefact_kind == kind), None)
    spec = MethodSpec(name=f"{kind}-writer", summary="test", proposer=lambda ctx: None, artefact_kind=kind)
    with registered(spec):  # a method of each kind (lora_adapter: no built-in method writes one)
        manifest = write_artefact(out, kind, method=method or spec.name, target=target_identity(target, tokenizer),
                                  proposer={}, **weights)
        assert manifest["kind"] == kind and read_manifest(out) == manifest
    if kind == "none":
        assert manifest["weights"] == {} and manifest["files"] == {}
        return
    assert all(name.startswith(WEIGHT_PATHS[kind]) for name in manifest["weights"])
    assert set(manifest["weights"]) < set(manifest["files"])  # the configs are hashed too
    if kind == "lora_adapter":
        assert (out / "adapter" / "adapter_config.json").is_file()
    if kind in ("heads", "embeddings"):
        assert load_file(str(out / WEIGHT_PATHS[kind]))["w"].shape == (3, 4)
        assert json.loads((out / f"{kind}_config.json").read_text()) == {"rows": 3}
    assert not list(out.glob(".staging*"))
