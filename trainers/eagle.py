"""EAGLE-1 (Li et al. 2024): a feature-level draft head trained on the frozen target's features.

For a training sequence ``x_0 .. x_{T-1}`` the frozen target gives its features ``f_t`` (final-normed last hidden
states) and next-token distributions ``p_{t+1} = softmax(LMHead(f_t))``; the features are computed inside the
training step (*online*: no disk). The head (:class:`draftsmith.inference.eagle.EagleHead`) reads
``[E(x_{t+1}); f_t + u]`` at position ``t`` and predicts ``f^_{t+1}``; ``u ~ U(-noise, noise)`` per element is the
paper's noise augmentation (0.1; training only), which makes the head robust to its own feature errors when it
drafts on its own outputs. Loss (EAGLE sec. 4, eqs. 2-4)::

    L_reg = sum_t mean_h SmoothL1(f^_{t+1}, f_{t+1})
    L_cls = sum_t CE(p_{t+2}, p^_{t+2}) = - sum_t sum_v p_{t+2}(v) log softmax(LMHead(f^_{t+1}))(v)
    L     = reg_weight * L_reg + cls_weight * L_cls          (the paper's weights: 1.0 and 0.1)

summed over the positions ``t`` whose token ``x_{t+2}`` is a response token, then normalised by the base trainer
over those positions of the accumulation window. The training data is the target's own answers by default
(``data_mode=target``, the shared self-distillation), as the paper recommends for robustness; ``fixed`` trains on
the dataset's responses. Evaluation reports the held-out top-1 agreement of the head's next token with the
target's (the acceptance proxy of the first draft step) and logs it to TensorBoard.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError
from draftsmith.inference.eagle import EagleHead
from draftsmith.trainers.base import FrozenTargetTrainer

DATA_MODES = ("target", "fixed")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class EagleConfig:
    """EAGLE-1 settings (recipe flags; ``method.KEY`` on clashes with TrainingArguments)."""

    variant: str = field(default="eagle1", metadata=_help("eagle1 (EAGLE-3 is not built yet)."))
    fc_bias: bool = field(default=False, metadata=_help("Bias in the (2H -> H) fc layer (vLLM's EAGLE-1 model "
                                                        "has none, so the default leaves it out)."))
    reg_weight: float = field(default=1.0, metadata=_help("Weight of the smooth-L1 feature regression (EAGLE: 1.0)."))
    cls_weight: float = field(default=0.1, metadata=_help("Weight of the token cross-entropy (EAGLE: 0.1)."))
    noise: float = field(default=0.1, metadata=_help("Uniform noise U(-noise, noise) on the input features (EAGLE: "
                                                     "0.1; 0 = off)."))
    data_mode: str = field(default="target", metadata=_help("target = train on the target's greedy answers to the "
                                                            "dataset prompts; fixed = the dataset responses."))
    max_new_tokens: int = field(default=64, metadata=_help("Tokens the target generates per prompt (data_mode=target)."))
    prompt_tokens: int = field(default=32, metadata=_help("For plain-text rows, how many leading tokens form the "
                                                          "prompt the target continues."))
    draft_length: int = field(default=5, metadata=_help("Evaluation: tokens the head drafts per step (chain)."))
    tree: str = field(default="dynamic", metadata=_help("Evaluation: dynamic (EAGLE-2's tree) or chain."))
    tree_depth: int = field(default=5, metadata=_help("Dynamic tree: levels the head expands."))
    tree_top_k: int = field(default=8, metadata=_help("Dynamic tree: nodes expanded per level, children per node."))
    tree_nodes: int = field(default=32, metadata=_help("Dynamic tree: tokens kept for verification (total_tokens)."))

    def __post_init__(self) -> None:
        if self.variant != "eagle1":
            raise ConfigError(f"variant={self.variant!r} is not available: this draftsmith trains eagle1")
        if self.data_mode not in DATA_MODES:
            raise ConfigError(f"data_mode={self.data_mode!r} is unknown: choose one of {', '.join(DATA_MODES)}")
        if min(float(self.reg_weight), float(self.cls_weight)) < 0 or float(self.reg_weight) + float(self.cls_weight) == 0:
            raise ConfigError("reg_weight and cls_weight must be >= 0 and not both 0")
        if float(self.noise) < 0:
            raise ConfigError(f"noise={self.noise} must be >= 0")
        if min(int(self.max_new_tokens), int(self.prompt_tokens), int(self.draft_length), int(self.tree_depth),
               int(self.tree_top_k), int(self.tree_nodes)) < 1:
            raise ConfigError("max_new_tokens, prompt_tokens, draft_length and the tree sizes must be >= 1")
        if self.tree not in ("chain", "dynamic"):
            raise ConfigError(f"tree={self.tree!r} is unknown: choose chain or dynamic")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def proposer_settings(self) -> dict[str, Any]:
        return {"draft_length": int(self.draft_length), "tree": self.tree, "tree_depth": int(self.tree_depth),
                "tree_top_k": int(self.tree_top_k), "tree_nodes": int(self.tree_nodes)}


def build_eagle_head(models: dict, config: EagleConfig) -> EagleHead:
    """The trainable module of the recipe: a fresh head for the target."""
    return EagleHead.for_target(models["target"], fc_bias=config.fc_bias)


def supervised_positions(labels: torch.Tensor) -> torch.Tensor:  # [B, T-2] bool
    """Head positions ``t`` that are trained: those whose ``x_{t+2}`` is a labelled (response) token."""
    return labels[:, 2:] != -100


def uniform_noise(like: torch.Tensor, scale: float) -> torch.Tensor:
    """``U(-scale, scale)`` noise of ``like``'s shape and dtype."""
    return (torch.rand_like(like) * 2.0 - 1.0) * scale


