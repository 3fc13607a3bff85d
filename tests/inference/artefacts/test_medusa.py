"""The vLLM Medusa export against the recorded contract of vLLM's loader (tests/contracts/engines.json, copied
from the loaders' source: config keys, tensor names, shapes), and the round trip back into draftsmith with
identical logits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.artefacts.medusa import export_vllm_medusa, read_vllm_medusa
from draftsmith.inference.drafters.medusa import MedusaHeads

CONTRACT = json.loads((Path(__file__).resolve().parents[2] / "contracts" / "engines.json").read_text())["vllm_medusa"]


def trained_heads(shared: bool, heads: int = 3, layers: int = 2) -> tuple[MedusaHeads, torch.nn.Module]:
    torch.manual_seed(0)
    target = random_model("llama", seed=0, layers=2)
    module = MedusaHeads(hidden=32, vocab=128, heads=heads, layers=layers, shared_lm_head=shared)
    module.init_lm_heads(target.get_output_embeddings())
    for p in module.parameters():
        p.data.add_(torch.randn_like(p) * 0.1)  # as if trained
    return module, target.get_output_embeddings()


def shape_of(spec: str, dims: dict[str, int]) -> list[list[int]]:
    """The allowed shapes of a contract entry like ``[H, H]`` or ``[Vt, H] (or [V, H] sliced by token_map)``."""
    return [[dims[d.strip()] for d in group.split(",")] for group in re.findall(r"\[([^\]]+)\]", spec)
            if all(d.strip() in dims for d in group.split(","))]


@pytest.mark.parametrize("shared", [True, False])
def test_export_matches_vllms_contract(shared, tmp_path):
    heads, lm_head = trained_heads(shared)
    out = export_vllm_medusa(heads, lm_head, tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == CONTRACT["model_type"] and config["architectures"] == CONTRACT["architectures"]
    assert set(CONTRACT["config_keys_required"]) <= set(config)
    assert set(config) <= set(CONTRACT["config_keys_required"]) | set(CONTRACT["config_keys_optional"])
    assert config["medusa_fc_bias"] is True  # our blocks have biases: vLLM drops them otherwise
    tensors = load_file(str(out / "model.safetensors"))
    dims = {"H": 32, "V": 128, "Vt": 128, "Vt|V": 128}
    patterns = {re.compile("^" + re.escape(name).replace(r"\{i\}", r"\d+").replace(r"\{j\}", r"\d+") + "$"): spec
                for name, spec in CONTRACT["tensors"].items()}
    for name, tensor in tensors.items():
        matches = [spec for pattern, spec in patterns.items() if pattern.match(name)]
        assert matches, f"{name} is not a tensor vLLM's Medusa loader knows (it would be dropped silently)"
        assert list(tensor.shape) in shape_of(matches[0]["shape"].replace("Vt|V", "Vt"), dims), name
        assert tensor.dtype.is_floating_point
    expected = {f"blocks.{i}.layers.{j}.{w}" for i in range(3) for j in range(2) for w in ("weight", "bias")}
    expected |= {"lm_head.weight"} if shared else {f"lm_heads.{i}.weight" for i in range(3)}
    assert set(tensors) == expected  # vLLM's strict check: every parameter present, nothing else


@pytest.mark.parametrize("shared", [True, False])
def test_round_trip_gives_identical_logits(shared, tmp_path):
    heads, lm_head = trained_heads(shared)
    back, back_head = read_vllm_medusa(export_vllm_medusa(heads, lm_head, tmp_path / "export"))
    h = torch.randn(4, 32)
    assert torch.equal(back(h, back_head if shared else None), heads(h, lm_head if shared else None))


def test_shared_heads_need_the_target(tmp_path):
    heads, _ = trained_heads(True)
    with pytest.raises(ConfigError, match="--target"):
        export_vllm_medusa(heads, None, tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".*tmp"))
