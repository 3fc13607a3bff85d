"""Reading weights whatever shards them (draftsmith.common.sharding): unsharded tensors pass through untouched; on 2
CPU processes the weights fingerprint, the heads started from the target and the fine-tuning methods' copy of it
are the same on a target ZeRO-3 partitions (FSDP2 shards: the fingerprint) as on a whole one (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    out = tmp_path / "reads.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port",
                           "29690", str(HERE / "sharded_reads.py"), str(out)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["zero3_local_numel"] == 0  # the embedding really is partitioned on each process
    assert result["fsdp2"] == result["whole"] and result["zero3"] == result["whole"]
    assert result["zero3_built_equal"] == {"eagle3_lm_head": True, "eagle3_norm": True, "medusa_lm_head": True,
                                           "bita_masks": True}
    assert result["zero3_copy_equal"] is True  # whole_copy of a partitioned target: plain, whole, equal
