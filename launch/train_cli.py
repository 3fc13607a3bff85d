"""``draftsmith train METHOD [settings]``: train a drafter through the recipe runner, exactly as
``python recipes/<method>.py [settings]`` does (the scripts stay, for ``accelerate launch recipes/<method>.py``).

    draftsmith train --help                                        # the methods it trains
    draftsmith train distillspec --help                            # the method's settings
    draftsmith train distillspec --config recipes/configs/distillspec_tiny.yaml max_steps=300
    draftsmith train eagle --variant eagle3 --output_dir runs/eagle3_tiny
    draftsmith train draft-verify --n-trials 40                    # a search, not a trainer: its own runner

Settings are the recipe's: ``--config FILE.yaml`` plus ``--key value`` / ``key=value`` overrides. Run from a source
checkout, the method's default config is the recipe script's (``recipes/configs/<method>_tiny.yaml``); without one,
the config dataclass's defaults apply.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from draftsmith.common.registry import REGISTRY, get_method, resolve

RECIPE_CONFIGS = Path(__file__).resolve().parents[1] / "recipes" / "configs"  # present in a source checkout only


def trainable_methods() -> list[str]:
    return [n for n in REGISTRY.names() if REGISTRY.get(n).trainable_by_command]


def recipe_default_config(method: str) -> Path | None:
    """The default config ``recipes/<method>.py`` uses, where the source checkout has it."""
    path = RECIPE_CONFIGS / f"{method}_tiny.yaml"
    return path if path.is_file() else None


def add_parser(sub) -> None:
    methods = trainable_methods()
    listing = "\n".join(f"  {n:<14} {REGISTRY.get(n).summary}" for n in methods)
    p = sub.add_parser("train", help="train a drafter (the recipe runner of `python recipes/<method>.py`)",
                       description=__doc__.split("\n\n")[0], epilog="methods:\n" + listing,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("method", choices=methods, metavar="METHOD", help="one of: " + ", ".join(methods))
    p.add_argument("settings", nargs=argparse.REMAINDER,
                   help="the recipe's settings (--config FILE.yaml, --key value, key=value); METHOD --help lists them")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from draftsmith.launch.recipe import recipe_main

    spec = get_method(args.method)
    if spec.train is not None:  # a method whose artefact comes from its own runner (Draft & Verify's search)
        return int(resolve(spec.train)(list(args.settings)) or 0)
    return recipe_main(args.method, list(args.settings), default_config=recipe_default_config(args.method))
