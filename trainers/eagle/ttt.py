"""EAGLE-3's training-time test (Li et al. 2025, sec. 3): the head unrolled over its own outputs in one forward, and
which anchors each unrolled step sees and is trained on. The loss and the trainer: :mod:`draftsmith.trainers.eagle.trainer`."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftsmith.inference.drafters.eagle import Eagle3Head
from draftsmith.inference.drafters.peagle import PEagleHead


class Eagle3TTT(nn.Module):
    """EAGLE-3's trainable module: the head, whose ``forward`` runs the whole unrolled training-time test (one
    forward per training step, as data-parallel wrappers require). The artefact keeps the head's own tensors.
    ``recompute``: each unrolled step's activations are recomputed in the backward (:func:`unrolled_states`)."""

    def __init__(self, head: Eagle3Head, recompute: bool = True) -> None:
        super().__init__()
        self.head = head
        self.recompute = bool(recompute)

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.head.hidden_layers

    @property
    def t2d(self) -> torch.Tensor:
        return self.head.t2d

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.to_target(ids)

    def forward(self, features: torch.Tensor, step_embeds: torch.Tensor,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """``features`` ``[B, A, 3Ht]`` (the target's three layers at anchors ``0 .. A-1``), ``step_embeds``
        ``[K, B, A, H]`` (``E(x_{t+1+j})`` for step ``j``) -> draft logits ``[K, B, A, Vd]``; with ``keep``
        ``[K, B, A]`` bool (the anchors each step is trained on), only those: ``[sum_j keep[j].sum(), Vd]``, step by
        step (the draft LM head skips the unlabelled anchors, most of a prompt)."""
        logits = []
        start = 0 if keep is None else ttt_start(keep)
        for j, hidden in enumerate(unrolled_states(self.head, features, step_embeds, self.recompute, start)):
            logits.append(self.head.draft_logits(hidden if keep is None else hidden[kept(keep, j, start)]))
        return torch.stack(logits) if keep is None else torch.cat(logits)

    def artefact_config(self) -> dict:
        return self.head.artefact_config()

    @staticmethod
    def artefact_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.removeprefix("head."): v for k, v in state_dict.items() if k.startswith("head.")}


def unrolled_states(head: Eagle3Head, features: torch.Tensor, step_embeds: torch.Tensor, recompute: bool = False,
                    start: int = 0) -> Iterator[torch.Tensor]:  # yields [B, A, H], then [B, A - start, H] per step
    """The training-time test's head outputs ``h^j`` (pre-norm), step by step: ``features`` ``[B, A, 3Ht]`` fused
    by ``fc`` into ``g``, then step ``j`` reads ``step_embeds[j]`` ``[B, A, H]`` and its step ``j-1`` output at
    positions ``t + j``, seeing what decoding shows draft depth ``j + 1`` (:func:`ttt_visibility`).

    A P-EAGLE head (:class:`~draftsmith.inference.drafters.peagle.PEagleHead`) drafts depth ``j > 0`` from
    placeholders instead: ``step_embeds[j]`` holds the mask token's embedding and the step reads ``fc(mask_hidden)`` in
    place of step ``j-1``'s output; the visibility and positions are the same (the reference's parallel-drafting mask:
    the true prefix up to the anchor, and the anchor's own shallower depths).

    ``recompute`` (with gradients on): each step runs under activation checkpointing, so the forward keeps only a
    step's output and its new keys and values, and the backward recomputes one step at a time — every step's
    activations (its ``A x A`` scores among them, :func:`ttt_attention`) are otherwise held at once. The gradients
    are the same; it costs a third more head compute, worth it where those activations do not fit (long rows, wide
    heads), not at SmolLM2's or the tiny zoo's shapes.

    ``start``: steps ``j >= 1`` run at anchors ``start .. A-1`` only (:func:`ttt_start`: the first anchor any of them
    trains on, after the batch's shortest prompt). Their queries and keys at earlier anchors reach no trained anchor
    (a later step's key is seen at its own anchor alone), while step 0 keeps every anchor, the keys of the true prefix.
    The trained rows' values and gradients are the same."""
    steps, b, a = step_embeds.shape[:3]
    hidden = head.fuse_concat(features)  # [B, A, H]: g
    placeholder = head.mask_state().expand(b, a, -1) if isinstance(head, PEagleHead) else None  # P-EAGLE: [B, A, H]
    past: list[torch.Tensor] = []  # keys, values of steps 0 .. j-1, [B, KV, A, D] each
    run = partial(checkpoint, partial(_unrolled_step, head), use_reentrant=False) \
        if recompute and torch.is_grad_enabled() else partial(_unrolled_step, head)
    for j in range(steps):
        crop = start if j > 0 else 0  # anchors crop .. A-1
        pos = (torch.arange(crop, a, device=features.device) + j)[None].expand(b, a - crop)  # [B, A - crop]
        if placeholder is not None and j > 0:  # P-EAGLE: every later depth reads the shared placeholder state
            hidden = placeholder[:, crop:]
        elif j == 1:
            hidden = hidden[:, crop:]
        hidden, key, value = run(step_embeds[j][:, crop:], hidden, pos, crop, *past)
        past += [key, value]
        yield hidden


