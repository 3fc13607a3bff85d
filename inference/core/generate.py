"""The speculative decode loop as small functions: prefill, propose, verify, accept, commit, stop.

State between steps is the committed token sequence whose last token is *pending* (not yet in the
target's KV cache). Each step runs the target once over ``[pending] + draft`` and commits the
accepted draft nodes plus one more token (the correction after a rejection, or the bonus token
after a full accept), so a step commits between 1 and ``len(draft) + 1`` tokens; with no draft this
is plain autoregressive decoding and every step commits exactly one token (tau = 1).

Per step the host waits on the device once, for the verdict (accepted path, next token and the
draft's tokens in one transfer; see :mod:`~draftsmith.inference.core.verify`); with step timing on, twice
more. Nothing goes the other way: the verdict keeps the accepted node indices and the committed tokens on
the device, where the KV cache keeps its accepted entries, the proposer's hidden-state rows are picked and
the sequence grows. A draft made on the host is moved once. Self-drafting proposers
reach the target and this sequence's cache through ``bind(TargetView)`` (see
:class:`~draftsmith.inference.core.proposer.TargetView`); the loop checks the cache they leave.
A draft's extra inputs ride along in the verification forward and are dropped from the cache with
the rejected nodes. Stop strings are searched in a bounded window of the output's tail.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.common.errors import ProposerError
from draftsmith.inference.core.adapter import AdapterOutput, ModelAdapter
from draftsmith.inference.core.kv_cache import KVCache, KVPrefix
from draftsmith.inference.core.proposer import Proposer, SelfDrafting, StepFeedback, TargetView, acceptance_rule
from draftsmith.inference.core.sampling import SamplingParams, process_logits
from draftsmith.inference.core.stops import find_stop, stop_lookback, truncate
from draftsmith.inference.core.timing import sync_device
from draftsmith.inference.core.verify import Draft, ExtraInputs, Verdict, verify_greedy, verify_sampling

Verifier = Callable[[torch.Tensor, Draft, "torch.Generator | None"], Verdict]


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    # (rows, padded rows) pairs: verification forwards over `rows` tokens run over `padded rows` instead, where the
    # machine's measured forward is cheaper that way (draftsmith.inference.evaluation.cost.padding_plan); () = never pad
    verify_padding: tuple[tuple[int, int], ...] = ()
    # False: the first new token comes from the prefill's forward alone, with no draft
    draft_first_step: bool = True
    # False: drafts never shorten at an answer's end (what the target accepts past max_new_tokens is counted, then cut).
    # Either way the output is the same; only the acceptance counts change (a serving engine's stepping, for parity).
    shorten_last_drafts: bool = True
    # time each step's drafting and verification (two device synchronisations per step on a GPU; the draft-length
    # policies that weigh draft against target time need them); False: no synchronisation inside the loop
    timing: bool = True


@dataclass
class GenerationResult:
    output_ids: list[int]  # the new tokens (EOS / stop string included when it ended the answer)
    accept_lengths: list[int]  # per target forward: tokens it committed, bonus included
    num_proposed: int  # draft nodes proposed, all steps
    num_accepted: int  # draft nodes accepted, all steps
    finish_reason: str  # "eos" | "stop" | "length"
    wall_time: float  # seconds, prefill included
    draft_time: float = 0.0
    verify_time: float = 0.0
    prefill_time: float = 0.0  # seconds before the first step: the target's prompt forward and the proposer's start
    proposed_by_depth: list[int] = field(default_factory=list)  # depth d-1 -> steps proposing depth d
    accepted_by_depth: list[int] = field(default_factory=list)  # depth d-1 -> steps accepting depth d

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / max(1, len(self.accept_lengths))

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0


def prefill(
    target: ModelAdapter,
    cache: KVCache,
    prompt_ids: torch.Tensor,  # [L]
    hidden_layers: Sequence[int] = (),
) -> dict[int, torch.Tensor]:  # layer -> [L - 1, H]
    """Put every prompt token but the last (the first pending token) into the cache; return the
    requested hidden states of those tokens."""
    if prompt_ids.numel() <= 1:
        return {}
    out = target.forward(
        prompt_ids[None, :-1], cache, compute_logits=False, output_hidden_states=_layer_indices(hidden_layers)
    )
    return _pick_hidden(out, hidden_layers)


def _layer_indices(hidden_layers: Sequence[int]) -> list[int]:
    return [i for i in hidden_layers if i != -1]


def _pick_hidden(
    out: AdapterOutput, hidden_layers: Sequence[int], rows: torch.Tensor | slice | None = None
) -> dict[int, torch.Tensor]:  # layer -> [rows, H]
    picked = {}
    for i in hidden_layers:
        h = out.last_hidden[0] if i == -1 else out.hidden_states[i][0]  # [T, H]
        picked[i] = h if rows is None else h[rows]
    return picked


def start_sequence(
    proposer: Proposer,
    target: ModelAdapter,
    cache: KVCache,
    prompt_ids: torch.Tensor,  # [L]
    prompt_hidden: dict[int, torch.Tensor],  # layer -> [L - 1, H]
) -> None:
    """Bind a self-drafting proposer to the target and this sequence's cache, then reset it."""
    if isinstance(proposer, SelfDrafting):
        proposer.bind(TargetView(target, cache))
    proposer.reset(prompt_ids)
    if getattr(proposer, "hidden_layers", ()):
        proposer.prefill_hidden(prompt_hidden)


