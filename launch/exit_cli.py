"""``draftsmith exit-layer``: choose LayerSkip's exit layer and draft length for a target, from measurements.

    draftsmith exit-layer                                          # the tiny zoo target
    draftsmith exit-layer --target smollm2-135m --prompts 16 --max-new-tokens 64 --threads 1 --out exit.json
    draftsmith exit-layer --artefact runs/layerskip_tiny/artefact      # measured on it, recorded in its manifest

Answers held-out calibration prompts with the target (greedy), measures every layer's top-1 agreement with the
full model along those answers and the cost of drafting through each exit, predicts the speedup of every (exit
layer, draft length) and prints the best (:mod:`draftsmith.inference.evaluation.exit_layer`); then run it with
``draftsmith eval --method early-exit --exit-layer E --draft-length K``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.common.errors import ConfigError
from draftsmith.launch.targets import add_placement_options
from draftsmith.launch.zoo_cli import SIZES as ZOO_SIZE_NAMES


def add_parser(sub) -> None:
    p = sub.add_parser("exit-layer", help="choose the exit layer and draft length of early-exit self-speculation",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--artefact", metavar="DIR", default=None,
                   help="a LayerSkip artefact: measure its adapted target and record the choice and the table in its "
                        "manifest (proposer settings and `tuning`), where `draftsmith eval --artefact` reads them")
    p.add_argument("--target", metavar="PATH", default=None,
                   help="target: a model directory, a .gguf file, a hub id or smollm2-135m (default: the zoo's)")
    p.add_argument("--tokenizer", metavar="DIR", default=None, help="tokenizer (default: the target's, or the zoo's)")
    p.add_argument("--zoo", default="tiny", choices=ZOO_SIZE_NAMES, help="zoo size used for the defaults")
    p.add_argument("--prompts", metavar="N", type=int, default=16, help="calibration prompts (held-out corpus split)")
    p.add_argument("--max-new-tokens", metavar="N", type=int, default=64, help="tokens per calibration answer")
    p.add_argument("--out", metavar="FILE", default=None, help="write the whole table as JSON")
    add_placement_options(p)  # measure the layers' costs where the early exit will run
    p.add_argument("--threads", metavar="N", default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def calibration_sequences(target, tokenizer, questions, max_new_tokens: int) -> tuple[list[list[int]], list[int]]:
    """Each question's chat prompt followed by the target's greedy answer, and where each answer starts."""
    import torch

    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.generate import GenerationConfig, generate
    from draftsmith.inference.evaluation.runs import chat_prompt_ids

    adapter = ModelAdapter(target)
    eos = tokenizer.eos_token_id
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=(eos,) if eos is not None else ())
    sequences, starts = [], []
    for q in questions:
        prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": q.turns[0]}])
        prompt = prompt[-max(1, adapter.max_positions - max_new_tokens - 1):]
        answer = generate(adapter, torch.tensor(prompt, device=adapter.device), config).output_ids
        sequences.append(prompt + list(answer))
        starts.append(len(prompt))
    return sequences, starts


def run(args: argparse.Namespace) -> int:
    from draftsmith.common.io import atomic_write_json
    from draftsmith.inference.evaluation.exit_layer import choose_exit
    from draftsmith.launch.eval_cli import threads_context
    from draftsmith.launch.targets import load_target, placement
    from draftsmith.launch.tune_cli import calibration_questions

    if args.prompts < 1 or args.max_new_tokens < 1:
        raise ConfigError("--prompts and --max-new-tokens must be at least 1")
    device, dtype = placement(args)
    with threads_context(args.threads):
        target_arg = args.target
        manifest = None
        if args.artefact:
            from draftsmith.inference.artefacts.reader import WEIGHT_PATHS, read_manifest

            if args.target is not None:
                raise ConfigError("--target and --artefact both name the model to measure: pass --artefact alone (its "
                                  "adapted target is measured), or --target alone")
            manifest = read_manifest(args.artefact)  # every file checked, the adapted target's included
            if manifest["kind"] != "adapted_target":
                raise ConfigError(f"{args.artefact} does not hold an adapted target: --artefact takes a LayerSkip "
                                  "artefact; measure any other model with --target")
            target_arg = str(Path(args.artefact) / WEIGHT_PATHS["adapted_target"])
        target_dir, target, tokenizer = load_target(target_arg, args.tokenizer, args.zoo, dtype=dtype, device=device)
        questions = calibration_questions(args.prompts, args.seed)
        sequences, starts = calibration_sequences(target, tokenizer, questions, args.max_new_tokens)
        record = choose_exit(target, sequences, starts)
    record["calibration"] = {"prompts": len(questions), "max_new_tokens": args.max_new_tokens, "target": str(target_dir)}
    if args.out:
        atomic_write_json(Path(args.out), record)
    if manifest is not None:
        from draftsmith.inference.artefacts.manifest import rewrite_manifest

        manifest["proposer"].update(exit_layer=record["chosen"]["exit_layer"],
                                    draft_length=record["chosen"]["draft_length"], draft_length_mode="fixed")
        manifest["tuning"] = {"exit_layer": record}
        rewrite_manifest(args.artefact, manifest)
    print("exit  agreement  " + "  ".join(f"{e + 1}:{a:.3f}" for e, a in enumerate(record["agreement"])))
    for name in ("chosen", "runner_up"):
        c = record[name]
        if c:
            print(f"{name}: exit layer {c['exit_layer']}, draft length {c['draft_length']}: agreement {c['agreement']:.3f}, "
                  f"predicted tau {c['predicted_tau']:.3f}, speedup {c['predicted_speedup']:.3f}")
    c = record["chosen"]
    print(json.dumps({"exit_layer": c["exit_layer"], "draft_length": c["draft_length"]}))
    return 0
