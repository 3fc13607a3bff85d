"""The GGUF path of the model loader on a tiny Llama GGUF file written by the test itself (gguf's writer):
load_model / load_tokenizer give back the source model and tokenizer, and errors are one line."""

from __future__ import annotations

import gguf_fixture as gg
import numpy as np
import pytest
import torch
import transformers

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.models import (
    config_sha256,
    has_tokenizer,
    is_gguf,
    load_model,
    load_tokenizer,
    target_identity,
    tokenizer_dir_for,
    tokenizer_sha256,
)

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = ["What is the capital of France?", "Hello world, how are you today?", "<|user|>hi<|eos|> <|endoftext|>",
         "  spaces\tand\nnewlines, ünïcödé 🙂"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return gg.write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert text and "\n" not in text, text
    return text


def test_the_fixture_is_a_llama_cpp_style_file_transformers_loads_exactly(tiny):
    import gguf

    reader = gguf.GGUFReader(str(tiny.path))
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "output_norm.weight", "blk.1.attn_q.weight",
            "blk.1.ffn_down.weight"} <= names
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    q = tiny.model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    stored = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    stored = np.asarray(stored.data).reshape(q.shape)
    assert not np.array_equal(stored, q)  # llama.cpp's interleaved rotary layout ...
    np.testing.assert_array_equal(stored, gg.llama_cpp_permute(q, tiny.model.config.num_attention_heads))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny.path.parent), gguf_file=tiny.path.name,
                                                              dtype=torch.float32)
    # ... which transformers undoes: the round trip is exact
    assert torch.equal(gg.logits(model, tiny.tokenizer), gg.logits(tiny.model, tiny.tokenizer))


def test_load_model_on_a_gguf_file_gives_the_source_logits(tiny):
    model = load_model(tiny.path)
    assert not model.training and model.dtype == torch.float32
    assert isinstance(model, transformers.LlamaForCausalLM)
    torch.testing.assert_close(gg.logits(model, tiny.tokenizer), gg.logits(tiny.model, tiny.tokenizer))
    assert load_model(str(tiny.path), dtype="auto").dtype == torch.float32  # "auto" dequantizes to float32
    half = load_model(tiny.path, dtype="bfloat16", device="cpu")
    assert half.dtype == torch.bfloat16


def test_a_gguf_target_cannot_be_quantized_again(tiny):
    with pytest.raises(ConfigError) as err:
        load_model(tiny.path, quantization="8bit")
    assert "GGUF" in one_line(err)


def test_load_tokenizer_on_a_gguf_file_tokenizes_like_the_source_and_keeps_the_chat_template(tiny):
    tokenizer = load_tokenizer(tiny.path)
    source = tiny.tokenizer
    for text in TEXTS:
        ids = tokenizer(text).input_ids
        assert ids == source(text).input_ids, text
        assert tokenizer.decode(ids, skip_special_tokens=True) == source.decode(ids, skip_special_tokens=True)
    assert tokenizer.chat_template == source.chat_template
    for prompt in (True, False):
        rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=prompt)
        assert rendered == source.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=prompt)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)
    assert len(tokenizer) == len(source) == tiny.model.config.vocab_size
    # a draft trained on the source tokenizer is recognised as matching the GGUF target
    assert tokenizer_sha256(tokenizer) == tokenizer_sha256(source)


def test_a_gguf_file_is_its_own_tokenizer_directory(tiny, tmp_path):
    assert is_gguf(tiny.path) and is_gguf("X/Model.Q4_1.GGUF") and not is_gguf(tiny.path.parent)
    assert has_tokenizer(tiny.path)
    assert tokenizer_dir_for(tiny.path) == tiny.path
    assert tokenizer_dir_for(tmp_path / "missing.gguf") is None


@pytest.mark.parametrize("loader", [load_model, load_tokenizer])
def test_a_missing_gguf_file_is_a_one_line_error(loader, tmp_path):
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(DraftsmithError) as err:
        loader(missing)
    text = one_line(err)
    assert str(missing) in text and "does not exist" in text


@pytest.mark.parametrize("loader", [load_model, load_tokenizer])
@pytest.mark.parametrize("content", [b"", b"not a gguf file " * 8, "truncated"])
def test_a_corrupt_gguf_file_is_a_one_line_error(loader, content, tiny, tmp_path):
    bad = tmp_path / "bad.gguf"
    data = tiny.path.read_bytes()
    bad.write_bytes(data[: len(data) // 2] if content == "truncated" else content)
    with pytest.raises(DraftsmithError) as err:
        loader(bad)
    assert f"cannot load the {'model' if loader is load_model else 'tokenizer'} from {bad}" in one_line(err)


def test_the_identity_of_a_gguf_target_is_that_of_its_plain_conversion(tiny, tmp_path):
    """config_sha256 ignores quantization_config: the GGUF file and the plain directory written from it
    (draftsmith.data.model_import.gguf_to_directory) are the same target."""
    from draftsmith.common.models import _VOLATILE_CONFIG_KEYS
    from draftsmith.data.model_import import gguf_to_directory

    gguf_model = load_model(tiny.path)
    assert "quantization_config" in gguf_model.config.to_dict()
    written = gguf_to_directory(tiny.path, tmp_path / "plain")
    assert written["vocab_size"] == len(tiny.tokenizer) and written["layers"] == 2
    plain = load_model(tmp_path / "plain")
    assert "quantization_config" not in plain.config.to_dict()
    assert config_sha256(gguf_model.config) == config_sha256(plain.config)
    stable = {k: v for k, v in gguf_model.config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
    assert stable == {k: v for k, v in plain.config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
    assert target_identity(gguf_model, load_tokenizer(tiny.path)) | {"name_or_path": ""} == \
        target_identity(plain, load_tokenizer(tmp_path / "plain")) | {"name_or_path": ""}
    torch.testing.assert_close(gg.logits(plain, tiny.tokenizer), gg.logits(tiny.model, tiny.tokenizer))
