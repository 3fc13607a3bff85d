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

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.inference.draft_length import DEFAULT_CONFIDENCE_THRESHOLD

METHODS = ("ar", "draft", "pld")
DTYPES = ("float32", "bfloat16", "float16", "auto")
DEFAULT_OUT = "eval/report.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="measure tau, acceptance and speedup of a method against AR decoding (Spec-Bench metrics)",
        description="Run plain autoregressive decoding and a speculative method on the same prompts in the same "
        "process and report tau, acceptance rate, speedup, predicted speedup and greedy identity; or, with "
        "--check-distribution, test that speculative sampling keeps the target's distribution.",
    )
    g = p.add_argument_group("models")
    g.add_argument("--target", metavar="PATH", default=None, help="target model directory (default: the built-in zoo's target)")
    g.add_argument("--tokenizer", metavar="DIR", default=None, help="tokenizer directory (default: the target's, or the zoo's)")
    g.add_argument("--method", choices=METHODS, default=None, help="decoding method (default: draft)")
    g.add_argument("--draft", metavar="PATH", default=None, help="draft model directory for --method draft (default: the zoo's draft)")
    g.add_argument("--artefact", metavar="DIR", default=None, help="a draftsmith artefact directory; the method comes from its manifest")
    g.add_argument("--allow-target-mismatch", action="store_true", help="run an artefact on a target it was not trained for")
    g.add_argument("--zoo", default="tiny", choices=["tiny", "small"], help="zoo size used for the defaults")
    g.add_argument("--home", metavar="DIR", default=None, help="DRAFTSMITH_HOME of the zoo (default ~/.cache/draftsmith)")
    g.add_argument("--dtype", default="float32", choices=DTYPES, help="weights dtype")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    g.add_argument("--threads", metavar="N", type=int, default=None,
                   help="torch CPU threads while evaluating (default: torch's; 1 is best for tiny models on a busy machine)")
    g = p.add_argument_group("questions and decoding")
    g.add_argument("--questions", metavar="FILE", default=None, help="Spec-Bench/MT-Bench question.jsonl[.gz] (default: bundled dev prompts)")
    g.add_argument("--limit", metavar="N", type=int, default=None, help="use the first N questions")
    g.add_argument("--max-new-tokens", metavar="N", type=int, default=128, help="new tokens per answer (same for AR and the method)")
    g.add_argument("--temperature", metavar="T", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", metavar="P", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    g.add_argument("--top-k", metavar="K", type=int, default=0, help="top-k sampling (0 = off)")
    g.add_argument("--seed", metavar="S", type=int, default=0)
    g.add_argument("--warmup", metavar="N", type=int, default=1, help="unmeasured warm-up answers before timing")
    g.add_argument("--draft-length", metavar="K", type=int, default=None, help="draft tokens per step (default 4, or the artefact's)")
    g.add_argument("--draft-length-mode", choices=["fixed", "heuristic", "leviathan"], default=None,
                   help="fixed, grow/shrink heuristic, or Leviathan's expected-speedup optimum (default fixed)")
    g.add_argument("--draft-confidence", metavar="P", type=float, default=None,
                   help="draft model: stop a draft after a token the draft gives probability < P "
                        f"(default {DEFAULT_CONFIDENCE_THRESHOLD}, or the artefact's; 0 = always draft --draft-length tokens)")
    g.add_argument("--pld-tokens", metavar="N", type=int, default=10, help="prompt lookup: tokens copied per step")
    g.add_argument("--pld-max-ngram", metavar="N", type=int, default=3, help="prompt lookup: longest n-gram matched")
    g = p.add_argument_group("output")
    g.add_argument("--compare", choices=["hf"], default=None, help="also run transformers' assisted generation and prompt lookup")
    g.add_argument("--out", metavar="FILE", default=None, help=f"report JSON path; .md and .png files go beside it (default {DEFAULT_OUT})")
    g.add_argument("--tensorboard", default=None, metavar="DIR", help="also log to TensorBoard in DIR")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("distribution check")
    g.add_argument("--check-distribution", action="store_true",
                   help="instead of timing, test that speculative sampling matches plain sampling (chi-square, p < 1e-3 fails)")
    g.add_argument("--samples", metavar="N", type=int, default=1000, help="samples per prompt and sampler for --check-distribution")
    g.add_argument("--positions", metavar="N", type=int, default=3, help="generated positions tested by --check-distribution")
    g.add_argument("--prompts", metavar="N", type=int, default=2, help="questions (first turns) used by --check-distribution")
    p.set_defaults(run=run)


# ---------------------------------------------------------------------------------------------- loading


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name} requested but CUDA is not available: use --device cpu")
    return name


