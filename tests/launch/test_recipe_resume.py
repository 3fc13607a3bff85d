"""Resuming a recipe run: changed settings that shape training are refused (or accepted with
--allow-changed-settings and recorded), the manifest's train_loss covers the whole run, and a tied-embedding draft
resumes without a false missing-keys warning. DistillSpec on the tiny pair of tests/common/tiny_pair.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import transformers

from draftsmith.common.errors import ConfigError
from draftsmith.launch.recipe import recipe_main, run_recipe, whole_run_loss
from draftsmith.launch.recipe_args import parse_recipe_args
from draftsmith.launch.run_settings import RUN_SETTINGS, check_resume_settings, settings_record, training_settings
from draftsmith.trainers.distillspec.trainer import DistillSpecConfig

ROOT = Path(__file__).resolve().parents[2]
TEST_CONFIG = ROOT / "launch" / "configs" / "recipes" / "distillspec_test.yaml"


def tied_draft(pair: dict, out: Path) -> Path:
    """The pair's draft architecture with its embedding tied to its LM head (saved once in safetensors)."""
    config = transformers.AutoConfig.from_pretrained(pair["draft"])
    config.tie_word_embeddings = True
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(pair["draft"]).save_pretrained(out)
    return out


def logged_losses(checkpoint: Path) -> list[float]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [h["loss"] for h in state["log_history"] if "loss" in h]


