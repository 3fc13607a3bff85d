"""BiTA declared: config, trainer and embeddings; the mask-token proposer (untrained embeddings without an artefact)."""

from __future__ import annotations

from draftsmith.common.eval_options import defaults_from
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.drafters.bita import BitaEmbeddings
from draftsmith.inference.methods.bita import OPTIONS, bita_proposer
from draftsmith.trainers.bita.trainer import BitaConfig, BitaTrainer, build_bita
from draftsmith.trainers.memory import MemoryShape


def memory_shape(target, draft=None) -> MemoryShape:
    """The prompt and mask embeddings; the gradient passes through every frozen layer; only the mask tokens score."""
    cfg, c = target.config, BitaConfig()
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    layers = int(cfg.num_hidden_layers)
    return MemoryShape(BitaEmbeddings(int(cfg.hidden_size), layers, kv, head_dim), 0, 0, int(cfg.vocab_size),
                       frozen_grad_layers=layers, loss_rows=int(c.groups) * int(c.mask_tokens))


SPEC = MethodSpec(name="bita", summary="prompt and mask tokens tuned on the frozen target, which drafts and verifies "
                  "in one forward (BiTA, Lin et al. 2024); without an artefact: untrained embeddings",
                  proposer=bita_proposer, artefact_kind="embeddings", config=BitaConfig, trainer=BitaTrainer,
                  trainable=build_bita, eval_method=True,
                  eval_options=defaults_from(BitaConfig, OPTIONS, ("tree", "tree_top_k")), memory={"bita": memory_shape},
                  default_config="bita_tiny")
