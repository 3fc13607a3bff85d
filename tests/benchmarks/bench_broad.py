"""Draft settings on prompts unlike the dev set: the zoo draft and a distilled draft on the broad dev questions.

    python tests/benchmarks/bench_broad.py --distilled runs/distillspec_tiny/artefact --out-dir runs/broad
    python tests/benchmarks/bench_broad.py --zoo smollm2 --distilled runs/distillspec_smollm2/artefact \
        --per-category 4 --pld --out-dir runs/broad_smollm2          # the real target, 48 of the 244 questions

For each draft (the zoo's, written as an artefact, and the distilled one) it runs ``draftsmith tune`` (held-out
calibration prompts from the corpus, never the broad set), then ``draftsmith eval --questions broad`` at the
chosen settings, at fixed draft lengths 2, 4 and 6 without a confidence stop, and at the old defaults (4 tokens,
confidence stop 0.4). Every cell is its own process with one torch thread; finished cells are not run again.
With ``--pld`` it also runs prompt lookup against transformers' (``--compare hf``) on the zoo's target. Writes
``broad.json`` and ``broad.md`` (overall and per category: tau, speedup, predicted, measured/predicted).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

FIXED = ["--draft-length-mode", "fixed"]  # an artefact tuned to an adaptive policy keeps it unless told otherwise
SETTINGS = {  # name -> draftsmith eval options ([]: the artefact's tuned settings)
    "chosen": [],
    "fixed 2": [*FIXED, "--draft-length", "2", "--draft-confidence", "0"],
    "fixed 4": [*FIXED, "--draft-length", "4", "--draft-confidence", "0"],
    "fixed 6": [*FIXED, "--draft-length", "6", "--draft-confidence", "0"],
    "old default (4, conf 0.4)": [*FIXED, "--draft-length", "4", "--draft-confidence", "0.4"],
}


def draftsmith(*args: str) -> None:
    cmd = [str(Path(sys.executable).parent / "draftsmith"), *args]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def zoo_draft_artefact(out: Path, size: str = "tiny") -> Path:
    """The ``size`` zoo's draft as a ``draft`` artefact (so it can be tuned like a trained one)."""
    if (out / "manifest.json").is_file():
        return out
    from draftsmith.common.models import load_model, load_tokenizer, target_identity
    from draftsmith.inference.artefacts.manifest import write_artefact
    from draftsmith.trainers.zoo import ensure_zoo

    zoo = ensure_zoo(size)
    target, draft = load_model(zoo / "target"), load_model(zoo / "draft")
    tokenizer = load_tokenizer(zoo / "tokenizer")
    write_artefact(out, "draft_model", method="draft", target=target_identity(target, tokenizer, str(zoo / "target")),
                   proposer={"draft_length": 4, "model_dir": "draft"}, model=draft, tokenizer=tokenizer)
    return out


def summary(report: dict) -> dict:
    s = report["summary"]
    cats = {name: {k: c.get(k) for k in ("tau", "speedup", "predicted_speedup")}
            for name, c in report["categories"].items()}
    return {k: s.get(k) for k in ("tau", "speedup", "aggregate_speedup", "predicted_speedup", "measured_over_predicted",
                                  "greedy_identical", "mean_draft_length")} | {
        "proposer": report.get("proposer"), "categories": cats,
        "hf_prompt_lookup": {k: report.get("baselines", {}).get("hf_prompt_lookup", {}).get(k) for k in ("tau", "speedup")}}


