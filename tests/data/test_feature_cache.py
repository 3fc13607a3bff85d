"""The offline feature cache: keyed reuse, the disk budget, resuming a killed build, reading rows back."""

from __future__ import annotations

import pickle

import pytest
import torch

from draftsmith.common.errors import ConfigError, DataError
from draftsmith.data.feature_cache import (
    CacheSpec,
    FeatureCollator,
    FeatureDataset,
    build_feature_cache,
    bytes_per_token,
    cache_key,
    finish_feature_cache,
)
from draftsmith.data.feature_order import ShardOrderSampler
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


def test_training_reads_each_shard_once_per_epoch_in_a_seeded_shuffled_order(tmp_path):
    """ShardOrderSampler: every row once per epoch, the shards in a shuffled order, the rows of each shuffled; the
    reader loads each shard file once per epoch (a uniform sampler reloads one for most rows); the same seed and
    epoch give the same order, another epoch another."""
    target = random_model("llama", seed=0, layers=3)
    rows = [{"input_ids": list(range(3, 3 + n)), "labels": [-100] + list(range(4, 3 + n))} for n in range(4, 44)]
    data = FeatureDataset(build_feature_cache(target, rows, tmp_path, CacheSpec(layers=(-1,), shard_rows=4), IDENTITY,
                                              progress=False))
    sampler = ShardOrderSampler(data, seed=3)
    orders = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(40)) and len(sampler) == 40
        shards = [i // 4 for i in order]
        assert all(shards[i] == shards[i - (i % 4)] for i in range(40))  # a shard's rows come together
        assert shards[::4] != list(range(10))  # the shards shuffled
        assert any(order[j:j + 4] != sorted(order[j:j + 4]) for j in range(0, 40, 4))  # and the rows of each
        before = data.loads
        for i in order:
            data[i]
        assert data.loads - before == 10  # 10 shards, each read once
        orders.append(order)
    assert orders[0] != orders[1]
    sampler.set_epoch(0)
    assert list(sampler) == orders[0]  # a resumed run sees the same order
    uniform = torch.randperm(40, generator=torch.Generator().manual_seed(0)).tolist()
    before = data.loads
    for i in uniform:
        data[i]
    assert data.loads - before > 25  # for scale: a uniform order reloads a shard for most rows


def test_the_cache_stores_bfloat16_by_default_and_float16_refuses_values_past_its_range(tmp_path):
    target = random_model("llama", seed=0, layers=3)
    spec = CacheSpec(layers=(-1,), shard_rows=2)
    assert spec.dtype == "bfloat16"
    assert FeatureDataset(build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False))[0][
        "feat_-1"].dtype == torch.bfloat16
    with torch.no_grad():
        target.model.norm.weight.fill_(1e6)  # final-normed hidden states far past 65,504
    with pytest.raises(ConfigError, match="past float16's 65,504.*bfloat16"):
        build_feature_cache(target, ROWS, tmp_path / "fp16", CacheSpec(layers=(-1,), dtype="float16"), IDENTITY,
                            progress=False)


def test_processes_build_disjoint_shares_and_the_cache_is_complete_only_when_all_are_written(tmp_path):
    """Each of 2 processes writes the shards k with k % 2 == its rank (no process waits on another while it
    computes); finish_feature_cache marks the cache complete once every shard exists, and the rows equal a
    one-process build's."""
    target = random_model("llama", seed=0, layers=3)
    spec = CacheSpec(layers=(1, -1), dtype="float32", shard_rows=2, batch_size=2)
    first = build_feature_cache(target, ROWS, tmp_path / "two", spec, IDENTITY, progress=False, rank=1, world=2)
    assert sorted(p.name for p in first.glob("shard-*.safetensors")) == ["shard-00001.safetensors"]
    with pytest.raises(DataError, match="lacks 2 shard"):
        finish_feature_cache(first)
    with pytest.raises(DataError, match="not a complete draftsmith feature cache"):
        FeatureDataset(first)
    assert build_feature_cache(target, ROWS, tmp_path / "two", spec, IDENTITY, progress=False, rank=0, world=2) == first
    finish_feature_cache(first)
    two = FeatureDataset(first)
    one = FeatureDataset(build_feature_cache(target, ROWS, tmp_path / "one", spec, IDENTITY, progress=False))
    for i in range(len(ROWS)):
        assert two[i]["input_ids"] == one[i]["input_ids"] and torch.equal(two[i]["feat_1"], one[i]["feat_1"])


# ------------------------------------------------------------------------------------- verified on every read


def built(tmp_path, **kw):
    target = random_model("llama", seed=0, layers=3)
    spec = CacheSpec(layers=(1, -1), dtype="bfloat16", shard_rows=2, batch_size=2)
    return build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False), target, spec