def test_resume_refuses_changed_settings_and_records_the_allowed_ones(tiny_pair, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    base = ["--config", str(TEST_CONFIG), "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]),
            "--draft", str(tied_draft(tiny_pair, tmp_path / "tied")), "--output_dir", str(out), "logging_steps=1",
            "eval_strategy=no", "save_steps=2", "tune=false"]
    first = run_recipe("distillspec", [*base, "max_steps=2"], None)
    assert first.manifest["training"]["settings_changes"] == []
    recorded = json.loads((out / "checkpoint-2" / RUN_SETTINGS).read_text())
    assert recorded["settings"]["method.divergence"] == "tvd" and recorded["settings"]["global_batch"] == 2

    # settings that shape training changed: refused in one line naming each change and the fix; nothing trained
    resume = [*base, "--resume_from_checkpoint", "latest"]
    capsys.readouterr()
    assert recipe_main("distillspec", [*resume, "max_steps=4", "divergence=forward_kl", "max_train_examples=32",
                                       "per_device_train_batch_size=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the tokenizing progress bar
    assert err.startswith(f"error: {out / 'checkpoint-2'} was trained with other settings (")
    for change in ("method.divergence 'tvd' -> 'forward_kl'", "max_train_examples 64 -> 32", "global_batch 2 -> 4"):
        assert change in err
    assert "--allow-changed-settings" in err and "--output_dir" in err
    assert not (out / "checkpoint-4").exists()

    # settings that do not shape training may change (the global batch is the same 1 x 2); a tied LM head is no
    # missing key
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        third = run_recipe("distillspec", [*resume, "max_steps=3", "save_steps=3", "logging_steps=1", "eval_steps=7",
                                           "per_device_train_batch_size=1", "gradient_accumulation_steps=2",
                                           "per_device_eval_batch_size=2", "dataloader_num_workers=0",
                                           "evaluate=false", "calibrate_tree=false", "report_to=none"], None)
    assert "missing keys" not in caplog.text + capsys.readouterr().err
    assert third.manifest["training"]["settings_changes"] == [] and third.manifest["training"]["steps"] == 3

    # with the flag: accepted, and recorded in the checkpoints and the manifest
    fourth = run_recipe("distillspec", [*resume, "max_steps=4", "save_steps=4", "divergence=forward_kl",
                                        "--allow-changed-settings"], None)
    change = {"step": 3, "changed": {"method.divergence": ["tvd", "forward_kl"]}}
    assert fourth.manifest["training"]["settings_changes"] == [change]
    recorded = json.loads((out / "checkpoint-4" / RUN_SETTINGS).read_text())
    assert recorded["settings"]["method.divergence"] == "forward_kl" and recorded["changes"] == [change]

    # the manifest's train_loss is over all four steps, not the mean of the last run's one
    losses = logged_losses(out / "checkpoint-4")
    assert len(losses) == 4 and len(set(losses)) == 4
    assert fourth.manifest["metrics"]["train_loss"] == pytest.approx(sum(losses) / 4)

    # the optimizer's settings are compared (the Trainer would restore the old schedule silently), and a max_steps
    # below the checkpoint's step is refused rather than writing the later model as this run's
    with pytest.raises(ConfigError, match=r"learning_rate 0\.001 -> 0\.01"):
        run_recipe("distillspec", [*resume, "max_steps=5", "learning_rate=0.01", "divergence=forward_kl"], None)
    with pytest.raises(ConfigError, match=r"max_steps=2 is below the step of .*checkpoint-4 \(4\).*max_steps >= 4"):
        run_recipe("distillspec", [*resume, "max_steps=2", "divergence=forward_kl"], None)

    # the recorded settings are now the new ones: the old divergence is the change
    with pytest.raises(ConfigError, match=r"method\.divergence 'forward_kl' -> 'tvd'"):
        run_recipe("distillspec", [*resume, "max_steps=5"], None)


# ------------------------------------------------------------------------------------------- the pure parts


def settings_of(tmp_path, *argv: str) -> dict:
    recipe, method, targs = parse_recipe_args(DistillSpecConfig, ["--output_dir", str(tmp_path), *argv])
    identity = {"config_sha256": "c" * 64, "tokenizer_sha256": "t" * 64, "vocab_size": 128}
    return training_settings("distillspec", method, recipe, targs, {"name": "d.jsonl", "sha256": "d" * 64},
                             {"target": identity, "draft": identity})


@pytest.mark.parametrize("argv", [
    ["logging_steps=3"], ["eval_steps=9", "eval_strategy=steps"], ["save_steps=7"], ["max_steps=99"],
    ["evaluate=true"], ["tune=true"], ["calibrate_tree=false"], ["eval_limit=3"],
    ["dataloader_num_workers=2"], ["per_device_eval_batch_size=16"], ["report_to=none"], ["run_name=x"], ["--output_dir", "/tmp/elsewhere"],
    ["feature_cache_dir=/tmp/cache"], ["per_device_train_batch_size=4", "gradient_accumulation_steps=2"],
    ["allow_changed_settings=true"],
], ids=lambda argv: " ".join(argv))
def test_settings_that_do_not_shape_training_are_not_compared(tmp_path, argv):
    base = ["per_device_train_batch_size=8"]
    assert settings_of(tmp_path, *base, *argv) == settings_of(tmp_path, *base)


@pytest.mark.parametrize("argv, key", [
    (["divergence=jsd"], "method.divergence"), (["max_length=64"], "max_length"),
    (["max_train_examples=9"], "max_train_examples"), (["data_mix=balanced"], "data_mix"),
    (["eval_examples=9"], "eval_examples"), (["dataset_format=sharegpt"], "dataset_format"), (["seed=7"], "seed"),
    (["dtype=bfloat16"], "dtype"), (["gradient_accumulation_steps=2"], "global_batch"),
    (["learning_rate=0.5"], "learning_rate"), (["lr_scheduler_type=constant"], "lr_scheduler_type"),
    (["warmup_steps=3"], "warmup_steps"), (["weight_decay=0.1"], "weight_decay"), (["max_grad_norm=0.5"], "max_grad_norm"),
])
def test_settings_that_shape_training_are_compared(tmp_path, argv, key):
    old, new = settings_of(tmp_path), settings_of(tmp_path, *argv)
    assert {k for k in new if new[k] != old[k]} == {key}


def test_a_checkpoint_without_recorded_settings_needs_the_flag(tmp_path):
    checkpoint = tmp_path / "checkpoint-6"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 6}))
    with pytest.raises(ConfigError, match="records no readable training settings .* --allow-changed-settings"):
        check_resume_settings(checkpoint, {"seed": 1}, allow_changed=False)
    assert check_resume_settings(checkpoint, {"seed": 1}, allow_changed=True) == [
        {"step": 6, "changed": {}, "unrecorded": True}]
    (checkpoint / RUN_SETTINGS).write_text(json.dumps(settings_record({"seed": 1, "data.sha256": "a" * 64}, [])))
    assert check_resume_settings(checkpoint, {"seed": 1, "data.sha256": "a" * 64}, allow_changed=False) == []
    with pytest.raises(ConfigError) as err:
        check_resume_settings(checkpoint, {"seed": 2, "data.sha256": "b" * 64}, allow_changed=False)
    assert "seed 1 -> 2, data.sha256 'aaaaaaaaaaaa...' -> 'bbbbbbbbbbbb...'" in str(err.value)
    assert "\n" not in str(err.value)
    assert check_resume_settings(None, {"seed": 2}, allow_changed=False) == []


