"""The recipe runner: config, models, data, training, artefact and evaluation for any registered method.

A recipe (``recipes/<method>.py``) is one call::

    sys.exit(recipe_main("distillspec"))          # default settings: the spec's shipped config (distillspec_tiny)

:func:`run_recipe` reads the method's registry entry (``draftsmith.common.registry``): it parses the settings
(:mod:`draftsmith.launch.recipe_args`), resolves and loads the models the method starts from (a target alone, or a
target plus a draft; the built-in zoo when no ``--target`` is given), loads the data, builds the method's trainer
around the module it trains, trains (resuming with ``--resume_from_checkpoint``, which refuses changed settings:
:mod:`draftsmith.launch.run_settings`), writes the artefact of the method's kind to ``<output_dir>/artefact`` with
its manifest, and with ``--evaluate`` runs the evaluator on it exactly as ``draftsmith eval --artefact`` would
(:mod:`draftsmith.launch.after_training`). It runs unchanged under ``python``, ``accelerate launch``, ``torchrun``
and ``deepspeed``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ConfigError, DraftsmithError, error_line
from draftsmith.common.io import SUMS_FILE, changed_files, sha256_file
from draftsmith.common.models import load_model, load_tokenizer, target_identity
from draftsmith.common.outputs import claim, first_missing, remove_empty, weights_bytes, write_failures
from draftsmith.common.precision import trained_dtype
from draftsmith.common.registry import MethodSpec, get_method
from draftsmith.launch.after_training import after_training
from draftsmith.launch.recipe_args import RecipeArguments, parse_recipe_args
from draftsmith.launch.run_settings import (
    RUN_SETTINGS,
    check_max_steps,
    check_resume_settings,
    checkpoint_step,
    settings_record,
    training_settings,
)
from draftsmith.launch.targets import resolve_model_arg, tokenizer_source, zoo_model_dir
from draftsmith.trainers.hooks import AdaptsTarget, ArtefactConfig, ArtefactTensors, PreparesDatasets, TunesTarget

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"  # the Trainer writes it last: a checkpoint without it is incomplete
RESUME_LATEST = ("true", "latest", "last")
RESUME_AUTO = "auto"
# Trainer evaluation keys that describe the run, not the model
_RUN_METRICS = ("runtime", "samples_per_second", "steps_per_second", "epoch")


@dataclass
class RecipeResult:
    method: str
    artefact: Path
    manifest: dict | None  # None on processes other than the main one
    reports: dict[str, dict]


# -------------------------------------------------------------------------------------------- models and data


def resolve_models(args: RecipeArguments, spec: MethodSpec) -> dict[str, str]:
    """Paths (or hub ids) of the tokenizer and of every model the method starts from, each checked before anything
    loads by the one resolver of ``--target``/``--draft``/``--tokenizer`` (:mod:`draftsmith.launch.targets`: the zoo's
    layout, directories, GGUF files, hub ids; an error names the option at fault); the zoo's when no target is
    given."""
    needs_draft = "draft" in spec.models
    if args.target is None:
        roles = ("tokenizer", "target", "draft") if needs_draft else ("tokenizer", "target")
        return {role: str(zoo_model_dir(args.zoo_size, role)) for role in roles}
    from draftsmith.data.zoo import zoo_size_for_target

    own_zoo = zoo_size_for_target(args.target)
    if needs_draft and args.draft is None and own_zoo is None:
        raise ConfigError(f"--target was given without --draft: {spec.name} trains a separate draft model; pass the "
                          "draft to start from")
    if not needs_draft and args.draft is not None:
        raise ConfigError(f"--draft was given but {spec.name} trains no separate draft model: drop --draft")
    target = resolve_model_arg(args.target, "--target")
    paths = {"tokenizer": tokenizer_source(target, args.tokenizer) if args.tokenizer else None,  # None: the target's
             "target": target}
    if not needs_draft:
        return paths
    if args.draft is None:  # a named real target: its zoo's draft
        return paths | {"draft": str(zoo_model_dir(own_zoo, "draft"))}
    return paths | {"draft": resolve_model_arg(args.draft, "--draft", "draft")}


def load_models(paths: dict[str, str], args: RecipeArguments, method_config) -> dict[str, Any]:
    """The frozen target in the recipe's (resolved) dtype, quantized if the method config asks, and, when listed, the
    trainable draft in float32 master weights (draftsmith.common.precision)."""
    quantization = getattr(method_config, "target_quantization", "none")
    target = load_model(paths["target"], args.dtype, what="target", quantization=quantization)
    models = {"target": target.eval().requires_grad_(False)}
    if "draft" in paths:
        models["draft"] = load_model(paths["draft"], trained_dtype(args.dtype), what="draft").train()
    return models


def load_data(args: RecipeArguments, tokenizer, seed: int = 0):
    """``(train, heldout, info)``: tokenized datasets (input_ids, labels, attention_mask) and, for the
    manifest, the data's name, sha256, example counts and load summary."""
    from draftsmith.data.datasets import examples_to_dataset, load_chat_dataset

    if args.dataset is None:
        from draftsmith.data.corpus import balanced_subset, corpus_sha256, load_corpus, random_subset

        pick = balanced_subset if args.data_mix == "balanced" else random_subset
        train_rows = pick(load_corpus("train"), args.max_train_examples, seed)
        heldout_rows = random_subset(load_corpus("heldout"), args.eval_examples, seed)
        train, report = examples_to_dataset(train_rows, tokenizer, args.max_length, args.max_bad_fraction,
                                            source="draftsmith corpus (train)")
        heldout, _ = examples_to_dataset(heldout_rows, tokenizer, args.max_length, args.max_bad_fraction,
                                         source="draftsmith corpus (heldout)")
        info = {"name": "draftsmith-corpus", "sha256": corpus_sha256()}
    else:
        full, report = load_chat_dataset(args.dataset, tokenizer, args.max_length, args.dataset_format,
                                         args.max_bad_fraction)
        if len(full) <= args.eval_examples:
            raise ConfigError(f"{args.dataset} has {len(full)} usable rows, not more than eval_examples="
                              f"{args.eval_examples}: lower --eval_examples or add rows")
        split = full.train_test_split(test_size=args.eval_examples, seed=seed)
        train, heldout = split["train"], split["test"]
        if args.max_train_examples is not None and args.max_train_examples < len(train):
            train = train.shuffle(seed=seed).select(range(args.max_train_examples))
        info = {"name": str(args.dataset), "sha256": sha256_file(args.dataset)}
    info.update(train_examples=len(train), heldout_examples=len(heldout), load=report.summary())
    return train, heldout, info


