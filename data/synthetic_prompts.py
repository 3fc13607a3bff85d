"""Prompts the target writes itself (Magpie, Xu et al. 2024, arXiv:2406.08464), for self-distillation data that
covers what the target's users ask rather than what a corpus happens to hold.

    stats = synthesize_prompts(target, tokenizer, "runs/sd/prompts.jsonl", count=2000, temperature=1.0, top_p=0.95)

An instruction-tuned model given its chat template only up to a user turn's content (:func:`user_prefix_ids`:
the template's system prompt and user header) continues with a user's request, drawn from the requests it was
aligned on. Each attempt samples one continuation to the end-of-turn token; an attempt is kept as a prompt when
it ended (the request is whole), holds at least ``min_words`` words and is not a repeat of a kept prompt (case and
spacing ignored). Output, one JSON line per kept prompt, a prompt-only chat row that ``draftsmith data generate
--prompts FILE`` answers::

    {"id": "3f2a...", "messages": [{"role": "user", "content": "Can you ..."}], "num_tokens": 23, "attempt": 7}

A Magpie model writes the requests it was aligned on most, which are rarely passages to summarise, texts to
translate or documents to answer from. ``openers`` steer it across kinds of task: attempt ``a`` starts the user
turn with ``openers[a % len(openers)]`` (the first words of a request, e.g. ``"Translate into French:"``) and the
model writes the rest, so each kind gets an equal share of the attempts; :data:`TASK_OPENERS` holds three or four
openers for each of twelve kinds of request (``--openers tasks``). A kept row then also records its ``opener``.

Sampling is reproducible per attempt: attempt ``a`` draws from its own uniforms seeded with
:func:`~draftsmith.data.row_files.row_seed` ``(seed, "attempt-<a>")``, so the file depends on the seed and the
target only. ``<out>.meta.json`` (written after every batch) records the settings, the target's identity, the
template prefix and the progress (kept, attempts, dropped by reason). Rerunning the same call resumes after the
last recorded attempt; rows a kill left past it are repeats of what the rerun samples and are dropped as such.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from draftsmith.common import __version__
from draftsmith.common.errors import ConfigError
from draftsmith.common.io import atomic_write_json, environment
from draftsmith.data.chat import user_prefix_ids
from draftsmith.data.generation import eos_token_ids, pad_token_id, sample_completions
from draftsmith.data.row_files import (
    SETTINGS,
    append_rows,
    check_settings,
    open_row_file,
    row_seed,
    sampling_settings,
    writer_identity,
)
from draftsmith.data.self_distill import finish_reason, prompt_id

META_FORMAT = "draftsmith-synthetic-prompts/1"
FIX = "pass a new --out, or --overwrite to start that file again"
DROP_REASONS = ("unfinished", "too_short", "repeat")

# The first words of user requests of twelve kinds (writing, roleplay, reasoning, math, coding, extraction, STEM,
# humanities, summarisation, QA, context QA, translation), for ``openers``: written for this purpose, generic
# task phrasings rather than any benchmark's questions. No opener ends in a space (the model writes the next word
# with its own leading space).
TASK_OPENERS: tuple[str, ...] = (
    "Write a short story about", "Write a formal email to", "Write a poem about", "Draft a blog post on",
    "Pretend you are", "You are a pirate captain.", "Let's play a game: you are",
    "Here is a logic puzzle:", "If all", "Which one does not belong, and why:",
    "Solve for x:", "A farmer has", "Calculate",
    "Write a Python function that", "Fix the bug in this code:\n\n", "Explain what this JavaScript code does:\n\n",
    "Extract every name and date from the text below.\n\n", "From the following text, list",
    "Turn this description into a JSON object:\n\n",
    "Explain how", "What is the difference between", "Describe the process of",
    "Discuss the causes of", "What was the significance of", "Compare the ideas of",
    "Summarize the following article in three sentences.\n\n", "Give a one-paragraph summary of this text:\n\n",
    "Condense the passage below into bullet points.\n\n",
    "Who", "When did", "Why do",
    "Answer the question using only the context below.\n\nContext:",
    "Read the passage and answer the question that follows.\n\nPassage:", "Based on the document below,",
    "Translate into French:", "Translate the following sentence into Spanish:", "How do you say this in German:",
)
OPENER_SETS = {"tasks": TASK_OPENERS}


def prompt_key(text: str) -> str:
    """What two prompts must share to be repeats: the text case-folded, runs of whitespace as one space."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def judge_attempt(tokens: list[int], text: str, eos_ids: list[int], min_words: int, seen: set[str],
                  opener: str = "") -> str | None:
    """Why an attempt is dropped (one of :data:`DROP_REASONS`), or None to keep it; a kept prompt's key is added
    to ``seen``. ``text`` is the whole request, ``opener`` included; the model's part must hold ``min_words``."""
    if finish_reason(tokens, eos_ids) != "eos":
        return "unfinished"  # cut at max_new_tokens: the request may be incomplete
    if len(text[len(opener):].split()) < min_words:
        return "too_short"
    key = prompt_key(text)
    if key in seen:
        return "repeat"
    seen.add(key)
    return None


