"""Offline hidden-state features: the frozen target's hidden states of chosen layers, computed once and stored, so
that head methods (EAGLE) and logit distillation (DistillSpec, from the last layer through the target's LM head) train
without running the target in every step and every epoch.

A cache directory holds ``manifest.json`` (what the cache is of: its key, the layers, the dtype, the shards and
their rows) and shards ``shard-00000.safetensors`` ...: per shard, the rows' tokens concatenated (``input_ids``,
``labels`` int32 ``[N]``), the row boundaries (``offsets`` int64 ``[rows + 1]``) and one tensor per layer
(``layer_<i>`` ``[N, H]``, bfloat16 by default — float16 keeps more mantissa but overflows past 65,504, which
hidden states of large targets reach, so a float16 build refuses such values; ``-1`` is the final-normed last
hidden state, the input of the LM head). Only the layers the method needs are kept.

- **Keyed**: the directory name is a hash of the target's identity, the rows (their tokens, hence the data and
  the answers), the layers and the dtype, so a run reuses a cache exactly when all of them match; a run whose
  layers are a subset of a complete cache's on the same target, rows and dtype reads them from that cache
  (``data_key`` in its manifest) instead of building another: EAGLE-1 reuses EAGLE-3's cache. A cache of the
  target's own answers also records what they were answered from (``answered_from``: :func:`source_key`, the rows
  before answering, the answer settings and the target's weights), so a rerun finds it without answering again.
- **Budgeted**: before writing, the size per million tokens and the estimate for these rows are printed, and a
  build whose estimate exceeds the stated disk budget (or the free space) is refused with a one-line error.
- **Resumable**: rows go to shards in a fixed order and each shard is written to a temporary file, hashed (its
  sha256 beside it, ``shard-00000.sha256``) and renamed; a killed build rerun skips the shards that exist and match
  their hash and writes the rest (no row lost or duplicated).
- **Verified**: a complete manifest records every shard's sha256 and size and its own sha256 (``manifest_sha256``).
  A reader checks the manifest's shape and self-hash and every shard's size when it opens the cache, and each shard's
  sha256 as it loads it, so a truncated, deleted, flipped or hand-edited part is a one-line :class:`DataError` naming
  it and the fix (delete the cache; the recipe rebuilds it), never a traceback or a model trained on it.
- **Shardable**: ``shard_rows`` rows per shard; a reader loads one shard at a time, and training samples the rows
  in shard order (:class:`ShardOrderSampler`: the shards in a shuffled order, the rows of each shuffled), so each
  shard is read once per epoch.
- **Built by every process**: under several processes each builds its own share of the shards (shard ``k`` by
  process ``k mod world``) and the main process marks the cache complete once all have finished; none waits on
  another while it computes, so a sharded target (ZeRO-3, gathered whole on every process for the build) cannot
  deadlock it.

:func:`answer_rows` turns dataset rows into the target's own answers first (greedy), when the method trains on
those, so the cache holds exactly the sequences the head trains on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.common.errors import ConfigError, DataError
from draftsmith.common.io import atomic_write_json, read_json
from draftsmith.common.models import target_identity
from draftsmith.data.chat import IGNORE_INDEX
from draftsmith.data.feature_shards import (
    DTYPES,
    FORMAT,
    add_answered_source,
    check_manifest,
    finish_feature_cache,
    read_offsets,
    read_shard,
    save_shard,
    shard_name,
    shard_sum,
)
from draftsmith.data.generation import (
    eos_token_ids,
    pad_token_id,
    sample_completions,
    sequences_from_generations,
    split_prompts,
)


@dataclass(frozen=True)
class CacheSpec:
    layers: tuple[int, ...]  # transformers hidden-state indices; -1 = final-normed last hidden state
    dtype: str = "bfloat16"
    shard_rows: int = 256
    budget_gb: float = 50.0
    batch_size: int = 8

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"feature cache dtype {self.dtype!r} is unknown: choose one of {', '.join(DTYPES)}")
        if self.shard_rows < 1 or self.batch_size < 1 or self.budget_gb <= 0 or not self.layers:
            raise ConfigError("feature cache: shard_rows and batch_size >= 1, budget_gb > 0 and at least one layer")


def bytes_per_token(hidden: int, spec: CacheSpec) -> int:
    """Disk bytes one token takes: every kept layer's hidden state plus its token and label ids."""
    return len(spec.layers) * hidden * DTYPES[spec.dtype].itemsize + 8


