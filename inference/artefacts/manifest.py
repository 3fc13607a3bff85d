"""Artefact directories: what a recipe writes and what the inference module loads.

Layout::

    <dir>/manifest.json          format, method, kind, versions, target identity, proposer settings,
                                 sha256 of every weight file, training config and metrics
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

Weights are safetensors only: a directory holding pickle-based weights is refused. Loading checks
the manifest's target identity (config and tokenizer hashes) against the target in hand and
refuses a mismatch unless the caller allows it explicitly.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from draftsmith.common.errors import ArtefactError
from draftsmith.common.io import atomic_write_json, environment, sha256_file
from draftsmith.common.models import target_identity

FORMAT = "draftsmith-artefact/1"
MANIFEST = "manifest.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


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
    """Hash every safetensors file under ``out_dir`` and write ``manifest.json`` atomically. Every kind but
    ``none`` must hold at least one safetensors file."""
    from draftsmith.common import __version__

    out_dir = Path(out_dir)
    refuse_pickles(out_dir)
    weights = {
        str(p.relative_to(out_dir)): sha256_file(p) for p in sorted(out_dir.rglob("*.safetensors"))
    }
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
        "weights": weights,
        **({"target_adapter": target_adapter} if target_adapter else {}),
        "training": training or {},
        "metrics": metrics or {},
        "environment": environment(),
    }
    atomic_write_json(out_dir / MANIFEST, manifest)
    return manifest


# kind -> the directory (or file) its weights go to, relative to the artefact directory
WEIGHT_PATHS = {"draft_model": "draft", "adapted_target": "model", "lora_adapter": "adapter",
                "heads": "heads.safetensors", "embeddings": "embeddings.safetensors", "none": None}
TARGET_ADAPTER = "adapter"  # where a heads artefact keeps the LoRA adapter of a target its method tuned


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
    return [target]


def write_artefact(out_dir: str | Path, kind: str, *, method: str, target: dict, proposer: dict,
                   training: dict | None = None, metrics: dict | None = None, target_adapter=None, **weights) -> dict:
    """Write a whole artefact: the weights of ``kind`` (see :func:`write_weights`) beside the final place, swapped
    in, then the manifest last, so a reader never sees a manifest over half-written weights. ``target_adapter``
    (a peft model of the target) is saved to ``adapter/`` and recorded in the manifest: the artefact then runs
    on the adapted target."""
    import shutil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    names = write_weights(staging, kind, **weights)
    if target_adapter is not None:
        names += write_weights(staging, "lora_adapter", model=target_adapter)
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


def refuse_pickles(directory: Path) -> None:
    bad = [p for p in directory.rglob("*") if p.suffix in PICKLE_SUFFIXES and p.is_file()]
    if bad:
        raise ArtefactError(
            f"{bad[0]} is a pickle-based weight file, which draftsmith refuses to load or ship: "
            "re-save the weights as safetensors (save_pretrained(..., safe_serialization=True))"
        )


def read_manifest(directory: str | Path, verify_weights: bool = True) -> dict:
    directory = Path(directory)
    if not directory.is_dir():
        raise ArtefactError(f"artefact directory {directory} does not exist: pass the --output_dir of a finished run")
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtefactError(f"{path} is missing: {directory} is not a draftsmith artefact (rerun the recipe to export one)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ArtefactError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}): re-export the artefact") from None
    if manifest.get("format") != FORMAT:
        raise ArtefactError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}: re-export it")
    for key in ("method", "target", "proposer", "weights"):
        if key not in manifest:
            raise ArtefactError(f"{path} lacks the {key!r} field: re-export the artefact")
    refuse_pickles(directory)
    if verify_weights:
        for name, digest in manifest["weights"].items():
            f = directory / name
            if not f.is_file():
                raise ArtefactError(f"weight file {f} listed in the manifest is missing: copy the whole artefact directory")
            if sha256_file(f) != digest:
                raise ArtefactError(f"weight file {f} does not match its sha256 in the manifest: the copy is corrupt")
    return manifest


def check_target(manifest: dict, model, tokenizer, allow_mismatch: bool = False) -> list[str]:
    """Compare the artefact's recorded target with ``model``/``tokenizer``; returns the warnings
    (when allowed) or raises :class:`ArtefactError`."""
    want = manifest["target"]
    have = target_identity(model, tokenizer)
    problems = []
    if want.get("vocab_size") not in (None, have["vocab_size"]):
        problems.append(f"vocabulary size {want['vocab_size']} vs {have['vocab_size']}")
    if want.get("config_sha256") and want["config_sha256"] != have["config_sha256"]:
        problems.append("model config hash differs")
    if want.get("tokenizer_sha256") and have["tokenizer_sha256"] and want["tokenizer_sha256"] != have["tokenizer_sha256"]:
        problems.append("tokenizer hash differs")
    if problems and not allow_mismatch:
        raise ArtefactError(
            f"this artefact was trained for target {want.get('name_or_path') or '?'} and the given target does not "
            f"match ({'; '.join(problems)}): pass that target, or --allow-target-mismatch to run anyway"
        )
    return problems


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

