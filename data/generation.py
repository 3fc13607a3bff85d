"""Generating responses with a model for training data: prompts split off labelled rows, left-padded
batches through ``generate`` (KV cache, several sequences per forward), and rows rebuilt from the answers.

Used by the trainers that train on model-generated data (DistillSpec's target-generated and on-policy modes)
and by self-distillation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftsmith.data.chat import IGNORE_INDEX


def split_prompts(
    input_ids: torch.Tensor,  # [B, T]
    labels: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    prompt_tokens: int,
) -> list[list[int]]:
    """The prompt of every row: the tokens before its first label (a chat row's prompt, generation header
    included). A row labelled from its first token (plain text) gets its first ``prompt_tokens`` tokens."""
    prompts = []
    for ids, lab, att in zip(input_ids.tolist(), labels.tolist(), attention_mask.tolist()):
        n = sum(att)
        ids, lab = ids[:n], lab[:n]
        start = next((i for i, label in enumerate(lab) if label != IGNORE_INDEX), n)
        if start == 0:
            start = min(prompt_tokens, n - 1)
        prompts.append(ids[: max(1, start)])
    return prompts


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` ``[B, P]`` for ``generate``."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def cut_at_eos(tokens: Sequence[int], eos_ids: Sequence[int]) -> list[int]:
    """``tokens`` up to and including the first end-of-sequence id."""
    out = []
    for t in tokens:
        out.append(int(t))
        if t in eos_ids:
            break
    return out


def sequences_from_generations(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[dict]:
    """Training rows ``prompt + completion`` with labels on the completion tokens only."""
    rows = []
    for prompt, completion in zip(prompts, completions):
        ids = list(prompt) + list(completion)
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * len(prompt) + list(completion),
                     "attention_mask": [1] * len(ids)})
    return rows


def sample_completions(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    pad_token_id: int,
    eos_ids: Sequence[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    synced_gpus: bool = False,
) -> list[list[int]]:
    """Let ``model`` continue every prompt by up to ``max_new_tokens`` tokens (greedy at ``temperature`` 0,
    else sampled with ``temperature`` and ``top_p``), one left-padded batch; each answer ends at its EOS."""
    import transformers

    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_token_id, device)  # [B, P]
    sample = temperature > 0
    gen = transformers.GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=temperature if sample else None,
        top_p=top_p if sample else None,
        top_k=0,  # off: None would take transformers' default of 50, truncating the target's distribution
        pad_token_id=pad_token_id,
        eos_token_id=list(eos_ids) or None,
        use_cache=True,
    )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen, synced_gpus=synced_gpus)
    finally:
        model.train(was_training)
    new = out[:, ids.shape[1]:].tolist()  # [B, <= max_new_tokens]
    return [cut_at_eos(row, eos_ids) for row in new]


def pad_token_id(tokenizer, config) -> int:
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(config, "pad_token_id", None),
                  getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)):
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def eos_token_ids(tokenizer, config) -> list[int]:
    ids: list[int] = []
    for value in (getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    return ids
