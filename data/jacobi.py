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

Within a block the ``n`` positions run in one batched forward over the cached context (transformers' own
``DynamicCache``, cropped after each update); prompts run one after another.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from draftsmith.common import __version__
from draftsmith.common.errors import ConfigError
from draftsmith.common.io import atomic_write_json, atomic_write_text, environment, read_json
from draftsmith.data.self_distill import append_rows, check_resume, meta_path, recover_rows, weights_sample_sha256

META_FORMAT = "draftsmith-jacobi/1"
SETTINGS = ("block", "max_new_tokens", "seed")
FIX = "delete the file (and its .meta.json) to start over, or pass another output path"


def initial_guess(context: Sequence[int], n: int, seed: int) -> list[int]:
    """``n`` tokens drawn uniformly, with replacement, from ``context`` (CLLM's initial Jacobi guess)."""
    gen = torch.Generator().manual_seed(seed)
    ctx = torch.as_tensor(list(context), dtype=torch.long)
    return ctx[torch.randint(0, ctx.numel(), (n,), generator=gen)].tolist()


def _forward(model, ids: list[int], cache) -> torch.Tensor:  # [T, V] logits, the tokens appended to the cache
    device = next(model.parameters()).device
    return model(input_ids=torch.tensor(ids, dtype=torch.long, device=device)[None], past_key_values=cache,
                 use_cache=True).logits[0]


@torch.no_grad()
def jacobi_states(model, cache, past: int, last_token: int, guess: list[int]) -> list[list[int]]:
    """Greedy Jacobi iteration of one block: the states from ``guess`` to the fixed point.

    ``cache`` (a transformers ``DynamicCache``) holds the ``past`` context tokens before ``last_token`` (the
    context's last token, not yet cached); each update runs ``[last_token, y_0 .. y_{n-2}]`` over it (row ``i``
    predicts ``y_i``) and removes those ``n`` entries again."""
    state, states = list(guess), [list(guess)]
    for _ in range(len(guess) + 1):  # update k fixes y_<k: n + 1 updates always reach the fixed point
        new = _forward(model, [last_token] + state[:-1], cache).argmax(-1).tolist()  # [n]
        cache.crop(-len(state))  # transformers 5: a negative count removes that many entries
        if cache.get_seq_length() != past:
            raise RuntimeError(f"the Jacobi cache holds {cache.get_seq_length()} entries after an update, not {past}")
        if new == state:
            break
        state = new
        states.append(state)
    return states


@torch.no_grad()
def prompt_trajectory(model, row_id: str, prompt: Sequence[int], *, block: int, max_new_tokens: int,
                      eos_ids: Sequence[int], seed: int) -> list[dict]:
    """Every block's trajectory for one prompt (module docstring), as output rows."""
    from transformers import DynamicCache

    from draftsmith.data.self_distill import row_seed

    prefix = [int(t) for t in prompt]
    cache = DynamicCache()
    if len(prefix) > 1:
        _forward(model, prefix[:-1], cache)
    rows: list[dict] = []
    b = 0
    while len(prefix) - len(prompt) < max_new_tokens:
        states = jacobi_states(model, cache, len(prefix) - 1, prefix[-1],
                               initial_guess(prefix, block, row_seed(seed, f"{row_id}:{b}")))
        fixed = states[-1]
        eos = any(t in eos_ids for t in fixed)
        rows.append({"id": row_id, "block": b, "prompt_length": len(prompt), "prefix": list(prefix),
                     "states": states, "fixed_point": fixed, "eos": eos, "last": False})
        _forward(model, [prefix[-1]] + fixed[:-1], cache)  # the cache now holds the new context but its last token
        prefix.extend(fixed)
        b += 1
        if eos:
            break
    rows[-1]["last"] = True
    return rows


def complete_rows(out: Path) -> list[dict]:
    """The rows of the prompts whose last block is on disk; a prompt a kill cut short loses its partial rows (the
    file is rewritten without them)."""
    rows = recover_rows(out)
    done = {r["id"] for r in rows if r.get("last")}
    kept = [r for r in rows if r["id"] in done]
    if len(kept) != len(rows):
        atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def collect_trajectories(model, prompts: Sequence[Sequence[int]], ids: Sequence[str], out_path: str | os.PathLike, *,
                         target: Mapping, block: int = 16, max_new_tokens: int = 256, seed: int = 0,
                         eos_ids: Sequence[int] = (), progress: bool = True) -> dict:
    """Collect (or resume) the trajectories of ``prompts`` (token ids; ``ids`` name them) into ``out_path``;
    ``target`` is the model's identity (:func:`~draftsmith.common.models.target_identity`). Returns the stats the
    meta also records."""
    from tqdm.auto import tqdm

    if block < 1 or max_new_tokens < 1:
        raise ConfigError(f"Jacobi trajectories need block >= 1 and max_new_tokens >= 1, got {block} and {max_new_tokens}")
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
    bar = tqdm(total=len(pending), desc="jacobi trajectories", unit="prompt", disable=not progress)
    try:
        for i in pending:
            start = time.perf_counter()
            rows = prompt_trajectory(model, ids[i], prompts[i], block=block, max_new_tokens=max_new_tokens,
                                     eos_ids=eos_ids, seed=seed)
            append_rows(out, rows)
            totals["prompts"] += 1
            totals["blocks"] += len(rows)
            totals["updates"] += sum(len(r["states"]) - 1 for r in rows)
            totals["seconds"] += time.perf_counter() - start
            write_meta()
            bar.update(1)
    finally:
        bar.close()
    return write_meta()


def read_trajectories(out_path: str | os.PathLike) -> list[dict]:
    """The complete trajectory rows of a file (see :func:`complete_rows`)."""
    return complete_rows(Path(out_path))


__all__ = ["collect_trajectories", "complete_rows", "initial_guess", "jacobi_states", "prompt_trajectory",
           "read_trajectories"]
