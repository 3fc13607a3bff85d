"""recipes/distillspec.py end to end on a tiny random pair: python, accelerate (2 CPU processes), deepspeed ZeRO-2
(2 CPU processes), kill-and-resume; plus config parsing and checkpoint resolution."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers
import yaml

from draftsmith.common.errors import ConfigError
from draftsmith.common.io import sha256_file
from draftsmith.common.models import target_identity
from draftsmith.inference.methods import load_artefact
from draftsmith.launch.recipe import complete_checkpoints, resolve_resume
from draftsmith.launch.recipe_args import RecipeArguments, parse_recipe_args
from draftsmith.trainers.distillspec.trainer import DistillSpecConfig

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "distillspec.py"
TEST_CONFIG = ROOT / "launch" / "configs" / "recipes" / "distillspec_test.yaml"
BIN = Path(sys.executable).parent


def pair_args(pair: dict, out: Path) -> list[str]:
    return ["--config", str(TEST_CONFIG), "--target", str(pair["target"]), "--draft", str(pair["draft"]),
            "--dataset", str(pair["dataset"]), "--output_dir", str(out)]


def run(cmd: list[str], timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    print(f"{' '.join(cmd[:4])} ... took {time.time() - start:.1f}s")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def check_artefact(pair: dict, out: Path, world_size: int, steps: int = 3) -> dict:
    target = transformers.AutoModelForCausalLM.from_pretrained(pair["target"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(pair["target"])
    proposer, manifest = load_artefact(out / "artefact", target, tokenizer)
    assert type(proposer).__name__ == "DraftModelProposer"
    assert manifest["method"] == "distillspec"
    assert manifest["proposer"] == {"draft_length": 3, "model_dir": "draft"}
    training = manifest["training"]
    assert training["steps"] == steps and training["world_size"] == world_size and training["seed"] == 42
    assert training["tokens"] > 0
    assert training["data"]["name"] == str(pair["dataset"])
    assert training["data"]["sha256"] == sha256_file(pair["dataset"])
    assert training["config"]["distillspec"]["divergence"] == "tvd"
    metrics = manifest["metrics"]
    assert metrics["estimated_acceptance"] == pytest.approx(1 - metrics["tvd"])
    assert 1.0 <= metrics["predicted_tau"] <= 4.0 and metrics["eval_loss"] >= 0
    # the draft moved away from where it started
    trained = transformers.AutoModelForCausalLM.from_pretrained(out / "artefact" / "draft")
    start = transformers.AutoModelForCausalLM.from_pretrained(pair["draft"])
    assert any((a - b).abs().max() > 0 for a, b in zip(trained.parameters(), start.parameters()))
    return manifest


# --------------------------------------------------------------------------------------------------- parsing


def test_yaml_then_flags_then_key_value(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"divergence": "jsd", "beta": 0.2, "max_steps": 7, "learning_rate": "1e-4",
                                   "output_dir": str(tmp_path / "o"), "max_length": 64, "report_to": "none"}))
    recipe, distill, targs = parse_recipe_args(DistillSpecConfig, ["--config", str(cfg), "--max_steps", "9", "beta=0.7"])
    assert recipe.config == str(cfg) and recipe.max_length == 64
    assert distill.divergence == "jsd" and distill.beta == 0.7  # key=value beats the file
    assert targs.max_steps == 9 and targs.learning_rate == pytest.approx(1e-4)  # YAML's "1e-4" string is converted


def test_default_config_is_used_without_arguments(tmp_path):
    cfg = tmp_path / "d.yaml"
    cfg.write_text("data_mode: onpolicy\nreport_to: none\n")
    _, distill, _ = parse_recipe_args(DistillSpecConfig, ["--output_dir", str(tmp_path)], default_config=cfg)
    assert distill.data_mode == "onpolicy"


@pytest.mark.parametrize("text, match", [("divergnce: tvd\n", "unknown setting.*divergnce"),
                                         ("- a\n- b\n", "must be a mapping"),
                                         ("a: [\n", "not valid YAML"),
                                         ("divergence: kl\n", "divergence='kl' is unknown")])
def test_bad_config_files_name_the_problem(tmp_path, text, match):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=match):
        parse_recipe_args(DistillSpecConfig, ["--config", str(cfg), "--output_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="does not exist"):
        parse_recipe_args(DistillSpecConfig, ["--config", str(tmp_path / "missing.yaml")])
    with pytest.raises(ConfigError, match=r"unknown argument\(s\).*--max_stepz"):
        parse_recipe_args(DistillSpecConfig, ["--output_dir", str(tmp_path), "--max_stepz", "3"])


@pytest.mark.parametrize("path", sorted((ROOT / "launch" / "configs" / "recipes").glob("distillspec*.yaml")), ids=lambda p: p.name)
def test_every_shipped_distillspec_config_parses(path, tmp_path):
    recipe, distill, targs = parse_recipe_args(DistillSpecConfig, ["--config", str(path), "--output_dir", str(tmp_path)])
    assert recipe.config == str(path) and targs.max_steps > 0 and distill.divergence


def test_recipe_arguments_validation():
    with pytest.raises(ConfigError, match="zoo_size"):
        RecipeArguments(zoo_size="huge")
    with pytest.raises(ConfigError, match="--draft was given without --target"):
        RecipeArguments(draft="somewhere")


# ------------------------------------------------------------------------------------------------- resuming


def test_resume_picks_the_last_complete_checkpoint(tmp_path):
    for step, complete in ((2, True), (4, True), (6, False)):  # checkpoint-6 was being written when killed
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x")
        if complete:
            (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-8").mkdir()
    (tmp_path / "checkpoint-8" / "trainer_state.json").write_text("{\"global_st")  # torn write
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-4"]
    assert resolve_resume("latest", tmp_path) == str(tmp_path / "checkpoint-4")
    assert resolve_resume("auto", tmp_path) == str(tmp_path / "checkpoint-4")
    assert resolve_resume(None, tmp_path) is None and resolve_resume("false", tmp_path) is None
    assert resolve_resume("auto", tmp_path / "empty") is None
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        resolve_resume("true", tmp_path / "empty")
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        resolve_resume(str(tmp_path / "checkpoint-6"), tmp_path)


# ------------------------------------------------------------------------------------------------ real runs


def test_python_run_writes_a_loadable_artefact(tiny_pair, tmp_path):
    out = tmp_path / "run"
    proc = run([sys.executable, str(RECIPE), *pair_args(tiny_pair, out), "--max_steps", "3", "seed=42"])
    assert f"artefact: {out / 'artefact'}" in proc.stdout
    check_artefact(tiny_pair, out, world_size=1)
    assert not list((out / "artefact").rglob("*.bin")) and (out / "artefact" / "draft" / "tokenizer.json").is_file()
    assert list((out / "runs").rglob("events.out.tfevents*")), "no TensorBoard logs under output_dir/runs"


def test_bad_setting_exits_2_with_one_line(tiny_pair, tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("distillspec_recipe", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    monkeypatch.setattr(sys, "argv", ["distillspec.py", *pair_args(tiny_pair, tmp_path), "divergence=kl"])
    assert recipe.main() == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: divergence='kl' is unknown: choose one of forward_kl, reverse_kl, jsd, tvd, nla, lk_hybrid"]


def test_token_signal_trains_on_the_targets_own_answers_and_refuses_other_data(tiny_pair, tmp_path, capsys):
    from draftsmith.data.self_distill import dataset_prompts, generate_answers
    from draftsmith.launch.recipe import recipe_main, run_recipe

    tokens = ["target_signal=tokens", "data_mode=fixed", "--max_steps", "2", "tune=false", "evaluate=false"]
    assert recipe_main("distillspec", [*pair_args(tiny_pair, tmp_path / "refused"), *tokens]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the tokenizing progress bar
    assert err.startswith("error: ") and "has no .meta.json of `draftsmith data generate`" in err

    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_pair["target"])
    prompts, _ = dataset_prompts(tiny_pair["dataset"])
    answers = tmp_path / "answers.jsonl"
    generate_answers(target, tokenizer, prompts, answers, batch_size=16, max_new_tokens=6, progress=False)
    argv = [*pair_args(tiny_pair, tmp_path / "run"), *tokens]
    argv[argv.index(str(tiny_pair["dataset"]))] = str(answers)
    result = run_recipe("distillspec", argv, None)
    training = result.manifest["training"]
    assert training["data"]["answered_by"]["config_sha256"] == target_identity(target, tokenizer)["config_sha256"]
    assert training["config"]["distillspec"]["target_signal"] == "tokens" and training["tokens"] > 0

    draft = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["draft"])  # a reduced vocabulary, refitted
    draft.config.draft_vocab = list(range(60, 100))
    draft.save_pretrained(tmp_path / "draft")
    tokenizer.save_pretrained(tmp_path / "draft")
    argv[argv.index(str(tiny_pair["draft"]))] = str(tmp_path / "draft")
    argv[argv.index(str(tmp_path / "run"))] = str(tmp_path / "refit")
    training = run_recipe("distillspec", [*argv, "draft_vocab=answers"], None).manifest["training"]
    saved = json.loads((tmp_path / "refit" / "artefact" / "draft" / "config.json").read_text())["draft_vocab"]
    assert len(saved) == 40 and saved != list(range(60, 100)) and training["draft_vocab_size"] == 40
    assert training["draft_vocab_heldout_coverage"] > training["draft_vocab_heldout_coverage_before"]


def test_offline_and_online_target_features_train_to_the_same_loss_curve(tiny_pair, offline_matches_online):
    """The same rows and seed: the target's logits from its cached last hidden state or from its forward in every step
    (conftest's ``offline_matches_online``)."""
    cache = offline_matches_online("distillspec", lambda out: pair_args(tiny_pair, out))
    assert len(list(cache.iterdir())) == 2  # the training rows, in float32 and in float16


def test_draft_layers_grows_the_draft_the_artefact_then_carries(tiny_pair, tmp_path):
    import torch

    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.generate import GenerationConfig, generate
    from draftsmith.launch.recipe import run_recipe

    out = tmp_path / "grown"
    result = run_recipe("distillspec", [*pair_args(tiny_pair, out), "draft_layers=2", "--max_steps", "2"], None)
    assert result.manifest["training"]["config"]["distillspec"]["draft_layers"] == 2
    draft = transformers.AutoModelForCausalLM.from_pretrained(out / "artefact" / "draft")
    assert draft.config.num_hidden_layers == 2
    assert draft.model.layers[1].mlp.down_proj.weight.abs().sum() > 0  # the zeroed writer trained
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_pair["target"])
    proposer, _ = load_artefact(out / "artefact", target, tokenizer)
    adapter = ModelAdapter(target)
    prompt = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(0))
    ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=16))
    sp = generate(adapter, prompt, GenerationConfig(max_new_tokens=16), proposer)
    assert sp.output_ids == ar.output_ids and sp.num_proposed > 0