def expected_cache_lengths(num_layers: int, past: int, draft: Draft) -> list[int]:
    """Per-layer target cache lengths the verification of ``draft`` expects (see TargetView):
    ``past`` everywhere, except ``past + 1 + n`` in the layers a resumed draft already ran."""
    start = draft.resume.start if draft.resume is not None else 0
    return [past + 1 + len(draft)] * start + [past] * (num_layers - start)


def check_target_cache(cache: KVCache, past: int, draft: Draft, proposer_name: str) -> None:
    """Refuse a proposal that left the target's cache other than the verification expects."""
    want = expected_cache_lengths(cache.num_layers, past, draft)
    got = cache.lengths()
    if got != want:
        i = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        raise ProposerError(
            f"proposer {proposer_name!r} left {got[i]} entries in layer {i} of the target's KV cache where the "
            f"verification expects {want[i]}: crop what the draft wrote (see TargetView)"
        )


def pad_rows(plan: dict[int, int], draft: Draft) -> int:
    """Dummy rows to append to this step's verification forward under ``plan`` (rows -> padded rows); none for
    a draft with extra inputs or one that resumes inside the target, whose rows have their own layout."""
    if not plan or draft.extra_inputs is not None or draft.resume is not None:
        return 0
    rows = 1 + len(draft)
    return max(0, plan.get(rows, rows) - rows)


def padded_inputs(
    ids: torch.Tensor,  # [T]
    pos: torch.Tensor,  # [1, T]
    mask: torch.Tensor | None,  # [T, T] bool or None (causal)
    pad: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # [T + pad], [1, T + pad], [T + pad, T + pad] | None
    """The verification inputs with ``pad`` dummy rows appended: copies of the last token at the next positions.
    No real row sees them (they come last under the causal mask; a tree's mask gets columns no real row reads,
    and each dummy row sees the root and itself), so the real rows' outputs are unchanged; the caller drops the
    dummy rows' outputs and the cache keeps only the accepted rows."""
    t = ids.numel()
    ids = torch.cat([ids, ids[-1:].expand(pad)])
    pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, pad + 1, device=pos.device)[None]], dim=1)
    if mask is not None:
        full = torch.zeros(t + pad, t + pad, dtype=torch.bool, device=mask.device)
        full[:t, :t] = mask
        full[t:, 0] = True
        full[t:, t:] = torch.eye(pad, dtype=torch.bool, device=mask.device)
        mask = full
    return ids, pos, mask


def verify_forward(
    target: ModelAdapter,
    cache: KVCache,
    past: int,  # committed tokens in the cache (the pending token's position)
    pending: torch.Tensor,  # [1]
    draft: Draft,
    hidden_layers: Sequence[int] = (),
    pad: int = 0,
) -> AdapterOutput:
    """One target forward over the pending token, the draft tree and the draft's extra inputs;
    ``.logits`` is ``[1, 1 + n + m (+ pad), V]``. A resumed draft starts at its layer from its hidden states.
    ``pad`` dummy rows (:func:`pad_rows`) go after the draft; their outputs mean nothing."""
    device = pending.device
    want = _layer_indices(hidden_layers)
    pos, mask = draft.forward_inputs(past, device)  # [1 + n + m]; [T, T] bool or None (causal), on the device
    pos = pos[None]  # [1, 1 + n + m]
    if draft.resume is not None:
        start = draft.resume.start
        if any(i < start for i in want):
            raise ProposerError(
                f"hidden states of layers {sorted(i for i in want if i < start)} were asked for, but the draft "
                f"resumes the verification at layer {start}"
            )
        hidden = draft.resume.hidden.to(device, target.dtype)[None]  # [1, 1 + n, H]
        return target.forward_from(hidden, start, cache, position_ids=pos, tree=mask, output_hidden_states=want)
    ids = torch.cat([pending, draft.tokens.to(device)]) if len(draft) else pending  # [1 + n]
    extra = draft.extra_inputs
    if extra is None:
        if pad:
            ids, pos, mask = padded_inputs(ids, pos, mask, pad)  # [1 + n + pad]
        return target.forward(ids[None], cache, position_ids=pos, tree=mask, output_hidden_states=want)
    prefix = extra_prefix(extra, 1 + len(draft))
    if extra.input_ids is not None:
        ids = torch.cat([ids, extra.input_ids.to(device)])  # [1 + n + m]
        return target.forward(ids[None], cache, position_ids=pos, tree=mask, output_hidden_states=want,
                              kv_prefix=prefix)
    embeds = torch.cat([target.embed_tokens(ids), extra.inputs_embeds.to(device, target.dtype)])  # [1 + n + m, H]
    return target.forward(inputs_embeds=embeds[None], cache=cache, position_ids=pos, tree=mask,
                          output_hidden_states=want, kv_prefix=prefix)


