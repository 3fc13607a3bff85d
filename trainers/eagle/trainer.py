"""EAGLE-1 (Li et al. 2024) and EAGLE-3 (Li et al. 2025): feature-level draft heads trained on the frozen target's
features.

For a training sequence ``x_0 .. x_{T-1}`` the frozen target gives its features ``f_t`` (final-normed last hidden
states) and next-token distributions ``p_{t+1} = softmax(LMHead(f_t))``; the features are computed inside the
training step (*online*: no disk). The head (:class:`draftsmith.inference.drafters.eagle.EagleHead`) reads
``[E(x_{t+1}); f_t + u]`` at position ``t`` and predicts ``f^_{t+1}``; ``u ~ U(-noise, noise)`` per element is the
paper's noise augmentation (0.1; training only), which makes the head robust to its own feature errors when it
drafts on its own outputs. Loss (EAGLE sec. 4, eqs. 2-4)::

    L_reg = sum_t mean_h SmoothL1(f^_{t+1}, f_{t+1})
    L_cls = sum_t CE(p_{t+2}, p^_{t+2}) = - sum_t sum_v p_{t+2}(v) log softmax(LMHead(f^_{t+1}))(v)
    L     = reg_weight * L_reg + cls_weight * L_cls          (the paper's weights: 1.0 and 0.1)

summed over the positions ``t`` whose token ``x_{t+2}`` is a response token, then normalised by the base trainer
over those positions of the accumulation window. The ``fc`` layer has a bias by default, as the reference's
EAGLE-1 head (``fc_bias``). The training data is the target's own answers by default (``data_mode=target``, the
shared self-distillation) — draftsmith's choice, not the paper's: EAGLE-1 trains on a fixed dataset (ShareGPT's
responses as they are) and reports low sensitivity to the training data; ``data_mode=fixed`` trains on the
dataset's responses, as the paper does. Evaluation reports the held-out top-1 agreement of the head's next token
with the target's (the acceptance proxy of the first draft step) and logs it to TensorBoard.

EAGLE-3 (``variant=eagle3``, :class:`draftsmith.inference.drafters.eagle.Eagle3Head`) fuses three target layers, drops the
feature regression and trains on tokens alone, with the target's distribution over the draft vocabulary as the
label, through the *training-time test*: the head is unrolled ``ttt_steps`` times, step ``j`` reading at anchor
``t`` the token ``x_{t+1+j}`` and its own step ``j-1`` output (step 0: ``g_t = fc(target features)``), at position
``t + j``, attending to the step-0 keys of positions ``<= t`` and to its own earlier steps at the same anchor —
exactly what decoding shows draft depth ``j + 1`` (:func:`~draftsmith.trainers.eagle.ttt.ttt_visibility`). Loss
(EAGLE-3 sec. 3; SpecForge's weights)::

    L = sum_j decay**j * sum_t m^j_t * CE(p_{t+2+j}|Vd, softmax(LMHead_d(norm(h^j_t))))
    m^j_t = [x_{t+2+j} is a response token] * t2d[argmax_v p_{t+2+j}(v)]

``p|Vd`` the target's next-token distribution restricted to the draft vocabulary and renormalised (``t2d``); the
mask ``m`` is the reference's ``position_mask = t2d[target_argmax] * loss_mask``, shifted with the labels at every
unrolled step: an anchor whose target token lies outside the draft vocabulary — which no draft could propose —
is not trained (:func:`~draftsmith.trainers.eagle.ttt.ttt_anchors`). Every step's sum is divided by the same count, the anchors of step 0 whose
``x_{t+2}`` is a response token (those outside the vocabulary included), over the accumulation window: the
reference too divides every step by one count that the vocabulary mask does not change (its ``.mean()`` over
every position of the batch, prompt and padding included; draftsmith counts the response anchors, the base
trainer's rule). The draft vocabulary is counted on the answers the head trains on (:func:`draft_vocab_counts`).
Evaluation logs the top-1 agreement at every unrolled step (``eval_step{j}_top1``, out-of-vocabulary anchors
counted as misses, as the reference's ``acc``): the acceptance proxy of draft depth ``j + 1``; and the share of
the evaluated answer tokens inside the draft vocabulary (``eval_draft_vocab_coverage``).

Memory: the target's forward returns only the hidden states the head reads (the decoder layers run through
:class:`~draftsmith.inference.core.adapter.ModelAdapter`: the features of the chosen layers and the final-normed last
hidden state, no logits; under ZeRO-3, whose sharded target only its engine runs, the engine's forward with
``logits_to_keep=1``). Every distribution over the vocabulary is computed chunk by chunk from hidden states and an LM
head (:mod:`draftsmith.trainers.losses`): ``p_{t+2}`` inside the same loop as the head's ``q`` (EAGLE-1: the soft
cross-entropy; EAGLE-3: per unrolled step, the target's LM-head rows of the draft vocabulary), and the target's argmax
behind the mask ``m`` in a chunked pass without gradient.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError
from draftsmith.common.models import lm_head_rows
from draftsmith.common.precision import first_argmax
from draftsmith.common.sharding import whole
from draftsmith.data.draft_vocab import answer_token_counts, ranked_counts
from draftsmith.data.feature_cache import features_of
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.drafters.eagle import Eagle3Head, EagleHead, aux_layers, draft_vocab
from draftsmith.inference.drafters.peagle import PEagleHead, mask_token
from draftsmith.trainers.base import FrozenTargetTrainer
from draftsmith.trainers.eagle.config import EagleConfig
from draftsmith.trainers.eagle.loss import Eagle3Training
from draftsmith.trainers.eagle.ttt import shifted, ttt_anchors
from draftsmith.trainers.losses import LinearHead, head_rows_map, head_soft_cross_entropy
from draftsmith.trainers.mixins import offline_feature_datasets

COVERAGE_WARNING = 0.97  # EAGLE-3: warn below this share of held-out answer tokens inside the draft vocabulary
logger = logging.getLogger(__name__)


def feature_layers(config: EagleConfig, target) -> tuple[int, ...]:
    """The target layers the head trains on (-1: the final-normed last hidden state, whose LM head gives the target's
    distribution)."""
    if config.variant == "eagle1":
        return (-1,)
    layers = aux_layers(int(target.config.num_hidden_layers)) if config.layers == "auto" else \
        tuple(int(x) for x in str(config.layers).split(","))
    return tuple(layers) + (-1,)


def coverage_warning(coverage: float, size: int) -> str | None:
    """The one-line warning for a draft vocabulary of ``size`` tokens holding only ``coverage`` of the held-out
    answer tokens (None at or above :data:`COVERAGE_WARNING`)."""
    if coverage >= COVERAGE_WARNING:
        return None
    return (f"the draft vocabulary ({size} tokens) holds only {coverage:.1%} of the held-out answer tokens and the "
            f"head can never draft the rest: raise draft_vocab_size")


def draft_vocab_counts(target, config: EagleConfig, train_dataset, tokenizer=None) -> torch.Tensor:  # [V] long
    """How often each target token occurs in the answers the head trains on, the counts EAGLE-3's draft vocabulary
    keeps the most frequent of (the reference counts the response tokens of its training data).

    ``data_mode=fixed``, or cached features (whose rows hold the target's answers already): the training rows'
    labelled tokens. ``data_mode=target`` online: the target's greedy answers to the first ``draft_vocab_prompts``
    training prompts, generated here once, in batches, on the process's device
    (:func:`~draftsmith.data.feature_cache.answer_rows`, the answers training regenerates); the dataset's responses
    only order the tokens those answers count alike (:func:`~draftsmith.data.draft_vocab.ranked_counts`). The
    answers are greedy, so a resumed run counts the same; its checkpoint restores ``d2t``/``t2d`` in any case."""
    vocab = lm_head_rows(target)  # the full vocabulary, also where ZeRO-3 has partitioned the LM head
    given = answer_token_counts(train_dataset, vocab)  # [V] the rows' own answers
    if config.data_mode != "target" or config.features == "offline" or not train_dataset:
        return given
    import itertools

    from accelerate import PartialState

    from draftsmith.data.feature_cache import answer_rows
    from draftsmith.data.generation import eos_token_ids, pad_token_id

    limit = int(config.draft_vocab_prompts) or len(train_dataset)
    rows = [{"input_ids": list(r["input_ids"]), "labels": list(r["labels"])}
            for r in itertools.islice(train_dataset, limit)]
    if not (getattr(target, "hf_device_map", None) or getattr(target, "is_quantized", False)):
        target = target.to(PartialState().device)  # where the trainer puts it next
    with whole(list(target.parameters())):  # a target ZeRO-3 partitions: gathered on every process meanwhile
        answers = answer_rows(target, rows, max_new_tokens=int(config.max_new_tokens),
                              prompt_tokens=int(config.prompt_tokens),
                              pad_token_id=pad_token_id(tokenizer, target.config),
                              eos_ids=eos_token_ids(tokenizer, target.config), batch_size=16)
    return ranked_counts(answer_token_counts(answers, vocab), given)


def target_features(target, input_ids: torch.Tensor, layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """``{layer: [B, T, H]}`` of a right-padded batch: the hidden states of ``layers`` (transformers' indices; -1 =
    the final-normed last hidden state) through the target's own decoder layers, and nothing else (no logits, no
    other layer): :meth:`ModelAdapter.forward` with the layers it keeps. Right padding leaves every real position's
    states those of the masked forward."""
    with torch.no_grad():
        out = ModelAdapter(target).forward(input_ids, output_hidden_states=[i for i in layers if i != -1],
                                           compute_logits=False)
    return {i: out.last_hidden if i == -1 else out.hidden_states[i] for i in layers}


def build_eagle_head(models: dict, config: EagleConfig, train_dataset=None,
                     tokenizer=None) -> EagleHead | Eagle3Training:
    """The trainable module of the recipe: a fresh head for the target (EAGLE-3, P-EAGLE: with its draft vocabulary, the
    most frequent tokens of the answers it trains on: :func:`draft_vocab_counts`), in float32 master weights
    whatever the target's dtype (:mod:`draftsmith.common.precision`)."""
    target = models["target"]
    if config.variant == "eagle1":
        return EagleHead.for_target(target, fc_bias=config.fc_bias, layer=config.head_layer).float()
    d2t, t2d = draft_vocab(draft_vocab_counts(target, config, train_dataset, tokenizer), config.draft_vocab_size)
    layers = None if config.layers == "auto" else tuple(int(x) for x in str(config.layers).split(","))
    v31 = {"fc_norm": bool(config.fc_norm), "norm_output": bool(config.norm_output),  # EAGLE-3.1's options
           "layer": config.head_layer, "norm_before_residual": bool(config.norm_before_residual)}
    if config.variant == "peagle":
        mask = int(config.mask_token_id) if int(config.mask_token_id) >= 0 else mask_token(tokenizer, target.config)
        head = PEagleHead.for_target(target, d2t, t2d, layers, mask_token_id=mask, **v31)
    else:
        head = Eagle3Head.for_target(target, d2t, t2d, layers, **v31)
    head.lm_head.weight.requires_grad_(bool(config.train_lm_head))  # frozen: the optimizer never sees it
    return Eagle3Training(head, recompute=config.ttt_recompute).float()


