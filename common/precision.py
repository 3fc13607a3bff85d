"""The precision policy: one ``dtype`` setting (default ``auto``) decides what every model runs in.

``auto`` is bfloat16 wherever bfloat16 is native (:func:`native_bf16`): a CUDA device that supports it, and a CPU
whose oneDNN reports native bfloat16 (AVX512-BF16 or AMX); float32 elsewhere. On such a CPU (an AMD EPYC with
AVX512-BF16, one thread) a bfloat16 product runs 2.2-2.7x float32's at training shapes, and SmolLM2's forward after
512 cached tokens costs 63 ms against 67 ms for one new token and 69 / 84 / 183 ms against 112 / 156 / 331 ms for 8
/ 16 / 64 (``tests/benchmarks/bench_precision.py``), so decoding, verification and training all take it.
With a 16-bit ``dtype``:

- frozen models (the target, a teacher) are held in it: an 8B target is 16 GB, not 32;
- trained parameters keep float32 master weights and the forward runs under autocast (accelerate's mixed precision,
  ``TrainingArguments.bf16`` / ``fp16``): a draft or a head is loaded or built in float32;
- TF32 matrix products are allowed for training on CUDA (float32 evaluation stays exact: it is the identity check).

Evaluation commands hold the target (and a draft) in the resolved dtype; ``--dtype float32`` is the exact identity
check, and 16-bit answers are judged by the near-tie rule (docs/EVALUATION.md).

``DRAFTSMITH_NATIVE_BF16=0`` (or ``1``) overrides the CPU's probe: for a CPU whose oneDNN misreports, and for test suites
that need float32 whatever machine they run on.
"""

from __future__ import annotations

import os
from typing import Any

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
MIXED_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}  # TrainingArguments flag of each 16-bit dtype
NATIVE_BF16_ENV = "DRAFTSMITH_NATIVE_BF16"


def native_bf16(device: Any = "cpu") -> bool:
    """Whether ``device`` runs bfloat16 natively: CUDA's own report, or oneDNN's on the CPU (AVX512-BF16 / AMX),
    which ``$DRAFTSMITH_NATIVE_BF16`` (``0``/``1``) overrides."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    forced = os.environ.get(NATIVE_BF16_ENV, "").strip().lower()
    if forced:
        if forced not in ("0", "1"):
            from draftsmith.common.errors import ConfigError

            raise ConfigError(f"${NATIVE_BF16_ENV}={forced!r}: set it to 0 (float32) or 1 (bfloat16), or unset it "
                              "to ask oneDNN")
        return forced == "1"
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_dtype(name: str, device: Any = "cpu") -> str:
    """``auto`` -> ``bfloat16`` where :func:`native_bf16` says so, else ``float32``; other names pass through."""
    if name not in DTYPE_NAMES:
        from draftsmith.common.errors import ConfigError

        raise ConfigError(f"dtype {name!r} is unknown: choose one of {', '.join(DTYPE_NAMES)}")
    if name != "auto":
        return name
    return "bfloat16" if native_bf16(device) else "float32"


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


def first_argmax(logits):  # [..., V] -> [...] long
    """The index of the first maximum over the last dimension: ``argmax(-1)``, computed as ``max(-1).indices``, which
    gives the same index and runs 4.5x faster on the CPU in bfloat16 (a ``[512, 49152]`` bfloat16 row block, one
    thread: 35 ms against 156 ms; in float32 45 ms either way)."""
    return logits.max(-1).indices