def prompt_row(text: str, tokens: list[int], attempt: int, opener: int | None = None) -> dict:
    """The output row of a kept attempt: a prompt-only chat row (with the index of its opener, when one began it)."""
    messages = [{"role": "user", "content": text}]
    row = {"id": prompt_id(messages), "messages": messages, "num_tokens": len(tokens), "attempt": attempt}
    return row if opener is None else {**row, "opener": opener}


def resolve_openers(spec: str | None) -> tuple[str, ...]:
    """The openers ``--openers`` names: a built-in set (:data:`OPENER_SETS`), or a file with one opener per line
    (a line that starts with ``"`` is a JSON string, for openers that hold line breaks); None: no openers."""
    if spec is None:
        return ()
    if spec in OPENER_SETS:
        return OPENER_SETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"--openers {spec!r} is neither a built-in set ({', '.join(OPENER_SETS)}) nor a file: pass "
                          "one of those or a text file with one opener per line")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"--openers {path} is not UTF-8 text (byte {err.start}): save it as UTF-8") from None
    openers = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            openers.append(json.loads(line) if line.startswith('"') else line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{n}: not a JSON string ({err.msg}): quote it as JSON or drop the leading \"") from None
    return check_openers(openers, str(path))


def check_openers(openers, where: str = "openers") -> tuple[str, ...]:
    """``openers`` as a tuple of non-empty strings with no trailing spaces (the model writes the next word's space)."""
    openers = tuple(o.rstrip(" ") if isinstance(o, str) else o for o in openers)
    if not openers or any(not isinstance(o, str) or not o.strip() for o in openers):
        raise ConfigError(f"{where}: every opener must be a non-empty string, and there must be at least one")
    return openers


def _check(count: int, batch_size: int, max_new_tokens: int, temperature: float, top_p: float,
           min_words: int) -> None:
    check_settings(batch_size, max_new_tokens, temperature, top_p)
    if count < 1:
        raise ConfigError(f"--count must be at least 1, got {count}")
    if temperature == 0:
        raise ConfigError("--temperature must be > 0: greedy writes one prompt over and over")
    if min_words < 1:
        raise ConfigError(f"--min-words must be at least 1, got {min_words}")


