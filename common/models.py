"""Loading models and tokenizers, and the identity of a model (what an artefact records of its target).

One loader for every command and recipe: local directories or hub ids, one-line errors naming the fix."""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.io import sha256_json
from draftsmith.common.outputs import write_failures
from draftsmith.common.precision import resolve_dtype
from draftsmith.common.sharding import full_shape

DTYPES = ("float32", "bfloat16", "float16", "auto")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# config keys that do not change what the model computes
_VOLATILE_CONFIG_KEYS = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures",
                         "_attn_implementation", "_attn_implementation_autoset", "use_cache",
                         "quantization_config"}  # a GGUF file's dequantized weights compute like the plain model's
# Names that work as a model path everywhere: imported on first use (draftsmith.data.model_import).
NAMED_MODELS = {"smollm2-135m": "draftsmith.data.model_import:ensure_imported",
                "gemma3-270m": "draftsmith.data.model_import:ensure_imported"}
GGUF_SUFFIX = ".gguf"


def torch_dtype(name: str | Any):
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` -> the torch dtype; ``"auto"`` stays ``"auto"``; a torch
    dtype passes through."""
    import torch

    if not isinstance(name, str):
        return name
    if name == "auto":
        return "auto"
    if name not in DTYPES:
        raise DraftsmithError(f"dtype {name!r} is unknown: choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' logging at error level and its progress bars off for the block."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


QUANTIZATIONS = ("none", "8bit", "4bit")


def check_quantization_available(kind: str) -> None:
    """Raise :class:`ConfigError` unless bitsandbytes ``kind`` quantization can run here."""
    import torch

    if kind not in QUANTIZATIONS:
        raise ConfigError(f"quantization {kind!r} is unknown: choose one of {', '.join(QUANTIZATIONS)}")
    if kind == "none":
        return
    if not torch.cuda.is_available():
        raise ConfigError(f"target_quantization={kind} needs a CUDA GPU (bitsandbytes) and none is visible: "
                          "use target_quantization=none on this machine")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError(f"target_quantization={kind} needs bitsandbytes: pip install 'draftsmith[quant]', "
                          "or use target_quantization=none") from None


def quantization_kwargs(kind: str) -> dict:
    """``from_pretrained`` arguments that load a model in bitsandbytes 8-bit or 4-bit NF4 (compute in bf16) on
    the current CUDA device; ``{}`` for ``none``."""
    import torch
    import transformers

    check_quantization_available(kind)
    if kind == "none":
        return {}
    config = transformers.BitsAndBytesConfig(load_in_8bit=kind == "8bit", load_in_4bit=kind == "4bit",
                                             bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    return {"quantization_config": config, "device_map": {"": torch.cuda.current_device()}}


def resolve_model_path(name_or_path: str | os.PathLike) -> str:
    """A named model (:data:`NAMED_MODELS`, e.g. ``smollm2-135m``) -> its imported directory, importing it on
    first use; anything else unchanged (a directory, a ``.gguf`` file or a hub id)."""
    name = str(name_or_path)
    if name in NAMED_MODELS and not Path(name).exists():
        from draftsmith.common.paths import models_dir
        from draftsmith.common.registry import resolve

        with write_failures(models_dir(), f"any earlier import of {name}, unchanged: set DRAFTSMITH_HOME to a "
                                          "writable directory and rerun"):
            return str(resolve(NAMED_MODELS[name])(name))
    return name


def is_gguf(name_or_path: str | os.PathLike) -> bool:
    return str(name_or_path).lower().endswith(GGUF_SUFFIX)


def _gguf_file(path: str | os.PathLike, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DraftsmithError(f"{what} {path} does not exist: pass an existing .gguf file")
    return path


# GGUF value types: scalar sizes; 8 is a string, 9 an array (github.com/ggml-org/ggml/blob/master/docs/gguf.md)
_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY, _GGUF_MAX_DIMS = 8, 9, 4


class _GGUFCursor:
    """Reads a GGUF file's header front to back, every length checked against the bytes left (a ValueError says
    where it breaks)."""

    def __init__(self, data) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError(f"it ends at byte {len(self.data)}, inside its {what}")
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += size
        return value

    def skip(self, size: int, what: str) -> None:
        if size < 0 or self.pos + size > len(self.data):
            raise ValueError(f"its {what} runs past the end of the file ({len(self.data)} bytes)")
        self.pos += size

    def string(self, what: str) -> bytes:
        length = self.take("<Q", what)
        start = self.pos
        self.skip(length, what)
        return bytes(self.data[start:self.pos])

    def value(self, kind: int, key: str, depth: int = 0):
        if kind in _GGUF_SCALAR_SIZES:
            fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[_GGUF_SCALAR_SIZES[kind]]
            return self.take(fmt, f"value of {key}")
        if kind == _GGUF_STRING:
            return self.string(f"value of {key}")
        if kind != _GGUF_ARRAY or depth > 2:
            raise ValueError(f"metadata {key} has the unknown value type {kind}")
        element, count = self.take("<I", f"array {key}"), self.take("<Q", f"array {key}")
        if element in _GGUF_SCALAR_SIZES:
            return self.skip(count * _GGUF_SCALAR_SIZES[element], f"array {key}")
        if count * 8 > len(self.data) - self.pos:
            raise ValueError(f"array {key} claims {count} elements, more than the file holds")
        for _ in range(count):
            self.value(element, key, depth + 1)
        return None


def _tensor_bytes(kind: int, dims: list[int]) -> int:
    """Bytes of a tensor of ggml type ``kind`` (0 when the gguf package, which knows the block sizes, is absent)."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:
        return 0
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise ValueError(f"a tensor has the unknown ggml type {kind}") from None
    return math.prod(dims) // block * size


def check_gguf(path: str | os.PathLike, what: str = "model") -> Path:
    """``path`` if it is a whole GGUF file (v2 or v3): magic, header, every metadata entry and tensor description
    within the file and every tensor's data inside it; else one :class:`DraftsmithError` line saying where it
    breaks, before any loader reads it."""
    path = _gguf_file(path, what)
    try:
        with open(path, "rb") as fh:
            data = fh.read(24)
            if len(data) < 24 or data[:4] != b"GGUF":
                raise ValueError(f"it is {len(data)} bytes long, shorter than a GGUF header" if len(data) < 24 else
                                 "it does not start with the GGUF magic bytes")
            fh.seek(0)
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as blob:
                _walk_gguf(_GGUFCursor(blob))
    except OSError as err:
        raise DraftsmithError(f"cannot read the {what} {path}: {_first_line(err)}") from None
    except (ValueError, struct.error, OverflowError) as err:
        raise DraftsmithError(f"cannot load the {what} from {path}: not a readable GGUF file ({_first_line(err)}); "
                              "pass a whole .gguf file (download or convert it again)") from None
    return path


def _walk_gguf(cur: _GGUFCursor) -> None:
    cur.take("<4s", "magic")
    version = cur.take("<I", "header")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}; versions 2 and 3 are read")
    tensors, entries = cur.take("<Q", "header"), cur.take("<Q", "header")
    left = len(cur.data) - cur.pos
    if tensors > left // 24 or entries > left // 12:
        raise ValueError(f"its header counts {tensors} tensors and {entries} metadata entries, more than its "
                         f"{len(cur.data)} bytes hold")
    alignment = 32
    for _ in range(entries):
        key = cur.string("metadata key").decode("utf-8", errors="replace")
        value = cur.value(cur.take("<I", f"type of {key}"), key)
        if key == "general.alignment":
            alignment = value if isinstance(value, int) and value > 0 else 0
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError("its general.alignment is not a power of two")
    described = []
    for _ in range(tensors):
        name = cur.string("tensor name").decode("utf-8", errors="replace")
        ndims = cur.take("<I", f"tensor {name}")
        if not 1 <= ndims <= _GGUF_MAX_DIMS:
            raise ValueError(f"tensor {name} has {ndims} dimensions")
        dims = [cur.take("<Q", f"tensor {name}") for _ in range(ndims)]
        described.append((name, cur.take("<I", f"tensor {name}"), dims, cur.take("<Q", f"tensor {name}")))
    start = -(-cur.pos // alignment) * alignment
    for name, kind, dims, offset in described:
        if start + offset + _tensor_bytes(kind, dims) > len(cur.data):
            raise ValueError(f"tensor {name} lies past the end of the file (is it cut short?)")


def load_gguf_model(path: str | os.PathLike, dtype: Any = "float32", what: str = "model"):
    """A causal LM from a GGUF file through transformers' GGUF loader, dequantized to ``dtype`` (float32 or
    bfloat16)."""
    import transformers

    path = check_gguf(path, what)
    if dtype == "auto":
        dtype = "float32"
    try:
        with quiet_transformers():
            return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                     dtype=torch_dtype(dtype))
    except ImportError as err:
        raise DraftsmithError(f"loading {path.name} needs the gguf package: pip install gguf ({_first_line(err)})") \
            from None
    except DraftsmithError:
        raise
    except Exception as err:  # a damaged file trips the reader in its own way (KeyError, struct.error, ...)
        raise DraftsmithError(f"cannot load the {what} from {path}: {_first_line(err)}") from None


def load_model(name_or_path: str | os.PathLike, dtype: Any = "float32", device: str | None = None,
               what: str = "model", quantization: str = "none", attn_implementation: str | None = None, **kwargs):
    """A causal LM from a Hugging Face directory or hub id (``kwargs`` go to ``from_pretrained``), optionally
    quantized, moved to ``device`` when given (never a quantized one). A ``.gguf`` file is dequantized
    (:func:`load_gguf_model`); a named model (:data:`NAMED_MODELS`) is imported on first use. Left in the mode
    ``from_pretrained`` gives (eval). Errors are one line.

    ``attn_implementation``: transformers' attention (``sdpa`` when None) or a name registered in its
    ``AttentionInterface`` beforehand (GGUF files too), such as the tree attention's:
    ``load_model(path, attn_implementation=draftsmith.kernels.tree_attention.register_tree_attention())`` runs
    ``sdpa`` everywhere except the tree steps of :class:`~draftsmith.inference.core.adapter.ModelAdapter` on CUDA, which
    run the Triton tree-attention kernel."""
    import transformers

    name_or_path = resolve_model_path(name_or_path)
    if dtype == "auto":  # the precision policy: bfloat16 where native, float32 elsewhere
        dtype = resolve_dtype(dtype, device or "cpu")
    if is_gguf(name_or_path):
        if quantization != "none":
            raise ConfigError("a GGUF target is loaded dequantized: drop target_quantization (or pass a model "
                              "directory to quantize with bitsandbytes)")
        model = load_gguf_model(name_or_path, dtype, what)
        if attn_implementation is not None:
            model.set_attn_implementation(attn_implementation)
        return model.to(device) if device is not None else model
    kwargs.update(quantization_kwargs(quantization))
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation

    path = Path(name_or_path).expanduser()
    looks_local = path.is_absolute() or str(name_or_path).startswith((".", "~")) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        raise DraftsmithError(f"{what} {path} is not a model directory (no config.json): pass a Hugging Face "
                              "model directory")
    try:
        with quiet_transformers():
            model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype),
                                                                      **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise DraftsmithError(f"cannot load the {what} from {name_or_path}: {_first_line(err)}") from None
    return model.to(device) if device is not None and quantization == "none" else model


def has_tokenizer(path: str | os.PathLike) -> bool:
    if is_gguf(path):
        return Path(path).is_file()  # a GGUF file carries its tokenizer
    return any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def tokenizer_dir_for(model_dir: str | os.PathLike) -> Path | None:
    """The model's own tokenizer directory (or its GGUF file), else a zoo-style sibling ``tokenizer/`` directory,
    else None."""
    model_dir = Path(resolve_model_path(model_dir))
    if has_tokenizer(model_dir):
        return model_dir
    sibling = model_dir.parent / "tokenizer"
    return sibling if has_tokenizer(sibling) else None


def load_tokenizer(name_or_path: str | os.PathLike, what: str = "tokenizer"):
    """A tokenizer with a pad token (the EOS token when it has none); one-line errors."""
    import transformers

    name_or_path = resolve_model_path(name_or_path)
    source = {"pretrained_model_name_or_path": str(name_or_path)}
    if is_gguf(name_or_path):
        path = check_gguf(name_or_path, what)
        source = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    try:
        with quiet_transformers():
            tokenizer = transformers.AutoTokenizer.from_pretrained(**source)
    except (OSError, ValueError, KeyError) as err:
        raise DraftsmithError(f"cannot load the {what} from {name_or_path}: {_first_line(err)} "
                              "(pass --tokenizer DIR)") from None
    except Exception as err:
        if "gguf_file" not in source:
            raise
        raise DraftsmithError(f"cannot load the {what} from {name_or_path}: {_first_line(err)}") from None
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ------------------------------------------------------------------------------------------------- identity


def config_sha256(config) -> str:
    """Hash of a model config's computation-relevant fields."""
    return sha256_json({k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS})


def tokenizer_sha256(tokenizer, chat_template: bool = True) -> str:
    """Hash of a tokenizer's vocabulary and special tokens (and chat template): equal hashes tokenize alike.
    ``chat_template=False`` compares tokenization only (a draft and its target may format chats differently)."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())
    blob = {"vocab": vocab, "special": special}
    if chat_template:
        blob["chat_template"] = getattr(tokenizer, "chat_template", None)
    return sha256_json(blob)


def lm_head_rows(model) -> int:
    """Rows of the LM head: the logits' vocabulary (the full shape even when ZeRO-3 has partitioned the weight,
    whose local shape is then empty)."""
    return int(full_shape(model.get_output_embeddings().weight)[0])


def target_identity(model, tokenizer, name_or_path: str | None = None) -> dict:
    """What an artefact records of its target: name, config and tokenizer hashes, vocabulary size."""
    return {
        "name_or_path": str(name_or_path or getattr(model.config, "_name_or_path", "") or ""),
        "config_sha256": config_sha256(model.config),
        "tokenizer_sha256": tokenizer_sha256(tokenizer) if tokenizer is not None else None,
        "vocab_size": lm_head_rows(model),
    }


def cache_keyword(module) -> str:
    """The name under which ``module``'s forward takes its KV cache: ``cache`` since transformers 5.24,
    ``past_key_values`` before (still accepted, with a deprecation warning, until 5.40)."""
    return _cache_keyword(type(module))


@functools.cache
def _cache_keyword(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"
