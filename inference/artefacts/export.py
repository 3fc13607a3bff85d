"""``draftsmith export``: an artefact in a serving engine's checkpoint layout (docs/EXPORT.md).

Each method's registry entry names its formats and their exporters (``MethodSpec.export_formats``: format ->
``exporter(artefact, manifest, fmt, out, target_model) -> Path``); the exporters live beside each method's artefact
loader (:mod:`draftsmith.inference.artefacts.medusa`, :mod:`draftsmith.inference.artefacts.eagle`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from draftsmith.common.errors import ConfigError
from draftsmith.common.registry import REGISTRY, export_formats
from draftsmith.inference.artefacts.medusa import describe_medusa_export
from draftsmith.inference.artefacts.reader import check_target, read_manifest, read_weights


def check_export(artefact: str | os.PathLike, fmt: str) -> dict:
    """The manifest of ``artefact`` once it is known to export as ``fmt``: the format exists, the artefact is read as
    every command reads it (:func:`~draftsmith.inference.artefacts.reader.read_manifest`: every file checked against
    its manifest) and is of the format's method. Writes nothing."""
    formats = export_formats()
    if fmt not in formats:
        raise ConfigError(f"export format {fmt!r} is unknown: choose one of {', '.join(formats)}")
    manifest = read_manifest(artefact)
    methods = formats[fmt]
    if manifest.get("method") not in methods:
        raise ConfigError(f"--format {fmt} exports {' or '.join(methods)} artefacts, but {artefact} is a "
                          f"{manifest.get('method')} artefact")
    return manifest


def export_artefact(artefact: str | os.PathLike, fmt: str, out: str | os.PathLike, target_model=None) -> Path:
    """Export the artefact at ``artefact`` in format ``fmt`` (:func:`draftsmith.common.registry.export_formats`) to
    ``out`` (:func:`check_export`; an existing ``out`` only when it is an earlier export of ``fmt``:
    :func:`~draftsmith.inference.artefacts.checkpoint.check_replaceable`); ``target_model``, when given, must be the
    target it was trained for."""
    manifest = check_export(artefact, fmt)
    method = manifest["method"]
    if target_model is not None:  # heads of another target would ship with its LM head or layer sizes
        check_target(manifest, target_model, None, escape="leave --target out to use the target its manifest names")
    return REGISTRY.get(method).export_formats[fmt](artefact, manifest, fmt, out, target_model)


def describe(out: str | os.PathLike) -> str:
    """One line: what an export directory holds."""
    config = json.loads((Path(out) / "config.json").read_text())
    tensors = len(read_weights(Path(out) / "model.safetensors"))
    if config.get("model_type") == "medusa":
        return describe_medusa_export(out, config, tensors)
    return f"{out}: {config['architectures'][0]} draft head, {tensors} tensors"


__all__ = ["check_export", "describe", "export_artefact"]
