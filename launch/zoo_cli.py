"""``draftsmith zoo``: build the built-in model zoo, or print where it lives.

draftsmith zoo build --size tiny [--home DIR] [--force] [--threads N]
draftsmith zoo path --size tiny [--home DIR]      # builds first if missing
"""

from __future__ import annotations

import argparse

SIZES = ("tiny", "small")


def add_parser(sub) -> None:
    p = sub.add_parser("zoo", help="build the built-in tokenizer + target + draft, or print their directory")
    actions = p.add_subparsers(dest="zoo_command", required=True, metavar="{build,path}")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--size", default="tiny", choices=SIZES, help="zoo size (default: tiny)")
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


def run(args: argparse.Namespace) -> int:
    from draftsmith.data.zoo import read_zoo_manifest
    from draftsmith.trainers.zoo import build_zoo, ensure_zoo

    if args.zoo_command == "path":
        print(ensure_zoo(args.size, home=args.home, threads=args.threads))
        return 0
    out = build_zoo(args.size, home=args.home, force=args.force, threads=args.threads)
    manifest = read_zoo_manifest(args.size, home=args.home)
    for role, info in manifest["models"].items():
        print(
            f"{role}: {info['parameters'] / 1e6:.2f}M parameters, {info['tokens_seen']:,} tokens, "
            f"held-out loss {info['heldout_loss']:.3f}, {info['tokens_per_second']:,.0f} tokens/s"
        )
    print(f"zoo {args.size} ready in {out} (build time {manifest['build_seconds']:.0f} s)")
    return 0