def extra_prefix(extra: ExtraInputs, tree_rows: int) -> KVPrefix | None:
    """The extras' own keys/values as a :class:`KVPrefix` that only the extras' rows see (``tree_rows`` rows of
    the pending token and the draft come first and never see it)."""
    if extra.prefix is None:
        return None
    keys, values = extra.prefix
    rows = torch.zeros(1, tree_rows + len(extra), int(keys[0].shape[2]), dtype=torch.bool, device=keys[0].device)
    rows[:, tree_rows:] = True  # [1, 1 + n + m, P]
    return KVPrefix(keys, values, rows)


def accept(
    target_logits: torch.Tensor,  # [1 + n, V]
    draft: Draft,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    verifier: Verifier | None = None,
) -> Verdict:
    if verifier is not None:
        return verifier(process_logits(target_logits, sampling), draft, generator)
    if sampling.greedy:
        return verify_greedy(target_logits, draft)
    return verify_sampling(process_logits(target_logits, sampling), draft, generator)


def accepted_index(verdict: Verdict, device: torch.device) -> torch.Tensor:  # [a] long on device
    """The accepted node indices on the device: the verdict's own (the rules of
    :mod:`~draftsmith.inference.core.verify` keep them there), made there for a chain's prefix, else copied once."""
    a = len(verdict.accepted)
    if verdict.path is not None:
        return verdict.path
    if verdict.accepted == list(range(a)):
        return torch.arange(a, device=device)
    return torch.tensor(verdict.accepted, dtype=torch.long, device=device)


def commit_cache(cache: KVCache, past: int, verdict: Verdict, index: torch.Tensor | None = None) -> None:
    """Keep the pending token (at ``past``) and the accepted branch; drop every other node and
    every extra input. ``index``: the accepted node indices on the cache's device (:func:`accepted_index`)."""
    cache.select(past + 1, verdict.accepted, index)


def committed_ids(verdict: Verdict, step_tokens: list[int], device: torch.device) -> torch.Tensor:  # [a + 1] long
    """A step's committed tokens on the device: the verdict's own, else copied from the host."""
    if verdict.committed is not None:
        return verdict.committed
    return torch.tensor(step_tokens, dtype=torch.long, device=device)


def step_feedback(
    out: AdapterOutput,
    draft: Draft,
    verdict: Verdict,
    committed: list[int],
    hidden_layers: Sequence[int],
    draft_seconds: float,
    target_seconds: float,
    index: torch.Tensor | None = None,  # [a] the accepted node indices on the device (accepted_index)
    committed_tensor: torch.Tensor | None = None,  # [a + 1] the committed tokens on the device (committed_ids)
) -> StepFeedback:
    n = len(draft)
    logits = out.logits[0]  # [1 + n + m, V]
    hidden = {}
    if hidden_layers:
        index = accepted_index(verdict, logits.device) if index is None else index
        rows = torch.cat([index.new_zeros(1), index + 1])  # [1 + a] the pending token's row, then the accepted nodes'
        hidden = _pick_hidden(out, hidden_layers, rows)
    extra = draft.extra_inputs
    return StepFeedback(
        num_proposed=n,
        num_accepted=len(verdict.accepted),
        draft_seconds=draft_seconds,
        target_seconds=target_seconds,
        accepted=verdict.accepted,
        committed=committed,
        committed_ids=committed_tensor,
        draft_tokens=verdict.drafted,
        target_logits=logits[: 1 + n],
        hidden_states=hidden,
        extra_logits=logits[1 + n :] if extra is not None else None,
        extra_hidden=_pick_hidden(out, extra.hidden_layers, slice(1 + n, None)) if extra is not None else {},
    )


