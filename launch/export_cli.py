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
                        "it; default: the one in the artefact's manifest)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from draftsmith.common.models import load_model
    from draftsmith.inference.artefacts.export import describe, export_artefact
    from draftsmith.inference.artefacts.manifest import read_manifest

    target_name = args.target or read_manifest(args.artefact)["target"].get("name_or_path")
    target = load_model(target_name, "float32", what="target") if target_name else None
    out = export_artefact(args.artefact, args.format, args.out, target_model=target)
    print(describe(out))
    return 0
