"""EAGLE-1 recipe (Li et al. 2024): a feature-level draft head trained on the frozen target's own features and
answers (features computed online, inside the training step), saved as a heads artefact and evaluated drafting a
chain.

    python recipes/eagle.py                                          # tiny zoo target, shipped corpus, then evaluate
    python recipes/eagle.py --target DIR --dataset chats.jsonl --output_dir runs/eagle-mine
    python recipes/eagle.py --config eagle_smollm2
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/eagle.py --max_steps 50
    draftsmith eval --artefact runs/eagle_tiny/artefact --draft-length 4

Settings: --config YAML or a shipped config by name (default eagle_tiny), then flags from RecipeArguments, EagleConfig
(also as method.KEY=value) and transformers.TrainingArguments; the rest is the recipe runner's
(draftsmith.launch.recipe), the same for every method.
"""

import sys

from draftsmith.launch.recipe import recipe_main


def main() -> int:
    return recipe_main("eagle")


if __name__ == "__main__":
    sys.exit(main())
