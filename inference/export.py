"""Exporting trained heads to the serving engines' checkpoint layouts (docs/EXPORT.md), and reading an export
back (the round trip the tests check). EAGLE's layouts live in :mod:`draftsmith.inference.export_eagle`.

``vllm-medusa``: the directory vLLM's Medusa model loads (``speculative_config={"method": "medusa", "model": DIR,
"num_speculative_tokens": k}`` with ``k <= heads``):

- ``config.json``: ``model_type: "medusa"``, ``architectures: ["MedusaModel"]``, ``hidden_size``, ``vocab_size``,
  ``num_heads``, ``num_hidden_layers`` (residual blocks per head; written explicitly, vLLM's AutoConfig path does
  not rename ``medusa_num_layers``), ``medusa_fc_bias: true`` (our blocks have biases; vLLM drops them silently
  otherwise), ``truncated_vocab_size = vocab_size`` and ``original_lm_head`` (true for heads that share the
  target's LM head);
- ``model.safetensors``: ``blocks.{i}.layers.{j}.weight`` ``[H, H]`` and ``.bias`` ``[H]``, then either
  ``lm_head.weight`` ``[V, H]`` (a copy of the target's LM head: vLLM does not take it from the target) or one
  ``lm_heads.{i}.weight`` per head.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.io import atomic_write_json, read_json
from draftsmith.inference.heads import MedusaHeads

FORMATS = ("vllm-medusa", "eagle3", "vllm-eagle", "sglang-eagle")
FORMAT_METHOD = {"vllm-medusa": "medusa", "eagle3": "eagle", "vllm-eagle": "eagle", "sglang-eagle": "eagle"}


def vllm_medusa_config(heads: MedusaHeads) -> dict:
    return {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": heads.hidden,
            "vocab_size": heads.vocab, "truncated_vocab_size": heads.vocab, "num_heads": heads.num_heads,
            "num_hidden_layers": heads.layers, "medusa_fc_bias": True, "original_lm_head": heads.shared_lm_head}


def vllm_medusa_tensors(heads: MedusaHeads, lm_head: torch.nn.Module | None) -> dict[str, torch.Tensor]:
    """Our heads' tensors under vLLM's names (``lm_head`` = the target's, needed when the heads share it)."""
    out: dict[str, torch.Tensor] = {}
    for i, block in enumerate(heads.blocks):
        for j, res in enumerate(block):
            out[f"blocks.{i}.layers.{j}.weight"] = res.linear.weight
            out[f"blocks.{i}.layers.{j}.bias"] = res.linear.bias
    if heads.shared_lm_head:
        if lm_head is None:
            raise ConfigError("these Medusa heads share the target's LM head, which the export must ship: load the "
                              "target (--target)")
        out["lm_head.weight"] = lm_head.weight[: heads.vocab]
    else:
        for i, head in enumerate(heads.lm_heads):
            out[f"lm_heads.{i}.weight"] = head.weight
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in out.items()}


