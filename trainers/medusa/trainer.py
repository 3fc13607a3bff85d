"""Medusa-1 and Medusa-2 (Cai et al. 2024): decoding heads on the target's last hidden state.

Loss (Medusa eq. 2, Medusa-1, ``variant=medusa1``, the target frozen): for the final-normed target hidden state ``h_t`` and head ``k`` (0-based, predicting
the token ``k + 2`` places after position ``t``, the target's own LM head covering ``t + 1``)::

    L = sum_k lambda_k * sum_t CE(softmax(LMHead(ResBlocks_k(h_t))), x_{t+k+2}),   lambda_k = decay**k  (0.8)

summed over the positions whose label ``x_{t+k+2}`` is a response token, then normalised by the base trainer over
the loss tokens of the accumulation window. The training data is the target's own answers by default
(``data_mode=target``: the shared self-distillation of :meth:`FrozenTargetTrainer.generated_batch`), so the heads
learn what the target will say; ``fixed`` trains on the dataset's responses as they are.

Medusa-2 (``variant=medusa2``, Medusa sec. 2.2.2) tunes the target jointly through a peft LoRA adapter on a copy of
it (the frozen original stays the teacher and the source of the training answers)::

    L = w_lm * sum_t CE(p'_t, x_{t+1})  +  w_kl * sum_t KL(p_t || p'_t)  +  lambda_0 * L_medusa1(h'_t)

with ``p`` the original target's next-token distribution, ``p'`` and ``h'`` the adapted target's, and
``lambda_0 = heads_weight`` (0.2). The default ``w_lm = 0, w_kl = 1`` is the paper's self-distillation (sec. 2.3.2,
``L_LM-distill = KL(p_original || p)``; the reference's ``medusa_self_distillation``): on the target's own answers
the KL to the original *replaces* the LM loss of the joint loss ``L_LM + lambda_0 L_medusa1``. ``w_lm = 1, w_kl = 0``
is that joint loss on data the target was trained on (``data_mode=fixed``); both at 1 is draftsmith's earlier
default. For the first ``heads_warmup_ratio`` of the steps only the heads train (Medusa-1 on
the adapter, which starts as the identity), as the paper warms the heads up before joint training; the adapter
then trains at its own, lower ``lora_learning_rate`` (the paper's differential learning rates). The artefact
carries the adapter (``adapter/``) next to the heads, and the evaluator verifies against the adapted target.

Every vocabulary-sized term runs chunk by chunk through the LM heads (:mod:`draftsmith.trainers.losses`): the heads'
cross-entropies, and Medusa-2's CE and KL from the adapted and the original target's last hidden states (their
forwards compute one position's logits only), so no ``[tokens, vocabulary]`` table exists beyond one chunk.

Evaluation measures, per head, how often the true token is the head's rank-r candidate (r < 10): top-1 and top-5
accuracy go to TensorBoard, and the whole table goes into the artefact's manifest (``training.head_accuracy``),
from which the evaluator grows the default token tree (:func:`draftsmith.inference.core.trees.greedy_choices`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from draftsmith.common.errors import ConfigError
from draftsmith.common.models import lm_head_rows
from draftsmith.common.sharding import whole_copy
from draftsmith.inference.drafters.medusa import MedusaHeads
from draftsmith.trainers.base import FrozenTargetTrainer
from draftsmith.trainers.losses import (
    LinearHead,
    check_plain_logits,
    cross_entropy_rows,
    divergence_per_token,
    head_cross_entropy,
    head_divergence,
    head_loss,
    head_rows_map,
    last_hidden,
    plain_linear,
)
from draftsmith.trainers.mixins import TargetAnswers
from draftsmith.trainers.mixins import help_text as _help

VARIANTS = ("medusa1", "medusa2")
RANKS = 10  # candidate ranks whose accuracy is measured (the tree's top-k)


@dataclass
class MedusaConfig(TargetAnswers):
    """Medusa-1/-2 settings (recipe flags; ``method.KEY`` on clashes with TrainingArguments)."""

    variant: str = field(default="medusa1", metadata=_help("medusa1 = heads on the frozen target; medusa2 = heads and a "
                                                           "LoRA adapter of the target trained jointly."))
    heads: int = field(default=4, metadata=_help("Number of Medusa heads K; head k predicts the token k+2 ahead."))
    head_layers: int = field(default=1, metadata=_help("Residual blocks per head."))
    shared_lm_head: bool = field(default=True, metadata=_help("Use the target's frozen LM head for every head (true), "
                                                              "or give each head its own copy initialised from it."))
    loss_decay: float = field(default=0.8, metadata=_help("lambda_k = loss_decay**k weights head k's loss (Medusa: 0.8)."))
    lora_r: int = field(default=16, metadata=_help("Medusa-2: LoRA rank of the target's adapter."))
    lora_alpha: float = field(default=32.0, metadata=_help("Medusa-2: LoRA alpha."))
    lora_dropout: float = field(default=0.0, metadata=_help("Medusa-2: LoRA dropout."))
    lora_target_modules: str = field(default="all-linear", metadata=_help("Medusa-2: modules the adapter wraps "
                                                                          "(peft's target_modules: all-linear, or "
                                                                          "comma-separated names like q_proj,v_proj)."))
    lora_learning_rate: float = field(default=1.0e-4, metadata=_help("Medusa-2: the adapter's learning rate (the "
                                                                     "heads use learning_rate)."))
    lm_weight: float = field(default=0.0, metadata=_help("Medusa-2: w_lm, weight of the adapted target's own "
                                                         "next-token CE. 0 = the paper's self-distillation (the KL "
                                                         "replaces the LM loss); 1 with kl_weight=0 = the joint loss "
                                                         "on the target's training data; both 1 = the earlier sum."))
    kl_weight: float = field(default=1.0, metadata=_help("Medusa-2: w_kl, weight of KL(original || adapted), the "
                                                         "paper's self-distillation loss of the target."))
    heads_weight: float = field(default=0.2, metadata=_help("Medusa-2: lambda_0, weight of the heads' loss."))
    heads_warmup_ratio: float = field(default=0.3, metadata=_help("Medusa-2: fraction of the steps that train the "
                                                                  "heads alone before the adapter joins."))
    tree: str = field(default="auto", metadata=_help("Evaluation tree: auto (grown from the measured head accuracies), "
                                                     "chain, or a JSON file of choice paths."))
    tree_nodes: int = field(default=32, metadata=_help("Nodes of the auto tree."))

    def __post_init__(self) -> None:
        if int(self.heads) < 1 or int(self.head_layers) < 1:
            raise ConfigError(f"heads={self.heads} and head_layers={self.head_layers} must be >= 1")
        if not 0.0 < float(self.loss_decay) <= 1.0:
            raise ConfigError(f"loss_decay={self.loss_decay} must lie in (0, 1] (Medusa uses 0.8)")
        self.check_answers()
        if int(self.tree_nodes) < 1:
            raise ConfigError(f"tree_nodes={self.tree_nodes} must be >= 1")
        if self.variant not in VARIANTS:
            raise ConfigError(f"variant={self.variant!r} is unknown: choose one of {', '.join(VARIANTS)}")
        if int(self.lora_r) < 1 or float(self.lora_learning_rate) <= 0:
            raise ConfigError(f"lora_r={self.lora_r} must be >= 1 and lora_learning_rate={self.lora_learning_rate} > 0")
        if min(float(self.lm_weight), float(self.kl_weight), float(self.heads_weight)) < 0 or float(self.heads_weight) == 0:
            raise ConfigError("lm_weight and kl_weight must be >= 0 and heads_weight > 0 (the heads must train)")
        if self.joint and float(self.lm_weight) + float(self.kl_weight) == 0:
            raise ConfigError("lm_weight and kl_weight are both 0: nothing keeps the adapted target close to the "
                              "original; set kl_weight=1 (self-distillation)")
        if not 0.0 <= float(self.heads_warmup_ratio) < 1.0:
            raise ConfigError(f"heads_warmup_ratio={self.heads_warmup_ratio} must lie in [0, 1)")

    @property
    def joint(self) -> bool:
        """Whether the target is tuned with the heads (Medusa-2)."""
        return self.variant == "medusa2"

    @property
    def loss_weights(self) -> tuple[float, float, float]:
        """Medusa-2's ``(w_lm, w_kl, lambda_0)``."""
        return float(self.lm_weight), float(self.kl_weight), float(self.heads_weight)

    def proposer_settings(self) -> dict[str, Any]:
        return {"tree": self.tree, "tree_nodes": self.tree_nodes}


