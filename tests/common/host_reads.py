"""Count, on the CPU, the host synchronisations a decode step would make on a GPU.

A ``TorchFunctionMode`` follows which tensors would live on the accelerator: the models' parameters and buffers,
tensors created with an explicit ``device=``, tensors moved with ``.to(device)`` / ``.cuda()``, and everything computed
from any of those. It counts

- *reads*: ``item``, ``tolist``, ``bool``, ``int``, ``float``, ``index``, ``cpu`` and ``numpy`` of such a tensor (each a
  device-to-host copy the host waits for), and
- *uploads*: a device tensor made from host data (``torch.tensor(list, device=...)``, ``.to(device)`` of a host tensor).

Host-side structure (a draft's ``parents``, made without ``device=``) is not counted: it never leaves the CPU. The count
is an upper bound of what ``torch.cuda.set_sync_debug_mode`` reports on a GPU (uploads from pageable memory are not
always synchronous there).
"""

from __future__ import annotations

import collections

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
         torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}
MOVES = {torch.Tensor.to, torch.Tensor.cuda}
FACTORIES = {torch.tensor, torch.as_tensor}


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _moves_to_device(args, kwargs) -> bool:
    """Whether ``Tensor.to``'s arguments name a device (not just a dtype)."""
    if "device" in kwargs:
        return True
    return any(isinstance(a, (torch.device, str)) for a in args[1:]) or (
        len(args) > 1 and isinstance(args[1], torch.Tensor))


class HostReads(TorchFunctionMode):
    """``with HostReads(model, draft_model) as counter: ...``; then ``counter.reads``, ``counter.uploads`` and
    ``counter.sites`` (where each came from)."""

    def __init__(self, *models: torch.nn.Module) -> None:
        super().__init__()
        self._device = WeakIdKeyDictionary()  # tensor -> True, by identity, not keeping it alive
        for model in models:
            for t in (*model.parameters(), *model.buffers()):
                self._device[t] = True
        self.reads = 0
        self.uploads = 0
        self.sites: collections.Counter = collections.Counter()

    def on_device(self, t: torch.Tensor) -> bool:
        return t in self._device

    def _count(self, kind: str, func) -> None:
        import traceback

        frames = [f for f in traceback.extract_stack()[:-2] if "/draftsmith/" in f.filename
                  or "/inference/" in f.filename or "/trainers/" in f.filename]
        where = f"{frames[-1].filename.rsplit('/', 2)[-1]}:{frames[-1].lineno}" if frames else "?"
        self.sites[f"{kind} {getattr(func, '__name__', func)} {where}"] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        from_device = any(self.on_device(t) for t in inputs)
        if func in READS and from_device:
            self.reads += 1
            self._count("read", func)
        out = func(*args, **kwargs)
        placed = (func in FACTORIES and kwargs.get("device") is not None) or (
            func in MOVES and _moves_to_device(args, kwargs))
        if placed and not from_device:
            self.uploads += 1
            self._count("upload", func)
        if func is torch.Tensor.cpu:  # the host copy (on a CPU run the very same tensor object) lives on the host
            for t in _tensors(out):
                self._device.pop(t, None)
        elif func not in READS and (from_device or placed or kwargs.get("device") is not None):
            for t in _tensors(out):
                self._device[t] = True
        return out
