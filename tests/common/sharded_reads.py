"""Run under ``torchrun --nproc_per_node 2`` (CPU, gloo) by tests/common/test_sharding.py: the weights fingerprint,
an EAGLE-3 head, Medusa heads and BiTA's embeddings started from a target, each on a whole target, on one ZeRO-3
partitions and (the fingerprint) on one FSDP2 shards; rank 0 writes what each gave to the JSON file named by
argv[1]."""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist


def built(target) -> dict[str, torch.Tensor]:
    """What each head builder reads from ``target``: tensors to compare."""
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.drafters.bita import BitaEmbeddings
    from draftsmith.inference.drafters.eagle import Eagle3Head, draft_vocab
    from draftsmith.inference.drafters.medusa import MedusaHeads

    d2t, t2d = draft_vocab(torch.arange(target.config.vocab_size), 64)
    eagle3 = Eagle3Head.for_target(target, d2t, t2d)
    medusa = MedusaHeads(target.config.hidden_size, target.config.vocab_size, heads=2, shared_lm_head=False)
    medusa.init_lm_heads(target.get_output_embeddings())
    bita = BitaEmbeddings.for_target(target, prompt_tokens=4, mask_tokens=3)
    bita.init_from_target(ModelAdapter(target), seed=0)
    return {"eagle3_lm_head": eagle3.lm_head.weight, "eagle3_norm": eagle3.norm.weight,
            "medusa_lm_head": medusa.lm_heads[0].weight, "bita_masks": bita.masks}


def main(out: str) -> None:
    import deepspeed
    from torch.distributed.fsdp import fully_shard

    from draftsmith.data.row_files import weights_sample_sha256
    from draftsmith.data.tiny_models import random_model

    dist.init_process_group("gloo")
    target = random_model("llama", seed=0, layers=4).requires_grad_(False)
    result = {"whole": weights_sample_sha256(target)}
    whole = {k: v.detach().clone() for k, v in built(target).items()}
    sharded = copy.deepcopy(target)
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)
    result["fsdp2"] = weights_sample_sha256(sharded)
    partitioned = copy.deepcopy(target)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    deepspeed.zero.Init(module=partitioned, config_dict_or_path=config)
    result["zero3_local_numel"] = int(partitioned.model.embed_tokens.weight.numel())  # 0: partitioned
    result["zero3"] = weights_sample_sha256(partitioned)
    result["zero3_built_equal"] = {k: bool(torch.equal(v.detach(), whole[k])) for k, v in built(partitioned).items()}
    from draftsmith.common.sharding import whole_copy

    copied = whole_copy(partitioned)  # the fine-tuning methods' copy of the target
    result["zero3_copy_equal"] = all(torch.equal(v, target.state_dict()[k]) for k, v in copied.state_dict().items())
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
