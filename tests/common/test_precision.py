"""The precision policy: auto resolves per device, 16-bit training keeps float32 master weights under autocast."""

from __future__ import annotations

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.common.precision import mixed_precision_flag, resolve_dtype, trained_dtype


def test_auto_is_float32_on_the_cpu_and_named_dtypes_pass_through():
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16" and resolve_dtype("float16", "cuda") == "float16"
    with pytest.raises(ConfigError, match="choose one of auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", "cpu")


def test_auto_is_bfloat16_on_a_cuda_device_that_supports_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", "cuda") == resolve_dtype("auto", "cuda:1") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # pre-Ampere cards
    assert resolve_dtype("auto", "cuda") == "float32"


def test_16_bit_training_is_mixed_precision_with_float32_master_weights():
    assert mixed_precision_flag("bfloat16") == "bf16" and mixed_precision_flag("float16") == "fp16"
    assert mixed_precision_flag("float32") is None
    assert trained_dtype("bfloat16") == trained_dtype("float16") == trained_dtype("float32") == "float32"
