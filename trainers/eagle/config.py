"""EAGLE-1, EAGLE-3 and P-EAGLE settings (:class:`EagleConfig`), the recipe's flags; the trainer and the losses:
:mod:`draftsmith.trainers.eagle.trainer`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftsmith.common.errors import ConfigError
from draftsmith.inference.drafters.eagle import HEAD_LAYERS
from draftsmith.kernels.divergences import DIVERGENCES
from draftsmith.trainers.mixins import FeatureCache, TargetAnswers
from draftsmith.trainers.mixins import help_text as _help

VARIANTS = ("eagle1", "eagle3", "peagle")


@dataclass
class EagleConfig(TargetAnswers, FeatureCache):
    """EAGLE-1/-3 settings (recipe flags; ``method.KEY`` on clashes with TrainingArguments)."""

    variant: str = field(default="eagle1", metadata=_help("eagle1 (last-layer features, feature regression), eagle3 "
                                                          "(three fused layers, token loss, training-time test) or "
                                                          "peagle (EAGLE-3 drafting a block in one forward from "
                                                          "placeholders: P-EAGLE)."))
    layers: str = field(default="auto", metadata=_help("EAGLE-3: the three target layers (hidden-state indices, "
                                                       "comma-separated), or auto: 2, n//2, n-3 as EAGLE-3."))
    ttt_steps: int = field(default=7, metadata=_help("EAGLE-3: unrolled steps of the training-time test."))
    ttt_recompute: bool = field(default=True, metadata=_help("EAGLE-3: recompute each unrolled step's activations in "
                                                             "the backward (activation checkpointing): one step's "
                                                             "activations held at a time instead of all of them, "
                                                             "the same gradients, about a sixth more training time "
                                                             "(eagle3_tiny: 20.5 -> 24.1 s for 30 steps)."))
    step_decay: float = field(default=0.8, metadata=_help("EAGLE-3: weight decay**j of unrolled step j's loss."))
    depth_r: float = field(default=0.7, metadata=_help("P-EAGLE: depth j's loss weight max(r**j, r_min), the share of "
                                                       "anchors the reference's conditional drop-token sampling keeps "
                                                       "at depth j (r 0.7)."))
    depth_r_min: float = field(default=0.2, metadata=_help("P-EAGLE: the floor r_min of depth j's weight (0.2)."))
    mask_token_id: int = field(default=-1, metadata=_help("P-EAGLE: the placeholder token; -1 = the tokenizer's mask "
                                                          "token, else its pad, unknown or end-of-sequence token."))
    draft_vocab_size: int = field(default=8192, metadata=_help("EAGLE-3: the draft vocabulary, the most frequent "
                                                               "target tokens of the answers the head trains on "
                                                               "(capped at the target's vocabulary)."))
    draft_vocab_prompts: int = field(default=512, metadata=_help("EAGLE-3 with data_mode=target and online features: "
                                                                 "the first N training prompts the target answers "
                                                                 "(greedy, once, before training) to count the draft "
                                                                 "vocabulary on, the dataset's responses breaking "
                                                                 "ties; 0 = every training prompt. Offline features "
                                                                 "count the cached answers, data_mode=fixed the "
                                                                 "dataset's responses."))
    head_layer: str = field(default="llama", metadata=_help("The head's decoder layer: llama = a Llama layer of the "
                                                            "target's sizes and rope, whatever its family (what vLLM "
                                                            "and SGLang load EAGLE heads as); target = the target "
                                                            "family's own layer (draftsmith's loop only: the export "
                                                            "refuses it where the family's layer is not Llama's)."))
    fc_bias: bool = field(default=True, metadata=_help("EAGLE-1: bias in the (2H -> H) fc layer, as the reference's "
                                                       "head (EAGLE-3's fc has none). vLLM's EAGLE-1 fc has no bias: "
                                                       "the vllm-eagle export folds it into the layer's attention "
                                                       "biases (exact)."))
    fc_norm: bool = field(default=False, metadata=_help("EAGLE-3.1 (EAGLE-3 / P-EAGLE): an RMSNorm on each fused "
                                                         "target layer before fc (against the layers' scale drift)."))
    norm_output: bool = field(default=False, metadata=_help("EAGLE-3.1: the next unrolled or drafted step reads the "
                                                            "head's normed output instead of its pre-norm state."))
    norm_before_residual: bool = field(default=False, metadata=_help(
        "EAGLE-3 / P-EAGLE: the layer's residual is its normed input hidden_norm(g) instead of g (speculators' "
        "default; vLLM reads it from the export, SGLang does not)."))
    train_lm_head: bool = field(default=True, metadata=_help(
        "EAGLE-3 / P-EAGLE: train the draft vocabulary's LM head from the target's rows (EAGLE-3's reference code), "
        "or keep it frozen at them (false: speculators' head)."))
    token_loss: str = field(default="ce", metadata=_help("EAGLE-3 / P-EAGLE: each unrolled step's loss against the "
                                                         "target's distribution over the draft vocabulary. ce = its "
                                                         "cross-entropy (the reference's); nla or lk_hybrid = the LK "
                                                         "losses, which optimise the acceptance rate itself; "
                                                         "forward_kl, reverse_kl, jsd, tvd as DistillSpec's."))
    reg_weight: float = field(default=1.0, metadata=_help("Weight of the smooth-L1 feature regression (EAGLE: 1.0)."))
    cls_weight: float = field(default=0.1, metadata=_help("Weight of the token cross-entropy (EAGLE: 0.1)."))
    noise: float = field(default=0.1, metadata=_help("Uniform noise U(-noise, noise) on the input features (EAGLE: "
                                                     "0.1; 0 = off)."))
    draft_length: int = field(default=5, metadata=_help("Evaluation: tokens the head drafts per step (chain)."))
    tree: str = field(default="dynamic", metadata=_help("Evaluation: dynamic (EAGLE-2's tree) or chain."))
    tree_depth: int = field(default=5, metadata=_help("Dynamic tree: levels the head expands."))
    tree_top_k: int = field(default=8, metadata=_help("Dynamic tree: nodes expanded per level, children per node."))
    tree_nodes: int = field(default=32, metadata=_help("Dynamic tree: tokens kept for verification (total_tokens)."))

    def __post_init__(self) -> None:
        self.check_features()
        if self.variant not in VARIANTS:
            raise ConfigError(f"variant={self.variant!r} is unknown: choose one of {', '.join(VARIANTS)}")
        if self.head_layer not in HEAD_LAYERS:
            raise ConfigError(f"head_layer={self.head_layer!r} is unknown: choose one of {', '.join(HEAD_LAYERS)}")
        if int(self.ttt_steps) < 1 or int(self.draft_vocab_size) < 1 or not 0.0 < float(self.step_decay) <= 1.0:
            raise ConfigError("ttt_steps and draft_vocab_size must be >= 1 and step_decay in (0, 1]")
        if int(self.draft_vocab_prompts) < 0:
            raise ConfigError(f"draft_vocab_prompts={self.draft_vocab_prompts} must be >= 0 (0 = every training prompt)")
        if self.layers != "auto":
            try:
                picked = [int(x) for x in str(self.layers).split(",")]
            except ValueError:
                picked = []
            if len(picked) != 3:
                raise ConfigError(f"layers={self.layers!r}: give auto or three comma-separated hidden-state indices")
        self.check_answers()
        if min(float(self.reg_weight), float(self.cls_weight)) < 0 or float(self.reg_weight) + float(self.cls_weight) == 0:
            raise ConfigError("reg_weight and cls_weight must be >= 0 and not both 0")
        if float(self.noise) < 0:
            raise ConfigError(f"noise={self.noise} must be >= 0")
        if min(int(self.draft_length), int(self.tree_depth), int(self.tree_top_k), int(self.tree_nodes)) < 1:
            raise ConfigError("draft_length and the tree sizes must be >= 1")
        if self.tree not in ("chain", "dynamic"):
            raise ConfigError(f"tree={self.tree!r} is unknown: choose chain or dynamic")
        if self.variant == "peagle" and int(self.draft_length) > int(self.ttt_steps):
            raise ConfigError(f"P-EAGLE drafts at most its trained depths: draft_length={self.draft_length} > "
                              f"ttt_steps={self.ttt_steps}; raise ttt_steps or lower draft_length")
        if not self.unrolled and (self.fc_norm or self.norm_output or self.norm_before_residual
                                  or not self.train_lm_head):
            raise ConfigError("fc_norm, norm_output, norm_before_residual and train_lm_head=false are EAGLE-3 / "
                              "P-EAGLE options: set variant=eagle3 or peagle, or leave them at their defaults")
        if self.token_loss != "ce" and self.token_loss not in DIVERGENCES:
            raise ConfigError(f"token_loss={self.token_loss!r} is unknown: choose ce or one of {', '.join(DIVERGENCES)}")
        if not 0.0 < float(self.depth_r) <= 1.0 or not 0.0 <= float(self.depth_r_min) <= 1.0:
            raise ConfigError("depth_r must be in (0, 1] and depth_r_min in [0, 1]")

    @property
    def unrolled(self) -> bool:
        """EAGLE-3 and P-EAGLE train through the unrolled training-time test."""
        return self.variant in ("eagle3", "peagle")

    def step_weights(self, steps: int) -> float | list[float]:
        """Unrolled step ``j``'s loss weight: ``step_decay**j`` (EAGLE-3, passed as the decay) or, for P-EAGLE,
        ``max(r**j, r_min)`` per depth."""
        if self.variant != "peagle":
            return float(self.step_decay)
        return [max(float(self.depth_r) ** j, float(self.depth_r_min)) for j in range(steps)]

    def proposer_settings(self) -> dict[str, Any]:
        tree = "chain" if self.variant == "peagle" else self.tree  # a P-EAGLE block is a chain
        return {"draft_length": int(self.draft_length), "tree": tree, "tree_depth": int(self.tree_depth),
                "tree_top_k": int(self.tree_top_k), "tree_nodes": int(self.tree_nodes)}


__all__ = ["EagleConfig", "VARIANTS"]
