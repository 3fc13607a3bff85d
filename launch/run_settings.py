"""The settings that shape a training run, recorded in every checkpoint and compared when the run resumes.

A recipe run writes :data:`RUN_SETTINGS` into each ``checkpoint-N`` (atomically, before the Trainer's state, which
marks the checkpoint complete). ``--resume_from_checkpoint`` then refuses a run whose settings differ from the
checkpoint's, with one line naming each changed setting (old -> new) and the fix; ``--allow-changed-settings``
accepts the change, and the run's record (hence its artefact's manifest) keeps which settings changed at which
step. :func:`training_settings` is the one place that says what is compared:

- ``method`` and every field of the method's config (``method.NAME``) but the cache locations of
  :data:`METHOD_FIELDS_NOT_COMPARED`;
- the recipe's data settings (:data:`DATA_SETTINGS`), the seed (it draws the training subset and its order) and the
  data's sha256 (its name, a path, may move);
- the identities of the target and the draft (:data:`IDENTITY_KEYS` of
  :func:`draftsmith.common.models.target_identity`; not their paths);
- the precision (``dtype``) and the global batch (per-device batch x gradient accumulation x processes);
- the optimizer and its schedule (:data:`OPTIMIZER_SETTINGS`: the learning rate, the scheduler and its warm-up, weight
  decay, AdamW's betas and epsilon, gradient clipping): the Trainer restores the checkpoint's scheduler, so a new
  learning rate would be silently ignored.

Nothing else is: the number of steps (a later ``max_steps`` extends the run; one below the checkpoint's step is
refused by :func:`check_max_steps`), logging, evaluation cadence, output paths, the evaluate/tune flags and
dataloader workers may change on resume.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ConfigError
from draftsmith.common.io import read_json

RUN_SETTINGS = "run_settings.json"
FORMAT = "draftsmith-run-settings/1"
DATA_SETTINGS = ("dataset_format", "max_length", "max_train_examples", "data_mix", "eval_examples")
IDENTITY_KEYS = ("config_sha256", "tokenizer_sha256", "vocab_size")
METHOD_FIELDS_NOT_COMPARED = ("feature_cache_dir", "feature_cache_budget_gb", "trajectory_dir")
ALLOW_FLAG = "--allow-changed-settings"
OPTIMIZER_SETTINGS = ("optim", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
                      "warmup_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm")
_HASH = re.compile(r"^[0-9a-f]{64}$")


def training_settings(method: str, method_config, recipe, training_args, data_info: dict,
                      identities: dict[str, dict]) -> dict[str, Any]:
    """The compared settings of a run (see the module docstring), flat and JSON-normalised: ``method``,
    ``method.<field>``, the data settings, ``seed``, ``data.sha256``, ``<role>.<identity key>``, ``dtype``,
    ``global_batch`` and :data:`OPTIMIZER_SETTINGS`."""
    config = asdict(method_config) if method_config is not None else {}
    settings: dict[str, Any] = {"method": method}
    settings |= {f"method.{k}": v for k, v in config.items() if k not in METHOD_FIELDS_NOT_COMPARED}
    settings |= {k: getattr(recipe, k) for k in DATA_SETTINGS}
    settings |= {"seed": training_args.seed, "data.sha256": data_info.get("sha256")}
    for role, identity in sorted(identities.items()):
        settings |= {f"{role}.{k}": identity.get(k) for k in IDENTITY_KEYS}
    settings["dtype"] = recipe.dtype
    settings |= {k: getattr(training_args, k, None) for k in OPTIMIZER_SETTINGS}
    settings["global_batch"] = (training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
                                * training_args.world_size)
    return json.loads(json.dumps(settings, default=str))


def settings_record(settings: dict[str, Any], changes: list[dict]) -> dict[str, Any]:
    """What :data:`RUN_SETTINGS` holds: the settings and the changes accepted so far (``{"step", "changed"}``)."""
    return {"format": FORMAT, "settings": settings, "changes": changes}


def changed_settings(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list]:
    """``{key: [old, new]}`` for every key whose value differs (a key one side lacks reads as None)."""
    keys = list(new) + [k for k in old if k not in new]
    return {k: [old.get(k), new.get(k)] for k in keys if old.get(k) != new.get(k)}


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """The global step of a checkpoint (its trainer state's, else its ``checkpoint-N`` name's)."""
    state = read_json(Path(checkpoint) / "trainer_state.json")
    if isinstance(state, dict) and isinstance(state.get("global_step"), int):
        return state["global_step"]
    match = re.search(r"(\d+)$", Path(checkpoint).name)
    return int(match.group(1)) if match else 0


def check_max_steps(checkpoint: str | os.PathLike | None, max_steps: int) -> None:
    """A resume whose ``max_steps`` lies below the checkpoint's step would write the checkpoint's later model as
    this run's: refused in one line."""
    if checkpoint is None or max_steps is None or max_steps <= 0:
        return
    step = checkpoint_step(checkpoint)
    if max_steps < step:
        raise ConfigError(f"max_steps={max_steps} is below the step of {checkpoint} ({step}), which would be written "
                          f"as this run's model: pass max_steps >= {step}, resume an earlier checkpoint, or a new "
                          "--output_dir")


def check_resume_settings(checkpoint: str | os.PathLike | None, settings: dict[str, Any],
                          allow_changed: bool) -> list[dict]:
    """The settings changes of the run so far: those the checkpoint's record lists, plus this resume's when
    ``allow_changed`` accepts one. Without ``allow_changed`` a changed setting, or a checkpoint that records none,
    is a one-line :class:`ConfigError` naming each change and the fix. ``[]`` when the run starts afresh."""
    if checkpoint is None:
        return []
    step = checkpoint_step(checkpoint)
    record = read_json(Path(checkpoint) / RUN_SETTINGS)
    if not (isinstance(record, dict) and record.get("format") == FORMAT and isinstance(record.get("settings"), dict)):
        if not allow_changed:
            raise ConfigError(f"{checkpoint} records no readable training settings ({RUN_SETTINGS}), so resuming it "
                              f"cannot check them: pass {ALLOW_FLAG} to resume with the current settings, or a new "
                              "--output_dir to start afresh")
        return [{"step": step, "changed": {}, "unrecorded": True}]
    changed = changed_settings(record["settings"], settings)
    history = list(record.get("changes") or [])
    if changed and not allow_changed:
        listed = ", ".join(f"{k} {_show(old)} -> {_show(new)}" for k, (old, new) in changed.items())
        same = f"dtype={changed['dtype'][0]}" if "dtype" in changed else "the same settings"  # auto may resolve anew
        raise ConfigError(f"{checkpoint} was trained with other settings ({listed}): resume with {same}, "
                          f"pass {ALLOW_FLAG} to continue with the new ones, or a new --output_dir to start afresh")
    return history + ([{"step": step, "changed": changed}] if changed else [])


def _show(value: Any) -> str:
    """A setting's value in a message: sha256 digests cut to 12 digits."""
    if isinstance(value, str) and _HASH.match(value):
        return repr(value[:12] + "...")
    return repr(value)
