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
        logits = [self.head.draft_logits(hidden)
                  for hidden in unrolled_states(self.head, features, step_embeds, self.recompute, keep)]
        return torch.stack(logits) if keep is None else torch.cat(logits)

    def artefact_config(self) -> dict:
        return self.head.artefact_config()

    @staticmethod
    def artefact_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.removeprefix("head."): v for k, v in state_dict.items() if k.startswith("head.")}


def unrolled_states(head: Eagle3Head, features: torch.Tensor, step_embeds: torch.Tensor, recompute: bool = False,
                    keep: torch.Tensor | None = None) -> Iterator[torch.Tensor]:  # yields [N_j, H] (or [B, A, H])
    """The training-time test's head outputs ``h^j`` (pre-norm), step by step: ``features`` ``[B, A, 3Ht]`` fused
    by ``fc`` into ``g``, then step ``j`` reads ``step_embeds[j]`` ``[B, A, H]`` and its step ``j-1`` output at
    positions ``t + j``, seeing what decoding shows draft depth ``j + 1`` (:func:`ttt_visibility`). Yields step
    ``j``'s states at the anchors it trains on, ``keep[j]`` ``[K, B, A]`` in row-major order (``[N_j, H]``), or
    without ``keep`` at every anchor (``[B, A, H]``).

    A P-EAGLE head (:class:`~draftsmith.inference.drafters.peagle.PEagleHead`) drafts depth ``j > 0`` from
    placeholders instead: ``step_embeds[j]`` holds the mask token's embedding and the step reads ``fc(mask_hidden)`` in
    place of step ``j-1``'s output; the visibility and positions are the same (the reference's parallel-drafting mask:
    the true prefix up to the anchor, and the anchor's own shallower depths).

    ``recompute`` (with gradients on): each step runs under activation checkpointing, so the forward keeps only a
    step's output and its new keys and values, and the backward recomputes one step at a time — every step's
    activations (its ``A x A`` scores among them, :func:`ttt_attention`) are otherwise held at once. The gradients
    are the same; it costs a third more head compute, worth it where those activations do not fit (long rows, wide
    heads), not at SmolLM2's or the tiny zoo's shapes.

    Steps ``j >= 1`` run at the anchors some of them train on only (:func:`ttt_rows`, packed into ``M`` rows: not
    the prompts, the padding or the rows' last anchors). An anchor's later steps reach no other anchor — a later
    step's key is seen at its own anchor alone — so the untrained ones change nothing, while step 0 keeps every
    anchor, the keys of the true prefix. The packed rows' projections and MLP run on ``[1, M, H]``; their attention
    on the ``[B, A - start]`` grid from the first of them (:func:`on_grid`). The trained rows' values and gradients
    are the same."""
    steps, b, a = step_embeds.shape[:3]
    hidden = head.fuse_concat(features)  # [B, A, H]: g
    run = partial(checkpoint, partial(_unrolled_step, head), use_reentrant=False) \
        if recompute and torch.is_grad_enabled() else partial(_unrolled_step, head)
    pos = torch.arange(a, device=features.device)[None].expand(b, a)  # [B, A]
    hidden, key, value = run(step_embeds[0], hidden, pos, 0, None)  # step 0 at every anchor
    yield hidden if keep is None else hidden[keep[0]]
    if steps == 1:
        return
    later = ttt_rows(keep) if keep is not None else torch.ones(b, a, dtype=torch.bool, device=features.device)
    rows, cols = later.nonzero(as_tuple=True)  # [M] each, row-major: the packed rows' batch row and anchor
    start = int(cols.min()) if cols.numel() else a - 1  # the attention grid's first anchor
    where = (rows, cols - start)
    placeholder = head.mask_state().expand(1, rows.numel(), -1) if isinstance(head, PEagleHead) else None
    hidden = hidden[rows, cols][None]  # [1, M, H]
    past = [key, value]  # keys, values of steps 0 .. j-1: step 0's [B, KV, A, D], later ones' [B, KV, A', D]
    for j in range(1, steps):
        if placeholder is not None:  # P-EAGLE: every later depth reads the shared placeholder state
            hidden = placeholder
        hidden, key, value = run(step_embeds[j][rows, cols][None], hidden, (cols + j)[None], start, where, *past)
        past += [key, value]
        yield hidden[0].view(b, a, -1) if keep is None else hidden[0][keep[j][rows, cols]]