def test_whole_run_loss_weights_each_log_by_the_steps_it_covers():
    history = [{"loss": 4.0, "step": 2}, {"eval_loss": 9.0, "step": 2}, {"loss": 1.0, "step": 3}]
    assert whole_run_loss(history, 3, run_loss=1.0, run_start=2) == pytest.approx(3.0)  # (4 x 2 + 1) / 3
    # resumed at step 3 of a run logged every 2 steps: steps 4-5 logged (mean 2), step 6 not (its loss 5)
    history = [{"loss": 4.0, "step": 2}, {"loss": 2.0, "step": 5}]
    assert whole_run_loss(history, 6, run_loss=3.0, run_start=3) == pytest.approx((4 * 2 + 2 * 2 + 5) / 5)
    assert whole_run_loss([], 5, run_loss=0.7) == 0.7  # nothing logged: the Trainer's own mean
    assert whole_run_loss([{"loss": 0.5, "step": 4}], 4, run_loss=0.5) == 0.5


def test_auto_trains_in_bfloat16_where_native_and_a_resume_across_the_dtype_is_refused(tiny_pair, tmp_path, capsys,
                                                                                      monkeypatch):
    """On a CPU with native bfloat16, ``dtype=auto`` holds the target in bfloat16 and trains float32 master weights
    under bfloat16 autocast, and the manifest says so; the same command on a machine without it (auto: float32)
    refuses to resume that checkpoint in one line naming the dtype to pass."""
    from safetensors import safe_open

    out = tmp_path / "run"
    base = ["--config", str(TEST_CONFIG), "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]),
            "--draft", str(tiny_pair["draft"]), "--output_dir", str(out), "eval_strategy=no", "save_steps=2",
            "tune=false"]
    monkeypatch.setenv("DRAFTSMITH_NATIVE_BF16", "1")
    first = run_recipe("distillspec", [*base, "max_steps=2"], None)
    config = first.manifest["training"]["config"]
    assert config["recipe"]["dtype"] == "bfloat16" and config["training_args"]["bf16"] is True
    weights = next(first.artefact.rglob("*.safetensors"))
    with safe_open(str(weights), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}  # the master weights

    monkeypatch.setenv("DRAFTSMITH_NATIVE_BF16", "0")
    capsys.readouterr()
    assert recipe_main("distillspec", [*base, "max_steps=3", "--resume_from_checkpoint", "latest"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "dtype 'bfloat16' -> 'float32'" in err and "resume with dtype=bfloat16" in err
    assert not (out / "checkpoint-3").exists()


def test_a_checkpoint_is_verified_against_the_sums_written_with_it(tiny_pair, tmp_path, capsys):
    """Every checkpoint records the sha256 of its files; a resume refuses a flipped bit, a truncated optimizer
    state or a removed file in one line, and a checkpoint whose sums a kill cut off is not counted complete."""
    out = tmp_path / "run"
    base = ["--config", str(TEST_CONFIG), "--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]),
            "--draft", str(tiny_pair["draft"]), "--output_dir", str(out), "eval_strategy=no", "save_steps=2",
            "tune=false", "save_total_limit=3"]
    run_recipe("distillspec", [*base, "max_steps=4"], None)
    sums = json.loads((out / "checkpoint-4" / "sha256sums.json").read_text())["files"]
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json", RUN_SETTINGS} <= sums.keys()

    def refused(checkpoint: str, *expected: str) -> None:
        capsys.readouterr()
        assert recipe_main("distillspec", [*base, "max_steps=5", "--resume_from_checkpoint", checkpoint]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("error:") and all(e in err for e in expected), err

    model = out / "checkpoint-4" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x40  # one exponent bit of one weight
    model.write_bytes(bytes(data))
    refused(str(out / "checkpoint-4"), "model.safetensors changed since the checkpoint was written",
            "resume an earlier checkpoint")
    optimizer = out / "checkpoint-2" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    refused(str(out / "checkpoint-2"), "optimizer.pt changed")
    (out / "checkpoint-4" / "sha256sums.json").unlink()  # as if killed before the sums were written
    refused("latest", "checkpoint-2", "optimizer.pt changed")  # checkpoint-4 is no longer the latest complete one
    refused(str(out / "checkpoint-4"), "records no checksums")
