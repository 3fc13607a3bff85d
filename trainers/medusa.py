"""Medusa-1 (Cai et al. 2024): decoding heads trained on the frozen target's last hidden state.

Loss (Medusa eq. 2, Medusa-1): for the final-normed target hidden state ``h_t`` and head ``k`` (0-based, predicting
the token ``k + 2`` places after position ``t``, the target's own LM head covering ``t + 1``)::

    L = sum_k lambda_k * sum_t CE(softmax(LMHead(ResBlocks_k(h_t))), x_{t+k+2}),   lambda_k = decay**k  (0.8)

summed over the positions whose label ``x_{t+k+2}`` is a response token, then normalised by the base trainer over
the loss tokens of the accumulation window. The training data is the target's own answers by default
(``data_mode=target``: the shared self-distillation of :meth:`FrozenTargetTrainer.generated_batch`), so the heads
learn what the target will say; ``fixed`` trains on the dataset's responses as they are.

Evaluation measures, per head, how often the true token is the head's rank-r candidate (r < 10): top-1 and top-5
accuracy go to TensorBoard, and the whole table goes into the artefact's manifest (``training.head_accuracy``),
from which the evaluator grows the default token tree (:func:`draftsmith.inference.trees.greedy_choices`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError
from draftsmith.common.models import lm_head_rows
from draftsmith.inference.heads import MedusaHeads
from draftsmith.trainers.base import FrozenTargetTrainer

DATA_MODES = ("target", "fixed")
RANKS = 10  # candidate ranks whose accuracy is measured (the tree's top-k)


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class MedusaConfig:
    """Medusa-1 settings (recipe flags; ``method.KEY`` on clashes with TrainingArguments)."""

    heads: int = field(default=4, metadata=_help("Number of Medusa heads K; head k predicts the token k+2 ahead."))
    head_layers: int = field(default=1, metadata=_help("Residual blocks per head."))
    shared_lm_head: bool = field(default=True, metadata=_help("Use the target's frozen LM head for every head (true), "
                                                              "or give each head its own copy initialised from it."))
    loss_decay: float = field(default=0.8, metadata=_help("lambda_k = loss_decay**k weights head k's loss (Medusa: 0.8)."))
    data_mode: str = field(default="target", metadata=_help("target = train on the target's greedy answers to the "
                                                            "dataset prompts (self-distillation); fixed = the dataset "
                                                            "responses as they are."))
    max_new_tokens: int = field(default=64, metadata=_help("Tokens the target generates per prompt (data_mode=target)."))
    prompt_tokens: int = field(default=32, metadata=_help("For plain-text rows, how many leading tokens form the "
                                                          "prompt the target continues."))
    tree: str = field(default="auto", metadata=_help("Evaluation tree: auto (grown from the measured head accuracies), "
                                                     "chain, or a JSON file of choice paths."))
    tree_nodes: int = field(default=32, metadata=_help("Nodes of the auto tree."))

    def __post_init__(self) -> None:
        if int(self.heads) < 1 or int(self.head_layers) < 1:
            raise ConfigError(f"heads={self.heads} and head_layers={self.head_layers} must be >= 1")
        if not 0.0 < float(self.loss_decay) <= 1.0:
            raise ConfigError(f"loss_decay={self.loss_decay} must lie in (0, 1] (Medusa uses 0.8)")
        if self.data_mode not in DATA_MODES:
            raise ConfigError(f"data_mode={self.data_mode!r} is unknown: choose one of {', '.join(DATA_MODES)}")
        if int(self.max_new_tokens) < 1 or int(self.prompt_tokens) < 1 or int(self.tree_nodes) < 1:
            raise ConfigError("max_new_tokens, prompt_tokens and tree_nodes must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def proposer_settings(self) -> dict[str, Any]:
        return {"tree": self.tree, "tree_nodes": self.tree_nodes}


def build_heads(models: dict, config: MedusaConfig) -> MedusaHeads:
    """The trainable module of the recipe: fresh heads over the target's width and vocabulary."""
    target = models["target"]
    heads = MedusaHeads(hidden=target.config.hidden_size, vocab=lm_head_rows(target), heads=config.heads,
                        layers=config.head_layers, shared_lm_head=config.shared_lm_head)
    heads.init_lm_heads(target.get_output_embeddings())
    return heads


