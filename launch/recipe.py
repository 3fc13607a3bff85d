"""What every recipe shares: config parsing, the default model pair and data, resuming, and the artefact.

A recipe (``recipes/<method>.py``) is a thin script::

    recipe_args, method_config, training_args = parse_recipe_args((RecipeArguments, MethodConfig, TrainingArguments))
    tokenizer, target, draft, names = load_pair(recipe_args)
    train, heldout, data_info = load_data(recipe_args, tokenizer, training_args.seed)
    ...

Configuration comes from ``--config FILE.yaml`` (a flat mapping of field names to values), then from the
command line, in either ``--key value`` or ``key=value`` form; the command line wins. On a machine without a GPU
``use_cpu`` defaults to true. Every key must name a
field of one of the dataclasses (``RecipeArguments``, the method's config, ``transformers.TrainingArguments``),
so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ConfigError, DraftsmithError

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"  # the Trainer writes it last: a checkpoint without it is incomplete
RESUME_LATEST = ("true", "latest", "last")
RESUME_AUTO = "auto"


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class RecipeArguments:
    """Models, data and the post-training evaluation of a recipe run."""

    config: str | None = field(default=None, metadata=_help("YAML file of settings (flat mapping: field -> value); "
                                                            "command-line flags override it."))
    target: str | None = field(default=None, metadata=_help("Target model: a Hugging Face model directory or hub id. "
                                                            "Default: the built-in zoo's target."))
    draft: str | None = field(default=None, metadata=_help("Draft model to start from (directory or hub id). "
                                                           "Default: the zoo's draft."))
    tokenizer: str | None = field(default=None, metadata=_help("Tokenizer (default: the target's, or the zoo's)."))
    zoo_size: str = field(default="tiny", metadata=_help("Built-in zoo used when --target is not given: tiny or small."))
    dtype: str = field(default="float32", metadata=_help("Weights dtype of both models: float32, bfloat16 or float16."))
    dataset: str | None = field(default=None, metadata=_help("Training data: a local .json/.jsonl/.parquet file "
                                                             "(alpaca, sharegpt, messages or text rows). Default: the "
                                                             "corpus draftsmith ships."))
    dataset_format: str = field(default="auto", metadata=_help("Row format of --dataset: auto, alpaca, sharegpt, "
                                                               "messages or text."))
    max_length: int = field(default=512, metadata=_help("Tokens per training example (longer ones are cut)."))
    max_bad_fraction: float = field(default=0.05, metadata=_help("Fraction of unusable dataset rows tolerated."))
    max_train_examples: int | None = field(default=None, metadata=_help("Train on a seeded random subset of this "
                                                                        "many examples (default: all)."))
    eval_examples: int = field(default=64, metadata=_help("Held-out examples for the loss / acceptance estimate at "
                                                          "each evaluation (the corpus' held-out split, or rows "
                                                          "split off --dataset)."))
    evaluate: bool = field(default=False, metadata=_help("After training, run the evaluator (greedy, bundled dev "
                                                         "prompts) on the artefact and print its summary."))
    eval_baseline: bool = field(default=True, metadata=_help("With --evaluate, also evaluate the draft as it was "
                                                             "before training, for the tau ratio."))
    eval_limit: int | None = field(default=None, metadata=_help("With --evaluate, how many dev questions to use "
                                                                "(default: all)."))
    eval_max_new_tokens: int = field(default=128, metadata=_help("With --evaluate, tokens generated per answer."))

    def __post_init__(self) -> None:
        if self.zoo_size not in ("tiny", "small"):
            raise ConfigError(f"zoo_size={self.zoo_size!r} is unknown: choose tiny or small")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype={self.dtype!r} is unknown: choose float32, bfloat16 or float16")
        if self.max_length < 2:
            raise ConfigError(f"max_length={self.max_length} must be at least 2")
        if self.eval_examples < 1:
            raise ConfigError(f"eval_examples={self.eval_examples} must be at least 1")
        if self.max_train_examples is not None and self.max_train_examples < 1:
            raise ConfigError(f"max_train_examples={self.max_train_examples} must be at least 1 (or unset)")
        if self.draft is not None and self.target is None:
            raise ConfigError("--draft was given without --target: pass the target the draft should be distilled into")


# ------------------------------------------------------------------------------------------------------ parsing


def _normalise_overrides(argv: Sequence[str]) -> list[str]:
    """``key=value`` tokens (not starting with ``-``) become ``--key value``."""
    out: list[str] = []
    for token in argv:
        if not token.startswith("-") and "=" in token and re.match(r"^[A-Za-z_][\w.]*=", token):
            key, value = token.split("=", 1)
            out += [f"--{key}", value]
        else:
            out.append(token)
    return out


def read_yaml_config(path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist: pass --config with a YAML file (see recipes/configs/)")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML ({str(err).splitlines()[0]}): fix its syntax") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must be a mapping of field names to values, not {type(values).__name__}")
    return values


def parse_recipe_args(dataclass_types: Sequence[type], argv: Sequence[str] | None = None,
                      default_config: str | os.PathLike | None = None) -> tuple:
    """Instances of ``dataclass_types`` from ``--config`` YAML (default ``default_config``) and the command
    line. The first type must be :class:`RecipeArguments` (or a subclass), whose ``config`` records the file."""
    import transformers

    argv = _normalise_overrides(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)
    config_path = known.config or (str(default_config) if default_config else None)
    parser = transformers.HfArgumentParser(list(dataclass_types))
    if not _has_accelerator():  # no GPU: run on the CPU under every launcher (DeepSpeed's CPU path needs it)
        parser.set_defaults(**{a.dest: True for a in parser._actions if a.dest == "use_cpu"})
    if config_path:
        values = read_yaml_config(config_path)
        dests = {a.dest for a in parser._actions}
        unknown = sorted(set(values) - dests)
        if unknown:
            raise ConfigError(f"{config_path}: unknown setting(s) {', '.join(unknown)}: check the spelling against "
                              "`--help`")
        parser.set_defaults(**values, config=config_path)
    try:
        parsed = parser.parse_args_into_dataclasses(args=argv)
    except DraftsmithError:
        raise
    except ValueError as err:  # unknown flags, or TrainingArguments' own validation
        message = str(err).strip().splitlines()[0]
        if message.startswith("Some specified arguments are not used"):
            message = f"unknown argument(s) {message.split(':', 1)[1].strip()}: check the spelling against `--help`"
        raise ConfigError(message) from None
    for obj in parsed:
        if isinstance(obj, transformers.TrainingArguments):
            join_process_group(obj)
    return tuple(parsed)


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def join_process_group(training_args) -> None:
    """Set up the process group now, before any model loads: under ZeRO-3 ``from_pretrained`` shards the weights
    as it loads them and needs the world size. On the CPU the Trainer starts a plain gloo group (DeepSpeed's
    own setup is skipped for ``use_cpu``), so DeepSpeed's communication layer is pointed at that group."""
    import torch

    _ = training_args.device
    if training_args.deepspeed and torch.distributed.is_available() and torch.distributed.is_initialized():
        import deepspeed

        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())


