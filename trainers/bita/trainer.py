"""BiTA (Lin et al. 2024): bi-directional tuning of prompt and mask tokens on a frozen target.

Only :class:`~draftsmith.inference.drafters.bita.BitaEmbeddings` train: ``virtual_tokens`` prompt tokens (deep per-layer
keys/values through peft's ``PrefixEncoder``, as the reference trains it; or plain input embeddings through peft's
``PromptEmbedding``) and ``mask_tokens`` mask embeddings. The target's weights never change, so its own greedy
output is the reference for losslessness.

Each training sequence (the target's own answers by default: the shared self-distillation, ``data_mode=target``)
gets ``groups`` insertion points ``t`` drawn from its answer. After the frozen target has run the sequence once
(no gradient), a group of the ``M`` mask embeddings is placed after every chosen ``t`` at positions
``t+1 .. t+M``; the group attends to the prompt, to tokens ``0 .. t`` and to its own masks (bidirectionally, or
causally), never to another group; no sequence token sees a mask or the prompt. Mask ``k`` learns the token
``k + 1`` places after ``t`` (BiTA eq. 4, cross-entropy on the masks' outputs)::

    L = sum_{b, t in points_b} sum_{k=1..M} CE( softmax(LMHead(h^mask_{t,k})), x_{t+k+1} )

summed over the targets inside the sequence, normalised by the base trainer over the window's mask targets. The
token ``x_{t+1}`` itself is the target's own prediction at ``t``, so each decoding step commits it and drafts
``M`` tokens after it.

The masks' cross-entropy runs chunk by chunk over the vocabulary from their last hidden states and the target's LM
head (:func:`~draftsmith.trainers.losses.head_cross_entropy`; the forward computes no logits), so no
``[targets, vocabulary]`` table exists beyond one chunk.

Held-out evaluation reports each mask's top-1 accuracy and the chain tau they imply
(``1 + sum_j prod_{k<=j} acc_k``, with the per-mask accuracies as if independent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.kv_cache import KVPrefix
from draftsmith.inference.drafters.bita import (
    MASK_ATTENTION,
    MASK_TOKENS,
    PROMPT_MODES,
    PROMPT_TOKENS,
    BitaEmbeddings,
    group_visibility,
    training_layout,
)
from draftsmith.inference.proposers.bita import TREES
from draftsmith.trainers.base import FrozenTargetTrainer
from draftsmith.trainers.losses import LinearHead, head_cross_entropy, head_rows_map
from draftsmith.trainers.mixins import SeededBatches, TargetAnswers
from draftsmith.trainers.mixins import help_text as _help

POINTS_KEY = "bita_points"  # [B, G] insertion points of a prepared batch (-1 = none)


@dataclass
class BitaConfig(TargetAnswers):
    """BiTA settings (recipe flags; ``method.KEY`` on clashes with TrainingArguments)."""

    virtual_tokens: int = field(default=PROMPT_TOKENS, metadata=_help("Prompt tokens P (BiTA's reference code: 16)."))
    mask_tokens: int = field(default=MASK_TOKENS, metadata=_help("Mask tokens M: tokens drafted per step (BiTA's reference code: 3 "
                                                                                  "for 7B-13B targets)."))
    prompt_mode: str = field(default="deep", metadata=_help("deep = per-layer prompt keys/values (P-tuning v2, as "
                                                            "the reference trains it); embeddings = plain prompt input embeddings."))
    mask_attention: str = field(default="bidirectional", metadata=_help("How a group's masks see each other: "
                                                                        "bidirectional or causal (the reference code's)."))
    groups: int = field(default=16, metadata=_help("Mask groups (insertion points) per training sequence."))
    init_seed: int = field(default=0, metadata=_help("Seed of the vocabulary tokens the prompt and masks start from."))
    tree: str = field(default="chain", metadata=_help("Evaluation draft: chain (top-1 of each mask) or triangle (the "
                                                      "reference code's upper-triangle tree over the masks' top-k)."))
    tree_top_k: int = field(default=5, metadata=_help("Candidates of the first mask in the triangle tree."))

    def __post_init__(self) -> None:
        self.check_answers()
        if int(self.virtual_tokens) < 1 or int(self.mask_tokens) < 1 or int(self.groups) < 1:
            raise ConfigError(f"virtual_tokens={self.virtual_tokens}, mask_tokens={self.mask_tokens} and "
                              f"groups={self.groups} must be >= 1")
        for name, value, allowed in (("prompt_mode", self.prompt_mode, PROMPT_MODES),
                                     ("mask_attention", self.mask_attention, MASK_ATTENTION), ("tree", self.tree, TREES)):
            if value not in allowed:
                raise ConfigError(f"{name}={value!r} is unknown: choose one of {', '.join(allowed)}")
        if int(self.tree_top_k) < 1:
            raise ConfigError(f"tree_top_k={self.tree_top_k} must be >= 1")

    def proposer_settings(self) -> dict[str, Any]:
        return {"tree": self.tree, "tree_top_k": self.tree_top_k}


def insertion_points(labels: torch.Tensor, groups: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``[B, G]`` insertion points: per sequence, up to ``groups`` distinct ``t`` whose first mask target
    ``x_{t+2}`` is labelled, drawn uniformly (sorted; -1 pads a sequence with fewer)."""
    b, t_len = labels.shape
    valid = torch.zeros_like(labels, dtype=torch.bool)
    valid[:, : max(0, t_len - 2)] = labels[:, 2:] != -100  # [B, T]
    points = torch.full((b, groups), -1, dtype=torch.long)
    for i in range(b):
        where = valid[i].nonzero()[:, 0].cpu()
        if where.numel() == 0:
            continue
        pick = where[torch.randperm(where.numel(), generator=generator)[:groups]].sort().values
        points[i, : pick.numel()] = pick
    return points.to(labels.device)