def resolve_dtype(name: str):
    import torch

    return "auto" if name == "auto" else getattr(torch, name)


def load_model(path: str | Path, what: str, dtype, device: str):
    """A causal LM from a Hugging Face directory, in eval mode; one-line errors."""
    import transformers

    path = Path(path)
    if not (path / "config.json").is_file():
        raise DraftsmithError(f"{what} {path} is not a model directory (no config.json): pass a Hugging Face model directory")
    try:
        with _quiet():
            model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DraftsmithError(f"cannot load the {what} from {path}: {first}") from None
    return model.to(device).eval()


def has_tokenizer(path: Path) -> bool:
    return any((path / f).is_file() for f in TOKENIZER_FILES)


def load_tokenizer(path: str | Path, what: str = "tokenizer"):
    import transformers

    try:
        with _quiet():
            return transformers.AutoTokenizer.from_pretrained(Path(path))
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DraftsmithError(f"cannot load the {what} from {path}: {first} (pass --tokenizer DIR)") from None


def tokenizer_dir_for(model_dir: Path) -> Path | None:
    """The model's own tokenizer, else a zoo-style sibling ``tokenizer/`` directory."""
    if has_tokenizer(model_dir):
        return model_dir
    sibling = model_dir.parent / "tokenizer"
    return sibling if has_tokenizer(sibling) else None


def zoo_paths(size: str, home: str | None) -> Path:
    try:
        from draftsmith.data.zoo import ensure_zoo
    except ImportError:
        raise DraftsmithError("the built-in model zoo is not available in this install: pass --target PATH") from None
    return Path(ensure_zoo(size, home=home))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    import torch

    if n is None:
        yield
        return
    if n < 1:
        raise ConfigError(f"--threads must be at least 1, got {n}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    """Load target, tokenizer and the method's proposer factory from the arguments."""
    import torch

    from draftsmith.inference.draft_length import DraftLengthPolicy
    from draftsmith.inference.proposers.draft_model import DraftModelProposer, check_same_tokenizer
    from draftsmith.inference.proposers.prompt_lookup import PromptLookupProposer

    if args.artefact and args.method:
        raise ConfigError("pass either --artefact (the method comes from its manifest) or --method, not both")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.draft_length is not None and args.draft_length < 1:
        raise ConfigError(f"--draft-length must be at least 1, got {args.draft_length}")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype)
    method = args.method or ("draft" if not args.artefact else None)
    zoo = None
    if args.target is None:
        zoo = zoo_paths(args.zoo, args.home)
        target_dir = zoo / "target"
    else:
        target_dir = Path(args.target)
    target = load_model(target_dir, "target", dtype, device)
    tok_dir = Path(args.tokenizer) if args.tokenizer else tokenizer_dir_for(target_dir)
    if tok_dir is None:
        raise DraftsmithError(f"the target directory {target_dir} holds no tokenizer: pass --tokenizer DIR")
    tokenizer = load_tokenizer(tok_dir)
    info = {"target": str(target_dir), "tokenizer": str(tok_dir), "draft": None, "draft_model": None, "manifest": None}

    if args.artefact:
        from draftsmith.inference.artefact import load_artefact

        options = {"draft_length": args.draft_length, "draft_length_mode": args.draft_length_mode,
                   "confidence_threshold": args.draft_confidence}
        proposer, manifest = load_artefact(
            args.artefact, target, tokenizer, allow_target_mismatch=args.allow_target_mismatch,
            **{k: v for k, v in options.items() if v is not None},
        )
        info.update(method=manifest["method"], draft=str(args.artefact), manifest=manifest)
        if getattr(proposer, "name", "") == "draft" and hasattr(proposer, "adapter"):
            info["draft_model"] = proposer.adapter.model
        info["factory"] = lambda: proposer
        return target, tokenizer, info

    policy_kwargs = {"length": args.draft_length or 4, "mode": args.draft_length_mode or "fixed"}
    policy_kwargs["max_length"] = max(16, policy_kwargs["length"])
    draft_dir = Path(args.draft) if args.draft else None
    if method == "draft" and draft_dir is None:
        if zoo is None:
            raise ConfigError("--method draft needs --draft PATH when --target is given (a draft sharing its tokenizer)")
        draft_dir = zoo / "draft"
    draft_model = None
    if draft_dir is not None and (method == "draft" or args.compare == "hf"):
        draft_model = load_model(draft_dir, "draft", dtype, device)
        draft_tok_dir = tokenizer_dir_for(draft_dir)
        draft_tok = load_tokenizer(draft_tok_dir, "draft tokenizer") if draft_tok_dir is not None else None
        check_same_tokenizer(target, draft_model, tokenizer, draft_tok, target_name=str(target_dir), draft_name=str(draft_dir))
        info["draft"] = str(draft_dir)
        info["draft_model"] = draft_model
    if method == "draft":
        threshold = DEFAULT_CONFIDENCE_THRESHOLD if args.draft_confidence is None else args.draft_confidence
        info["factory"] = lambda: DraftModelProposer(draft_model, DraftLengthPolicy(**policy_kwargs), threshold)
    elif method == "pld":
        info["factory"] = lambda: PromptLookupProposer(num_draft_tokens=args.pld_tokens, max_ngram=args.pld_max_ngram)
    else:
        info["factory"] = lambda: None
    info["method"] = method
    torch.manual_seed(args.seed)
    return target, tokenizer, info


