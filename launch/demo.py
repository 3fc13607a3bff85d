"""``draftsmith demo``: build (or reuse) the tiny zoo, generate from its target, and decode the same
prompt speculatively with the zoo draft to show that the output is identical and how many tokens
each target forward committed."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="build the tiny zoo if needed and show a speculative generation")
    p.add_argument("--size", default="tiny", choices=["tiny", "small"], help="zoo size")
    p.add_argument("--home", default=None, help="DRAFTSMITH_HOME (default ~/.cache/draftsmith)")
    p.add_argument("--prompt", default="Write a Python function that returns the square of a number.")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from draftsmith.data.zoo import load_zoo
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.draft_length import DraftLengthPolicy
    from draftsmith.inference.core.generate import GenerationConfig, generate
    from draftsmith.inference.proposers.draft_model import DraftModelProposer
    from draftsmith.trainers.zoo import ensure_zoo

    ensure_zoo(args.size, home=args.home)
    tokenizer, target, draft = load_zoo(args.size, home=args.home)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_dict=False
    )
    prompt = torch.tensor(ids, dtype=torch.long)
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=(tokenizer.eos_token_id,))
    adapter = ModelAdapter(target)
    ar = generate(adapter, prompt, cfg)
    sd = generate(adapter, prompt, cfg, DraftModelProposer(draft, DraftLengthPolicy(length=4)))
    print(f"prompt: {args.prompt}")
    print(f"target ({sum(p.numel() for p in target.parameters()) / 1e6:.1f}M parameters) answers:")
    print("  " + tokenizer.decode(ar.output_ids, skip_special_tokens=True).strip().replace("\n", "\n  "))
    same = "identical" if sd.output_ids == ar.output_ids else "DIFFERENT"
    print(
        f"speculative decoding with the zoo draft: {same} output, tau {sd.tau:.2f} tokens per target forward, "
        f"acceptance {sd.acceptance_rate:.2f}, {len(sd.output_ids) / sd.wall_time:.0f} vs "
        f"{len(ar.output_ids) / ar.wall_time:.0f} tokens/s (autoregressive)"
    )
    return 0
