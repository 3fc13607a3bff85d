"""``draftsmith memory``: per-GPU training memory of each recipe by sharding mode, from the target's config.

    draftsmith memory --target llama-3.1-8b --gpus 8 --tokens 4096
    draftsmith memory --target path/to/model --method eagle3 --modes zero3,fsdp2 --json plan.json
    draftsmith memory --target llama-3.1-70b --method distillspec --draft llama-3.2-1b

Parameters are counted on the meta device (nothing is loaded or allocated); the step's activations are estimated
from the dominant terms (:mod:`draftsmith.launch.memory_plan`; docs/LAUNCHING.md sets them against measured peaks).
"""

from __future__ import annotations

import json

from draftsmith.common.errors import ConfigError
from draftsmith.launch.memory_plan import MODES, PRESETS, count, memory_variants, needs_draft, plan

GIB = 2**30


def add_parser(sub) -> None:
    p = sub.add_parser("memory", help="per-GPU training memory of each recipe by sharding mode, from a config",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--target", metavar="MODEL", required=True,
                   help=f"a model directory, a config.json, or a published shape: {', '.join(PRESETS)}")
    p.add_argument("--draft", metavar="MODEL", default=None,
                   help="the draft of a method that trains one, e.g. DistillSpec (the same kinds); default: the target's config --draft-layers deep")
    p.add_argument("--draft-layers", metavar="N", type=int, default=2, help="depth of the default draft (default 2)")
    p.add_argument("--method", default="all", help=f"one of {', '.join(memory_variants())}, or all (default)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    p.add_argument("--gpus", metavar="N", type=int, default=8, help="GPUs the run shards over (default 8)")
    p.add_argument("--tokens", metavar="N", type=int, default=4096,
                   help="tokens per GPU per micro-batch: batch x sequence length (default 4096)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                   help="the frozen models' dtype and the activations' (default bfloat16)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write every component of every plan")
    p.set_defaults(run=run)


def model_config(spec: str, flag: str):
    """The transformers config of a preset, a ``config.json`` or a model directory; one-line error otherwise."""
    from pathlib import Path

    import transformers

    if spec in PRESETS:
        return transformers.LlamaConfig(**PRESETS[spec])
    path = Path(spec).expanduser()
    if path.is_file() and path.name.endswith(".json"):
        path = path.parent if path.name == "config.json" else path
    if not (path / "config.json").is_file() and not path.is_file():
        raise ConfigError(f"{flag} {spec}: no config.json there; pass a model directory, a config.json or one of "
                          f"{', '.join(PRESETS)}")
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{flag} {file} is not a JSON config ({type(err).__name__}): pass a model's config.json") \
            from None
    if not isinstance(raw, dict) or not raw.get("model_type"):
        raise ConfigError(f"{flag} {file} is not a model config (a JSON object with model_type): pass a model's "
                          "config.json")
    try:
        config = transformers.AutoConfig.from_pretrained(str(path))
    except Exception as err:  # noqa: BLE001 -- transformers' config classes validate with error types of their own
        first = " ".join(str(err).split())[-160:]
        raise ConfigError(f"{flag} {file}: transformers refuses it ({first}): fix the config, or pass one of a model "
                          "type transformers knows") from None
    check_shape(config, f"{flag} {file}")
    return config


def check_shape(config, where: str) -> None:
    """One line for a config whose shape no model has: non-positive sizes, heads that do not divide the width."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    sizes = {k: getattr(text, k, None) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                  "vocab_size")}
    optional = {k: getattr(text, k, None) for k in ("head_dim", "intermediate_size", "num_key_value_heads")}
    sizes |= {k: v for k, v in optional.items() if v is not None}
    bad = [f"{k}={v}" for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad:
        raise ConfigError(f"{where}: {', '.join(bad)}: every size must be a whole number >= 1")
    if getattr(text, "head_dim", None) is None and sizes["hidden_size"] % sizes["num_attention_heads"]:
        raise ConfigError(f"{where}: hidden_size={sizes['hidden_size']} is not divisible by num_attention_heads="
                          f"{sizes['num_attention_heads']} (and no head_dim is given): fix the config")
    if sizes["num_attention_heads"] % sizes.get("num_key_value_heads", 1):
        raise ConfigError(f"{where}: num_attention_heads={sizes['num_attention_heads']} is not divisible by "
                          f"num_key_value_heads={sizes['num_key_value_heads']}: fix the config")


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _parse(args) -> tuple[list[str], list[str]]:
    known = list(memory_variants())
    methods = known if args.method == "all" else [args.method]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in methods if m not in known] + [m for m in modes if m not in MODES]
    if bad:
        raise ConfigError(f"unknown method or mode {', '.join(bad)}: methods {', '.join(known)}; modes "
                          f"{', '.join(MODES)}")
    if not modes:
        raise ConfigError(f"--modes {args.modes!r} names no mode: pass some of {', '.join(MODES)}")
    for flag, value in (("--gpus", args.gpus), ("--tokens", args.tokens), ("--draft-layers", args.draft_layers)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: must be >= 1")
    return methods, modes


def run(args) -> int:
    import copy

    from draftsmith.kernels.reference import GPU_CHUNK_BYTES, default_chunk_size
    from draftsmith.launch.memory_plan import DTYPE_BYTES

    methods, modes = _parse(args)
    target = model_config(args.target, "--target")
    if args.draft is not None:
        draft = model_config(args.draft, "--draft")
    else:
        draft = copy.deepcopy(target)
        draft.num_hidden_layers = args.draft_layers
    size = DTYPE_BYTES[args.dtype]
    rows, plans = [], {}
    for method in methods:
        c = count(method, target, draft if needs_draft(method) else None)
        chunk = default_chunk_size(args.tokens, c.loss_vocab, c.hidden, GPU_CHUNK_BYTES)
        plans[method] = {"frozen_parameters": c.frozen, "trained_parameters": c.trained,
                         "modes": {m: plan(c, m, args.gpus, args.tokens, size, size, chunk) for m in modes}}
        rows.append(f"| {method} | {_params(c.frozen)} | {_params(c.trained)} | "
                    + " | ".join(f"{plans[method]['modes'][m]['total'] / GIB:.1f}" for m in modes) + " |")
    print(f"per-GPU training memory, GiB: {args.target}, {args.gpus} GPUs, {args.tokens} tokens per GPU, "
          f"{args.dtype} (estimate: docs/LAUNCHING.md)")
    print("| method | frozen | trained | " + " | ".join(modes) + " |")
    print("|---|---:|---:|" + "---:|" * len(modes))
    print("\n".join(rows))
    if args.json:
        from draftsmith.common.io import atomic_write_json

        atomic_write_json(args.json, {"target": args.target, "gpus": args.gpus, "tokens": args.tokens,
                                      "dtype": args.dtype, "plans": plans})
    return 0


__all__ = ["add_parser", "model_config", "run"]
