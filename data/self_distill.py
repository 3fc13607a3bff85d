"""Self-distillation: regenerate the answers of a prompt set with the target, for training a drafter on the
target's own outputs.

    stats = generate_answers(target, tokenizer, prompts, "runs/sd/answers.jsonl", batch_size=16,
                             max_new_tokens=256, temperature=0.0, top_p=1.0, seed=0, target_name="path/to/target")

``prompts`` are conversations (``[{"role", "content"}, ...]``, the last turn a user turn). The answers are
generated in left-padded batches through ``generate`` (KV cache, several sequences per forward); prompts are
sorted by length into batches to limit padding. Output, one JSON line per prompt::

    {"id": "3f2a...", "messages": [...prompt turns, {"role": "assistant", "content": answer}],
     "num_tokens": 57, "finish": "eos" | "length"}

``num_tokens`` counts the generated tokens (the end-of-sequence token included when there is one); it is what
tokens/s counts. ``<out>.meta.json`` (written atomically after every batch) records the generation settings,
the target's identity (:func:`~draftsmith.common.models.target_identity` and a sample of its weights,
:func:`~draftsmith.data.row_files.weights_sample_sha256`), the prompt source and its sha256, the draftsmith version and environment, and the
progress (rows, tokens, seconds, tokens/s) with one entry per run.

Resuming (:mod:`draftsmith.data.row_files`): rows are appended and flushed to disk (fsync) one batch at a time. Rerunning the same call reads the
rows already written (a torn last line from a kill is cut off), skips their ids and generates the rest; a run
whose settings or target differ from the meta's is refused (:class:`ConfigError`). When every prompt is done
the file is rewritten (atomically) in prompt order, so the finished file does not depend on how often the run
was interrupted.

Sampling is reproducible per row: row ``id`` draws its tokens from its own uniforms (a CPU generator seeded
with :func:`~draftsmith.data.row_files.row_seed` of ``(seed, id)``), turned into a token by inverting the cumulative distribution after
temperature and top-p. A row's answer therefore depends on the seed, its id and the target's logits only, not
on the batch it lands in, the batch size or restarts (up to the last-bit differences padding makes in the
logits). Greedy decoding is the argmax. Both go through ``generate`` as greedy search with
:class:`~draftsmith.data.generation.RowSampler` as a logits processor, with the processors a model's ``generation_config`` could add
(repetition penalty, n-gram blocking, minimum length) set neutral.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from draftsmith.common import __version__
from draftsmith.common.errors import ConfigError, DataError
from draftsmith.common.io import (
    atomic_write_json,
    environment,
    read_json,
    sha256_json,
)
from draftsmith.data.chat import EMPTY_TEXT, MISSING_FIELD, NO_ASSISTANT, BadRow, build_prompt_ids, normalize_row
from draftsmith.data.datasets import LoadReport, read_rows, resolve_format
from draftsmith.data.generation import eos_token_ids, pad_token_id, sample_completions
from draftsmith.data.row_files import (
    FIX,
    META_SUFFIX,
    append_rows,
    check_settings,
    meta_path,
    open_row_file,
    recover_rows,
    rewrite_rows,
    row_seed,
    same_target,
    sampling_settings,
    writer_identity,
)

META_FORMAT = "draftsmith-self-distill/1"
PLACEHOLDER = "(answer)"  # stands in for a missing answer while a prompt-only row is validated

# ------------------------------------------------------------------------------------------------------ prompts


def prompt_id(messages: Sequence[Mapping[str, str]]) -> str:
    """A stable id of a prompt: the first 16 hex digits of the sha256 of its turns."""
    return sha256_json([{"role": m["role"], "content": m["content"]} for m in messages])[:16]


def prompt_turns(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """The prompt of a conversation: the turns before its final assistant turn (the whole conversation when it
    ends on a user turn); raises :class:`BadRow` unless that prompt ends on a user turn."""
    turns = [dict(m) for m in messages]
    if turns and turns[-1]["role"] == "assistant":
        turns = turns[:-1]
    if not turns or turns[-1]["role"] != "user":
        raise BadRow(NO_ASSISTANT, "no user turn to answer before the last assistant turn")
    return turns


def _with_placeholder(row: Mapping, fmt: str) -> Mapping:
    """A prompt-only row completed with a placeholder answer, so :func:`normalize_row` validates the rest."""
    if fmt == "messages" and isinstance(row.get("messages"), list):
        return {**row, "messages": [*row["messages"], {"role": "assistant", "content": PLACEHOLDER}]}
    if fmt == "sharegpt" and isinstance(row.get("conversations"), list):
        return {**row, "conversations": [*row["conversations"], {"from": "gpt", "value": PLACEHOLDER}]}
    if fmt == "alpaca" and not row.get("output"):
        return {**row, "output": PLACEHOLDER}
    return row


def row_prompt(row: Any, fmt: str) -> list[dict[str, str]]:
    """The prompt turns of one ``messages``, ``sharegpt`` or ``alpaca`` row (see :func:`prompt_turns`); rows with
    no answer yet are prompts too. Raises :class:`BadRow`."""
    try:
        return prompt_turns(normalize_row(row, fmt))
    except BadRow as err:
        if err.category not in (NO_ASSISTANT, MISSING_FIELD, EMPTY_TEXT) or not isinstance(row, Mapping):
            raise
        completed = _with_placeholder(row, fmt)
        if completed is row:
            raise
        return prompt_turns(normalize_row(completed, fmt))


def unique_prompts(ids: Sequence[str], prompts: Sequence[list]) -> tuple[list[str], list[list], int]:
    """``(ids, prompts, dropped)``: the first prompt of every id (repeated content shares a content id)."""
    seen: set[str] = set()
    out_ids, out_prompts = [], []
    for pid, prompt in zip(ids, prompts):
        if pid not in seen:
            seen.add(pid)
            out_ids.append(pid)
            out_prompts.append(prompt)
    return out_ids, out_prompts, len(ids) - len(out_ids)


def corpus_prompts(split: str = "train", limit: int | None = None, seed: int = 0) -> list[list[dict[str, str]]]:
    """The user turns of the shipped corpus' chat examples in ``split`` (plain-text chunks have no prompt): all of
    them in file order, or ``limit`` of them with an equal share from every source (the corpus is stored source by
    source, so its first N would all be code prompts), as the recipes' ``data_mix=balanced`` picks."""
    from draftsmith.data.corpus import balanced_subset, load_corpus

    chats = [ex for ex in load_corpus(split) if "messages" in ex]
    return [prompt_turns(ex["messages"]) for ex in balanced_subset(chats, limit, seed)]


