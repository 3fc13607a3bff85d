"""The target a command runs on, loaded one way everywhere (``draftsmith eval``, ``tune``, ``exit-layer``,
``draft-verify``, ``data`` and the recipe runner).

``--target`` is a model directory, a ``.gguf`` file, a hub id or a named real target (``smollm2-135m``, imported on
first use); without it, the built-in zoo's target, the zoo built on first use (:func:`zoo_model_dir`).
``--tokenizer`` defaults to the target's own (:func:`tokenizer_source`): a local target without one is a
:class:`~draftsmith.common.errors.ConfigError` naming ``--tokenizer``.
"""

from __future__ import annotations

import os
from pathlib import Path

from draftsmith.common.errors import ConfigError
from draftsmith.common.models import load_model, load_tokenizer, resolve_model_path, tokenizer_dir_for
from draftsmith.common.paths import zoo_path


def zoo_model_dir(size: str = "tiny", role: str = "target", home: str | os.PathLike | None = None) -> Path:
    """``<home>/zoo/<size>/<role>`` (``tokenizer``, ``target`` or ``draft``), building the zoo first when it is not
    built (:func:`draftsmith.trainers.zoo.ensure_zoo`)."""
    from draftsmith.trainers.zoo import ensure_zoo

    ensure_zoo(size, home=home)
    return zoo_path(size, role, home)


def tokenizer_source(target: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> str:
    """Where the tokenizer of ``target`` loads from: ``tokenizer`` when given; else the target's own (its
    directory's tokenizer files, a zoo-style sibling ``tokenizer/``, its GGUF file), or a hub id itself. A local
    target with no tokenizer raises :class:`ConfigError`."""
    if tokenizer:
        return str(tokenizer)
    own = tokenizer_dir_for(target)
    if own is not None:
        return str(own)
    resolved = resolve_model_path(target)
    if Path(resolved).expanduser().exists():
        raise ConfigError(f"the target directory {target} holds no tokenizer: pass --tokenizer DIR")
    return resolved  # a hub id: its own tokenizer


def load_target(target: str | os.PathLike | None = None, tokenizer: str | os.PathLike | None = None,
                zoo: str = "tiny", *, home: str | os.PathLike | None = None, dtype: str = "float32",
                device: str | None = None, quantization: str = "none", attn_implementation: str | None = None):
    """``(target_dir, model, tokenizer)`` for a command's ``--target`` / ``--tokenizer`` (default: the target of the
    ``zoo`` size under ``home``). The model is in eval mode, in ``dtype``, on ``device`` when given, quantized or
    with another attention as :func:`~draftsmith.common.models.load_model` takes them."""
    target_dir = Path(target).expanduser() if target else zoo_model_dir(zoo, "target", home)
    model = load_model(target_dir, dtype, device, what="target", quantization=quantization,
                       attn_implementation=attn_implementation).eval()
    return target_dir, model, load_tokenizer(tokenizer_source(target_dir, tokenizer))


__all__ = ["load_target", "tokenizer_source", "zoo_model_dir"]
