"""LayerSkip (Elhoushi et al. 2024): layer dropout and an early-exit loss, so that the target's first layers already
predict well and it can draft for itself (early-exit self-speculation, ``draftsmith eval --artefact``).

The trained module is a copy of the target (full fine-tuning, or a peft LoRA adapter merged into the artefact;
the frozen original stays the reference for the held-out figures). Its layers run one by one through the adapter (:meth:`ModelAdapter.forward_layers`, the
model's own layer modules; no copied modeling code).

**Layer dropout** (sec. 4.1.1, eqs. 2-4): at step ``t`` of ``T`` layer ``l`` of ``L`` is skipped, per sample, with
probability::

    p_{l,t} = S(t) * D(l) * p_max
    D(l) = exp(l ln 2 / (L - 1)) - 1         ("exp", the paper's; "linear": l / (L - 1); "uniform": 1)
    S(t) = 1                                 ("constant", the default: the paper's for continual pretraining and
                                              fine-tuning, which is what draftsmith does)
    S(t) = exp(t ln 2 / (T - 1)) - 1         ("increasing": the paper's S_exp, for pretraining from scratch)

so the first layer is never dropped and the last at ``p_max`` (a skipped layer passes its input through).

**Early-exit loss** (sec. 4.1.2, eqs. 5-6): every enabled exit ``l`` (the model's own final norm and LM head on layer
``l``'s output) adds its next-token cross-entropy, with scales that grow with depth and are normalised over the
enabled exits::

    J = sum_l  e~(t, l) * CE(LMHead(norm(h_l)), Y),      e~(t, l) = C(t, l) e(l) / sum_i C(t, i) e(i)
    e(l) = e_scale * sum_{i=0..l} i                      for 0 <= l < L - 1
    e(L - 1) = (L - 1) + e_scale * sum_{i=0..L-2} i

(so the first layer's exit has weight 0, and with ``e_scale = 1`` every ``e(l)`` is ``sum_{i<=l} i``). The paper's
sum, not the reference code's: torchtune's ``sum_l_loss_scale`` takes the running sum of ``l + 1`` over the enabled
exits only.

**Curricula** ``C(t, l)`` (the last layer is always enabled): ``rotational`` enables every ``R``-th exit, rotating
by one layer each step (``C = 1`` when ``(l - t) mod R == 0``); ``gradual`` enables exits from the last layer
towards the first: ``C = 1`` once ``t / T >= f * (L - l) / L`` (all enabled from ``t = f T``; ``f`` =
``gradual_fraction``); ``all`` enables every exit in every step.

Each exit's cross-entropy runs chunk by chunk over the vocabulary through the copy's LM head
(:func:`~draftsmith.trainers.losses.head_cross_entropy`), as do the held-out figures: no ``[tokens, vocabulary]``
table exists beyond one chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.trainers.base import FrozenTargetTrainer
from draftsmith.trainers.losses import LinearHead, head_cross_entropy, head_rows_map, last_hidden
from draftsmith.trainers.mixins import TargetAnswers, TunableCopy, check_choice, merged_model, tunable_copy
from draftsmith.trainers.mixins import help_text as _help

DROPOUT_SHAPES = ("exp", "linear", "uniform")
DROPOUT_TIMES = ("constant", "increasing")
CURRICULA = ("rotational", "gradual", "all")


@dataclass
class LayerSkipConfig(TargetAnswers, TunableCopy):
    """LayerSkip settings (recipe flags; ``method.KEY`` on clashes with TrainingArguments)."""

    data_mode: str = field(default="fixed", metadata=_help("fixed = the dataset as it is (continual pretraining on "
                                                           "text, or fine-tuning on chats: assistant tokens only); "
                                                           "target = the target's own answers."))
    dropout_max: float = field(default=0.1, metadata=_help("p_max: the last layer's dropout rate."))
    dropout_shape: str = field(default="exp", metadata=_help("D(l): exp (the paper's), linear or uniform."))
    dropout_time: str = field(default="constant", metadata=_help("S(t): constant = 1 (the paper's for continual "
                                                                 "pretraining and fine-tuning) or increasing = "
                                                                 "exp(t ln 2 / (T - 1)) - 1 (the paper's for "
                                                                 "pretraining from scratch)."))
    early_exit_scale: float = field(default=1.0, metadata=_help("e_scale: weight of the early exits against the "
                                                                "last layer (the paper: 1.0 for fine-tuning, "
                                                                "0.1-0.2 for continual pretraining)."))
    curriculum: str = field(default="rotational", metadata=_help("rotational, gradual or all."))
    rotation: int = field(default=4, metadata=_help("Rotational curriculum: R, every R-th exit enabled per step."))
    gradual_fraction: float = field(default=0.5, metadata=_help("Gradual curriculum: all exits enabled after this "
                                                                "fraction of the steps."))
    exit_layer: int = field(default=0, metadata=_help("Evaluation: the exit layer E that drafts (0 = a quarter of "
                                                      "the layers)."))
    draft_length: int = field(default=4, metadata=_help("Evaluation: tokens drafted per step."))

    def __post_init__(self) -> None:
        self.check_answers()
        self.check_finetune()
        if not 0.0 <= float(self.dropout_max) < 1.0:
            raise ConfigError(f"dropout_max={self.dropout_max} must lie in [0, 1)")
        check_choice("dropout_shape", self.dropout_shape, DROPOUT_SHAPES)
        check_choice("dropout_time", self.dropout_time, DROPOUT_TIMES)
        check_choice("curriculum", self.curriculum, CURRICULA)
        if int(self.rotation) < 1 or not 0.0 < float(self.gradual_fraction) <= 1.0 or float(self.early_exit_scale) < 0:
            raise ConfigError("rotation >= 1, gradual_fraction in (0, 1] and early_exit_scale >= 0")
        if int(self.exit_layer) < 0 or int(self.draft_length) < 1:
            raise ConfigError("exit_layer >= 0 (0 = a quarter of the layers) and draft_length >= 1")

    def proposer_settings(self) -> dict[str, Any]:
        return {"exit_layer": int(self.exit_layer) or None, "draft_length": int(self.draft_length),
                "draft_length_mode": "fixed"}


# ------------------------------------------------------------------------------------------------ the schedules


def dropout_rates(num_layers: int, step: int, total_steps: int, p_max: float, shape: str = "exp",
                  time: str = "constant") -> torch.Tensor:  # [L]
    """``p_{l,t} = S(t) D(l) p_max`` for every layer (module docstring)."""
    L, T = int(num_layers), max(2, int(total_steps))
    depth = torch.arange(L, dtype=torch.float64) / max(1, L - 1)
    d = {"exp": torch.exp(depth * math.log(2.0)) - 1.0, "linear": depth, "uniform": torch.ones(L, dtype=torch.float64)}
    s = 1.0 if time == "constant" else math.exp(min(step, T - 1) * math.log(2.0) / (T - 1)) - 1.0
    return (s * d[shape] * p_max).float()


def enabled_exits(num_layers: int, step: int, total_steps: int, curriculum: str, rotation: int = 4,
                  fraction: float = 0.5) -> torch.Tensor:  # [L] bool
    """``C(t, l)``: which exits add their loss at ``step`` (the last layer always; module docstring)."""
    L = int(num_layers)
    layers = torch.arange(L)
    if curriculum == "all":
        on = torch.ones(L, dtype=torch.bool)
    elif curriculum == "rotational":
        on = (layers - step) % int(rotation) == 0
    else:
        done = step / max(1, int(total_steps))
        on = torch.tensor([done >= fraction * (L - i) / L for i in range(L)])
    on[-1] = True
    return on


def exit_scales(enabled: torch.Tensor, e_scale: float) -> torch.Tensor:  # [L] float, zero where disabled
    """``e~(t, l)`` (LayerSkip eq. 6): ``e(l) = e_scale * sum_{i=0..l} i`` for ``l < L - 1``, ``e(L - 1) = (L - 1) +
    e_scale * sum_{i=0..L-2} i``, normalised over the enabled exits (module docstring). Where every enabled exit
    weighs 0 (a one-layer model) the enabled exits share the loss equally."""
    L = enabled.numel()
    layers = torch.arange(L, dtype=torch.float64)
    e = e_scale * layers * (layers + 1) / 2  # e_scale * sum_{i=0..l} i
    e[-1] = (L - 1) + e_scale * (L - 2) * (L - 1) / 2
    e = e * enabled.double()
    if float(e.sum()) <= 0.0:  # L = 1, or only the zero-weight first exit enabled: equal weights
        e = enabled.double()
    return (e / e.sum().clamp(min=1e-12)).float()


# ------------------------------------------------------------------------------------------------- the model


class LayerSkipTraining(nn.Module):
    """The trainable module: the adapted copy of the target, whose ``forward`` is a batch's whole LayerSkip loss (one
    forward per step through the data-parallel wrapper, so gradients are synchronised). The artefact is the
    adapted model itself (:meth:`artefact_model`; a LoRA adapter merged in)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def causal_lm(self) -> nn.Module:
        return base_model(self.model)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor | None, exits: torch.Tensor,
                scales: torch.Tensor, called: bool = False) -> torch.Tensor:
        """``sum_l scales[l] * CE_l`` (summed over the labelled positions) with layer dropout ``keep`` [B, L]
        (``called``: the LM head is sharded, called chunk by chunk)."""
        losses = exit_losses(self.causal_lm, input_ids, labels, keep, exits, called)
        return sum(scales[layer] * ce for layer, ce in losses.items())

    def artefact_model(self) -> nn.Module:
        return merged_model(self.model)


