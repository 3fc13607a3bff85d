"""The precision policy: auto is bfloat16 wherever it is native (CUDA, CPUs whose oneDNN says so), float32
elsewhere; 16-bit training keeps float32 master weights under autocast."""

from __future__ import annotations

import pytest
import torch

from draftsmith.common import precision
from draftsmith.common.errors import ConfigError
from draftsmith.common.precision import mixed_precision_flag, native_bf16, resolve_dtype, trained_dtype


def cpu_reports(monkeypatch, native: bool) -> None:
    """The CPU's probe (oneDNN) replaced, and the suite's override dropped, so that the probe decides."""
    monkeypatch.delenv(precision.NATIVE_BF16_ENV, raising=False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)


def test_auto_follows_the_cpus_probe_and_named_dtypes_pass_through(monkeypatch):
    cpu_reports(monkeypatch, True)  # AVX512-BF16 or AMX
    assert native_bf16("cpu") and resolve_dtype("auto", "cpu") == "bfloat16"
    cpu_reports(monkeypatch, False)  # no native bfloat16: float32
    assert not native_bf16("cpu") and resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16" and resolve_dtype("float16", "cuda") == "float16"
    assert resolve_dtype("float32", "cpu") == "float32"
    with pytest.raises(ConfigError, match="choose one of auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", "cpu")


def test_the_environment_overrides_the_cpus_probe_in_one_checked_value(monkeypatch):
    cpu_reports(monkeypatch, True)
    monkeypatch.setenv(precision.NATIVE_BF16_ENV, "0")
    assert resolve_dtype("auto", "cpu") == "float32"
    cpu_reports(monkeypatch, False)
    monkeypatch.setenv(precision.NATIVE_BF16_ENV, "1")
    assert resolve_dtype("auto", "cpu") == "bfloat16"
    monkeypatch.setenv(precision.NATIVE_BF16_ENV, "maybe")
    with pytest.raises(ConfigError, match=r"DRAFTSMITH_NATIVE_BF16='maybe': set it to 0 \(float32\) or 1"):
        resolve_dtype("auto", "cpu")


def test_the_zoos_pretraining_asks_the_same_probe(monkeypatch):
    from draftsmith.trainers.pretrain import autocast_dtype

    cpu_reports(monkeypatch, True)
    assert autocast_dtype("auto", "cpu") is torch.bfloat16
    cpu_reports(monkeypatch, False)
    assert autocast_dtype("auto", "cpu") is None and autocast_dtype("bf16", "cpu") is torch.bfloat16


def test_auto_is_bfloat16_on_a_cuda_device_that_supports_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setenv(precision.NATIVE_BF16_ENV, "0")  # the override is the CPU's only
    assert resolve_dtype("auto", "cuda") == resolve_dtype("auto", "cuda:1") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # pre-Ampere cards
    assert resolve_dtype("auto", "cuda") == "float32"


def test_16_bit_training_is_mixed_precision_with_float32_master_weights():
    assert mixed_precision_flag("bfloat16") == "bf16" and mixed_precision_flag("float16") == "fp16"
    assert mixed_precision_flag("float32") is None
    assert trained_dtype("bfloat16") == trained_dtype("float16") == trained_dtype("float32") == "float32"


def test_first_argmax_is_argmax_with_its_first_maximum_in_every_dtype():
    from draftsmith.common.precision import first_argmax

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 4099, generator=gen)
    logits[:, 7] = logits[:, 4000] = logits.max(-1).values + 1  # a tie: the first index wins
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        z = logits.to(dtype)
        assert torch.equal(first_argmax(z), z.argmax(-1)) and (first_argmax(z) == 7).all()
    assert first_argmax(logits[0]).shape == ()