def _rows_hash(head: dict, rows: Sequence[dict]) -> str:
    h = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
    for row in rows:
        h.update(json.dumps([list(row["input_ids"]), list(row["labels"])]).encode())
    return h.hexdigest()[:24]


def cache_key(identity: dict, rows: Sequence[dict], spec: CacheSpec) -> str:
    """The hash that names a cache: the target's identity, the rows' tokens and labels, the layers, the dtype."""
    return _rows_hash({"target": identity, "layers": list(spec.layers), "dtype": spec.dtype}, rows)


def data_key(identity: dict, rows: Sequence[dict], spec: CacheSpec) -> str:
    """:func:`cache_key` without the layers: caches with equal data keys hold the same target's features of the same
    rows in the same dtype, and differ at most in which layers they keep."""
    return _rows_hash({"target": identity, "dtype": spec.dtype}, rows)


def weights_fingerprint(model) -> str:
    """sha256 of the model's parameters (names, dtypes, shapes and bytes): what its greedy answers depend on beyond
    its config. Parameters on an accelerator are read to the host one at a time."""
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        data = param.detach().contiguous().cpu()
        h.update(f"{name}:{data.dtype}:{list(data.shape)}".encode())
        h.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return h.hexdigest()


def source_key(identity: dict, weights: str, rows: Sequence[dict], answer: dict, dtype: str) -> str:
    """The hash of what a cache of the target's own answers was made from: the target (identity and weights), the
    rows before answering, the answer settings (``max_new_tokens``, ``prompt_tokens``) and the cache's dtype."""
    return _rows_hash({"target": identity, "weights": weights, "answer": dict(sorted(answer.items())),
                       "dtype": dtype}, rows)


def answered_cache(root: str | os.PathLike, source: str, layers: Sequence[int]) -> Path | None:
    """A complete cache under ``root`` that holds the answers made from ``source`` (:func:`source_key`) and keeps
    every one of ``layers``, else ``None``: the run reads it without answering its rows again."""
    return _find_cache(root, lambda m: source in m.get("answered_from", ()) and set(layers) <= set(m["layers"]))


def covering_cache(root: str | os.PathLike, key: str, layers: Sequence[int]) -> Path | None:
    """A complete cache under ``root`` with data key ``key`` that keeps every one of ``layers`` (EAGLE-3's cache
    of layers ``(2, 15, 27, -1)`` serves EAGLE-1's ``(-1,)`` on the same rows), else ``None``."""
    return _find_cache(root, lambda m: m.get("data_key") == key and set(layers) <= set(m["layers"]))


def _find_cache(root: str | os.PathLike, wanted) -> Path | None:
    """The first complete, sound cache under ``root`` whose manifest ``wanted(manifest)`` accepts, else ``None``."""
    root = Path(root)
    for manifest_path in sorted(root.glob("*/manifest.json")) if root.is_dir() else ():
        try:
            manifest = check_manifest(manifest_path.parent)
        except DataError:
            continue  # a damaged cache serves nothing (reading it names the problem)
        if wanted(manifest):
            return manifest_path.parent
    return None


def answer_rows(target, rows: Sequence[dict], *, max_new_tokens: int, prompt_tokens: int, pad_token_id: int,
                eos_ids: Sequence[int], batch_size: int = 8, progress: bool = True) -> list[dict]:
    """``rows`` with their answers replaced by the target's own greedy answers to the same prompts (the shared
    self-distillation, batched)."""
    from tqdm.auto import tqdm

    out: list[dict] = []
    for start in tqdm(range(0, len(rows), batch_size), desc="target answers", disable=not progress, unit="batch"):
        batch = rows[start: start + batch_size]
        width = max(len(r["input_ids"]) for r in batch)
        ids = torch.tensor([list(r["input_ids"]) + [pad_token_id] * (width - len(r["input_ids"])) for r in batch])
        labels = torch.tensor([list(r["labels"]) + [IGNORE_INDEX] * (width - len(r["labels"])) for r in batch])
        mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in batch])
        prompts = split_prompts(ids, labels, mask, prompt_tokens)
        completions = sample_completions(target, prompts, max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                                         eos_ids=eos_ids)
        out.extend(sequences_from_generations(prompts, completions))
    return out


