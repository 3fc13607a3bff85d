"""DSpark's artefact: the draft of a ``heads`` artefact directory (:func:`load_dspark_draft`), its export in the
layout vLLM's DSpark proposer loads (``vllm-dspark``), and reading an export back.

The export (recorded from vLLM 0.32's ``qwen3_dspark.py`` loader and its DSpark speculator; docs/EXPORT.md): DFlash's
``config.json`` (:func:`draftsmith.inference.artefacts.dflash.export_config`) with ``architectures:
["Qwen3DSparkModel"]`` and, instead of the ``dflash_config`` block, top-level keys: ``mask_token_id``,
``target_layer_ids`` (vLLM's: the output of decoder layer ``id``) beside ``eagle_aux_hidden_state_layer_ids``
(hidden-state indices, read first), ``sample_from_anchor: true`` (every query drafts the next token; vLLM refuses
it inside ``dflash_config``), ``markov_rank``, ``markov_head_type: "vanilla"``, ``enable_confidence_head`` and
``confidence_head_with_markov`` (always written: vLLM's default, false, is not the trainers'). ``model.safetensors``:
DFlash's tensors and ``markov_head.markov_w1.weight`` ``[V, r]``, ``markov_head.markov_w2.weight`` ``[V, r]``,
``confidence_head.proj.weight`` ``[1, H (+ r)]`` and ``.bias`` ``[1]``. No embedding, no LM head and no ``d2t``: the
draft drafts over the target's whole vocabulary with its LM head, which vLLM shares.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.io import read_json
from draftsmith.inference.artefacts.checkpoint import write_export
from draftsmith.inference.artefacts.dflash import export_config, export_tensors
from draftsmith.inference.artefacts.reader import config_misfit, read_weights
from draftsmith.inference.drafters.dspark import DSparkDraft

DSPARK_FORMATS = ("vllm-dspark",)
ARCHITECTURE = "Qwen3DSparkModel"


def _draft(target, config: dict, layers: tuple[int, ...]) -> DSparkDraft:
    return DSparkDraft.for_target(target, int(config["draft_layers"]), layers, int(config["block_size"]),
                                  int(config["mask_token_id"]), int(config["markov_rank"]),
                                  bool(config["confidence_head"]), bool(config["confidence_with_markov"]))


def load_dspark_draft(directory, target: torch.nn.Module) -> DSparkDraft:
    """The draft of a DSpark artefact directory (``heads.safetensors`` + ``heads_config.json``) for ``target``."""
    directory = Path(directory)
    config = read_json(directory / "heads_config.json")
    if not isinstance(config, dict) or config.get("method") != "dspark":
        raise ArtefactError(f"{directory}/heads_config.json is missing or not a DSpark draft: pass a DSpark artefact")
    try:
        draft = _draft(target, config, tuple(config["layers"]))
        draft.load_state_dict(read_weights(directory / "heads.safetensors"))
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise config_misfit(directory / "heads_config.json", err) from None
    return draft


def dspark_config(draft: DSparkDraft, target_config) -> dict:
    """The export's ``config.json`` (module docstring)."""
    config = export_config(draft, target_config)
    dflash = config.pop("dflash_config")
    return config | {"architectures": [ARCHITECTURE], "mask_token_id": dflash["mask_token_id"],
                     "target_layer_ids": dflash["target_layer_ids"], "sample_from_anchor": True,
                     "markov_rank": draft.markov_rank, "markov_head_type": "vanilla",
                     "enable_confidence_head": draft.confidence_head is not None,
                     "confidence_head_with_markov": draft.confidence_with_markov}


def export_dspark(draft: DSparkDraft, target_config, fmt: str, out: str | os.PathLike) -> Path:
    """Write ``draft`` in layout ``fmt`` at ``out``, atomically."""
    if fmt not in DSPARK_FORMATS:
        raise ConfigError(f"DSpark export format {fmt!r} is unknown: choose one of {', '.join(DSPARK_FORMATS)}")
    return write_export(out, export_tensors(draft), dspark_config(draft, target_config), fmt)


def read_dspark_export(directory: str | os.PathLike, target) -> DSparkDraft:
    """A ``vllm-dspark`` export back as a draftsmith draft for ``target`` (its layers ascending)."""
    directory = Path(directory)
    config = read_json(directory / "config.json")
    if not isinstance(config, dict) or ARCHITECTURE not in (config.get("architectures") or []):
        raise ArtefactError(f"{directory} is not a DSpark export (config.json architectures "
                            f"{(config or {}).get('architectures')!r})")
    settings = {"draft_layers": config["num_hidden_layers"], "block_size": config["block_size"],
                "mask_token_id": config["mask_token_id"], "markov_rank": config["markov_rank"],
                "confidence_head": config.get("enable_confidence_head", False),
                "confidence_with_markov": config.get("confidence_head_with_markov", False)}
    draft = _draft(target, settings, tuple(i + 1 for i in config["target_layer_ids"]))
    draft.load_state_dict(read_weights(directory / "model.safetensors"))
    return draft


def export_dspark_artefact(artefact: str | os.PathLike, manifest: dict, fmt: str, out: str | os.PathLike,
                           target_model=None) -> Path:
    """Export a DSpark artefact in layout ``fmt``; the draft's config is built from the target's, so the target is
    needed."""
    if target_model is None:
        raise ConfigError(f"--format {fmt} builds the draft's config from its target's: pass --target")
    return export_dspark(load_dspark_draft(artefact, target_model), target_model.config, fmt, out)


__all__ = ["DSPARK_FORMATS", "dspark_config", "export_dspark", "export_dspark_artefact", "load_dspark_draft",
           "read_dspark_export"]
