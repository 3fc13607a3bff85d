"""A tiny random target/draft pair, a character tokenizer and a chat dataset written to disk for recipe runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.data.tiny_models import char_tokenizer, random_model


def write_pair(root: Path) -> dict[str, Path]:
    """target/, draft/ (HF model directories with the tokenizer) and data.jsonl (48 chat rows) under ``root``."""
    tokenizer = char_tokenizer()
    paths = {"target": root / "target", "draft": root / "draft", "dataset": root / "data.jsonl"}
    for name, model in (("target", random_model("llama", seed=0, layers=2)), ("draft", random_model("llama", seed=1, layers=1))):
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                      {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]}
        for i in range(48)
    ]
    paths["dataset"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> dict[str, Path]:
    return write_pair(tmp_path_factory.mktemp("tiny_pair"))


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def launcher(tiny_pair):
    """``launcher(tool, method, port, *extra)``: ``recipes/<method>.py`` on the tiny pair with its ``<method>_test``
    config under ``accelerate launch`` (2 CPU processes) or ``deepspeed`` (ZeRO-2, 2 processes, gloo); returns the
    finished process and the output directory."""
    import os
    import subprocess
    import sys

    def run(tool: str, method: str, port: int, out: Path, *extra: str, timeout: int = 1200):
        bin_dir = Path(sys.executable).parent
        script = [str(ROOT / "recipes" / f"{method}.py"), "--config", str(ROOT / "recipes" / "configs" / f"{method}_test.yaml"),
                  "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out),
                  *extra]
        if tool == "accelerate":
            cmd = [str(bin_dir / "accelerate"), "launch", "--config_file",
                   str(ROOT / "launch" / "configs" / "accelerate" / "cpu_2proc.yaml"), "--main_process_port", str(port),
                   *script]
        else:
            cmd = [str(bin_dir / "deepspeed"), "--num_gpus", "2", "--master_port", str(port), *script, "--deepspeed",
                   str(ROOT / "launch" / "configs" / "deepspeed" / "zero2.json")]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)

    return run
