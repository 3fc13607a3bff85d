"""draftsmith's EAGLE-3 feature cache as speculators 0.9.0's offline data (run by the peer's interpreter, which has
``datasets``): the same rows, the same loss tokens, the same hidden states, written once.

    <peer env>/bin/python to_speculators.py CACHE_DIR TARGET_DIR OUT_DIR [LAYERS]   # LAYERS: e.g. 1,3 (DFlash)

- ``OUT_DIR``: a ``datasets`` folder (``save_to_disk``) of ``input_ids``, ``loss_mask`` (1 where draftsmith's labels
  train the token) and ``seq_len``; ``OUT_DIR/hidden_states/hs_<row>.safetensors`` holding ``token_ids`` [T] and
  ``hidden_states`` [T, L+1, H]: the cache's auxiliary layers in ascending order (EAGLE-3's three, or ``LAYERS``),
  then the last decoder layer's output *before* the final norm, which speculators' trainer normalises itself.
- The cache keeps the last layer after the norm (``layer_-1``, what the LM head reads). RMSNorm scales each row to
  unit root mean square and multiplies by the norm's weight ``w``, so ``layer_-1 / w`` is a row of unit root mean
  square whose norm is ``layer_-1`` again (to the norm's epsilon): the logits speculators computes from it are the
  ones draftsmith's trainer reads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def norm_weight(target: Path) -> torch.Tensor:  # [H]
    for path in sorted(target.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            if "model.norm.weight" in f.keys():
                return f.get_tensor("model.norm.weight").float()
    raise SystemExit(f"{target} has no model.norm.weight")


def convert(cache: Path, target: Path, out: Path, layers: list[int] | None = None) -> int:
    """``layers``: the auxiliary layers to write (default: every one the cache keeps but the last, EAGLE-3's three;
    DFlash's are its draft layers' own), then the last layer before the final norm."""
    from datasets import Dataset

    manifest = json.loads((cache / "manifest.json").read_text())
    aux = sorted(layers or [layer for layer in manifest["layers"] if layer >= 0])
    assert set(aux) <= set(manifest["layers"]) and -1 in manifest["layers"], (aux, manifest["layers"])
    weight = norm_weight(target)
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    columns: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    row = 0
    for shard in manifest["shards"]:
        tensors = load_file(str(cache / shard["file"]))
        offsets = tensors["offsets"].tolist()
        for a, b in zip(offsets, offsets[1:]):
            ids = tensors["input_ids"][a:b].long()  # [T]
            stack = [tensors[f"layer_{layer}"][a:b].float() for layer in aux]
            stack.append(tensors["layer_-1"][a:b].float() / weight)  # before the final norm
            save_file({"token_ids": ids, "hidden_states": torch.stack(stack, dim=1).contiguous()},  # [T, L+1, H]
                      str(out / "hidden_states" / f"hs_{row}.safetensors"))
            columns["input_ids"].append(ids.tolist())
            columns["loss_mask"].append((tensors["labels"][a:b] != -100).long().tolist())
            columns["seq_len"].append(b - a)
            row += 1
    data = Dataset.from_dict(columns)
    data.set_format("torch")
    data.save_to_disk(str(out))
    return row


if __name__ == "__main__":
    picked = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
    rows = convert(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), picked)
    print(json.dumps({"rows": rows, "out": sys.argv[3]}))
