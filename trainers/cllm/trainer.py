"""CLLM (Kou et al. 2024): consistency training on the target's own Jacobi trajectories, so that Jacobi decoding
reaches its fixed point in few steps.

The data are Jacobi trajectories the frozen original target produces (:mod:`draftsmith.data.jacobi`): per
``block``-token block, the states ``y^(0) .. y^*`` from a random guess to the fixed point (the greedy block), with
the context ``x`` before it. A copy of the target trains (all of it, or a peft LoRA adapter merged into the
artefact). For a block and an intermediate state ``y^(j)`` drawn at random, with ``q_theta(. | y, x)_i`` the model's
distribution at block position ``i`` given ``x`` and the first ``i`` tokens of ``y``:

- global consistency (CLLM eq. 4, ``consistency=global``, the default): every state maps straight to the fixed
  point's prediction::

      L_GC = sum_i KL( sg[q_theta(. | y^*, x)_i] || q_theta(. | y^(j), x)_i )

- local consistency (CLLM eq. 5, ``consistency=local``): each state to the next one's::

      L_LC = sum_i KL( sg[q_theta(. | y^(j+1), x)_i] || q_theta(. | y^(j), x)_i )

- the AR loss (CLLM eq. 6) on the fixed points keeps the model's own distribution (the greedy answer), with label
  smoothing ``eps`` (``ar_label_smoothing``, 0.1: the reference implementation's; the paper's eq. 6 is plain
  ``-log q``, ``eps = 0``)::

      L_AR = sum_i [ (1 - eps) * (-log q_theta(y^*_i | y^*_<i, x)) + eps * mean_v (-log q_theta(v | y^*_<i, x)) ]

  ``L = L_consistency + ar_weight * L_AR`` (``ar_weight`` 10, the reference implementation's).

``sg`` is stop-gradient; positions whose context already equals the fixed point's (``y^(j)_<i = y^*_<i``) add
nothing to the consistency term and are left out of it, as in the reference code. Sums run over the block positions
up to the first end-of-sequence token and are normalised by the base trainer over those positions.

Both terms run chunk by chunk over the vocabulary from the model's last hidden states and its LM head
(:mod:`draftsmith.trainers.losses`; the forwards compute one position's logits only): the consistency KL computes
``sg[q(. | y^*, x)]`` inside the same loop as ``q(. | y^(j), x)``, so no ``[tokens, vocabulary]`` table exists beyond
one chunk. The logits must be that product: a model that post-processes them (soft-capping) is refused.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftsmith.common.errors import ConfigError
from draftsmith.common.sharding import whole
from draftsmith.data.collate import IGNORE_INDEX
from draftsmith.trainers.base import FrozenTargetTrainer
from draftsmith.trainers.losses import (
    LinearHead,
    check_plain_logits,
    head_cross_entropy,
    head_divergence,
    head_rows_map,
    last_hidden,
    plain_linear,
)
from draftsmith.trainers.mixins import AnswerTokens, TunableCopy, check_choice, merged_model, tunable_copy
from draftsmith.trainers.mixins import help_text as _help

CONSISTENCY = ("global", "local")
ITEM_KEYS = ("prefix", "state", "next", "fixed")  # a trajectory item's fields


@dataclass
class CllmConfig(AnswerTokens, TunableCopy):
    """CLLM settings (recipe flags; ``method.KEY`` on clashes with TrainingArguments). ``max_new_tokens``: answer
    tokens collected per prompt, in whole blocks to the first end-of-sequence."""

    block: int = field(default=16, metadata=_help("Jacobi block size n (CLLM: 16); also the evaluation's block."))
    consistency: str = field(default="global", metadata=_help("global = every state to the fixed point (eq. 4); local "
                                                              "= each state to the next (eq. 5)."))
    ar_weight: float = field(default=10.0, metadata=_help("Weight of the AR loss on the fixed points (reference: 10)."))
    ar_label_smoothing: float = field(default=0.1, metadata=_help("Label smoothing eps of the AR loss (reference: "
                                                                  "0.1; the paper's plain AR loss: 0)."))
    lora_r: int = field(default=32, metadata=_help("finetune=lora: the LoRA rank (reference: 32)."))
    lora_alpha: float = field(default=16.0, metadata=_help("finetune=lora: LoRA alpha (reference: 16)."))
    trajectory_batch_size: int = field(default=8, metadata=_help("Prompts whose Jacobi trajectories are collected "
                                                                  "together (one left-padded batch)."))
    trajectory_dir: str | None = field(default=None, metadata=_help("Where the Jacobi trajectories are collected "
                                                                    "(resumable; default: <output_dir>/trajectories)."))

    def __post_init__(self) -> None:
        self.check_answer_tokens()
        self.check_finetune()
        if min(int(self.block), int(self.trajectory_batch_size)) < 1:
            raise ConfigError("block and trajectory_batch_size must be >= 1")
        check_choice("consistency", self.consistency, CONSISTENCY)
        if float(self.ar_weight) < 0:
            raise ConfigError(f"ar_weight={self.ar_weight} must be >= 0")
        if not 0.0 <= float(self.ar_label_smoothing) < 1.0:
            raise ConfigError(f"ar_label_smoothing={self.ar_label_smoothing} must lie in [0, 1)")

    def proposer_settings(self) -> dict[str, Any]:
        return {"draft_length": int(self.block)}


# --------------------------------------------------------------------------------------------------- the data


def row_prompt(input_ids: list[int], labels: list[int], prompt_tokens: int) -> list[int]:
    """A training row's prompt: the tokens before its first label, or its first ``prompt_tokens`` (plain text)."""
    start = next((i for i, lab in enumerate(labels) if lab != IGNORE_INDEX), len(labels))
    if start == 0:
        start = min(prompt_tokens, len(input_ids) - 1)
    return list(input_ids[: max(1, start)])


