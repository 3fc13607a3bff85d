"""Plots for docs/BENCHMARKS.md from benchmark outputs.

    python tests/benchmarks/plot_bench.py exits OUT.png NAME=exit.json [NAME=exit.json ...]
        per-layer top-1 agreement of each exit with the full model (``draftsmith exit-layer --out`` files)
    python tests/benchmarks/plot_bench.py study OUT.png runs/draft_verify_tiny/artefact/manifest.json
        a Draft & Verify search's history: each complete trial's seconds per token and the running best
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot_exits(out: Path, named: dict[str, Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, path in named.items():
        agreement = json.loads(path.read_text())["agreement"]
        ax.plot(range(1, len(agreement) + 1), agreement, marker="o", label=name)
    ax.set_xlabel("exit layer E")
    ax.set_ylabel("top-1 agreement with the full model")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plot_study(out: Path, manifest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    search = json.loads(manifest.read_text())["training"]["search"]
    history = search["history"]
    predicted = search.get("settings", {}).get("objective") == "predicted"
    best, running = float("inf"), []
    for value in history:
        best = min(best, value)
        running.append(best)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([v * 1000 for v in history], "o", alpha=0.6, label="complete trial")
    ax.plot([v * 1000 for v in running], "-", label="best so far")
    ax.set_xlabel("complete trial")
    ax.set_ylabel(("predicted " if predicted else "") + "ms per generated token")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str]) -> int:
    kind, out, *rest = argv
    if kind == "exits":
        plot_exits(Path(out), {a.split("=", 1)[0]: Path(a.split("=", 1)[1]) for a in rest})
    elif kind == "study":
        plot_study(Path(out), Path(rest[0]))
    else:
        raise SystemExit(f"unknown plot {kind!r}: exits or study")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
