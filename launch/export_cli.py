"""``draftsmith export``: write a trained artefact in a serving engine's checkpoint layout (docs/EXPORT.md).

draftsmith export --artefact runs/medusa_tiny/artefact --format vllm-medusa --out exports/medusa [--target PATH]
draftsmith export --artefact runs/eagle3_tiny/artefact --format eagle3 --out exports/eagle3
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write an artefact in a serving engine's layout (vLLM, SGLang)")
    p.add_argument("--artefact", required=True, metavar="DIR", help="the artefact directory a recipe wrote")
    p.add_argument("--format", required=True, choices=("vllm-medusa", "eagle3", "vllm-eagle", "sglang-eagle"),
                   help="the layout to write: vllm-medusa (Medusa), eagle3 (EAGLE-3, vLLM and SGLang), vllm-eagle / "
                        "sglang-eagle (EAGLE-1)")
    p.add_argument("--out", required=True, metavar="DIR", help="the export directory (replaced when it exists)")
    p.add_argument("--target", metavar="PATH", default=None,
                   help="the target (Medusa heads sharing its LM head ship it; EAGLE heads take their layer sizes from "
                        "it; default: the one in the artefact's manifest)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from draftsmith.common.io import read_json
    from draftsmith.common.models import load_model
    from draftsmith.inference.export import describe, export_artefact

    manifest = read_json(Path(args.artefact) / "manifest.json") or {}
    target_name = args.target or manifest.get("target", {}).get("name_or_path")
    config = read_json(Path(args.artefact) / "heads_config.json") or {}
    target = None
    needs_target = config.get("shared_lm_head", True) or manifest.get("target_adapter") or config.get("method") == "eagle"
    if needs_target and target_name:
        target = load_model(target_name, "float32", what="target")
    out = export_artefact(args.artefact, args.format, args.out, target_model=target)
    if manifest.get("target_adapter") and target_name:  # the adapted target ships with the tokenizer it speaks
        from draftsmith.common.models import load_tokenizer, tokenizer_dir_for
        from draftsmith.inference.export import ADAPTED_TARGET

        tok_dir = tokenizer_dir_for(target_name)
        if tok_dir is not None:
            load_tokenizer(tok_dir).save_pretrained(Path(args.out) / ADAPTED_TARGET)
    print(describe(out))
    return 0
