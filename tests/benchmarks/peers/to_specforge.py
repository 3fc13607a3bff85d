"""draftsmith's EAGLE-3 feature cache as SpecForge 0.2.0's offline features (run by the peer's interpreter): the same
rows, loss tokens and hidden states, written once, one ``rows/data_<i>.ckpt`` (``torch.save``) per row.

    <peer env>/bin/python to_specforge.py CACHE_DIR OUT_DIR

Each file: ``input_ids`` [T] int64; ``loss_mask`` [T] int64 (1 where draftsmith's labels train the token);
``hidden_state`` [T, H] bfloat16, the last layer after the final norm (what the LM head reads: the cache's
``layer_-1`` as it is); ``aux_hidden_state`` [T, 3H] bfloat16, the cache's three auxiliary layers in ascending order,
concatenated. SpecForge reads bfloat16 (its target head is bfloat16 and casts nothing). Every tensor is a copy:
``torch.save`` of a slice writes the whole shard's storage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def convert(cache: Path, out: Path) -> int:
    manifest = json.loads((cache / "manifest.json").read_text())
    aux = sorted(layer for layer in manifest["layers"] if layer >= 0)
    (out / "rows").mkdir(parents=True, exist_ok=True)
    row = 0
    for shard in manifest["shards"]:
        tensors = load_file(str(cache / shard["file"]))
        offsets = tensors["offsets"].tolist()
        for a, b in zip(offsets, offsets[1:]):
            torch.save({"input_ids": tensors["input_ids"][a:b].long(),
                        "loss_mask": (tensors["labels"][a:b] != -100).long(),
                        "hidden_state": tensors["layer_-1"][a:b].bfloat16().clone(),  # a view saves its shard
                        "aux_hidden_state": torch.cat([tensors[f"layer_{i}"][a:b] for i in aux], -1).bfloat16()},
                       out / "rows" / f"data_{row}.ckpt")
            row += 1
    return row


if __name__ == "__main__":
    print(json.dumps({"rows": convert(Path(sys.argv[1]), Path(sys.argv[2])), "out": sys.argv[2]}))