def head_module(heads: MedusaHeads, k: int, lm_head: nn.Module | None) -> nn.Module:
    """Head ``k``'s LM head: the target's, shared (``lm_head``), or the head's own copy."""
    if heads.lm_heads is not None:
        return heads.lm_heads[k]
    if lm_head is None:
        raise ValueError("these Medusa heads share the target's LM head: pass lm_head=")
    return lm_head


def heads_loss(heads: MedusaHeads, hidden: torch.Tensor, labels: torch.Tensor, lm_head: nn.Module, decay: float,
               called: bool = False) -> torch.Tensor:
    """``sum_k decay**k * sum_t CE(softmax(LMHead(ResBlocks_k(h_t))), x_{t+k+2})`` (Medusa eq. 2) over ``hidden``
    ``[B, T, H]``, each head's CE chunked over the vocabulary (``called``: its LM head sharded, called per chunk)."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for k in range(heads.num_heads):
        positions, tokens = head_targets(labels, k)
        if not bool(positions.any()):
            continue
        features = heads.features(hidden[:, : positions.shape[1]][positions], k)  # [N, H]
        head = LinearHead(head_module(heads, k, lm_head), called=called)
        total = total + decay ** k * head_cross_entropy(features, head, tokens[positions])
    return total


def _next_token_rows(labels: torch.Tensor, hidden: torch.Tensor,
                     original: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The response positions ``t`` (``x_{t+1}`` labelled): ``(h'_t [N, H], x_{t+1} [N], h_t [N, H] or None)``."""
    mask = labels[:, 1:] != -100  # [B, T-1]
    return (hidden[:, :-1][mask], labels[:, 1:][mask],
            None if original is None else original[:, :-1][mask].to(hidden.device))


