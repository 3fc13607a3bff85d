"""LayerSkip recipe (Elhoushi et al. 2024): the target fine-tuned with layer dropout and an early-exit loss under a
curriculum, so that its first layers draft for it; saved as the adapted target with its exit layer and evaluated
with early-exit self-speculation against the adapted model's own AR.

    python recipes/layerskip.py                                      # tiny zoo target, shipped corpus, then evaluate
    python recipes/layerskip.py --target DIR --dataset chats.jsonl --output_dir runs/layerskip-mine
    python recipes/layerskip.py curriculum=gradual dropout_max=0.2 exit_layer=2
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/layerskip.py --max_steps 50
    draftsmith eval --artefact runs/layerskip_tiny/artefact --exit-layer 2

Settings: --config YAML (default configs/layerskip_tiny.yaml), then flags from RecipeArguments, LayerSkipConfig
(also as method.KEY=value) and transformers.TrainingArguments; the rest is the recipe runner's
(draftsmith.launch.recipe), the same for every method.
"""

import sys
from pathlib import Path

from draftsmith.launch.recipe import recipe_main

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "layerskip_tiny.yaml"


def main() -> int:
    return recipe_main("layerskip", default_config=DEFAULT_CONFIG)


if __name__ == "__main__":
    sys.exit(main())
