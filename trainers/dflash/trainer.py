"""DFlash (Chen et al. 2026): a block-diffusion draft trained to fill a block of mask tokens in one forward,
conditioned on the frozen target's hidden states (the draft: :mod:`draftsmith.inference.drafters.dflash`).

For a training sequence ``x_0 .. x_{T-1}`` (the target's own answers by default: ``data_mode=target``, as the
reference regenerates its data with the target) the frozen target gives the hidden states of the chosen layers at
every position (online, or from the feature cache). ``anchors`` positions ``a`` are drawn at random per sequence
(distinct, each followed by an answer token: the answer's tokens but its last, and the last prompt token, from which
draftsmith's loop drafts an answer's first block; the reference anchors on answer tokens, ``loss_mask[a] = 1``); each makes one
block ``[x_a, MASK x (B-1)]`` at positions ``a .. a+B-1`` that sees the context of positions ``s < a`` and the whole
of its own block (bidirectional), nothing of the other blocks: exactly what decoding shows the draft when ``x_a`` is
the pending token. Every block of a batch runs in one draft forward. Loss (DFlash sec. 3, eq. 4: same-position
labels, the anchor slot excluded, later slots decayed)::

    L = sum_blocks sum_{k=1}^{B-1} w_k * m_{a,k} * CE(x_{a+k}, softmax(LMHead(h^_{a,k})))
    w_k = exp(-(k-1) / gamma)            (gamma: 7 for B = 16, 5 for B = 10, 4 for B = 8; 0 = no decay)

With ``loss_weighting=dpace`` (D-PACE, arXiv:2605.18810, eqs. 7-9; Model-Optimizer's DFlash default) the slot
weights come from the draft's own confidence instead of the decay, per block and detached::

    c_k = alpha + (1 - alpha) * q(x_{a+k})    (the draft's probability of the label; 1 where m_{a,k} = 0)
    C_k = m_{a,k} * prod_{i <= k} c_i          w_k = sum_{j >= k} C_j

(``w_k`` is the expected number of slots accepted from ``k`` on when slot ``i`` passes with ``c_i``), normalised to a
mean of 1 over the batch's trained slots, which makes the loss the reference's ``sum w CE / sum w``.

``m_{a,k}`` is 1 where ``x_{a+k}`` exists and is an answer token; ``LMHead`` is the target's, frozen and shared (only
``fc``, the norms and the draft layers train). The sum is divided by the trained slots of the accumulation window
(the base trainer's count; the reference divides by ``sum w``, a constant factor away for a fixed block size).
Evaluation draws its anchors with a fixed seed and reports each slot's top-1 agreement (``eval_slot{k}_top1``) and
the mean accepted length of a greedy block over the blocks whose slots are all labelled (``eval_block_tau`` =
``1 +`` the leading run of agreeing slots: the paper's acceptance length, the predicted tau).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from draftsmith.common.errors import ConfigError
from draftsmith.common.precision import first_argmax
from draftsmith.inference.drafters.dflash import DFlashDraft, block_visibility, dflash_layers
from draftsmith.inference.drafters.peagle import mask_token
from draftsmith.kernels.cross_entropy import cross_entropy_rows
from draftsmith.trainers.eagle.trainer import EagleTrainer
from draftsmith.trainers.losses import LinearHead, head_cross_entropy, head_rows_map, head_weighted_cross_entropy
from draftsmith.trainers.mixins import FeatureCache, SeededBatches, TargetAnswers
from draftsmith.trainers.mixins import help_text as _help

IGNORE = -100
EVAL_SEED = 0  # evaluation draws the same anchors for the same held-out batch every time


PAPER_GAMMA = ((8, 4.0), (10, 5.0), (16, 7.0))  # (block size, gamma) the paper trains with (eq. 4)


def paper_gamma(block_size: int) -> float:
    """The paper's decay for ``block_size``: its three pairs, linear between them and along the nearest segment beyond."""
    (b0, g0), (b1, g1) = PAPER_GAMMA[:2] if block_size <= PAPER_GAMMA[1][0] else PAPER_GAMMA[1:]
    return max(1.0, g0 + (g1 - g0) * (block_size - b0) / (b1 - b0))


