"""What a recipe does after training, on the main process only: tuning a draft model's proposer, calibrating the
tree of a tree method, and evaluating the artefact exactly as ``draftsmith eval --artefact`` would.

Under sharding (ZeRO-3 or FSDP) the other processes have finished once the artefact is written, and the training
copies of the models are sharded, so nothing here may need them: the main process loads the target whole, once,
from its path (the artefact on disk is already whole), with ZeRO-3's partitioned construction switched off while
it loads (:func:`unpartitioned_loading`). Without sharding the training target is used as it is.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from draftsmith.common.models import load_model
from draftsmith.common.registry import MethodSpec
from draftsmith.launch.recipe_args import RecipeArguments


@contextlib.contextmanager
def unpartitioned_loading(training_args) -> Iterator[None]:
    """Models loaded inside this block are whole on this process: while a ZeRO-3 config is active, transformers
    builds every model it loads partitioned across the processes (``deepspeed.zero.Init``, a collective the finished
    processes would never join); the config is set aside meanwhile and restored after."""
    config = getattr(training_args, "hf_deepspeed_config", None)
    if config is None or not config.is_zero3():
        yield
        return
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        set_hf_deepspeed_config(config)


def after_training(artefact: Path, spec: MethodSpec, recipe: RecipeArguments, training_args, target, tokenizer,
                   paths: dict[str, str], *, sharded: bool, load_target: Callable[[], Any]) -> dict[str, dict]:
    """Tune, calibrate and evaluate ``artefact`` as the recipe asks (main process only); returns the evaluation
    reports by name. ``target``: the training target; ``sharded``: its training copies are sharded, so the target is
    ``load_target()`` instead (whole, loaded once)."""
    from draftsmith.launch.tune_cli import calibration_questions, summary_lines

    tune = recipe.tune and spec.artefact_kind == "draft_model"
    calibrate = recipe.calibrate_tree and spec.calibrated_tree
    if not (tune or calibrate or recipe.evaluate):
        return {}
    with unpartitioned_loading(training_args):
        if sharded:
            print("loading the whole target on the main process for the work after training (the training copies "
                  "are sharded)")
            target = load_target()
        questions = calibration_questions(recipe.tune_prompts, training_args.seed)
        if tune:
            from draftsmith.launch.tune_cli import tune_artefact

            record = tune_artefact(artefact, target, tokenizer, questions, max_new_tokens=recipe.eval_max_new_tokens)
            print("\n".join(summary_lines(record)))
        if calibrate:
            from draftsmith.launch.tune_cli import calibrate_tree_artefact

            record = calibrate_tree_artefact(artefact, target, tokenizer, questions,
                                             max_new_tokens=recipe.eval_max_new_tokens)
            print("\n".join(summary_lines(record)))
        if not recipe.evaluate:
            return {}
        baseline = None
        if recipe.eval_baseline and "draft" in paths:
            baseline = load_model(paths["draft"], recipe.dtype, what="draft")
        return evaluate_artefact(artefact, target, tokenizer, recipe, Path(training_args.output_dir) / "eval",
                                 paths["target"], baseline)


def evaluate_artefact(artefact: Path, target_model, tokenizer, args: RecipeArguments, out_dir: Path,
                      target_name: str, baseline_draft=None) -> dict[str, dict]:
    """Evaluate the artefact (loaded exactly as ``draftsmith eval --artefact`` loads it) and, when given, the
    method before training (the same proposer settings with the draft as it was); print the summary and the tau
    ratio. Returns the reports by name."""
    from draftsmith.inference.artefacts.manifest import adapted_target, read_manifest
    from draftsmith.inference.evaluation.evaluator import evaluate
    from draftsmith.inference.evaluation.questions import read_questions
    from draftsmith.inference.evaluation.report import summary_table, write_report
    from draftsmith.inference.methods import load_artefact

    questions = read_questions(None, limit=args.eval_limit)
    manifest = read_manifest(artefact)  # every file hashed, once
    verified = adapted_target(artefact, manifest, target_model)  # the target, or target + LoRA
    runs = {"trained": load_artefact(artefact, verified, tokenizer, manifest=manifest)}
    if baseline_draft is not None:
        runs["baseline"] = load_artefact(artefact, verified, tokenizer, draft_model=baseline_draft, manifest=manifest)
    reports = {}
    for name, (proposer, manifest) in runs.items():
        label = str(artefact) if name == "trained" else f"{manifest['method']} before training"
        reports[name] = evaluate(verified.eval(), tokenizer, manifest["method"], lambda p=proposer: p, questions,
                                 max_new_tokens=args.eval_max_new_tokens, target_name=target_name, draft_name=label,
                                 command=" ".join(sys.argv),
                                 original_model=target_model.eval() if verified is not target_model else None)
        write_report(reports[name], out_dir / name)
    print(summary_table(reports["trained"]))
    if "baseline" in reports:
        before, after = reports["baseline"]["summary"]["tau"], reports["trained"]["summary"]["tau"]
        print(f"tau: before training {before:.3f} -> after {after:.3f} ({after / before:.3f}x)")
    print(f"reports: {out_dir.resolve()}")
    return reports


__all__ = ["after_training", "evaluate_artefact", "unpartitioned_loading"]
