"""Tiny randomly initialised models of every supported family, built from configs in seconds.

Used by the tests and by anyone who wants to try a recipe end to end without a real checkpoint.
"""

from __future__ import annotations

import torch
import transformers

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")


def tiny_config(
    family: str,
    vocab_size: int = 128,
    layers: int = 3,
    hidden: int = 32,
    attn: str = "sdpa",
    max_positions: int = 256,
) -> transformers.PretrainedConfig:
    """A config of ``family`` (one of :data:`FAMILIES`) with a few thousand parameters."""
    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=max_positions, **common)
    elif family in ("llama", "qwen2", "mistral"):
        cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "mistral": transformers.MistralConfig}
        cfg = cls[family](
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
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