def flip_byte(path, at=-3):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40  # an exponent bit of the last bf16 value
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, match", [
    (lambda d: (d / "shard-00001.safetensors").unlink(), "shard-00001.safetensors is missing"),
    (lambda d: (d / "shard-00001.safetensors").write_bytes((d / "shard-00001.safetensors").read_bytes()[:-100]),
     "shard-00001.safetensors has .* bytes, not the .* written"),
    (lambda d: (d / "manifest.json").write_text("{not json"), "manifest.json is missing or not JSON"),
    (lambda d: (d / "manifest.json").write_text(
        (d / "manifest.json").read_text().replace('"rows": 5', '"rows": 4')), "changed since it was written"),
    (lambda d: (d / "manifest.json").write_text("[]"), "missing or not JSON"),
], ids=["deleted shard", "truncated shard", "manifest not JSON", "edited manifest", "manifest a list"])
def test_a_damaged_cache_is_refused_in_one_line_when_opened(tmp_path, damage, match):
    directory, _, _ = built(tmp_path)
    damage(directory)
    with pytest.raises(DataError, match=match) as err:
        FeatureDataset(directory)
    assert "\n" not in str(err.value) and f"delete {directory}" in str(err.value)


def test_a_flipped_bit_in_a_shard_is_refused_when_the_shard_is_read(tmp_path):
    directory, _, _ = built(tmp_path)
    flip_byte(directory / "shard-00002.safetensors")
    data = FeatureDataset(directory)  # the size is right: opening passes
    assert data[0]["input_ids"] == ROWS[0]["input_ids"]
    with pytest.raises(DataError, match=r"shard-00002\.safetensors was changed since it was written"):
        data[4]


@pytest.mark.parametrize("at, byte", [(0, 0x00), (12, 0xff)], ids=["header length", "header text"])
def test_a_damaged_shard_header_is_one_line_when_its_row_lengths_are_read(tmp_path, at, byte):
    """Length grouping reads each shard's offsets alone, before the shard is read and hashed whole: a garbled
    safetensors header there is the same one-line DataError, not the reader's traceback."""
    directory, _, _ = built(tmp_path)
    path = directory / "shard-00001.safetensors"
    data = bytearray(path.read_bytes())
    data[at] = byte
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"shard-00001\.safetensors cannot be read") as err:
        FeatureDataset(directory).row_lengths(1)
    assert "\n" not in str(err.value) and f"delete {directory}" in str(err.value)


def test_a_killed_build_rewrites_a_shard_that_differs_from_its_sum(tmp_path):
    """A shard changed after it was written (and before the cache was complete) is written again by the rerun;
    the finished cache equals one that was never interrupted."""
    directory, target, spec = built(tmp_path / "whole")
    reference = FeatureDataset(directory)
    partial = tmp_path / "cut"
    for rank in (0, 1):  # every shard written, the cache not yet complete
        cut = build_feature_cache(target, ROWS, partial, spec, IDENTITY, progress=False, rank=rank, world=2)
    flip_byte(cut / "shard-00002.safetensors")
    with pytest.raises(DataError, match="shard-00002.safetensors is not what was written"):
        finish_feature_cache(cut)
    again = FeatureDataset(build_feature_cache(target, ROWS, partial, spec, IDENTITY, progress=False))
    for i in range(len(ROWS)):
        assert torch.equal(again[i]["feat_1"], reference[i]["feat_1"])