def _unrolled_step(head: Eagle3Head, embeds: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, start: int,
                   *past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One unrolled step of the head's layer as a function of its inputs (so it can be recomputed): ``embeds``,
    ``hidden`` ``[B, A', H]`` and ``pos`` ``[B, A']`` at anchors ``start .. A-1`` (``A' = A - start``), ``past`` the
    earlier steps' keys and values (step 0's ``[B, KV, A, D]``, then ``[B, KV, A', D]``, alternating) ->
    ``(h^j [B, A', H], keys [B, KV, A', D], values [B, KV, A', D])`` of this step. The same layer as
    :meth:`Eagle3Head.forward` under :func:`ttt_visibility`, with the attention computed as :func:`ttt_attention`."""
    layer = head.midlayer
    attn = layer.self_attn
    b, a, _ = hidden.shape
    x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)  # [B, A, 2H]
    q, k, v = (proj(x).view(b, a, -1, attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    if hasattr(attn, "q_norm"):  # Qwen3 and OLMo2 layers normalise each head's query and key before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    cos, sin = head.rotary(hidden, pos)  # [B, A, D] each
    q, k = (rotated(t.transpose(1, 2), cos, sin) for t in (q, k))  # [B, N, A, D], [B, KV, A, D]
    v = v.transpose(1, 2)
    out = ttt_attention(q, [*past[0::2], k], [*past[1::2], v], float(attn.scaling), start=start)  # [B, N, A', D]
    h = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, a, -1))
    return head.fed_back(h + layer.mlp(layer.post_attention_layernorm(h))), k, v


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [B, N, A, D] -> same
    """RoPE (Su et al. 2021, eq. 34 in the half-split layout of Llama's checkpoints): ``x cos + rotate_half(x) sin``
    with ``cos``, ``sin`` ``[B, A, D]``."""
    half = x.shape[-1] // 2
    return x * cos[:, None] + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin[:, None]


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], scale: float,
                  masked: bool | None = None, start: int = 0) -> torch.Tensor:  # -> [B, N, A', D]
    """Step ``j``'s attention in the training-time test (-> ``[B, N, A, D]``) without a ``[A, (j+1)A]`` mask: step
    0's keys causally (``[A, A]`` scores) and each later step's key only at the query's own anchor (one score per
    anchor: ``q_t . k^i_t``), one softmax over both — :func:`ttt_visibility`'s view at ``(j+1)/2`` of its cost (the
    diagonal scores of the reference implementations' ``cache_hidden`` attention). Grouped-query heads share their
    key. ``masked`` (default: on CUDA) runs SDPA over every step's keys under :func:`ttt_visibility` instead: the
    GPU's fused kernels take the mask without holding the scores, which the CPU's do not. ``q`` ``[B, N, A', D]`` at
    anchors ``start .. A-1``; ``keys``, ``values``: step 0's ``[B, KV, A, D]``, later steps' ``[B, KV, A', D]``."""
    b, n, rows, d = q.shape
    a = keys[0].shape[2]  # step 0's anchors: all of them
    if q.is_cuda if masked is None else masked:
        visible = ttt_visibility(a, len(keys) - 1, q.device, start)  # [A', A + j A']
        return F.scaled_dot_product_attention(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), scale=scale,
                                              attn_mask=visible, enable_gqa=True)
    kv = keys[0].shape[1]
    qg = q.view(b, kv, n // kv, rows, d)  # [B, KV, G, A', D]
    causal = (qg @ keys[0][:, :, None].transpose(-1, -2)) * scale  # [B, KV, G, A', A]
    future = torch.ones(rows, a, dtype=torch.bool, device=q.device).triu(1 + start)  # key s > anchor start + row
    scores = [causal.masked_fill(future, torch.finfo(causal.dtype).min)]
    scores += [((qg * k[:, :, None]).sum(-1) * scale)[..., None] for k in keys[1:]]  # [B, KV, G, A', 1] each
    probs = torch.cat(scores, dim=-1).softmax(dim=-1, dtype=torch.float32).to(q.dtype)  # [B, KV, G, A', A + j]
    out = probs[..., :a] @ values[0][:, :, None]  # [B, KV, G, A', D]
    for i, v in enumerate(values[1:]):
        out = out + probs[..., a + i, None] * v[:, :, None]
    return out.reshape(b, n, rows, d)


def ttt_visibility(anchors: int, step: int, device=None, start: int = 0) -> torch.Tensor:  # [A', A + step A'] bool
    """What unrolled step ``step`` sees in the training-time test, over the keys of steps ``0 .. step`` (step 0's
    ``anchors`` keys, later steps' at anchors ``start ..`` only: ``A' = anchors - start``): step 0's keys causally
    (``s <= t``, the true prefix), and each later step's key at the same anchor only (``s == t``: the draft's own
    ancestors) — decoding's view of draft depth ``step + 1``, for the queries at anchors ``start .. anchors-1``."""
    rows = anchors - start
    causal = torch.ones(rows, anchors, dtype=torch.bool, device=device).tril(start)
    eye = torch.eye(rows, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def ttt_start(keep: torch.Tensor) -> int:  # keep [K, B, A] bool -> anchor index
    """The first anchor any unrolled step after the first trains on (``keep[1:]``): those steps run from there
    (:func:`unrolled_states`). Step 0 always runs at every anchor."""
    later = keep[1:].any(dim=0).any(dim=0).nonzero()  # [n, 1]
    return int(later[0, 0]) if later.numel() else max(int(keep.shape[-1]) - 1, 0)


def kept(keep: torch.Tensor, step: int, start: int) -> torch.Tensor:  # [B, A] or [B, A - start] bool
    """Step ``step``'s trained anchors in the index space of its states: every anchor for step 0, ``start ..`` after."""
    return keep[step] if step == 0 else keep[step][:, start:]


def ttt_anchors(labels: torch.Tensor, step: int,
                draftable: torch.Tensor | None = None) -> torch.Tensor:  # labels [B, T] -> [B, A = T-1] bool
    """The anchors ``t`` unrolled step ``step`` is trained on: those whose ``x_{t+2+step}`` is an answer token (the
    last anchor never has a label); with ``draftable`` ``[B, A]`` (at anchor ``t``: the target's argmax next token
    ``argmax p_{t+2}`` lies in the draft vocabulary), only those whose step-``step`` label ``argmax p_{t+2+step}`` does
    — EAGLE-3's ``position_mask = t2d[target_argmax] * loss_mask``, shifted with the labels."""
    keep = shifted(labels[:, 2:], step, -100) != -100  # [B, A-1]
    keep = torch.cat([keep, keep.new_zeros(keep.shape[0], 1)], dim=1)  # [B, A]
    return keep if draftable is None else keep & shifted(draftable.bool(), step, False)


def shifted(x: torch.Tensor, by: int, fill: float = 0) -> torch.Tensor:  # [B, A, ...] -> [B, A, ...]
    """``x`` moved ``by`` places to the left along dim 1, ``fill`` at the end."""
    if by == 0:
        return x
    return torch.cat([x[:, by:], x.new_full((x.shape[0], by, *x.shape[2:]), fill)], dim=1)


__all__ = ["Eagle3TTT", "kept", "shifted", "ttt_anchors", "ttt_attention", "ttt_start", "ttt_visibility",
           "unrolled_states"]
