"""The chunked losses for an LM head that can only be called: its parameters sharded (ZeRO-3, FSDP) and gathered by
the module's own hooks inside its forward, so a kernel cannot read its weight. :func:`checkpointed_head_loss` runs a
per-row loss (:data:`~draftsmith.kernels.reference.RowLoss`) through ``head(h_c)`` chunk by chunk under activation
checkpointing; :func:`chunked_head_rows` maps a per-row statistic (argmax, ranks, per-token losses) over chunks without
gradient (the evaluations' view of the logits). Only ``[chunk, V]`` logits are ever alive. Every call of a sharded head
is a collective, so every process makes as many calls as the one with the most chunks (:func:`lockstep_calls`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from draftsmith.kernels.reference import RowLoss, counted_rows, resolve_chunk_size

# head(hidden [C, H]) -> logits [C, V]: an LM head called as a module (its parameters read only inside the call)
Head = Callable[[torch.Tensor], torch.Tensor]


def _module_inputs(hidden, labels, teacher_hidden, mask):
    """Flattened ``hidden`` [N, H], ``labels`` [N], ``teacher_hidden`` [N, Ht] and the counted rows [M]."""
    lead = hidden.shape[:-1]
    for name, x in (("labels", labels), ("mask", mask)):
        if x is not None and x.shape != lead:
            raise ValueError(f"{name} {tuple(x.shape)} must match the token dims {tuple(lead)} of the hidden states")
    if teacher_hidden is not None and teacher_hidden.shape[:-1] != lead:
        raise ValueError(f"teacher hidden {tuple(teacher_hidden.shape)} must match the token dims {tuple(lead)}")
    flat = hidden.reshape(-1, hidden.shape[-1])
    labels = None if labels is None else labels.reshape(-1).to(flat.device)
    teacher_hidden = None if teacher_hidden is None else teacher_hidden.detach().reshape(-1, teacher_hidden.shape[-1])
    mask = None if mask is None else mask.reshape(-1).to(device=flat.device, dtype=torch.bool)
    return flat, labels, teacher_hidden, counted_rows(flat.shape[0], mask, flat.device)


def lockstep_calls(chunks: int, device) -> int:  # the most chunks any process has
    """How many times to call a sharded head: its every call gathers its shards, a collective, so each process calls
    it as often as the process with the most chunks (the others on empty chunks); ``chunks`` alone on one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return chunks
    count = torch.tensor([chunks], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def _chunk_loss_sum(h_c, y_c, t_c, head: Head, teacher_head: Head | None, row_loss: RowLoss) -> torch.Tensor:
    teacher = None
    if teacher_head is not None:
        with torch.no_grad():
            teacher = teacher_head(t_c)  # [C, V] frozen
    return row_loss(head(h_c), y_c, teacher).sum()


def checkpointed_head_loss(
    hidden: torch.Tensor,  # [..., H]
    head: Head,
    row_loss: RowLoss,
    *,
    vocab: int,
    labels: torch.Tensor | None = None,  # [...] long
    teacher_hidden: torch.Tensor | None = None,  # [..., Ht]
    teacher_head: Head | None = None,
    mask: torch.Tensor | None = None,  # [...] bool
    reduction: str = "mean",
    chunk_size: int | None = None,
    reentrant: bool = False,
    lockstep: bool = True,
) -> torch.Tensor:  # scalar float32
    """:func:`~draftsmith.kernels.reference.chunked_linear_loss` for a head that can only be called (its parameters
    sharded by ZeRO-3 or FSDP and gathered inside its own forward): each chunk runs ``row_loss(head(h_c), labels_c,
    teacher_head(t_c))`` under activation checkpointing, so its ``[C, V]`` logits are freed at once and recomputed,
    one chunk at a time, in the backward; gradients reach the head's parameters and ``hidden`` through autograd and
    the head's own hooks. ``vocab`` (the head's output width) only sizes the default chunk. ``reentrant``: recompute
    with the reentrant checkpoint, which reruns the heads' forwards with their hooks inside the backward (a head whose
    ZeRO-3 shards were released after its forward needs that; FSDP's do not). ``lockstep`` (on: a called head is a
    sharded one): every process calls the head as often as the one with the most chunks (:func:`lockstep_calls`)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if (teacher_hidden is None) != (teacher_head is None):
        raise ValueError("teacher_hidden and teacher_head go together")
    flat, labels, teacher_hidden, rows = _module_inputs(hidden, labels, teacher_hidden, mask)
    chunk_size = resolve_chunk_size(chunk_size, flat.shape[0], vocab, flat.shape[1], flat.device)
    total = torch.zeros((), dtype=torch.float32, device=flat.device)
    calls = -(-rows.numel() // chunk_size)
    calls = lockstep_calls(calls, flat.device) if lockstep else calls
    for start in range(0, calls * chunk_size, chunk_size):
        idx = rows[start : start + chunk_size]  # [C], empty past this process's rows
        y_c = None if labels is None else labels.index_select(0, idx)
        t_c = None if teacher_hidden is None else teacher_hidden.index_select(0, idx)
        total = total + checkpoint(_chunk_loss_sum, flat.index_select(0, idx), y_c, t_c, head, teacher_head,
                                   row_loss, use_reentrant=reentrant)
    if rows.numel() == 0 and flat.requires_grad:  # nothing counted: a zero that still reaches the graph
        total = total + flat.sum() * 0.0
    return total / max(rows.numel(), 1) if reduction == "mean" else total


@torch.no_grad()
def chunked_head_rows(
    hidden: torch.Tensor,  # [N, H]
    head: Head,
    row_fn: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor],
    *,
    vocab: int,
    labels: torch.Tensor | None = None,  # [N]
    teacher_hidden: torch.Tensor | None = None,  # [N, Ht]
    teacher_head: Head | None = None,
    chunk_size: int | None = None,
    lockstep: bool = False,
) -> torch.Tensor:  # [N, ...]
    """``row_fn(head(h_c), labels_c, teacher_head(t_c))`` (a per-row statistic ``[C, ...]``: argmax, rank hits,
    per-row losses) over ``hidden`` chunk by chunk, without gradient, concatenated: the evaluation's view of the
    logits with one ``[C, V]`` chunk alive. ``vocab`` only sizes the default chunk. ``lockstep``: the head is sharded,
    so every process calls it as often as the one with the most chunks (:func:`lockstep_calls`)."""
    if (teacher_hidden is None) != (teacher_head is None):
        raise ValueError("teacher_hidden and teacher_head go together")
    n = hidden.shape[0]
    chunk_size = resolve_chunk_size(chunk_size, n, vocab, hidden.shape[-1], hidden.device)
    out = []
    calls = -(-n // chunk_size)
    for start in range(0, (lockstep_calls(calls, hidden.device) if lockstep else calls) * chunk_size, chunk_size):
        part = slice(start, start + chunk_size)
        teacher = None if teacher_head is None else teacher_head(teacher_hidden[part])
        out.append(row_fn(head(hidden[part]), None if labels is None else labels[part], teacher))
    if not out:
        return row_fn(head(hidden[:0]), None if labels is None else labels[:0],
                      None if teacher_head is None else teacher_head(teacher_hidden[:0]))
    return torch.cat(out)


__all__ = ["Head", "checkpointed_head_loss", "chunked_head_rows", "lockstep_calls"]
