"""The offline feature cache: keyed reuse, the disk budget, resuming a killed build, reading rows back."""

from __future__ import annotations

import pickle

import pytest
import torch

from draftsmith.common.errors import ConfigError
from draftsmith.data.feature_cache import (
    CacheSpec,
    FeatureCollator,
    FeatureDataset,
    build_feature_cache,
    bytes_per_token,
    cache_key,
)
from draftsmith.data.tiny_models import random_model

ROWS = [{"input_ids": list(range(3, 3 + n)), "labels": [-100] * 2 + list(range(5, 3 + n))} for n in (5, 9, 7, 6, 8)]
IDENTITY = {"config_sha256": "x"}


def test_rows_come_back_with_the_targets_features(tmp_path):
    target = random_model("llama", seed=0, layers=3)
    spec = CacheSpec(layers=(1, -1), dtype="float32", shard_rows=2, batch_size=2)
    data = FeatureDataset(build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False))
    assert len(data) == 5 and data.layers == (1, -1)
    for i, source in enumerate(ROWS):  # batched by length inside each shard, read back in row order
        with torch.no_grad():
            out = target(input_ids=torch.tensor([source["input_ids"]]), output_hidden_states=True)
        row = data[i]
        assert row["input_ids"] == source["input_ids"] and row["labels"] == source["labels"]
        assert torch.allclose(row["feat_1"], out.hidden_states[1][0], atol=1e-5)
        assert torch.allclose(row["feat_-1"], out.hidden_states[-1][0], atol=1e-5)
    batch = FeatureCollator(0)([data[0], data[1]])
    assert batch["feat_-1"].shape == (2, 9, 32) and batch["input_ids"].shape == (2, 9)
    assert bool((batch["feat_-1"][0, 5:] == 0).all()) and batch["attention_mask"][0].tolist() == [1] * 5 + [0] * 4


def test_rows_read_in_any_order_and_after_pickling_are_the_same(tmp_path):
    target = random_model("llama", seed=0, layers=3)
    spec = CacheSpec(layers=(1, -1), dtype="float16", shard_rows=2, batch_size=2)
    data = FeatureDataset(build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False))
    first = [data[i] for i in range(len(data))]
    again = pickle.loads(pickle.dumps(data))  # as a worker process gets it: no open shard travels
    for i in (4, 0, 3, 1, 2, 4):  # across the three shards, back and forth
        row = again[i]
        assert row["input_ids"] == first[i]["input_ids"] and row["labels"] == first[i]["labels"]
        assert row["feat_1"].dtype == torch.float16 and torch.equal(row["feat_1"], first[i]["feat_1"])
        assert torch.equal(row["feat_-1"], first[i]["feat_-1"]) and row["feat_-1"].shape == (len(row["input_ids"]), 32)


def test_a_matching_cache_is_reused_and_another_gets_its_own_key(tmp_path):
    target = random_model("llama", seed=0, layers=3)
    spec = CacheSpec(layers=(-1,), shard_rows=2)
    first = build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False)
    stamp = (first / "shard-00000.safetensors").stat().st_mtime_ns
    assert build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False) == first
    assert (first / "shard-00000.safetensors").stat().st_mtime_ns == stamp  # not rewritten
    assert cache_key(IDENTITY, ROWS[:4], spec) != first.name  # other rows: another cache
    assert cache_key(IDENTITY, ROWS, CacheSpec(layers=(1, -1))) != first.name  # other layers: another cache
    assert cache_key({"config_sha256": "y"}, ROWS, spec) != first.name  # another target: another cache


def test_a_cache_of_more_layers_on_the_same_rows_serves_a_subset(tmp_path):
    target = random_model("llama", seed=0, layers=3)
    wide = build_feature_cache(target, ROWS, tmp_path, CacheSpec(layers=(1, 2, -1), dtype="float32"), IDENTITY,
                               progress=False)
    narrow = CacheSpec(layers=(-1,), dtype="float32")
    assert build_feature_cache(target, ROWS, tmp_path, narrow, IDENTITY, progress=False) == wide  # nothing built
    assert [p.name for p in tmp_path.iterdir()] == [wide.name]
    data = FeatureDataset(wide, narrow.layers)
    assert data.layers == (-1,) and sorted(k for k in data[0] if k.startswith("feat_")) == ["feat_-1"]
    with torch.no_grad():
        out = target(input_ids=torch.tensor([ROWS[1]["input_ids"]]), output_hidden_states=True)
    assert torch.allclose(data[1]["feat_-1"], out.hidden_states[-1][0], atol=1e-5)
    other_rows = build_feature_cache(target, ROWS[:3], tmp_path, narrow, IDENTITY, progress=False)
    other_dtype = build_feature_cache(target, ROWS, tmp_path, CacheSpec(layers=(-1,)), IDENTITY, progress=False)
    assert len({wide, other_rows, other_dtype}) == 3  # other rows or another dtype: built anew
    with pytest.raises(ConfigError, match="keeps layers"):
        FeatureDataset(other_rows, (1, -1))


def test_the_budget_is_checked_before_anything_is_written(tmp_path, capsys):
    target = random_model("llama", seed=0, layers=3)
    tokens = sum(len(r["input_ids"]) for r in ROWS)
    spec = CacheSpec(layers=(1, -1), budget_gb=tokens * bytes_per_token(32, CacheSpec(layers=(1, -1))) / 2e9)
    with pytest.raises(ConfigError, match="over its budget"):
        build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False)
    assert not list(tmp_path.rglob("*.safetensors"))
    assert "GB per million tokens" in capsys.readouterr().out


def test_a_killed_build_resumes_without_losing_or_repeating_rows(tmp_path, monkeypatch):
    import draftsmith.data.feature_cache as fc

    target = random_model("llama", seed=0, layers=3)
    spec = CacheSpec(layers=(-1,), dtype="float32", shard_rows=2, batch_size=1)
    real, calls = fc._features, []

    def dies_in_the_third_shard(model, rows, layers, dtype):
        calls.append(len(rows))
        if len(calls) == 5:
            raise KeyboardInterrupt  # the build is killed while writing shard 2
        return real(model, rows, layers, dtype)

    monkeypatch.setattr(fc, "_features", dies_in_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False)
    directory = next(tmp_path.iterdir())
    assert sorted(p.name for p in directory.glob("shard-*.safetensors")) == ["shard-00000.safetensors",
                                                                           "shard-00001.safetensors"]
    kept = {p.name: p.stat().st_mtime_ns for p in directory.glob("shard-*.safetensors")}
    monkeypatch.setattr(fc, "_features", real)
    data = FeatureDataset(build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False))
    assert all((directory / name).stat().st_mtime_ns == t for name, t in kept.items())  # finished shards kept
    assert [data[i]["input_ids"] for i in range(len(data))] == [r["input_ids"] for r in ROWS]