def eagle_losses(pred: torch.Tensor, target_features: torch.Tensor, pred_logits: torch.Tensor,
                 target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed ``(L_reg, L_cls)`` over ``N`` positions: ``pred``/``target_features`` ``[N, H]``, logits ``[N, V]``."""
    reg = F.smooth_l1_loss(pred.float(), target_features.float(), reduction="none").mean(-1).sum()
    p = target_logits.float().softmax(-1)
    cls = -(p * F.log_softmax(pred_logits.float(), dim=-1)).sum()
    return reg, cls


class EagleTrainer(FrozenTargetTrainer):
    """Trains an :class:`EagleHead` (``model``) on the frozen target's features (module docstring)."""

    config_class = EagleConfig

    def prepare_training_batch(self, model, inputs):
        cfg = self.method_config
        if cfg.data_mode == "fixed":
            return inputs
        return self.generated_batch(inputs, max_new_tokens=cfg.max_new_tokens, prompt_tokens=cfg.prompt_tokens)

    def count_loss_tokens(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return supervised_positions(inputs["labels"]).sum()

    def _head_outputs(self, model, inputs: dict[str, torch.Tensor], noise: float):
        """``(f^ [B, T-1, H], target features [B, T, H], target logits [B, T, V])`` for a batch."""
        with torch.no_grad():
            out = self.teacher(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                               output_hidden_states=True)
        features, logits = out.hidden_states[-1], out.logits  # [B, T, H], [B, T, V]
        ids = inputs["input_ids"]
        with torch.no_grad():
            embeds = self.teacher_module.get_input_embeddings()(ids[:, 1:])  # [B, T-1, H]  E(x_{t+1})
        inp = features[:, :-1]
        if noise > 0:
            inp = inp + uniform_noise(inp, noise)
        t = inp.shape[1]
        pos = torch.arange(t, device=ids.device)[None].expand(ids.shape[0], t)
        pred = model(embeds, inp, pos, key_padding=inputs["attention_mask"][:, 1:])  # [B, T-1, H]
        return pred, features, logits

    def _terms(self, model, inputs, noise: float):
        pred, features, logits = self._head_outputs(model, inputs, noise)
        keep = supervised_positions(inputs["labels"])  # [B, T-2]
        lm_head = self.teacher_module.get_output_embeddings()
        pred_rows = pred[:, :-1][keep]  # [N, H]: f^_{t+1} for t = 0 .. T-3
        pred_logits = lm_head(pred_rows)  # [N, V]
        target_logits = logits[:, 1:-1][keep]  # [N, V]: p_{t+2} = softmax(LMHead(f_{t+1}))
        reg, cls = eagle_losses(pred_rows, features[:, 1:-1][keep], pred_logits, target_logits)
        agree = (pred_logits.argmax(-1) == target_logits.argmax(-1)).sum().float()
        return reg, cls, agree, keep.sum().float()

    def loss_sum(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """``reg_weight * L_reg + cls_weight * L_cls`` summed over the supervised positions (module docstring)."""
        cfg = self.method_config
        reg, cls, _, _ = self._terms(model, inputs, float(cfg.noise) if model.training else 0.0)
        return cfg.reg_weight * reg + cfg.cls_weight * cls, None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out loss, and the sums behind the regression, cross-entropy and top-1 agreement metrics."""
        inputs = self._prepare_inputs(inputs)
        if self.method_config.data_mode == "target":
            inputs = self.prepare_training_batch(model, inputs)
        cfg = self.method_config
        with torch.no_grad():
            reg, cls, agree, n = self._terms(model, inputs, 0.0)
            loss = (cfg.reg_weight * reg + cfg.cls_weight * cls) / n.clamp(min=1)
            self.add_eval_sums(torch.stack([reg, cls, agree, n]))
        return loss.detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        n = float(sums[3].clamp(min=1))
        self.top1 = float(sums[2]) / n
        return {f"{prefix}_reg": float(sums[0]) / n, f"{prefix}_cls": float(sums[1]) / n, f"{prefix}_top1": self.top1}

    def manifest_training(self) -> dict[str, Any]:
        return {"head_top1": self.top1} if getattr(self, "top1", None) is not None else {}


__all__ = ["EagleConfig", "EagleTrainer", "build_eagle_head", "eagle_losses", "supervised_positions", "uniform_noise"]