def check_target_answers(args: RecipeArguments, method_config, target, tokenizer, target_name: str,
                         info: dict) -> None:
    """A method config whose ``trains_on_dataset_as_answers`` is true learns the dataset's responses as the target's
    own answers: the dataset must be a `draftsmith data generate` file this target wrote (recorded in ``info``)."""
    if not getattr(method_config, "trains_on_dataset_as_answers", False):
        return
    if args.dataset is None:
        raise ConfigError(f"the shipped corpus's responses are not the target's own answers: write them first "
                          f"(draftsmith data generate --target {target_name} --prompts corpus --out FILE) and pass "
                          "--dataset FILE, or train with data_mode=target")
    from draftsmith.data.self_distill import answered_by

    info["answered_by"] = answered_by(args.dataset, target, tokenizer, target_name)


# ------------------------------------------------------------------------------------------------- resuming


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """``checkpoint-N`` directories of ``output_dir`` whose trainer state (written last) parses, by step."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for sub in root.iterdir():
        m = CHECKPOINT_RE.match(sub.name)
        if not (m and sub.is_dir() and (sub / TRAINER_STATE).is_file()):
            continue
        try:
            json.loads((sub / TRAINER_STATE).read_text())
        except (json.JSONDecodeError, OSError):
            continue
        if (sub / RUN_SETTINGS).is_file() and not (sub / SUMS_FILE).is_file():
            continue  # a recipe's checkpoint whose sums a kill cut off
        found.append((int(m.group(1)), sub))
    return [p for _, p in sorted(found)]


def resolve_resume(value: str | None, output_dir: str | os.PathLike) -> str | None:
    """``--resume_from_checkpoint``: a checkpoint path; ``true``/``latest`` = the last complete checkpoint in
    ``output_dir`` (an error if there is none); ``auto`` = that checkpoint if any, else start fresh. A checkpoint
    a kill interrupted mid-write has no trainer state and is never picked."""
    if value is None or str(value).strip().lower() in ("", "false", "none", "no"):
        return None
    key = str(value).strip().lower()
    if key in RESUME_LATEST or key == RESUME_AUTO:
        done = complete_checkpoints(output_dir)
        if done:
            return str(done[-1])
        if key == RESUME_AUTO:
            return None
        raise ConfigError(f"--resume_from_checkpoint {value}: {output_dir} holds no complete checkpoint-N directory; "
                          "check --output_dir, or drop the flag to start afresh")
    path = Path(value)
    if not (path / TRAINER_STATE).is_file():
        raise ConfigError(f"--resume_from_checkpoint {value}: not a complete checkpoint (no {TRAINER_STATE}); pass a "
                          "checkpoint-N directory, or `latest`")
    return str(path)


def verify_checkpoint(checkpoint: str | None) -> None:
    """Every file of a recipe's checkpoint as it was written (:data:`~draftsmith.common.io.SUMS_FILE`), before it is
    resumed: a changed, truncated or missing file is one line naming it and the fix."""
    if checkpoint is None:
        return
    changed = changed_files(checkpoint)
    fix = "resume an earlier checkpoint (pass its path to --resume_from_checkpoint), or pass a new --output_dir"
    if changed is None:
        raise ConfigError(f"{checkpoint} records no checksums ({SUMS_FILE}), so its files cannot be checked (an older "
                          f"draftsmith wrote it, or its save was cut short): {fix}")
    if changed:
        raise ConfigError(f"{checkpoint}: {', '.join(changed)} changed since the checkpoint was written (corrupted, "
                          f"truncated or removed): {fix}")


def checkpoint_kept(output_dir: str | os.PathLike) -> str:
    """What a failed write leaves of a training run (for its one-line error): its last complete checkpoint."""
    done = complete_checkpoints(output_dir)
    if not done:
        return f"no complete checkpoint yet in {output_dir}: rerun the same command to start again"
    return f"the last complete checkpoint {done[-1]}: rerun with --resume_from_checkpoint latest to continue from it"


def final_eval_metrics(trainer) -> dict[str, float]:
    """The metrics of the evaluation the Trainer ran at the last step, or of a fresh one if it did not."""
    for entry in reversed(trainer.state.log_history):
        if "eval_loss" in entry:
            if entry.get("step") == trainer.state.global_step:
                return dict(entry)
            break
    return trainer.evaluate()


# -------------------------------------------------------------------------------------------------- artefact


def whole_run_loss(log_history: list[dict], global_step: int, run_loss: float | None, run_start: int = 0) -> float | None:
    """The training loss over every step of a run, resumes included (the Trainer's own ``training_loss`` covers the
    steps of its last ``train`` call only): each logged ``loss`` (the mean since the previous log) weighted by the
    steps it covers, plus the steps after the last log, whose sum ``run_loss`` (the Trainer's mean over the steps
    trained since ``run_start``, the resumed checkpoint's step) gives. ``run_loss`` when nothing was logged."""
    total = steps = in_run = 0.0
    last = 0
    for entry in log_history:
        if "loss" not in entry or "step" not in entry:
            continue
        step = int(entry["step"])
        span = step - (max(last, run_start) if step > run_start else last)
        if span <= 0:
            continue
        total, steps, last = total + entry["loss"] * span, steps + span, step
        in_run += entry["loss"] * span if step > run_start else 0.0
    tail = global_step - max(last, run_start)
    if run_loss is not None and tail > 0:
        total, steps = total + run_loss * (global_step - run_start) - in_run, steps + tail
    return total / steps if steps else run_loss


def manifest_metrics(final: dict[str, float], train_loss: float | None) -> dict[str, float]:
    """The model's metrics of the last evaluation (``eval_`` prefix dropped, ``eval_loss`` kept) and the
    training loss."""
    metrics = {}
    for key, value in final.items():
        name = key.removeprefix("eval_")
        if key.startswith("eval_") and name not in _RUN_METRICS:
            metrics["eval_loss" if name == "loss" else name] = value
    metrics["train_loss"] = train_loss
    return metrics


def artefact_weights(trainer, kind: str, tokenizer) -> dict[str, Any]:
    """What :func:`draftsmith.inference.artefacts.manifest.write_weights` needs for ``kind``, gathered from the trainer
    (collective under ZeRO-3: call on every process)."""
    state_dict = trainer.whole_state_dict()  # ZeRO-3, FSDP2: gathered on the main process only
    module = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    if state_dict is None:  # another process under ZeRO-3: it writes nothing
        return {}
    if kind in ("heads", "embeddings"):
        config = module.artefact_config() if isinstance(module, ArtefactConfig) else None
        extra = {}
        if isinstance(module, TunesTarget) and module.target_adapter is not None:  # it tuned the target too (Medusa-2)
            extra["target_adapter"] = module.target_adapter  # saved from the gathered weights (ZeRO-3's are partitioned)
            extra["target_adapter_state"] = {k.removeprefix("target."): v for k, v in state_dict.items()
                                             if k.startswith("target.")}
        if isinstance(module, ArtefactTensors):
            state_dict = module.artefact_tensors(state_dict)
        return {"tensors": state_dict, "config": config} | extra
    if kind == "none":
        return {}
    if kind == "adapted_target" and isinstance(module, AdaptsTarget):  # the model a training wrapper adapted
        if not trainer.sharded():
            return {"model": module.artefact_model(), "tokenizer": tokenizer}
        if hasattr(module.model, "get_base_model"):
            raise ConfigError(f"finetune=lora under {trainer.parallelism()}: the merged model cannot be built from "
                              f"sharded weights; train with ZeRO-2 or finetune=full (the checkpoints in "
                              f"{trainer.args.output_dir} are kept)")
        model_weights = {k.removeprefix("model."): v for k, v in state_dict.items() if k.startswith("model.")}
        return {"model": module.model, "state_dict": model_weights, "tokenizer": tokenizer}  # the gathered weights
    return {"model": module, "state_dict": state_dict, "tokenizer": tokenizer}


def save_artefact(trainer, spec: MethodSpec, out: Path, *, method_config, target_model, tokenizer, target_name: str,
                  training: dict, metrics: dict) -> dict | None:
    """Write the method's artefact (weights of its kind + manifest); only the main process writes."""
    from draftsmith.inference.artefacts.manifest import WEIGHT_PATHS, write_artefact

    weights = artefact_weights(trainer, spec.artefact_kind, tokenizer)
    manifest = None
    if trainer.is_world_process_zero():
        proposer = method_config.proposer_settings() if hasattr(method_config, "proposer_settings") else {}
        if spec.artefact_kind == "draft_model":
            proposer["model_dir"] = WEIGHT_PATHS["draft_model"]
        manifest = write_artefact(out, spec.artefact_kind, method=spec.name,
                                  target=target_identity(target_model, tokenizer, target_name), proposer=proposer,
                                  training=training, metrics=metrics, **weights)
    trainer.accelerator.wait_for_everyone()
    return manifest


# ---------------------------------------------------------------------------------------------------- the run


def build_trainer(spec: MethodSpec, models: dict, method_config, training_args, train, heldout, tokenizer,
                  checkpoint_records: dict | None = None):
    trainer_cls = spec.trainer
    collator = None
    if isinstance(trainer_cls, PreparesDatasets):  # e.g. EAGLE's offline features: the datasets it trains on
        train, heldout, collator = trainer_cls.prepare_datasets(models, method_config, train, heldout, tokenizer,
                                                                training_args)
    trainable = models.get("draft")
    if spec.trainable:
        import inspect

        build = spec.trainable
        takes = inspect.signature(build).parameters  # e.g. EAGLE-3's draft vocabulary: the data, the target's answers
        extra = {k: v for k, v in (("train_dataset", train), ("tokenizer", tokenizer)) if k in takes}
        trainable = build(models, method_config, **extra)
    return trainer_cls(model=trainable, teacher_model=models["target"], method_config=method_config,
                       args=training_args, train_dataset=train, eval_dataset=heldout, processing_class=tokenizer,
                       data_collator=collator, checkpoint_records=checkpoint_records)


def run_recipe(method: str, argv: list[str] | None = None, default_config: str | os.PathLike | None = None) -> RecipeResult:
    """Train ``method`` as configured by ``argv`` (default ``sys.argv[1:]``); see the module docstring."""
    import transformers

    spec = get_method(method)
    if not spec.trained:
        raise ConfigError(f"method {method!r} has nothing to train: evaluate it with `draftsmith eval --method {method}`")
    recipe, method_config, targs = parse_recipe_args(spec.config, argv, default_config or spec.default_config,
                                                     fixed=spec.config_defaults)
    transformers.set_seed(targs.seed)
    with targs.main_process_first(desc="building the zoo"):  # one process builds a missing zoo, the others wait
        paths = resolve_models(recipe, spec)
    created = first_missing(targs.output_dir)  # what this run creates, removed again if it fails leaving it empty
    output = claim(targs.output_dir, "--output_dir", "dir", lock=targs.process_index == 0,  # before models load
                   need_bytes=weights_bytes(paths.get("draft")), need="the artefact's copy of the draft")
    try:
        tokenizer = load_tokenizer(tokenizer_source(paths["target"], paths["tokenizer"]))
        models = load_models(paths, recipe, method_config)
        train, heldout, data_info = load_data(recipe, tokenizer, targs.seed)
        check_target_answers(recipe, method_config, models["target"], tokenizer, paths["target"], data_info)
        settings = training_settings(method, method_config, recipe, targs, data_info,
                                     {role: target_identity(model, tokenizer) for role, model in models.items()})
        resume = resolve_resume(targs.resume_from_checkpoint, targs.output_dir)
        verify_checkpoint(resume)
        check_max_steps(resume, targs.max_steps)
        changes = check_resume_settings(resume, settings, recipe.allow_changed_settings)
        with write_failures(targs.output_dir, lambda: checkpoint_kept(targs.output_dir)):  # full disk, read-only
            trainer = build_trainer(spec, models, method_config, targs, train, heldout, tokenizer,
                                    checkpoint_records={RUN_SETTINGS: settings_record(settings, changes)})
            result = trainer.train(resume_from_checkpoint=resume)
        train_loss = whole_run_loss(trainer.state.log_history, trainer.state.global_step, result.training_loss,
                                    run_start=checkpoint_step(resume) if resume else 0)
        metrics = manifest_metrics(final_eval_metrics(trainer), train_loss)
        training = {
            "config": {"recipe": asdict(recipe), method: asdict(method_config),
                       "training_args": {k: v for k, v in targs.to_dict().items() if "token" not in k}},
            "seed": targs.seed,
            "steps": trainer.state.global_step,
            "tokens": trainer.trained_tokens,
            "world_size": targs.world_size,
            "parallelism": trainer.parallelism(),  # zero3, fsdp2, ddp, none
            **trainer.manifest_training(),
            "data": data_info,
            "models": paths,
            "settings_changes": changes,  # accepted by --allow-changed-settings on resume: {step, changed: {key: [old, new]}}
        }
        artefact = Path(targs.output_dir) / "artefact"
        with write_failures(artefact, lambda: checkpoint_kept(targs.output_dir)):
            manifest = save_artefact(trainer, spec, artefact, method_config=method_config, target_model=models["target"],
                                     tokenizer=tokenizer, target_name=paths["target"], training=training, metrics=metrics)
        reports: dict[str, dict] = {}
        if trainer.is_world_process_zero():
            print(f"artefact: {artefact}  (load it with: draftsmith eval --artefact {artefact})")
            print("metrics: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float))))
            reports = after_training(artefact, spec, recipe, targs, models["target"], tokenizer, paths,
                                     sharded=trainer.sharded(),
                                     load_target=lambda: load_models({"target": paths["target"]}, recipe, method_config)["target"])
    except BaseException:
        if output is not None:  # a refusal after the claim leaves no empty output directory behind
            output.release()
            remove_empty(targs.output_dir, created)
        raise
    if output is not None:
        output.release()
    return RecipeResult(method, artefact, manifest, reports)


def recipe_main(method: str, argv: list[str] | None = None, default_config: str | os.PathLike | None = None) -> int:
    """:func:`run_recipe` with one-line errors (exit status 2) for the command line."""
    try:
        run_recipe(method, argv, default_config)
    except DraftsmithError as err:
        print(error_line(err), file=sys.stderr)
        return 2
    return 0
