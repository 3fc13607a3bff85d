"""LayerSkip recipe (Elhoushi et al. 2024): the target fine-tuned with layer dropout and an early-exit loss under a
curriculum, so that its first layers draft for it; saved as the adapted target with its exit layer and evaluated
with early-exit self-speculation against the adapted model's own AR.

    python recipes/layerskip.py                                      # tiny zoo target, shipped corpus, then evaluate
    python recipes/layerskip.py --target DIR --dataset chats.jsonl --output_dir runs/layerskip-mine
    python recipes/layerskip.py curriculum=gradual dropout_max=0.2 exit_layer=2
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/layerskip.py --max_steps 50
    draftsmith eval --artefact runs/layerskip_tiny/artefact --exit-layer 2

Settings: --config YAML or a shipped config by name (default layerskip_tiny), then flags from RecipeArguments, LayerSkipConfig
(also as method.KEY=value) and transformers.TrainingArguments; the rest is the recipe runner's
(draftsmith.launch.recipe), the same for every method.
"""

import sys

from draftsmith.launch.recipe import recipe_main


def main() -> int:
    return recipe_main("layerskip")


if __name__ == "__main__":
    sys.exit(main())
