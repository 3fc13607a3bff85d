"""Batching of tokenized rows: right padding for training, and which positions a loss counts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from draftsmith.data.chat import IGNORE_INDEX


@dataclass
class PadCollator:
    """Right-pads ``input_ids`` (with ``pad_token_id``), ``labels`` (with -100) and ``attention_mask`` (with 0)."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        pads = {"input_ids": self.pad_token_id, "labels": IGNORE_INDEX, "attention_mask": 0}
        defaults = {"input_ids": None, "labels": "input_ids", "attention_mask": "ones"}  # when a row lacks a key
        out = {}
        for key, pad in pads.items():
            rows = []
            for f in features:
                if key in f:
                    row = list(f[key])
                else:
                    row = list(f["input_ids"]) if defaults[key] == "input_ids" else [1] * len(f["input_ids"])
                rows.append(row + [pad] * (length - len(row)))
            out[key] = torch.tensor(rows, dtype=torch.long)  # [B, T]
        return out



def response_mask(labels: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T-1] bool
    """Which logits positions are trained: position ``t`` predicts token ``t + 1``, which counts when labelled."""
    return labels[:, 1:] != IGNORE_INDEX