def fmt(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(results: dict) -> str:
    lines = ["| draft | settings | tau | speedup | token-weighted speedup | predicted (of it) | measured/predicted | identical |",
             "|---|---|---|---|---|---|---|---|"]
    for draft, cells in results.items():
        for name, r in cells.items():
            p = r["proposer"] or {}
            mode = p.get("draft_length_mode") or "fixed"
            policy = f"k {p.get('draft_length')}" if mode == "fixed" else f"{mode} from {p.get('draft_length')} to {p.get('draft_max_length')}"
            label = f"{name.split(' (')[0]} ({policy}, conf {p.get('confidence_threshold')})"
            lines.append(f"| {draft} | {label} | {fmt(r['tau'])} | {fmt(r['speedup'])} | {fmt(r.get('aggregate_speedup'))} "
                         f"| {fmt(r['predicted_speedup'])} | {fmt(r['measured_over_predicted'])} | {fmt(r['greedy_identical'], 2)} |")
    for draft, cells in results.items():
        hf = cells["chosen"].get("hf_prompt_lookup") or {}
        if hf.get("speedup"):
            ratio = fmt(cells["chosen"]["speedup"] / hf["speedup"], 2)
            lines.append(f"| transformers' prompt lookup (same run as {draft}) | - | {fmt(hf['tau'])} | {fmt(hf['speedup'])} "
                         f"| - | - | draftsmith ÷ transformers {ratio} | - |")
    first = next(iter(results.values()))["chosen"]["categories"]
    lines += ["", "Per category at the chosen settings (tau / speedup):", "",
              "| category | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for cat in first:
        row = [f"{fmt(results[d]['chosen']['categories'][cat]['tau'])} / "
               f"{fmt(results[d]['chosen']['categories'][cat]['speedup'])}" for d in results]
        lines.append(f"| {cat} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--distilled", type=Path, required=True, help="a distilled draft artefact (DistillSpec recipe)")
    p.add_argument("--out-dir", type=Path, default=Path("runs/broad"))
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--per-category", type=int, default=None, help="the first N questions of each category")
    p.add_argument("--tune-prompts", type=int, default=40)
    p.add_argument("--zoo", default="tiny", help="zoo size whose draft is the undistilled baseline (tiny, smollm2)")
    p.add_argument("--pld", action="store_true", help="also prompt lookup vs transformers' on the zoo's target")
    p.add_argument("--first", choices=("zoo", "distilled"), default="zoo", help="whose cells run first")
    args = p.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    subset = [*(["--limit", str(args.limit)] if args.limit else []),
              *(["--per-category", str(args.per_category)] if args.per_category else [])]
    drafts = {"zoo draft": zoo_draft_artefact(args.out_dir / "zoo_draft_artefact", args.zoo), "distilled": args.distilled}
    if args.first == "distilled":  # the distilled draft's cells first (a long run shows its figures sooner)
        drafts = dict(reversed(list(drafts.items())))
    results: dict[str, dict] = {}
    for draft, artefact in drafts.items():
        manifest = json.loads((artefact / "manifest.json").read_text())
        if "tuning" not in manifest:
            draftsmith("tune", "--artefact", str(artefact), "--prompts", str(args.tune_prompts), "--max-new-tokens",
                       str(args.max_new_tokens), "--threads", "1")
        results[draft] = {}
        for name, options in SETTINGS.items():
            out = args.out_dir / draft.replace(" ", "_") / name.split(" (")[0].replace(" ", "_") / "report.json"
            if not out.is_file():
                draftsmith("eval", "--artefact", str(artefact), "--questions", "broad", "--max-new-tokens",
                           str(args.max_new_tokens), "--threads", "1", "--no-progress", "--out", str(out), *options,
                           *subset)
            results[draft][name] = summary(json.loads(out.read_text()))
    if args.pld:
        out = args.out_dir / "pld" / "report.json"
        if not out.is_file():
            from draftsmith.trainers.zoo import ensure_zoo

            draftsmith("eval", "--target", str(ensure_zoo(args.zoo) / "target"), "--method", "pld", "--compare", "hf",
                       "--questions", "broad", "--max-new-tokens", str(args.max_new_tokens), "--threads", "1",
                       "--no-progress", "--out", str(out), *subset)
        results["prompt lookup"] = {"chosen": summary(json.loads(out.read_text()))}
    (args.out_dir / "broad.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out_dir / "broad.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
