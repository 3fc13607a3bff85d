"""Artefact directories: what a recipe writes and what the inference module loads.

Layout::

    <dir>/manifest.json          format, method, versions, target identity, proposer settings,
                                 sha256 of every weight file, training config and metrics
    <dir>/draft/                 a plain Hugging Face model directory (draft-model methods)
    <dir>/*.safetensors          head / prompt weights (head methods)

Weights are safetensors only: a directory holding pickle-based weights is refused. Loading checks
the manifest's target identity (config and tokenizer hashes) against the target in hand and
refuses a mismatch unless the caller allows it explicitly.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ArtefactError
from draftsmith.common.io import atomic_write_text, environment, sha256_file
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
) -> dict:
    """Hash every safetensors file under ``out_dir`` and write ``manifest.json`` atomically."""
    from draftsmith.common import __version__

    out_dir = Path(out_dir)
    refuse_pickles(out_dir)
    weights = {
        str(p.relative_to(out_dir)): sha256_file(p) for p in sorted(out_dir.rglob("*.safetensors"))
    }
    if not weights:
        raise ArtefactError(f"{out_dir} holds no .safetensors weights: save the model with safe_serialization")
    manifest = {
        "format": FORMAT,
        "method": method,
        "draftsmith_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "target": target,
        "proposer": proposer,
        "weights": weights,
        "training": training or {},
        "metrics": metrics or {},
        "environment": environment(),
    }
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=2, default=str) + "\n")
    return manifest


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


ProposerLoader = Callable[[Path, dict, Any, dict], Any]


def _load_draft_model_proposer(directory: Path, manifest: dict, target_model, options: dict):
    import transformers

    from draftsmith.inference.draft_length import DEFAULT_CONFIDENCE_THRESHOLD, DraftLengthPolicy
    from draftsmith.inference.proposers.draft_model import DraftModelProposer, check_same_tokenizer

    sub = directory / manifest["proposer"].get("model_dir", "draft")
    if not (sub / "config.json").is_file():
        raise ArtefactError(f"{sub}/config.json is missing: the artefact's draft model directory is incomplete")
    draft = transformers.AutoModelForCausalLM.from_pretrained(sub, dtype=target_model.dtype, use_safetensors=True)
    draft = draft.to(target_model.device).eval()
    check_same_tokenizer(target_model, draft, draft_name=str(sub))
    prop = manifest["proposer"]
    policy = DraftLengthPolicy(
        length=int(options.get("draft_length") or prop.get("draft_length", 4)),
        mode=options.get("draft_length_mode") or prop.get("draft_length_mode", "fixed"),
        max_length=max(16, int(options.get("draft_length") or prop.get("draft_length", 4))),
    )
    threshold = options.get("confidence_threshold")
    if threshold is None:
        threshold = prop.get("confidence_threshold", DEFAULT_CONFIDENCE_THRESHOLD)
    return DraftModelProposer(draft, policy, confidence_threshold=float(threshold))


# method name in the manifest -> loader; later methods (medusa, eagle, layerskip, ...) register here
PROPOSER_LOADERS: dict[str, ProposerLoader] = {
    "distillspec": _load_draft_model_proposer,
    "draft": _load_draft_model_proposer,
}


def load_artefact(
    directory: str | Path,
    target_model,
    target_tokenizer=None,
    allow_target_mismatch: bool = False,
    **options,
):
    """Read and check an artefact, and build its proposer for ``target_model``.

    Returns ``(proposer, manifest)``."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    check_target(manifest, target_model, target_tokenizer, allow_target_mismatch)
    loader = PROPOSER_LOADERS.get(manifest["method"])
    if loader is None:
        raise ArtefactError(
            f"artefact method {manifest['method']!r} is not known to this draftsmith "
            f"({', '.join(sorted(PROPOSER_LOADERS))}): upgrade draftsmith"
        )
    return loader(directory, manifest, target_model, options), manifest

