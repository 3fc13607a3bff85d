"""``draftsmith export``: write a trained artefact in a serving engine's checkpoint layout (docs/EXPORT.md).

draftsmith export --artefact runs/medusa_tiny/artefact --format vllm-medusa --out exports/medusa [--target PATH]
draftsmith export --artefact runs/eagle3_tiny/artefact --format eagle3 --out exports/eagle3
"""

from __future__ import annotations

import argparse

from draftsmith.common.registry import export_formats


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write an artefact in a serving engine's layout (vLLM, SGLang)")
    p.add_argument("--artefact", required=True, metavar="DIR", help="the artefact directory a recipe wrote")
    formats = export_formats()
    p.add_argument("--format", required=True, choices=tuple(formats),
                   help="the layout to write (docs/EXPORT.md): " + ", ".join(f"{f} ({'/'.join(m)})" for f, m in formats.items()))
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the export directory: new or empty, or with --overwrite an earlier export of this format")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out when it holds an earlier export of the same format (nothing else is replaced)")
    p.add_argument("--target", metavar="PATH", default=None,
                   help="the target (Medusa heads sharing its LM head ship it; EAGLE heads take their layer sizes from "
                        "it; default: the one in the artefact's manifest); refused unless it is the target the "
                        "artefact was trained for")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from draftsmith.common.models import load_model
    from draftsmith.common.outputs import OutputLock, write_failures
    from draftsmith.inference.artefacts.export import check_export, describe, export_artefact
    from draftsmith.launch.targets import resolve_model_arg

    manifest = check_export(args.artefact, args.format)  # every input checked before anything is written
    target_name = resolve_model_arg(args.target) if args.target is not None else manifest["target"].get("name_or_path")
    out = export_dir(args.out, args.artefact, args.format, args.overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)  # the lock sits beside the directory, which the export replaces
    with OutputLock(out, "--out", "file"):
        target = load_model(target_name, "float32", what="target") if target_name else None
        with write_failures(out, f"the artefact as it was, and any earlier export in {out}"):
            out = export_artefact(args.artefact, args.format, out, target_model=target)
    print(describe(out))
    return 0


def export_dir(path: str, artefact: str, fmt: str, overwrite: bool):
    """``--out`` checked before anything is written (nothing is created here): a new or empty directory, or with
    ``--overwrite`` an earlier export of ``fmt``, on a disk with room for the artefact's weights."""
    from draftsmith.common.outputs import prepare_output, weights_bytes
    from draftsmith.inference.artefacts.checkpoint import check_replaceable

    out = prepare_output(path, "--out", "dir", need_bytes=weights_bytes(artefact), need="the artefact's weights",
                         create=False)
    check_replaceable(out, fmt, overwrite)
    return out
