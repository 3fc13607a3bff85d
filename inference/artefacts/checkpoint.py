"""An engine's checkpoint directory (``model.safetensors`` + ``config.json``), written atomically: every export
format ends here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftsmith.common.io import atomic_write_json, umask_modes


def write_export(out: str | os.PathLike, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """An engine's checkpoint directory at ``out`` (``model.safetensors`` + ``config.json``), atomically: staged
    beside it, then renamed over any older export."""
    out = Path(out)
    staging = out.with_name(f".{out.name}.export.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        save_file(tensors, str(staging / "model.safetensors"))
        umask_modes(staging / "model.safetensors")
        atomic_write_json(staging / "config.json", config)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


__all__ = ["write_export"]
