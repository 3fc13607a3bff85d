"""DistillSpec recipe: distil a draft model into its target (Zhou et al. 2023), save the artefact, evaluate it.

    python recipes/distillspec.py                                   # tiny zoo pair, shipped corpus, then evaluate
    python recipes/distillspec.py --config recipes/configs/distillspec_small.yaml divergence=tvd data_mode=mixed
    python recipes/distillspec.py --target DIR --draft DIR --dataset chats.jsonl --output_dir runs/mine
    accelerate launch --config_file launch/configs/accelerate/cpu_2proc.yaml recipes/distillspec.py --max_steps 50
    deepspeed --num_gpus 2 recipes/distillspec.py --deepspeed launch/configs/deepspeed/zero2.json
    python recipes/distillspec.py --output_dir runs/x --resume_from_checkpoint latest     # continue a killed run

Settings: --config YAML (default configs/distillspec_tiny.yaml), then --key value / key=value flags from
RecipeArguments (models, data, evaluation), DistillSpecConfig (divergence, data mode, ...) and
transformers.TrainingArguments. The artefact goes to <output_dir>/artefact (load it with
`draftsmith eval --artefact <output_dir>/artefact`); checkpoints and TensorBoard logs stay in <output_dir>.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import transformers

from draftsmith.common.errors import DraftsmithError
from draftsmith.launch.recipe import (
    RecipeArguments,
    evaluate_draft_artefact,
    final_eval_metrics,
    load_data,
    load_model,
    load_tokenizer,
    parse_recipe_args,
    resolve_pair,
    resolve_resume,
    save_draft_artefact,
    torch_dtype,
)
from draftsmith.trainers.distillspec import DistillSpecConfig, DistillSpecTrainer, load_target

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "distillspec_tiny.yaml"


def run(argv: list[str] | None = None) -> int:
    recipe, distill, targs = parse_recipe_args(
        (RecipeArguments, DistillSpecConfig, transformers.TrainingArguments), argv, DEFAULT_CONFIG
    )
    transformers.set_seed(targs.seed)
    with targs.main_process_first(desc="building the zoo"):  # one process builds a missing zoo, the others wait
        paths = resolve_pair(recipe)
    tokenizer = load_tokenizer(paths["tokenizer"])
    target = load_target(paths["target"], distill.target_quantization, torch_dtype(recipe.dtype))
    draft = load_model(paths["draft"], recipe.dtype)
    train, heldout, data_info = load_data(recipe, tokenizer, targs.seed)
    trainer = DistillSpecTrainer(
        model=draft, teacher_model=target, distill_config=distill, args=targs,
        train_dataset=train, eval_dataset=heldout, processing_class=tokenizer,
    )
    result = trainer.train(resume_from_checkpoint=resolve_resume(targs.resume_from_checkpoint, targs.output_dir))
    final = final_eval_metrics(trainer)

    artefact = Path(targs.output_dir) / "artefact"
    metrics = {key: final.get(f"eval_{key}") for key in (
        "loss", "estimated_acceptance", "predicted_tau", "tvd", "greedy_acceptance", "predicted_tau_greedy")}
    metrics["eval_loss"] = metrics.pop("loss")
    metrics["train_loss"] = result.training_loss
    training = {
        "config": {"recipe": asdict(recipe), "distillspec": distill.to_dict(),
                   "training_args": {k: v for k, v in targs.to_dict().items() if "token" not in k}},
        "seed": targs.seed,
        "steps": trainer.state.global_step,
        "tokens": trainer.distilled_tokens,
        "world_size": targs.world_size,
        "fused_kernel": trainer.use_fused_kernel,
        "data": data_info,
        "models": paths,
    }
    save_draft_artefact(
        trainer, artefact, method="distillspec", target_model=target, tokenizer=tokenizer,
        target_name=paths["target"], proposer={"draft_length": distill.draft_length, "model_dir": "draft"},
        training=training, metrics=metrics,
    )
    if not trainer.is_world_process_zero():
        return 0
    print(f"artefact: {artefact}  (load it with: draftsmith eval --artefact {artefact})")
    print("estimated acceptance {estimated_acceptance:.3f}, predicted tau {predicted_tau:.3f} (sampling); greedy "
          "agreement {greedy_acceptance:.3f}, predicted tau {predicted_tau_greedy:.3f}".format(**metrics))
    if recipe.evaluate:
        baseline = load_model(paths["draft"], recipe.dtype) if recipe.eval_baseline else None
        evaluate_draft_artefact(artefact, target, tokenizer, recipe, Path(targs.output_dir) / "eval", baseline,
                                distill.draft_length, target_name=paths["target"])
    return 0


def main() -> int:
    try:
        return run()
    except DraftsmithError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
