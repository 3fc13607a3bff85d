"""Generating responses with a model for training data: prompts split off labelled rows, left-padded
batches through ``generate`` (KV cache, several sequences per forward), and rows rebuilt from the answers.

Used by the trainers that train on model-generated data (DistillSpec's target-generated and on-policy modes)
and by self-distillation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import transformers

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


def row_uniforms(seeds: Sequence[int], steps: int) -> torch.Tensor:  # [B, steps] float32 in [0, 1)
    """``steps`` uniforms per row, row ``i`` from a CPU generator seeded with ``seeds[i]``."""
    return torch.stack([torch.rand(steps, generator=torch.Generator().manual_seed(int(s))) for s in seeds])


def nucleus_probs(
    logits: torch.Tensor,  # [B, V]
    temperature: float,
    top_p: float,
) -> torch.Tensor:  # [B, V] float32, rows sum to 1
    """Softmax of ``logits / temperature`` restricted to the smallest set of tokens whose mass reaches ``top_p``
    (the token that crosses it is kept), renormalised."""
    logits = logits.float() / temperature
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
        probs = sorted_logits.softmax(-1)
        drop_sorted = probs.cumsum(-1) - probs >= top_p  # mass of strictly better tokens already reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def inverse_cdf(
    probs: torch.Tensor,  # [B, V]
    u: torch.Tensor,  # [B] in [0, 1)
) -> torch.Tensor:  # [B] token ids
    """Token ``t`` of every row with ``cdf[t - 1] <= u * total < cdf[t]``: one draw per uniform."""
    cdf = probs.cumsum(-1)  # [B, V]
    target = (u.to(cdf) * cdf[:, -1]).unsqueeze(-1)  # [B, 1]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # [B]
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1)  # [B] last token with mass (u * total rounding up)
    return torch.minimum(tokens, last)


class RowSampler(transformers.LogitsProcessor):
    """Samples the next token of every row from its own uniforms (``[B, steps]``, column ``t`` at generated
    position ``t``) and returns scores whose argmax is that token: greedy search then emits the sample."""

    def __init__(self, uniforms: torch.Tensor, prompt_width: int, temperature: float, top_p: float):
        self.uniforms, self.prompt_width = uniforms, prompt_width
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # [B, T], [B, V] -> [B, V]
        step = input_ids.shape[1] - self.prompt_width
        probs = nucleus_probs(scores, self.temperature, self.top_p)
        tokens = inverse_cdf(probs, self.uniforms[:, step])  # [B]
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(1, tokens.unsqueeze(1), 0.0)


def generation_config(max_new_tokens: int, pad_id: int, eos_ids: Sequence[int]) -> transformers.GenerationConfig:
    """Greedy search with the processors a model's own ``generation_config`` could switch on set neutral."""
    return transformers.GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, pad_token_id=pad_id,
        eos_token_id=list(eos_ids) or None, use_cache=True, repetition_penalty=1.0,
        encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0, min_length=0,
    )


def sample_completions(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    pad_token_id: int,
    eos_ids: Sequence[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    row_seeds: Sequence[int] | None = None,
    synced_gpus: bool = False,
) -> list[list[int]]:
    """Let ``model`` continue every prompt by up to ``max_new_tokens`` tokens, one left-padded ``generate`` call;
    each answer ends at its first EOS. Greedy at ``temperature`` 0; otherwise sampled with ``temperature`` and
    ``top_p``, row ``i`` from its own uniforms seeded by ``row_seeds[i]`` (drawn from torch's global generator when
    not given), so a row's answer does not depend on the other rows of the batch."""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_token_id, device)  # [B, P]
    processors = transformers.LogitsProcessorList()
    if temperature > 0:
        if row_seeds is None:
            row_seeds = torch.randint(0, 1 << 62, (len(prompts),)).tolist()
        if len(row_seeds) != len(prompts):
            raise ValueError("sampling needs one row seed per prompt")
        uniforms = row_uniforms(row_seeds, max_new_tokens).to(device)  # [B, max_new_tokens]
        processors.append(RowSampler(uniforms, ids.shape[1], temperature, top_p))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, logits_processor=processors,
                                 generation_config=generation_config(max_new_tokens, pad_token_id, eos_ids),
                                 synced_gpus=synced_gpus)  # [B, P + <= max_new_tokens]
    finally:
        model.train(was_training)
    return [cut_at_eos(row, eos_ids) for row in out[:, ids.shape[1]:].tolist()]


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
