"""The engine report: what a serving engine's run says about a drafter, from the runner's results alone.

Figures follow vLLM's own definitions (``vllm/v1/spec_decode/metrics.py``), so they compare with what users see
in the engine:

- acceptance by position ``i``: drafts whose position ``i`` was accepted / drafts (every step that drafted);
- mean acceptance length: ``1 + accepted draft tokens / drafts`` (tokens one verification commits, bonus included);
- draft acceptance rate: accepted draft tokens / draft tokens;
- tokens/s: output tokens over the wall time of the answers, one request at a time, against the engine's AR in the
  same run; throughput at each concurrency likewise.

vLLM takes the first new token from the prefill without a draft, never shortens a draft at an answer's end, and
counts a draft's acceptance before cutting the answer at ``max_tokens``; draftsmith's loop drafts from its first
step and shortens its last drafts, unless run with ``engine_steps`` (its ``acceptance_by_position`` then counts
the same steps the same way as the engine's).
"""

from __future__ import annotations

from collections.abc import Sequence


def spec_totals(results: Sequence[dict]) -> dict:
    """The runner's per-prompt draft counters, summed: drafts, draft tokens, accepted, accepted per position."""
    per_pos: list[int] = []
    for r in results:
        for i, n in enumerate(r["spec"]["per_pos"]):
            per_pos += [0] * (i + 1 - len(per_pos))
            per_pos[i] += int(n)
    return {k: sum(int(r["spec"][k]) for r in results) for k in ("drafts", "draft_tokens", "accepted")} | {
        "per_pos": per_pos}


def acceptance_figures(totals: dict) -> dict:
    """vLLM's acceptance figures from summed counters (module docstring); None where nothing was drafted."""
    drafts = totals["drafts"]
    return {"drafts": drafts, "draft_tokens": totals["draft_tokens"], "accepted": totals["accepted"],
            "acceptance_by_position": [n / drafts for n in totals["per_pos"]] if drafts else [],
            "mean_acceptance_length": 1 + totals["accepted"] / drafts if drafts else None,
            "draft_acceptance_rate": totals["accepted"] / totals["draft_tokens"] if totals["draft_tokens"] else None}


def tokens_per_second(results: Sequence[dict]) -> float | None:
    seconds = sum(r["seconds"] for r in results)
    return sum(len(r["token_ids"]) for r in results) / seconds if seconds > 0 else None


def identity(a: Sequence[dict], b: Sequence[Sequence[int]]) -> float | None:
    """The share of answers in ``a`` (runner results) token-identical to the answers ``b``."""
    return sum(list(r["token_ids"]) == list(t) for r, t in zip(a, b)) / len(a) if a else None


def summarize(spec: Sequence[dict], ar: Sequence[dict], draftsmith_ar: Sequence[Sequence[int]] | None) -> dict:
    """One group's figures: acceptance, tokens/s against the engine's AR, and greedy identity of the speculative
    answers to the engine's AR (and of both to draftsmith's AR, when given)."""
    tps, ar_tps = tokens_per_second(spec), tokens_per_second(ar)
    out = acceptance_figures(spec_totals(spec)) | {
        "questions": len(spec), "tokens_per_s": tps, "ar_tokens_per_s": ar_tps,
        "speedup": tps / ar_tps if tps and ar_tps else None,
        "identical_to_engine_ar": identity(spec, [r["token_ids"] for r in ar])}
    if draftsmith_ar is not None:
        out["identical_to_draftsmith_ar"] = identity(spec, draftsmith_ar)
        out["engine_ar_identical_to_draftsmith_ar"] = identity(ar, draftsmith_ar)
    return out


def by_category(categories: Sequence[str], spec: Sequence[dict], ar: Sequence[dict],
                draftsmith_ar: Sequence[Sequence[int]] | None) -> dict[str, dict]:
    """:func:`summarize` per question category (in order of first appearance)."""
    out = {}
    for cat in dict.fromkeys(categories):
        idx = [i for i, c in enumerate(categories) if c == cat]
        out[cat] = summarize([spec[i] for i in idx], [ar[i] for i in idx],
                             [draftsmith_ar[i] for i in idx] if draftsmith_ar is not None else None)
    return out


def throughput(spec: Sequence[dict], ar: Sequence[dict]) -> list[dict]:
    """Output tokens/s with and without speculation at each concurrency the runner measured."""
    ar_at = {t["concurrency"]: t for t in ar}
    rows = []
    for t in spec:
        base = ar_at.get(t["concurrency"])
        tps = t["output_tokens"] / t["seconds"] if t["seconds"] > 0 else None
        ar_tps = base["output_tokens"] / base["seconds"] if base and base["seconds"] > 0 else None
        rows.append({"concurrency": t["concurrency"], "requests": t["requests"], "tokens_per_s": tps,
                     "ar_tokens_per_s": ar_tps, "speedup": tps / ar_tps if tps and ar_tps else None})
    return rows


def parity(draftsmith_by_position: Sequence[float], engine_by_position: Sequence[float]) -> dict:
    """draftsmith's and the engine's acceptance by position side by side, with their differences."""
    n = max(len(draftsmith_by_position), len(engine_by_position))
    ds = list(draftsmith_by_position) + [0.0] * (n - len(draftsmith_by_position))
    en = list(engine_by_position) + [0.0] * (n - len(engine_by_position))
    diff = [e - d for d, e in zip(ds, en)]
    return {"draftsmith": ds, "engine": en, "difference": diff,
            "max_abs_difference": max((abs(x) for x in diff), default=0.0)}


def parity_table(p: dict) -> str:
    """The parity as a markdown table, one row per draft position."""
    lines = ["| position | draftsmith | vLLM | vLLM - draftsmith |", "|---|---|---|---|"]
    for i, (d, e, x) in enumerate(zip(p["draftsmith"], p["engine"], p["difference"]), start=1):
        lines.append(f"| {i} | {d:.3f} | {e:.3f} | {x:+.3f} |")
    lines.append(f"\nlargest difference: {p['max_abs_difference']:.3f}")
    return "\n".join(lines)


def summary_lines(report: dict) -> list[str]:
    """The engine report in a few lines for the terminal."""
    s = report["summary"]
    acc = " / ".join(f"{a:.3f}" for a in s["acceptance_by_position"]) or "-"

    def fmt(x, spec=".3f"):
        return "-" if x is None else format(x, spec)

    lines = [f"engine: {report['engine']} {report['versions'].get('vllm', '')} ({report['engine_method']}, "
             f"{report['num_speculative_tokens']} draft tokens), {s['questions']} questions",
             f"acceptance by position: {acc}; mean acceptance length {fmt(s['mean_acceptance_length'])}",
             f"tokens/s {fmt(s['tokens_per_s'], '.1f')} vs engine AR {fmt(s['ar_tokens_per_s'], '.1f')} "
             f"(speedup {fmt(s['speedup'])}); identical to engine AR {fmt(s['identical_to_engine_ar'])}"
             + (f", to draftsmith AR {fmt(s['identical_to_draftsmith_ar'])}" if "identical_to_draftsmith_ar" in s else "")]
    for row in report.get("throughput", []):
        lines.append(f"concurrency {row['concurrency']}: {fmt(row['tokens_per_s'], '.1f')} tokens/s vs AR "
                     f"{fmt(row['ar_tokens_per_s'], '.1f')} (speedup {fmt(row['speedup'])})")
    return lines


__all__ = ["acceptance_figures", "by_category", "identity", "parity", "parity_table", "spec_totals", "summarize",
           "summary_lines", "throughput", "tokens_per_second"]