def _shards(n: int, per: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + per)) for s in range(0, n, per)]


@torch.no_grad()
def _features(target, rows: Sequence[dict], layers: Sequence[int], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One batch's features, unpadded and concatenated: ``layer_<i>`` ``[N, H]``."""
    device = next(target.parameters()).device
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([list(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows], device=device)
    mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows], device=device)
    out = target(input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)
    keep = mask.bool()
    return {f"layer_{i}": stored(out.hidden_states[i][keep], dtype, i) for i in layers}  # right padding: row order


def stored(hidden: torch.Tensor, dtype: torch.dtype, layer: int) -> torch.Tensor:  # [N, H] -> [N, H] in dtype, CPU
    """Hidden states in the cache's dtype; non-finite values are refused, and float16 refuses values past its range
    (they would be stored as inf)."""
    if not bool(torch.isfinite(hidden).all()):
        raise DataError(f"layer {layer}'s hidden states hold nan or inf: the target overflows in its dtype; load it in "
                        "float32 (dtype=float32) to build the feature cache")
    if dtype == torch.float16:
        peak = float(hidden.abs().max()) if hidden.numel() else 0.0
        if peak > torch.finfo(torch.float16).max:
            raise ConfigError(f"layer {layer}'s hidden states reach {peak:.3g}, past float16's 65,504: build the "
                              "feature cache in bfloat16 (feature_cache_dtype=bfloat16, the default)")
    return hidden.to(dtype).cpu()


def _shard_features(target, rows: Sequence[dict], spec: CacheSpec, bar) -> dict[str, torch.Tensor]:
    """``layer_<i>`` ``[N, H]`` of ``rows`` in row order, computed in batches of rows of similar length (sorted by
    length, so batches carry little padding) and put back in order."""
    order = sorted(range(len(rows)), key=lambda r: len(rows[r]["input_ids"]))
    per_row: list[dict[str, torch.Tensor]] = [{} for _ in rows]
    for s in range(0, len(order), spec.batch_size):
        picked = order[s: s + spec.batch_size]
        lengths = [len(rows[r]["input_ids"]) for r in picked]
        for name, value in _features(target, [rows[r] for r in picked], spec.layers, DTYPES[spec.dtype]).items():
            for r, part in zip(picked, value.split(lengths)):
                per_row[r][name] = part
        bar.update(len(picked))
    return {f"layer_{i}": torch.cat([row[f"layer_{i}"] for row in per_row]) for i in spec.layers}