def test_accelerate_two_cpu_processes(tiny_pair, tmp_path):
    out = tmp_path / "acc"
    cfg = ROOT / "launch" / "configs" / "accelerate" / "cpu_2proc.yaml"
    # also covers the fused kernel under DDP and mixed (on-policy + fixed) batches
    run([str(BIN / "accelerate"), "launch", "--config_file", str(cfg), "--main_process_port", "29531", str(RECIPE),
         *pair_args(tiny_pair, out), "--max_steps", "3", "seed=42", "use_fused_kernel=true", "data_mode=mixed",
         "max_new_tokens=8", "ddp_find_unused_parameters=false"])
    manifest = check_artefact(tiny_pair, out, world_size=2)
    assert manifest["training"]["config"]["distillspec"]["use_fused_kernel"] is True


def test_deepspeed_zero2_two_cpu_processes(tiny_pair, tmp_path):
    """The first DeepSpeed run on a machine JIT-builds its CPU shared-memory op (29 s on an idle 2-core machine,
    then cached in ~/.cache/torch_extensions): 48 s in all from a cold cache."""
    out = tmp_path / "ds"
    run([str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", "29532", str(RECIPE),
         *pair_args(tiny_pair, out), "--max_steps", "3", "seed=42",
         "--deepspeed", str(ROOT / "launch" / "configs" / "deepspeed" / "zero2.json")], timeout=1200)
    manifest = check_artefact(tiny_pair, out, world_size=2)
    assert manifest["training"]["config"]["training_args"]["deepspeed"].endswith("zero2.json")


