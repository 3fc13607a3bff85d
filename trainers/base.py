"""The trainer every frozen-target method shares (DistillSpec, Medusa-1, EAGLE, BiTA, ...).

:class:`FrozenTargetTrainer` is a ``transformers.Trainer`` that trains one module (a draft model, heads, prompt
embeddings) beside a frozen target, and does once what each of those methods would otherwise copy:

- the target is frozen, in eval mode, placed on the training device, or sharded under ZeRO-3 in an inference engine
  that gathers each layer in forward (TRL's ``prepare_deepspeed`` recipe); the trained module is gathered for
  generation under ZeRO-3 / FSDP (:meth:`generation_model`);
- a hook turns every micro-batch before it is counted (:meth:`prepare_training_batch`: on-policy or target answers);
- the loss is normalised by the number of loss tokens of the whole gradient-accumulation window, over every
  process — not a mean of micro-batch means, which weights a short generated answer like a long one::

      L = (sum over micro-batches m, processes r, loss tokens t of l_t) / N_window

  (the correction transformers applies to its own causal-LM loss since 4.46); subclasses return the *sum* of
  their per-token losses from :meth:`loss_sum`; loss tokens are counted and logged (``trained_tokens``, resumed);
- evaluation accumulates sums (TVD, greedy agreement) that :meth:`eval_metrics` turns into metrics over processes;
- every checkpoint records the sha256 of its files, which a resume verifies.

Shared settings and helpers (target answers, the feature cache, a tuned copy of the target): :mod:`.mixins`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from draftsmith.common.io import atomic_write_json, umask_modes, write_sums
from draftsmith.data.collate import PadCollator, response_mask
from draftsmith.data.generation import (
    eos_token_ids,
    pad_token_id,
    sample_completions,
    sequences_from_generations,
    split_prompts,
)
from draftsmith.inference.core.draft_length import expected_tau
from draftsmith.trainers.cpu_fsdp import CpuFsdpCheckpoints, cpu_fsdp_wanted, shard_trained_module, whole_model_state
from draftsmith.trainers.losses import acceptance_from_tvd
from draftsmith.trainers.mixins import on_training_device

TOKENS_LOG_KEY = "trained_tokens"
BATCH_COLUMNS = ("input_ids", "labels", "attention_mask")


class FrozenTargetTrainer(CpuFsdpCheckpoints, transformers.Trainer):
    """Trains ``model`` against the frozen ``teacher_model`` (the target); see the module docstring.

    Subclasses set ``config_class`` and implement :meth:`loss_sum`; they may override
    :meth:`prepare_training_batch`, :meth:`count_loss_tokens` and :meth:`eval_metrics`. ``checkpoint_records``
    (file name -> JSON-able record, keyword only) are written into every checkpoint before its trainer state (the
    recipe runner's training settings, which a resume compares)."""

    config_class: type | None = None

    def __init__(self, model, teacher_model, method_config=None, *args, **kwargs):
        self.checkpoint_records: dict[str, Any] = dict(kwargs.pop("checkpoint_records", None) or {})
        if method_config is None:
            method_config = self.config_class() if self.config_class is not None else None
        self.method_config = method_config
        fill_sharding_sizes(kwargs.get("args"), teacher_model.config)
        tokenizer = kwargs.get("processing_class")
        pad_id = pad_token_id(tokenizer, teacher_model.config)
        if kwargs.get("data_collator") is None:
            kwargs["data_collator"] = PadCollator(pad_id)
        super().__init__(model, *args, **kwargs)
        self.pad_token_id = pad_id
        self.eos_token_ids = eos_token_ids(tokenizer, teacher_model.config)
        # compute_loss normalises by the loss tokens of the accumulation window itself (num_items_in_batch)
        self.model_accepts_loss_kwargs = False
        self.loss_is_scaled_for_ga = True
        # the dataset columns the collator and the losses read, whatever the trained module's forward takes
        self._signature_columns = list(BATCH_COLUMNS)
        layers = getattr(self.train_dataset, "layers", ())  # a FeatureDataset: its feature columns reach the loss
        self._signature_columns += [f"feat_{i}" for i in layers]
        self.teacher_module = teacher_model.eval().requires_grad_(False)  # the model itself (config, LM head)
        self.teacher = self._place_teacher(self.teacher_module)  # what forward is called on
        self._tokens_pending = torch.zeros((), dtype=torch.long)
        self._tokens_total: int | None = None
        self._eval_sums: torch.Tensor | None = None
        fsdp = cpu_fsdp_wanted(self.args, self.accelerator)  # FSDP asked for on CPU processes: sharded here
        self.own_fsdp = fsdp is not None
        if self.own_fsdp:
            shard_trained_module(self.model, fsdp)
            self.is_distributed_loading_by_transformers = True  # the Trainer's flag: no DDP wrapper, no placement

    def _get_train_sampler(self, train_dataset=None):
        """Cached features in shard order (``ShardOrderSampler``: each step's micro-batches by length; ``feature_order:
        length``: each shard's batches of similar lengths) unless ``feature_order`` is ``random``; any other dataset
        as the Trainer samples it."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        order = getattr(self.method_config, "feature_order", "shard")
        if hasattr(dataset, "shard_spans") and order in ("shard", "length"):
            from draftsmith.data.feature_order import ShardOrderSampler

            args, batch = self.args, int(self.args.per_device_train_batch_size)
            return ShardOrderSampler(dataset, seed=args.data_seed if args.data_seed is not None else args.seed,
                                     group=batch if order == "length" else 0,
                                     window=batch * int(args.gradient_accumulation_steps) * int(args.world_size))
        return super()._get_train_sampler(train_dataset)

    # ------------------------------------------------------------------------------------------ placement

    def _zero_stage(self) -> int:
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None) if self.is_deepspeed_enabled else None
        return int(plugin.zero_stage) if plugin is not None else 0

    def sharded(self) -> bool:
        """Whether the trained module's parameters are sharded across processes (ZeRO-3 or FSDP)."""
        return self._zero_stage() == 3 or self.is_fsdp_enabled or self.own_fsdp

    def parallelism(self) -> str:
        """How the training is spread over processes (manifest): ``zero<stage>``, ``fsdp<version>``, ``ddp``, ``none``."""
        if self.is_deepspeed_enabled:
            return f"zero{self._zero_stage()}"
        if self.is_fsdp_enabled:
            return f"fsdp{getattr(self.accelerator.state.fsdp_plugin, 'fsdp_version', 1)}"
        if self.own_fsdp:
            return "fsdp2"
        return "ddp" if self.args.world_size > 1 else "none"

    def _place_teacher(self, teacher):
        if self._zero_stage() == 3:  # shard the frozen target too; its engine gathers each layer in forward
            return deepspeed_frozen_engine(teacher, self.accelerator.state.deepspeed_plugin.deepspeed_config)
        return on_training_device(teacher, self.args.device)

    @contextlib.contextmanager
    def generation_model(self, model) -> Iterator[Any]:
        """The unwrapped trained module, its parameters gathered while it generates (ZeRO-3; FSDP1). FSDP2
        gathers layer by layer in every forward, so all ranks must generate in lockstep (``synced_gpus``)."""
        unwrapped = self.accelerator.unwrap_model(model)
        if self._zero_stage() == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(unwrapped.parameters())):
                yield unwrapped
            return
        from torch.distributed.fsdp import FullyShardedDataParallel

        if isinstance(model, FullyShardedDataParallel):
            with FullyShardedDataParallel.summon_full_params(model, writeback=False, recurse=True):
                yield unwrapped
            return
        yield unwrapped

    # ----------------------------------------------------------------------------------------- the loss

    def generated_batch(self, inputs: dict[str, torch.Tensor], generator=None, *, max_new_tokens: int,
                        prompt_tokens: int, temperature: float = 0.0, top_p: float = 1.0) -> dict[str, torch.Tensor]:
        """``inputs`` with its responses replaced by ``generator``'s (default: the frozen target's: the shared
        self-distillation of :func:`draftsmith.data.generation.sample_completions`) to the same prompts; labels
        cover the generated tokens. Pass the trained module (inside :meth:`generation_model`) for on-policy data."""
        prompts = split_prompts(inputs["input_ids"], inputs["labels"], inputs["attention_mask"], prompt_tokens)
        own = generator is None
        model, synced = (self.teacher_module, False) if own else (generator, self.sharded())
        if own and self._zero_stage() == 3:  # gathered once for the batch, not layer by layer for every token
            model = self.whole_target()
        completions = sample_completions(model, prompts, max_new_tokens=max_new_tokens, pad_token_id=self.pad_token_id,
                                         eos_ids=self.eos_token_ids, temperature=temperature, top_p=top_p,
                                         synced_gpus=synced)
        del model
        batch = self.data_collator(sequences_from_generations(prompts, completions))
        return {k: v.to(inputs["input_ids"].device) for k, v in batch.items()}

    def whole_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The trained module's state dict with whole tensors on the main process (gathered under ZeRO-3 and FSDP2: a
        collective, every process calls this); ``None`` on the other processes where it is gathered."""
        if self.own_fsdp:
            return whole_model_state(self.model) or None
        return self.accelerator.get_state_dict(self.model_wrapped)

    def whole_target(self):
        """The frozen target as a plain, whole model on the training device: under ZeRO-3 a copy gathered in one
        collective (every process calls this), which generates a batch with no further communication — the engine's
        hooks would gather every layer again for every generated token, all processes in lockstep. It holds the whole
        target on each process while the batch is generated (the peak of a ZeRO-3 run that generates its data; give
        the answers in the dataset, ``data_mode=fixed``, where that does not fit)."""
        from draftsmith.common.sharding import whole_copy

        return whole_copy(self.teacher_module).to(self.args.device).eval().requires_grad_(False)

    def answers_batch(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``inputs`` with the target's own answers when the method config (a
        :class:`~draftsmith.trainers.mixins.TargetAnswers`) says ``data_mode=target``, else unchanged."""
        cfg = self.method_config
        if getattr(cfg, "data_mode", "fixed") == "fixed":
            return inputs
        return self.generated_batch(inputs, max_new_tokens=cfg.max_new_tokens, prompt_tokens=cfg.prompt_tokens)

    def prepare_training_batch(self, model, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Turn a collated micro-batch (on the device) into what the loss sees; runs before the window's loss
        tokens are counted. Default: unchanged."""
        return inputs

    def count_loss_tokens(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # scalar long
        """Positions the loss sums over: by default every position whose next token is labelled."""
        return response_mask(inputs["labels"]).sum()

    def loss_sum(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """``(sum of the per-token losses over the batch's loss tokens, outputs)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement loss_sum(model, inputs)")

    def get_batch_samples(self, epoch_iterator, num_batches: int, device: torch.device):
        """The micro-batches of one optimizer step, prepared, and their loss tokens over every process."""
        batches = []
        for _ in range(num_batches):
            try:
                batch = next(epoch_iterator)
            except StopIteration:
                break
            batches.append(self.prepare_training_batch(self.model_wrapped, self._prepare_inputs(batch)))
        if not batches:
            return batches, None
        count = sum(self.count_loss_tokens(b).to(device) for b in batches)
        if self.args.world_size > 1:
            count = self.accelerator.reduce(count, reduction="sum")
        return batches, count

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self.accelerator.autocast():  # mixed precision: the frozen 16-bit target and float32 trained weights meet
            total, outputs = self.loss_sum(model, inputs)  # in the loss outside the wrapped module's forward too
        local = self.count_loss_tokens(inputs)
        if model.training:
            self._tokens_pending = self._tokens_pending.to(local.device) + local
        if num_items_in_batch is None:  # outside the training loop: this batch's mean
            loss = total / local.clamp(min=1).to(total.device)
        else:  # processes average their gradients: scale so that the average is the window's token mean
            loss = total * self.accelerator.num_processes / torch.as_tensor(num_items_in_batch).clamp(min=1).to(total.device)
        return (loss, outputs) if return_outputs else loss

    # ------------------------------------------------------------------------------------------- evaluation

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The held-out loss: the mean of :meth:`loss_sum` over the batch's loss tokens."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            total, _ = self.loss_sum(model, inputs)
            loss = total / self.count_loss_tokens(inputs).clamp(min=1).to(total.device)
        return loss.detach(), None, None

    def add_eval_sums(self, sums: torch.Tensor) -> None:
        """Accumulate a vector of sums over the evaluation batches (reduced over processes at the end)."""
        sums = sums.detach().float()
        self._eval_sums = sums if self._eval_sums is None else self._eval_sums.to(sums.device) + sums

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        """Metrics from the accumulated sums (default: none)."""
        return {}

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        self._eval_sums = None
        with self.accelerator.autocast():  # every method's prediction_step under the training's mixed precision
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)
        if self._eval_sums is not None:
            sums = self.accelerator.reduce(self._eval_sums.to(self.args.device), reduction="sum")
            output.metrics.update(self.eval_metrics(sums, metric_key_prefix))
        self._eval_sums = None
        return output

    # ---------------------------------------------------------------------------------------------- logging

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs or "train_loss" in logs:  # training logs run on every rank: safe to reduce
            if self._tokens_total is None:  # resumed run: continue the count of the checkpoint's log history
                self._tokens_total = next((int(h[TOKENS_LOG_KEY]) for h in reversed(self.state.log_history)
                                           if TOKENS_LOG_KEY in h), 0)
            pending = self._tokens_pending.to(self.args.device)
            self._tokens_total += int(self.accelerator.reduce(pending, reduction="sum").item())
            self._tokens_pending = torch.zeros((), dtype=torch.long)
            logs[TOKENS_LOG_KEY] = self._tokens_total
        super().log(logs, start_time)

    # ---------------------------------------------------------------------------------------- the replicas

    def train(self, resume_from_checkpoint: str | None = None, **kwargs):
        if finished_checkpoint(resume_from_checkpoint, self.args.max_steps) and not self.sharded():
            return self._restore_finished(resume_from_checkpoint)
        result = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        self.check_replicas()
        return result

    def _restore_finished(self, checkpoint: str) -> transformers.trainer_utils.TrainOutput:
        """A checkpoint taken at ``max_steps`` (a run killed before its artefact): its state and weights, and no
        training step (the Trainer would take one more before it checks the step count). The loss of the whole run
        comes from the checkpoint's log history."""
        self.state = transformers.TrainerState.load_from_json(str(Path(checkpoint) / transformers.trainer.TRAINER_STATE_NAME))
        self._load_from_checkpoint(checkpoint)
        self._tokens_total = next((int(h[TOKENS_LOG_KEY]) for h in reversed(self.state.log_history)
                                   if TOKENS_LOG_KEY in h), 0)
        return transformers.trainer_utils.TrainOutput(self.state.global_step, None, {})

    def check_replicas(self) -> None:
        """Data-parallel processes must end with the same trained parameters; a loss computed outside the wrapped
        module's forward would silently skip the gradient all-reduce (each process training its own copy). Raises
        ``RuntimeError`` when the replicas differ (not checked when parameters are sharded)."""
        if self.args.world_size <= 1 or self.sharded():
            return
        module = self.accelerator.unwrap_model(self.model_wrapped)
        total = torch.zeros(2, dtype=torch.float64, device=self.args.device)
        for p in module.parameters():
            if p.requires_grad:
                data = p.detach().double()
                total += torch.stack([data.sum(), (data * data).sum()]).to(total.device)
        every = self.accelerator.gather(total[None]).reshape(-1, 2)  # [world, 2]
        if not torch.allclose(every, every[:1].expand_as(every), rtol=1e-6, atol=1e-9):
            raise RuntimeError(f"the data-parallel replicas of the trained module differ after training ({every.tolist()}): "
                               "a method computed its loss outside the wrapped module's forward; route it through "
                               "model(...)")

    # ----------------------------------------------------------------------------------------- checkpoints

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """A trained module that is not a Hugging Face model (a training wrapper) is checkpointed without its frozen
        parameters (Medusa-2's copy of the target under its LoRA adapter: they never change, and the Trainer
        reloads a checkpoint non-strictly) and with tied tensors (an embedding that is also the LM head) once,
        which safetensors requires; loading the one name restores both. A module sharded here (FSDP2 on CPU
        processes) is gathered whole onto the main process first (every process calls this)."""
        whole = self.whole_state_dict() if self.own_fsdp and state_dict is None else None
        if self.own_fsdp and not self.args.should_save:
            return
        if state_dict is None and not isinstance(self.model, transformers.PreTrainedModel):
            frozen = {name for name, p in self.model.named_parameters() if not p.requires_grad}
            state_dict, seen = {}, set()
            for name, tensor in (whole or self.model.state_dict()).items():  # tied weights (embedding = LM head) once
                if name in frozen or tensor.data_ptr() in seen:
                    continue
                seen.add(tensor.data_ptr())
                state_dict[name] = tensor
        super()._save(output_dir, whole if state_dict is None else state_dict)
        umask_modes(output_dir or self.args.output_dir)

    def _save_checkpoint(self, model, trial) -> None:
        """The :attr:`checkpoint_records`, the Trainer's checkpoint, then every file's sha256 (:func:`write_sums`)."""
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        save = self.checkpoint_records and self.args.should_save
        for name, record in self.checkpoint_records.items() if save else ():
            atomic_write_json(folder / name, record)
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every process's shards written (ZeRO's, FSDP's) before they are hashed
        if save and folder.is_dir():
            write_sums(folder)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Resuming leaves the frozen parameters a checkpoint left out as built, and restores every name of a tied
        tensor from the one name saved: only other missing keys are news."""
        missing = unrestored_keys(self.model, load_result.missing_keys)
        if missing or load_result.unexpected_keys:
            transformers.utils.logging.get_logger(__name__).warning(
                f"checkpoint load: missing keys {missing}, unexpected keys {list(load_result.unexpected_keys)}")

    @property
    def trained_tokens(self) -> int:
        """Loss tokens trained on so far, over every process (as of the last training log)."""
        return int(self._tokens_total or 0)

    def manifest_training(self) -> dict[str, Any]:
        """Method-specific facts for the artefact manifest's ``training`` record (default: none)."""
        return {}


def fill_sharding_sizes(training_args, target_config) -> None:
    """DeepSpeed's bucket and persistence sizes left ``"auto"``, sized by the target's hidden size ``H`` as transformers
    would (``H^2``, ``0.9 H^2``, ``10 H``): transformers reads ``hidden_size`` from the trained module's config, which
    heads, embeddings and the training wrappers do not have (ZeRO-3 refused them)."""
    ds = getattr(training_args, "hf_deepspeed_config", None)
    hidden = getattr(target_config, "hidden_size", None)
    if ds is None or hidden is None:
        return
    h = int(hidden)
    ds.fill_only("zero_optimization.reduce_bucket_size", h * h)
    if ds.is_zero3():
        ds.fill_only("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * h * h))
        ds.fill_only("zero_optimization.stage3_param_persistence_threshold", 10 * h)


def finished_checkpoint(checkpoint: str | None, max_steps: int) -> bool:
    """Whether ``checkpoint`` (a resumed checkpoint directory, or None) was taken at or past the run's last step:
    ``max_steps`` when set (> 0), else the step count the checkpoint's own state planned (epochs)."""
    state_file = Path(checkpoint) / transformers.trainer.TRAINER_STATE_NAME if checkpoint else None
    if state_file is None or not state_file.is_file():
        return False
    state = transformers.TrainerState.load_from_json(str(state_file))
    last = max_steps if max_steps > 0 else state.max_steps
    return last > 0 and state.global_step >= last


def unrestored_keys(module: torch.nn.Module, missing: Iterable[str]) -> list[str]:
    """The ``missing`` keys of a non-strict ``load_state_dict`` that the checkpoint really lacked: neither frozen
    parameters (checkpoints of training wrappers leave them out; they stay as built) nor second names of a tied
    parameter (an embedding that is also the LM head, saved once) whose other name was loaded."""
    missing = list(missing)
    absent = set(missing)
    names: dict[int, list[str]] = {}  # parameter -> every name it has
    frozen = set()
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
        if not param.requires_grad:
            frozen.add(name)
    loaded_through = {name: any(other not in absent for other in group if other != name)
                      for group in names.values() for name in group}
    return [k for k in missing if k not in frozen and not loaded_through.get(k, False)]


def acceptance_metrics(sums: torch.Tensor, draft_length: int, prefix: str = "eval") -> dict[str, float]:
    """``[sum TVD, sum greedy agreement, tokens]`` -> mean TVD, estimated acceptance ``1 - TVD``, the tau it
    predicts for ``draft_length`` (Leviathan et al. 2023, eq. 1) and the same two for greedy verification."""
    tvd_sum, agree_sum, count = (float(x) for x in sums.tolist())
    if count == 0:
        return {}
    tvd = tvd_sum / count
    alpha = float(acceptance_from_tvd(tvd))
    greedy = agree_sum / count
    return {
        f"{prefix}_tvd": tvd,
        f"{prefix}_estimated_acceptance": alpha,
        f"{prefix}_predicted_tau": float(expected_tau(min(max(alpha, 0.0), 1.0), draft_length)),
        f"{prefix}_greedy_acceptance": greedy,
        f"{prefix}_predicted_tau_greedy": float(expected_tau(min(max(greedy, 0.0), 1.0), draft_length)),
        f"{prefix}_tokens": count,
    }


def deepspeed_frozen_engine(model, train_config: dict):
    """``model`` under a ZeRO-3 inference engine built from the training config (no optimizer): its parameters
    are sharded like the trained module's and gathered layer by layer in forward (TRL's ``prepare_deepspeed``)."""
    import deepspeed

    config = copy.deepcopy(train_config)
    for key in ("optimizer", "scheduler"):
        config.pop(key, None)
    zero = config.setdefault("zero_optimization", {})
    zero.pop("offload_optimizer", None)
    hidden = getattr(model.config, "hidden_size", None) or getattr(model.config, "n_embd", None)
    sizes = {"reduce_bucket_size": hidden * hidden, "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
             "stage3_param_persistence_threshold": 10 * hidden} if hidden else {}
    for key, value in sizes.items():
        if zero.get(key) == "auto":
            zero[key] = value
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()  # DeepSpeedEngine.eval returns None
    return engine
