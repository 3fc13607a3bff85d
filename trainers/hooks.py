"""The optional hooks a method's trained module or trainer offers the recipe runner, declared: a method offers one by
defining its member; the runner tests for it with ``isinstance``."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class ArtefactConfig(Protocol):
    """A ``heads``/``embeddings`` module's config, written beside its weights in the artefact."""

    def artefact_config(self) -> dict: ...


@runtime_checkable
class ArtefactTensors(Protocol):
    """A training wrapper that keeps more than the artefact holds (EAGLE-3's unroll, Medusa-2's copy of the target):
    the tensors of its state dict that go into the artefact."""

    def artefact_tensors(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


@runtime_checkable
class AdaptsTarget(Protocol):
    """A wrapper around an adapted target (LayerSkip, CLLM): the model an ``adapted_target`` artefact holds."""

    model: nn.Module

    def artefact_model(self) -> nn.Module: ...


@runtime_checkable
class TunesTarget(Protocol):
    """Tunes the target too (Medusa-2's LoRA adapter): the peft model of the target the artefact carries."""

    target_adapter: Any


@runtime_checkable
class PreparesDatasets(Protocol):
    """A trainer class that turns the tokenized rows into the datasets it trains on (EAGLE's offline features, ...):
    ``prepare_datasets(models, config, train, heldout, tokenizer, training_args) -> (train, heldout, collator)``."""

    def prepare_datasets(self, models: dict, config: Any, train: Any, heldout: Any, tokenizer: Any,
                         training_args: Any) -> tuple: ...


__all__ = ["AdaptsTarget", "ArtefactConfig", "ArtefactTensors", "PreparesDatasets", "TunesTarget"]
