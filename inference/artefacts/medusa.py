"""Medusa's artefact: the heads of a ``heads`` artefact directory, and their export to the layout vLLM loads
(docs/EXPORT.md), with the reader of that export (the round trip the tests check).

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

import os
from pathlib import Path

import torch

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.io import read_json
from draftsmith.common.models import load_tokenizer, tokenizer_dir_for
from draftsmith.inference.artefacts.checkpoint import write_export
from draftsmith.inference.artefacts.manifest import adapted_target
from draftsmith.inference.artefacts.reader import config_misfit, read_weights
from draftsmith.inference.drafters.medusa import MedusaHeads


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


def export_vllm_medusa(heads: MedusaHeads, lm_head: torch.nn.Module | None, out: str | os.PathLike) -> Path:
    """Write the vLLM Medusa directory (module docstring) at ``out``, atomically."""
    return write_export(out, vllm_medusa_tensors(heads, lm_head), vllm_medusa_config(heads), "vllm-medusa")


def read_vllm_medusa(directory: str | os.PathLike) -> tuple[MedusaHeads, torch.nn.Linear | None]:
    """A vLLM Medusa directory back as ``(heads, shared LM head or None)``."""
    directory = Path(directory)
    config = read_json(directory / "config.json")
    if not isinstance(config, dict) or config.get("model_type") != "medusa":
        raise ArtefactError(f"{directory} is not a vLLM Medusa export (config.json with model_type medusa)")
    tensors = read_weights(directory / "model.safetensors")
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
    if not isinstance(config, dict) or config.get("method", "medusa") != "medusa":
        raise ArtefactError(f"{directory}/heads_config.json is missing or not Medusa heads: pass a Medusa artefact")
    try:
        heads = MedusaHeads.from_artefact_config(config)
        heads.load_state_dict(read_weights(directory / "heads.safetensors"))
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise config_misfit(directory / "heads_config.json", err) from None
    return heads


def export_medusa_artefact(artefact: str | os.PathLike, manifest: dict, fmt: str, out: str | os.PathLike,
                           target_model=None) -> Path:
    """Export a Medusa artefact (``fmt`` = ``vllm-medusa``); Medusa-2's adapted target ships beside the heads."""
    heads = load_heads_artefact(artefact)
    if manifest.get("target_adapter"):  # Medusa-2: the heads belong to the adapted target, which ships beside them
        if target_model is None:
            raise ConfigError(f"{artefact} tuned its target (Medusa-2): the export ships the adapted target, so it "
                              "needs the original: pass --target")
        target_name = str(getattr(target_model.config, "_name_or_path", "") or "")
        target_model = adapted_target(artefact, manifest, target_model)
    lm_head = target_model.get_output_embeddings() if target_model is not None else None
    path = export_vllm_medusa(heads, lm_head, out)
    if manifest.get("target_adapter"):  # the adapted target ships with the tokenizer it speaks
        target_model.save_pretrained(Path(out) / ADAPTED_TARGET, safe_serialization=True)
        tok_dir = tokenizer_dir_for(target_name) if target_name else None
        if tok_dir is not None:
            load_tokenizer(tok_dir).save_pretrained(Path(out) / ADAPTED_TARGET)
    return path


def describe_medusa_export(out: str | os.PathLike, config: dict, tensors: int) -> str:
    """One line: what a vLLM Medusa export directory holds."""
    line = (f"{out}: {config['model_type']} with {config['num_heads']} heads x {config['num_hidden_layers']} blocks, "
            f"{tensors} tensors")
    if (Path(out) / ADAPTED_TARGET).is_dir():
        line += f"; the adapted target (serve it as the model) in {Path(out) / ADAPTED_TARGET}"
    return line


__all__ = ["ADAPTED_TARGET", "describe_medusa_export", "export_medusa_artefact", "export_vllm_medusa", "load_heads_artefact",
           "read_vllm_medusa", "vllm_medusa_config", "vllm_medusa_tensors"]
