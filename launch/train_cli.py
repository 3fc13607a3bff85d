"""``draftsmith train METHOD [settings]``: train a drafter through the recipe runner, exactly as
``python recipes/<method>.py [settings]`` does (the scripts stay, for ``accelerate launch recipes/<method>.py``).

    draftsmith train --help                                        # the methods it trains
    draftsmith train distillspec --help                            # the method's settings
    draftsmith train distillspec --config distillspec_tiny max_steps=300     # a shipped config, by name
    draftsmith train eagle --config eagle3_smollm2                 # EAGLE-3 on SmolLM2
    draftsmith train peagle --output_dir runs/peagle_tiny          # P-EAGLE (variant peagle, fixed)
    draftsmith train medusa --config my_medusa.yaml                # a YAML file of your own
    draftsmith train draft-verify --n-trials 40                    # a search, not a trainer: its own runner

Settings are the recipe's: ``--config`` (a YAML file, or the name of a config draftsmith ships:
``draftsmith.launch.recipe_args.shipped_configs``) plus ``--key value`` / ``key=value`` overrides. Without
``--config`` the method's own shipped config runs (its spec's ``default_config``, e.g. ``medusa_tiny``).
"""

from __future__ import annotations

import argparse

from draftsmith.common.registry import REGISTRY, get_method, resolve


def trainable_methods() -> list[str]:
    return [n for n in REGISTRY.names() if REGISTRY.get(n).trainable_by_command]


def add_parser(sub) -> None:
    from draftsmith.launch.recipe_args import shipped_configs

    methods = trainable_methods()
    listing = "\n".join(f"  {n:<14} {REGISTRY.get(n).summary}" for n in methods)
    listing += "\n\nshipped configs (--config NAME):\n  " + ", ".join(shipped_configs())
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
    return recipe_main(args.method, list(args.settings))