def prompt_key(prompt: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:16]


class TrajectoryDataset(torch.utils.data.Dataset):
    """One item per block: the context, a state drawn at random from its trajectory (never the fixed point, unless
    the guess was the fixed point already), the state after it and the fixed point. The draw is a function of
    ``seed``, the epoch (``set_epoch``, which the Trainer's data loader calls) and the item, not of the global
    generator, which the loader's prefetch moves before a checkpoint saves it: a resumed run draws the same states."""

    def __init__(self, rows: list[dict], seed: int = 0) -> None:
        self.rows, self.seed, self.epoch = rows, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[index]
        states = row["states"]
        draw = random.Random(f"{self.seed}:{self.epoch}:{index}")
        j = draw.randrange(len(states) - 1) if len(states) > 1 else 0
        return {"prefix": row["prefix"], "state": states[j], "next": states[min(j + 1, len(states) - 1)],
                "fixed": row["fixed_point"]}


@dataclass
class TrajectoryCollator:
    """Right-pads ``prefix + state``, ``prefix + next`` and ``prefix + fixed`` (same length per row) into
    ``input_state``, ``input_next``, ``input_ids`` (the fixed point) ``[B, T]``; ``labels`` hold the fixed block
    (to its first end-of-sequence token), ``consistency_mask`` the block positions whose state context differs from
    the fixed point's."""

    pad_token_id: int
    eos_ids: tuple[int, ...] = ()

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        length = max(len(it["prefix"]) + len(it["fixed"]) for it in items)
        out = {k: torch.full((len(items), length), v, dtype=torch.long) for k, v in
               (("input_ids", self.pad_token_id), ("input_state", self.pad_token_id), ("input_next", self.pad_token_id),
                ("labels", IGNORE_INDEX), ("attention_mask", 0), ("consistency_mask", 0))}
        for b, it in enumerate(items):
            p, fixed = len(it["prefix"]), list(it["fixed"])
            n = len(fixed)
            stop = next((i + 1 for i, t in enumerate(fixed) if t in self.eos_ids), n)  # block positions trained
            for key, block in (("input_ids", fixed), ("input_state", it["state"]), ("input_next", it["next"])):
                out[key][b, : p + n] = torch.tensor(list(it["prefix"]) + list(block))
            out["attention_mask"][b, : p + n] = 1
            out["labels"][b, p: p + stop] = torch.tensor(fixed[:stop])
            differs = [list(it["state"][:i]) != fixed[:i] for i in range(stop)]
            out["consistency_mask"][b, p: p + stop] = torch.tensor(differs, dtype=torch.long)
        return out


