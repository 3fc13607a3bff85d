"""Reading parameters whatever shards them: ZeRO-3 partitions each parameter across the processes (its local tensor
is empty; ``deepspeed.zero.GatheredParameters`` makes it whole for a block, a collective every process enters) and
FSDP2 makes each a ``DTensor`` (``full_tensor()``, also a collective). Code that reads a model's weights (a head
started from the target's LM head, a fingerprint of the weights) reads them through :func:`whole` or
:func:`full_tensor`, so it gives the same result under any sharding as on one process."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator

import torch


def partitioned(param: torch.Tensor) -> bool:
    """Whether ``param`` is a ZeRO-3 partitioned parameter (DeepSpeed tags each with ``ds_id``)."""
    return hasattr(param, "ds_id")


def _gathered_now(param: torch.Tensor) -> bool:
    """Whether a ZeRO-3 parameter is whole on this process at the moment (inside an enclosing :func:`whole`)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return param.ds_status != ZeroParamStatus.NOT_AVAILABLE


def full_shape(param: torch.Tensor) -> torch.Size:
    """``param``'s whole shape: a ZeRO-3 partitioned parameter's local tensor is empty, its shape is ``ds_shape``;
    a ``DTensor`` reports its whole shape already."""
    return torch.Size(param.ds_shape) if partitioned(param) else param.shape


@contextlib.contextmanager
def whole(params: Iterable[torch.Tensor]) -> Iterator[None]:
    """Inside the block every ZeRO-3 partitioned parameter of ``params`` is whole on this process (gathered, then
    partitioned again; read-only: changes made inside are dropped). Every process must enter the block when any
    parameter is partitioned; with none it costs nothing, and inside an enclosing block it neither gathers nor
    releases what that block gathered."""
    parts = [p for p in params if partitioned(p) and not _gathered_now(p)]
    if not parts:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(parts):
        yield


def full_tensor(param: torch.Tensor) -> torch.Tensor:
    """``param``'s whole value as a plain tensor: a ``DTensor`` (FSDP2) gathered, a ZeRO-3 partitioned parameter
    gathered (a collective in both cases: every process calls it), any other tensor as it is."""
    if partitioned(param):
        with whole([param]):  # nothing to gather inside an enclosing block
            return param.detach().clone()
    if hasattr(param, "full_tensor"):
        return param.full_tensor().detach()
    return param.detach()


def _no_init() -> contextlib.AbstractContextManager:
    """transformers' switch that skips the random initialisation of a model built from its config (a no-op where this
    transformers has none)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        return contextlib.nullcontext()
    return no_init_weights()


def whole_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` whose parameters are plain and whole: a model ZeRO-3 partitions (loaded under its
    ``zero.Init``) cannot be deep-copied, so its weights are gathered (a collective: every process calls this) into a
    fresh instance of its class built from its config; any other model is deep-copied."""
    params = list(model.parameters())
    if not any(partitioned(p) for p in params):
        return copy.deepcopy(model)
    with whole(params):
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with _no_init():  # every weight is loaded next: no random initialisation to pay for
        fresh = type(model)(copy.deepcopy(model.config))  # a plain construction: no zero.Init outside from_pretrained
    fresh.load_state_dict(state)
    return fresh.to(params[0].dtype).train(model.training)


__all__ = ["full_shape", "full_tensor", "partitioned", "whole", "whole_copy"]
