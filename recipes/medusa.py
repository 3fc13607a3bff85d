"""Medusa-1 recipe: decoding heads on the frozen target (Cai et al. 2024), trained on the target's own answers,
saved as a heads artefact and evaluated with a static token tree.

    python recipes/medusa.py                                         # tiny zoo target, shipped corpus, then evaluate
    python recipes/medusa.py --target DIR --dataset chats.jsonl --output_dir runs/medusa-mine
    python recipes/medusa.py heads=5 head_layers=2 tree_nodes=48
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/medusa.py --max_steps 50
    draftsmith eval --artefact runs/medusa_tiny/artefact --tree chain     # the top-1 chain instead of the tree

Settings: --config YAML (default configs/medusa_tiny.yaml), then flags from RecipeArguments, MedusaConfig
(also as method.KEY=value) and transformers.TrainingArguments; the rest is the recipe runner's
(draftsmith.launch.recipe), the same for every method.
"""

import sys
from pathlib import Path

from draftsmith.launch.recipe import recipe_main

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "medusa_tiny.yaml"


def main() -> int:
    return recipe_main("medusa", default_config=DEFAULT_CONFIG)


if __name__ == "__main__":
    sys.exit(main())