def build_feature_cache(target, rows: Sequence[dict], root: str | os.PathLike, spec: CacheSpec, identity: dict,
                        progress: bool = True, rank: int = 0, world: int = 1) -> Path:
    """The cache of ``rows`` under ``root`` (built, or finished, or reused as it is); see the module docstring. With
    ``world`` > 1 this process writes the shards ``k`` with ``k % world == rank`` and leaves the cache incomplete:
    :func:`finish_feature_cache` marks it complete once every process has written its share."""
    from tqdm.auto import tqdm

    key, shared = cache_key(identity, rows, spec), data_key(identity, rows, spec)
    directory = Path(root) / key
    manifest = read_json(directory / "manifest.json")
    if isinstance(manifest, dict) and manifest.get("complete"):
        if "manifest_sha256" not in manifest:  # completed before caches recorded sums: record the shards' now
            finish_feature_cache(directory)
        check_manifest(directory)
        return directory
    covering = covering_cache(root, shared, spec.layers)
    if covering is not None:  # the same rows' features with more layers: read the ones needed from there
        print(f"feature cache: reusing {covering} (it holds layers {list(spec.layers)} of these rows)")
        return covering
    hidden = int(target.config.hidden_size)
    tokens = sum(len(r["input_ids"]) for r in rows)
    per_token = bytes_per_token(hidden, spec)
    need = tokens * per_token
    if rank == 0:
        print(f"feature cache: {per_token * 1e6 / 1e9:.2f} GB per million tokens ({len(spec.layers)} layers x "
              f"{hidden} x {spec.dtype}); {tokens:,} tokens -> {need / 1e9:.3f} GB in {directory}")
    if need > spec.budget_gb * 1e9:
        raise ConfigError(f"the feature cache needs {need / 1e9:.2f} GB, over its budget of {spec.budget_gb:g} GB: "
                          "raise feature_cache_budget_gb, keep fewer rows (max_train_examples) or train online")
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if need > free:
        raise ConfigError(f"the feature cache needs {need / 1e9:.2f} GB and {directory} has {free / 1e9:.2f} GB free: "
                          "free space, or point feature_cache_dir elsewhere")
    shards = _shards(len(rows), spec.shard_rows)
    atomic_write_json(directory / "manifest.json", {  # the same content from every process
        "format": FORMAT, "key": key, "data_key": shared, "target": identity, "layers": list(spec.layers), "dtype": spec.dtype,
        "rows": len(rows), "tokens": tokens, "shards": [{"file": shard_name(k), "rows": [a, b]}
                                                       for k, (a, b) in enumerate(shards)], "complete": False})
    mine = [(k, a, b) for k, (a, b) in enumerate(shards) if k % world == rank]
    with tqdm(total=sum(b - a for _, a, b in mine), desc="feature cache", disable=not progress, unit="row") as bar:
        for k, a, b in mine:  # closed on errors too
            path = directory / shard_name(k)
            if shard_sum(path) is not None:  # written (atomically) by an earlier, interrupted build, and intact
                bar.update(b - a)
                continue
            chunk = rows[a:b]
            tensors = _shard_features(target, chunk, spec, bar)
            lengths = torch.tensor([len(r["input_ids"]) for r in chunk], dtype=torch.long)
            tensors["input_ids"] = torch.tensor([t for r in chunk for t in r["input_ids"]], dtype=torch.int32)
            tensors["labels"] = torch.tensor([t for r in chunk for t in r["labels"]], dtype=torch.int32)
            tensors["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
            save_shard(tensors, path)
    if world == 1:
        finish_feature_cache(directory)
    return directory


def feature_datasets(target, tokenizer, datasets: Sequence, root: str | os.PathLike, spec: CacheSpec,
                     answer: dict | None = None, group=None) -> list[FeatureDataset]:
    """Each of ``datasets`` (rows with ``input_ids`` and ``labels``) as a :class:`FeatureDataset` over its cache under
    ``root`` (built, finished or reused). ``answer`` (``max_new_tokens``, ``prompt_tokens``) first replaces the rows'
    answers by the target's own greedy ones (:func:`answer_rows`). ``group``: a ``torch.distributed`` process group
    whose processes all call this; each answers and builds its share (module docstring), and every process returns
    the same datasets."""
    import torch.distributed as dist

    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)
    identity = target_identity(target, tokenizer)
    weights = weights_fingerprint(target) if answer is not None else None
    out = []
    for dataset in datasets:
        rows = [{"input_ids": list(r["input_ids"]), "labels": list(r["labels"])} for r in dataset]
        source = source_key(identity, weights, rows, answer, spec.dtype) if answer is not None else None
        found = answered_cache(root, source, spec.layers) if source is not None else None
        if found is not None:  # these rows answered by this target before: no answering, no build
            out.append(FeatureDataset(found, spec.layers))
            continue
        if answer is not None:
            mine = answer_rows(target, rows[rank::world], max_new_tokens=int(answer["max_new_tokens"]),
                               prompt_tokens=int(answer["prompt_tokens"]),
                               pad_token_id=pad_token_id(tokenizer, target.config),
                               eos_ids=eos_token_ids(tokenizer, target.config))
            rows = _interleaved(mine, group, world)
        directory = build_feature_cache(target, rows, root, spec, identity, rank=rank, world=world)
        if world > 1:
            dist.barrier(group)  # every share written
            if rank == 0 and not read_json(directory / "manifest.json").get("complete"):
                finish_feature_cache(directory)
            dist.barrier(group)
        if source is not None and rank == 0:
            add_answered_source(directory, source)
        out.append(FeatureDataset(directory, spec.layers))
    return out


