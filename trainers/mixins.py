"""What several methods share beside the trainer (:mod:`draftsmith.trainers.base`): config mixins, each a group of
settings with its check, and the helpers that act on them.

- :class:`AnswerTokens` how much the target writes per prompt, and :class:`TargetAnswers` whether a method trains on
  those answers or on the dataset's (Medusa, EAGLE, BiTA, LayerSkip; CLLM and DistillSpec take the lengths only);
- :class:`FeatureCache` where the frozen target's hidden states come from (EAGLE, DistillSpec), and
  :func:`offline_feature_datasets`, the cache of :mod:`draftsmith.data.feature_cache` as the training set;
- :class:`TunableCopy` how a method tunes its copy of the target (LayerSkip, CLLM): :func:`tunable_copy` builds it
  (full or LoRA) and :func:`merged_model` gives the adapted-target artefact;
- :class:`SeededBatches` (a trainer mixin) the random draws a method makes per training micro-batch (DFlash's
  anchors, BiTA's insertion points) from :func:`micro_batch_generator`, so a resumed run repeats them exactly.

A method config is a dataclass deriving from the mixins it needs; its ``__post_init__`` calls their checks. A
config is written to the artefact manifest with :func:`dataclasses.asdict`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.common.sharding import whole_copy

ANSWER_MODES = ("target", "fixed")
FEATURE_MODES = ("online", "offline")
FINETUNE_MODES = ("full", "lora")


def help_text(text: str) -> dict:
    """Dataclass field metadata for a method config: the ``--flag`` help the recipe parser shows."""
    return {"help": text}


def check_choice(name: str, value, choices: Sequence) -> None:
    """Raise the one-line :class:`ConfigError` ``name=value is unknown: choose one of ...`` unless ``value`` is
    one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is unknown: choose one of {', '.join(map(str, choices))}")


# ------------------------------------------------------------------------------------------------ answers


@dataclass
class AnswerTokens:
    """How much the target (or the draft, on-policy) writes per prompt where a method generates its data."""

    max_new_tokens: int = field(default=64, metadata=help_text("Tokens generated per prompt where the data are "
                                                               "generated (the target's answers, on-policy drafts)."))
    prompt_tokens: int = field(default=32, metadata=help_text("For plain-text rows, how many leading tokens form "
                                                              "the prompt a generation continues."))

    def check_answer_tokens(self) -> None:
        if int(self.max_new_tokens) < 1 or int(self.prompt_tokens) < 1:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens} and prompt_tokens={self.prompt_tokens} must "
                              "be >= 1")


@dataclass
class TargetAnswers(AnswerTokens):
    """Where a method trains its answers from: the target's own, or the dataset's."""

    data_mode: str = field(default="target", metadata=help_text("target = train on the target's greedy answers to "
                                                                "the dataset prompts (self-distillation); fixed = the "
                                                                "dataset responses as they are."))

    def check_answers(self) -> None:
        check_choice("data_mode", self.data_mode, ANSWER_MODES)
        self.check_answer_tokens()


# ----------------------------------------------------------------------------------------------- features


@dataclass
class FeatureCache:
    """Where a method reads the frozen target's hidden states from."""

    features: str = field(default="online", metadata=help_text("online = the frozen target runs in every step; "
                                                               "offline = its hidden states are computed once, into "
                                                               "a cache on disk (draftsmith.data.feature_cache), "
                                                               "reused across epochs and runs."))
    feature_cache_dir: str = field(default="", metadata=help_text("Offline features: the cache root (default "
                                                                  "$DRAFTSMITH_HOME/features)."))
    feature_cache_budget_gb: float = field(default=50.0, metadata=help_text("Offline features: refuse to build a "
                                                                            "cache larger than this."))
    feature_cache_dtype: str = field(default="bfloat16", metadata=help_text("Offline features: bfloat16, float16 "
                                                                            "(refused where a hidden state passes "
                                                                            "65,504) or float32."))

    feature_order: str = field(default="shard", metadata=help_text("Offline features: the training order. shard = "
                                                                   "the shards shuffled and the rows of each "
                                                                   "shuffled, each shard read once per epoch; length "
                                                                   "= the same, each shard's batches of rows of "
                                                                   "similar length (less padding, but less accepted: "
                                                                   "docs/BENCHMARKS.md); random = the "
                                                                   "Trainer's uniform order (the online run's; reads "
                                                                   "a shard for almost every row)."))

    def check_features(self) -> None:
        check_choice("features", self.features, FEATURE_MODES)
        check_choice("feature_order", self.feature_order, ("shard", "length", "random"))


def is_placed(model) -> bool:
    """True when the model was loaded onto devices already (device_map / bitsandbytes) and must not be moved."""
    return bool(getattr(model, "hf_device_map", None)) or getattr(model, "is_quantized", False)