# ---------------------------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
    from draftsmith.inference.questions import read_questions
    from draftsmith.inference.sampling import SamplingParams

    with _short_warnings(), _torch_threads(args.threads):
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        questions = read_questions(args.questions, limit=args.limit)
        target, tokenizer, info = setup(args)
        if args.check_distribution:
            return run_distribution_check(args, target, tokenizer, info, questions, sampling)
        return run_eval(args, target, tokenizer, info, questions, sampling)


def run_eval(args, target, tokenizer, info, questions, sampling) -> int:
    from draftsmith.inference.evaluator import evaluate
    from draftsmith.inference.questions import default_questions_path
    from draftsmith.inference.report import summary_table, write_report

    extra = {}
    if info["manifest"] is not None:
        m = info["manifest"]
        extra["artefact"] = {k: m.get(k) for k in ("method", "draftsmith_version", "created", "target", "proposer", "metrics")}
    report = evaluate(
        target,
        tokenizer,
        info["method"],
        info["factory"],
        questions,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        seed=args.seed,
        warmup=args.warmup,
        compare_hf=args.compare == "hf",
        draft_model=info["draft_model"],
        target_name=info["target"],
        draft_name=info["draft"],
        question_file=str(args.questions or default_questions_path()),
        tensorboard_dir=args.tensorboard,
        progress=not args.no_progress,
        command=command_line(args),
        extra=extra or None,
    )
    paths = write_report(report, args.out or DEFAULT_OUT)
    print(summary_table(report))
    print(f"report: {paths['json']} (+ {paths['markdown'].name} and plots)")
    return 0


def run_distribution_check(args, target, tokenizer, info, questions, sampling) -> int:
    import json

    from draftsmith.inference.artefact import atomic_write_text
    from draftsmith.inference.distribution import check_distribution
    from draftsmith.inference.evaluator import chat_prompt_ids
    from draftsmith.inference.sampling import SamplingParams

    notes = []
    if sampling.greedy:
        sampling = SamplingParams(temperature=1.0, top_k=args.top_k, top_p=args.top_p)
        notes.append("--temperature 0 is greedy; the distribution check ran at temperature 1.0")
    from draftsmith.inference.adapter import ModelAdapter

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
    atomic_write_text(out, json.dumps(payload, indent=1) + "\n")
    for note in result.notes:
        print(f"note: {note}")
    print(f"test: {result.test}")
    print(result.summary())
    print(f"result: {out}")
    return 0 if result.passed else 1
