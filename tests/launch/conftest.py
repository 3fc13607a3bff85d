"""A tiny random target/draft pair, a character tokenizer and a chat dataset written to disk for recipe runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_pair import write_pair


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
        script = [str(ROOT / "recipes" / f"{method}.py"), "--config", str(ROOT / "launch" / "configs" / "recipes" / f"{method}_test.yaml"),
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


class ZooIdentity:
    """The slow done-when check of a recipe on the tiny zoo: ``train(recipe, *overrides)`` runs it briefly (40
    steps); ``check(result, label, **load_kwargs)`` decodes the dev questions (``--dev-questions``, 64 new tokens) with
    the artefact's proposer, verified against the artefact's adapted target where it has one, asserts every answer
    token-identical to that model's AR, and returns the report."""

    def __init__(self, root: Path, questions: list) -> None:
        self.root, self.questions = root, questions

    def train(self, recipe: str, *overrides: str, name: str | None = None):
        from draftsmith.launch.recipe import run_recipe

        return run_recipe(recipe, ["--output_dir", str(self.root / (name or recipe)), "max_steps=40", "eval_steps=40",
                                   "save_steps=40", "evaluate=false", "eval_examples=16", *overrides])

    def check(self, result, label: str, **load_kwargs) -> dict:
        from draftsmith.data.zoo import load_zoo
        from draftsmith.inference.artefacts.manifest import adapted_target
        from draftsmith.inference.evaluation.evaluator import evaluate
        from draftsmith.inference.methods import load_artefact

        tokenizer, target, _ = load_zoo("tiny")
        verified = adapted_target(result.artefact, result.manifest, target)
        proposer, _ = load_artefact(result.artefact, target, tokenizer, **load_kwargs)
        rep = evaluate(verified, tokenizer, label, lambda: proposer, self.questions, max_new_tokens=64, warmup=1,
                       progress=False)
        assert rep["num_questions"] == len(self.questions)
        differing = [(r["question_id"], r["difference"]) for r in rep["questions"] if not r["identical"]]
        assert rep["summary"]["greedy_identical"] == 1.0, (label, load_kwargs, differing[:3])
        return rep


@pytest.fixture
def zoo_identity(tmp_path, dev_questions) -> ZooIdentity:
    return ZooIdentity(tmp_path, dev_questions)


@pytest.fixture
def offline_matches_online(tmp_path):
    """``offline_matches_online(method, args)``: trains ``method`` 4 steps three times, ``args(out)`` plus the target's
    features online, from a float32 cache and from a float16 cache (under ``tmp_path / "cache"``, returned), the
    cached rows in the online run's order (``feature_order=random``), and checks the loss curves: float32 features give the online losses, float16 ones stay within half-precision
    rounding and differ (they were the ones trained on)."""

    from draftsmith.launch.recipe import run_recipe

    def check(method: str, args) -> Path:
        cache, curves = tmp_path / "cache", {}
        for mode, dtype in (("online", "float32"), ("offline", "float32"), ("offline", "float16")):
            out = tmp_path / f"{mode}-{dtype}"
            run_recipe(method, [*args(out), f"features={mode}", f"feature_cache_dtype={dtype}", "feature_order=random",
                                f"feature_cache_dir={cache}", "max_steps=4", "eval_steps=4", "save_steps=4"], None)
            state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
            curves[(mode, dtype)] = [h["loss"] for h in state["log_history"] if "loss" in h]
        online = curves[("online", "float32")]
        assert len(online) == 4
        assert curves[("offline", "float32")] == pytest.approx(online, rel=1e-4)
        assert curves[("offline", "float16")] == pytest.approx(online, rel=2e-2)
        assert curves[("offline", "float16")] != online
        return cache

    return check
