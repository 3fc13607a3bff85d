"""BiTA recipe (Lin et al. 2024): prompt and mask tokens tuned on the frozen target's own answers, saved as an
embeddings-only artefact (a few hundred kilobytes) and evaluated with the target drafting and verifying in one
forward per step.

    python recipes/bita.py                                           # tiny zoo target, shipped corpus, then evaluate
    python recipes/bita.py --target DIR --dataset chats.jsonl --output_dir runs/bita-mine
    python recipes/bita.py --config bita_smollm2
    python recipes/bita.py prompt_mode=embeddings mask_tokens=4       # plain prompt embeddings, 4 masks
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/bita.py --max_steps 50
    deepspeed --num_gpus 2 recipes/bita.py --deepspeed launch/configs/deepspeed/zero2.json
    draftsmith eval --artefact runs/bita_tiny/artefact --tree triangle   # the reference code's tree instead of the chain
    draftsmith eval --method bita                                        # untrained embeddings (before training)

Settings: --config YAML or a shipped config by name (default bita_tiny), then flags from RecipeArguments, BitaConfig
(also as method.KEY=value) and transformers.TrainingArguments; the rest is the recipe runner's
(draftsmith.launch.recipe), the same for every method.
"""

import sys

from draftsmith.launch.recipe import recipe_main


def main() -> int:
    return recipe_main("bita")


if __name__ == "__main__":
    sys.exit(main())
