"""Building the model zoo on a REDUCED spec (vocab 512, a few thousand tokens, seconds): manifest, loading,
determinism, resume after an interruption, skip on rerun, the thread choice and the ``draftsmith zoo`` command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest
import torch
import transformers

from draftsmith.common.errors import ConfigError
from draftsmith.common.io import sha256_file
from draftsmith.common.paths import zoo_dir
from draftsmith.common.threads import THREADS_ENV
from draftsmith.data import zoo
from draftsmith.data.corpus import corpus_sha256
from draftsmith.data.tiny_models import ROPE_FAMILIES
from draftsmith.launch import zoo_cli
from draftsmith.trainers.pretrain import heldout_loss
from draftsmith.trainers.zoo import build_zoo, ensure_zoo


def reduced_spec(seed: int = 0) -> zoo.ZooSpec:
    return zoo.ZooSpec(
        size="tiny",
        target=zoo.ModelSpec(layers=2, hidden=32, intermediate=64, heads=4, kv_heads=2, tokens=64 * 4 * 8, lr=1e-2,
                             warmup_steps=2),
        draft=zoo.ModelSpec(layers=1, hidden=16, intermediate=32, heads=2, kv_heads=1, tokens=64 * 4 * 3, lr=3e-3,
                            warmup_steps=1),
        vocab_size=512, seq_len=64, batch_size=4, max_positions=512, seed=seed, checkpoint_every=2,
        eval_tokens=1500, max_train_examples=200,
    )  # fmt: skip


class Interrupt(Exception):
    pass


def build(home, **kwargs):
    kwargs.setdefault("spec", reduced_spec())
    kwargs.setdefault("threads", 1)
    return build_zoo("tiny", home=home, progress=False, **kwargs)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    return home, build(home)


def weights(out):
    return {role: sha256_file(out / role / "model.safetensors") for role in zoo.MODEL_ROLES}


# ------------------------------------------------------------------------------------------------- manifest


def test_layout_and_manifest_fields(built):
    home, out = built
    assert out == zoo_dir("tiny", home) == home / "zoo" / "tiny"
    assert sorted(p.name for p in out.iterdir()) == ["draft", "manifest.json", "target", "tokenizer"]
    manifest = json.loads((out / "manifest.json").read_text())
    spec = reduced_spec()
    assert manifest["format"] == zoo.MANIFEST_FORMAT and manifest["size"] == "tiny"
    assert manifest["seed"] == 0 and manifest["corpus_sha256"] == corpus_sha256()
    assert zoo.ZooSpec(**manifest["spec"]) == spec
    assert manifest["build_seconds"] > 0 and manifest["corpus"]["train_examples"] == 200
    assert manifest["tokenizer"]["vocab_size"] == 512
    assert manifest["tokenizer"]["sha256"] == sha256_file(out / "tokenizer" / "tokenizer.json")
    for role in zoo.MODEL_ROLES:
        info = manifest["models"][role]
        assert info["config"]["num_hidden_layers"] == spec.model(role).layers
        assert info["config"]["hidden_size"] == spec.model(role).hidden
        assert info["steps"] == spec.steps(role) and info["tokens_seen"] == spec.steps(role) * 4 * 64
        assert info["tokens_seen"] >= spec.model(role).tokens
        assert math.isfinite(info["heldout_loss"]) and 0 < info["heldout_loss"] < math.log(512) + 1
        assert 1400 < info["heldout_tokens"] < 1500  # eval_tokens minus one unscored token per row
        assert info["train_seconds"] > 0 and info["tokens_per_second"] > 0
        assert info["weights_sha256"] == weights(out)[role]
    assert manifest["models"]["target"]["parameters"] > manifest["models"]["draft"]["parameters"]


def test_directories_load_with_auto_classes(built):
    home, out = built
    manifest = zoo.read_zoo_manifest("tiny", home)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "tokenizer")
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    for role in zoo.MODEL_ROLES:
        assert (out / role / "model.safetensors").is_file() and not list((out / role).glob("*.bin"))
        model = transformers.AutoModelForCausalLM.from_pretrained(out / role)
        assert isinstance(model, transformers.LlamaForCausalLM)
        assert zoo.param_count(model) == manifest["models"][role]["parameters"]
        assert model.config.vocab_size == len(tokenizer)
        ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                            return_dict=False)  # fmt: skip
        logits = model(torch.tensor([ids])).logits  # [1, T, V]
        assert logits.shape == (1, len(ids), 512) and torch.isfinite(logits).all()
    tok, target, draft = zoo.load_zoo("tiny", home)
    assert not target.training and not draft.training and tok.eos_token_id == 2


def test_training_beats_the_uniform_guess_and_the_heldout_loss_is_reproducible(built):
    home, out = built
    manifest = zoo.read_zoo_manifest("tiny", home)
    assert manifest["models"]["target"]["heldout_loss"] < math.log(512) - 0.3
    assert reduced_spec().steps("target") == 8
    tokenizer, target, _ = zoo.load_zoo("tiny", home)
    rows = zoo.zoo_rows(tokenizer, reduced_spec(), *zoo.zoo_examples(reduced_spec()))
    loss, count = heldout_loss(target, rows.heldout, rows.n_heldout, batch_size=8, device="cpu")
    assert (round(loss, 4), count) == (manifest["models"]["target"]["heldout_loss"],
                                       manifest["models"]["target"]["heldout_tokens"])  # fmt: skip


# ----------------------------------------------------------------------------- determinism, resume, rerun


def test_two_builds_with_the_same_seed_are_identical(built, tmp_path):
    _, first = built
    second = build(tmp_path)
    assert weights(second) == weights(first)
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (first, second))
    for role in zoo.MODEL_ROLES:
        assert a["models"][role]["heldout_loss"] == b["models"][role]["heldout_loss"]
    assert (first / "tokenizer" / "tokenizer.json").read_bytes() == (
        second / "tokenizer" / "tokenizer.json"
    ).read_bytes()


def test_interrupted_build_resumes_from_its_checkpoint(built, tmp_path):
    calls = []

    def crash_at_target_step_5(stage, step):
        calls.append((stage, step))
        if (stage, step) == ("target", 5):
            raise Interrupt

    with pytest.raises(Interrupt):
        build(tmp_path, on_step=crash_at_target_step_5)
    out = zoo_dir("tiny", tmp_path)
    assert (out / "tokenizer").is_dir() and not (out / "target").exists() and not (out / "manifest.json").exists()
    assert (out / ".build" / "target.ckpt.pt").is_file()
    assert not [p for p in (out / ".build").iterdir() if ".tmp" in p.name]  # atomic writes leave no temp files
    assert torch.load(out / ".build" / "target.ckpt.pt", weights_only=False)["state"]["step"] == 4

    calls.clear()
    build(tmp_path, on_step=lambda stage, step: calls.append((stage, step)))
    assert calls[0] == ("target", 5)  # resumed after the last checkpoint, tokenizer stage skipped
    assert [c for c in calls if c[0] == "draft"] == [("draft", s) for s in range(1, 4)]
    assert weights(out) == weights(built[1])  # identical to the uninterrupted build
    assert not (out / ".build").exists()


def test_finished_zoo_is_not_rebuilt_and_other_spec_needs_force(built):
    home, out = built
    before = (out / "manifest.json").read_text()
    assert build(home, on_step=lambda *_: pytest.fail("a finished zoo must not train again")) == out
    assert ensure_zoo("tiny", home) == out
    assert (out / "manifest.json").read_text() == before
    with pytest.raises(ConfigError, match="--force"):
        build(home, spec=reduced_spec(seed=1))


def test_force_rebuilds_and_another_seed_gives_other_weights(built, tmp_path):
    build(tmp_path)
    out = build(tmp_path, spec=reduced_spec(seed=1), force=True)
    assert zoo.read_zoo_manifest("tiny", tmp_path)["seed"] == 1
    assert weights(out)["target"] != weights(built[1])["target"]


# ------------------------------------------------------------------------------------------------- the CLI


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="draftsmith")
    zoo_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


def test_cli_zoo_path_prints_the_directory(built, capsys):
    home, out = built
    assert run_cli(["zoo", "path", "--size", "tiny", "--home", str(home)]) == 0
    assert capsys.readouterr().out.strip() == str(out)


def test_cli_zoo_build_refuses_a_zoo_built_from_another_spec(built):
    home, _ = built  # built from the reduced spec, not the built-in tiny one
    with pytest.raises(ConfigError, match="--force"):
        run_cli(["zoo", "build", "--size", "tiny", "--home", str(home)])
    with pytest.raises(SystemExit):
        run_cli(["zoo", "build", "--size", "huge"])



# ------------------------------------------------------------------------------------------------ threads


def test_the_build_runs_with_the_threads_the_environment_asks_for(monkeypatch, tmp_path):
    monkeypatch.setenv(THREADS_ENV, "1")
    out = build(tmp_path, threads=None)
    assert json.loads((out / "manifest.json").read_text())["environment"]["threads"] == 1


@pytest.mark.parametrize("env, argv", [({}, ["--threads", "0"]), ({}, ["--threads", "two"]),
                                       ({THREADS_ENV: "0"}, []), ({THREADS_ENV: "-2"}, [])])  # fmt: skip
def test_a_bad_thread_count_is_a_one_line_error_naming_the_fix(monkeypatch, tmp_path, env, argv):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="must be a positive integer") as err:
        run_cli(["zoo", "build", "--size", "tiny", "--home", str(tmp_path), *argv])
    assert "\n" not in str(err.value) and ("--threads N" if argv else f"{THREADS_ENV}=N") in str(err.value)
    assert not (tmp_path / "zoo" / "tiny").exists()


# ----------------------------------------------------------------------------------------------- families


@pytest.mark.parametrize("family", [f for f in zoo.ZOO_FAMILIES if f != "llama"])
def test_a_zoo_of_another_family_builds_in_that_familys_layers_with_the_same_tokenizer(built, tmp_path, family,
                                                                                      capsys):
    """``zoo build --family F``: the tiny zoo's stages in F's decoder layers, under its own name (``tiny-F``), with
    the tokenizer the Llama zoo trains from the same corpus; the models train (held-out loss under the uniform
    guess's) and draftsmith's adapter runs them as transformers does."""
    from draftsmith.inference.core.adapter import ModelAdapter

    llama_home, llama = built
    size = zoo.family_size("tiny", family)
    spec = dataclasses.replace(reduced_spec(), size=size, family=family)
    out = build_zoo(size, home=tmp_path, spec=spec, progress=False, threads=1)
    assert out == zoo_dir(size, tmp_path)
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (llama / "tokenizer" / "tokenizer.json").read_bytes()
    manifest = zoo.read_zoo_manifest(size, tmp_path)
    cls = ROPE_FAMILIES[family]
    for role in zoo.MODEL_ROLES:
        model = transformers.AutoModelForCausalLM.from_pretrained(out / role).eval()
        assert isinstance(model.config, cls) and model.config.tie_word_embeddings
        assert manifest["models"][role]["heldout_loss"] < math.log(512)
        ids = torch.randint(3, 512, (1, 40), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            assert torch.allclose(ModelAdapter(model).forward(ids).logits, model(ids).logits.float(), atol=1e-4)
    assert run_cli(["zoo", "path", "--size", "tiny", "--family", family, "--home", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
