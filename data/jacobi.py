"""Jacobi trajectories (CLLM, Kou et al. 2024): how the target's greedy Jacobi iteration moves an ``n``-token guess
to its fixed point, block after block, recorded for consistency training.

For a prompt, block ``b`` starts from the prompt plus the fixed points of blocks ``0 .. b-1``; its initial guess is
``n`` tokens drawn from that context (CLLM's initialisation, seeded per prompt and block); each Jacobi update
re-predicts all ``n`` positions in one forward from the current guess (``y_i <- argmax p(. | x, y_<i)``) until
the guess stops changing. After at most ``n`` updates it is the greedy continuation, so the fixed points of the
blocks are the target's own greedy answer. Blocks continue until ``max_new_tokens`` or an end-of-sequence token in
a fixed point.

Output, one JSON line per block::

    {"id": "<prompt id>", "block": 0, "prompt_length": 37, "prefix": [...], "states": [[n ids], ...],
     "fixed_point": [n ids], "eos": false, "last": false}

``states`` runs from the initial guess to the fixed point (both included). ``<out>.meta.json`` records the
settings (``block``, ``max_new_tokens``, ``seed``), the target's identity and the progress.

Resuming: a prompt's rows are appended (and fsynced) together once its last block is done, the last one marked
``"last": true``. Rerunning the same call keeps the prompts whose last row is on disk, drops the rows of a prompt a
kill cut short (the file is rewritten atomically without them) and collects the rest, so no trajectory is lost or
duplicated; a run with other settings or another target is refused.

Batched: ``batch_size`` prompts (sorted by length, left-padded) run together, each Jacobi update one forward of
``[batch, n]`` over the cached contexts (transformers' own ``DynamicCache``, cropped after each update); a batch's
rows are appended together, so a kill loses at most the batch in flight.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from draftsmith.common import __version__
from draftsmith.common.errors import ConfigError
from draftsmith.common.io import atomic_write_json, environment, read_json
from draftsmith.common.models import cache_keyword
from draftsmith.data.row_files import (
    append_rows,
    check_resume,
    meta_path,
    recover_rows,
    rewrite_rows,
    row_seed,
    weights_sample_sha256,
)

META_FORMAT = "draftsmith-jacobi/1"
SETTINGS = ("block", "max_new_tokens", "seed")
FIX = "delete the file (and its .meta.json) to start over, or pass another output path"


def initial_guess(context: Sequence[int], n: int, seed: int) -> list[int]:
    """``n`` tokens drawn uniformly, with replacement, from ``context`` (CLLM's initial Jacobi guess)."""
    gen = torch.Generator().manual_seed(seed)
    ctx = torch.as_tensor(list(context), dtype=torch.long)
    return ctx[torch.randint(0, ctx.numel(), (n,), generator=gen)].tolist()


def prompt_trajectory(model, row_id: str, prompt: Sequence[int], *, block: int, max_new_tokens: int,
                      eos_ids: Sequence[int], seed: int) -> list[dict]:
    """Every block's trajectory for one prompt (module docstring), as output rows."""
    return batch_trajectories(model, [row_id], [prompt], block=block, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                              seed=seed)[0]


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p))
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def batch_trajectories(model, row_ids: Sequence[str], prompts: Sequence[Sequence[int]], *, block: int,
                       max_new_tokens: int, eos_ids: Sequence[int], seed: int, pad_id: int = 0) -> list[list[dict]]:
    """The trajectories of several prompts at once (module docstring): left-padded into one batch, every Jacobi
    update of a block one forward of ``[B, n]`` over the cached contexts (transformers' ``DynamicCache``, the
    update's entries removed again); each row is recorded until it converges, and a row whose fixed point holds an
    end-of-sequence token stops there (it rides along, unrecorded, while the others go on). Returns each prompt's
    rows."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    n, b_size = int(block), len(prompts)
    prefixes = [[int(t) for t in p] for p in prompts]
    ids, seen = _left_pad(prefixes, pad_id, device)  # [B, L]; seen: which columns are real tokens
    positions = (seen.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    cache = DynamicCache()
    if ids.shape[1] > 1:
        model(input_ids=ids[:, :-1], attention_mask=seen[:, :-1], position_ids=positions[:, :-1], use_cache=True,
              **{cache_keyword(model): cache})
    last, last_pos = ids[:, -1], positions[:, -1]  # [B] the context's last token (not cached) and its position
    ones = torch.ones(b_size, n, dtype=torch.long, device=device)
    steps = torch.arange(n, device=device)

    def run(block_ids: torch.Tensor) -> torch.Tensor:  # [B, n] -> [B, n, V]; appends n entries to the cache
        inputs = torch.cat([last[:, None], block_ids[:, :-1]], dim=1)  # [B, n]
        return model(input_ids=inputs, attention_mask=torch.cat([seen, ones[:, :-1]], dim=1),
                     position_ids=last_pos[:, None] + steps, use_cache=True, **{cache_keyword(model): cache}).logits

    rows: list[list[dict]] = [[] for _ in range(b_size)]
    active = [True] * b_size
    b = 0
    while any(active) and b * n < max_new_tokens:
        guesses = [initial_guess(prefixes[i], n, row_seed(seed, f"{row_ids[i]}:{b}")) for i in range(b_size)]
        state = torch.tensor(guesses, dtype=torch.long, device=device)  # [B, n]
        states = [[g] for g in guesses]
        done = [False] * b_size
        for _ in range(n + 1):  # update k fixes y_<k: n + 1 updates always reach the fixed point
            new = run(state).argmax(-1)  # [B, n]
            cache.crop(-n)  # transformers >= 4.56: a negative count removes that many entries
            for i in range(b_size):
                if not done[i]:
                    if torch.equal(new[i], state[i]):
                        done[i] = True
                    else:
                        states[i].append(new[i].tolist())
            state = new
            if all(done):
                break
        for i in range(b_size):
            if active[i]:
                fixed = states[i][-1]
                eos = any(t in eos_ids for t in fixed)
                rows[i].append({"id": row_ids[i], "block": b, "prompt_length": len(prompts[i]),
                                "prefix": list(prefixes[i]), "states": states[i], "fixed_point": fixed, "eos": eos,
                                "last": False})
                prefixes[i].extend(fixed)
                active[i] = not eos
        run(state)  # the fixed blocks into the cache: it now holds every context but its new last token
        seen = torch.cat([seen, ones], dim=1)
        last, last_pos = state[:, -1], last_pos + n
        b += 1
    for r in rows:
        r[-1]["last"] = True
    return rows


def complete_rows(out: Path) -> list[dict]:
    """The rows of the prompts whose last block is on disk; a prompt a kill cut short loses its partial rows (the
    file is rewritten without them)."""
    rows = recover_rows(out)
    done = {r["id"] for r in rows if r.get("last")}
    kept = [r for r in rows if r["id"] in done]
    if len(kept) != len(rows):
        rewrite_rows(out, kept)
    return kept


def collect_trajectories(model, prompts: Sequence[Sequence[int]], ids: Sequence[str], out_path: str | os.PathLike, *,
                         target: Mapping, block: int = 16, max_new_tokens: int = 256, seed: int = 0,
                         eos_ids: Sequence[int] = (), batch_size: int = 8, pad_id: int = 0,
                         progress: bool = True) -> dict:
    """Collect (or resume) the trajectories of ``prompts`` (token ids; ``ids`` name them) into ``out_path``;
    ``target`` is the model's identity (:func:`~draftsmith.common.models.target_identity`). Returns the stats the
    meta also records."""
    from tqdm.auto import tqdm

    if block < 1 or max_new_tokens < 1 or batch_size < 1:
        raise ConfigError(f"Jacobi trajectories need block, max_new_tokens and batch_size >= 1, got {block}, "
                          f"{max_new_tokens} and {batch_size}")
    if len(set(ids)) != len(ids):
        raise ConfigError("trajectory prompt ids must be unique")
    out, meta_file = Path(out_path), meta_path(out_path)
    settings = {"block": int(block), "max_new_tokens": int(max_new_tokens), "seed": int(seed)}
    identity = {**target, "weights_sample_sha256": weights_sample_sha256(model)}
    out.parent.mkdir(parents=True, exist_ok=True)
    done = complete_rows(out) if out.exists() else []
    old_meta = read_json(meta_file) if done else None
    check_resume(old_meta, settings, identity, out, bool(done), fmt=META_FORMAT, keys=SETTINGS, fix=FIX)
    done_ids = {r["id"] for r in done}
    pending = [i for i, pid in enumerate(ids) if pid not in done_ids]
    model = model.eval()
    totals = {"prompts": len(done_ids), "blocks": len(done), "updates": sum(len(r["states"]) - 1 for r in done),
              "seconds": float(((old_meta or {}).get("progress") or {}).get("seconds", 0.0))}
    meta = {"format": META_FORMAT, "settings": settings, "target": identity, "draftsmith_version": __version__,
            "environment": environment(device=str(next(model.parameters()).device), threads=torch.get_num_threads()),
            "prompts": len(ids)}

    def write_meta() -> dict:
        meta["progress"] = {**totals, "complete": totals["prompts"] == len(ids),
                            "updates_per_block": totals["updates"] / max(1, totals["blocks"])}
        atomic_write_json(meta_file, meta)
        return meta["progress"]

    out.touch()
    write_meta()
    order = sorted(pending, key=lambda i: len(prompts[i]))  # similar lengths together: less padding
    bar = tqdm(total=len(pending), desc="jacobi trajectories", unit="prompt", disable=not progress)
    try:
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            began = time.perf_counter()
            per_prompt = batch_trajectories(model, [ids[i] for i in batch], [prompts[i] for i in batch], block=block,
                                            max_new_tokens=max_new_tokens, eos_ids=eos_ids, seed=seed, pad_id=pad_id)
            rows = [r for prompt_rows in per_prompt for r in prompt_rows]
            append_rows(out, rows)
            totals["prompts"] += len(batch)
            totals["blocks"] += len(rows)
            totals["updates"] += sum(len(r["states"]) - 1 for r in rows)
            totals["seconds"] += time.perf_counter() - began
            write_meta()
            bar.update(len(batch))
    finally:
        bar.close()
    return write_meta()


def read_trajectories(out_path: str | os.PathLike) -> list[dict]:
    """The complete trajectory rows of a file (see :func:`complete_rows`)."""
    return complete_rows(Path(out_path))


__all__ = ["batch_trajectories", "collect_trajectories", "complete_rows", "initial_guess", "prompt_trajectory",
           "read_trajectories"]
