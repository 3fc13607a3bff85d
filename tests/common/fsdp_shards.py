"""Run under ``torchrun --nproc_per_node 2`` (CPU, gloo) by tests/trainers/test_cpu_fsdp.py: a tiny Llama with a
frozen embedding sharded by :func:`draftsmith.trainers.cpu_fsdp.shard_trained_module`; rank 0 writes what it found
to the JSON file named by argv[1]: which modules became FSDP units, whether the frozen weight stayed a plain tensor,
whether the whole state gathered equals the model before sharding, and whether loading a changed whole state gives
each process the matching shard."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def main(out: str) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from draftsmith.data.tiny_models import random_model
    from draftsmith.trainers.cpu_fsdp import load_whole_model_state, shard_trained_module, whole_model_state

    dist.init_process_group("gloo")
    model = random_model("llama", seed=0, layers=2)
    model.model.embed_tokens.requires_grad_(False)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    shard_trained_module(model, {"reshard_after_forward": True})
    gathered = {k: v.clone() for k, v in whole_model_state(model).items()}  # a frozen weight is returned as it is
    changed = {k: v + 1 for k, v in before.items()}
    load_whole_model_state(model, dict(changed))  # it may replace the given dict's entries by shards
    after = whole_model_state(model)
    result = {
        "units": sorted({type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule)}),
        "frozen_plain": not isinstance(model.model.embed_tokens.weight, DTensor),
        "trained_sharded": isinstance(model.model.layers[0].mlp.up_proj.weight, DTensor),
        "gathered_equal": bool(gathered) and all(torch.equal(gathered[k], before[k]) for k in before),
        "reloaded_equal": bool(after) and all(torch.equal(after[k], changed[k]) for k in changed),
        "other_rank_empty": dist.get_rank() == 0 or not gathered,
    }
    flags = [torch.tensor(float(result["other_rank_empty"]))]
    dist.all_reduce(flags[0], op=dist.ReduceOp.MIN)
    result["other_rank_empty"] = bool(flags[0].item())
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
