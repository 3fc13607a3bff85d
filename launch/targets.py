"""The models a command runs on, resolved and loaded one way everywhere (``draftsmith eval``, ``tune``, ``exit-layer``,
``draft-verify``, ``data``, ``export`` and the recipe runner).

:func:`resolve_model_arg` is the one resolver of ``--target`` and ``--draft``, run before anything loads: a model
directory, a built zoo's directory (its ``target/`` or ``draft/``), a ``.gguf`` file (its header checked), a named
real target (``smollm2-135m``, imported on first use) or a hub id; ``~`` is expanded, and a path that is none of these
is refused in one line naming the option. Without ``--target``, the built-in zoo's target, the zoo built on first use
(:func:`zoo_model_dir`). ``--tokenizer`` defaults to the target's own (:func:`tokenizer_source`: its directory's
tokenizer files, the zoo's sibling ``tokenizer/``, its GGUF file, or a hub id itself); a local target without one is a
:class:`~draftsmith.common.errors.ConfigError` naming ``--tokenizer``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.models import (
    NAMED_MODELS,
    check_gguf,
    has_tokenizer,
    is_gguf,
    load_model,
    load_tokenizer,
    quiet_transformers,
    resolve_model_path,
    tokenizer_dir_for,
)
from draftsmith.common.outputs import prepare_output, write_failures
from draftsmith.common.paths import zoo_dir, zoo_path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
KINDS = "a model directory, a .gguf file, a hub id or " + ", ".join(NAMED_MODELS)


def zoo_model_dir(size: str = "tiny", role: str = "target", home: str | os.PathLike | None = None) -> Path:
    """``<home>/zoo/<size>/<role>`` (``tokenizer``, ``target`` or ``draft``), building the zoo first when it is not
    built (:func:`draftsmith.trainers.zoo.ensure_zoo`): its directory checked writable before the build starts."""
    from draftsmith.trainers.zoo import ensure_zoo

    if not zoo_path(size, "manifest.json", home).is_file():
        where = zoo_dir(size, home)
        prepare_output(where, "the zoo directory (DRAFTSMITH_HOME or --home)", "dir")
        with write_failures(where, f"the {size} zoo's finished stages in {where}: rerun to resume the build"):
            ensure_zoo(size, home=home)
    else:
        ensure_zoo(size, home=home)
    return zoo_path(size, role, home)


def _zoo_part(path: Path, role: str) -> Path | None:
    """``path/role`` when ``path`` is a built zoo's directory (``manifest.json`` beside ``target/`` ...)."""
    part = path / role
    return part if (path / "manifest.json").is_file() and part.is_dir() else None


def _looks_local(text: str) -> bool:
    """Whether a name that does not exist was meant as a local path rather than a hub id."""
    path = Path(text)
    return (path.is_absolute() or text.startswith((".", "~")) or "\\" in text or text.count("/") > 1
            or text.endswith("/") or (len(path.parts) > 1 and Path(path.parts[0]).exists()))


HUB_PROBE_SECONDS = 10.0


def hub_reason(name: str, timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """Why the hub id ``name`` cannot be loaded, from the local Hugging Face cache and one request to the hub (no
    retries: the download's five retries take 23 s on a machine without network); None when it can be."""
    import huggingface_hub
    from huggingface_hub import errors

    if isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str):
        return None
    try:
        huggingface_hub.model_info(name, timeout=timeout)
    except errors.RepositoryNotFoundError:
        return "no such model repository on the hub, or it is private"
    except errors.GatedRepoError:
        return "a gated repository: log in with `hf auth login` after accepting its terms"
    except errors.OfflineModeIsEnabled:
        return "not in the local Hugging Face cache, and HF_HUB_OFFLINE is set"
    except Exception as err:  # connection errors (httpx), timeouts, HTTP errors
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return f"not in the local Hugging Face cache, and the hub cannot be reached: {first}"
    return None


def check_hub_model(name: str, flag: str) -> None:
    """Refuse a hub id whose config cannot be had (not cached, no network, no such repository) in one line naming
    ``flag``, within one request's time (:func:`hub_reason`); the config is then cached for the load that follows."""
    import transformers

    reason = hub_reason(name)
    if reason is None:
        try:
            with quiet_transformers():
                transformers.AutoConfig.from_pretrained(name)
        except Exception as err:  # OSError (lost connection), ValueError (not a model), ...
            text = str(err).strip()
            reason = text.splitlines()[0] if text else type(err).__name__
    if reason is not None:
        raise ConfigError(f"{flag} {name} is not a local path, and as a hub id it cannot be loaded ({reason}): pass "
                          f"{KINDS}")


