"""The evaluation report: assembled from the decode runs (:func:`build_report`) and written as
``<out>.json``, ``<out>.md`` and PNG plots beside them (:func:`write_report`).

Given ``--out runs/report.json`` the files are ``runs/report.json``, ``runs/report.md``,
``runs/report_accept_lengths.png`` (histogram of tokens committed per target forward) and
``runs/report_categories.png`` (speedup and tau by category). Every file is written atomically.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import secrets
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from draftsmith.common import __version__
from draftsmith.common.io import atomic_write_text, environment
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.proposer import acceptance_rule
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.evaluation.baselines import HF_PROMPT_LOOKUP_TOKENS, summarize_hf
from draftsmith.inference.evaluation.metrics import question_record, summarize
from draftsmith.inference.evaluation.runs import QuestionRun

SUMMARY_ROWS = (
    ("tau", "tau (tokens per target forward)"),
    ("acceptance_rate", "acceptance rate"),
    ("speedup", "speedup vs AR"),
    ("tokens_per_s", "tokens/s"),
    ("ar_tokens_per_s", "AR tokens/s"),
    ("predicted_speedup", "predicted speedup (cost model)"),
    ("measured_over_predicted", "measured / predicted speedup"),
    ("greedy_identical", "greedy identical to AR"),
)


# ---------------------------------------------------------------------------------------------- assembly


def build_report(
    runs: Sequence[QuestionRun],
    *,
    method: str,
    sampling: SamplingParams,
    max_new_tokens: int,
    seed: int,
    warmup: int,
    proposer,
    target_name: str,
    draft_name: str | None,
    question_file: str | None,
    command: str | None,
    tie_rule: str,
    target: ModelAdapter,
    compare_hf: bool,
    extra: dict | None,
    cost_curve: dict[int, float] | None = None,
) -> dict:
    """The report dict of an evaluation (JSON-serialisable): settings, summary, per-category summaries,
    transformers baselines, notes, environment and one record per question; ``extra`` keys are added last.
    ``cost_curve`` (verification seconds by tokens) makes the predictions use the cost model."""
    greedy = sampling.greedy
    lossless = bool(getattr(proposer, "lossless", True)) if proposer is not None else True
    summary = summarize(runs, greedy, cost_curve)
    categories = {
        cat: summarize([r for r in runs if r.question.category == cat], greedy, cost_curve)
        for cat in dict.fromkeys(r.question.category for r in runs)
    }
    env = environment(
        torch_threads=torch.get_num_threads(), device=str(target.device), dtype=str(target.dtype).replace("torch.", "")
    )
    report = {
        "method": method,
        "target": target_name,
        "draft": draft_name,
        "question_file": question_file,
        "num_questions": len(runs),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "warmup": warmup,
        "lossless": lossless,
        "verification": _verification(proposer, greedy),
        "proposer": _proposer_info(proposer),
        "summary": summary,
        "categories": categories,
        "baselines": _baselines(runs, summary) if compare_hf else {},
        "notes": _notes(runs, greedy, lossless, getattr(proposer, "name", method), tie_rule),
        "near_tie_rule": tie_rule,
        "draftsmith_version": __version__,
        "environment": env,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "questions": [question_record(r, greedy) for r in runs],
    }
    if extra:
        report.update(extra)
    return report


def _notes(runs: Sequence[QuestionRun], greedy: bool, lossless: bool, name: str, tie_rule: str) -> list[str]:
    """What a reader must know to read the figures: sampling, a lossy rule, differing answers, truncation."""
    notes = []
    if not greedy:
        notes.append(
            "temperature > 0: greedy_identical is null (sampled answers are not expected to match AR token for "
            "token); losslessness under sampling is checked by `draftsmith eval --check-distribution`"
        )
    if not lossless:
        notes.append(f"LOSSY: the {name} acceptance rule changes the output distribution")
    near = [r.difference for r in runs if r.difference is not None]
    if near:
        ties = sum(1 for d in near if d.get("near_tie"))
        notes.append(
            f"{len(near)} answer(s) differ from AR; {ties} at a near-tie ({tie_rule}), "
            f"{len(near) - ties} not explained by a near-tie"
        )
    truncated = sum(1 for r in runs for t in r.method if t.truncated)
    if truncated:
        notes.append(f"{truncated} prompt(s) were truncated from the left to fit the context")
    return notes


def _baselines(runs: Sequence[QuestionRun], summary: dict) -> dict[str, dict]:
    """The transformers baselines' fields, a skipped assisted baseline said so, and their settings."""
    baselines = summarize_hf(runs, summary["ar_tokens_per_s"])
    if "hf_assisted" not in baselines:
        baselines["hf_assisted"] = {"speedup": None, "tau": None, "tokens_per_s": None,
                                    "skipped": "no separate draft model for transformers' assisted generation (pass --draft)"}
    assisted = baselines["hf_assisted"].get("speedup")
    baselines["draftsmith_vs_hf_assisted"] = summary["speedup"] / assisted if assisted and summary["speedup"] else None
    baselines["settings"] = {
        "hf_assisted": "transformers defaults (num_assistant_tokens=20 'constant' schedule unless the draft's "
        "generation_config says otherwise, assistant_confidence_threshold=0.4)",
        "hf_prompt_lookup": f"prompt_lookup_num_tokens={HF_PROMPT_LOOKUP_TOKENS}",
        "greedy": True,
    }
    return baselines