def synthesize_prompts(
    model,
    tokenizer,
    out_path: str | os.PathLike,
    *,
    count: int,
    batch_size: int = 16,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    top_p: float = 0.95,
    seed: int = 0,
    min_words: int = 3,
    max_attempts: int | None = None,
    openers: Sequence[str] = (),
    target_name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Write ``count`` prompts sampled from ``model`` into ``out_path`` (see the module docstring), resuming a file
    a killed run left; stop early after ``max_attempts`` attempts (default ``4 * count``). Returns the progress
    also written to the meta. ``openers``: first words of the requests, one per attempt in turn (module docstring)."""
    _check(count, batch_size, max_new_tokens, temperature, top_p, min_words)
    max_attempts = 4 * count if max_attempts is None else max_attempts
    openers = check_openers(openers) if openers else ()
    # a resumed run must use the same openers (a file from before openers records none)
    settings = {**sampling_settings(temperature, top_p, seed, max_new_tokens), "openers": list(openers) or None}
    target = writer_identity(model, tokenizer, target_name)
    out, meta_file, done, old_meta = open_row_file(out_path, settings, target, overwrite, fmt=META_FORMAT, fix=FIX,
                                                   keys=(*SETTINGS, "openers"))
    old = (old_meta or {}).get("progress", {})
    prefix = user_prefix_ids(tokenizer)  # [P]
    steer = openers or ("",)  # no openers: every attempt starts at the bare user header
    prefixes = [user_prefix_ids(tokenizer, o) for o in steer]  # [P_k] per opener
    eos_ids, pad_id = eos_token_ids(tokenizer, model.config), pad_token_id(tokenizer, model.config)
    if not eos_ids:
        raise ConfigError("the target names no end-of-sequence token, so a sampled request never ends; set "
                          "eos_token_id in its generation config")
    seen = {prompt_key(r["messages"][0]["content"]) for r in done}
    totals = {"kept": len(done), "attempts": int(old.get("attempts", 0)), "seconds": float(old.get("seconds", 0.0)),
              "tokens": int(old.get("tokens", 0)), "dropped": Counter(old.get("dropped", {}))}
    meta = {"format": META_FORMAT, "settings": settings, "min_words": min_words, "target": target,
            "prefix": tokenizer.decode(prefix), "draftsmith_version": __version__,
            "environment": environment(device=str(next(model.parameters()).device), threads=torch.get_num_threads()),
            "created": (old_meta or {}).get("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))}

    def stats() -> dict:
        meta["progress"] = {**totals, "dropped": {r: totals["dropped"][r] for r in DROP_REASONS}, "count": count,
                            "tokens_per_s": totals["tokens"] / totals["seconds"] if totals["seconds"] else 0.0,
                            "complete": totals["kept"] >= count}
        return {**meta["progress"], "out": str(out)}

    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch()
    stats()
    atomic_write_json(meta_file, meta)
    from tqdm.auto import tqdm

    bar = tqdm(total=count, initial=min(totals["kept"], count), desc="prompts", unit="prompt", disable=not progress,
               dynamic_ncols=True)
    try:
        while totals["kept"] < count and totals["attempts"] < max_attempts:
            attempts = list(range(totals["attempts"], min(totals["attempts"] + batch_size, max_attempts)))
            start = time.perf_counter()
            completions = sample_completions(model, [prefixes[a % len(steer)] for a in attempts],
                                             max_new_tokens=max_new_tokens,
                                             pad_token_id=pad_id, eos_ids=eos_ids, temperature=temperature,
                                             top_p=top_p, row_seeds=[row_seed(seed, f"attempt-{a}") for a in attempts])
            rows = []
            for attempt, tokens in zip(attempts, completions):
                if totals["kept"] + len(rows) == count:
                    break  # the attempts left are not used: a later run with a larger count starts at them
                body = tokens[:-1] if finish_reason(tokens, eos_ids) == "eos" else tokens
                k = attempt % len(steer)
                text = (steer[k] + tokenizer.decode(body, skip_special_tokens=True)).strip()
                reason = judge_attempt(tokens, text, eos_ids, min_words, seen, steer[k].strip())
                if reason is not None:
                    totals["dropped"][reason] += 1
                else:
                    rows.append(prompt_row(text, tokens, attempt, k if openers else None))
                totals["attempts"] = attempt + 1
                totals["tokens"] += len(tokens)
            append_rows(out, rows)
            totals["kept"] += len(rows)
            totals["seconds"] += time.perf_counter() - start
            stats()
            atomic_write_json(meta_file, meta)
            bar.update(len(rows))
    finally:
        bar.close()
    return stats()

