"""The zoo's data side: specs and their sizes, where a zoo lives, the packed rows, and reading a built zoo (a
hand-made one here; tests/trainers/test_zoo.py builds real ones)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.paths import zoo_dir
from draftsmith.data import zoo
from draftsmith.data.tiny_models import char_tokenizer, random_model

MODEL = dict(layers=2, hidden=32, intermediate=64, heads=4, kv_heads=2, tokens=1024, lr=1e-2, warmup_steps=2)


def small_spec(**changes) -> zoo.ZooSpec:
    spec = zoo.ZooSpec(size="tiny", target=zoo.ModelSpec(**MODEL), draft=zoo.ModelSpec(**MODEL), vocab_size=512,
                       seq_len=8, batch_size=2, max_positions=64)  # fmt: skip
    return dataclasses.replace(spec, **changes)


# ------------------------------------------------------------------------------------------------- specs


def meta_params(spec: zoo.ZooSpec, role: str) -> int:
    with torch.device("meta"):
        return zoo.param_count(transformers.LlamaForCausalLM(zoo.zoo_model_config(spec, role)))


def test_builtin_sizes_have_the_promised_parameter_counts():
    tiny, small = zoo.zoo_spec("tiny"), zoo.zoo_spec("small")
    assert 3.5e6 < meta_params(tiny, "target") < 4.8e6
    assert meta_params(tiny, "draft") < meta_params(tiny, "target") / 2
    assert tiny.draft.tokens < tiny.target.tokens
    assert 25e6 <= meta_params(small, "target") <= 35e6
    assert 3e6 <= meta_params(small, "draft") <= 5e6
    with pytest.raises(ConfigError, match="unknown zoo size"):
        zoo.zoo_spec("huge")


def test_spec_validation():
    with pytest.raises(ConfigError, match="divisible"):
        zoo.ModelSpec(**{**MODEL, "hidden": 30})
    with pytest.raises(ConfigError, match="layers"):
        zoo.ModelSpec(**{**MODEL, "layers": 0})
    with pytest.raises(ConfigError, match="max_positions"):
        small_spec(seq_len=1024)
    with pytest.raises(ConfigError, match="precision"):
        small_spec(precision="fp16")


def test_spec_round_trips_through_its_manifest_dict_and_counts_steps():
    spec = small_spec()
    assert zoo.ZooSpec(**json.loads(json.dumps(dataclasses.asdict(spec)))) == spec
    assert spec.steps("target") == 1024 // (2 * 8) and spec.model("draft") is spec.draft


def test_home_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    assert zoo_dir("small") == tmp_path / "zoo" / "small"
    assert zoo_dir("tiny", home=tmp_path / "x") == tmp_path / "x" / "zoo" / "tiny"
    monkeypatch.delenv("DRAFTSMITH_HOME")
    assert str(zoo_dir("tiny")).endswith(".cache/draftsmith/zoo/tiny")
    with pytest.raises(ConfigError, match="invalid zoo size"):
        zoo_dir("../etc")


# -------------------------------------------------------------------------------------------------- rows


def test_pack_cuts_rows_and_pads_the_tail():
    seqs = [[1, 7, 8, 2], [1, 9, 2], [1, 5, 6, 2]]  # 11 tokens
    assert zoo.pack(seqs, 4).tolist() == [[1, 7, 8, 2], [1, 9, 2, 1]]
    assert zoo.pack(seqs, 4, pad_id=0, keep_tail=True).tolist()[-1] == [5, 6, 2, 0]


def test_shuffled_is_a_seeded_permutation():
    items = list(range(20))
    assert zoo.shuffled(items, 3) == zoo.shuffled(items, 3) != zoo.shuffled(items, 4)
    assert sorted(zoo.shuffled(items, 3)) == items


def examples(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"answer {i}"}]}
            if i % 2 else {"text": f"plain text number {i}"} for i in range(n)]  # fmt: skip


def test_zoo_rows_pack_train_and_heldout_and_cap_the_heldout_tokens():
    tok = char_tokenizer()
    rows = zoo.zoo_rows(tok, small_spec(), examples(10), examples(4))
    assert rows.train.shape[1] == 8 and rows.train.shape[0] == rows.train_tokens // 8
    assert rows.n_heldout > 8 and rows.heldout.shape[0] == -(-rows.n_heldout // 8)
    capped = zoo.zoo_rows(tok, small_spec(eval_tokens=10), examples(10), examples(4))
    assert capped.n_heldout == 10 and capped.heldout.shape == (2, 8) and capped.heldout[1, 2:].eq(0).all()
    with pytest.raises(ConfigError, match="batch_size"):
        zoo.zoo_rows(tok, small_spec(batch_size=1000), examples(10), examples(4))


# -------------------------------------------------------------------------------------------- a built zoo


def test_reading_a_zoo_that_is_not_built_names_the_build_command(tmp_path):
    for read in (zoo.read_zoo_manifest, zoo.load_zoo):
        with pytest.raises(DraftsmithError, match="draftsmith zoo build --size tiny"):
            read("tiny", tmp_path)


def test_load_zoo_loads_the_three_directories_in_eval_mode(tmp_path):
    out = zoo_dir("tiny", tmp_path)
    char_tokenizer().save_pretrained(out / "tokenizer")
    for seed, role in enumerate(zoo.MODEL_ROLES):
        random_model("llama", seed=seed, layers=1).train().save_pretrained(out / role)
    (out / "manifest.json").write_text(json.dumps({"format": zoo.MANIFEST_FORMAT, "size": "tiny"}))
    assert zoo.read_zoo_manifest("tiny", tmp_path)["format"] == zoo.MANIFEST_FORMAT
    tok, target, draft = zoo.load_zoo("tiny", tmp_path)
    assert not target.training and not draft.training and tok.eos_token_id == 2
    assert not torch.equal(target.lm_head.weight, draft.lm_head.weight)
