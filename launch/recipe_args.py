"""Recipe settings: the runner's own arguments, the method's config and ``transformers.TrainingArguments``.

Configuration comes from ``--config FILE.yaml``, then from the command line in ``--key value`` or ``key=value``
form; the command line wins. The three groups are parsed apart:

- ``RecipeArguments`` and ``TrainingArguments`` share one namespace (their field names never collide);
- the method's config (``DistillSpecConfig``, ...) has its own. A method field is given flat (``divergence=tvd``)
  or prefixed (``method.divergence=tvd``); a method field whose name is also a recipe or trainer flag (say a
  method's own ``learning_rate``) can only be given prefixed, so method fields never shadow trainer flags. In
  YAML the same holds: flat keys, plus an optional ``method:`` mapping.

Every key must name a field, so a typo is an error, not a silently ignored setting. On a machine without a
GPU ``use_cpu`` defaults to true.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.precision import (
    DTYPE_NAMES,
    MIXED_PRECISION,
    allow_tf32_for_training,
    mixed_precision_flag,
    resolve_dtype,
)
from draftsmith.launch.typed_settings import check_values, one_line, settings_parser
from draftsmith.launch.zoo_cli import FAMILIES

METHOD_PREFIX = "method."
TRAINABLE_ZOOS = ("tiny", "small", *(f"tiny-{f}" for f in FAMILIES if f != "llama"))  # zoos a recipe trains on


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class RecipeArguments:
    """Models, data and the post-training evaluation of a recipe run."""

    config: str | None = field(default=None, metadata=_help("YAML file of settings (flat mapping: field -> value); "
                                                            "command-line flags override it."))
    target: str | None = field(default=None, metadata=_help("Target model: a Hugging Face model directory, a .gguf "
                                                            "file, a hub id, or smollm2-135m (imported on first use; "
                                                            "the draft then defaults to the smollm2 zoo's). Default: "
                                                            "the built-in zoo's target."))
    draft: str | None = field(default=None, metadata=_help("Draft model to start from (directory or hub id), for "
                                                           "methods that train a separate draft. Default: the zoo's "
                                                           "draft."))
    tokenizer: str | None = field(default=None, metadata=_help("Tokenizer (default: the target's, or the zoo's)."))
    zoo_size: str = field(default="tiny", metadata=_help("Built-in zoo used when --target is not given: tiny or small, or "
                                                         "tiny-<family> (qwen2, qwen3, gemma3, olmo2, mistral)."))
    dtype: str = field(default="auto", metadata=_help("Precision (draftsmith.common.precision): auto = bfloat16 where "
                                                      "it is native (CUDA, CPUs with AVX512-BF16 or AMX), else float32; a 16-bit dtype holds the frozen "
                                                      "target in it and trains float32 master weights under autocast; "
                                                      "float32, bfloat16 or float16 to choose."))
    dataset: str | None = field(default=None, metadata=_help("Training data: a local .json/.jsonl/.parquet file "
                                                             "(alpaca, sharegpt, messages or text rows). Default: the "
                                                             "corpus draftsmith ships."))
    dataset_format: str = field(default="auto", metadata=_help("Row format of --dataset: auto, alpaca, sharegpt, "
                                                               "messages or text."))
    max_length: int = field(default=512, metadata=_help("Tokens per training example (longer ones are cut)."))
    max_bad_fraction: float = field(default=0.05, metadata=_help("Fraction of unusable dataset rows tolerated."))
    max_train_examples: int | None = field(default=None, metadata=_help("Train on a seeded random subset of this "
                                                                        "many examples (default: all)."))
    data_mix: str = field(default="proportional", metadata=_help("How --max_train_examples draws from the shipped "
                                                                  "corpus: proportional (a plain random subset) or "
                                                                  "balanced (an equal share from every source)."))
    eval_examples: int = field(default=64, metadata=_help("Held-out examples for the loss / acceptance estimate at "
                                                          "each evaluation (the corpus' held-out split, or rows "
                                                          "split off --dataset)."))
    tune: bool = field(default=False, metadata=_help("After training a draft-model artefact, choose its draft length "
                                                     "and confidence stop on held-out calibration prompts "
                                                     "(`draftsmith tune`) and record them in the manifest."))
    tune_prompts: int = field(default=40, metadata=_help("With --tune or --calibrate_tree, calibration prompts (the "
                                                         "corpus' held-out split)."))
    calibrate_tree: bool = field(default=True, metadata=_help("After training a Medusa, EAGLE or DFlash artefact, measure its "
                                                              "per-depth acceptance on held-out calibration prompts "
                                                              "and store it for its tree (`draftsmith tune`)."))
    evaluate: bool = field(default=False, metadata=_help("After training, run the evaluator (greedy, bundled dev "
                                                         "prompts) on the artefact and print its summary."))
    eval_baseline: bool = field(default=True, metadata=_help("With --evaluate, also evaluate the method as it was "
                                                             "before training (where it has a before), for the tau "
                                                             "ratio."))
    eval_limit: int | None = field(default=None, metadata=_help("With --evaluate, how many dev questions to use "
                                                                "(default: all)."))
    eval_max_new_tokens: int = field(default=128, metadata=_help("With --evaluate, tokens generated per answer."))
    allow_changed_settings: bool = field(default=False, metadata=_help("With --resume_from_checkpoint, continue even "
                                                                       "though settings that shape training changed "
                                                                       "since the checkpoint (the manifest records "
                                                                       "which, at which step); refused otherwise."))

    def __post_init__(self) -> None:
        if self.zoo_size not in TRAINABLE_ZOOS:
            raise ConfigError(f"zoo_size={self.zoo_size!r} is unknown: choose tiny or small, or tiny-<family> "
                              f"({', '.join(f for f in FAMILIES if f != 'llama')})")
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"dtype={self.dtype!r} is unknown: choose {', '.join(DTYPE_NAMES)}")
        if self.max_length < 2:
            raise ConfigError(f"max_length={self.max_length} must be at least 2")
        if self.data_mix not in ("proportional", "balanced"):
            raise ConfigError(f"data_mix={self.data_mix!r} is unknown: choose proportional or balanced")
        if self.eval_examples < 1:
            raise ConfigError(f"eval_examples={self.eval_examples} must be at least 1")
        if self.max_train_examples is not None and self.max_train_examples < 1:
            raise ConfigError(f"max_train_examples={self.max_train_examples} must be at least 1 (or unset)")
        if self.draft is not None and self.target is None:
            raise ConfigError("--draft was given without --target: pass the target the draft should be distilled into")


def _normalise_overrides(argv: Sequence[str]) -> list[str]:
    """``key=value`` tokens (not starting with ``-``) become ``--key=value``: one token, so that a value starting with
    ``-`` (``layers=-50,1``) is read as the value, not as a flag."""
    out: list[str] = []
    for token in argv:
        if not token.startswith("-") and "=" in token and re.match(r"^[A-Za-z_][\w.]*=", token):
            out.append(f"--{token}")
        else:
            out.append(token)
    return out


class DuplicateKey(Exception):
    def __init__(self, key: str, first: int, second: int) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def _unique_keys_loader():
    """yaml's safe loader, refusing a mapping that sets a key twice (plain YAML keeps the last silently)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise DuplicateKey(str(key), seen[key], line)
                seen[key] = line
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