def sequence_kv(adapter: ModelAdapter, input_ids: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The frozen target's per-layer keys and values of a right-padded batch ``[B, T]``: each ``[B, H_kv, T, D]``."""
    with torch.no_grad():
        cache = adapter.new_cache(input_ids.shape[1])
        adapter.forward(input_ids, cache, compute_logits=False)
        pairs = [cache.layer(i) for i in range(adapter.num_layers)]
    return [k for k, _ in pairs], [v for _, v in pairs]


class BitaTraining(nn.Module):
    """The trainable module: the embeddings, whose ``forward`` is a batch's whole loss (one forward per step through
    the data-parallel wrapper, so gradients are synchronised). The artefact keeps the embeddings."""

    def __init__(self, embeddings: BitaEmbeddings) -> None:
        super().__init__()
        self.embeddings = embeddings

    def mask_hidden(self, adapter: ModelAdapter, points: torch.Tensor, labels: torch.Tensor,
                    seq_keys: list[torch.Tensor], seq_values: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(final-normed hidden states [B, G*M, H], targets [B, G*M])`` of every mask group of the batch (module
        docstring): the LM head's inputs."""
        emb = self.embeddings
        b, g = points.shape
        m = emb.mask_tokens
        seen, positions, targets = training_layout(points, labels, m)  # [B, GM, T], [B, GM], [B, GM]
        prompt_k, prompt_v = emb.prefix_kv(adapter)  # L x [1, Hkv, P, D]
        keys = [torch.cat([pk.to(sk.dtype).expand(b, -1, -1, -1), sk], dim=2) for pk, sk in zip(prompt_k, seq_keys)]
        values = [torch.cat([pv.to(sv.dtype).expand(b, -1, -1, -1), sv], dim=2) for pv, sv in zip(prompt_v, seq_values)]
        visible = torch.cat([seen.new_ones(b, g * m, emb.prompt_tokens), seen], dim=2)  # [B, GM, P + T]
        inputs = emb.mask_inputs(g)[None].expand(b, -1, -1).to(adapter.dtype)  # [B, GM, H]
        out = adapter.forward(inputs_embeds=inputs, position_ids=positions,
                              tree=group_visibility(g, m, emb.mask_attention).to(inputs.device),
                              kv_prefix=KVPrefix(keys, values, visible), compute_logits=False)
        return out.last_hidden, targets

    def forward(self, adapter: ModelAdapter, points: torch.Tensor, labels: torch.Tensor,
                seq_keys: list[torch.Tensor], seq_values: list[torch.Tensor], *, hidden_only: bool = False):
        """The summed cross-entropy of every mask against its target token (BiTA eq. 4), chunked over the
        vocabulary; with ``hidden_only`` :meth:`mask_hidden`'s ``(hidden, targets)`` instead (evaluation: through
        the forward too, which a sharded module needs to gather its embeddings)."""
        hidden, targets = self.mask_hidden(adapter, points, labels, seq_keys, seq_values)
        if hidden_only:
            return hidden, targets
        return head_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), LinearHead(adapter.lm_head),
                                  targets.reshape(-1))

    def artefact_config(self) -> dict:
        return self.embeddings.artefact_config()

    @staticmethod
    def artefact_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The embeddings' entries of the whole module's state dict, named as :class:`BitaEmbeddings` names them."""
        return {k.removeprefix("embeddings."): v for k, v in state_dict.items() if k.startswith("embeddings.")}


def build_bita(models: dict, config: BitaConfig) -> nn.Module:
    """The recipe's trainable module: prompt and mask embeddings for the target, started from its vocabulary."""
    target = models["target"]
    emb = BitaEmbeddings.for_target(target, prompt_tokens=int(config.virtual_tokens),
                                    mask_tokens=int(config.mask_tokens), prompt_mode=config.prompt_mode,
                                    mask_attention=config.mask_attention)
    emb.init_from_target(ModelAdapter(target), seed=int(config.init_seed))
    return BitaTraining(emb)


