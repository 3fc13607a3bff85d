"""``draftsmith data``: training data made with the target.

    draftsmith data generate --target PATH --prompts corpus --out runs/sd/answers.jsonl --limit 2000
    draftsmith data generate --target PATH --prompts broad --out broad.jsonl --temperature 0.7 --top-p 0.9
    draftsmith data generate --target PATH --prompts data.jsonl --out answers.jsonl --sequential   # one at a time
    draftsmith data generate --target PATH --prompts corpus --prompts mine.jsonl --limit 2000 --out answers.jsonl
    draftsmith data generate --target PATH --prompts corpus --prompts mine.jsonl --limit 2000 --limit all --out a.jsonl
    draftsmith data prompts --target PATH --out runs/sd/prompts.jsonl --count 2000
    draftsmith data jacobi --target PATH --prompts corpus --out runs/traj/train.jsonl --block 16 --limit 500

``generate`` answers every prompt with the target (self-distillation, :mod:`draftsmith.data.self_distill`):
left-padded batches with a KV cache, greedy or sampled, into chat rows (jsonl) with ``<out>.meta.json`` beside
them; ``--prompts`` may repeat (the sets are answered together; one ``--limit`` applies to each, or
give one per set in order, ``all`` for no cut). ``prompts`` has
the target write user requests itself (Magpie, :mod:`draftsmith.data.synthetic_prompts`), prompts for ``generate``
that cover what the target's users ask rather than what the corpus holds. ``jacobi`` collects the target's greedy Jacobi trajectories (CLLM's training data,
:mod:`draftsmith.data.jacobi`): per block, every state from a guess drawn from the context to the fixed point.
Killed, either command continues where it stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from pathlib import Path

from draftsmith.common.errors import ConfigError
from draftsmith.common.outputs import claim_output, write_failures
from draftsmith.common.registry import method_commands
from draftsmith.common.threads import parse_threads, torch_threads

PROMPT_SOURCES = "a .jsonl/.json/.parquet chat dataset (messages, ShareGPT or Alpaca rows; the last answer is " \
                 "dropped), a Spec-Bench question.jsonl[.gz] or bundled set (dev, broad: first turns), or corpus " \
                 "(the user turns of the shipped corpus' train split)"


def _target_and_out(a) -> None:
    """The options every ``draftsmith data`` command shares: the target and the output file."""
    a.add_argument("--target", metavar="PATH_OR_NAME", required=True, help="target model directory, hub id or name")
    a.add_argument("--tokenizer", metavar="DIR", default=None, help="tokenizer directory (default: the target's)")
    a.add_argument("--out", metavar="FILE", required=True, help="output .jsonl; FILE.meta.json goes beside it")


def target_and_prompts(a) -> None:
    """The options of the commands that run the target on prompts: the target, the output file and the prompts."""
    _target_and_out(a)
    a.add_argument("--prompts", metavar="FILE|SET", required=True, action="append",
                   help=PROMPT_SOURCES + "; repeat it to answer several sets together")
    a.add_argument("--limit", metavar="N|all", type=_limit, action="append", default=None,
                   help="the first N prompts only (corpus: N with an equal share from every source); one value cuts "
                        "every --prompts set, or repeat it to give one per set in order (all: no cut)")


def machine_options(a, action) -> None:
    """The device, dtype, threads and progress options, and the function that runs the action ``a``."""
    from draftsmith.launch.targets import add_placement_options

    add_placement_options(a)
    a.add_argument("--threads", metavar="N", default=None, help="torch CPU threads (default: torch's)")
    a.add_argument("--no-progress", action="store_true", help="no progress bar")
    a.set_defaults(run=run, action=action)


def _sampling(a, temperature: float, top_p: float, unit: str) -> None:
    """The sampling and resumption options of the commands that write sampled row files."""
    a.add_argument("--temperature", metavar="T", type=float, default=temperature,
                   help=f"sampling temperature, 0 = greedy (default {temperature:g})")
    a.add_argument("--top-p", metavar="P", type=float, default=top_p,
                   help=f"nucleus sampling mass, 1 = off (default {top_p:g})")
    a.add_argument("--seed", metavar="S", type=int, default=0, help=f"sampling seed (each {unit} draws from its own)")
    a.add_argument("--overwrite", action="store_true", help="start the output again instead of resuming it")


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="make training data with the target (self-distillation)",
                       description=__doc__.split("\n\n")[0])
    names = ["generate", "prompts", *method_commands("data_commands")]
    actions = p.add_subparsers(dest="data_command", required=True, metavar="{" + ",".join(names) + "}")
    g = actions.add_parser("generate", help="answer a prompt set with the target into chat rows (resumable)",
                           description="Regenerate the answers of a prompt set with the target: batched, greedy or "
                                       "sampled, resumable (rerun the same command after a kill).")
    target_and_prompts(g)
    g.add_argument("--batch-size", metavar="B", type=int, default=16, help="sequences per forward (default 16)")
    g.add_argument("--sequential", action="store_true", help="one sequence at a time (--batch-size 1), for comparison")
    g.add_argument("--max-new-tokens", metavar="N", type=int, default=256, help="longest answer in tokens")
    g.add_argument("--engine", choices=("vllm",), default=None,
                   help="answer through vLLM's continuous batching in its own environment (`make engine`); the same "
                        "file, resumable the same way; --batch-size prompts per streamed batch (use a few hundred)")
    g.add_argument("--engine-python", metavar="PATH", default=None,
                   help="--engine: the vLLM environment's python (default $DRAFTSMITH_VLLM_PYTHON, else make engine's)")
    _sampling(g, temperature=0.0, top_p=1.0, unit="row")
    machine_options(g, run_generate)
    w = actions.add_parser("prompts", help="have the target write user prompts itself (Magpie; resumable)",
                           description="Sample user requests from an instruction-tuned target given only its chat "
                                       "template up to a user turn (Magpie, arXiv:2406.08464): prompts for `data "
                                       "generate` that cover what the target was aligned on. Unfinished, short and "
                                       "repeated requests are dropped. Resumable (rerun the same command).")
    _target_and_out(w)
    w.add_argument("--count", metavar="N", type=int, required=True, help="prompts to keep")
    w.add_argument("--batch-size", metavar="B", type=int, default=16, help="attempts per forward (default 16)")
    w.add_argument("--max-new-tokens", metavar="N", type=int, default=96,
                   help="longest request in tokens; a longer one is dropped as unfinished (default 96)")
    w.add_argument("--min-words", metavar="N", type=int, default=3, help="shortest request kept (default 3 words)")
    w.add_argument("--openers", metavar="SET|FILE", default=None,
                   help="start each request with one of these first words, in turn, to cover kinds of task the target "
                        "rarely writes unprompted: 'tasks' (built in: 12 kinds, writing to translation) or a file, "
                        "one opener per line (default: none, plain Magpie)")
    _sampling(w, temperature=1.0, top_p=0.95, unit="attempt")
    machine_options(w, run_prompts)
    for module in method_commands("data_commands").values():  # the methods' own (CLLM's jacobi)
        importlib.import_module(module).add_parser(actions)


# ---------------------------------------------------------------------------------------------------- prompts


def _questions(spec: str, limit: int | None) -> tuple[list[str], list[list[dict]]]:
    from draftsmith.inference.evaluation.questions import read_questions

    questions = read_questions(spec, limit=limit)
    return [str(q.question_id) for q in questions], [[{"role": "user", "content": q.turns[0]}] for q in questions]


def _is_question_file(path: Path) -> bool:
    """A Spec-Bench question file: gzip, or a first row with ``turns``."""
    from draftsmith.data.datasets import read_rows

    if path.suffix.lower() == ".gz":
        return True
    first = next((row for _, row in read_rows(path) if isinstance(row, dict)), None)
    return first is not None and "turns" in first


def _limit(text: str) -> int | None:
    """One ``--limit``: a positive count, or ``all`` (None: no cut)."""
    if text.strip().lower() == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of prompts or 'all', got {text!r}") from None


def per_set_limits(limits: int | None | list[int | None], count: int) -> list[int | None]:
    """The cut of each of ``count`` prompt sets: one ``--limit`` (or none) for all, else exactly one per set."""
    if limits is None or isinstance(limits, int):
        return [limits] * count
    if len(limits) == 1:
        return list(limits) * count
    if len(limits) != count:
        raise ConfigError(f"{len(limits)} --limit values for {count} --prompts sets; give one --limit for all sets "
                          f"or one per --prompts, in the same order ('all' for no cut)")
    return list(limits)


def load_prompt_sets(specs: list[str], limit: int | None | list[int | None] = None
                     ) -> tuple[list[str], list[list[dict]], str]:
    """``(ids, prompts, source)`` of every ``--prompts`` set in turn (each cut to its ``limit``, see
    :func:`per_set_limits`); a prompt two sets share is answered once, and the sources are joined with ``+``."""
    sets = [load_prompts(spec, n) for spec, n in zip(specs, per_set_limits(limit, len(specs)))]
    if len(sets) == 1:
        return sets[0]
    from draftsmith.data.self_distill import unique_prompts

    ids, prompts, repeats = unique_prompts([i for s in sets for i in s[0]], [p for s in sets for p in s[1]])
    if repeats:
        print(f"note: {repeats} prompts appear in more than one --prompts set and are answered once", file=sys.stderr)
    return ids, prompts, "+".join(s[2] for s in sets)


def load_prompts(spec: str, limit: int | None = None) -> tuple[list[str], list[list[dict]], str]:
    """``(ids, prompts, source)`` of ``--prompts``: question ids for question sets, content ids otherwise (a
    repeated prompt is kept once); the first ``limit`` prompts."""
    from draftsmith.data.corpus import QUESTION_SETS
    from draftsmith.data.self_distill import corpus_prompts, dataset_prompts, prompt_id, unique_prompts

    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    path = Path(spec)
    if spec == "corpus" and not path.exists():
        prompts, source = corpus_prompts("train", limit), "corpus:train"
    elif (spec in QUESTION_SETS and not path.exists()) or (path.is_file() and _is_question_file(path)):
        ids, prompts = _questions(spec, limit)
        return ids, prompts, f"questions:{spec}"
    else:
        prompts, report = dataset_prompts(path)
        if report.skipped:
            print(f"warning: {report.summary()}", file=sys.stderr)
        source = str(path)
    ids, prompts, repeats = unique_prompts([prompt_id(p) for p in prompts], prompts)
    if repeats:
        print(f"note: {repeats} repeated prompts in {source} are answered once", file=sys.stderr)
    return ids[:limit], prompts[:limit], source


# -------------------------------------------------------------------------------------------------------- run


def summary_line(stats: dict) -> str:
    line = (f"{stats['out']}: {stats['rows']} rows ({stats['new_rows']} new), {stats['new_tokens']} tokens in "
            f"{stats['new_seconds']:.1f} s, {stats['new_tokens_per_s']:.1f} tokens/s")
    if stats["too_long"]:
        line += f"; {stats['too_long']} prompts too long for the target skipped"
    return line


POSITIVE = ("batch_size", "max_new_tokens", "count", "block")  # the counts every data command refuses below 1


def check_numbers(args: argparse.Namespace) -> None:
    """The command's counts, sampling settings, device and models' paths, refused in one line before anything
    loads or is written."""
    from draftsmith.data.row_files import check_settings
    from draftsmith.launch.targets import resolve_device, resolve_model_arg, tokenizer_source

    for name in POSITIVE:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if hasattr(args, "temperature") and hasattr(args, "top_p"):
        check_settings(getattr(args, "batch_size", 1), getattr(args, "max_new_tokens", 1), args.temperature, args.top_p)
    resolve_device(args.device)
    resolve_model_arg(args.target, "--target", check_hub=False)
    if args.tokenizer:
        tokenizer_source("", args.tokenizer)


def rows_kept(out) -> str:
    """What a failed write leaves of a row file (for its one-line error): its complete rows, resumed by a rerun."""
    try:
        with open(out, "rb") as fh:
            rows = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        rows = 0
    return f"the {rows} complete rows in {out}: rerun the same command to resume"


def run(args: argparse.Namespace) -> int:
    check_numbers(args)
    threads = contextlib.nullcontext() if args.threads is None else torch_threads(
        parse_threads(args.threads, "--threads", "pass --threads N with N >= 1, or leave it out"))
    with threads, claim_output(args.out, "--out", example="answers.jsonl") as out:
        args.out = str(out)  # ~ expanded
        with write_failures(out, lambda: rows_kept(out)):
            return args.action(args)


def load_data_target(args: argparse.Namespace):
    """The target model (on ``--device``, in ``--dtype``) and its tokenizer."""
    from draftsmith.launch.targets import load_target, placement

    device, args.dtype = placement(args)  # auto: bfloat16 where native, else float32
    _, model, tokenizer = load_target(args.target, args.tokenizer, dtype=args.dtype, device=device)
    return model, tokenizer


def run_generate(args: argparse.Namespace) -> int:
    from draftsmith.data.self_distill import generate_answers
    from draftsmith.launch.engine_eval import refuse_engine_options_without_engine

    refuse_engine_options_without_engine(args)
    batch_size = 1 if args.sequential else args.batch_size
    completer, generator = None, "draftsmith"
    if args.engine is not None:
        from draftsmith.inference.engines.environment import engine_python, engine_versions

        python = engine_python(args.engine_python)  # refused before the target loads when missing
        generator = f"vllm {engine_versions(python)['vllm']}"
    ids, prompts, source = load_prompt_sets(args.prompts, args.limit)
    model, tokenizer = load_data_target(args)
    if args.engine is not None:
        from draftsmith.inference.engines.generate import engine_completer
        from draftsmith.launch.targets import tokenizer_source

        target = str(model.config._name_or_path)
        completer = engine_completer(python, target, tokenizer_source(target, args.tokenizer),
                                     max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                     top_p=args.top_p, dtype=args.dtype, threads=args.threads and int(args.threads),
                                     log=Path(str(args.out) + ".engine.log"))
    stats = generate_answers(model, tokenizer, prompts, args.out, ids=ids, source=source, batch_size=batch_size,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                             seed=args.seed, target_name=str(args.target), overwrite=args.overwrite,
                             progress=not args.no_progress, completer=completer, generator_name=generator)
    print(summary_line(stats))
    return 0


def run_prompts(args: argparse.Namespace) -> int:
    from draftsmith.data.synthetic_prompts import resolve_openers, synthesize_prompts

    openers = resolve_openers(args.openers)
    model, tokenizer = load_data_target(args)
    stats = synthesize_prompts(model, tokenizer, args.out, count=args.count, batch_size=args.batch_size,
                               max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                               seed=args.seed, min_words=args.min_words, openers=openers,
                               target_name=str(args.target),
                               overwrite=args.overwrite, progress=not args.no_progress)
    dropped = ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in stats["dropped"].items() if n) or "none"
    print(f"{stats['out']}: {stats['kept']} prompts of {stats['attempts']} attempts (dropped: {dropped}), "
          f"{stats['tokens']} tokens in {stats['seconds']:.1f} s, {stats['tokens_per_s']:.1f} tokens/s")
    if not stats["complete"]:
        print(f"warning: only {stats['kept']} of {args.count} prompts after {stats['attempts']} attempts; the target "
              "repeats itself: raise --temperature or lower --count", file=sys.stderr)
    return 0