@torch.inference_mode()
def generate(
    target: ModelAdapter,
    prompt_ids: torch.Tensor,  # [L] long
    config: GenerationConfig,
    proposer: Proposer | None = None,
    generator: torch.Generator | None = None,
    tokenizer=None,
    verifier: Verifier | None = None,
) -> GenerationResult:
    """Decode up to ``config.max_new_tokens`` new tokens; ``proposer=None`` is plain AR decoding. ``verifier``
    replaces the acceptance rule; otherwise a proposer's own (:class:`OwnsAcceptanceRule`: a lossy rule such as
    Medusa's typical acceptance, on a proposer with ``lossless = False``) does, else the exact rules."""
    device = target.device
    prompt_ids = prompt_ids.to(device).reshape(-1)
    if prompt_ids.numel() == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. BOS)")
    max_new = min(config.max_new_tokens, target.max_positions - prompt_ids.numel())
    sync_device(device)
    t0 = time.perf_counter()
    cache = target.new_cache(capacity=prompt_ids.numel() + max_new + 64)
    hidden_layers = tuple(getattr(proposer, "hidden_layers", ()) or ())
    verifier = acceptance_rule(proposer, verifier)  # a lossy proposer's own rule unless one is given
    prompt_hidden = prefill(target, cache, prompt_ids, hidden_layers)
    if proposer is not None:
        start_sequence(proposer, target, cache, prompt_ids, prompt_hidden)
    sync_device(device)
    prefill_time = time.perf_counter() - t0
    lookback = stop_lookback(config.stop_strings) if config.stop_strings and tokenizer is not None else 0
    tokens = prompt_ids
    output: list[int] = []
    accept_lengths: list[int] = []
    proposed_by_depth: list[int] = []
    accepted_by_depth: list[int] = []
    n_proposed = n_accepted = 0
    draft_time = verify_time = 0.0
    padding = dict(config.verify_padding)
    finish = "length"
    while len(output) < max_new:
        room = max_new - len(output)
        past = tokens.numel() - 1  # committed tokens in the cache; tokens[-1] is pending
        t_draft = time.perf_counter()
        if proposer is None or (not config.draft_first_step and not accept_lengths):  # the prefill drafts nothing
            draft = Draft.empty()
        else:
            budget = room - 1 if config.shorten_last_drafts else target.max_positions - tokens.numel() - 1
            draft = proposer.propose(tokens, budget, config.sampling, generator).to(device)  # host tokens: one upload
            check_target_cache(cache, past, draft, getattr(proposer, "name", type(proposer).__name__))
        if config.timing:
            sync_device(device)
        t_verify = time.perf_counter()
        want = hidden_layers + (draft.extra_inputs.hidden_layers if draft.extra_inputs is not None else ())
        out = verify_forward(target, cache, past, tokens[-1:], draft, want, pad_rows(padding, draft))
        verdict = accept(out.logits[0, : 1 + len(draft)], draft, config.sampling, generator, verifier)
        index = accepted_index(verdict, device)  # [a] on the device: the cache and the proposer's rows need no upload
        commit_cache(cache, past, verdict, index)
        if config.timing:
            sync_device(device)
        t_end = time.perf_counter()
        draft_time += t_verify - t_draft
        verify_time += t_end - t_verify
        step_tokens = verdict.accepted_tokens(draft) + [verdict.next_token]
        step_ids = committed_ids(verdict, step_tokens, device)  # [a + 1] on the device
        if len(draft):
            n_proposed += len(draft)
            n_accepted += len(verdict.accepted)
            _count_depths(draft, verdict, proposed_by_depth, accepted_by_depth)
        if proposer is not None:
            proposer.observe(
                step_feedback(out, draft, verdict, step_tokens, hidden_layers, t_verify - t_draft, t_end - t_verify,
                              index, step_ids)
            )
        kept, reason = truncate(step_tokens, len(output), max_new, config.eos_token_ids)
        stop = find_stop(tokenizer, output[max(0, len(output) - lookback) :], kept, config.stop_strings)
        if stop is not None:
            kept, reason = kept[:stop], "stop"
        output.extend(kept)
        accept_lengths.append(len(kept))
        tokens = torch.cat([tokens, step_ids[: len(kept)]])  # kept is a prefix of the step's tokens
        if reason is not None:
            finish = reason
            break
    sync_device(device)
    return GenerationResult(
        output_ids=output,
        accept_lengths=accept_lengths,
        num_proposed=n_proposed,
        num_accepted=n_accepted,
        finish_reason=finish,
        wall_time=time.perf_counter() - t0,
        draft_time=draft_time,
        verify_time=verify_time,
        prefill_time=prefill_time,
        proposed_by_depth=proposed_by_depth,
        accepted_by_depth=accepted_by_depth,
    )


def _count_depths(draft: Draft, verdict: Verdict, proposed: list[int], accepted: list[int]) -> None:
    for d in sorted(set(draft.depths.tolist())):  # steps that proposed something at depth d
        while len(proposed) < d:
            proposed.append(0)
            accepted.append(0)
        proposed[d - 1] += 1
    for d in range(len(verdict.accepted)):
        accepted[d] += 1