def write_export(out: str | os.PathLike, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """An engine's checkpoint directory at ``out`` (``model.safetensors`` + ``config.json``), atomically: staged
    beside it, then renamed over any older export."""
    out = Path(out)
    staging = out.with_name(f".{out.name}.export.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        save_file(tensors, str(staging / "model.safetensors"))
        atomic_write_json(staging / "config.json", config)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def export_vllm_medusa(heads: MedusaHeads, lm_head: torch.nn.Module | None, out: str | os.PathLike) -> Path:
    """Write the vLLM Medusa directory (module docstring) at ``out``, atomically."""
    return write_export(out, vllm_medusa_tensors(heads, lm_head), vllm_medusa_config(heads))


def read_vllm_medusa(directory: str | os.PathLike) -> tuple[MedusaHeads, torch.nn.Linear | None]:
    """A vLLM Medusa directory back as ``(heads, shared LM head or None)``."""
    directory = Path(directory)
    config = read_json(directory / "config.json")
    if config is None or config.get("model_type") != "medusa":
        raise ArtefactError(f"{directory} is not a vLLM Medusa export (config.json with model_type medusa)")
    tensors = load_file(str(directory / "model.safetensors"))
    shared = bool(config.get("original_lm_head"))
    heads = MedusaHeads(hidden=config["hidden_size"], vocab=config["vocab_size"], heads=config["num_heads"],
                        layers=config["num_hidden_layers"], shared_lm_head=shared)
    state = {}
    for i in range(heads.num_heads):
        for j in range(heads.layers):
            state[f"blocks.{i}.{j}.linear.weight"] = tensors[f"blocks.{i}.layers.{j}.weight"]
            state[f"blocks.{i}.{j}.linear.bias"] = tensors[f"blocks.{i}.layers.{j}.bias"]
        if not shared:
            state[f"lm_heads.{i}.weight"] = tensors[f"lm_heads.{i}.weight"]
    heads.load_state_dict(state)
    lm_head = None
    if shared:
        lm_head = torch.nn.Linear(heads.hidden, heads.vocab, bias=False)
        lm_head.weight.data.copy_(tensors["lm_head.weight"])
    return heads, lm_head


ADAPTED_TARGET = "target"  # where a Medusa-2 export puts the adapted target (serve it as the model)


def load_heads_artefact(directory: str | os.PathLike) -> MedusaHeads:
    """The Medusa heads of a ``heads`` artefact directory."""
    directory = Path(directory)
    config = read_json(directory / "heads_config.json")
    if config is None or config.get("method", "medusa") != "medusa":
        raise ArtefactError(f"{directory}/heads_config.json is missing or not Medusa heads: pass a Medusa artefact")
    heads = MedusaHeads.from_artefact_config(config)
    heads.load_state_dict(load_file(str(directory / "heads.safetensors")))
    return heads


def export_artefact(artefact: str | os.PathLike, fmt: str, out: str | os.PathLike,
                    target_model=None) -> Path:
    """Export the artefact at ``artefact`` in format ``fmt`` (:data:`FORMATS`) to ``out``."""
    if fmt not in FORMATS:
        raise ConfigError(f"export format {fmt!r} is unknown: choose one of {', '.join(FORMATS)}")
    manifest = read_json(Path(artefact) / "manifest.json")
    if manifest is None:
        raise ArtefactError(f"{artefact} has no manifest.json: pass an artefact directory written by a recipe")
    if manifest.get("method") != FORMAT_METHOD[fmt]:
        raise ConfigError(f"--format {fmt} exports {FORMAT_METHOD[fmt]} heads, but {artefact} is a "
                          f"{manifest.get('method')} artefact")
    if FORMAT_METHOD[fmt] == "eagle":
        from draftsmith.inference.eagle import load_eagle_head
        from draftsmith.inference.export_eagle import export_eagle

        if target_model is None:
            raise ConfigError(f"--format {fmt} builds the head's layer from its target's config: pass --target")
        return export_eagle(load_eagle_head(artefact, target_model), target_model.config, fmt, out)
    heads = load_heads_artefact(artefact)
    if manifest.get("target_adapter"):  # Medusa-2: the heads belong to the adapted target, which ships beside them
        from draftsmith.inference.artefact import adapted_target

        if target_model is None:
            raise ConfigError(f"{artefact} tuned its target (Medusa-2): the export ships the adapted target, so it "
                              "needs the original: pass --target")
        target_model = adapted_target(artefact, manifest, target_model)
    lm_head = target_model.get_output_embeddings() if target_model is not None else None
    path = export_vllm_medusa(heads, lm_head, out)
    if manifest.get("target_adapter"):
        target_model.save_pretrained(Path(out) / ADAPTED_TARGET, safe_serialization=True)
    return path


def describe(out: str | os.PathLike) -> str:
    """One line: what an export directory holds."""
    config = json.loads((Path(out) / "config.json").read_text())
    names = load_file(str(Path(out) / "model.safetensors"))
    if config.get("model_type") != "medusa":
        return f"{out}: {config['architectures'][0]} draft head, {len(names)} tensors"
    line = (f"{out}: {config['model_type']} with {config['num_heads']} heads x {config['num_hidden_layers']} blocks, "
            f"{len(names)} tensors")
    if (Path(out) / ADAPTED_TARGET).is_dir():
        line += f"; the adapted target (serve it as the model) in {Path(out) / ADAPTED_TARGET}"
    return line


__all__ = ["FORMATS", "write_export", "vllm_medusa_config", "vllm_medusa_tensors", "export_vllm_medusa", "read_vllm_medusa",
           "load_heads_artefact", "export_artefact", "describe"]