def dataset_prompts(path: str | os.PathLike, max_bad_fraction: float = 0.05) -> tuple[list[list[dict]], LoadReport]:
    """The prompt of every row of a .json / .jsonl / .parquet chat dataset (any format :mod:`~draftsmith.data.chat`
    reads; rows without an answer are prompts too), in file order, and a :class:`LoadReport` of the rows skipped.
    More than ``max_bad_fraction`` unusable rows (or none usable) is a :class:`DataError`."""
    rows = list(read_rows(path))
    fmt = resolve_format(rows, "auto", source=str(path))
    if fmt == "text":
        raise DataError(f"{path} holds plain text rows, not chats: pass messages, ShareGPT or Alpaca rows (or a "
                        "question set) as --prompts")
    report = LoadReport(source=str(path), format=fmt, unit="line" if Path(path).suffix.lower() == ".jsonl" else "record")
    prompts = []
    for line, row in rows:
        report.total += 1
        try:
            if isinstance(row, BadRow):
                raise row
            prompts.append(row_prompt(row, fmt))
        except BadRow as err:
            report.add_skip(line, err)
    report.kept = len(prompts)
    if not prompts or report.bad_fraction > max_bad_fraction:
        first = report.first_bad
        raise DataError(f"{path}: {report.skipped} of {report.total} rows are not usable prompts (first at "
                        f"{report.unit} {first.first_line}: {first.reason}); fix or drop them")
    return prompts, report


def prompts_sha256(ids: Sequence[str], prompts: Sequence[Sequence[Mapping[str, str]]]) -> str:
    """sha256 of the prompt set, in order (ids and turns)."""
    return sha256_json([[pid, list(p)] for pid, p in zip(ids, prompts)])


# ------------------------------------------------------------------------------------------------------ batches


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices into ``lengths`` in batches of ``batch_size``, longest prompts first (ties by index) so a batch
    holds prompts of similar length; every batch is in index order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [sorted(order[k:k + batch_size]) for k in range(0, len(order), batch_size)]


