"""FSDP2 on CPU processes, applied by draftsmith itself.

accelerate turns the Trainer's ``--fsdp`` into FSDP only on accelerator devices: CPU processes (gloo) are its
``MULTI_CPU`` type, which it wraps in DDP whatever the FSDP settings say. On CPU processes draftsmith therefore
shards the trained module itself with torch's ``fully_shard`` (FSDP2, the version accelerate uses on GPUs) and
tells the Trainer the module owns its placement and gradient reduction (the Trainer's flag for a model sharded at
load time): no DDP wrapper, the optimizer over the sharded ``DTensor`` parameters, gradients reduce-scattered by
FSDP2. As under accelerate's FSDP, only the trained module is sharded; the frozen target stays whole on each process.

- Units: with an auto-wrap policy (the default), every submodule whose class is one of the trained module's
  no-split classes (its decoder layers: ``_no_split_modules``) or named by ``transformer_layer_cls_to_wrap``, then
  the root; ``reshard_after_forward`` for the units as the config says (``full_shard``: true, ``shard_grad_op``:
  false), the root left whole after its forward (FSDP2's default for a root: backward needs it next).
- Frozen parameters inside the trained module (a target's embedding or LM head an EAGLE head shares) are left
  whole (``ignored_params``): the target's own forward reads them.
- Checkpoints hold whole tensors, as a one-process run's: the weights and the optimizer state are gathered to the
  main process (torch's ``get_*_state_dict(full_state_dict=True)``, a collective every process enters) and written
  there (the optimizer state keyed by parameter name); a resume gives every process the whole state and each keeps
  its shard (``set_*_state_dict``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME


def fsdp_settings(args, environ=None) -> dict | None:
    """The FSDP settings a run asks for, or None: the Trainer's ``--fsdp`` with its ``--fsdp_config``, or an
    accelerate config with ``distributed_type: FSDP`` (``accelerate launch`` passes it to the processes as
    ``ACCELERATE_USE_FSDP`` and ``FSDP_*`` variables)."""
    env = os.environ if environ is None else environ
    if args.fsdp:
        return dict(args.fsdp_config or {})
    if env.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return None
    layers = [c for c in env.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "").split(",") if c]
    return {"reshard_after_forward": env.get("FSDP_RESHARD_AFTER_FORWARD", "true"),
            "auto_wrap_policy": env.get("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP"),
            "transformer_layer_cls_to_wrap": layers}


def cpu_fsdp_wanted(args, accelerator) -> dict | None:
    """The FSDP settings when a run asks for FSDP that accelerate does not apply (several CPU processes), else
    None."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        return None
    return fsdp_settings(args)


def shard_units(module: torch.nn.Module, fsdp_config: dict) -> list[torch.nn.Module]:
    """The submodules sharded as their own units before the root: instances of the module's no-split classes (the
    decoder layers of every Hugging Face model inside it) or of ``transformer_layer_cls_to_wrap``; none with
    ``auto_wrap_policy`` NO_WRAP."""
    if str(fsdp_config.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")).upper() == "NO_WRAP":
        return []
    names = set(fsdp_config.get("transformer_layer_cls_to_wrap") or ())
    if not names:
        for sub in module.modules():
            names |= set(getattr(sub, "_no_split_modules", None) or ())
    return [sub for sub in module.modules() if sub is not module and type(sub).__name__ in names
            and any(p.requires_grad for p in sub.parameters())]


def shard_trained_module(module: torch.nn.Module, fsdp_config: dict) -> torch.nn.Module:
    """Shard ``module`` in place over the default process group with ``fully_shard``: its units, then the root;
    frozen parameters left whole. Returns ``module`` (now an ``FSDPModule``)."""
    from torch.distributed.fsdp import fully_shard

    reshard = str(fsdp_config.get("reshard_after_forward", True)).lower() not in ("false", "shard_grad_op")
    frozen = {p for p in module.parameters() if not p.requires_grad}
    for unit in shard_units(module, fsdp_config):
        fully_shard(unit, reshard_after_forward=reshard, ignored_params=frozen & set(unit.parameters()) or None)
    # the root: FSDP2's own default, kept whole after forward (so the losses that read its LM head after the forward
    # find it whole, as under accelerate's FSDP2) and resharded after backward
    fully_shard(module, reshard_after_forward=None if reshard else False, ignored_params=frozen or None)
    return module


def whole_model_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's whole state dict on the main process (plain CPU tensors; a frozen, unsharded weight as it is),
    ``{}`` on the others; a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_whole_model_state(module: torch.nn.Module, state: dict[str, torch.Tensor]):
    """Load a whole state dict (every process holds it) into the sharded module, non-strictly; returns the missing
    and unexpected keys as ``load_state_dict`` does."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    return set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=False))


class CpuFsdpCheckpoints:
    """The Trainer's checkpoint and accumulation hooks for a module :func:`shard_trained_module` sharded (the trainer
    sets ``own_fsdp``); every hook is the Trainer's own otherwise. Mixed into
    :class:`~draftsmith.trainers.base.FrozenTargetTrainer` before ``transformers.Trainer``."""

    own_fsdp: bool = False

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self.own_fsdp:
            return super()._save_optimizer_and_scheduler(output_dir)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(self.model, self.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.args.should_save:
            torch.save(state, os.path.join(output_dir, OPTIMIZER_NAME))
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if not self.own_fsdp or checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        folder = Path(checkpoint)
        if not (folder / OPTIMIZER_NAME).is_file():
            return None
        state = torch.load(folder / OPTIMIZER_NAME, map_location="cpu", weights_only=True)
        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))
        self.lr_scheduler.load_state_dict(torch.load(folder / SCHEDULER_NAME, map_location="cpu", weights_only=True))
        return None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if not self.own_fsdp:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        from draftsmith.common.io import read_safetensors_dir

        state = read_safetensors_dir(Path(resume_from_checkpoint))
        self._issue_warnings_after_load(load_whole_model_state(self.model, state))
        return None

    @contextlib.contextmanager
    def _defer_fsdp_gradient_reduction(self):
        """No gradient reduce-scatter until the last micro-batch of an accumulation window."""
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)


__all__ = ["CpuFsdpCheckpoints", "cpu_fsdp_wanted", "fsdp_settings", "load_whole_model_state",
           "shard_trained_module", "shard_units", "whole_model_state"]
