"""Timing device work: wall-clock seconds are only meaningful once queued GPU kernels have finished."""

from __future__ import annotations

import torch


def sync_device(device: torch.device) -> None:
    """Wait for every kernel queued on ``device`` (a no-op off CUDA), so a ``perf_counter`` reading after it
    covers the work before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