def max_positions(config) -> int | None:
    """The longest sequence a model's config allows (None when it does not say)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def finish_reason(tokens: Sequence[int], eos_ids: Sequence[int]) -> str:
    return "eos" if tokens and tokens[-1] in eos_ids else "length"


def answer_row(row_id: str, prompt: Sequence[Mapping[str, str]], tokens: Sequence[int], tokenizer,
               eos_ids: Sequence[int]) -> dict:
    """The output row of one prompt: its turns plus the decoded answer (special tokens dropped)."""
    finish = finish_reason(tokens, eos_ids)
    body = list(tokens[:-1]) if finish == "eos" else list(tokens)
    answer = tokenizer.decode(body, skip_special_tokens=True)
    return {"id": row_id, "messages": [*map(dict, prompt), {"role": "assistant", "content": answer}],
            "num_tokens": len(tokens), "finish": finish}


# -------------------------------------------------------------------------------------------------- output file


def answered_by(path: str | os.PathLike, model, tokenizer, target_name: str | None = None) -> dict:
    """The target record of the answers in ``path`` (from its ``.meta.json``), after checking that ``model`` wrote
    them: a ConfigError naming the fix when the file has no self-distillation meta or another target's."""
    fix = (f"write the answers with this target first: draftsmith data generate --target {target_name or 'TARGET'} "
           f"--prompts PROMPTS --out FILE, then pass --dataset FILE (or train with data_mode=target)")
    meta = read_json(meta_path(path)) if meta_path(path).is_file() else None
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise ConfigError(f"{path} has no {META_SUFFIX} of `draftsmith data generate`, so nothing says the target "
                          f"wrote its answers; {fix}")
    recorded = meta.get("target", {})
    if not same_target(recorded, writer_identity(model, tokenizer, target_name)):
        raise ConfigError(f"{path} holds the answers of another target ({recorded.get('name_or_path')}); {fix}")
    return dict(recorded)


def _check_prompts(ids: Sequence[str], prompts: Sequence[Sequence[Mapping[str, str]]]) -> None:
    if len(ids) != len(prompts):
        raise ValueError(f"{len(ids)} ids for {len(prompts)} prompts")
    repeated = [pid for pid, n in Counter(ids).items() if n > 1]
    if repeated:
        dup = repeated[0]
        raise DataError(f"prompt id {dup!r} repeats; give every prompt its own id (or drop the repeats)")
    for pid, prompt in zip(ids, prompts):
        if not prompt or prompt[-1].get("role") != "user":
            raise DataError(f"prompt {pid} does not end on a user turn; drop its trailing assistant turn")


def _render(tokenizer, prompt: Sequence[Mapping[str, str]], pid: str) -> list[int]:
    """The prompt's token ids with the generation prompt; a prompt the chat template rejects is a DataError."""
    try:
        return build_prompt_ids(tokenizer, prompt)
    except DataError:
        raise
    except Exception as err:  # jinja raise_exception(), role-alternation checks, ...
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"the chat template rejected prompt {pid}: {reason}; drop or rewrite that prompt") from None


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def _progress_bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generating", unit="row", disable=not enabled, dynamic_ncols=True)


def _in_prompt_order(out: Path, ids: Sequence[str]) -> None:
    """Rewrite a finished file in prompt order (atomically), unless it already is."""
    rows = recover_rows(out)
    rank = {pid: i for i, pid in enumerate(ids)}
    ordered = sorted(rows, key=lambda r: rank[r["id"]])
    if [r["id"] for r in ordered] != [r["id"] for r in rows]:
        rewrite_rows(out, ordered)


# (batches of prompt ids, per-batch row seeds or None) -> (batch index, completions, seconds), batch by batch
Completer = Callable[[list[list[list[int]]], list[list[int] | None]], Iterator[tuple[int, list[list[int]], float]]]