def supervised_positions(labels: torch.Tensor) -> torch.Tensor:  # [B, T-2] bool
    """Head positions ``t`` that are trained: those whose ``x_{t+2}`` is a labelled (response) token."""
    return labels[:, 2:] != -100


def uniform_noise(like: torch.Tensor, scale: float) -> torch.Tensor:
    """``U(-scale, scale)`` noise of ``like``'s shape and dtype."""
    return (torch.rand_like(like) * 2.0 - 1.0) * scale


def eagle_losses(pred: torch.Tensor, target_features: torch.Tensor, lm_head: LinearHead) -> tuple[torch.Tensor,
                                                                                                    torch.Tensor]:
    """Summed ``(L_reg, L_cls)`` over ``N`` positions (EAGLE eqs. 2-4): ``pred``/``target_features`` ``[N, H]``,
    ``L_cls = - sum_t sum_v p(v) log softmax(LMHead(f^))(v)`` with ``p = softmax(LMHead(f))``, both through the
    target's LM head chunk by chunk."""
    reg = F.smooth_l1_loss(pred.float(), target_features.float(), reduction="none").mean(-1).sum()
    cls = head_soft_cross_entropy(pred, lm_head, target_features, lm_head)
    return reg, cls


def top1_agreement(pred: torch.Tensor, target_features: torch.Tensor, lm_head: LinearHead) -> torch.Tensor:
    """How often ``argmax LMHead(f^) == argmax LMHead(f)`` over the ``N`` rows (without gradient, chunked)."""
    hits = head_rows_map(pred, lm_head, lambda z, _, t: (first_argmax(z) == first_argmax(t)).float(),
                         teacher_hidden=target_features, teacher=lm_head)
    return hits.sum()


