"""Artefact directories: what a recipe writes and what the inference module loads.

Layout::

    <dir>/manifest.json          format, method, kind, versions, target identity, proposer settings,
                                 sha256 of every file of the artefact (``files``; the safetensors among them
                                 also as ``weights``), training config and metrics
    <dir>/draft/                 kind draft_model: a plain Hugging Face model directory
    <dir>/heads.safetensors      kind heads: head weights (+ heads_config.json); with ``target_adapter`` in the
                                 manifest, ``adapter/`` beside them holds a peft LoRA adapter of the target that
                                 the method tuned with its heads (Medusa-2): it is verified against that
                                 adapted target
    <dir>/adapter/               kind lora_adapter: a peft LoRA adapter of the target
    <dir>/model/                 kind adapted_target: the full adapted target
    <dir>/embeddings.safetensors kind embeddings: tuned embeddings only
    (nothing)                    kind none: decoding settings only, in the manifest

The kinds and which method writes which are in :mod:`draftsmith.common.registry`.

Weights are safetensors only: a directory holding pickle-based weights is refused. This module writes artefacts;
:mod:`draftsmith.inference.artefacts.reader` is the one reader (every file verified against the manifest, the
manifest's fields and kind checked, the target identity compared).
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from draftsmith.common.errors import ArtefactError
from draftsmith.common.io import atomic_write_json, environment, sha256_file, umask_modes
from draftsmith.inference.artefacts.reader import (
    FORMAT,
    MANIFEST,
    PREVIOUS_FORMAT,
    TARGET_ADAPTER,
    WEIGHT_PATHS,
    check_kind,
    check_target,
    hash_files,
    load_manifest_json,
    read_manifest,
    refuse_pickles,
    validate_manifest,
)


def write_manifest(
    out_dir: str | Path,
    method: str,
    target: dict,
    proposer: dict,
    training: dict | None = None,
    metrics: dict | None = None,
    kind: str = "draft_model",
    target_adapter: str | None = None,
) -> dict:
    """Hash every file under ``out_dir`` (configs, tokenizer files and weights; all but ``manifest.json``) and write
    ``manifest.json`` atomically, checked as the reader checks it (a method's own kind; a kind other than ``none``
    holds safetensors weights)."""
    from draftsmith.common import __version__

    out_dir = Path(out_dir)
    check_kind(method, kind, out_dir / MANIFEST, fix="write the kind its registry entry declares")
    refuse_pickles(out_dir)
    files = hash_files(out_dir)
    weights = {name: digest for name, digest in files.items() if name.endswith(".safetensors")}
    if not weights and kind != "none":
        raise ArtefactError(f"{out_dir} holds no .safetensors weights: save the model with safe_serialization")
    manifest = {
        "format": FORMAT,
        "method": method,
        "kind": kind,
        "draftsmith_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "target": target,
        "proposer": proposer,
        "files": files,
        "weights": weights,
        **({"target_adapter": target_adapter} if target_adapter else {}),
        "training": training or {},
        "metrics": metrics or {},
        "environment": environment(),
    }
    validate_manifest(manifest, out_dir / MANIFEST)
    atomic_write_json(out_dir / MANIFEST, manifest)
    return manifest


def rewrite_manifest(directory: str | Path, manifest: dict) -> None:
    """Write back the manifest of a read artefact whose settings a command changed (``draftsmith tune``, ``draftsmith
    exit-layer``), checked first; its files and their hashes stay as they were saved."""
    path = Path(directory) / MANIFEST
    validate_manifest(manifest, path)
    atomic_write_json(path, manifest)


def resave_manifest(directory: str | Path) -> dict:
    """Re-save the manifest of an artefact in the previous format (which hashed its safetensors only) in the current
    one: its weights are verified against the old manifest, then every file is hashed as it is now. Only for
    artefacts whose configs you trust: the old manifest cannot tell whether they were edited."""
    directory = Path(directory)
    path, manifest = load_manifest_json(directory)
    if not isinstance(manifest, dict) or manifest.get("format") != PREVIOUS_FORMAT:
        raise ArtefactError(f"{path} is not a {PREVIOUS_FORMAT} manifest: only those are re-saved")
    weights = manifest.get("weights")
    if not isinstance(weights, dict) or (not weights and manifest.get("kind") != "none"):
        raise ArtefactError(f"{path} lists no weights, so they cannot be verified: re-run the training that wrote it")
    for name, digest in weights.items():
        if not (directory / name).is_file() or sha256_file(directory / name) != digest:
            raise ArtefactError(f"{directory / name} is missing or does not match its sha256 in the manifest: "
                                "re-run the training that wrote the artefact")
    refuse_pickles(directory)
    manifest.update(format=FORMAT, files=hash_files(directory))
    manifest["weights"] = {n: d for n, d in manifest["files"].items() if n.endswith(".safetensors")}
    rewrite_manifest(directory, manifest)
    return manifest


def write_weights(staging: Path, kind: str, *, model=None, state_dict: dict | None = None, tokenizer=None,
                  tensors: dict | None = None, config: dict | None = None) -> list[str]:
    """Write the weights of an artefact of ``kind`` under ``staging``; returns the top-level names written.

    Model kinds (draft_model, adapted_target, lora_adapter) save ``model`` with ``save_pretrained`` (a peft
    model saves its adapter), with ``state_dict`` when given (gathered ZeRO-3 weights) and the tokenizer beside
    it; tensor kinds (heads, embeddings) save ``tensors`` as safetensors and ``config`` as
    ``<kind>_config.json``."""
    target = WEIGHT_PATHS.get(kind, ...)
    if target is ...:
        raise ArtefactError(f"artefact kind {kind!r} is unknown: choose one of {', '.join(WEIGHT_PATHS)}")
    if target is None:
        return []
    if kind in ("heads", "embeddings"):
        if not tensors:
            raise ArtefactError(f"a {kind} artefact needs its tensors: pass tensors={{name: tensor}}")
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(staging / target))
        umask_modes(staging / target)
        names = [target]
        if config is not None:
            atomic_write_json(staging / f"{kind}_config.json", config)
            names.append(f"{kind}_config.json")
        return names
    if model is None:
        raise ArtefactError(f"a {kind} artefact needs its model: pass model=")
    model.save_pretrained(staging / target, state_dict=state_dict, safe_serialization=True)
    if tokenizer is not None and kind != "lora_adapter":
        tokenizer.save_pretrained(staging / target)
    umask_modes(staging / target)
    return [target]


def write_artefact(out_dir: str | Path, kind: str, *, method: str, target: dict, proposer: dict,
                   training: dict | None = None, metrics: dict | None = None, target_adapter=None,
                   target_adapter_state: dict | None = None, **weights) -> dict:
    """Write a whole artefact: the weights of ``kind`` (see :func:`write_weights`) beside the final place, swapped
    in, then the manifest last, so a reader never sees a manifest over half-written weights. ``target_adapter``
    (a peft model of the target) is saved to ``adapter/``, from ``target_adapter_state`` when given (its whole state
    dict, gathered under ZeRO-3), and recorded in the manifest: the artefact then runs on the adapted target."""
    import shutil

    check_kind(method, kind, Path(out_dir) / MANIFEST, fix="write the kind its registry entry declares")  # first
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    names = write_weights(staging, kind, **weights)
    if target_adapter is not None:
        names += write_weights(staging, "lora_adapter", model=target_adapter, state_dict=target_adapter_state)
    (out / MANIFEST).unlink(missing_ok=True)  # the old manifest would not match the new weights
    for name in names:
        final = out / name
        if final.is_dir():
            shutil.rmtree(final)
        os.replace(staging / name, final)
    shutil.rmtree(staging, ignore_errors=True)
    if target_adapter is None and (out / TARGET_ADAPTER).is_dir() and kind != "lora_adapter":
        shutil.rmtree(out / TARGET_ADAPTER)  # an older run's adapter would be hashed into the new manifest
    return write_manifest(out, method, target, proposer, training, metrics, kind=kind,
                          target_adapter=TARGET_ADAPTER if target_adapter is not None else None)


def adapted_target(directory: str | Path, manifest: dict, target_model):
    """The model an artefact's proposer is verified against: ``target_model`` itself; the artefact's own model for
    kind ``adapted_target``; or, when the manifest names a ``target_adapter``, a copy of ``target_model`` with that
    LoRA adapter merged in (``target_model`` is left untouched)."""
    if manifest.get("kind") == "adapted_target":  # the method tuned the whole target (LayerSkip): its copy
        from draftsmith.common.models import load_model

        model = load_model(Path(directory) / WEIGHT_PATHS["adapted_target"], what="adapted target")
        return model.to(next(target_model.parameters()).device, next(target_model.parameters()).dtype).eval()
    name = manifest.get("target_adapter")
    if not name:
        return target_model
    import copy

    from peft import PeftModel

    path = Path(directory) / name
    if not (path / "adapter_config.json").is_file():
        raise ArtefactError(f"{path} holds no adapter_config.json although the manifest names it: copy the whole "
                            "artefact directory")
    try:
        adapted = PeftModel.from_pretrained(copy.deepcopy(target_model), str(path))
    except (ValueError, KeyError, RuntimeError) as err:
        raise ArtefactError(f"the target adapter {path} does not fit this target ({str(err).splitlines()[0]}): pass "
                            "the target the artefact was trained for") from None
    return adapted.merge_and_unload().eval()


__all__ = ["FORMAT", "MANIFEST", "TARGET_ADAPTER", "WEIGHT_PATHS", "adapted_target", "check_target", "read_manifest",
           "refuse_pickles", "resave_manifest", "rewrite_manifest", "write_artefact", "write_manifest", "write_weights"]
