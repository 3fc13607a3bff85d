"""DFlash recipe (Chen et al. 2026): a small block-diffusion draft conditioned on the frozen target's hidden states,
trained to fill a block of mask tokens in one forward (features online, or cached), saved as a heads artefact and
evaluated drafting the block as a chain.

    python recipes/dflash.py                                         # tiny zoo target, shipped corpus, then evaluate
    python recipes/dflash.py --target DIR --dataset chats.jsonl --output_dir runs/dflash-mine
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/dflash.py --max_steps 50
    draftsmith eval --artefact runs/dflash_tiny/artefact
    draftsmith export --artefact runs/dflash_tiny/artefact --format vllm-dflash --out runs/dflash_tiny/vllm

Settings: --config YAML or a shipped config by name (default dflash_tiny), then flags from RecipeArguments, DFlashConfig (also as
method.KEY=value) and transformers.TrainingArguments; the rest is the recipe runner's (draftsmith.launch.recipe), the
same for every method.
"""

import sys

from draftsmith.launch.recipe import recipe_main


def main() -> int:
    return recipe_main("dflash")


if __name__ == "__main__":
    sys.exit(main())