# -------------------------------------------------------------------------------------------- models and data


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_pair(args: RecipeArguments) -> dict[str, str]:
    """Paths (or hub ids) of the tokenizer, target and draft; the zoo's when no target is given."""
    if args.target is None:
        from draftsmith.data.zoo import ensure_zoo

        home = ensure_zoo(args.zoo_size)
        return {"tokenizer": str(home / "tokenizer"), "target": str(home / "target"), "draft": str(home / "draft")}
    if args.draft is None:
        raise ConfigError("--target was given without --draft: pass the draft model to distil into it")
    return {"tokenizer": args.tokenizer or args.target, "target": args.target, "draft": args.draft}


def load_tokenizer(name_or_path: str):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str, dtype: str = "float32"):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype(dtype))


def _subset(items: list, n: int | None, seed: int) -> list:
    if n is None or n >= len(items):
        return items
    return random.Random(seed).sample(items, n)


def load_data(args: RecipeArguments, tokenizer, seed: int = 0):
    """``(train, heldout, info)``: tokenized datasets (input_ids, labels, attention_mask) and, for the
    manifest, the data's name, sha256, example counts and load summary."""
    from draftsmith.data.datasets import examples_to_dataset, load_chat_dataset

    if args.dataset is None:
        from draftsmith.data.corpus import corpus_sha256, load_corpus

        train_rows = _subset(load_corpus("train"), args.max_train_examples, seed)
        heldout_rows = _subset(load_corpus("heldout"), args.eval_examples, seed)
        train, report = examples_to_dataset(train_rows, tokenizer, args.max_length, args.max_bad_fraction,
                                            source="draftsmith corpus (train)")
        heldout, _ = examples_to_dataset(heldout_rows, tokenizer, args.max_length, args.max_bad_fraction,
                                         source="draftsmith corpus (heldout)")
        info = {"name": "draftsmith-corpus", "sha256": corpus_sha256()}
    else:
        from draftsmith.inference.artefact import sha256_file

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


