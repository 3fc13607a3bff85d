"""Read throughput of the offline feature cache: one epoch of its rows in shard order (the training order,
``ShardOrderSampler``) against a uniform order, rows/s, tokens/s and shard files read (CPU).

    python tests/benchmarks/bench_feature_cache.py                    # 4,096 rows x 128 tokens, H 1,024, 3 layers
    python tests/benchmarks/bench_feature_cache.py --rows 1024 --json out.json

A random Llama-style target of hidden size ``--hidden`` fills a cache of ``--layers`` layers (bfloat16, 256 rows per
shard, the defaults) under a scratch directory; then each order reads every row once through ``FeatureDataset``
(the collator's input), timed. Printed: the cache's size, and per order the seconds, rows/s, tokens/s (MB/s of
features) and how many shard files were loaded.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def measure(dataset, order: list[int]) -> dict:
    loads, start = dataset.loads, time.perf_counter()
    tokens = 0
    for i in order:
        tokens += len(dataset[i]["input_ids"])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rows_per_s": len(order) / seconds, "tokens_per_s": tokens / seconds,
            "shard_loads": dataset.loads - loads}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=128, help="tokens per row")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3, help="cached layers")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch

    from draftsmith.data.feature_cache import CacheSpec, FeatureDataset, build_feature_cache
    from draftsmith.data.feature_order import ShardOrderSampler
    from draftsmith.data.tiny_models import random_model

    target = random_model("llama", seed=0, vocab_size=1000, hidden=args.hidden, layers=args.layers + 1,
                          max_positions=args.tokens + 8)
    gen = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(3, 1000, (args.tokens,), generator=gen).tolist(),
             "labels": [-100] + torch.randint(3, 1000, (args.tokens - 1,), generator=gen).tolist()}
            for _ in range(args.rows)]
    spec = CacheSpec(layers=tuple(range(1, args.layers + 1)))
    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        directory = build_feature_cache(target, rows, root, spec, {"bench": True}, progress=False)
        build = time.perf_counter() - start
        size = sum(f.stat().st_size for f in directory.glob("shard-*"))
        results = {"rows": args.rows, "tokens_per_row": args.tokens, "hidden": args.hidden, "layers": args.layers,
                   "dtype": spec.dtype, "shard_rows": spec.shard_rows, "cache_mb": size / 2**20,
                   "build_seconds": build}
        for name in ("shard", "uniform"):
            data = FeatureDataset(directory)
            if name == "shard":
                order = list(ShardOrderSampler(data, seed=0))
            else:
                order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).tolist()
            results[name] = measure(data, order)
    print(f"cache: {args.rows:,} rows x {args.tokens} tokens, {args.layers} layers x {args.hidden} {spec.dtype}, "
          f"{results['cache_mb']:.0f} MB in {args.rows // spec.shard_rows} shards (built in {build:.0f} s)")
    print("| order | seconds | rows/s | tokens/s | feature MB/s | shard files read |")
    print("|---|---:|---:|---:|---:|---:|")
    per_token_mb = results["cache_mb"] / (args.rows * args.tokens)
    for name in ("shard", "uniform"):
        r = results[name]
        print(f"| {name} | {r['seconds']:.1f} | {r['rows_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
              f"{r['tokens_per_s'] * per_token_mb:,.0f} | {r['shard_loads']:,} |")
    if args.json:
        from draftsmith.common.io import atomic_write_json

        atomic_write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
