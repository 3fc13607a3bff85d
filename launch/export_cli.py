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
                   help="the layout to write (docs/EXPORT.md): " + ", ".join(f"{f} ({m})" for f, m in formats.items()))
    p.add_argument("--out", required=True, metavar="DIR", help="the export directory (replaced when it exists)")
    p.add_argument("--target", metavar="PATH", default=None,
                   help="the target (Medusa heads sharing its LM head ship it; EAGLE heads take their layer sizes from "
                        "it; default: the one in the artefact's manifest); refused unless it is the target the "
                        "artefact was trained for")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from draftsmith.common.models import load_model
    from draftsmith.common.outputs import OutputLock, write_failures
    from draftsmith.inference.artefacts.export import describe, export_artefact
    from draftsmith.inference.artefacts.reader import read_manifest
    from draftsmith.launch.targets import resolve_model_arg

    out = export_dir(args.out, args.artefact)
    target_name = resolve_model_arg(args.target) if args.target else \
        read_manifest(args.artefact)["target"].get("name_or_path")
    with OutputLock(out, "--out", "file"):  # the lock sits beside the directory, which the export replaces whole
        target = load_model(target_name, "float32", what="target") if target_name else None
        with write_failures(out, f"the artefact as it was, and any earlier export in {out}"):
            out = export_artefact(args.artefact, args.format, out, target_model=target)
    print(describe(out))
    return 0


def export_dir(path: str, artefact: str):
    """``--out`` checked before anything loads: a directory with room for the artefact's weights, new or empty or
    an earlier export (it is replaced whole, so a directory of other files is refused)."""
    from draftsmith.common.errors import OutputError
    from draftsmith.common.outputs import prepare_output, weights_bytes

    out = prepare_output(path, "--out", "dir", need_bytes=weights_bytes(artefact), need="the artefact's weights")
    if any(out.iterdir()) and not ((out / "config.json").is_file() and (out / "model.safetensors").is_file()):
        raise OutputError(f"--out {out} holds files that are not an export, and the export replaces the directory "
                          "whole: pass a new or empty directory, or an earlier export to replace")
    return out
