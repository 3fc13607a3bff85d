"""A preallocated key/value cache with O(1) crop and in-place branch selection.

Hugging Face attention modules only call ``cache.update(key, value, layer_idx)`` and use the
returned full keys and values, so any object with that method can serve as their cache. This one
keeps, per layer, one buffer ``[batch, kv_heads, capacity, head_dim]`` and a length: appending
writes into the buffer (no ``torch.cat`` per step), rolling back rejected draft tokens is setting
the length, and keeping the accepted branch of a token tree is one gather per layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class KVCache:
    """Per-layer key/value buffers that grow by doubling; lengths may differ between layers
    (a layer skipped during a self-drafting forward receives no entries)."""

    def __init__(self, num_layers: int, capacity: int = 256) -> None:
        if num_layers <= 0:
            raise ValueError(f"KVCache needs at least one layer, got num_layers={num_layers}")
        self.num_layers = num_layers
        self.capacity = max(int(capacity), 1)
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._lengths = [0] * num_layers

    # -- the method Hugging Face attention modules call -------------------------------------
    def update(
        self,
        key_states: torch.Tensor,  # [B, H_kv, T, D]
        value_states: torch.Tensor,  # [B, H_kv, T, D]
        layer_idx: int,
        *_,
        **__,  # what the attention module adds (cache_kwargs; kwargs= since transformers 5.24): nothing needed here
    ) -> tuple[torch.Tensor, torch.Tensor]:  # two [B, H_kv, L + T, D] views
        start = self._lengths[layer_idx]
        end = start + key_states.shape[2]
        self._reserve(layer_idx, key_states, end)
        keys, values = self._keys[layer_idx], self._values[layer_idx]
        keys[:, :, start:end] = key_states
        values[:, :, start:end] = value_states
        self._lengths[layer_idx] = end
        return keys[:, :, :end], values[:, :, :end]

    def _reserve(self, layer_idx: int, like: torch.Tensor, needed: int) -> None:
        buf = self._keys[layer_idx]
        if buf is not None and buf.shape[2] >= needed:
            return
        size = self.capacity if buf is None else buf.shape[2]
        while size < needed:
            size *= 2
        shape = (like.shape[0], like.shape[1], size, like.shape[3])
        new_k = like.new_zeros(shape)
        new_v = like.new_zeros(shape)
        old = self._lengths[layer_idx]
        if buf is not None and old:
            new_k[:, :, :old] = buf[:, :, :old]
            new_v[:, :, :old] = self._values[layer_idx][:, :, :old]
        self._keys[layer_idx], self._values[layer_idx] = new_k, new_v

    # -- queries ---------------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._lengths[layer_idx]

    def lengths(self) -> list[int]:
        """Entries per layer (they differ while a self-drafting proposer holds draft entries in some
        layers, or after a forward that skipped layers)."""
        return list(self._lengths)

    def __len__(self) -> int:
        return self.num_layers

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached ``(keys, values)`` of one layer, each ``[B, H_kv, L, D]``."""
        n = self._lengths[layer_idx]
        if self._keys[layer_idx] is None:
            raise IndexError(f"layer {layer_idx} of the cache is empty")
        return self._keys[layer_idx][:, :, :n], self._values[layer_idx][:, :, :n]

    # -- edits -----------------------------------------------------------------------------
    def crop(self, length: int) -> None:
        """Forget every entry at position >= ``length`` in every layer (roll back a draft)."""
        if length < 0:
            raise ValueError(f"cannot crop a cache to a negative length ({length})")
        self._lengths = [min(n, length) for n in self._lengths]

    def select(self, start: int, keep: Sequence[int] | torch.Tensor, index: torch.Tensor | None = None) -> None:
        """Keep the entries ``start + keep`` (``keep``: offsets after ``start``, in order) and move them to
        positions ``start .. start + k - 1``; drop the rest after ``start``. This is how the accepted branch of a
        verified token tree is committed.

        ``keep`` is read on the host (a list, or a CPU tensor; a device tensor is read once); ``index``: the same
        offsets ``[k]`` already on the cache's device (the decode loop has them from the verdict), else they are
        copied there once, not once per layer."""
        offsets = keep.tolist() if isinstance(keep, torch.Tensor) else [int(i) for i in keep]
        k = len(offsets)
        if k == 0 or offsets == list(range(k)):
            self.crop(start + k)
            return
        rows: dict[torch.device, torch.Tensor] = {}  # device -> [k] start + keep, made once per device
        if index is not None:
            rows[index.device] = start + index.to(torch.long)
        elif isinstance(keep, torch.Tensor):
            rows[keep.device] = start + keep.to(torch.long)
        for i in range(self.num_layers):
            n = self._lengths[i]
            if n <= start:
                continue
            if max(offsets) >= n - start:
                raise IndexError(f"layer {i}: keep index {max(offsets)} past the cache end")
            device = self._keys[i].device
            if device not in rows:
                rows[device] = torch.tensor([start + o for o in offsets], dtype=torch.long, device=device)
            idx = rows[device]
            for buf in (self._keys[i], self._values[i]):
                buf[:, :, start : start + k] = buf.index_select(2, idx)
            self._lengths[i] = start + k


class KVPrefix:
    """Keys and values that sit before the cache in every layer and only some queries see (BiTA's deep prompt:
    the mask tokens attend to it, the sequence never does, so the target's own outputs stay exact).

    ``keys[i]`` / ``values[i]``: ``[B or 1, H_kv, P, D]`` for layer ``i``, used as they are (no rotary applied,
    as P-tuning v2's prefix keys). ``visible``: ``[B or 1, T, P]`` bool, which of a forward's ``T`` queries see
    which prefix entry. The adapter prepends the prefix to each layer's keys and its ``visible`` columns to the
    attention mask (:meth:`~draftsmith.inference.core.adapter.ModelAdapter.forward_layers`)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], visible: torch.Tensor) -> None:
        if len(keys) != len(values):
            raise ValueError(f"a KV prefix needs as many key as value tensors, got {len(keys)} and {len(values)}")
        lengths = {int(k.shape[2]) for k in keys} | {int(v.shape[2]) for v in values}
        if len(lengths) != 1 or visible.dim() != 3 or int(visible.shape[2]) not in lengths:
            raise ValueError(f"a KV prefix needs one length P in every layer and visible [B, T, P]; got lengths "
                             f"{sorted(lengths)} and visible {tuple(visible.shape)}")
        self.keys, self.values, self.visible = keys, values, visible.to(torch.bool)

    @property
    def length(self) -> int:
        return int(self.visible.shape[2])


class PrefixedCache:
    """What the attention modules see as their cache when a forward has a :class:`KVPrefix`: updates go to the
    real ``cache`` (or nowhere, ``cache=None``), and the keys/values returned start with the prefix."""

    def __init__(self, cache: KVCache | None, prefix: KVPrefix) -> None:
        self.cache, self.prefix = cache, prefix

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *_,
               **__) -> tuple[torch.Tensor, torch.Tensor]:  # two [B, H_kv, P + L + T, D]
        if self.cache is not None:
            key_states, value_states = self.cache.update(key_states, value_states, layer_idx)
        b = key_states.shape[0]
        pk = self.prefix.keys[layer_idx].to(key_states.dtype).expand(b, -1, -1, -1)
        pv = self.prefix.values[layer_idx].to(value_states.dtype).expand(b, -1, -1, -1)
        return torch.cat([pk, key_states], dim=2), torch.cat([pv, value_states], dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cache.get_seq_length(layer_idx) if self.cache is not None else 0
