"""Reading weights whatever shards them (draftsmith.common.sharding): unsharded tensors pass through untouched; on 2
CPU processes the weights fingerprint, the heads started from the target and the fine-tuning methods' copy of it
are the same on a target ZeRO-3 partitions (FSDP2 shards: the fingerprint) as on a whole one (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from two_processes import two_process_result

from draftsmith.common.sharding import full_tensor, partitioned, whole

HERE = Path(__file__).resolve().parent


def test_plain_tensors_are_neither_partitioned_nor_copied():
    weight = torch.nn.Parameter(torch.randn(4, 3))
    assert not partitioned(weight)
    assert full_tensor(weight).data_ptr() == weight.data_ptr()
    with whole([weight]):
        assert weight.shape == (4, 3)


@pytest.mark.slow
def test_fingerprints_and_heads_read_the_same_weights_under_zero3_and_fsdp2(tmp_path):
    result = two_process_result(HERE / "sharded_reads.py", tmp_path / "reads.json", 29690)
    assert result["zero3_local_numel"] == 0  # the embedding really is partitioned on each process
    assert result["fsdp2"] == result["whole"] and result["zero3"] == result["whole"]
    assert result["zero3_built_equal"] == {"eagle3_lm_head": True, "eagle3_norm": True, "medusa_lm_head": True,
                                           "bita_masks": True}
    assert result["zero3_copy_equal"] is True  # whole_copy of a partitioned target: plain, whole, equal
