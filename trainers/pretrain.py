"""Pretraining a causal LM from scratch on packed token rows: the loop the model zoo trains its target and draft with.

Summed next-token cross-entropy, AdamW with weight decay on matrices only, linear warmup then cosine decay, bf16
autocast where the hardware does it natively. Batches are seeded permutations per epoch, so a step fixes the data
position: a checkpoint (model, optimizer, loop state), written atomically every ``spec.checkpoint_every`` steps,
is all a resume needs, and a resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from draftsmith.common.precision import native_bf16
from draftsmith.data.zoo import ModelSpec, ZooSpec

# called after every optimizer step with (stage, step); raising from it interrupts the build (tests use it)
StepHook = Callable[[str, int], None]


def autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    """The autocast dtype for training (``None``: plain fp32); ``auto`` picks bf16 only where it is native
    (:func:`~draftsmith.common.precision.native_bf16`, the one probe)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    return torch.bfloat16 if native_bf16(device) else None


def lr_at(step: int, total: int, m: ModelSpec) -> float:
    """Linear warmup to ``m.lr`` over ``m.warmup_steps``, then cosine decay to ``m.lr * m.min_lr_ratio``."""
    if step < m.warmup_steps:
        return m.lr * (step + 1) / m.warmup_steps
    progress = (step - m.warmup_steps) / max(1, total - m.warmup_steps)
    return m.lr * (m.min_lr_ratio + (1 - m.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model: torch.nn.Module, m: ModelSpec) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, with weight decay on matrices only (norm weights are not decayed)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": m.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=m.lr, betas=(0.9, 0.95), eps=1e-8)


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Summed next-token cross-entropy: -sum_t log p(x_{t+1} | x_<=t) over the non-padding targets."""
    # logits [B, T, V], input_ids [B, T], pad_mask [B, T] (True = padding)
    labels = input_ids[:, 1:].clone()
    if pad_mask is not None:
        labels[pad_mask[:, 1:]] = -100
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum")


def batch_rows(step: int, batch_size: int, n_rows: int, seed: int) -> torch.Tensor:
    """Row indices of the batch at ``step``: epochs of seeded permutations, so a step fixes the data position."""
    first = step * batch_size
    epochs = {(first + k) // n_rows for k in range(batch_size)}
    perms = {e: torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed * 100_003 + e)) for e in epochs}
    return torch.stack([perms[(first + k) // n_rows][(first + k) % n_rows] for k in range(batch_size)])


@torch.inference_mode()
def heldout_loss(
    model: torch.nn.Module, rows: torch.Tensor, n_real: int, batch_size: int, device: str
) -> tuple[float, int]:
    """``(mean next-token loss in nats/token, number of scored targets)`` of ``model`` on packed ``rows``
    whose first ``n_real`` flat positions are real tokens (the rest is padding)."""
    # rows [N, T]; tokens at flat positions >= n_real are padding
    model.eval()
    total, count = 0.0, 0
    seq_len = rows.shape[1]
    for start in range(0, rows.shape[0], batch_size):
        x = rows[start : start + batch_size].to(device)  # [b, T]
        flat_pos = torch.arange(start * seq_len, (start + x.shape[0]) * seq_len, device=device).view_as(x)
        pad = flat_pos >= n_real  # [b, T]
        total += lm_loss(model(input_ids=x).logits, x, pad).item()
        count += int((~pad[:, 1:]).sum())
    return total / max(1, count), count


# ------------------------------------------------------------------------------------------------ the loop


def fresh_state() -> dict:
    """The loop state before the first step."""
    return {"step": 0, "train_seconds": 0.0, "loss_ema": None}


def next_state(state: dict, loss: float, seconds: float) -> dict:
    """The loop state after one more step that took ``seconds`` and had training ``loss``."""
    ema = state["loss_ema"]
    return {
        "step": state["step"] + 1,
        "train_seconds": state["train_seconds"] + seconds,
        "loss_ema": loss if ema is None else 0.95 * ema + 0.05 * loss,  # smoothed for the progress bar
    }


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Write model, optimizer and loop state to ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: str) -> dict:
    """Restore ``model`` and ``optimizer`` from ``path`` and return its loop state (a fresh one if none)."""
    if not path.exists():
        return fresh_state()
    saved = torch.load(path, map_location=device, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return saved["state"]


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    lr: float,
    grad_clip: float,
    dtype: torch.dtype | None,
) -> float:
    """One optimizer step at learning rate ``lr`` on the batch ``x`` [B, T]; returns its mean token loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        logits = model(input_ids=x).logits  # [B, T, V]
    loss = lm_loss(logits, x) / (x.shape[0] * (x.shape[1] - 1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def train_stats(state: dict, total: int, tokens_per_step: int, dtype: torch.dtype | None) -> dict:
    """What a finished run reports: ``steps``, ``tokens_seen``, ``train_seconds``, ``final_train_loss``,
    ``precision``."""
    return {
        "steps": total,
        "tokens_seen": total * tokens_per_step,
        "train_seconds": round(state["train_seconds"], 3),
        "final_train_loss": None if state["loss_ema"] is None else round(state["loss_ema"], 4),
        "precision": "fp32" if dtype is None else "bf16 autocast",
    }


def train_model(
    model: torch.nn.Module,
    rows: torch.Tensor,
    m: ModelSpec,
    spec: ZooSpec,
    stage: str,
    seed: int,
    checkpoint: Path,
    device: str,
    on_step: StepHook | None = None,
    progress: bool = True,
) -> dict:
    """Train ``model`` on packed ``rows`` [N, T] for ``spec.steps(stage)`` steps, resuming from ``checkpoint``.

    Returns :func:`train_stats`."""
    total = spec.steps(stage)
    dtype = autocast_dtype(spec.precision, device)
    optimizer = make_optimizer(model, m)
    state = load_checkpoint(checkpoint, model, optimizer, device)
    tokens_per_step = spec.batch_size * spec.seq_len
    bar = tqdm(total=total, initial=state["step"], desc=f"zoo {spec.size} {stage}", unit="step", disable=not progress)
    model.train()
    while state["step"] < total:
        step = state["step"]
        started = time.perf_counter()
        x = rows[batch_rows(step, spec.batch_size, rows.shape[0], seed)].to(device)  # [B, T]
        loss = train_step(model, optimizer, x, lr_at(step, total, m), m.grad_clip, dtype)
        state = next_state(state, loss, time.perf_counter() - started)
        if state["step"] % spec.checkpoint_every == 0 and state["step"] < total:
            save_checkpoint(checkpoint, model, optimizer, state)
        bar.update(1)
        bar.set_postfix(
            loss=f"{state['loss_ema']:.3f}",
            tok_s=f"{state['step'] * tokens_per_step / max(state['train_seconds'], 1e-9):.0f}",
        )
        if on_step is not None:
            on_step(stage, state["step"])
    bar.close()
    return train_stats(state, total, tokens_per_step, dtype)