def test_a_cache_completed_before_shards_had_sums_gets_them_on_its_next_use(tmp_path):
    import json

    directory, target, spec = built(tmp_path)
    manifest = json.loads((directory / "manifest.json").read_text())
    for shard in manifest["shards"]:
        del shard["sha256"], shard["bytes"]
    del manifest["manifest_sha256"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    for sums in directory.glob("*.sha256"):
        sums.unlink()
    with pytest.raises(DataError, match="changed since it was written"):
        FeatureDataset(directory)
    assert build_feature_cache(target, ROWS, tmp_path, spec, IDENTITY, progress=False) == directory
    assert len(FeatureDataset(directory)) == len(ROWS)


def test_non_finite_hidden_states_are_refused_at_build(tmp_path):
    target = random_model("llama", seed=0, layers=3)
    with torch.no_grad():
        target.model.norm.weight.fill_(float("inf"))
    with pytest.raises(DataError, match="layer -1's hidden states hold nan or inf.*dtype=float32"):
        build_feature_cache(target, ROWS, tmp_path, CacheSpec(layers=(-1,)), IDENTITY, progress=False)
    assert not list(tmp_path.rglob("*.safetensors"))


# ------------------------------------------------------------------------------- the target's own answers, once


def test_a_cache_of_the_targets_answers_is_found_again_without_answering(tmp_path, monkeypatch):
    import draftsmith.data.feature_cache as feature_cache

    target = random_model("llama", seed=0, layers=3)
    spec = CacheSpec(layers=(1, -1), dtype="float32", shard_rows=2, batch_size=2)
    answer = {"max_new_tokens": 4, "prompt_tokens": 2}
    calls = []
    real = feature_cache.answer_rows
    monkeypatch.setattr(feature_cache, "answer_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    (first,) = feature_cache.feature_datasets(target, None, [ROWS], tmp_path, spec, answer)
    assert calls == [1] and len(first) == len(ROWS)
    (again,) = feature_cache.feature_datasets(target, None, [ROWS], tmp_path, spec, answer)
    assert calls == [1] and again.directory == first.directory  # found by what it was answered from
    (subset,) = feature_cache.feature_datasets(target, None, [ROWS], tmp_path, CacheSpec(layers=(-1,), dtype="float32"),
                                               answer)
    assert calls == [1] and subset.directory == first.directory  # fewer layers of the same answers
    feature_cache.feature_datasets(target, None, [ROWS], tmp_path, spec, answer | {"max_new_tokens": 3})
    assert calls == [1, 1]  # other answer settings: answered again
    with torch.no_grad():
        next(target.parameters()).add_(1e-3)
    feature_cache.feature_datasets(target, None, [ROWS], tmp_path, spec, answer)
    assert calls == [1, 1, 1]  # other weights (same config): answered again


def test_length_grouped_batches_pad_less_and_keep_the_shard_order(tmp_path):
    """ShardOrderSampler(group=B): every row once per epoch, each shard's rows together, batches on the loader's
    grid of similar length (the padded tokens of 4-row batches fall), seeded as before."""
    target = random_model("llama", seed=0, layers=3)
    lengths = [4 + (7 * i) % 37 for i in range(46)]
    rows = [{"input_ids": list(range(3, 3 + n)), "labels": [-100] + list(range(4, 3 + n))} for n in lengths]
    data = FeatureDataset(build_feature_cache(target, rows, tmp_path, CacheSpec(layers=(-1,), shard_rows=10), IDENTITY,
                                              progress=False))
    assert [data.row_lengths(k) for k in range(5)] == [lengths[i:i + 10] for i in range(0, 46, 10)]

    def padded(order):  # tokens the loader's 4-row batches compute
        return sum(max(lengths[i] for i in order[j:j + 4]) * len(order[j:j + 4]) for j in range(0, len(order), 4))

    plain, grouped = ShardOrderSampler(data, seed=3), ShardOrderSampler(data, seed=3, group=4)
    order = list(grouped)
    assert sorted(order) == list(range(46)) and order == list(grouped)  # every row once; seeded
    shards = [i // 10 for i in order]
    assert [shards[i] for i in range(46) if i == 0 or shards[i] != shards[i - 1]] == \
        [shards[i] for i in range(46) if i == 0 or shards[i] != shards[i - 1]][:5]  # each shard's rows together
    real = sum(lengths)
    assert padded(order) - real < 0.6 * (padded(list(plain)) - real)  # (on the grid, across shard ends too)
    grouped.set_epoch(1)
    assert list(grouped) != order


def test_each_steps_rows_are_sorted_by_length_and_stay_the_steps_rows(tmp_path):
    """ShardOrderSampler(window=W): the rows of every step (W on the loader's grid) are the plain shard order's,
    sorted by length within the step wherever the step lies in one shard, so its micro-batches pad less."""
    target = random_model("llama", seed=0, layers=3)
    lengths = [4 + (7 * i) % 37 for i in range(46)]
    rows = [{"input_ids": list(range(3, 3 + n)), "labels": [-100] + list(range(4, 3 + n))} for n in lengths]
    data = FeatureDataset(build_feature_cache(target, rows, tmp_path, CacheSpec(layers=(-1,), shard_rows=10), IDENTITY,
                                              progress=False))
    plain, stepped = list(ShardOrderSampler(data, seed=3)), ShardOrderSampler(data, seed=3, window=8)
    order = list(stepped)
    assert sorted(order) == list(range(46)) and order == list(stepped)  # every row once; seeded
    steps = [(order[j:j + 8], plain[j:j + 8]) for j in range(0, 46, 8)]
    assert all(sorted(a) == sorted(b) for a, b in steps)  # no step's rows change
    one_shard = [a for a, _ in steps if len({i // 10 for i in a}) == 1]
    assert one_shard and all([lengths[i] for i in a] == sorted(lengths[i] for i in a) for a in one_shard)

    def padded(order):  # tokens the loader's 2-row micro-batches compute
        return sum(max(lengths[i] for i in order[j:j + 2]) * len(order[j:j + 2]) for j in range(0, len(order), 2))

    assert padded(order) < padded(plain)
    assert ShardOrderSampler(data, seed=3, window=8, group=4).window == 0  # length groups already sort every batch
