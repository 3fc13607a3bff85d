"""EAGLE-1/3 and P-EAGLE declared: one config (``variant``), one trainer, one head builder, one proposer builder and the
EAGLE exports; ``peagle`` is the same spec with ``variant: peagle`` fixed, trained by name (``draftsmith train peagle``)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from draftsmith.common.eval_options import defaults_from
from draftsmith.common.registry import MethodSpec
from draftsmith.inference.artefacts.eagle import export_eagle_artefact
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.drafters.eagle import Eagle3Head, EagleHead, aux_layers, head_classes
from draftsmith.inference.methods.eagle import EAGLE_OPTIONS, eagle_proposer, vllm_engine
from draftsmith.trainers.eagle.config import EagleConfig
from draftsmith.trainers.eagle.trainer import EagleTrainer, build_eagle_head
from draftsmith.trainers.memory import MemoryShape

DERIVED = ("tree", "tree_nodes", "draft_length", "tree_top_k", "tree_depth")  # EagleConfig's decoding defaults
OPTIONS = defaults_from(EagleConfig, EAGLE_OPTIONS, DERIVED)
EXPORTS = ("eagle3", "vllm-eagle", "sglang-eagle", "speculators")


def memory_shape(target, draft=None, variant: str = "eagle1") -> MemoryShape:
    """EAGLE-1: one layer over [H] features (regression and classification, two kept feature tensors). EAGLE-3 (and
    P-EAGLE, the same head and unroll): one layer over the fused [2 H] input, three auxiliary layers and the last
    kept, one loss call per unrolled step on the draft vocabulary's rows, each step's input kept for the backward."""
    cfg, c = target.config, EagleConfig(variant=variant)
    config, layer_cls, rotary_cls, norm_cls = head_classes(ModelAdapter(target), c.head_layer)
    hidden, vocab = int(cfg.hidden_size), int(cfg.vocab_size)
    if variant == "eagle1":
        return MemoryShape(EagleHead(config, layer_cls, rotary_cls, fc_bias=c.fc_bias), 1, 2, vocab)
    dv = min(c.draft_vocab_size, vocab)
    d2t, t2d = torch.zeros(dv, dtype=torch.long), torch.zeros(vocab, dtype=torch.bool)
    head = Eagle3Head(config, layer_cls, rotary_cls, norm_cls, aux_layers(int(cfg.num_hidden_layers)), d2t, t2d)
    return MemoryShape(head, 1, 4, dv, loss_calls=c.ttt_steps, unrolled=c.ttt_steps, trained_hidden=2 * hidden,
                       loss_head_trained=True)


def chain_options(depth: int) -> dict:
    """The chain tree calibration decodes: the dynamic tree's depth as a chain."""
    return {"tree": "chain", "draft_length": depth}


SPEC = MethodSpec(name="eagle", summary="EAGLE-1 feature-level draft head on the frozen target (Li et al. 2024); "
                  "EAGLE-3 and EAGLE-3.1 with --variant eagle3", proposer=eagle_proposer, artefact_kind="heads",
                  config=EagleConfig, trainer=EagleTrainer, trainable=build_eagle_head,
                  export_formats=dict.fromkeys(EXPORTS, export_eagle_artefact), engine_configs={"vllm": vllm_engine},
                  eval_options=OPTIONS, calibrated_tree=True, chain_options=chain_options,
                  memory={"eagle": memory_shape, "eagle3": partial(memory_shape, variant="eagle3")},
                  default_config="eagle_tiny")
PEAGLE = replace(SPEC, name="peagle", summary="P-EAGLE: an EAGLE-3 head drafting its whole block in one forward from "
                 "placeholder tokens (parallel drafting)", config_defaults={"variant": "peagle"},
                 eval_options=tuple(o.default_to("chain") if o.name == "tree" else o for o in OPTIONS),  # a block: a chain
                 memory={"peagle": partial(memory_shape, variant="peagle")}, default_config="peagle_tiny")