RECIPE_CONFIGS = Path(__file__).resolve().parent / "configs" / "recipes"  # shipped with draftsmith, found by name


def shipped_configs() -> list[str]:
    """The names of the configs draftsmith ships (``medusa_tiny``, ``eagle3_smollm2``, ...)."""
    return sorted(p.stem for p in RECIPE_CONFIGS.glob("*.yaml"))


def config_path(value: str | os.PathLike) -> Path:
    """A ``--config`` value as a file: a YAML path as given, or the name of a shipped config (``medusa_tiny``)."""
    path = Path(value).expanduser()
    if path.is_file() or path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        return path
    named = RECIPE_CONFIGS / f"{value}.yaml"
    if not named.is_file():
        raise ConfigError(f"--config {value}: no such file, and draftsmith ships no config of that name: pass a YAML "
                          f"file or one of {', '.join(shipped_configs())}")
    return named


def read_yaml_config(path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist: pass --config with a YAML file or the name of a "
                          f"shipped config ({', '.join(shipped_configs())})")
    try:
        values = yaml.load(path.read_bytes().decode("utf-8"), Loader=_unique_keys_loader()) or {}
    except DuplicateKey as err:
        raise ConfigError(f"config file {path} sets {err.key!r} twice (lines {err.first} and {err.second}): keep "
                          "one") from None
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read ({err.strerror}): check its permissions") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text: pass a YAML file") from None
    except yaml.YAMLError as err:
        first = " ".join(str(err).split())[:200]
        raise ConfigError(f"config file {path} is not valid YAML ({first}): fix its syntax") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must be a mapping of field names to values, not {type(values).__name__}")
    return values