def target_loss(labels: torch.Tensor, hidden: torch.Tensor, head: LinearHead, original_hidden: torch.Tensor,
                original: LinearHead, lm_weight: float, kl_weight: float) -> torch.Tensor:
    """Medusa-2's target terms over the response positions, ``w_lm * sum_t CE(p'_t, x_{t+1}) + w_kl * sum_t
    KL(p_t || p'_t)``, with ``p' = softmax(head(h'))`` the adapted target's (``hidden`` ``[B, T, H]``) and ``p =
    softmax(original(h))`` the frozen original's (``original_hidden``), chunked in one pass over the vocabulary."""
    h, y, t = _next_token_rows(labels, hidden, original_hidden)
    if lm_weight == 0:
        return kl_weight * head_divergence(h, head, t, original, kind="forward_kl")
    if kl_weight == 0:
        return lm_weight * head_cross_entropy(h, head, y)

    def rows(z, y_c, t_c):  # [C]
        return lm_weight * cross_entropy_rows(z, y_c) + kl_weight * divergence_per_token(z, t_c, "forward_kl")

    return head_loss(h, head, rows, labels=y, teacher_hidden=t, teacher=original)


def target_agreement(labels: torch.Tensor, hidden: torch.Tensor, head: LinearHead, original_hidden: torch.Tensor,
                     original: LinearHead) -> tuple[torch.Tensor, torch.Tensor]:
    """Held-out: summed ``KL(p_t || p'_t)`` and how often the adapted and the original target's argmaxes agree, over
    the response positions (without gradient, chunk by chunk)."""
    h, _, t = _next_token_rows(labels, hidden, original_hidden)

    def rows(z, _, t_c):  # [C, 2]
        agree = (z.argmax(-1) == t_c.argmax(-1)).float()
        return torch.stack([divergence_per_token(z, t_c, "forward_kl").float(), agree], -1)

    sums = head_rows_map(h, head, rows, teacher_hidden=t, teacher=original).sum(0)  # [2]
    return sums[0], sums[1]