def head_targets(labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions, tokens)`` head ``k`` learns from: ``positions`` ``[B, T-k-2]`` bool where ``x_{t+k+2}`` is a
    labelled token, ``tokens`` ``[B, T-k-2]`` those tokens (-100 elsewhere)."""
    ahead = labels[:, k + 2:]  # [B, T-k-2]
    return ahead != -100, ahead


def rank_of_true(logits: torch.Tensor, tokens: torch.Tensor, ranks: int = RANKS) -> torch.Tensor:
    """``[ranks]`` counts: how often the true token is the logits' rank-r candidate (``logits`` [N, V], ``tokens`` [N])."""
    top = logits.topk(ranks, dim=-1).indices  # [N, ranks]
    hit = top == tokens[:, None]  # [N, ranks], at most one True per row
    return hit.sum(0).float()


class MedusaTrainer(FrozenTargetTrainer):
    """Trains :class:`MedusaHeads` (``model``) on the frozen target's last hidden states (Medusa-1)."""

    config_class = MedusaConfig

    def __init__(self, model, teacher_model, method_config: MedusaConfig | None = None, *args, **kwargs):
        super().__init__(model, teacher_model, method_config, *args, **kwargs)
        self.head_accuracy: list[list[float]] | None = None  # [K][RANKS] from the last evaluation

    def prepare_training_batch(self, model, inputs):
        cfg = self.method_config
        if cfg.data_mode == "fixed":
            return inputs
        return self.generated_batch(inputs, max_new_tokens=cfg.max_new_tokens, prompt_tokens=cfg.prompt_tokens)

    def _target_hidden(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # [B, T, H], final-normed
        with torch.no_grad():
            out = self.teacher(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                               output_hidden_states=True, logits_to_keep=1)
        return out.hidden_states[-1]

    def _head_logits(self, model, hidden: torch.Tensor, k: int, positions: torch.Tensor) -> torch.Tensor:  # [N, V]
        heads = self.accelerator.unwrap_model(model)
        picked = hidden[:, : positions.shape[1]][positions]  # [N, H]
        return heads.head_logits(picked, k, self.teacher_module.get_output_embeddings()).float()

    def loss_sum(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """Sum over heads of lambda_k * the summed cross-entropy of head k (module docstring)."""
        hidden = self._target_hidden(inputs)
        total = hidden.new_zeros((), dtype=torch.float32)
        heads = self.accelerator.unwrap_model(model).num_heads
        for k in range(heads):
            positions, tokens = head_targets(inputs["labels"], k)
            if not bool(positions.any()):
                continue
            logits = self._head_logits(model, hidden, k, positions)  # [N, V]
            ce = F.cross_entropy(logits, tokens[positions], reduction="sum")
            total = total + self.method_config.loss_decay ** k * ce
        if total.grad_fn is None:  # no head had a target in this batch: a zero that still reaches every parameter
            total = total + sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad)
        return total, None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out loss and, per head, how often the true token is each candidate rank."""
        inputs = self._prepare_inputs(inputs)
        if self.method_config.data_mode == "target":
            inputs = self.prepare_training_batch(model, inputs)
        with torch.no_grad():
            total, _ = self.loss_sum(model, inputs)
            loss = total / self.count_loss_tokens(inputs).clamp(min=1).to(total.device)
            hidden = self._target_hidden(inputs)
            rows = []
            for k in range(self.accelerator.unwrap_model(model).num_heads):
                positions, tokens = head_targets(inputs["labels"], k)
                counts = torch.zeros(RANKS, device=hidden.device)
                if bool(positions.any()):
                    counts = rank_of_true(self._head_logits(model, hidden, k, positions), tokens[positions])
                rows.append(torch.cat([counts, positions.sum().float()[None].to(counts.device)]))
            self.add_eval_sums(torch.stack(rows))  # [K, RANKS + 1]
        return loss.detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        counts, n = sums[:, :RANKS], sums[:, RANKS:].clamp(min=1)  # [K, RANKS], [K, 1]
        accuracy = counts / n  # [K, RANKS]
        self.head_accuracy = [[round(float(a), 5) for a in row] for row in accuracy]
        metrics = {}
        for k, row in enumerate(accuracy):
            metrics[f"{prefix}_head{k}_top1"] = float(row[0])
            metrics[f"{prefix}_head{k}_top5"] = float(row[:5].sum())
        return metrics

    def manifest_training(self) -> dict[str, Any]:
        return {"head_accuracy": self.head_accuracy} if self.head_accuracy is not None else {}


__all__ = ["MedusaConfig", "MedusaTrainer", "build_heads", "head_targets", "rank_of_true"]
