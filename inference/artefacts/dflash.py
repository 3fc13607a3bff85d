"""DFlash's artefact: the draft of a ``heads`` artefact directory (:func:`load_dflash_draft`), its export in the layout
vLLM's DFlash proposer loads (``vllm-dflash``), and reading an export back.

The export (recorded from vLLM 0.32's ``qwen3_dflash.py`` loader; docs/EXPORT.md): ``config.json`` with
``architectures: ["DFlashDraftModel"]``, ``model_type: "qwen3"``, the draft's Qwen3 sizes, ``block_size``, and
``dflash_config: {mask_token_id, target_layer_ids}``, whose ids are vLLM's: the *output* of decoder layer ``id``
(draftsmith's hidden-state index minus one), always written, ascending (``fc``'s column blocks permuted to match),
and the same layers as hidden-state indices in the top-level ``eagle_aux_hidden_state_layer_ids``, which vLLM reads
first (a release without the ``dflash_config`` fallback would otherwise capture its default layers);
``model.safetensors`` with ``fc.weight`` ``[H, n Ht]``, ``hidden_norm.weight``, ``norm.weight`` and every
``layers.{i}.*`` tensor (q/k norms included: vLLM leaves a tensor the checkpoint lacks uninitialised). No embedding
and no LM head: vLLM shares the target's, as draftsmith does.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.io import read_json
from draftsmith.inference.artefacts.checkpoint import write_export
from draftsmith.inference.artefacts.eagle import ascending_fc
from draftsmith.inference.artefacts.reader import config_misfit, read_weights
from draftsmith.inference.drafters.dflash import DFlashDraft

DFLASH_FORMATS = ("vllm-dflash",)
ARCHITECTURE = "DFlashDraftModel"
_QWEN3_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters",
               "attention_bias", "layer_types")


def load_dflash_draft(directory, target: torch.nn.Module) -> DFlashDraft:
    """The draft of a DFlash artefact directory (``heads.safetensors`` + ``heads_config.json``) for ``target``."""
    directory = Path(directory)
    config = read_json(directory / "heads_config.json")
    if not isinstance(config, dict) or config.get("method") != "dflash":
        raise ArtefactError(f"{directory}/heads_config.json is missing or not a DFlash draft: pass a DFlash artefact")
    try:
        draft = DFlashDraft.for_target(target, int(config["draft_layers"]), tuple(config["layers"]),
                                       int(config["block_size"]), int(config["mask_token_id"]))
        draft.load_state_dict(read_weights(directory / "heads.safetensors"))
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise config_misfit(directory / "heads_config.json", err) from None
    return draft


def export_config(draft: DFlashDraft, target_config) -> dict:
    """The export's ``config.json`` (module docstring)."""
    source = draft.config.to_dict()
    config = {"architectures": [ARCHITECTURE], "model_type": "qwen3", "vocab_size": int(target_config.vocab_size),
              "tie_word_embeddings": False, "block_size": draft.block_size,
              "num_target_layers": int(target_config.num_hidden_layers),
              "dflash_config": {"mask_token_id": draft.mask_token_id,
                                "target_layer_ids": [i - 1 for i in sorted(draft.hidden_layers)]},
              "eagle_aux_hidden_state_layer_ids": sorted(draft.hidden_layers)}  # vLLM's first choice: hidden states
    config.update({k: source[k] for k in _QWEN3_KEYS if source.get(k) is not None})
    theta = (source.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None:
        config["rope_theta"] = theta
    if draft.target_hidden != draft.hidden:
        config["target_hidden_size"] = draft.target_hidden
    config["torch_dtype"] = str(next(draft.parameters()).dtype).removeprefix("torch.")
    return config


def export_tensors(draft: DFlashDraft) -> dict[str, torch.Tensor]:
    """Every tensor of the draft under vLLM's names (the same as draftsmith's), ``fc`` in ascending layer order."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in draft.state_dict().items()}
    tensors["fc.weight"] = ascending_fc(tensors["fc.weight"], draft.hidden_layers)
    return tensors


def export_dflash(draft: DFlashDraft, target_config, fmt: str, out: str | os.PathLike) -> Path:
    """Write ``draft`` in layout ``fmt`` at ``out``, atomically."""
    if fmt not in DFLASH_FORMATS:
        raise ConfigError(f"DFlash export format {fmt!r} is unknown: choose one of {', '.join(DFLASH_FORMATS)}")
    return write_export(out, export_tensors(draft), export_config(draft, target_config), fmt)


def read_dflash_export(directory: str | os.PathLike, target) -> DFlashDraft:
    """A ``vllm-dflash`` export back as a draftsmith draft for ``target`` (its layers ascending)."""
    directory = Path(directory)
    config = read_json(directory / "config.json")
    if not isinstance(config, dict) or ARCHITECTURE not in (config.get("architectures") or []):
        raise ArtefactError(f"{directory} is not a DFlash export (config.json architectures "
                            f"{(config or {}).get('architectures')!r})")
    spec = config.get("dflash_config") or {}
    draft = DFlashDraft.for_target(target, int(config["num_hidden_layers"]),
                                   tuple(i + 1 for i in spec["target_layer_ids"]), int(config["block_size"]),
                                   int(spec["mask_token_id"]))
    draft.load_state_dict(read_weights(directory / "model.safetensors"))
    return draft


def export_dflash_artefact(artefact: str | os.PathLike, manifest: dict, fmt: str, out: str | os.PathLike,
                           target_model=None) -> Path:
    """Export a DFlash artefact in layout ``fmt``; the draft's config is built from the target's, so the target is
    needed."""
    if target_model is None:
        raise ConfigError(f"--format {fmt} builds the draft's config from its target's: pass --target")
    return export_dflash(load_dflash_draft(artefact, target_model), target_model.config, fmt, out)


__all__ = ["DFLASH_FORMATS", "export_config", "export_dflash", "export_dflash_artefact", "export_tensors",
           "load_dflash_draft", "read_dflash_export"]