class EagleTrainer(FrozenTargetTrainer):
    """Trains an :class:`EagleHead` (``model``) on the frozen target's features (module docstring)."""

    config_class = EagleConfig

    @classmethod
    def prepare_datasets(cls, models: dict, config: EagleConfig, train, heldout, tokenizer, training_args):
        """Offline features: the target's answers (``data_mode=target``) and their features, cached once
        (:mod:`draftsmith.data.feature_cache`; the main process builds, the others wait and read), as the datasets
        and collator the trainer uses. Online: unchanged."""
        if config.features != "offline":
            return train, heldout, None
        from draftsmith.data.feature_cache import FeatureCollator
        from draftsmith.data.generation import pad_token_id

        target = models["target"]
        answer = {"max_new_tokens": config.max_new_tokens, "prompt_tokens": config.prompt_tokens}
        train, heldout = offline_feature_datasets(config, target, tokenizer, (train, heldout),
                                                  cls.cached_layers(config, target), training_args,
                                                  answer if config.data_mode == "target" else None)
        return train, heldout, FeatureCollator(pad_token_id(tokenizer, target.config))

    @classmethod
    def cached_layers(cls, config, target) -> tuple[int, ...]:
        """The target layers whose outputs the trained module reads (the feature cache stores these)."""
        return feature_layers(config, target)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.vocab_coverage = None  # EAGLE-3: the share of the evaluated answer tokens a draft can propose
        self._coverage_warned = False

    def _target_outputs(self, inputs: dict[str, torch.Tensor], layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
        """``{layer: [B, T, H]}``: from the batch's cached features when it has them, else from a frozen target forward
        that keeps only those layers (:func:`target_features`; under ZeRO-3 the engine's forward, with one position's
        logits)."""
        cached = features_of(inputs)
        if self.method_config.features == "offline" and not cached:
            raise ConfigError("features=offline but the batch holds no cached features: build the trainer through the "
                              "recipe runner (EagleTrainer.prepare_datasets), or train with features=online")
        if cached:
            dtype = self.teacher_module.get_output_embeddings().weight.dtype
            return {i: cached[i].to(dtype) for i in layers}
        if self._zero_stage() == 3:  # the sharded target runs only as its engine
            with torch.no_grad():
                out = self.teacher(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                   output_hidden_states=True, logits_to_keep=1)
            return {i: out.hidden_states[i] for i in layers}
        return target_features(self.teacher_module, inputs["input_ids"], layers)

    def prepare_training_batch(self, model, inputs):
        if features_of(inputs):  # cached rows already hold the target's answers
            return inputs
        return self.answers_batch(inputs)

    def count_loss_tokens(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The positions ``t`` whose ``x_{t+2}`` is a response token (EAGLE-3: step 0's labelled anchors, those outside
        the draft vocabulary included, the one count every unrolled step is divided by)."""
        return supervised_positions(inputs["labels"]).sum()

    def _head_outputs(self, model, inputs: dict[str, torch.Tensor], noise: float):
        """``(f^ [B, T-1, H], target features [B, T, H])``."""
        features = self._target_outputs(inputs, (-1,))[-1]  # [B, T, H]
        ids = inputs["input_ids"]
        with torch.no_grad():
            embeds = self.teacher_module.get_input_embeddings()(ids[:, 1:])  # [B, T-1, H]  E(x_{t+1})
        inp = features[:, :-1]
        if noise > 0:
            inp = inp + uniform_noise(inp, noise)
        t = inp.shape[1]
        pos = torch.arange(t, device=ids.device)[None].expand(ids.shape[0], t)
        pred = model(embeds, inp, pos, key_padding=inputs["attention_mask"][:, 1:])  # [B, T-1, H]
        return pred, features

    def _terms(self, model, inputs, noise: float, agreement: bool = False):
        """``(L_reg, L_cls, top-1 agreements or None, supervised positions)`` summed over the batch."""
        pred, features = self._head_outputs(model, inputs, noise)
        keep = supervised_positions(inputs["labels"])  # [B, T-2]
        lm_head = LinearHead(self.teacher_module.get_output_embeddings(), called=self.sharded())
        pred_rows = pred[:, :-1][keep]  # [N, H]: f^_{t+1} for t = 0 .. T-3
        target_rows = features[:, 1:-1][keep]  # [N, H]: f_{t+1}, whose LM head gives p_{t+2}
        reg, cls = eagle_losses(pred_rows, target_rows, lm_head)
        agree = top1_agreement(pred_rows.detach(), target_rows, lm_head) if agreement else None
        return reg, cls, agree, keep.sum().float()

    def _ttt(self, model, inputs: dict[str, torch.Tensor],
             top1: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """EAGLE-3's unrolled steps: ``(weighted loss sum, [K] per-step CE sums, [K, 2] top-1 hits and labelled
        anchors when top1)``; the loss over the anchors whose target token the draft vocabulary holds (module
        docstring)."""
        cfg = self.method_config
        unrolled = self.accelerator.unwrap_model(model)
        if not isinstance(unrolled, Eagle3Training):
            raise ConfigError(f"EAGLE-3 trains an Eagle3Training module (build_eagle_head builds it), not a "
                              f"{type(unrolled).__name__}")
        ids, labels = inputs["input_ids"], inputs["labels"]
        t = ids.shape[1]
        steps = max(1, min(int(cfg.ttt_steps), t - 2))  # unrolled steps with a label (anchors 0 .. T-2)
        layers = tuple(unrolled.hidden_layers)
        feats = self._target_outputs(inputs, layers + (-1,))
        target_head = self.teacher_module.get_output_embeddings()
        with torch.no_grad():
            features = torch.cat([feats[i][:, :-1] for i in layers], dim=-1)  # [B, A, 3Ht]
            embed = self.teacher_module.get_input_embeddings()
            step_embeds = torch.stack([embed(shifted(ids[:, 1:], j)) for j in range(steps)])  # [K, B, A, H]
            if isinstance(unrolled.head, PEagleHead):  # P-EAGLE: depths 1.. read the mask token
                mask = torch.full_like(ids[:1, :1], unrolled.head.mask_token_id)  # [1, 1]
                step_embeds[1:] = embed(mask)
            following = feats[-1][:, 1:]  # [B, A, Ht]: the target's state at t+1, whose LM head gives p_{t+2}
            label_top1 = head_rows_map(following.reshape(-1, following.shape[-1]), LinearHead(target_head),
                                       lambda z, _, __: first_argmax(z)).view(following.shape[:2])  # [B, A], any token
            draftable = unrolled.t2d[label_top1]  # [B, A]: the target's next token inside the draft vocabulary
            labelled = torch.stack([ttt_anchors(labels, j) for j in range(steps)])  # [K, B, A]
            keep = torch.stack([ttt_anchors(labels, j, draftable) for j in range(steps)])  # [K, B, A] position_mask
        total, ce_sums, tops = model(features, step_embeds, keep, following, target_head, cfg.step_weights(steps),
                                     self.sharded(), top1, cfg.token_loss)
        if not top1:
            return total, ce_sums, None
        hits = [torch.stack([(top == shifted(label_top1, j)[keep[j]]).sum().float(), labelled[j].sum().float()])
                for j, top in enumerate(tops)]  # out-of-vocabulary anchors: never trained, counted as misses
        return total, ce_sums, torch.stack(hits)

    def loss_sum(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """EAGLE-1: ``reg_weight * L_reg + cls_weight * L_cls`` summed over the supervised positions; EAGLE-3: the
        unrolled token loss (module docstring)."""
        cfg = self.method_config
        if cfg.unrolled:
            return self._ttt(model, inputs)[0], None
        reg, cls, _, _ = self._terms(model, inputs, float(cfg.noise) if model.training else 0.0)
        return cfg.reg_weight * reg + cfg.cls_weight * cls, None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Held-out loss, and the sums behind the regression, cross-entropy and top-1 agreement metrics."""
        inputs = self._prepare_inputs(inputs)
        if self.method_config.data_mode == "target":
            inputs = self.prepare_training_batch(model, inputs)
        cfg = self.method_config
        if cfg.unrolled:
            with torch.no_grad():
                total, ce, hits = self._ttt(model, inputs, top1=True)
                steps = int(cfg.ttt_steps)
                row = torch.zeros(3, steps, device=total.device)  # per step: CE sum, top-1 hits, labelled anchors
                row[0, : ce.numel()], row[1, : ce.numel()], row[2, : ce.numel()] = ce, hits[:, 0], hits[:, 1]
                answer = inputs["labels"][inputs["labels"] != -100]  # [n] the evaluated answer tokens
                t2d = self.accelerator.unwrap_model(model).t2d
                inside = torch.tensor([int(t2d[answer.to(t2d.device)].sum()), answer.numel()], dtype=torch.float32)
                self.add_eval_sums(torch.cat([row.flatten(), inside.to(row.device)]))
                return (total / self.count_loss_tokens(inputs).clamp(min=1).to(total.device)).detach(), None, None
        with torch.no_grad():
            reg, cls, agree, n = self._terms(model, inputs, 0.0, agreement=True)
            loss = (cfg.reg_weight * reg + cfg.cls_weight * cls) / n.clamp(min=1)
            self.add_eval_sums(torch.stack([reg, cls, agree, n]))
        return loss.detach(), None, None

    def eval_metrics(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        if self.method_config.unrolled:  # [3K + 2]: CE sums, hits, anchors per step; answer tokens inside
            steps = int(self.method_config.ttt_steps)
            per_step, (inside, answers) = sums[: 3 * steps].view(3, steps), sums[3 * steps:].tolist()
            n = per_step[2].clamp(min=1)
            self.top1 = float(per_step[1, 0] / n[0])
            metrics = {f"{prefix}_step{j}_top1": float(per_step[1, j] / n[j]) for j in range(steps)}
            if answers > 0:
                self.vocab_coverage = inside / answers
                metrics[f"{prefix}_draft_vocab_coverage"] = self.vocab_coverage
                self._warn_coverage(self.vocab_coverage)
            metrics.update({f"{prefix}_step{j}_ce": float(per_step[0, j] / n[j]) for j in range(steps)})
            return metrics | {f"{prefix}_top1": self.top1}
        n = float(sums[3].clamp(min=1))
        self.top1 = float(sums[2]) / n
        return {f"{prefix}_reg": float(sums[0]) / n, f"{prefix}_cls": float(sums[1]) / n, f"{prefix}_top1": self.top1}

    def _warn_coverage(self, coverage: float) -> None:
        """Log :func:`coverage_warning` once, at the first evaluation that falls short."""
        message = coverage_warning(coverage, int(self.accelerator.unwrap_model(self.model).t2d.sum()))
        if message and not self._coverage_warned:
            logger.warning(message)
            self._coverage_warned = True

    def manifest_training(self) -> dict[str, Any]:
        out = {"head_top1": self.top1} if getattr(self, "top1", None) is not None else {}
        if self.vocab_coverage is not None:  # EAGLE-3: held-out answer tokens it can draft
            out["draft_vocab_heldout_coverage"] = self.vocab_coverage
        return out


__all__ = ["EagleConfig", "EagleTrainer", "build_eagle_head", "coverage_warning", "draft_vocab_counts",
           "eagle_losses", "feature_layers", "supervised_positions", "target_features", "top1_agreement",
           "uniform_noise"]