def generate_answers(
    model,
    tokenizer,
    prompts: Sequence[Sequence[Mapping[str, str]]],
    out_path: str | os.PathLike,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    target_name: str | None = None,
    ids: Sequence[str] | None = None,
    source: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    on_batch: Callable[[dict], None] | None = None,
    completer: Completer | None = None,
    generator_name: str = "draftsmith",
) -> dict:
    """Answer every prompt with ``model`` into ``out_path`` (see the module docstring), resuming a file a killed
    run left. ``ids`` default to :func:`prompt_id` of each prompt; ``source`` names the prompt set in the meta;
    ``on_batch(stats)`` runs after every batch is on disk. Prompts too long for the model's positions with
    ``max_new_tokens`` more are skipped and counted. Returns the stats also written to the meta's progress.

    ``completer`` answers the batches instead of ``model`` (a serving engine's continuous batching:
    ``draftsmith data generate --engine vllm``); each run's generator is recorded in the meta."""
    check_settings(batch_size, max_new_tokens, temperature, top_p)
    ids = [prompt_id(p) for p in prompts] if ids is None else [str(i) for i in ids]
    _check_prompts(ids, prompts)
    settings = sampling_settings(temperature, top_p, seed, max_new_tokens)
    target = writer_identity(model, tokenizer, target_name)
    out, meta_file, done, old_meta = open_row_file(out_path, settings, target, overwrite, fmt=META_FORMAT)
    known = set(ids)
    strangers = [r["id"] for r in done if r["id"] not in known]
    if strangers:
        raise ConfigError(f"{out} holds {len(strangers)} rows (e.g. id {strangers[0]}) of prompts not in this prompt "
                          f"set (another --prompts or a smaller --limit?); {FIX}")
    done_ids = {r["id"] for r in done}

    pad_id, eos_ids = pad_token_id(tokenizer, model.config), eos_token_ids(tokenizer, model.config)
    positions = max_positions(model.config)
    if positions is not None and max_new_tokens >= positions:
        raise ConfigError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the target's "
                          f"{positions} positions; lower it")
    pending = [i for i, pid in enumerate(ids) if pid not in done_ids]
    prompt_ids = {i: _render(tokenizer, prompts[i], ids[i]) for i in pending}
    too_long = [i for i in pending if positions is not None and len(prompt_ids[i]) + max_new_tokens > positions]
    runnable = sorted(set(pending) - set(too_long))
    batches = [[runnable[j] for j in b] for b in length_batches([len(prompt_ids[i]) for i in runnable], batch_size)]

    old_progress = (old_meta or {}).get("progress", {})
    run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "batch_size": batch_size, "generator": generator_name,
           "rows": 0, "tokens": 0, "seconds": 0.0, "tokens_per_s": 0.0}
    totals = {"rows": len(done), "tokens": sum(int(r.get("num_tokens", 0)) for r in done),
              "seconds": float(old_progress.get("seconds", 0.0))}
    meta = {
        "format": META_FORMAT,
        "settings": settings,
        "sampling": "greedy (argmax)" if temperature == 0 else
        "per row: inverse CDF of temperature/top-p probabilities at uniforms from a CPU torch.Generator seeded "
        "with int(sha256_json(f'{seed}:{id}')[:16], 16) & (2**63 - 1)",
        "target": target,
        "prompts": {"source": source, "count": len(ids), "sha256": prompts_sha256(ids, prompts)},
        "draftsmith_version": __version__,
        "environment": environment(device=str(next(model.parameters()).device), threads=torch.get_num_threads(),
                                   dtype=str(next(model.parameters()).dtype).removeprefix("torch.")),
        "created": (old_meta or {}).get("created", run["started"]),
        "runs": [*(old_meta or {}).get("runs", []), run],
    }

    def stats() -> dict:
        finished = totals["rows"] + len(too_long) == len(ids)
        meta["progress"] = {**totals, "tokens_per_s": _rate(totals["tokens"], totals["seconds"]),
                            "prompts": len(ids), "too_long": len(too_long),
                            "too_long_ids": [ids[i] for i in too_long[:10]], "complete": finished}
        return {**meta["progress"], "out": str(out), "new_rows": run["rows"], "new_tokens": run["tokens"],
                "new_seconds": run["seconds"], "new_tokens_per_s": run["tokens_per_s"]}

    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch()
    stats()
    atomic_write_json(meta_file, meta)
    bar = _progress_bar(len(runnable), progress)

    def model_completer(prompt_batches, seeds_of):  # one left-padded generate per batch
        for b, batch_prompts in enumerate(prompt_batches):
            start = time.perf_counter()
            yield b, sample_completions(model, batch_prompts, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                                        eos_ids=eos_ids, temperature=temperature, top_p=top_p,
                                        row_seeds=seeds_of[b]), time.perf_counter() - start

    seeds_of = [[row_seed(seed, ids[i]) for i in batch] if temperature > 0 else None for batch in batches]
    answered = (completer or model_completer)([[prompt_ids[i] for i in batch] for batch in batches], seeds_of)
    try:
        for b, completions, seconds in answered:
            batch = batches[b]
            rows = [answer_row(ids[i], prompts[i], c, tokenizer, eos_ids) for i, c in zip(batch, completions)]
            append_rows(out, rows)
            tokens = sum(r["num_tokens"] for r in rows)
            for acc in (run, totals):
                acc["rows"] += len(rows)
                acc["tokens"] += tokens
                acc["seconds"] += seconds
            run["tokens_per_s"] = _rate(run["tokens"], run["seconds"])
            current = stats()
            atomic_write_json(meta_file, meta)
            bar.update(len(rows))
            bar.set_postfix_str(f"{run['tokens_per_s']:.1f} tokens/s", refresh=False)
            if on_batch is not None:
                on_batch(current)
    finally:
        bar.close()
        getattr(answered, "close", lambda: None)()  # stops an engine that is still answering
    if totals["rows"] + len(too_long) == len(ids):
        _in_prompt_order(out, ids)
    current = stats()
    atomic_write_json(meta_file, meta)
    return current
