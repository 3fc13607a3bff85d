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
from draftsmith.common.models import DTYPES, load_model, load_tokenizer, tokenizer_dir_for
from draftsmith.common.registry import REGISTRY, get_method, resolve
from draftsmith.common.threads import parse_threads, torch_threads
from draftsmith.launch.zoo_cli import SIZES as ZOO_SIZE_NAMES

DEFAULT_OUT = "eval/report.json"
# command-line option -> the proposer setting it overrides (None = not given: the artefact's, else the method's)
PROPOSER_OPTIONS = {"draft_length": "draft_length", "draft_length_mode": "draft_length_mode",
                    "draft_max_length": "draft_max_length",
                    "draft_confidence": "confidence_threshold", "pld_tokens": "pld_tokens",
                    "pld_max_ngram": "pld_max_ngram", "pld_min_ngram": "pld_min_ngram", "pld_length": "pld_length",
                    "pld_threshold": "pld_threshold", "draft_vocab": "draft_vocab", "tree": "tree",
                    "tree_nodes": "tree_nodes", "acceptance": "acceptance", "typical_epsilon": "typical_epsilon",
                    "typical_delta": "typical_delta", "tree_depth": "tree_depth", "tree_top_k": "tree_top_k",
                    "exit_layer": "exit_layer", "skip_attention": "skip_attention", "skip_mlp": "skip_mlp"}


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
    g.add_argument("--dtype", default="float32", choices=DTYPES, help="weights dtype")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
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
                        "324) or broad (244 in 12 categories: writing, roleplay, reasoning, math, coding, extraction, "
                        "stem, humanities, summarization, qa, rag, translation)")
    g.add_argument("--limit", metavar="N", type=int, default=None, help="use the first N questions")
    g.add_argument("--per-category", metavar="N", type=int, default=None,
                   help="use the first N questions of every category (a stratified subset; --limit applies after it)")
    g.add_argument("--max-new-tokens", metavar="N", type=int, default=128, help="new tokens per answer (same for AR and the method)")
    g.add_argument("--temperature", metavar="T", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", metavar="P", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    g.add_argument("--top-k", metavar="K", type=int, default=0, help="top-k sampling (0 = off)")
    g.add_argument("--seed", metavar="S", type=int, default=0)
    g.add_argument("--warmup", metavar="N", type=int, default=1, help="unmeasured warm-up answers before timing")
    g.add_argument("--draft-length", metavar="K", type=int, default=None,
                   help="draft tokens per step, a fixed length unless --draft-length-mode says otherwise (default 4, or "
                        "the artefact's)")
    g.add_argument("--draft-length-mode", choices=["fixed", "heuristic", "leviathan"], default=None,
                   help="fixed, grow/shrink heuristic, or Leviathan's expected-speedup optimum (default fixed, or the artefact's)")
    g.add_argument("--draft-max-length", metavar="K", type=int, default=None,
                   help="the longest draft the heuristic and Leviathan policies may grow to (default 16, or the artefact's)")
    g.add_argument("--draft-confidence", metavar="P", type=float, default=None,
                   help="draft model: stop a draft after a token the draft gives probability < P "
                        f"(default {get_method('draft').eval_defaults['confidence_threshold']}, or the artefact's; "
                        "0 = always draft --draft-length tokens)")
    g.add_argument("--tree", metavar="auto|chain|FILE", default=None,
                   help="head drafters: medusa's static token tree: auto (grown from the heads' measured "
                        "accuracies; default), chain (the top-1 of each head) or a JSON file of choice paths; eagle: chain or dynamic (EAGLE-2); "
                        "pld: chain (one chain voted from the earlier occurrences; default) or dynamic (their candidates as a "
                        "token tree, at most --pld-tokens nodes)")
    g.add_argument("--skip-attention", metavar="L,L", default=None,
                   help="draft-verify: the layers whose attention the draft skips (e.g. 1,3,5)")
    g.add_argument("--skip-mlp", metavar="L,L", default=None, help="draft-verify: the layers whose MLP the draft skips")
    g.add_argument("--exit-layer", metavar="E", type=int, default=None,
                   help="early-exit: draft with the target's first E layers (LayerSkip self-speculation)")
    g.add_argument("--tree-nodes", metavar="N|auto", default=None,
                   help="nodes of the auto tree (medusa; auto = the count with the best predicted speedup on this "
                        "target's measured verification cost) or the dynamic tree's total tokens (eagle; auto = chosen each "
                        "step from the draft's path probabilities and the measured cost, up to 64) (default 32)")
    g.add_argument("--tree-depth", metavar="D", type=int, default=None,
                   help="eagle --tree dynamic: levels the head expands (default 5)")
    g.add_argument("--tree-top-k", metavar="K", type=int, default=None,
                   help="eagle --tree dynamic: nodes expanded per level and children per node (default 8)")
    g.add_argument("--acceptance", choices=("exact", "typical"), default=None,
                   help="head drafters: exact (default, lossless) or typical (Medusa's typical acceptance: LOSSY under "
                        "sampling, labelled so in the report)")
    g.add_argument("--typical-epsilon", metavar="E", type=float, default=None, help="typical acceptance: epsilon (0.09)")
    g.add_argument("--typical-delta", metavar="D", type=float, default=None, help="typical acceptance: delta (0.3)")
    g.add_argument("--draft-vocab", choices=("auto", "full"), default=None,
                   help="draft model: auto = draft only among the tokens of the draft's config.draft_vocab when it "
                        "has one (a cheaper LM head; the zoo's smollm2 draft has 8,192), full = the whole vocabulary")
    pld = get_method("pld").eval_defaults
    g.add_argument("--pld-tokens", metavar="N", type=int, default=None,
                   help=f"prompt lookup: longest draft, tokens copied per step (default {pld['pld_tokens']})")
    g.add_argument("--pld-max-ngram", metavar="N", type=int, default=None,
                   help=f"prompt lookup: longest n-gram matched, tried first (default {pld['pld_max_ngram']})")
    g.add_argument("--pld-min-ngram", metavar="N", type=int, default=None,
                   help=f"prompt lookup: shortest n-gram matched (default {pld['pld_min_ngram']}; 1 also copies after a "
                        "lone matching token)")
    g.add_argument("--pld-length", choices=["adaptive", "fixed", "cost"], default=None,
                   help="prompt lookup: from how often copies are accepted, the draft size that commits the most tokens "
                        "per second on the target's verification cost, measured at the start (cost), or the longest draft "
                        "whose copies stay above --pld-threshold (adaptive), or always --pld-tokens (fixed) (default "
                        f"{pld['pld_length']})")
    g.add_argument("--pld-threshold", metavar="P", type=float, default=None,
                   help="prompt lookup, --pld-length adaptive: draft a copied token (a tree node) only while its "
                        f"estimated chance of acceptance is at least P (default {pld['pld_threshold']}; lower where "
                        "verifying more tokens is cheap, e.g. on a GPU)")
    g = p.add_argument_group("output")
    g.add_argument("--compare", choices=["hf"], default=None, help="also run transformers' assisted generation and prompt lookup")
    g.add_argument("--out", metavar="FILE", default=None, help=f"report JSON path; .md and .png files go beside it (default {DEFAULT_OUT}); while it runs, "
                        "finished questions go to REPORT.partial.jsonl, and rerunning the same command after a kill "
                        "resumes from them")
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


def threads_context(value):
    """``--threads N`` as a context (torch's own threads when not given)."""
    if value is None:
        return contextlib.nullcontext()
    return torch_threads(parse_threads(value, "--threads", "pass --threads N with N >= 1, or leave it out"))


def load_target(target: str | None, tokenizer: str | None, zoo: str):
    """``(target_dir, model, tokenizer)`` for a command's ``--target`` / ``--tokenizer`` (default: the zoo's)."""
    target_dir = Path(target) if target else zoo_paths(zoo, None) / "target"
    model = load_model(target_dir, "float32", what="target").eval()
    tok_dir = Path(tokenizer) if tokenizer else tokenizer_dir_for(target_dir)
    if tok_dir is None:
        raise ConfigError(f"the target directory {target_dir} holds no tokenizer: pass --tokenizer DIR")
    return target_dir, model, load_tokenizer(tok_dir)


def artefact_target(artefact: str | None, target: str | None) -> str | None:
    """The target a command loads: ``--target`` when given; else, for ``--artefact``, the target its manifest names
    when that can be had here (an existing directory or file, or a named real target such as ``smollm2-135m``);
    else None, the zoo's."""
    if target is not None or artefact is None:
        return target
    from draftsmith.data.zoo import zoo_size_for_target
    from draftsmith.inference.artefact import read_manifest

    name = (read_manifest(artefact).get("target") or {}).get("name_or_path")
    if name and (Path(name).exists() or zoo_size_for_target(name) is not None):
        return str(name)
    return None


def zoo_paths(size: str, home: str | None) -> Path:
    from draftsmith.trainers.zoo import ensure_zoo

    return Path(ensure_zoo(size, home=home))


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
    device = resolve_device(args.device)
    target_name = artefact_target(args.artefact, args.target)
    zoo = zoo_paths(args.zoo, args.home) if target_name is None else None
    target_dir = zoo / "target" if zoo is not None else Path(target_name)
    own_zoo = default_draft_zoo(args, target_name)
    if own_zoo is not None:
        zoo = zoo_paths(own_zoo, args.home)
    attention = None
    if getattr(args, "tree_attention", "mask") == "kernel":
        from draftsmith.kernels.tree_attention import register_tree_attention

        attention = register_tree_attention()
    target = load_model(target_dir, args.dtype, device, what="target", attn_implementation=attention).eval()
    tok_dir = Path(args.tokenizer) if args.tokenizer else tokenizer_dir_for(target_dir)
    if tok_dir is None:
        raise DraftsmithError(f"the target directory {target_dir} holds no tokenizer: pass --tokenizer DIR")
    tokenizer = load_tokenizer(tok_dir)
    info = {"target": str(target_dir), "tokenizer": str(tok_dir), "draft": None, "draft_model": None, "manifest": None}
    options = {setting: getattr(args, flag) for flag, setting in PROPOSER_OPTIONS.items()}
    if args.draft_length is not None and args.draft_length_mode is None:
        options["draft_length_mode"] = "fixed"  # --draft-length K drafts K tokens, whatever policy an artefact was tuned to

    if args.artefact:
        from draftsmith.inference.artefact import adapted_target, load_artefact, read_manifest

        verified = adapted_target(args.artefact, read_manifest(args.artefact), target)  # target, or target + LoRA
        proposer, manifest = load_artefact(args.artefact, verified, tokenizer,
                                           allow_target_mismatch=args.allow_target_mismatch, **options)
        info.update(method=manifest["method"], draft=str(args.artefact), manifest=manifest,
                    draft_model=_draft_model_of(proposer), factory=lambda: proposer,
                    original_target=target if verified is not target else None)
        return verified, tokenizer, info

    method = args.method or "draft"
    spec = get_method(method)
    draft_dir = Path(args.draft) if args.draft else (zoo / "draft" if zoo is not None else None)
    if "draft" in spec.models and draft_dir is None:
        raise ConfigError(f"--method {method} needs --draft PATH when --target is given (a draft sharing its tokenizer)")
    if draft_dir is not None and ("draft" in spec.models or args.compare == "hf"):
        info["draft_model"] = load_draft(target, tokenizer, draft_dir, args.dtype, device)
        info["draft"] = str(draft_dir)
    ctx = ProposerContext(target_model=target, tokenizer=tokenizer, options=options, defaults=spec.eval_defaults,
                          draft_model=info["draft_model"] if "draft" in spec.models else None)
    build = resolve(spec.proposer)
    info.update(method=method, factory=lambda: build(ctx))
    torch.manual_seed(args.seed)
    return target, tokenizer, info


def default_draft_zoo(args: argparse.Namespace, target_name: str | None) -> str | None:
    """The zoo size whose draft ``--method draft`` runs by default on a named real target (``smollm2-135m``: the
    smollm2 zoo, built on first use), else ``None``: an artefact brings its own drafter, ``--draft`` names one, and
    other methods draft without a separate model."""
    from draftsmith.data.zoo import zoo_size_for_target

    if args.artefact or args.draft is not None or args.method not in (None, "draft"):
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


def _draft_model_of(proposer):
    """The separate draft model a proposer runs, if any (for transformers' assisted generation)."""
    adapter = getattr(proposer, "adapter", None)
    return adapter.model if getattr(proposer, "name", "") == "draft" and adapter is not None else None


# ---------------------------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
    from draftsmith.inference.questions import read_questions
    from draftsmith.inference.sampling import SamplingParams

    with _short_warnings(), threads_context(args.threads):
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


def run_eval(args, target, tokenizer, info, questions, sampling) -> int:
    from draftsmith.inference.evaluator import evaluate
    from draftsmith.inference.journal import EvalJournal, journal_path
    from draftsmith.inference.questions import resolve_questions_path
    from draftsmith.inference.report import summary_table, write_report

    extra = {}
    if info["manifest"] is not None:
        m = info["manifest"]
        extra["artefact"] = {k: m.get(k) for k in ("method", "draftsmith_version", "created", "target", "proposer", "metrics",
                                                   "tuning")}
    out = args.out or DEFAULT_OUT
    journal = EvalJournal(journal_path(out), journal_settings(args))  # rerunning the command resumes a killed run
    if journal.path.exists():
        print(f"resuming from {journal.path}: questions answered there are kept, the rest are run", file=sys.stderr)
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
        question_file=str(resolve_questions_path(args.questions)),
        tensorboard_dir=args.tensorboard,
        progress=not args.no_progress,
        command=command_line(args),
        extra=extra or None,
        original_model=info.get("original_target"),
        journal=journal,
        verify_padding=args.verify_padding != "off",
    )
    paths = write_report(report, out)
    journal.remove()
    print(summary_table(report))
    print(f"report: {paths['json']} (+ {paths['markdown'].name} and plots)")
    return 0


def run_distribution_check(args, target, tokenizer, info, questions, sampling) -> int:
    import json

    from draftsmith.common.io import atomic_write_text
    from draftsmith.inference.distribution import check_distribution
    from draftsmith.inference.runs import chat_prompt_ids
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
