"""``draftsmith eval``: a method against plain autoregressive decoding on Spec-Bench-format questions.

Examples::

    draftsmith eval --method draft --limit 20 --max-new-tokens 64 --compare hf --out runs/eval/report.json
    draftsmith eval --artefact runs/distillspec --questions mt_bench/question.jsonl
    draftsmith eval --method draft --check-distribution --temperature 0.7 --top-p 0.9
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from draftsmith.common.errors import ConfigError
from draftsmith.common.models import load_model, load_tokenizer, tokenizer_dir_for
from draftsmith.common.outputs import claim_output, prepare_output, write_failures
from draftsmith.common.registry import REGISTRY, default_method, eval_flags, get_method
from draftsmith.common.threads import parse_threads, torch_threads
from draftsmith.launch.engine_eval import add_engine_options
from draftsmith.launch.targets import (
    add_placement_options,
    load_target,
    placement,
    resolve_device,
    resolve_model_arg,
    tokenizer_source,
    zoo_model_dir,
)
from draftsmith.launch.zoo_cli import SIZES as ZOO_SIZE_NAMES

DEFAULT_OUT = "eval/report.json"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="measure tau, acceptance and speedup of a method against AR decoding (Spec-Bench metrics)",
        description="Run plain autoregressive decoding and a speculative method on the same prompts in the same "
        "process and report tau, acceptance rate, speedup, predicted speedup and greedy identity; or, with "
        "--check-distribution, test that speculative sampling keeps the target's distribution.",
    )
    g = p.add_argument_group("models")
    g.add_argument("--target", metavar="PATH", default=None,
                   help="target: a model directory, a .gguf file, a hub id or smollm2-135m (imported on first use, "
                        "drafting with the smollm2 zoo's draft); default: the built-in zoo's target")
    g.add_argument("--tokenizer", metavar="DIR", default=None, help="tokenizer directory (default: the target's, or the zoo's)")
    g.add_argument("--method", choices=REGISTRY.names(eval_method=True), default=None,
                   help="decoding method (default: draft); trained methods run from their --artefact")
    g.add_argument("--draft", metavar="PATH", default=None, help="draft model directory for --method draft (default: the zoo's draft)")
    g.add_argument("--artefact", metavar="DIR", default=None, help="a draftsmith artefact directory; the method comes from its manifest")
    g.add_argument("--allow-target-mismatch", action="store_true", help="run an artefact on a target it was not trained for")
    g.add_argument("--zoo", default="tiny", choices=ZOO_SIZE_NAMES, help="zoo size used for the defaults")
    g.add_argument("--home", metavar="DIR", default=None, help="DRAFTSMITH_HOME of the zoo (default ~/.cache/draftsmith)")
    add_placement_options(g)
    g.add_argument("--tree-attention", choices=("mask", "kernel"), default="mask",
                   help="tree steps: mask = the model's own attention under a 4-D mask (default); kernel = the Triton "
                        "tree-attention kernel on CUDA (sdpa elsewhere; draftsmith.kernels.tree_attention)")
    g.add_argument("--verify-padding", choices=("auto", "off"), default=None,
                   help="auto (default): pad a verification forward to the cheapest measured size at or above its "
                        "own where this machine runs that faster (CPU matrix kernels are not monotone in the rows); "
                        "off: never pad")
    g.add_argument("--threads", metavar="N", type=int, default=None,
                   help="torch CPU threads while evaluating (default: torch's; 1 is best for tiny models on a busy machine)")
    g = p.add_argument_group("questions and decoding")
    g.add_argument("--questions", metavar="FILE|SET", default=None,
                   help="Spec-Bench/MT-Bench question.jsonl[.gz], or a bundled set: dev (default: HumanEval + GSM8K, "
                        "324), broad (244 in 12 categories: writing, roleplay, reasoning, math, coding, extraction, "
                        "stem, humanities, summarization, qa, rag, translation) or openings (74 texts a base model "
                        "continues without the chat template)")
    g.add_argument("--limit", metavar="N", type=int, default=None, help="use the first N questions")
    g.add_argument("--per-category", metavar="N", type=int, default=None,
                   help="use the first N questions of every category (a stratified subset; --limit applies after it)")
    g.add_argument("--max-new-tokens", metavar="N", type=int, default=128, help="new tokens per answer (same for AR and the method)")
    g.add_argument("--temperature", metavar="T", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", metavar="P", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    g.add_argument("--top-k", metavar="K", type=int, default=0, help="top-k sampling (0 = off)")
    g.add_argument("--seed", metavar="S", type=int, default=0)
    g.add_argument("--warmup", metavar="N", type=int, default=1, help="unmeasured warm-up answers before timing")
    add_method_options(p)
    g = p.add_argument_group("output")
    g.add_argument("--compare", choices=["hf"], default=None, help="also run transformers' assisted generation and prompt lookup")
    g.add_argument("--out", metavar="FILE", default=None, help=f"report JSON path; .md and .png files go beside it (default {DEFAULT_OUT}); while it runs, "
                        "finished questions go to REPORT.partial.jsonl, and rerunning the same command after a kill "
                        "resumes from them")
    g.add_argument("--tensorboard", default=None, metavar="DIR", help="also log to TensorBoard in DIR")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_options(p.add_argument_group("serving engine"))
    g = p.add_argument_group("distribution check")
    g.add_argument("--check-distribution", action="store_true",
                   help="instead of timing, test that speculative sampling matches plain sampling (chi-square, p < 1e-3 fails)")
    g.add_argument("--samples", metavar="N", type=int, default=1000, help="samples per prompt and sampler for --check-distribution")
    g.add_argument("--positions", metavar="N", type=int, default=3, help="generated positions tested by --check-distribution")
    g.add_argument("--prompts", metavar="N", type=int, default=2, help="questions (first turns) used by --check-distribution")
    p.set_defaults(run=run)


def add_method_options(p: argparse.ArgumentParser) -> None:
    """One flag per evaluation option the registered methods declare (``MethodSpec.eval_options``); each defaults to
    None (not given: the artefact's setting, else the method's declared default)."""
    g = p.add_argument_group("method options (declared by each method's registry entry)")
    for name, merged in eval_flags().items():
        opt = merged.option
        g.add_argument(opt.cli_flag, dest=name, type=opt.type, default=None, choices=merged.choices,
                       metavar=opt.metavar, help=merged.help())


def method_options(args: argparse.Namespace) -> dict:
    """The evaluation options given on the command line (None = not given)."""
    return {name: getattr(args, name, None) for name in eval_flags()}


# ---------------------------------------------------------------------------------------------- loading


def threads_context(value):
    """``--threads N`` as a context (torch's own threads when not given)."""
    if value is None:
        return contextlib.nullcontext()
    return torch_threads(parse_threads(value, "--threads", "pass --threads N with N >= 1, or leave it out"))


def artefact_target(artefact: str | None, target: str | None) -> str | None:
    """The target a command loads: ``--target`` when given; else, for ``--artefact``, the target its manifest names
    when that can be had here (an existing directory or file, or a named real target such as ``smollm2-135m``);
    else None, the zoo's."""
    if target is not None or artefact is None:
        return target
    from draftsmith.data.zoo import zoo_size_for_target
    from draftsmith.inference.artefacts.reader import load_manifest_json, validate_manifest

    path, manifest = load_manifest_json(Path(artefact))
    validate_manifest(manifest, path)  # its files are hashed once, when the artefact loads
    name = (manifest.get("target") or {}).get("name_or_path")
    if name and (Path(name).exists() or zoo_size_for_target(name) is not None):
        return str(name)
    return None


@contextlib.contextmanager
def _short_warnings() -> Iterator[None]:
    """Show our warnings as one ``warning: ...`` line on stderr while the command runs."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("default", UserWarning)
        warnings.showwarning = show
        yield


def command_line(args: argparse.Namespace) -> str:
    """The ``draftsmith eval`` command reproducing ``args`` (options that differ from the defaults)."""
    parser = argparse.ArgumentParser(add_help=False)
    sub = parser.add_subparsers()
    add_parser(sub)
    defaults = vars(sub.choices["eval"].parse_args([]))
    parts = ["draftsmith", "eval"]
    for dest, default in defaults.items():
        value = getattr(args, dest, default)
        if dest == "run" or value == default:
            continue
        flag = "--" + dest.replace("_", "-")
        parts += [flag] if isinstance(value, bool) else [flag, str(value)]
    return shlex.join(parts)


# ---------------------------------------------------------------------------------------------- setup


def setup(args: argparse.Namespace):
    """Load target and tokenizer, and build the method's proposer factory through the method registry."""
    import torch

    from draftsmith.inference.methods import ProposerContext

    if args.artefact and args.method:
        raise ConfigError("pass either --artefact (the method comes from its manifest) or --method, not both")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.draft_length is not None and args.draft_length < 1:
        raise ConfigError(f"--draft-length must be at least 1, got {args.draft_length}")
    device, args.dtype = placement(args)  # auto: bfloat16 where native, else float32 (as reported)
    target_name = artefact_target(args.artefact, args.target)
    attention = None
    if getattr(args, "tree_attention", "mask") == "kernel":
        from draftsmith.kernels.tree_attention import register_tree_attention

        attention = register_tree_attention()
    target_dir, target, tokenizer = load_target(target_name, args.tokenizer, args.zoo, home=args.home, dtype=args.dtype,
                                                device=device, attn_implementation=attention)
    own_zoo = default_draft_zoo(args, target_name)
    zoo_draft = zoo_model_dir(own_zoo or args.zoo, "draft", args.home) if own_zoo or target_name is None else None
    info = {"target": str(target_dir), "tokenizer": tokenizer_source(target_dir, args.tokenizer), "draft": None,
            "draft_model": None, "manifest": None}
    options = method_options(args)
    if args.draft_length is not None and args.draft_length_mode is None:
        options["draft_length_mode"] = "fixed"  # --draft-length K drafts K tokens, whatever policy an artefact was tuned to

    if args.artefact:
        from draftsmith.inference.artefacts.manifest import adapted_target, check_target, read_manifest
        from draftsmith.inference.methods import load_artefact

        manifest = read_manifest(args.artefact)
        check_target(manifest, target, tokenizer, args.allow_target_mismatch)  # the given target, whatever the kind
        verified = adapted_target(args.artefact, manifest, target)  # target, or target + LoRA
        proposer, manifest = load_artefact(args.artefact, verified, tokenizer, manifest=manifest,
                                           allow_target_mismatch=args.allow_target_mismatch, **options)
        info.update(method=manifest["method"], draft=str(args.artefact), manifest=manifest,
                    draft_model=getattr(proposer, "draft_model", None), factory=lambda: proposer,
                    original_target=target if verified is not target else None)
        return verified, tokenizer, info

    method = args.method or default_method()
    spec = get_method(method)
    draft_dir = Path(resolve_model_arg(args.draft, "--draft", "draft")) if args.draft is not None else zoo_draft
    if "draft" in spec.models and draft_dir is None:
        raise ConfigError(f"--method {method} needs --draft PATH when --target is given (a draft sharing its tokenizer)")
    if draft_dir is not None and ("draft" in spec.models or args.compare == "hf"):
        info["draft_model"] = load_draft(target, tokenizer, draft_dir, args.dtype, device)
        info["draft"] = str(draft_dir)
    ctx = ProposerContext(target_model=target, method=method, tokenizer=tokenizer, options=options,
                          draft_model=info["draft_model"] if "draft" in spec.models else None)
    build = spec.proposer
    info.update(method=method, factory=lambda: build(ctx))
    torch.manual_seed(args.seed)
    return target, tokenizer, info


def default_draft_zoo(args: argparse.Namespace, target_name: str | None) -> str | None:
    """The zoo size whose draft ``--method draft`` runs by default on a named real target (``smollm2-135m``: the
    smollm2 zoo, built on first use), else ``None``: an artefact brings its own drafter, ``--draft`` names one, and
    other methods draft without a separate model."""
    from draftsmith.data.zoo import zoo_size_for_target

    if args.artefact or args.draft is not None or "draft" not in get_method(args.method or default_method()).models:
        return None
    return zoo_size_for_target(target_name)


def load_draft(target, tokenizer, draft_dir: Path, dtype: str, device: str):
    """The draft model, refused unless it tokenizes like the target."""
    from draftsmith.inference.proposers.draft_model import check_same_tokenizer

    draft = load_model(draft_dir, dtype, device, what="draft").eval()
    draft_tok_dir = tokenizer_dir_for(draft_dir)
    draft_tok = load_tokenizer(draft_tok_dir, "draft tokenizer") if draft_tok_dir is not None else None
    check_same_tokenizer(target, draft, tokenizer, draft_tok, target_name=str(target.config._name_or_path),
                         draft_name=str(draft_dir))
    return draft


# ---------------------------------------------------------------------------------------------- run


def report_path(args: argparse.Namespace) -> Path:
    """Where the command writes its report: ``--out``, else the default of the report it writes."""
    if args.out:
        return Path(args.out)
    return Path(DEFAULT_OUT).with_name("distribution.json") if args.check_distribution else Path(DEFAULT_OUT)


@contextlib.contextmanager
def claim_report(args: argparse.Namespace) -> Iterator[None]:
    """The report's path (and ``--tensorboard``) checked and locked before any model loads; ``--device`` and the
    models' paths first, so a bad one leaves nothing behind."""
    resolve_device(args.device)
    for value, flag, role in ((args.target, "--target", "target"), (args.draft, "--draft", "draft")):
        if value is not None:  # an empty one is refused, not taken for "the zoo's"
            resolve_model_arg(value, flag, role, check_hub=False)
    if args.tokenizer:
        tokenizer_source("", args.tokenizer)
    if args.tensorboard:
        prepare_output(args.tensorboard, "--tensorboard", "dir")
    with claim_output(report_path(args), "--out", example="report.json"):
        yield


def run(args: argparse.Namespace) -> int:
    from draftsmith.inference.core.sampling import SamplingParams
    from draftsmith.inference.evaluation.questions import read_questions
    from draftsmith.launch.engine_eval import refuse_engine_options_without_engine

    refuse_engine_options_without_engine(args)
    if args.engine is not None:  # vLLM as the backend (launch/engine_eval.py)
        from draftsmith.launch.engine_eval import run_engine_eval

        with _short_warnings(), threads_context(args.threads), claim_report(args):
            return run_engine_eval(args, setup, run_eval, method_options(args), DEFAULT_OUT)
    with _short_warnings(), threads_context(args.threads), claim_report(args):
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        questions = read_questions(args.questions, limit=args.limit, per_category=args.per_category)
        target, tokenizer, info = setup(args)
        if args.check_distribution:
            return run_distribution_check(args, target, tokenizer, info, questions, sampling)
        return run_eval(args, target, tokenizer, info, questions, sampling)


def journal_settings(args: argparse.Namespace) -> dict:
    """What an interrupted evaluation must have been run with to be resumed: every option but where the report goes
    and how progress shows."""
    skip = {"run", "out", "no_progress", "tensorboard"}
    return {k: v if v is None or isinstance(v, bool | int | float | str) else str(v)
            for k, v in sorted(vars(args).items()) if k not in skip}


def run_eval(args, target, tokenizer, info, questions, sampling, engine_steps: bool = False) -> int:
    from draftsmith.inference.evaluation.evaluator import evaluate
    from draftsmith.inference.evaluation.journal import EvalJournal, journal_path
    from draftsmith.inference.evaluation.questions import resolve_questions_path
    from draftsmith.inference.evaluation.report import summary_table, write_report

    extra = {}
    if info["manifest"] is not None:
        m = info["manifest"]
        extra["artefact"] = {k: m.get(k) for k in ("method", "draftsmith_version", "created", "target", "proposer", "metrics",
                                                   "tuning")}
    out = args.out or DEFAULT_OUT
    journal = EvalJournal(journal_path(out), journal_settings(args))  # rerunning the command resumes a killed run
    if journal.path.exists():
        print(f"resuming from {journal.path}: questions answered there are kept, the rest are run", file=sys.stderr)
    with write_failures(out, journal.kept):  # a full disk or a read-only directory: one line, the journal kept
        report = evaluate(target, tokenizer, info["method"], info["factory"], questions,
                          max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed, warmup=args.warmup,
                          compare_hf=args.compare == "hf", draft_model=info["draft_model"], target_name=info["target"],
                          draft_name=info["draft"], question_file=str(resolve_questions_path(args.questions)),
                          tensorboard_dir=args.tensorboard, progress=not args.no_progress,
                          command=command_line(args), extra=extra or None,
                          original_model=info.get("original_target"), journal=journal,
                          verify_padding=args.verify_padding != "off", engine_steps=engine_steps)
        paths = write_report(report, out)
        journal.remove()
    print(summary_table(report))
    print(f"report: {paths['json']} (+ {paths['markdown'].name} and plots)")
    return 0


def run_distribution_check(args, target, tokenizer, info, questions, sampling) -> int:
    import json

    from draftsmith.common.io import atomic_write_text
    from draftsmith.inference.core.sampling import SamplingParams
    from draftsmith.inference.evaluation.distribution import check_distribution
    from draftsmith.inference.evaluation.runs import chat_prompt_ids

    notes = []
    if sampling.greedy:
        sampling = SamplingParams(temperature=1.0, top_k=args.top_k, top_p=args.top_p)
        notes.append("--temperature 0 is greedy; the distribution check ran at temperature 1.0")
    from draftsmith.inference.core.adapter import ModelAdapter

    max_prompt = max(1, ModelAdapter(target).max_positions - args.positions)
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": q.turns[0]}])[-max_prompt:] for q in questions[: args.prompts]]
    eos = tokenizer.eos_token_id
    result = check_distribution(
        target, info["factory"], prompts, sampling, num_samples=args.samples, num_positions=args.positions,
        seed=args.seed, eos_token_ids=(eos,) if eos is not None else (), progress=not args.no_progress,
    )
    result.notes.extend(notes)
    out = Path(args.out) if args.out else Path(DEFAULT_OUT).with_name("distribution.json")
    payload = result.to_dict() | {"method": info["method"], "target": info["target"], "draft": info["draft"],
                                  "command": command_line(args)}
    with write_failures(out, "nothing: the check's samples are drawn again by a rerun"):
        atomic_write_text(out, json.dumps(payload, indent=1) + "\n")
    for note in result.notes:
        print(f"note: {note}")
    print(f"test: {result.test}")
    print(result.summary())
    print(f"result: {out}")
    return 0 if result.passed else 1
