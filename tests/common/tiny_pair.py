"""A tiny random Llama target/draft pair with a character tokenizer and a 48-row chat dataset, written to disk for
recipe runs (tests/launch, tests/gpu)."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.data.tiny_models import char_tokenizer, random_model


def write_pair(root: Path, target_layers: int = 2) -> dict[str, Path]:
    """target/, draft/ (HF model directories with the tokenizer) and data.jsonl (48 chat rows) under ``root``."""
    tokenizer = char_tokenizer()
    paths = {"target": root / "target", "draft": root / "draft", "dataset": root / "data.jsonl"}
    for name, model in (("target", random_model("llama", seed=0, layers=target_layers)), ("draft", random_model("llama", seed=1, layers=1))):
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                      {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]}
        for i in range(48)
    ]
    paths["dataset"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def write_target(root: Path, layers: int) -> Path:
    """A random llama target of ``layers`` layers (seed 0, the pair's target seed) with the pair's tokenizer, under
    ``root/target<layers>``."""
    out = root / f"target{layers}"
    random_model("llama", seed=0, layers=layers).save_pretrained(out)
    char_tokenizer().save_pretrained(out)
    return out