def _all_trainable_zero(module: nn.Module) -> torch.Tensor:
    """A zero that reaches every trainable parameter (data-parallel ranks then all reduce the same set)."""
    return sum(p.sum() * 0.0 for p in module.parameters() if p.requires_grad)


class HeadsTraining(nn.Module):
    """Medusa-1's trainable module: the heads, whose ``forward`` is the whole training loss of a batch (one forward
    per step through the data-parallel wrapper, so gradients are synchronised). The artefact keeps the heads."""

    def __init__(self, heads: MedusaHeads) -> None:
        super().__init__()
        self.heads = heads

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, lm_head: nn.Module, decay: float,
                called: bool = False) -> torch.Tensor:
        total = heads_loss(self.heads, hidden, labels, lm_head, decay, called)
        return total if total.grad_fn is not None else total + _all_trainable_zero(self)

    def artefact_config(self) -> dict:
        return self.heads.artefact_config()

    @staticmethod
    def artefact_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The heads' entries of the whole module's state dict, named as :class:`MedusaHeads` names them."""
        return {k.removeprefix("heads."): v for k, v in state_dict.items() if k.startswith("heads.")}


class AdaptedTargetHeads(HeadsTraining):
    """Medusa-2's trainable module: a peft LoRA model of (a copy of) the target and the heads over it; ``forward``
    is the batch's whole loss (module docstring). The artefact keeps the heads' tensors and the adapter
    (:attr:`target_adapter`)."""

    def __init__(self, adapted_target: nn.Module, heads: MedusaHeads) -> None:
        super().__init__(heads)
        self.target = adapted_target

    @property
    def target_adapter(self) -> nn.Module:
        return self.target

    def adapted(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, grad: bool) -> torch.Tensor:
        """The adapted target's final-normed last hidden state ``[B, T, H]`` (its forward computes one position's
        logits only)."""
        with contextlib.nullcontext() if grad else torch.no_grad():
            return last_hidden(self.target, input_ids, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, lm_head: nn.Module,
                decay: float, original_hidden: torch.Tensor | None = None,
                weights: tuple[float, float, float] = (0, 1, 0.2), joint: bool = True,
                called: bool = False) -> torch.Tensor:
        """``joint``: ``w_lm CE + w_kl KL(original || adapted) + w_heads heads loss`` (``weights``, with
        ``original_hidden`` ``[B, T, H]`` the frozen original's last hidden state and ``lm_head`` its LM head);
        warm-up (not ``joint``): the heads' loss over the adapted target's hidden states, the adapter untouched."""
        hidden = self.adapted(input_ids, attention_mask, grad=joint)
        heads = heads_loss(self.heads, hidden, labels, lm_head, decay, called)
        if not joint:
            return heads + _all_trainable_zero(self)
        lm_weight, kl_weight, heads_weight = weights
        own = LinearHead(self.target.get_output_embeddings(), called=called)
        terms = target_loss(labels, hidden, own, original_hidden, LinearHead(lm_head, called=called), lm_weight,
                            kl_weight)
        return terms + heads_weight * heads


def lora_adapted(target: nn.Module, config: MedusaConfig) -> nn.Module:
    """A peft LoRA model over a copy of ``target`` (the original stays frozen and untouched: the teacher). The copy
    doubles the target's weights in memory; a target ZeRO-3 partitions is gathered into a whole copy (every process
    builds it), which the engine then partitions with the trainable module."""
    from peft import LoraConfig, get_peft_model

    modules = config.lora_target_modules
    modules = modules if modules == "all-linear" else [m.strip() for m in modules.split(",") if m.strip()]
    lora = LoraConfig(r=int(config.lora_r), lora_alpha=float(config.lora_alpha), lora_dropout=float(config.lora_dropout),
                      target_modules=modules, bias="none", task_type="CAUSAL_LM")
    try:
        adapted = get_peft_model(whole_copy(target).requires_grad_(False), lora)
    except ValueError as err:
        raise ConfigError(f"the LoRA adapter could not be built ({str(err).splitlines()[0]}): set "
                          "lora_target_modules to module names of this target, e.g. q_proj,v_proj") from None
    plain_linear(adapted.get_output_embeddings(), "the adapted target's LM head")
    return adapted


def build_heads(models: dict, config: MedusaConfig) -> nn.Module:
    """The trainable module of the recipe: fresh heads over the target's width and vocabulary (Medusa-1), with a
    LoRA adapter of the target beside them (Medusa-2)."""
    target = models["target"]
    heads = MedusaHeads(hidden=target.config.hidden_size, vocab=lm_head_rows(target), heads=config.heads,
                        layers=config.head_layers, shared_lm_head=config.shared_lm_head)
    heads.init_lm_heads(target.get_output_embeddings())
    if config.joint:
        check_plain_logits(target.config, "Medusa-2")
    return AdaptedTargetHeads(lora_adapted(target, config), heads) if config.joint else HeadsTraining(heads)


def head_targets(labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions, tokens)`` head ``k`` learns from: ``positions`` ``[B, T-k-2]`` bool where ``x_{t+k+2}`` is a
    labelled token, ``tokens`` ``[B, T-k-2]`` those tokens (-100 elsewhere)."""
    ahead = labels[:, k + 2:]  # [B, T-k-2]
    return ahead != -100, ahead


