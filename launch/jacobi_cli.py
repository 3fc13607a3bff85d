"""``draftsmith data jacobi``: the target's Jacobi trajectories, CLLM's training data (:mod:`draftsmith.data.jacobi`);
an action CLLM's registry entry adds to ``draftsmith data`` (``data_commands``).

    draftsmith data jacobi --target PATH --prompts corpus --out runs/traj/train.jsonl --block 16 --limit 500
"""

from __future__ import annotations

import argparse

from draftsmith.launch.data_cli import load_data_target, load_prompt_sets, machine_options, target_and_prompts


def add_parser(actions) -> None:
    j = actions.add_parser("jacobi", help="collect the target's Jacobi trajectories (CLLM's data; resumable)",
                           description="Run greedy Jacobi decoding of --block-token blocks with the target on a prompt "
                                       "set and record every state of every block to its fixed point: batched, "
                                       "resumable (rerun the same command after a kill).")
    target_and_prompts(j)
    j.add_argument("--block", metavar="N", type=int, default=16, help="Jacobi block size (default 16, CLLM's)")
    j.add_argument("--max-new-tokens", metavar="N", type=int, default=256, help="answer tokens per prompt (whole "
                                                                                "blocks, to the first end-of-sequence)")
    j.add_argument("--batch-size", metavar="B", type=int, default=8, help="prompts per batch (default 8)")
    j.add_argument("--seed", metavar="S", type=int, default=0, help="seed of the initial guesses")
    machine_options(j, run)


def run(args: argparse.Namespace) -> int:
    from draftsmith.common.models import target_identity
    from draftsmith.data.chat import build_prompt_ids
    from draftsmith.data.generation import eos_token_ids, pad_token_id
    from draftsmith.data.jacobi import collect_trajectories

    ids, prompts, _ = load_prompt_sets(args.prompts, args.limit)
    model, tokenizer = load_data_target(args)
    token_ids = [build_prompt_ids(tokenizer, p) for p in prompts]
    stats = collect_trajectories(model, token_ids, ids, args.out, target=target_identity(model, tokenizer, str(args.target)),
                                 block=args.block, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                 eos_ids=eos_token_ids(tokenizer, model.config), batch_size=args.batch_size,
                                 pad_id=pad_token_id(tokenizer, model.config), progress=not args.no_progress)
    print(f"{args.out}: {stats['prompts']} prompts, {stats['blocks']} blocks, {stats['updates_per_block']:.2f} Jacobi "
          f"updates per block, {stats['seconds']:.1f} s")
    return 0