def _unrolled_step(head: Eagle3Head, embeds: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, start: int,
                   where: tuple[torch.Tensor, torch.Tensor] | None,
                   *past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One unrolled step of the head's layer as a function of its inputs (so it can be recomputed): ``embeds``,
    ``hidden`` ``[B, A', H]`` and ``pos`` ``[B, A']``, ``past`` the earlier steps' keys and values (step 0's ``[B,
    KV, A, D]``, then ``[B, KV, A', D]``, alternating) -> ``(h^j [B, A', H], keys [B, KV, A', D], values [B, KV,
    A', D])`` of this step. With ``where`` (packed rows' batch row and anchor ``- start``, ``[M]`` each) the states
    are ``[1, M, H]`` rows, placed on the ``[B, A']`` grid of anchors ``start ..`` for the attention
    (:func:`on_grid`), and the keys and values returned on that grid. The same layer as :meth:`Eagle3Head.forward`
    under :func:`ttt_visibility`, with the attention computed as :func:`ttt_attention`."""
    layer = head.midlayer
    attn = layer.self_attn
    b, a, _ = hidden.shape
    x, residual = head.layer_inputs(embeds, hidden)  # [B, A, 2H], [B, A, H]
    q, k, v = (proj(x).view(b, a, -1, attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    if hasattr(attn, "q_norm"):  # Qwen3 and OLMo2 layers normalise each head's query and key before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    cos, sin = head.rotary(hidden, pos)  # [B, A, D] each
    q, k = (rotated(t.transpose(1, 2), cos, sin) for t in (q, k))  # [B, N, A, D], [B, KV, A, D]
    v = v.transpose(1, 2)
    if where is not None:  # packed rows: the attention on the grid
        grid = (past[0].shape[0], past[0].shape[2] - start)  # (B, A')
        q, k, v = (on_grid(t, where, grid) for t in (q, k, v))  # [B, N or KV, A', D]
    out = ttt_attention(q, [*past[0::2], k], [*past[1::2], v], float(attn.scaling), start=start)  # [B, N, A', D]
    out = out.transpose(1, 2) if where is None else out.transpose(1, 2)[where][None]  # [B, A', N, D] or [1, M, N, D]
    h = residual + attn.o_proj(out.reshape(b, a, -1))
    return head.fed_back(h + layer.mlp(layer.post_attention_layernorm(h))), k, v


def on_grid(x: torch.Tensor, where: tuple[torch.Tensor, torch.Tensor],
            grid: tuple[int, int]) -> torch.Tensor:  # [1, N, M, D] -> [B, N, A', D]
    """Packed rows ``x`` placed at ``where`` (batch rows, anchors; ``[M]`` each) of a zero ``grid`` ``(B, A')``."""
    n, d = x.shape[1], x.shape[3]
    placed = x.new_zeros(*grid, n, d).index_put(where, x[0].transpose(0, 1))  # [B, A', N, D]
    return placed.transpose(1, 2)


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


def ttt_rows(keep: torch.Tensor) -> torch.Tensor:  # keep [K, B, A] bool -> [B, A] bool
    """The anchors the unrolled steps after the first run at (:func:`unrolled_states`): those any of them trains on
    (``keep[1:]``). Step 0 always runs at every anchor."""
    return keep[1:].any(dim=0)


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


__all__ = ["Eagle3TTT", "on_grid", "shifted", "ttt_anchors", "ttt_attention", "ttt_rows", "ttt_visibility",
           "unrolled_states"]