def rank_hits(logits: torch.Tensor, tokens: torch.Tensor, ranks: int = RANKS) -> torch.Tensor:  # [N, ranks]
    """Per row, whether the true token is the logits' rank-r candidate (``logits`` [N, V], ``tokens`` [N])."""
    top = logits.topk(ranks, dim=-1).indices  # [N, ranks]
    return (top == tokens[:, None]).float()  # at most one 1 per row


def rank_of_true(logits: torch.Tensor, tokens: torch.Tensor, ranks: int = RANKS) -> torch.Tensor:
    """``[ranks]`` counts: how often the true token is the logits' rank-r candidate (``logits`` [N, V], ``tokens`` [N])."""
    return rank_hits(logits, tokens, ranks).sum(0)


class MedusaTrainer(FrozenTargetTrainer):
    """Trains :class:`MedusaHeads` (``model``) on the frozen target's last hidden states (Medusa-1), or an
    :class:`AdaptedTargetHeads` on the adapted target's, with the Medusa-2 loss (module docstring)."""

    config_class = MedusaConfig

    def __init__(self, model, teacher_model, method_config: MedusaConfig | None = None, *args, **kwargs):
        super().__init__(model, teacher_model, method_config, *args, **kwargs)
        self.head_accuracy: list[list[float]] | None = None  # [K][RANKS] from the last evaluation

    def prepare_training_batch(self, model, inputs):
        return self.answers_batch(inputs)

    def _target_hidden(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # [B, T, H], final-normed
        with torch.no_grad():
            return last_hidden(self.teacher, inputs["input_ids"], inputs["attention_mask"])

    def warming_up(self) -> bool:
        """Medusa-2: whether this step trains the heads alone (the first ``heads_warmup_ratio`` of the steps)."""
        return self.state.global_step < int(self.method_config.heads_warmup_ratio * max(1, self.state.max_steps))

    def loss_sum(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """Medusa-1: sum over heads of lambda_k * the summed cross-entropy of head k; Medusa-2: the heads' loss in the
        warm-up, then the combined loss (module docstring). Always one forward of the trained module."""
        cfg = self.method_config
        lm_head = self.teacher_module.get_output_embeddings()
        called = self.sharded()
        if not cfg.joint:
            return model(self._target_hidden(inputs), inputs["labels"], lm_head, cfg.loss_decay, called), None
        joint = not self.warming_up() or not model.training  # held-out: always the whole combined loss
        original = self._target_hidden(inputs) if joint else None
        total = model(inputs["input_ids"], inputs["attention_mask"], inputs["labels"], lm_head, cfg.loss_decay,
                      original, cfg.loss_weights, joint, called)
        return total, None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out loss and, per head, how often the true token is each candidate rank."""
        inputs = self._prepare_inputs(inputs)
        if self.method_config.data_mode == "target":
            inputs = self.prepare_training_batch(model, inputs)
        with torch.no_grad():
            total, _ = self.loss_sum(model, inputs)
            loss = total / self.count_loss_tokens(inputs).clamp(min=1).to(total.device)
            module = self.accelerator.unwrap_model(model)
            lm_head = self.teacher_module.get_output_embeddings()
            joint = self.method_config.joint
            hidden = module.adapted(inputs["input_ids"], inputs["attention_mask"], grad=False) if joint \
                else self._target_hidden(inputs)
            rows = []
            for k in range(module.num_heads):
                positions, tokens = head_targets(inputs["labels"], k)
                counts = torch.zeros(RANKS, device=hidden.device)
                if bool(positions.any()):
                    features = module.heads.features(hidden[:, : positions.shape[1]][positions], k)  # [N, H]
                    head = LinearHead(head_module(module.heads, k, lm_head))
                    counts = head_rows_map(features, head, lambda z, y, _: rank_hits(z, y), labels=tokens[positions])
                    counts = counts.sum(0)
                rows.append(torch.cat([counts, positions.sum().float()[None].to(counts.device)]))
            if joint:  # one more row: the adapted target against the original
                own = LinearHead(module.target.get_output_embeddings())
                kl, agree = target_agreement(inputs["labels"], hidden, own, self._target_hidden(inputs),
                                             LinearHead(lm_head))
                n = (inputs["labels"][:, 1:] != -100).sum().float().to(hidden.device)
                rows.append(torch.cat([torch.stack([kl.to(hidden.device), agree.to(hidden.device)]),
                                       hidden.new_zeros(RANKS - 2, dtype=torch.float32), n[None]]))
            self.add_eval_sums(torch.stack(rows))  # [K (+1), RANKS + 1]
        return loss.detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        metrics = {}
        if self.method_config.joint:  # the last row: KL and argmax agreement of the adapted target
            row, sums = sums[-1], sums[:-1]
            n = float(row[RANKS].clamp(min=1))
            metrics[f"{prefix}_target_kl"] = float(row[0]) / n
            metrics[f"{prefix}_target_top1_agreement"] = float(row[1]) / n
        counts, n = sums[:, :RANKS], sums[:, RANKS:].clamp(min=1)  # [K, RANKS], [K, 1]
        accuracy = counts / n  # [K, RANKS]
        self.head_accuracy = [[round(float(a), 5) for a in row] for row in accuracy]
        for k, row in enumerate(accuracy):
            metrics[f"{prefix}_head{k}_top1"] = float(row[0])
            metrics[f"{prefix}_head{k}_top5"] = float(row[:5].sum())
        return metrics

    def manifest_training(self) -> dict[str, Any]:
        return {"head_accuracy": self.head_accuracy} if self.head_accuracy is not None else {}

    def create_optimizer(self, model=None):
        """Medusa-2: the heads at ``learning_rate``, the adapter at ``lora_learning_rate`` (differential learning
        rates, Medusa sec. 2.2.2); Medusa-1: the Trainer's own."""
        if not self.method_config.joint or self.optimizer is not None:
            return super().create_optimizer(model)
        module = self.accelerator.unwrap_model(self.model if model is None else model)
        optimizer_cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, module)
        kwargs.pop("lr", None)
        decay = self.args.weight_decay
        groups = [{"params": [p for p in module.heads.parameters() if p.requires_grad], "lr": self.args.learning_rate,
                   "weight_decay": decay},
                  {"params": [p for p in module.target.parameters() if p.requires_grad],
                   "lr": float(self.method_config.lora_learning_rate), "weight_decay": decay}]
        self.optimizer = optimizer_cls(groups, **kwargs)
        return self.optimizer


__all__ = ["AdaptedTargetHeads", "HeadsTraining", "MedusaConfig", "MedusaTrainer", "build_heads", "head_module",
           "head_targets", "heads_loss", "lora_adapted", "rank_hits", "rank_of_true", "target_agreement",
           "target_loss"]