@dataclass
class DFlashConfig(TargetAnswers, FeatureCache):
    """DFlash settings (recipe flags; ``method.KEY`` on clashes with TrainingArguments)."""

    draft_layers: int = field(default=1, metadata=_help("Decoder layers of the draft (the reference's command line: "
                                                        "1; its released drafts: 5)."))
    layers: str = field(default="auto", metadata=_help("The target layers the draft reads (hidden-state indices, "
                                                       "comma-separated), or auto: one per draft layer, spread over "
                                                       "the outputs of layers 1 .. L-3 as the reference picks them."))
    block_size: int = field(default=8, metadata=_help("Tokens per block: the pending token and block_size-1 masks, "
                                                      "the draft tokens of one step (the paper: 16; Model-Optimizer: "
                                                      "8)."))
    anchors: int = field(default=16, metadata=_help("Blocks drawn per training sequence (the reference: up to 512 per "
                                                    "3,072 tokens)."))
    loss_gamma: float = field(default=-1.0, metadata=_help("Slot k's loss weight exp(-(k-1)/gamma) (the paper's eq. 4); "
                                                           "-1 = the paper's for the block size (7 for blocks of 16, 5 "
                                                           "for 10, 4 for 8, linear between and beyond); 0 = every "
                                                           "slot alike."))
    loss_weighting: str = field(default="dpace", metadata=_help("Slot weights: dpace = D-PACE's, from the draft's own "
                                                                "confidence in each slot and the slots before it "
                                                                "(module docstring; above the paper's decay on the dev "
                                                                "questions in vLLM and on 10 of the broad set's 12 "
                                                                "categories: docs/BENCHMARKS.md); decay = "
                                                                "exp(-(k-1)/loss_gamma) (the paper's eq. 4)."))
    dpace_alpha: float = field(default=0.5, metadata=_help("loss_weighting=dpace: the confidence floor alpha in "
                                                           "alpha + (1 - alpha) q, in (0, 1] (the reference's 0.5)."))
    prompt_anchor: bool = field(default=True, metadata=_help("Anchor blocks on the last prompt token too (draftsmith's "
                                                             "loop drafts an answer's first block from it); false = "
                                                             "on answer tokens only, as the reference and as vLLM "
                                                             "drafts (its first answer token comes from the prefill)."))
    mask_token_id: int = field(default=-1, metadata=_help("The mask token; -1 = the tokenizer's mask token, else its "
                                                          "pad, unknown or end-of-sequence token."))
    draft_length: int = field(default=0, metadata=_help("Evaluation: tokens drafted per step, the block's first N "
                                                        "masks; 0 = block_size-1."))

    def __post_init__(self) -> None:
        self.check_features()
        self.check_answers()
        if int(self.draft_layers) < 1 or int(self.anchors) < 1 or int(self.block_size) < 2:
            raise ConfigError("draft_layers and anchors must be >= 1 and block_size >= 2")
        if self.loss_weighting not in ("decay", "dpace") or not 0.0 < float(self.dpace_alpha) <= 1.0:
            raise ConfigError(f"loss_weighting={self.loss_weighting!r}, dpace_alpha={self.dpace_alpha}: choose decay "
                              "or dpace, and dpace_alpha in (0, 1]")
        if float(self.loss_gamma) < 0 and float(self.loss_gamma) != -1:
            raise ConfigError(f"loss_gamma={self.loss_gamma} must be >= 0 (0 = no decay), or -1 (the paper's for the "
                              "block size)")
        if not 0 <= int(self.draft_length) <= self.block_drafts():
            raise ConfigError(f"draft_length={self.draft_length}: a block of {self.block_size} drafts 1 to "
                              f"{self.block_drafts()} tokens (0 = all of them)")
        if self.layers != "auto":
            try:
                [int(x) for x in str(self.layers).split(",")]
            except ValueError:
                raise ConfigError(f"layers={self.layers!r}: give auto or comma-separated hidden-state indices") from None

    def target_layers(self, target) -> tuple[int, ...]:
        if self.layers == "auto":
            return dflash_layers(int(target.config.num_hidden_layers), int(self.draft_layers))
        return tuple(int(x) for x in str(self.layers).split(","))

    def gamma(self) -> float:
        """``loss_gamma``, or with -1 the paper's for ``block_size`` (:func:`paper_gamma`)."""
        return paper_gamma(int(self.block_size)) if float(self.loss_gamma) == -1 else float(self.loss_gamma)

    def slot_weights(self) -> list[float]:
        """``w_k`` for slots ``k = 1 .. B-1`` (eq. 4)."""
        g = self.gamma()
        return [math.exp(-(k - 1) / g) if g > 0 else 1.0 for k in range(1, int(self.block_size))]

    def block_drafts(self) -> int:
        """The tokens one block drafts: its masks, ``block_size - 1``."""
        return int(self.block_size) - 1

    def proposer_settings(self) -> dict[str, Any]:
        return {"draft_length": int(self.draft_length) or self.block_drafts()}