def _verification(proposer, greedy: bool) -> str:
    """The acceptance rule the run used: a lossy proposer's own (e.g. Medusa's typical acceptance), else the exact
    rule of the decoding mode."""
    rule = acceptance_rule(proposer)
    if rule is not None:
        return getattr(rule, "__name__", "custom") + ("" if getattr(proposer, "lossless", True) else " (LOSSY)")
    return "greedy (exact match)" if greedy else "speculative sampling"


def _proposer_info(proposer) -> dict | None:
    if proposer is None:
        return None
    info: dict = {"name": getattr(proposer, "name", type(proposer).__name__), "lossless": getattr(proposer, "lossless", True)}
    policy = getattr(proposer, "policy", None)
    if policy is not None:
        info["draft_length"] = policy.length
        info["draft_length_mode"] = policy.mode
        if policy.mode != "fixed":
            info["draft_max_length"] = policy.max_length
    for attr in ("num_draft_tokens", "max_ngram", "min_ngram", "adaptive", "threshold", "confidence_threshold"):
        if hasattr(proposer, attr):
            info[attr] = getattr(proposer, attr)
    return info


# ---------------------------------------------------------------------------------------------- writing


def report_paths(out: str | Path) -> dict[str, Path]:
    out = Path(out)
    if out.suffix != ".json":
        out = out.with_suffix(out.suffix + ".json") if out.suffix else out.with_suffix(".json")
    stem = out.with_suffix("")
    return {
        "json": out,
        "markdown": stem.with_suffix(".md"),
        "accept_lengths_png": stem.parent / f"{stem.name}_accept_lengths.png",
        "categories_png": stem.parent / f"{stem.name}_categories.png",
    }


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}f}"
    return str(value)


def _tuning_lines(tuning: dict | None) -> list[str]:
    """The artefact's tuned draft settings: the choice and the runner-up, predicted and measured."""
    if not tuning:
        return []
    from draftsmith.inference.evaluation.tune import Candidate

    rows = [[name, Candidate(**c).policy_label(), fmt(c["confidence_threshold"], 2), fmt(c["predicted_tau"]),
             fmt(c["predicted_speedup"]), fmt(c.get("measured_tau")), fmt(c.get("measured_speedup"))]
            for name, c in (("chosen", tuning.get("chosen")), ("runner-up", tuning.get("runner_up"))) if c]
    return ["", "## Draft settings chosen for this artefact (`draftsmith tune`, calibration prompts)", "",
            *_table(["", "draft length (policy)", "confidence stop", "predicted tau", "predicted speedup", "measured tau",
                     "measured speedup"], rows)]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def lossless_status(report: dict) -> str:
    if not report.get("lossless", True):
        return "LOSSY: this method's acceptance rule changes the output distribution; its outputs are not the target's."
    ident = report.get("summary", {}).get("greedy_identical")
    if ident is None:
        return (
            "lossless rule (speculative sampling); sampled answers are not compared token by token "
            "(run `draftsmith eval --check-distribution` for the statistical check)"
        )
    n = report.get("num_questions", 0)
    same = round(ident * n)
    line = f"lossless rule; {same}/{n} answers token-identical to AR (greedy)"
    diffs = [q["difference"] for q in report.get("questions", []) if q.get("difference")]
    if diffs:
        ties = sum(1 for d in diffs if d.get("near_tie"))
        line += f"; of the {len(diffs)} that differ, {ties} differ at a near-tie ({report.get('near_tie_rule')})"
    return line


