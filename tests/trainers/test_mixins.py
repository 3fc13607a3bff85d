"""The tuned copy of a target: float32 master weights over a 16-bit frozen original (the precision policy)."""

from __future__ import annotations

import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.trainers.mixins import tunable_copy


def test_a_full_copy_of_a_bfloat16_target_trains_float32_master_weights():
    target = random_model("llama", seed=0, layers=1).to(torch.bfloat16).requires_grad_(False)
    copy = tunable_copy(target, "full", 4, 8.0)
    assert all(p.dtype == torch.float32 and p.requires_grad for p in copy.parameters())
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in target.parameters())  # untouched
    assert torch.equal(copy.get_input_embeddings().weight.to(torch.bfloat16), target.get_input_embeddings().weight)


def test_a_lora_copy_keeps_the_16_bit_base_frozen_and_its_adapter_in_float32():
    target = random_model("llama", seed=0, layers=1).to(torch.bfloat16).requires_grad_(False)
    copy = tunable_copy(target, "lora", 4, 8.0)
    trained = [p for p in copy.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert all(p.dtype == torch.bfloat16 for p in copy.parameters() if not p.requires_grad)


class _Target:
    """A stand-in target that records where it is moved (``to``) and whether it was loaded onto devices."""

    def __init__(self, placed: bool = False):
        self.moves, self.hf_device_map = [], {"": 0} if placed else None

    def to(self, device):
        self.moves.append(str(device))
        return self

    def parameters(self):
        return iter(())


class _Args:
    device = torch.device("cpu")
    world_size = 1


def test_the_feature_cache_is_computed_on_the_training_device(monkeypatch, tmp_path):
    """The offline cache (and the answers it holds) runs the target where training runs, not on the CPU before the
    trainer places it; a target loaded onto devices (device_map) stays where it is."""
    import draftsmith.data.feature_cache as feature_cache
    from draftsmith.trainers.mixins import FeatureCache, offline_feature_datasets

    seen = []
    monkeypatch.setattr(feature_cache, "feature_datasets",
                        lambda target, *a, **kw: seen.append(list(target.moves)) or [])
    config = FeatureCache(features="offline", feature_cache_dir=str(tmp_path))
    for placed, moves in ((False, ["cpu"]), (True, [])):
        seen.clear()
        offline_feature_datasets(config, _Target(placed), None, (), (1,), _Args())
        assert seen == [moves]
