"""Medusa recipe (Cai et al. 2024): decoding heads trained on the target's own answers, on the frozen target
(Medusa-1, the default) or jointly with a LoRA adapter of the target (Medusa-2, ``--variant medusa2``), saved as a
heads artefact (Medusa-2: with the adapter) and evaluated with a static token tree.

    python recipes/medusa.py                                         # tiny zoo target, shipped corpus, then evaluate
    python recipes/medusa.py --target DIR --dataset chats.jsonl --output_dir runs/medusa-mine
    python recipes/medusa.py heads=5 head_layers=2 tree_nodes=48
    python recipes/medusa.py --config medusa2_tiny    # Medusa-2 (or: --variant medusa2)
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/medusa.py --max_steps 50
    draftsmith eval --artefact runs/medusa_tiny/artefact --tree chain     # the top-1 chain instead of the tree

Settings: --config YAML or a shipped config by name (default medusa_tiny), then flags from RecipeArguments, MedusaConfig
(also as method.KEY=value) and transformers.TrainingArguments; the rest is the recipe runner's
(draftsmith.launch.recipe), the same for every method.
"""

import sys

from draftsmith.launch.recipe import recipe_main


def main() -> int:
    return recipe_main("medusa")


if __name__ == "__main__":
    sys.exit(main())