class DFlashTraining(nn.Module):
    """The trainable module: the draft, whose ``forward`` runs every block of a batch (one forward per training step,
    as data-parallel wrappers require). The artefact keeps the draft's own tensors."""

    def __init__(self, draft: DFlashDraft) -> None:
        super().__init__()
        self.draft = draft

    def forward(self, features: dict[int, torch.Tensor], embeds: torch.Tensor, positions: torch.Tensor,
                visible: torch.Tensor) -> torch.Tensor:
        """``features`` ``{layer: [B, T, Ht]}``, the blocks' ``embeds`` ``[B, Q, H]`` at ``positions`` ``[B, Q]``,
        ``visible`` ``[B, Q, T + Q]`` -> the draft's normed states ``[B, Q, H]``."""
        context = self.draft.context(features)  # [B, T, H]
        t = context.shape[1]
        pos = torch.arange(t, device=context.device)[None].expand(context.shape[0], t)
        return self.draft(embeds, positions, self.draft.context_keys(context, pos), visible)

    def artefact_config(self) -> dict:
        return self.draft.artefact_config()

    @staticmethod
    def artefact_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.removeprefix("draft."): v for k, v in state_dict.items() if k.startswith("draft.")}


def build_dflash(models: dict, config: DFlashConfig, tokenizer=None) -> DFlashTraining:
    """A fresh draft for the target, in float32 master weights (shapes from the target's config alone, so it builds
    under ``zero.Init`` too)."""
    target = models["target"]
    mask = int(config.mask_token_id) if int(config.mask_token_id) >= 0 else mask_token(tokenizer, target.config)
    draft = DFlashDraft.for_target(target, int(config.draft_layers), config.target_layers(target),
                                   int(config.block_size), mask)
    return DFlashTraining(draft).float()


def dpace_weights(probs: torch.Tensor, labelled: torch.Tensor, alpha: float) -> torch.Tensor:  # [..., K] -> same
    """D-PACE's slot weights (arXiv:2605.18810, eqs. 7-9; module docstring) from the draft's probabilities of the
    labels ``probs`` and which slots are ``labelled``, per block along the last dim: ``c = alpha + (1 - alpha) q``
    (1 where unlabelled), ``C_k = m_k prod_{i <= k} c_i``, ``w_k = sum_{j >= k} C_j``; then scaled to a mean of 1
    over the labelled slots (0 elsewhere). Constants: no gradient."""
    with torch.no_grad():
        m = labelled.to(torch.float32)
        c = torch.where(labelled, alpha + (1.0 - alpha) * probs.float(), torch.ones_like(m))
        run = m * c.cumprod(-1)  # C_k
        w = run.flip(-1).cumsum(-1).flip(-1) * m  # suffix sums, labelled slots only
        return w * (m.sum() / w.sum().clamp_min(1e-12))