def split_argv(argv: Sequence[str], method_fields: set[str], shared: set[str]) -> tuple[list[str], list[str]]:
    """``(recipe and trainer argv, method argv)``. A flag owns the tokens after it up to the next ``--`` flag;
    ``--method.KEY`` always goes to the method, ``--KEY`` to the method when KEY is a method field that is not
    also a recipe or trainer flag."""
    main: list[str] = []
    method: list[str] = []
    target = main
    for token in argv:
        if token.startswith("--"):
            key = token[2:].split("=", 1)[0]
            if key.startswith(METHOD_PREFIX):
                target, token = method, "--" + token[2 + len(METHOD_PREFIX):]
            else:
                target = method if key in method_fields and key not in shared else main
        target.append(token)
    return main, method


def split_yaml(values: dict[str, Any], method_fields: set[str], main_fields: set[str],
               source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(recipe and trainer values, method values)`` of a YAML config (see the module docstring)."""
    nested = values.pop("method", None) or {}
    if not isinstance(nested, dict):
        raise ConfigError(f"{source}: 'method' must be a mapping of the method's settings")
    odd = [k for k in [*values, *nested] if not isinstance(k, str)]
    if odd:
        raise ConfigError(f"{source}: setting names are text, not {odd[0]!r}: check the file's keys against `--help`")
    main = {k: v for k, v in values.items() if k in main_fields}
    method = {k: v for k, v in values.items() if k in method_fields and k not in main_fields}
    unknown = sorted(set(values) - set(main) - set(method)) + sorted(set(nested) - method_fields)
    if unknown:
        shown = ", ".join(k if k.isprintable() else repr(k) for k in unknown)
        raise ConfigError(f"{source}: unknown setting(s) {shown}: check the spelling against `--help`")
    return main, {**method, **nested}


def _parse(parser, argv: list[str], defaults: dict[str, Any]) -> tuple:
    parser.set_defaults(**defaults)
    try:
        return parser.parse_args_into_dataclasses(args=argv)
    except DraftsmithError:
        raise
    except ValueError as err:  # unknown flags, or TrainingArguments' own validation
        message = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if message.startswith("Some specified arguments are not used"):
            message = f"unknown argument(s) {message.split(':', 1)[1].strip()}: check the spelling against `--help`"
        raise ConfigError(message) from None
    except Exception as err:  # a dataclass tripping over a value of the right type (say a JSON list for a config)
        message = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(f"the settings were refused ({type(err).__name__}: {message}): check them against "
                          "`--help`") from None


POSITIVE_TRAINER_FIELDS = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")


def check_training_args(training) -> None:
    """One-line errors for trainer settings ``TrainingArguments`` lets through: batch sizes and accumulation steps
    below 1."""
    for name in POSITIVE_TRAINER_FIELDS:
        value = getattr(training, name)
        if value < 1:
            raise ConfigError(f"{name}={value} must be at least 1")


def _config_flag(argv: list[str]) -> str | None:
    """The ``--config`` value of ``argv`` (one-line errors, no usage dump)."""
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    pre.add_argument("--config", default=None)
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError as err:
        raise ConfigError(one_line(f"argument {err.argument_name}: {err.message}")) from None
    return known.config


def parse_recipe_args(method_config: type | None, argv: Sequence[str] | None = None,
                      default_config: str | os.PathLike | None = None, fixed: dict[str, Any] | None = None) -> tuple:
    """``(RecipeArguments, method config or None, TrainingArguments)`` from ``--config`` YAML or a shipped config's
    name (default ``default_config``) and the command line (see the module docstring). ``fixed``: method settings the
    method's spec fixes (P-EAGLE's ``variant``); a config or flag that sets one otherwise is refused."""
    import transformers

    argv = _normalise_overrides(sys.argv[1:] if argv is None else argv)
    given = _config_flag(argv) or default_config
    config_file = str(config_path(given)) if given else None
    main_classes = [RecipeArguments, transformers.TrainingArguments]
    main_parser = settings_parser(main_classes)
    main_fields = {a.dest for a in main_parser._actions}
    method_fields = {f.name for f in dataclasses.fields(method_config)} if method_config else set()
    if {"-h", "--help"} & set(argv):
        main_parser.print_help()
        if method_config:
            print(f"\n{method_config.__name__} (flat, or prefixed with `{METHOD_PREFIX}`):")
            settings_parser([method_config]).print_help()
        raise SystemExit(0)
    main_defaults: dict[str, Any] = {}
    method_defaults: dict[str, Any] = {}
    if not _has_accelerator():  # no GPU: run on the CPU under every launcher (DeepSpeed's CPU path needs it)
        main_defaults["use_cpu"] = True
    if config_file:
        main_values, method_defaults = split_yaml(read_yaml_config(config_file), method_fields, main_fields,
                                                  config_file)
        main_defaults.update(check_values(main_values, main_classes, config_file), config=config_file)
        method_defaults = check_values(method_defaults, [method_config], config_file) if method_config else {}
    for key, value in (fixed or {}).items():
        if method_defaults.get(key, value) != value:
            raise ConfigError(f"{config_file} sets {key}: {method_defaults[key]}, which this method fixes to {value}: "
                              f"drop it from the config, or train the method it names")
    method_defaults = {**method_defaults, **(fixed or {})}
    main_argv, method_argv = split_argv(argv, method_fields, main_fields)
    recipe, training = _parse(main_parser, main_argv, main_defaults)
    recipe, training = apply_precision(recipe, training, lambda defaults: _parse(main_parser, main_argv, defaults),
                                       main_defaults)
    check_training_args(training)
    training.output_dir = os.path.expanduser(training.output_dir) if training.output_dir else training.output_dir
    method = _parse(settings_parser([method_config]), method_argv, method_defaults)[0] if method_config else None
    clash = {k: getattr(method, k) for k, v in (fixed or {}).items() if method is not None and getattr(method, k) != v}
    if clash:
        raise ConfigError(f"{', '.join(f'{k}={v}' for k, v in clash.items())}: this method fixes "
                          f"{', '.join(f'{k}={fixed[k]}' for k in clash)}; drop the setting")
    join_process_group(training)
    return recipe, method, training


def apply_precision(recipe, training, reparse, main_defaults: dict) -> tuple:
    """The recipe's ``dtype`` resolved for the training device (``auto``: bfloat16 where native, else float32) and,
    for a 16-bit dtype, accelerate's mixed precision switched on (float32 master weights, autocast), unless the
    settings already chose it; a clash between the two is an error."""
    device = "cpu" if training.use_cpu or not _has_accelerator() else "cuda"
    dtype = resolve_dtype(recipe.dtype, device)
    flag = mixed_precision_flag(dtype)
    chosen = [name for name in MIXED_PRECISION.values() if getattr(training, name)]
    if chosen and chosen != [flag]:
        raise ConfigError(f"dtype={dtype} with {chosen[0]}=true: 16-bit training runs under the mixed precision of "
                          f"its dtype; drop {chosen[0]} or set dtype to match it")
    if flag is not None and not chosen:
        recipe, training = reparse({**main_defaults, flag: True})
    if device == "cuda":
        allow_tf32_for_training()
    return dataclasses.replace(recipe, dtype=dtype), training


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