def test_kill_and_resume(tiny_pair, tmp_path):
    out = tmp_path / "resume"
    args = [sys.executable, str(RECIPE), *pair_args(tiny_pair, out), "--max_steps", "40", "--save_steps", "5",
            "eval_strategy=no", "save_total_limit=0", "seed=42"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not complete_checkpoints(out) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed_at = int(complete_checkpoints(out)[-1].name.split("-")[1])
    assert 5 <= killed_at < 40 and not (out / "artefact").exists()
    done = run(args + ["--resume_from_checkpoint", "latest"])
    state = json.loads((out / "checkpoint-40" / "trainer_state.json").read_text())
    steps_logged = [h["step"] for h in state["log_history"] if "loss" in h]
    assert steps_logged == list(range(1, 41)), "log history should continue the killed run's"
    # the resumed process itself trained only the remaining steps
    assert done.stdout.count("'loss':") == 40 - killed_at
    manifest = check_artefact(tiny_pair, out, world_size=1, steps=40)
    assert manifest["training"]["tokens"] == state["log_history"][-1]["trained_tokens"]


def test_balanced_subset_takes_an_equal_share_of_every_source():
    from collections import Counter

    from draftsmith.data.corpus import balanced_subset

    rows = [{"source": "big", "i": i} for i in range(100)] + [{"source": "mid", "i": i} for i in range(30)] + \
           [{"source": "small", "i": i} for i in range(5)]
    picked = balanced_subset(rows, 60, seed=0)
    assert Counter(r["source"] for r in picked) == {"small": 5, "mid": 27, "big": 28}
    assert balanced_subset(rows, 60, seed=0) == picked and balanced_subset(rows, None, 0) is rows
    with pytest.raises(ConfigError, match="data_mix"):
        RecipeArguments(data_mix="random")
