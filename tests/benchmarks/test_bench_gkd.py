"""The GKDTrainer comparison: both trainers get the same settings, data and loss, and the figures add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch

from draftsmith.data.tiny_models import char_tokenizer, random_model

SCRIPT = Path(__file__).with_name("bench_gkd.py")


@pytest.fixture(scope="module")
def bench(script_loader):
    return script_loader("bench_gkd")


def test_response_tokens_counts_shifted_unignored_labels(bench):
    labels = torch.tensor([[5, -100, 7, 8], [-100, -100, 3, -100]])
    assert bench.response_tokens(labels) == 2 + 1


def test_throughput_leaves_out_the_warmup_steps(bench):
    out = bench.throughput([1.0, 2.0, 4.0, 6.0], [10, 20, 30, 40], start=0.0, warmup=1)
    assert out == {"timed_steps": 3, "timed_tokens": 90, "timed_seconds": 5.0, "tokens_per_s": 18.0,
                   "seconds_per_step": 5.0 / 3}
    assert bench.throughput([1.0, 3.0], [4, 4], start=0.5, warmup=0)["tokens_per_s"] == pytest.approx(8 / 2.5)
    with pytest.raises(ValueError, match="warm-up"):
        bench.throughput([1.0], [4], start=0.0, warmup=1)


def _run(kind, tps, peak, loaded):
    return {"trainer": kind, "tokens_per_s": tps, "peak_rss_mb": peak, "loaded_rss_mb": loaded, "losses": [1.0, 0.5]}


def test_summary_takes_medians_and_ratios_to_gkd(bench):
    runs = [_run("trl-gkd", 100, 1000, 600), _run("trl-gkd", 120, 1000, 600), _run("draftsmith", 165, 900, 600),
            _run("draftsmith", 165, 800, 600)]
    s = bench.summarize(runs)
    assert s["trl-gkd"]["tokens_per_s"] == 110 and s["trl-gkd"]["speed_vs_gkd"] == 1.0
    assert s["draftsmith"]["speed_vs_gkd"] == pytest.approx(1.5)
    assert s["draftsmith"]["peak_rss_vs_gkd"] == pytest.approx(0.85)
    assert s["draftsmith"]["rss_growth_vs_gkd"] == pytest.approx(250 / 400)
    table = bench.markdown_table(s)
    assert "| draftsmith | 165 | 1.50x | 850 MB (0.85x) | 250 MB (0.62x) | 1.0000, 0.5000 |" in table


def test_worker_command_round_trips_through_the_parser(bench, tmp_path):
    args = bench.parse_args(["--steps", "7", "--warmup", "2", "--batch-size", "3", "--target", "T", "--draft", "D"])
    cmd = bench.worker_command("trl-gkd", args, tmp_path / "r.json")
    again = bench.parse_args(cmd[2:])
    assert again.worker == "trl-gkd" and again.result == tmp_path / "r.json"
    for key in ("steps", "warmup", "batch_size", "learning_rate", "seed", "examples", "max_length", "threads",
                "target", "draft", "tokenizer"):
        assert getattr(again, key) == getattr(args, key)


def test_parser_refuses_half_a_pair_and_no_timed_steps(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--target", "T"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "3", "--warmup", "3"])


@pytest.mark.parametrize("kind", ["draftsmith", "trl-gkd"])
def test_both_trainers_get_the_same_settings_and_the_same_loss(bench, kind, tmp_path):
    """Same TrainingArguments core; and on one batch the same forward-KL value (GKD's beta=0 JSD)."""
    from draftsmith.data.collate import PadCollator

    args = bench.parse_args(["--steps", "4", "--warmup", "1", "--batch-size", "2"])
    tok = char_tokenizer()
    target, draft = random_model("llama", seed=0, layers=2), random_model("llama", seed=1, layers=1)
    rows = [{"input_ids": [1, 5, 6, 7, 8], "labels": [-100, -100, 6, 7, 8]},
            {"input_ids": [1, 9, 10], "labels": [-100, 9, 10]}]
    collator = bench.CountingCollator(PadCollator(tok.pad_token_id))
    trainer = bench.build_trainer(kind, args, draft, target, tok, datasets.Dataset.from_list(rows), collator, str(tmp_path))
    a = trainer.args
    assert (a.max_steps, a.per_device_train_batch_size, a.learning_rate, a.seed) == (4, 2, 3e-4, 0)
    assert (a.bf16, a.fp16, a.activation_checkpointing, a.gradient_checkpointing, a.lr_scheduler_type.value, a.warmup_steps) == (
        False, False, False, False, "linear", 0)
    batch = collator(rows)
    assert collator.tokens == [3 + 2]
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    with torch.no_grad():
        mask = batch["labels"][:, 1:] != -100
        p = torch.log_softmax(target(input_ids=batch["input_ids"]).logits[:, :-1][mask], -1)
        q = torch.log_softmax(draft(input_ids=batch["input_ids"]).logits[:, :-1][mask], -1)
        forward_kl = (p.exp() * (p - q)).sum(-1).mean()
    assert float(loss) == pytest.approx(float(forward_kl), rel=1e-5)


@pytest.mark.slow
def test_the_driver_runs_every_trainer_on_a_tiny_pair(bench, tmp_path):
    tok = char_tokenizer()
    for name, model in (("target", random_model("llama", seed=0, layers=2)),
                        ("draft", random_model("llama", seed=1, layers=1))):
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    out = tmp_path / "result.json"
    subprocess.run([sys.executable, str(SCRIPT), "--target", str(tmp_path / "target"), "--draft",
                    str(tmp_path / "draft"), "--steps", "4", "--warmup", "1", "--examples", "64", "--max-length", "512",
                    "--repeats", "1", "--json", str(out)], check=True, timeout=600)
    result = json.loads(out.read_text())
    assert {r["trainer"] for r in result["runs"]} == set(bench.TRAINERS)
    first = {r["trainer"]: r["losses"][0] for r in result["runs"]}
    assert max(first.values()) == pytest.approx(min(first.values()), rel=1e-4)  # same batch, same loss
    for run in result["runs"]:
        assert run["steps"] == 4 and run["timed_steps"] == 3 and run["tokens_per_s"] > 0
        assert run["peak_rss_mb"] >= run["loaded_rss_mb"] > 0
    assert result["summary"]["trl-gkd"]["speed_vs_gkd"] == 1.0
    assert out.with_suffix(".md").read_text().startswith("| trainer |")