# -------------------------------------------------------------------------------------------------- the model


def block_kl(teacher_hidden: torch.Tensor, student_hidden: torch.Tensor, head: LinearHead,
             mask: torch.Tensor) -> torch.Tensor:
    """``sum KL(softmax(head(teacher)) || softmax(head(student)))`` over the positions ``t`` whose *next* token is
    masked in (``mask`` ``[B, T]`` on token positions; hidden states ``[B, T, H]`` at ``t`` predict ``t + 1``), chunked
    over the vocabulary; the teacher side is frozen (``sg``)."""
    rows = mask[:, 1:].bool()  # [B, T-1]
    frozen = LinearHead(head.module, head.rows, head.vocab, head.called)
    return head_divergence(student_hidden[:, :-1][rows], head, teacher_hidden.detach()[:, :-1][rows], frozen,
                           kind="forward_kl")


def ar_loss(hidden: torch.Tensor, head: LinearHead, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Summed CE of ``head(hidden)`` (``hidden`` ``[B, T, H]``) at ``t`` against ``labels[t + 1]``, chunked over the
    vocabulary; with ``label_smoothing`` ``eps`` each position adds ``(1 - eps) * (-log p_label) + eps * mean_v(-log
    p_v)`` (the reference's ``LabelSmoother``)."""
    rows = labels[:, 1:] != IGNORE_INDEX
    return head_cross_entropy(hidden[:, :-1][rows], head, labels[:, 1:][rows], label_smoothing=label_smoothing)


class ConsistencyTraining(nn.Module):
    """The trainable module: the target's copy (or its LoRA model), whose ``forward`` is a batch's whole CLLM loss
    (one forward per step through the data-parallel wrapper). The artefact is the fine-tuned model, a LoRA adapter
    merged in (:meth:`artefact_model`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        """The final-normed last hidden states (the forward computes one position's logits only)."""
        return last_hidden(self.model, input_ids, attention_mask)

    def head(self, called: bool = False) -> LinearHead:
        """The model's LM head (``called``: sharded, called chunk by chunk)."""
        return LinearHead(plain_linear(self.model.get_output_embeddings(), "the tuned copy's LM head"), called=called)

    def forward(self, input_ids: torch.Tensor, input_state: torch.Tensor, input_next: torch.Tensor,
                attention_mask: torch.Tensor, labels: torch.Tensor, consistency_mask: torch.Tensor,
                consistency: str = "global", ar_weight: float = 10.0, label_smoothing: float = 0.1,
                called: bool = False) -> torch.Tensor:
        """``L_consistency + ar_weight * L_AR`` (module docstring; ``L_AR`` label-smoothed by ``label_smoothing``),
        summed."""
        fixed = self.hidden(input_ids, attention_mask)  # with gradient: the AR term
        if consistency == "global":
            teacher = fixed.detach()
        else:
            with torch.no_grad():
                teacher = self.hidden(input_next, attention_mask)
        student = self.hidden(input_state, attention_mask)
        head = self.head(called)
        return block_kl(teacher, student, head, consistency_mask) + float(ar_weight) * ar_loss(fixed, head, labels,
                                                                                                label_smoothing)

    def artefact_model(self) -> nn.Module:
        return merged_model(self.model)


def build_cllm_model(models: dict, config: CllmConfig) -> ConsistencyTraining:
    """A copy of the target (the original collects the trajectories and stays the reference), fully trainable or
    under a LoRA adapter."""
    check_plain_logits(models["target"].config, "CLLM")
    module = ConsistencyTraining(tunable_copy(models["target"], config.finetune, config.lora_r, config.lora_alpha))
    module.head()  # a plain linear LM head (LoRA leaves it out)
    return module


class CllmTrainer(FrozenTargetTrainer):
    """Consistency training of ``model`` (a :class:`ConsistencyTraining`) on the frozen target's Jacobi
    trajectories (module docstring)."""

    config_class = CllmConfig

    @classmethod
    def prepare_datasets(cls, models: dict, config: CllmConfig, train, heldout, tokenizer, training_args):
        """The Jacobi trajectories of the train and held-out prompts, collected once by the frozen target into
        ``trajectory_dir`` (resumable; the main process collects, the others wait and read), as the datasets. Under
        ZeRO-3 every process gathers the target first, so the main process collects with whole weights."""
        from draftsmith.common.models import target_identity
        from draftsmith.data.generation import eos_token_ids, pad_token_id
        from draftsmith.data.jacobi import collect_trajectories, read_trajectories

        target = models["target"]
        eos = eos_token_ids(tokenizer, target.config)
        root = Path(config.trajectory_dir) if config.trajectory_dir else Path(training_args.output_dir) / "trajectories"
        identity = target_identity(target, tokenizer)
        out = []
        # a target ZeRO-3 partitions is gathered on every process first (a collective), then the main process collects
        with whole(list(target.parameters())), training_args.main_process_first(desc="collecting Jacobi trajectories"):
            for name, dataset in (("train", train), ("heldout", heldout)):
                prompts = [row_prompt(list(r["input_ids"]), list(r["labels"]), config.prompt_tokens) for r in dataset]
                unique = {prompt_key(p): p for p in prompts}
                path = root / f"{name}.jsonl"
                if training_args.process_index == 0:
                    collect_trajectories(target, list(unique.values()), list(unique), path, target=identity,
                                         block=config.block, max_new_tokens=config.max_new_tokens,
                                         seed=training_args.seed, eos_ids=eos,
                                         batch_size=int(config.trajectory_batch_size),
                                         pad_id=pad_token_id(tokenizer, target.config),
                                         progress=not training_args.disable_tqdm)
                out.append(TrajectoryDataset(read_trajectories(path), seed=training_args.seed))
        return out[0], out[1], TrajectoryCollator(pad_token_id(tokenizer, target.config), tuple(eos))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._signature_columns = list(self._signature_columns) + list(ITEM_KEYS)  # what the collator reads

    def loss_sum(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        cfg = self.method_config
        return model(inputs["input_ids"], inputs["input_state"], inputs["input_next"], inputs["attention_mask"],
                     inputs["labels"], inputs["consistency_mask"], cfg.consistency, cfg.ar_weight,
                     cfg.ar_label_smoothing, self.sharded()), None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out loss and how often the model, from an intermediate state, already predicts the fixed point's
        token at the block positions whose context is still wrong (``state_top1``: a one-update jump)."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            total, _ = self.loss_sum(model, inputs)
            loss = total / self.count_loss_tokens(inputs).clamp(min=1).to(total.device)
            module = self.accelerator.unwrap_model(model)
            head = module.head(self.sharded())
            rows = inputs["consistency_mask"][:, 1:].bool()  # [B, T-1]
            state = module.hidden(inputs["input_state"], inputs["attention_mask"])[:, :-1][rows]  # [N, H]
            top = head_rows_map(state, head, lambda z, _, __: z.argmax(-1))  # [N]
            hit = top == inputs["labels"][:, 1:][rows]
            tuned = ar_loss(module.hidden(inputs["input_ids"], inputs["attention_mask"]), head, inputs["labels"])
            original_hidden = last_hidden(self.teacher, inputs["input_ids"], inputs["attention_mask"])
            original = ar_loss(original_hidden, LinearHead(self.teacher_module.get_output_embeddings(),
                                                           called=self.sharded()), inputs["labels"])
            n = (inputs["labels"][:, 1:] != IGNORE_INDEX).sum().float()
            self.add_eval_sums(torch.stack([hit.sum().float(), rows.sum().float(), tuned.float(), original.float(),
                                            n.to(tuned.device)]))
        return loss.detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        """``state_top1`` (above), and the AR loss per fixed-point token of the trained model and of the original
        target (``ar_loss``, ``original_ar_loss``; plain cross-entropy, no label smoothing): how far consistency
        training moved the model's own distribution."""
        n = sums[4].clamp(min=1)
        return {f"{prefix}_state_top1": float(sums[0] / sums[1].clamp(min=1)), f"{prefix}_state_positions": float(sums[1]),
                f"{prefix}_ar_loss": float(sums[2] / n), f"{prefix}_original_ar_loss": float(sums[3] / n)}


__all__ = ["CllmConfig", "CllmTrainer", "ConsistencyTraining", "TrajectoryCollator", "TrajectoryDataset",
           "ar_loss", "block_kl", "build_cllm_model", "prompt_key", "row_prompt"]