def final_eval_metrics(trainer) -> dict[str, float]:
    """The metrics of the evaluation the Trainer ran at the last step, or of a fresh one if it did not."""
    for entry in reversed(trainer.state.log_history):
        if "eval_loss" in entry:
            if entry.get("step") == trainer.state.global_step:
                return dict(entry)
            break
    return trainer.evaluate()


# -------------------------------------------------------------------------------------------------- artefact


def save_draft_artefact(trainer, artefact_dir: str | os.PathLike, *, method: str, target_model, tokenizer,
                        target_name: str, proposer: dict, training: dict, metrics: dict) -> Path | None:
    """Write ``<artefact_dir>/draft`` (the trained draft, safetensors, plus the tokenizer) and the manifest.

    Call it on every process (gathering ZeRO-3 weights is collective); only the main process writes. The draft
    directory is written beside the final one and swapped in, so a reader never sees half a model."""
    import shutil

    from draftsmith.inference.artefact import target_identity, write_manifest

    state_dict = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    if not trainer.is_world_process_zero():
        trainer.accelerator.wait_for_everyone()
        return None
    out = Path(artefact_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging, final = out / ".draft.tmp", out / proposer.get("model_dir", "draft")
    shutil.rmtree(staging, ignore_errors=True)
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    model.save_pretrained(staging, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    (out / "manifest.json").unlink(missing_ok=True)  # the old manifest would not match the new weights
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    write_manifest(out, method, target_identity(target_model, tokenizer, target_name), proposer, training, metrics)
    trainer.accelerator.wait_for_everyone()
    return out


# ------------------------------------------------------------------------------------------------ evaluation


def evaluate_proposer(target_model, tokenizer, method: str, proposer, args: RecipeArguments, out_dir: str | os.PathLike,
                      target_name: str | None = None, draft_name: str | None = None) -> dict:
    """Run the evaluator (greedy, the bundled dev prompts, ``args.eval_limit`` of them) and write its report
    (report.json, report.md, plots) under ``out_dir``."""
    from draftsmith.inference.evaluator import evaluate
    from draftsmith.inference.questions import read_questions
    from draftsmith.inference.report import write_report

    questions = read_questions(None, limit=args.eval_limit)
    report = evaluate(target_model.eval(), tokenizer, method, lambda: proposer, questions,
                      max_new_tokens=args.eval_max_new_tokens, target_name=target_name, draft_name=draft_name,
                      command=" ".join(sys.argv))
    write_report(report, out_dir)
    return report


def evaluate_draft_artefact(artefact_dir: str | os.PathLike, target_model, tokenizer, args: RecipeArguments,
                            out_dir: str | os.PathLike, baseline_draft=None, draft_length: int = 4,
                            target_name: str | None = None) -> dict[str, dict]:
    """Evaluate the artefact (loaded exactly as ``draftsmith eval --artefact`` loads it) and, if given, the
    draft before training; print the summary and the tau ratio. Returns the reports by name."""
    from draftsmith.inference.artefact import load_artefact
    from draftsmith.inference.report import summary_table

    proposer, manifest = load_artefact(artefact_dir, target_model, tokenizer)
    reports = {"trained": evaluate_proposer(target_model, tokenizer, manifest["method"], proposer, args,
                                            Path(out_dir) / "trained", target_name, str(artefact_dir))}
    if baseline_draft is not None:
        from draftsmith.inference.draft_length import DraftLengthPolicy
        from draftsmith.inference.proposers.draft_model import DraftModelProposer

        baseline = DraftModelProposer(baseline_draft.to(target_model.device, target_model.dtype).eval(),
                                      DraftLengthPolicy(length=draft_length),
                                      confidence_threshold=getattr(proposer, "confidence_threshold", 0.0))
        reports["baseline"] = evaluate_proposer(target_model, tokenizer, "draft", baseline, args,
                                                Path(out_dir) / "baseline", target_name, "draft before training")
    print(summary_table(reports["trained"]))
    if "baseline" in reports:
        before, after = reports["baseline"]["summary"]["tau"], reports["trained"]["summary"]["tau"]
        print(f"tau: draft before training {before:.3f} -> after {after:.3f} ({after / before:.3f}x)")
    print(f"reports: {Path(out_dir).resolve()}")
    return reports