def _interleaved(mine: list[dict], group, world: int) -> list[dict]:
    """Every process's rows ``rows[rank::world]`` put back in their order (an all-gather; ``world`` 1: as given)."""
    if world == 1:
        return mine
    import torch.distributed as dist

    parts: list[list[dict]] = [[] for _ in range(world)]
    dist.all_gather_object(parts, mine, group=group)
    return [parts[i % world][i // world] for i in range(sum(len(p) for p in parts))]


class FeatureDataset(torch.utils.data.Dataset):
    """The rows of a built cache: ``input_ids``, ``labels``, ``attention_mask`` and ``feat_<i>`` ``[T, H]`` per
    layer of ``layers`` (default: every layer the cache keeps). Loads one shard at a time."""

    def __init__(self, directory: str | os.PathLike, layers: Sequence[int] | None = None) -> None:
        self.directory = Path(directory)
        manifest = check_manifest(self.directory)
        kept = tuple(manifest["layers"])
        missing = sorted(set(layers or ()) - set(kept))
        if missing:
            raise ConfigError(f"{self.directory} keeps layers {list(kept)}, not {missing}: build a cache of those "
                              "layers (the recipe does, with features=offline)")
        self.layers = tuple(layers) if layers else kept
        self._index = [(k, j) for k, shard in enumerate(manifest["shards"])
                       for j in range(shard["rows"][1] - shard["rows"][0])]
        self._files = [shard["file"] for shard in manifest["shards"]]
        self._sums = [shard["sha256"] for shard in manifest["shards"]]
        self._rows = [shard["rows"][1] - shard["rows"][0] for shard in manifest["shards"]]
        self.loads = 0  # shard files read so far
        self._loaded: tuple[int, dict] | None = None
        self._lengths: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._index)

    def shard_spans(self) -> list[tuple[int, int]]:
        """``(index of its first row, rows)`` of each shard, in file order."""
        starts = torch.tensor([0, *self._rows]).cumsum(0).tolist()
        return [(starts[k], n) for k, n in enumerate(self._rows)]

    def row_lengths(self, k: int) -> list[int]:
        """The token counts of shard ``k``'s rows, from its offsets alone (read once; the rows themselves are checked
        when the shard is read)."""
        if k not in self._lengths:
            self._lengths[k] = read_offsets(self.directory / self._files[k], self._rows[k]).diff().tolist()
        return self._lengths[k]

    def _shard(self, k: int) -> dict[str, torch.Tensor]:
        if self._loaded is None or self._loaded[0] != k:
            self._loaded = (k, read_shard(self.directory / self._files[k], self._sums[k], self._rows[k], self.layers))
            self.loads += 1
        return self._loaded[1]

    def __getitem__(self, i: int) -> dict:
        k, j = self._index[i]
        shard = self._shard(k)
        a, b = int(shard["offsets"][j]), int(shard["offsets"][j + 1])
        row = {"input_ids": shard["input_ids"][a:b].tolist(), "labels": shard["labels"][a:b].tolist()}
        row["attention_mask"] = [1] * (b - a)
        for layer in self.layers:
            row[f"feat_{layer}"] = shard[f"layer_{layer}"][a:b]
        return row


@dataclass
class FeatureCollator:
    """Right-pads token rows (as :class:`draftsmith.data.collate.PadCollator`) and their ``feat_<i>`` features
    (zeros): ``feat_<i>`` ``[B, T, H]``."""

    pad_token_id: int

    def __call__(self, rows: Sequence[dict]) -> dict[str, torch.Tensor]:
        from draftsmith.data.collate import PadCollator

        out = PadCollator(self.pad_token_id)([{k: r[k] for k in ("input_ids", "labels", "attention_mask")}
                                              for r in rows])
        width = out["input_ids"].shape[1]
        for key in (k for k in rows[0] if k.startswith("feat_")):
            feats = [r[key] for r in rows]
            padded = feats[0].new_zeros(len(rows), width, feats[0].shape[-1])
            for b, f in enumerate(feats):
                padded[b, : f.shape[0]] = f
            out[key] = padded
        return out


def features_of(batch: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """``{layer: [B, T, H]}`` from a collated batch's ``feat_<i>`` entries (empty when the batch has none)."""
    return {int(k.removeprefix("feat_")): v for k, v in batch.items() if k.startswith("feat_")}


__all__ = ["CacheSpec", "FeatureCollator", "FeatureDataset", "answer_rows", "build_feature_cache",
           "bytes_per_token", "cache_key", "check_manifest", "covering_cache", "data_key", "feature_datasets", "features_of",
           "finish_feature_cache", "stored"]