def on_training_device(target, device):
    """The frozen ``target`` on the training ``device`` (where the trainer puts it), unless it was loaded onto devices
    already: what it computes before training (the feature cache, its answers) runs there, not on the CPU."""
    return target if is_placed(target) else target.to(device)


def offline_feature_datasets(config: FeatureCache, target, tokenizer, datasets, layers, training_args,
                             answer: dict | None = None) -> list:
    """``datasets`` as :class:`~draftsmith.data.feature_cache.FeatureDataset` of the target's ``layers`` under the
    configured cache root (default :func:`draftsmith.common.paths.features_dir`), computed by the target on the
    training device (:func:`on_training_device`). Under several processes every one answers and builds its share
    of the shards, with a target that ZeRO-3 partitions gathered whole on each meanwhile; none waits on another while
    it computes (:func:`~draftsmith.data.feature_cache.feature_datasets`)."""
    from pathlib import Path

    import torch.distributed as dist

    from draftsmith.common.paths import features_dir
    from draftsmith.common.sharding import whole
    from draftsmith.data.feature_cache import CacheSpec, feature_datasets

    root = Path(config.feature_cache_dir) if config.feature_cache_dir else features_dir()
    spec = CacheSpec(layers=tuple(layers), dtype=config.feature_cache_dtype,
                     budget_gb=float(config.feature_cache_budget_gb))
    group = dist.group.WORLD if training_args.world_size > 1 and dist.is_initialized() else None
    target = on_training_device(target, training_args.device)
    with whole(list(target.parameters())):
        return feature_datasets(target, tokenizer, datasets, root, spec, answer, group=group)


# ----------------------------------------------------------------------------------------- a tuned target


@dataclass
class TunableCopy:
    """How a method tunes its copy of the target (the frozen original stays the reference)."""

    finetune: str = field(default="full", metadata=help_text("full = every weight of the target's copy trains; lora "
                                                             "= a peft LoRA adapter on every linear layer (merged "
                                                             "into the artefact)."))
    lora_r: int = field(default=16, metadata=help_text("finetune=lora: the LoRA rank."))
    lora_alpha: float = field(default=32.0, metadata=help_text("finetune=lora: LoRA alpha."))

    def check_finetune(self) -> None:
        check_finetune(self.finetune, self.lora_r)


def check_finetune(finetune: str, lora_r: int) -> None:
    if finetune not in FINETUNE_MODES or int(lora_r) < 1:
        raise ConfigError(f"finetune={finetune!r} must be full or lora (with lora_r >= 1)")


def tunable_copy(target, finetune: str, lora_r: int, lora_alpha: float):
    """A copy of ``target`` to fine-tune (the original stays the frozen reference): every weight trainable in float32
    master weights (``full``; a 16-bit target's copy is cast up, autocast runs it in 16 bits), or a peft LoRA model
    over all its linear layers (``lora``; peft keeps the adapter in float32 over the frozen 16-bit base)."""
    check_finetune(finetune, lora_r)
    model = whole_copy(target)  # a target ZeRO-3 partitions: gathered into a plain copy
    if finetune == "full":
        return model.float().requires_grad_(True)
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=int(lora_r), lora_alpha=float(lora_alpha), target_modules="all-linear", bias="none",
                      task_type="CAUSAL_LM")
    return get_peft_model(model.requires_grad_(False), lora)


def merged_model(model):
    """The model a fine-tuning run produced: a LoRA model's adapter merged into a copy of its base, or the model."""
    return copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model


__all__ = ["ANSWER_MODES", "FEATURE_MODES", "FINETUNE_MODES", "AnswerTokens", "FeatureCache", "TargetAnswers",
           "TunableCopy", "check_choice", "check_finetune", "help_text", "merged_model", "offline_feature_datasets",
           "tunable_copy"]


def micro_batch_generator(seed: int, step: int, micro_batch: int, process: int) -> torch.Generator:
    """The CPU generator of one training micro-batch's draws: a function of the run's seed, the optimizer step it
    trains, its index within the step and the process (so resumes repeat it, and processes draw apart)."""
    mixed = (((int(seed) * 1_000_003 + int(step)) * 1_009 + int(micro_batch)) * 9_176 + int(process)) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


class SeededBatches:
    """A trainer mixin: :meth:`batch_generator` gives the micro-batch being prepared its own generator
    (:func:`micro_batch_generator`), not the global one, which a resumed run finds elsewhere (the data loader's
    prefetch, the checkpoint's restored state): a run resumed from a checkpoint draws exactly what the uninterrupted
    one drew."""

    def batch_generator(self) -> torch.Generator:
        """The generator of the next micro-batch of the current optimizer step (call once per micro-batch)."""
        step = self.state.global_step
        last_step, index = getattr(self, "_batch_draw", (None, -1))  # micro-batches of one step count up
        self._batch_draw = (step, index + 1 if last_step == step else 0)
        return micro_batch_generator(self.args.seed, step, self._batch_draw[1], self.args.process_index)
