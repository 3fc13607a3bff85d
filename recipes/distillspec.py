"""DistillSpec recipe: distil a draft model into its target (Zhou et al. 2023), save the artefact, evaluate it.

    python recipes/distillspec.py                                   # tiny zoo pair, shipped corpus, then evaluate
    python recipes/distillspec.py --config distillspec_small divergence=tvd data_mode=mixed
    python recipes/distillspec.py --target DIR --draft DIR --dataset chats.jsonl --output_dir runs/mine
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/distillspec.py --max_steps 50
    deepspeed --num_gpus 2 recipes/distillspec.py --deepspeed launch/configs/deepspeed/zero2.json
    python recipes/distillspec.py --output_dir runs/x --resume_from_checkpoint latest     # continue a killed run

Settings: --config YAML or a shipped config by name (default distillspec_tiny), then --key value / key=value flags from
RecipeArguments (models, data, evaluation), DistillSpecConfig (divergence, data mode, ...; also as
method.KEY=value) and transformers.TrainingArguments. Everything else — models, data, training, the artefact in
<output_dir>/artefact (`draftsmith eval --artefact <output_dir>/artefact`), the evaluation — is the recipe
runner's (draftsmith.launch.recipe), the same for every method.
"""

import sys

from draftsmith.launch.recipe import recipe_main


def main() -> int:
    return recipe_main("distillspec")


if __name__ == "__main__":
    sys.exit(main())