def render_markdown(report: dict, paths: dict[str, Path] | None = None) -> str:
    s = report["summary"]
    lines = [f"# draftsmith eval: {report['method']}", ""]
    if not report.get("lossless", True):
        lines += ["> **LOSSY METHOD** — outputs are not guaranteed to follow the target's distribution.", ""]
    lines += [
        f"- target: `{report.get('target') or '?'}`" + (f", draft: `{report['draft']}`" if report.get("draft") else ""),
        f"- questions: {report.get('num_questions')} from `{report.get('question_file') or '?'}`",
        f"- temperature {report.get('temperature')}, top-p {report.get('top_p')}, top-k {report.get('top_k')}, "
        f"max_new_tokens {report.get('max_new_tokens')}, seed {report.get('seed')}, warm-up {report.get('warmup')}",
        f"- verification: {report.get('verification')}",
        f"- lossless: {lossless_status(report)}",
        "",
        "## Summary",
        "",
    ]
    lines += _table(["metric", "value"], [[label, fmt(s.get(key))] for key, label in SUMMARY_ROWS])
    lines += [
        "",
        f"Predicted tau {fmt(s.get('predicted_tau'))} from the per-depth acceptance, mean draft length "
        f"{fmt(s.get('mean_draft_length'), 2)}, the measured verification cost by tokens and the draft cost "
        f"(draft/target cost ratio {fmt(s.get('cost_ratio'))}), prompt processing a fixed cost per answer; the "
        f"prediction is of the token-weighted speedup ({fmt(s.get('aggregate_speedup'))} measured). With a constant "
        f"verification cost (Leviathan et al.) "
        f"it would be {fmt(s.get('predicted_speedup_constant_cost'))}.",
        "",
        "## By category",
        "",
    ]
    cat_rows = [
        [name, str(c.get("num_questions")), fmt(c.get("tau")), fmt(c.get("acceptance_rate")), fmt(c.get("speedup")),
         fmt(c.get("tokens_per_s"), 1), fmt(c.get("ar_tokens_per_s"), 1), fmt(c.get("greedy_identical"))]
        for name, c in report.get("categories", {}).items()
    ]
    lines += _table(["category", "questions", "tau", "acceptance", "speedup", "tokens/s", "AR tokens/s", "identical"], cat_rows)
    lines += _tuning_lines((report.get("artefact") or {}).get("tuning"))
    baselines = {k: v for k, v in report.get("baselines", {}).items() if isinstance(v, dict) and k != "settings"}
    if baselines:
        lines += ["", "## transformers baselines (same prompts, greedy)", ""]
        hf_ar = baselines.get("hf_ar", {}).get("tokens_per_s")
        vs_hf_ar = s["tokens_per_s"] / hf_ar if hf_ar and s.get("tokens_per_s") is not None else None
        rows = [["draftsmith " + report["method"], fmt(s.get("speedup")), fmt(s.get("tau")), fmt(s.get("tokens_per_s"), 1),
                 fmt(vs_hf_ar), fmt(s.get("greedy_identical"))]]
        for name, b in baselines.items():
            rows.append([name, fmt(b.get("speedup")), fmt(b.get("tau")), fmt(b.get("tokens_per_s"), 1),
                         fmt(b.get("speedup_vs_hf_ar")), b.get("skipped") or fmt(b.get("identical_to_ar"))])
        lines += _table(["decoder", "speedup vs draftsmith AR", "tau", "tokens/s", "speedup vs HF AR", "identical to AR"], rows)
        ratio = report["baselines"].get("draftsmith_vs_hf_assisted")
        if ratio is not None:
            lines += ["", f"draftsmith {report['method']} speedup / transformers assisted speedup: **{fmt(ratio, 2)}**"]
        settings = report.get("baselines", {}).get("settings")
        if settings:
            lines += ["", "Settings: " + "; ".join(f"{k}: {v}" for k, v in settings.items())]
    diffs = [q for q in report.get("questions", []) if q.get("difference")]
    if diffs:
        lines += ["", "## Answers that differ from AR", ""]
        rows = [
            [str(q["question_id"]), str(q["difference"]["turn"] + 1), str(q["difference"]["position"]),
             fmt(q["difference"].get("top2_gap"), 6), fmt(q["difference"].get("near_tie"))]
            for q in diffs
        ]
        lines += _table(["question", "turn", "first differing position", "top-2 logit gap", "near-tie"], rows)
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    if paths is not None:
        lines += ["", "## Plots", "", f"![accept lengths]({paths['accept_lengths_png'].name})",
                  f"![by category]({paths['categories_png'].name})"]
    env = report.get("environment", {})
    lines += ["", "## Environment", "", "- " + ", ".join(f"{k} {v}" for k, v in env.items())]
    if report.get("command"):
        lines += ["", "## Command", "", "```", report["command"], "```"]
    return "\n".join(lines) + "\n"