def build_layerskip_model(models: dict, config: LayerSkipConfig) -> LayerSkipTraining:
    """The trainable module around a copy of the target (the original stays the frozen reference): all of it
    trained, or a peft LoRA model of it (``finetune=lora``)."""
    ModelAdapter(models["target"])  # refuse unsupported layouts now, with a one-line error
    return LayerSkipTraining(tunable_copy(models["target"], config.finetune, config.lora_r, config.lora_alpha))


def base_model(module: nn.Module) -> nn.Module:
    """The causal LM under a peft wrapper (its LoRA layers active), or the module itself."""
    return module.get_base_model() if hasattr(module, "get_base_model") else module


def layer_forward(model: nn.Module, input_ids: torch.Tensor, keep: torch.Tensor | None,
                  exits: torch.Tensor) -> dict[int, torch.Tensor]:
    """Run ``model``'s layers one by one: a row whose ``keep[b, l]`` is False skips layer ``l`` (passes its input
    through). Returns ``{l: [B, T, H]}`` the output of every layer ``l`` with ``exits[l]`` (before the norm)."""
    adapter = ModelAdapter(model)
    t = input_ids.shape[1]
    pos = torch.arange(t, device=input_ids.device)[None].expand(input_ids.shape[0], t)
    hidden = adapter.embed(input_ids, pos)
    states = {}
    for i in range(adapter.num_layers):
        if keep is None or bool(keep[:, i].any()):
            new, _ = adapter.forward_layers(hidden, pos, start=i, end=i + 1)
            hidden = new if keep is None else torch.where(keep[:, i, None, None], new, hidden)
        if bool(exits[i]):
            states[i] = hidden
    return states


