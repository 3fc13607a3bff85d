"""The precision policy: one ``dtype`` setting (default ``auto``) decides what every model runs in.

``auto`` is bfloat16 on a CUDA device that supports it and float32 elsewhere (CPUs gain nothing from 16-bit weights
and lose exactness). With a 16-bit ``dtype``:

- frozen models (the target, a teacher) are held in it: an 8B target is 16 GB, not 32;
- trained parameters keep float32 master weights and the forward runs under autocast (accelerate's mixed precision,
  ``TrainingArguments.bf16`` / ``fp16``): a draft or a head is loaded or built in float32;
- TF32 matrix products are allowed for training on CUDA (float32 evaluation stays exact: it is the identity check).

Evaluation commands hold the target (and a draft) in the resolved dtype.
"""

from __future__ import annotations

from typing import Any

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
MIXED_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}  # TrainingArguments flag of each 16-bit dtype


def resolve_dtype(name: str, device: Any = "cpu") -> str:
    """``auto`` -> ``bfloat16`` on a CUDA device with bfloat16 support, else ``float32``; other names pass through."""
    if name not in DTYPE_NAMES:
        from draftsmith.common.errors import ConfigError

        raise ConfigError(f"dtype {name!r} is unknown: choose one of {', '.join(DTYPE_NAMES)}")
    if name != "auto":
        return name
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return "float32"


def mixed_precision_flag(dtype: str) -> str | None:
    """The TrainingArguments flag (``bf16`` / ``fp16``) that trains float32 master weights under autocast to
    ``dtype``, or None for float32."""
    return MIXED_PRECISION.get(dtype)


def trained_dtype(dtype: str) -> str:
    """The dtype trained weights are held in: float32 master weights whatever ``dtype`` the frozen models use."""
    return "float32" if dtype in MIXED_PRECISION else dtype


def allow_tf32_for_training() -> None:
    """TF32 tensor-core products for float32 matmuls and convolutions on CUDA (no effect elsewhere)."""
    import torch

    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
