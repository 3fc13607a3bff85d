"""Count, on the CPU, the host synchronisations a decode step would make on a GPU.

A ``TorchFunctionMode`` follows which tensors would live on the accelerator: the models' parameters and buffers,
tensors created with an explicit ``device=``, tensors moved with ``.to(device)`` / ``.cuda()``, and everything computed
from any of those. It counts

- *reads*: ``item``, ``tolist``, ``bool``, ``int``, ``float``, ``index``, ``cpu`` and ``numpy`` of such a tensor (each a
  device-to-host copy the host waits for), ``torch.equal`` of one, and the operations whose output size depends on
  its values (``nonzero``, ``masked_select``, ``unique``, indexing with a boolean mask), and
- *uploads*: a device tensor made from host data (``torch.tensor(list, device=...)``, ``.to(device)`` of a host tensor),
  and indexing a device tensor with a host tensor or a Python list (the index is copied to the device).

On the CPU ``.to(device)`` of a host tensor and ``.cpu()`` of a device tensor return the very tensor they were given;
here they return a copy, as on a GPU, so that the host tensor stays on the host and the device one on the device.

Host-side structure (a draft's ``parents``, made without ``device=``) is not counted: it never leaves the CPU. The count
is an upper bound of what ``torch.cuda.set_sync_debug_mode`` reports on a GPU (uploads from pageable memory are not
always synchronous there).

``counter.sites`` counts each read and upload by kind, function and the innermost project line that made it;
``HostReads(..., stacks=True)`` also keeps, in ``counter.stacks``, the project lines of the whole call chain.
"""

from __future__ import annotations

import collections
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
         torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy, torch.equal, torch.Tensor.equal,
         torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.Tensor.masked_select, torch.unique,
         torch.Tensor.unique, torch.argwhere, torch.Tensor.argwhere}
MOVES = {torch.Tensor.to, torch.Tensor.cuda}
FACTORIES = {torch.tensor, torch.as_tensor}
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
PROJECT = ("/draftsmith/", "/inference/", "/trainers/", "/data/", "/common/")


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


def _index_parts(index) -> list:
    return list(index) if isinstance(index, tuple) else [index]


class HostReads(TorchFunctionMode):
    """``with HostReads(model, draft_model) as counter: ...``; then ``counter.reads``, ``counter.uploads`` and
    ``counter.sites`` (where each came from). Count a run after a warm-up run under the same counter
    (:meth:`reset` between them)."""

    def __init__(self, *models: torch.nn.Module, stacks: bool = False) -> None:
        super().__init__()
        self._device = WeakIdKeyDictionary()  # tensor -> True, by identity, not keeping it alive
        for model in models:
            for t in (*model.parameters(), *model.buffers()):
                self._device[t] = True
        self.reads = 0
        self.uploads = 0
        self.sites: collections.Counter = collections.Counter()
        self.stacks: collections.Counter | None = collections.Counter() if stacks else None

    def reset(self) -> None:
        """Zero the counts and keep what is known to live on the device: count a second run after a warm-up run
        under the same counter, so that what the first made on the device and kept (a static tree's structure)
        is known as such."""
        self.reads = self.uploads = 0
        self.sites.clear()
        if self.stacks is not None:
            self.stacks.clear()

    def on_device(self, t: torch.Tensor) -> bool:
        return t in self._device

    def _count(self, kind: str, func) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if any(p in f.filename for p in PROJECT)
                  and not f.filename.endswith("host_reads.py")]
        lines = [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in frames]
        name = f"{kind} {getattr(func, '__name__', func)}"
        self.sites[f"{name} {lines[-1] if lines else '?'}"] += 1
        if self.stacks is not None:
            self.stacks[f"{name} " + " < ".join(reversed(lines))] += 1

    def _host_index(self, index) -> bool:
        """Whether an index holds host data the device would need: a host tensor of one or more dimensions (a
        zero-dimensional one is a scalar) or a Python list."""
        for part in _index_parts(index):
            if isinstance(part, list):
                return True
            if isinstance(part, torch.Tensor) and part.dim() > 0 and not self.on_device(part):
                return True
        return False

    def _mask_index(self, index) -> bool:
        """Whether an index selects with a device boolean mask (its output size is read from the device)."""
        return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool and p.dim() > 0 and self.on_device(p)
                   for p in _index_parts(index))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        from_device = any(self.on_device(t) for t in inputs)
        if func in READS and from_device:
            self.reads += 1
            self._count("read", func)
        if func in INDEXING and self.on_device(args[0]):
            if self._host_index(args[1]):
                self.uploads += 1
                self._count("upload", func)
            if self._mask_index(args[1]):
                self.reads += 1
                self._count("read", func)
        out = func(*args, **kwargs)
        placed = (func in FACTORIES and kwargs.get("device") is not None) or (
            func in MOVES and _moves_to_device(args, kwargs))
        if placed and not from_device:
            self.uploads += 1
            self._count("upload", func)
            if any(out is t for t in inputs):  # a GPU gives a copy; the host tensor stays on the host
                out = out.clone()
        if func is torch.Tensor.cpu:  # the host copy: a new tensor, as on a GPU
            if out is args[0]:
                out = out.clone()
            for t in _tensors(out):
                self._device.pop(t, None)
        elif func not in READS and (from_device or placed or kwargs.get("device") is not None):
            for t in _tensors(out):
                self._device[t] = True
        return out