def exit_losses(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor | None,
                exits: torch.Tensor, called: bool = False) -> dict[int, torch.Tensor]:
    """``{l: summed next-token CE of exit l}`` over the labelled positions (the model's own norm and LM head, chunked
    over the vocabulary; ``called``: the head is sharded and called chunk by chunk)."""
    adapter = ModelAdapter(model)
    states = layer_forward(model, input_ids, keep, exits)
    targets = labels[:, 1:]
    mask = targets != -100
    head = LinearHead(adapter.lm_head, called=called)
    return {layer: head_cross_entropy(adapter.norm(hidden[:, :-1][mask]), head, targets[mask])
            for layer, hidden in states.items()}


def exit_rows(logits: torch.Tensor, labels: torch.Tensor, final_top: torch.Tensor) -> torch.Tensor:  # [C, 2]
    """Per held-out token of one exit: its next-token CE and whether its argmax is the full depth's."""
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    return torch.stack([ce, (logits.argmax(-1) == final_top).float()], -1)


class LayerSkipTrainer(FrozenTargetTrainer):
    """Trains a copy of the target with layer dropout and the early-exit loss (module docstring)."""

    config_class = LayerSkipConfig

    def prepare_training_batch(self, model, inputs):
        return self.answers_batch(inputs)

    def loss_sum(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """``sum_l e~(t, l) * CE_l`` with this step's dropout and enabled exits (module docstring)."""
        cfg = self.method_config
        layers = ModelAdapter(self.accelerator.unwrap_model(model).causal_lm).num_layers
        step, total = self.state.global_step, max(1, self.state.max_steps)
        exits = enabled_exits(layers, step, total, cfg.curriculum, cfg.rotation, cfg.gradual_fraction)
        scales = exit_scales(exits, cfg.early_exit_scale)  # [L]
        exits = exits & (scales > 0)  # an exit of weight 0 (the first layer's, e(0) = 0) needs no LM head
        keep = None
        if model.training and cfg.dropout_max > 0:
            rates = dropout_rates(layers, step, total, cfg.dropout_max, cfg.dropout_shape, cfg.dropout_time)
            keep = torch.rand(inputs["input_ids"].shape[0], layers) >= rates[None]  # [B, L], per sample
            keep = keep.to(inputs["input_ids"].device)
        return model(inputs["input_ids"], inputs["labels"], keep, exits, scales.to(inputs["input_ids"].device),
                     self.sharded()), None

    def _original_hidden(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # [B, T, H], final-normed
        """The original target's last hidden state (its forward computes one position's logits only)."""
        with torch.no_grad():
            return last_hidden(self.teacher, inputs["input_ids"], inputs["attention_mask"])

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out: the training loss (no dropout, this step's exits), and per exit the CE and the top-1 agreement
        with the full depth, plus the full-depth CE of the trained copy and of the original target (every one chunked
        over the vocabulary)."""
        inputs = self._prepare_inputs(inputs)
        inputs = self.answers_batch(inputs)
        net = self.accelerator.unwrap_model(model).causal_lm
        with torch.no_grad():
            total, _ = self.loss_sum(model, inputs)
            n = self.count_loss_tokens(inputs).clamp(min=1).to(total.device)
            adapter = ModelAdapter(net)
            layers = adapter.num_layers
            states = layer_forward(net, inputs["input_ids"], None, torch.ones(layers, dtype=torch.bool))
            labels = inputs["labels"][:, 1:]
            mask = labels != -100
            y = labels[mask]  # [N]
            head = LinearHead(adapter.lm_head)
            final_top = head_rows_map(adapter.norm(states[layers - 1][:, :-1][mask]), head,
                                      lambda z, _, __: z.argmax(-1))  # [N]
            targets = torch.stack([y, final_top], -1)  # [N, 2]: each exit's label and the full depth's argmax
            rows = [head_rows_map(adapter.norm(states[layer][:, :-1][mask]), head,
                                  lambda z, t, _: exit_rows(z, t[:, 0], t[:, 1]), labels=targets).sum(0)
                    for layer in range(layers)]  # [2] each: CE sum, agreements
            original = self._original_hidden(inputs)[:, :-1][mask]  # [N, H]
            orig_ce = head_cross_entropy(original, LinearHead(self.teacher_module.get_output_embeddings(),
                                                              called=self.sharded()), y)
            sums = torch.cat([torch.stack(rows).reshape(-1), orig_ce[None].to(total.device),
                              mask.sum().float()[None].to(total.device)])
            self.add_eval_sums(sums)  # [2L + 2]
        return (total / n).detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        n = float(sums[-1].clamp(min=1))
        per = sums[:-2].reshape(-1, 2)  # [L, 2]: CE sum, agreement
        self.exit_agreement = [round(float(a) / n, 5) for a in per[:, 1]]
        metrics = {f"{prefix}_exit{layer + 1}_top1": float(per[layer, 1]) / n for layer in range(per.shape[0])}
        metrics[f"{prefix}_full_loss"] = float(per[-1, 0]) / n
        metrics[f"{prefix}_original_full_loss"] = float(sums[-2]) / n
        return metrics

    def manifest_training(self) -> dict[str, Any]:
        agreement = getattr(self, "exit_agreement", None)
        return {"exit_agreement": agreement} if agreement is not None else {}


__all__ = ["LayerSkipConfig", "LayerSkipTrainer", "build_layerskip_model", "dropout_rates", "enabled_exits",
           "LayerSkipTraining", "base_model", "exit_losses", "exit_rows", "exit_scales", "layer_forward"]