def chain_tau(accuracy: list[float]) -> float:
    """``1 + sum_j prod_{k<=j} acc_k``: tokens per step of the chain if the masks' hits were independent."""
    tau, run = 1.0, 1.0
    for a in accuracy:
        run *= a
        tau += run
    return tau


class BitaTrainer(SeededBatches, FrozenTargetTrainer):
    """Trains :class:`BitaTraining` (``model``) beside the frozen target (module docstring)."""

    config_class = BitaConfig

    def __init__(self, model, teacher_model, method_config: BitaConfig | None = None, *args, **kwargs):
        super().__init__(model, teacher_model, method_config, *args, **kwargs)
        if self._zero_stage() == 3:
            raise ConfigError("BiTA runs the frozen target layer by layer, which ZeRO-3's sharded target does not allow: "
                              "use ZeRO-2 (launch/configs/deepspeed/zero2.json) or plain data parallelism")
        self.adapter = ModelAdapter(self.teacher_module)
        self.mask_accuracy: list[float] | None = None

    def prepare_training_batch(self, model, inputs):
        batch = self.answers_batch(inputs)
        return {**batch, POINTS_KEY: insertion_points(batch["labels"], int(self.method_config.groups),
                                                      self.batch_generator())}

    def count_loss_tokens(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The mask targets of the batch (what the loss sums over)."""
        _, _, targets = training_layout(inputs[POINTS_KEY], inputs["labels"], int(self.method_config.mask_tokens))
        return (targets != -100).sum()

    def loss_sum(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        keys, values = sequence_kv(self.adapter, inputs["input_ids"])
        return model(self.adapter, inputs[POINTS_KEY], inputs["labels"], keys, values), None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out loss and each mask's top-1 accuracy, at insertion points drawn with a fixed seed."""
        inputs = self._prepare_inputs(inputs)
        batch = self.answers_batch(inputs)
        batch[POINTS_KEY] = insertion_points(batch["labels"], int(self.method_config.groups),
                                             torch.Generator().manual_seed(0))
        m = int(self.method_config.mask_tokens)
        with torch.no_grad():
            keys, values = sequence_kv(self.adapter, batch["input_ids"])
            hidden, targets = model(self.adapter, batch[POINTS_KEY], batch["labels"], keys, values, hidden_only=True)
            hidden, head = hidden.reshape(-1, hidden.shape[-1]), LinearHead(self.adapter.lm_head)  # [B*GM, H]
            count = (targets != -100).sum()
            loss = head_cross_entropy(hidden, head, targets.reshape(-1)) / count.clamp(min=1)
            top = head_rows_map(hidden, head, lambda z, _, __: z.argmax(-1)).view_as(targets)  # [B, GM]
            hit = (top == targets) & (targets != -100)  # [B, GM]
            by_mask = hit.reshape(hit.shape[0], -1, m).sum((0, 1)).float()  # [M]
            total = (targets != -100).reshape(hit.shape[0], -1, m).sum((0, 1)).float()  # [M]
            self.add_eval_sums(torch.stack([by_mask, total]))
        return loss.detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        accuracy = (sums[0] / sums[1].clamp(min=1)).tolist()
        self.mask_accuracy = [round(a, 5) for a in accuracy]
        metrics = {f"{prefix}_mask{k + 1}_top1": a for k, a in enumerate(accuracy)}
        metrics[f"{prefix}_predicted_tau_chain"] = chain_tau(accuracy)
        return metrics

    def manifest_training(self) -> dict[str, Any]:
        module = self.accelerator.unwrap_model(self.model)
        facts: dict[str, Any] = {"trained_parameters": module.embeddings.num_parameters}
        if self.mask_accuracy is not None:
            facts["mask_accuracy"] = self.mask_accuracy
        return facts


__all__ = ["BitaConfig", "BitaTrainer", "BitaTraining", "build_bita", "chain_tau", "insertion_points", "sequence_kv"]