def _figure(size: tuple[float, float]):
    """A matplotlib figure on the Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def _save_figure(fig, path: Path) -> None:
    # a plain open() of a fresh name, not mkstemp: the plot gets the mode the umask gives, as the report does
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.png")
    try:
        fig.savefig(tmp, dpi=100, bbox_inches="tight", format="png")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plot_accept_lengths(report: dict, path: Path) -> None:
    counts = Counter(a for q in report.get("questions", []) for a in q.get("accept_lengths", []))
    fig = _figure((6, 3.5))
    ax = fig.subplots()
    xs = sorted(counts) or [1]
    ax.bar(xs, [counts.get(x, 0) for x in xs], color="#4477aa")
    ax.set_xlabel("tokens committed per target forward")
    ax.set_ylabel("steps")
    ax.set_xticks(xs)
    ax.set_title(f"{report['method']}: tau = {fmt(report['summary'].get('tau'), 2)}")
    _save_figure(fig, path)


def plot_categories(report: dict, path: Path) -> None:
    cats = report.get("categories", {})
    names = list(cats) or ["(none)"]
    fig = _figure((max(6, 1.2 * len(names) + 2), 3.5))
    ax1, ax2 = fig.subplots(1, 2)
    for ax, key, title in ((ax1, "speedup", "speedup vs AR"), (ax2, "tau", "tau")):
        values = [cats.get(n, {}).get(key) or 0.0 for n in names]
        ax.bar(range(len(names)), values, color="#228833" if key == "speedup" else "#4477aa")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right")
        ax.set_title(title)
    _save_figure(fig, path)


def write_report(report: dict, out: str | Path, plots: bool = True) -> dict[str, Path]:
    """Write the JSON, the markdown and (unless ``plots=False``) the PNG plots; returns their paths."""
    paths = report_paths(out)
    paths["json"].parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths["json"], json.dumps(report, indent=1, default=str) + "\n")
    if plots:
        plot_accept_lengths(report, paths["accept_lengths_png"])
        plot_categories(report, paths["categories_png"])
    else:
        paths.pop("accept_lengths_png")
        paths.pop("categories_png")
    atomic_write_text(paths["markdown"], render_markdown(report, paths if plots else None))
    return paths


def summary_table(report: dict) -> str:
    """A short plain-text table for the terminal."""
    s = report["summary"]
    rows = [(label, fmt(s.get(key))) for key, label in SUMMARY_ROWS]
    for name, b in report.get("baselines", {}).items():
        if isinstance(b, dict) and name != "settings":
            rows.append((f"{name} speedup / tau", f"{fmt(b.get('speedup'))} / {fmt(b.get('tau'))}"))
    ratio = report.get("baselines", {}).get("draftsmith_vs_hf_assisted")
    if ratio is not None:
        rows.append(("speedup / hf_assisted speedup", fmt(ratio, 2)))
    rows.append(("lossless", lossless_status(report)))
    adapted = report.get("adapted_target")
    if adapted:
        rows.append(("verified against", "the artefact's adapted target"))
        rows.append(("AR answers identical to the original target's",
                     f"{fmt(adapted.get('answers_identical_to_original'))} (shared prefix "
                     f"{fmt(adapted.get('mean_shared_prefix_fraction'))}, first difference at token "
                     f"{fmt(adapted.get('mean_first_difference'), 1)})"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)
