"""transformers' own greedy decoding as baselines: plain, assisted (a separate draft model) and prompt
lookup, on the same prompts as draftsmith's AR. Their tau is new tokens / target forwards, the forwards
counted with a forward hook on the target."""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch

from draftsmith.common.models import quiet_transformers
from draftsmith.inference.core.timing import sync_device
from draftsmith.inference.evaluation.metrics import mean_or_none, ratio_or_none
from draftsmith.inference.evaluation.runs import HFRun, QuestionRun

HF_PROMPT_LOOKUP_TOKENS = 10


@contextlib.contextmanager
def count_forwards(model: torch.nn.Module) -> Iterator[list[int]]:
    """Count the calls of ``model``'s forward inside the block (a public forward hook, removed after)."""
    counter = [0]

    def hook(module, args, output):
        counter[0] += 1

    handle = model.register_forward_hook(hook)
    try:
        yield counter
    finally:
        handle.remove()


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """transformers' generation-config chatter off for a baseline call: its logging and Python warnings."""
    with quiet_transformers(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def hf_generate(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: Sequence[int], pad_id: int, **kwargs) -> HFRun:
    """transformers' own greedy ``generate`` (plain, assisted or prompt lookup); returns
    (new token ids, seconds, target forwards)."""
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)  # [1, L]
    with count_forwards(model) as counter, _silenced():
        sync_device(model.device)
        t0 = time.perf_counter()
        out = model.generate(  # [1, L + new]
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=list(eos_ids) or None,
            pad_token_id=pad_id,
            **kwargs,
        )
        sync_device(model.device)
        seconds = time.perf_counter() - t0
    return out[0, ids.shape[1] :].tolist(), seconds, counter[0]


def hf_variants(draft_model, prompt_lookup_tokens: int, target_model=None) -> dict[str, dict]:
    """name -> extra ``generate`` kwargs of the transformers baselines (no assisted generation without
    a separate draft model: its target forwards could not be told from the draft's)."""
    variants: dict[str, dict] = {"hf_ar": {}}
    if draft_model is not None and draft_model is not target_model:
        variants["hf_assisted"] = {"assistant_model": draft_model}
    variants["hf_prompt_lookup"] = {"prompt_lookup_num_tokens": prompt_lookup_tokens}
    return variants


def hf_pad_id(tokenizer) -> int:
    """The pad id for transformers' ``generate``: the tokenizer's pad token, else EOS, else 0."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0


def hf_runners(
    model, variants: dict[str, dict], max_new_tokens: int, eos_ids: Sequence[int], pad_id: int
) -> dict[str, Callable[[list[int]], HFRun]]:
    """name -> prompt ids -> :func:`hf_generate` of that variant on ``model``."""
    return {
        name: functools.partial(hf_generate, model, max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id, **kwargs)
        for name, kwargs in variants.items()
    }


def _hf_tokens_per_s(triples: Sequence[HFRun]) -> float:
    tokens = sum(len(ids) for ids, _, _ in triples)
    seconds = sum(s for _, s, _ in triples)
    return tokens / seconds if seconds > 0 else 0.0


def summarize_hf(runs: Sequence[QuestionRun], ar_tps: float | None) -> dict[str, dict]:
    """Baseline fields per transformers variant: tokens/s, speedups, tau = tokens / target forwards."""
    if not runs or not runs[0].hf:
        return {}
    names = list(runs[0].hf)
    per_q = {n: [_hf_tokens_per_s(r.hf[n]) for r in runs] for n in names}
    hf_ar_tps = mean_or_none(per_q.get("hf_ar", []))
    out: dict[str, dict] = {}
    for n in names:
        tokens = sum(len(ids) for r in runs for ids, _, _ in r.hf[n])
        forwards = sum(f for r in runs for _, _, f in r.hf[n])
        identical = sum(
            1 for r in runs if all(ids == t.result.output_ids for (ids, _, _), t in zip(r.hf[n], r.ar))
        ) / len(runs)
        tps = mean_or_none(per_q[n])
        out[n] = {
            "speedup": ratio_or_none(tps, ar_tps),
            "tau": tokens / forwards if forwards else None,
            "tokens_per_s": tps,
            "speedup_vs_hf_ar": ratio_or_none(tps, hf_ar_tps),
            "identical_to_ar": identical,
            "new_tokens": tokens,
            "target_forwards": forwards,
        }
    return out
