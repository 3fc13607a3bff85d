"""Tiny randomly initialised models of every supported family, built from configs in seconds.

Used by the tests and by anyone who wants to try a recipe end to end without a real checkpoint.
"""

from __future__ import annotations

import string

import torch
import transformers
from tokenizers import Tokenizer, decoders, models

FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "gemma3", "olmo2", "gpt2")
# one family of each position and layer layout the proposers meet (learned positions, rotary pre-norm layers with and
# without biases, a sliding window): their tests run on these, the adapter's and the decode loop's on every family
LAYOUT_FAMILIES = ("llama", "qwen2", "mistral", "gpt2")
ROPE_FAMILIES = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                 "mistral": transformers.MistralConfig, "qwen3": transformers.Qwen3Config,
                 "gemma3": transformers.Gemma3TextConfig, "olmo2": transformers.Olmo2Config}


def family_extras(family: str, hidden: int, heads: int, layers: int, window: int) -> dict:
    """What a family's config needs beyond Llama's fields: Qwen3's and Gemma 3's explicit head size; Gemma 3's
    sliding-window layers (every layer but the last, as its 5:1 pattern would have it in a deeper model) with their
    window ``window``, and its query scale."""
    if family == "qwen3":
        return {"head_dim": hidden // heads}
    if family == "gemma3":
        return {"head_dim": hidden // heads, "query_pre_attn_scalar": hidden // heads, "sliding_window": window,
                "layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"]}
    return {}


def tiny_config(
    family: str,
    vocab_size: int = 128,
    layers: int = 3,
    hidden: int = 32,
    attn: str = "sdpa",
    max_positions: int = 256,
    window: int = 8,
) -> transformers.PretrainedConfig:
    """A config of ``family`` (one of :data:`FAMILIES`) with a few thousand parameters (``window``: Gemma 3's
    sliding window)."""
    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=max_positions, **common)
    elif family in ROPE_FAMILIES:
        cfg = ROPE_FAMILIES[family](
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            **family_extras(family, hidden, 4, layers, window),
            **common,
        )
    else:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    cfg._attn_implementation = attn
    return cfg


def random_model(family: str, seed: int = 0, **config_kwargs) -> transformers.PreTrainedModel:
    """A randomly initialised ``*ForCausalLM`` of ``family`` in eval mode (deterministic in ``seed``)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, **config_kwargs))
    return model.eval()


CHAR_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3, matching tiny_config's pad/bos/eos
CHAR_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def char_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Printable ASCII + newline, one token per character, with a chat template (vocab 100 < 128),
    for pairing with :func:`random_model` without training a tokenizer."""
    vocab = {c: i for i, c in enumerate(dict.fromkeys(CHAR_SPECIALS + list(string.printable[:95]) + ["\n"]))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(CHAR_SPECIALS)
    tok.decoder = decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAR_CHAT_TEMPLATE
    return fast
