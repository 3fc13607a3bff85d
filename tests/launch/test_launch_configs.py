"""The shipped accelerate YAMLs, DeepSpeed JSONs and multi-node files are valid and documented."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import transformers

from draftsmith.data.tiny_models import random_model

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "launch" / "configs"
ACCELERATE = sorted((CONFIGS / "accelerate").glob("*.yaml"))
DEEPSPEED = sorted((CONFIGS / "deepspeed").glob("*.json"))
FSDP = sorted((CONFIGS / "fsdp").glob("*.json"))
EXPECTED_TYPES = {
    "single_device.yaml": "NO", "multi_gpu.yaml": "MULTI_GPU", "cpu_2proc.yaml": "MULTI_GPU", "fsdp.yaml": "FSDP",
    "deepspeed_zero2.yaml": "DEEPSPEED", "deepspeed_zero3.yaml": "DEEPSPEED", "deepspeed_zero3_offload.yaml": "DEEPSPEED",
}


def test_the_expected_files_ship():
    assert {p.name for p in ACCELERATE} == set(EXPECTED_TYPES)
    assert {p.name for p in DEEPSPEED} == {"zero2.json", "zero3.json", "zero3_offload.json"}
    assert {p.name for p in FSDP} == {"fsdp2.json"}
    assert (CONFIGS / "multinode" / "hostfile").is_file() and (CONFIGS / "multinode" / "slurm_distillspec.sh").is_file()


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    assert str(config.distributed_type).split(".")[-1] == EXPECTED_TYPES[path.name]
    assert config.num_machines == 1 and config.num_processes >= 1
    if EXPECTED_TYPES[path.name] == "DEEPSPEED":
        ds_file = ROOT / config.deepspeed_config["deepspeed_config_file"]
        assert ds_file.is_file(), f"{path.name} points at a missing {ds_file}"
    if path.name == "cpu_2proc.yaml":
        assert config.use_cpu and config.num_processes == 2


@pytest.mark.parametrize("path", DEEPSPEED, ids=lambda p: p.name)
def test_deepspeed_json_autos_are_all_filled_by_the_trainer(path, tmp_path):
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    model = random_model("llama")  # before the config exists: a live ZeRO-3 config makes from_config shard weights
    raw = json.loads(path.read_text())
    stage = raw["zero_optimization"]["stage"]
    assert stage == (2 if path.name == "zero2.json" else 3)
    if stage == 3:
        assert raw["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True  # for the artefact
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                          per_device_train_batch_size=4, gradient_accumulation_steps=2)
    config = HfTrainerDeepSpeedConfig(str(path))
    try:
        config.trainer_config_process(args)
        config.trainer_config_finalize(args, model, num_training_steps=10)
        filled = config.config
    finally:
        unset_hf_deepspeed_config()
    assert '"auto"' not in json.dumps(filled)
    assert filled["train_micro_batch_size_per_gpu"] == 4 and filled["gradient_accumulation_steps"] == 2


def test_the_fsdp_json_is_fsdp2_as_the_trainer_reads_it(tmp_path):
    """launch/configs/fsdp/fsdp2.json under `torchrun ... --fsdp "full_shard auto_wrap" --fsdp_config FILE`."""
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], fsdp="full_shard auto_wrap",
                                          fsdp_config=str(FSDP[0]))
    assert args.fsdp_config["version"] == 2 and args.fsdp_config["reshard_after_forward"] is True


def test_hostfile_lines():
    lines = [ln for ln in (CONFIGS / "multinode" / "hostfile").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines and all(re.fullmatch(r"\S+ slots=\d+", ln) for ln in lines)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_script_is_valid_bash_and_points_at_shipped_files():
    script = CONFIGS / "multinode" / "slurm_distillspec.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for rel in re.findall(r"(?:launch|recipes)/[\w/.-]+\.(?:yaml|py|json)", text):
        assert (ROOT / rel).is_file(), f"{script.name} refers to a missing {rel}"
    assert "--resume_from_checkpoint auto" in text


def test_launching_doc_mentions_every_config():
    doc = (ROOT / "docs" / "LAUNCHING.md").read_text()
    for path in [*ACCELERATE, *DEEPSPEED, *FSDP, CONFIGS / "multinode" / "hostfile", CONFIGS / "multinode" / "slurm_distillspec.sh"]:
        assert str(path.relative_to(ROOT)) in doc, f"docs/LAUNCHING.md does not show {path.name}"
