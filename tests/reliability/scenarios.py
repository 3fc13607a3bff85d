"""What the reliability suite's fault tests run and compare (loaded by conftest.py, handed out as the ``scenarios``
fixture): each :class:`Scenario` is a short ``draftsmith`` command on the tiny pair and the part of its output that a
rerun after a fault must reproduce exactly (rows, answers and tau, weights and losses, cache shards; never timings)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


# -------------------------------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    """A command whose output a rerun after a fault (a full disk, a kill) must reproduce."""

    name: str
    argv: Callable  # (harness, pair, output directory) -> `draftsmith` argv
    result: Callable[[Path], object]  # output directory -> what a finished run must reproduce
    units: Callable[[object], set]  # a result -> its rows / questions / steps, to count what a fault lost
    fault_root: str = ""  # the directory under the output directory where the disk fails ("" = all of it)


def generate_argv(harness, pair, out):
    return ["data", "generate", "--target", pair["target"], "--prompts", pair["dataset"], "--limit", "6",
            "--batch-size", "2", "--max-new-tokens", "3", "--out", out / "answers.jsonl", "--no-progress"]


def generated_rows(out: Path) -> dict:
    meta = json.loads((out / "answers.jsonl.meta.json").read_text())
    return {"rows": (out / "answers.jsonl").read_text().splitlines(), "settings": meta["settings"],
            "complete": meta["progress"]["complete"]}


def eval_argv(harness, pair, out):
    return ["eval", "--target", pair["target"], "--method", "draft", "--draft", pair["draft"], "--limit", "3",
            "--max-new-tokens", "6", "--warmup", "0", "--verify-padding", "off", "--out", out / "report.json",
            "--no-progress"]


def report_numbers(out: Path) -> dict:
    """What an evaluation reports that is not a timing: every answer, its steps and accepted lengths, tau."""
    report = json.loads((out / "report.json").read_text())
    keep = ("question_id", "new_tokens", "steps", "accept_lengths", "identical", "output_ids", "finish_reason")
    summary = {k: report["summary"].get(k) for k in ("tau", "acceptance_rate", "greedy_identical", "new_tokens",
                                                      "steps", "proposed", "accepted")}
    return {"summary": summary, "questions": [{k: q.get(k) for k in keep} for q in report["questions"]]}


def training_argv(harness, pair, out, *extra):
    return ["train", "distillspec", *harness.recipe_argv(pair, out, "distillspec"), "max_steps=4", "save_steps=2",
            "eval_strategy=no", "report_to=none", "seed=42", "--resume_from_checkpoint", "auto", *extra]


def artefact_result(out: Path) -> dict:
    """The artefact's weights and the numbers of its manifest that do not depend on timing, and the logged losses."""
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    metrics = {k: v for k, v in manifest["metrics"].items() if not any(t in k for t in ("second", "time"))}
    last = max((p for p in out.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
               key=lambda p: int(p.name.split("-")[1]))
    losses = [(h["step"], h["loss"]) for h in json.loads((last / "trainer_state.json").read_text())["log_history"]
              if "loss" in h]
    return {"weights": manifest["weights"], "steps": manifest["training"]["steps"],
            "tokens": manifest["training"]["tokens"], "metrics": metrics, "losses": losses}


def cache_argv(harness, pair, out):
    return training_argv(harness, pair, out, "features=offline", f"feature_cache_dir={out / 'cache'}",
                         "feature_cache_dtype=float32")


def cache_result(out: Path) -> dict:
    cache = out / "cache"
    return {str(p.relative_to(cache)): _digest(p) for p in sorted(cache.rglob("*.safetensors"))}


# every recipe and variant the kill test breaks: (method, settings of the variant, target layers; 0 = the pair's)
RECIPES = {
    "distillspec": ("distillspec", [], 0), "medusa1": ("medusa", [], 0), "medusa2": ("medusa", ["variant=medusa2"], 0),
    "eagle1": ("eagle", [], 0), "eagle3": ("eagle", ["variant=eagle3", "ttt_steps=2", "draft_vocab_size=64"], 4),
    "peagle": ("eagle", ["variant=peagle", "ttt_steps=3", "draft_length=3", "tree_depth=3"], 4),
    "dflash": ("dflash", [], 4), "layerskip": ("layerskip", [], 0), "bita": ("bita", [], 0), "cllm": ("cllm", [], 0),
}


def recipe_scenario(name: str) -> Scenario:
    """The training scenario of one recipe of :data:`RECIPES` (its test config, 4 steps, checkpoints at 2 and 4)."""
    method, extra, layers = RECIPES[name]

    def argv(harness, pair, out):
        from tiny_pair import write_target

        target = pair["target"]
        if layers:
            target = pair["target"].parent / f"target{layers}"
            if not (target / "config.json").is_file():
                write_target(pair["target"].parent, layers)
        return ["train", method, *harness.recipe_argv(pair | {"target": target}, out, method), "max_steps=4",
                "save_steps=2", "eval_strategy=no", "report_to=none", "seed=42", "evaluate=false", "tune=false",
                "calibrate_tree=false", "--resume_from_checkpoint", "auto", *extra]

    return Scenario(f"training {name}", argv, artefact_result, lambda r: set(r["losses"]))


SCENARIOS = {
    "data generate": Scenario("data generate", generate_argv, generated_rows, lambda r: set(r["rows"])),
    "eval": Scenario("eval", eval_argv, report_numbers, lambda r: {json.dumps(q) for q in r["questions"]}),
    "training": Scenario("training", training_argv, artefact_result, lambda r: set(r["losses"])),
    "feature cache": Scenario("feature cache", cache_argv, cache_result, lambda r: set(r.items()), "cache"),
}




def difference(expected, got) -> str:
    """Where a rerun's result departs from the reference's (the first three keys)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        keys = [k for k in expected if expected.get(k) != got.get(k)] + [k for k in got if k not in expected]
        return "; ".join(f"{k}: {json.dumps(expected.get(k), default=str)[:150]} != "
                         f"{json.dumps(got.get(k), default=str)[:150]}" for k in keys[:3])
    return f"{str(expected)[:200]} != {str(got)[:200]}"