def sample_anchors(labels: torch.Tensor, count: int, generator: torch.Generator | None = None,
                   prompt_anchor: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` distinct anchors per row of ``labels`` ``[B, T]``, ascending: positions ``a >= 1`` whose next
    token is an answer token -> ``(anchors [B, N], valid [B, N])``, ``N = min(count, T)`` (rows with fewer candidates:
    the rest invalid, at position 0). The last prompt token is one (``prompt_anchor``): draftsmith's loop drafts its
    first block from it (the pending token after the prefill); the reference anchors on answer tokens only
    (``prompt_anchor=False``), as vLLM takes the first answer token from the prefill without a draft."""
    b, t = labels.shape
    pos = torch.arange(t, device=labels.device)
    following = torch.cat([labels[:, 1:], labels.new_full((b, 1), IGNORE)], dim=1)  # [B, T] label of x_{a+1}
    candidate = (following != IGNORE) & (pos >= 1)  # [B, T]
    if not prompt_anchor:  # the anchor token itself an answer token
        candidate &= labels != IGNORE
    noise = torch.rand(b, t, generator=generator, device="cpu" if generator is not None else None).to(labels.device)
    score = torch.where(candidate, noise, torch.full_like(noise, -1.0))
    top = score.topk(min(int(count), t), dim=1)
    valid = top.values >= 0
    anchors = torch.where(valid, top.indices, torch.zeros_like(top.indices))
    order = torch.where(valid, anchors, torch.full_like(anchors, t)).argsort(dim=1)  # valid ones first, ascending
    return anchors.gather(1, order), valid.gather(1, order)


def block_inputs(input_ids: torch.Tensor, labels: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                 block: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids [B, N, blk], positions [B, N, blk], targets [B, N, blk])``: each block's tokens ``[x_a, MASK...]``, its
    positions ``a .. a+blk-1`` and its slots' labels ``x_{a+k}`` (``IGNORE`` at the anchor slot, past the sequence,
    on non-answer tokens and in invalid blocks)."""
    t = input_ids.shape[1]
    offsets = torch.arange(block, device=anchors.device)
    positions = anchors[..., None] + offsets  # [B, N, blk]
    inside = (positions < t) & valid[..., None]
    at = positions.clamp(max=t - 1).flatten(1)  # [B, N*blk]
    targets = labels.gather(1, at).view_as(positions).masked_fill(~inside, IGNORE)
    targets[..., 0] = IGNORE  # the anchor slot is the pending token, not a draft
    ids = torch.full_like(positions, int(mask_id))
    ids[..., 0] = input_ids.gather(1, anchors)
    return ids, positions, targets


class DFlashTrainer(SeededBatches, EagleTrainer):
    """Trains a :class:`DFlashTraining` draft on the frozen target's hidden states (module docstring); the features
    (online or cached) and the target's answers as :class:`~draftsmith.trainers.eagle.trainer.EagleTrainer` gets them."""

    config_class = DFlashConfig

    @classmethod
    def cached_layers(cls, config: DFlashConfig, target) -> tuple[int, ...]:
        return tuple(config.target_layers(target))

    def _draft(self, model) -> DFlashDraft:
        return self.accelerator.unwrap_model(model).draft

    def prepare_training_batch(self, model, inputs, generator: torch.Generator | None = None):
        """The target's answers (unless cached), then the batch's anchors, drawn once (the loss and the count of its
        slots read the same ones). In training they are drawn from the micro-batch's own generator
        (:class:`~draftsmith.trainers.mixins.SeededBatches`): a resumed run draws exactly the anchors the
        uninterrupted one drew."""
        inputs = super().prepare_training_batch(model, inputs)
        cfg = self.method_config
        generator = self.batch_generator() if generator is None else generator
        anchors, valid = sample_anchors(inputs["labels"], int(cfg.anchors), generator, bool(cfg.prompt_anchor))
        ids, positions, targets = block_inputs(inputs["input_ids"], inputs["labels"], anchors, valid,
                                               int(cfg.block_size), self._draft(model).mask_token_id)
        return inputs | {"block_anchors": anchors, "block_valid": valid, "block_ids": ids, "block_positions": positions,
                         "block_targets": targets}

    def count_loss_tokens(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return (inputs["block_targets"] != IGNORE).sum()

    def _block_states(self, model, inputs) -> torch.Tensor:  # -> [B, N, blk, H]
        draft = self._draft(model)
        layers = tuple(draft.hidden_layers)
        feats = self._target_outputs(inputs, layers)
        ids, positions = inputs["block_ids"], inputs["block_positions"]  # [B, N, blk]
        b, n, blk = ids.shape
        with torch.no_grad():
            embeds = self.teacher_module.get_input_embeddings()(ids.flatten(1))  # [B, Q, H], frozen
        visible = block_visibility(inputs["block_anchors"], inputs["block_valid"], inputs["input_ids"].shape[1], blk)
        states = model(feats, embeds, positions.flatten(1), visible)  # [B, Q, H]
        return states.view(b, n, blk, -1)

    def loss_sum(self, model, inputs) -> tuple[torch.Tensor, Any]:
        return self._slots_loss(self._block_states(model, inputs), inputs["block_targets"]), None

    def _slots_loss(self, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``sum_k w_k sum_blocks CE_k`` over the trained slots (module docstring): ``states`` ``[B, N, blk, H]``,
        ``targets`` ``[B, N, blk]``; D-PACE's weights per block and slot with ``loss_weighting=dpace``."""
        cfg = self.method_config
        head = LinearHead(self.teacher_module.get_output_embeddings(), called=self.sharded())
        total = states.new_zeros((), dtype=torch.float32)
        if cfg.loss_weighting == "dpace":
            weights = dpace_weights(self._label_probs(states, targets, head), targets[..., 1:] != IGNORE,
                                    float(cfg.dpace_alpha))  # [B, N, blk-1]
            for k in range(1, targets.shape[-1]):
                keep = targets[:, :, k] != IGNORE
                total = total + head_weighted_cross_entropy(states[:, :, k][keep], head, targets[:, :, k][keep],
                                                            weights[:, :, k - 1][keep])
            return total
        for k, w in enumerate(cfg.slot_weights(), start=1):
            keep = targets[:, :, k] != IGNORE
            total = total + w * head_cross_entropy(states[:, :, k][keep], head, targets[:, :, k][keep])
        return total

    @staticmethod
    def _label_probs(states: torch.Tensor, targets: torch.Tensor, head: LinearHead) -> torch.Tensor:
        """``q(x_{a+k})`` ``[B, N, blk-1]``, the draft's probability of each slot's label (0 where unlabelled), no
        gradient."""
        probs = torch.zeros(targets[..., 1:].shape, dtype=torch.float32, device=targets.device)
        for k in range(1, targets.shape[-1]):
            keep = targets[:, :, k] != IGNORE
            logq = head_rows_map(states[:, :, k][keep].detach(), head, lambda z, y, _: -cross_entropy_rows(z, y),
                                 labels=targets[:, :, k][keep])
            probs[:, :, k - 1][keep] = logq.to(probs.device).exp()
        return probs

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out loss with anchors drawn by a fixed seed, and per slot the top-1 hits, the trained slots, and the
        accepted length of the fully labelled blocks."""
        inputs = self._prepare_inputs(inputs)
        inputs = self.prepare_training_batch(model, inputs, torch.Generator().manual_seed(EVAL_SEED))
        with torch.no_grad():
            states, targets = self._block_states(model, inputs), inputs["block_targets"]
            total = self._slots_loss(states, targets)
            head = LinearHead(self.teacher_module.get_output_embeddings(), called=self.sharded())
            slots = targets.shape[-1] - 1
            hits = torch.zeros(targets.shape[:2] + (slots,), dtype=torch.bool, device=targets.device)  # [B, N, K]
            for k in range(1, slots + 1):
                keep = targets[:, :, k] != IGNORE
                top = head_rows_map(states[:, :, k][keep], head, lambda z, _, __: first_argmax(z))
                hits[:, :, k - 1][keep] = top.to(targets.device) == targets[:, :, k][keep]
            labelled = targets[..., 1:] != IGNORE  # [B, N, K]
            full = labelled.all(-1)  # blocks whose every slot has a label
            accepted = hits.long().cumprod(-1).sum(-1)[full]  # [F] leading agreeing slots
            sums = torch.cat([hits.sum((0, 1)).float(), labelled.sum((0, 1)).float(),
                              torch.stack([accepted.sum().float(), full.sum().float()])])
            self.add_eval_sums(sums)
        return (total / self.count_loss_tokens(inputs).clamp(min=1).to(total.device)).detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        slots = (sums.numel() - 2) // 2
        hits, labelled, (accepted, blocks) = sums[:slots], sums[slots: 2 * slots], sums[2 * slots:].tolist()
        rates = (hits / labelled.clamp(min=1)).tolist()
        self.top1 = rates[0]
        self.block_tau = 1.0 + accepted / max(1.0, blocks)
        metrics = {f"{prefix}_slot{k + 1}_top1": r for k, r in enumerate(rates)}
        return metrics | {f"{prefix}_top1": self.top1, f"{prefix}_block_tau": self.block_tau}

    def manifest_training(self) -> dict[str, Any]:
        if getattr(self, "top1", None) is None:
            return {}
        return {"slot1_top1": self.top1, "predicted_tau": self.block_tau}


__all__ = ["DFlashConfig", "DFlashTrainer", "DFlashTraining", "block_inputs", "build_dflash", "dpace_weights",
           "sample_anchors"]