def resolve_model_arg(value: str | os.PathLike, flag: str = "--target", role: str = "target", *,
                      check_hub: bool = True) -> str:
    """What ``value`` of option ``flag`` names, checked before anything loads (module docstring): the model directory
    (a built zoo's directory gives its ``role`` part) or the checked ``.gguf`` file as an absolute path, the named
    target as it is named, or the hub id (its config fetched when ``check_hub``). A one-line :class:`ConfigError`
    names ``flag`` otherwise."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if not text.strip() or "\x00" in text:
        raise ConfigError(f"{flag} {text!r} is not a model: pass {KINDS}")
    if text in NAMED_MODELS and not Path(text).exists():
        return text
    path = Path(text).expanduser().absolute()  # a manifest that records it resolves from any working directory
    shown = path if text.startswith("~") else text
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(path)
        part = _zoo_part(path, role)
        if part is not None:
            return str(part)
        raise ConfigError(f"{flag} {shown} is a directory without config.json, not a model: pass a Hugging Face model "
                          f"directory (save_pretrained's), or {KINDS}")
    if path.is_file():
        if not is_gguf(path):
            raise ConfigError(f"{flag} {shown} is a file but not a .gguf model: pass a model directory or a .gguf file")
        try:
            return str(check_gguf(path, f"{role} ({flag})"))
        except DraftsmithError as err:
            raise ConfigError(str(err)) from None
    if is_gguf(text) or _looks_local(text) or not HUB_ID.match(text) or ".." in text or "--" in text:
        raise ConfigError(f"{flag} {shown} does not exist: pass {KINDS}")
    if check_hub:
        check_hub_model(text, flag)
    return text


def tokenizer_source(target: str | os.PathLike, tokenizer: str | os.PathLike | None = None,
                     flag: str = "--tokenizer") -> str:
    """Where the tokenizer of ``target`` loads from: ``tokenizer`` when given (a directory with tokenizer files, a
    zoo's directory, a ``.gguf`` file or a hub id; a local path without a tokenizer is refused); else the target's own
    (its directory's tokenizer files, a zoo-style sibling ``tokenizer/``, its GGUF file), or a hub id itself. A local
    target with no tokenizer raises :class:`ConfigError`."""
    if tokenizer:
        text = os.fspath(tokenizer) if isinstance(tokenizer, os.PathLike) else str(tokenizer)
        path = Path(text).expanduser()
        if path.exists():
            own = path if has_tokenizer(path) else _zoo_part(path, "tokenizer")
            if own is None:
                raise ConfigError(f"{flag} {path} holds no tokenizer (tokenizer.json, tokenizer_config.json, ...): "
                                  "pass a tokenizer directory, a .gguf file or a hub id")
            return str(own)
        if is_gguf(text) or _looks_local(text):
            raise ConfigError(f"{flag} {path} does not exist: pass a tokenizer directory, a .gguf file or a hub id")
        return text  # a hub id
    target = Path(str(target)).expanduser() if str(target).startswith("~") else target
    own = tokenizer_dir_for(target)
    if own is not None:
        return str(own)
    resolved = resolve_model_path(target)
    if Path(resolved).expanduser().exists():
        raise ConfigError(f"the target directory {target} holds no tokenizer: pass --tokenizer DIR")
    return resolved  # a hub id: its own tokenizer


DEVICE_KINDS = "auto, cpu, cuda or cuda:N"


def resolve_device(name: str) -> str:
    """``--device``: ``auto`` (cuda when available, else cpu), or a device this machine has; anything else is one
    :class:`ConfigError` line."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"--device {name!r} is not a device: pass {DEVICE_KINDS}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name} requested but CUDA is not available: use --device cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"--device {name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"--device {name} requested but MPS is not available: use --device cpu")
    elif device.type != "cpu":
        raise ConfigError(f"--device {name}: draftsmith runs on the CPU, CUDA or MPS: pass {DEVICE_KINDS}")
    return name


def add_placement_options(group) -> None:
    """``--dtype`` and ``--device``, as every command that runs a model takes them."""
    from draftsmith.common.models import DTYPES

    group.add_argument("--dtype", default="auto", choices=DTYPES,
                       help="weights dtype; auto (default): bfloat16 where native (CUDA, CPUs with AVX512-BF16 or "
                            "AMX), else float32; float32 is the exact identity check")
    group.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")


def placement(args) -> tuple[str, str]:
    """``(device, dtype)`` of ``--device``/``--dtype``, checked (:func:`resolve_device`) and ``auto`` resolved:
    bfloat16 where native, else float32 (:func:`~draftsmith.common.precision.resolve_dtype`)."""
    from draftsmith.common.precision import resolve_dtype

    device = resolve_device(args.device)
    return device, resolve_dtype(args.dtype, device)


def load_target(target: str | os.PathLike | None = None, tokenizer: str | os.PathLike | None = None,
                zoo: str = "tiny", *, home: str | os.PathLike | None = None, dtype: str = "float32",
                device: str | None = None, quantization: str = "none", attn_implementation: str | None = None):
    """``(target_dir, model, tokenizer)`` for a command's ``--target`` / ``--tokenizer`` (default: the target of the
    ``zoo`` size under ``home``), both resolved (:func:`resolve_model_arg`, :func:`tokenizer_source`) before either
    loads. The model is in eval mode, in ``dtype``, on ``device`` when given, quantized or with another attention as
    :func:`~draftsmith.common.models.load_model` takes them."""
    target_dir = Path(resolve_model_arg(target)) if target is not None else zoo_model_dir(zoo, "target", home)
    source = tokenizer_source(target_dir, tokenizer)
    model = load_model(target_dir, dtype, device, what="target", quantization=quantization,
                       attn_implementation=attn_implementation).eval()
    return target_dir, model, load_tokenizer(source)


__all__ = ["add_placement_options", "check_hub_model", "load_target", "placement", "resolve_device", "resolve_model_arg",
           "tokenizer_source", "zoo_model_dir"]
