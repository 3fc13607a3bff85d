"""The speculative decode loop as small functions: prefill, propose, verify, accept, commit, stop.

State between steps is the committed token sequence whose last token is *pending* (not yet in the
target's KV cache). Each step runs the target once over ``[pending] + draft`` and commits the
accepted draft nodes plus one more token (the correction after a rejection, or the bonus token
after a full accept), so a step commits between 1 and ``len(draft) + 1`` tokens; with no draft this
is plain autoregressive decoding and every step commits exactly one token (tau = 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.inference.adapter import ModelAdapter
from draftsmith.inference.kv_cache import KVCache
from draftsmith.inference.proposers.base import Proposer, StepFeedback
from draftsmith.inference.sampling import SamplingParams, process_logits
from draftsmith.inference.verify import Draft, Verdict, verify_greedy, verify_sampling

Verifier = Callable[[torch.Tensor, Draft, "torch.Generator | None"], Verdict]


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()


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
        prompt_ids[None, :-1], cache, compute_logits=False, output_hidden_states=_layer_indices(target, hidden_layers)
    )
    return _pick_hidden(out, hidden_layers)


def _layer_indices(target: ModelAdapter, hidden_layers: Sequence[int]) -> list[int]:
    return [i for i in hidden_layers if i != -1]


def _pick_hidden(out, hidden_layers: Sequence[int], rows: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
    picked = {}
    for i in hidden_layers:
        h = out.last_hidden[0] if i == -1 else out.hidden_states[i][0]  # [T, H]
        picked[i] = h if rows is None else h[rows]
    return picked


def verify_forward(
    target: ModelAdapter,
    cache: KVCache,
    pending: torch.Tensor,  # [1]
    draft: Draft,
    hidden_layers: Sequence[int] = (),
):
    """One target forward over the pending token and the draft tree; ``.logits`` is ``[1, 1 + n, V]``."""
    past = cache.get_seq_length()
    ids = torch.cat([pending, draft.tokens.to(pending.device)])[None]  # [1, 1 + n]
    want = _layer_indices(target, hidden_layers)
    if draft.is_chain:
        return target.forward(ids, cache, output_hidden_states=want)
    depths = torch.cat([torch.zeros(1, dtype=torch.long), draft.depths]).to(pending.device)
    return target.forward(
        ids, cache, position_ids=(past + depths)[None], tree=draft.verify_mask, output_hidden_states=want
    )


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


def commit_cache(cache: KVCache, past: int, verdict: Verdict) -> None:
    """Keep the pending token (at ``past``) and the accepted branch; drop every other node."""
    cache.select(past + 1, torch.tensor(verdict.accepted, dtype=torch.long))


def truncate(
    new_tokens: list[int],
    produced: int,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
) -> tuple[list[int], str | None]:
    """Cut a step's committed tokens at the first EOS (kept) and at the token budget."""
    room = max_new_tokens - produced
    for i, tok in enumerate(new_tokens[:room]):
        if tok in eos_token_ids:
            return new_tokens[: i + 1], "eos"
    if len(new_tokens) >= room:
        return new_tokens[:room], "length"
    return new_tokens, None


def stop_string_cut(tokenizer, output_ids: list[int], start: int, stop_strings: Sequence[str]) -> int | None:
    """Smallest number of output tokens (>= ``start``) whose text contains a stop string, else None."""
    if not stop_strings or tokenizer is None:
        return None
    text = tokenizer.decode(output_ids, skip_special_tokens=True)
    if not any(s in text for s in stop_strings):
        return None
    for n in range(max(1, start), len(output_ids) + 1):
        prefix = tokenizer.decode(output_ids[:n], skip_special_tokens=True)
        if any(s in prefix for s in stop_strings):
            return n
    return len(output_ids)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    """Decode up to ``config.max_new_tokens`` new tokens; ``proposer=None`` is plain AR decoding."""
    device = target.device
    prompt_ids = prompt_ids.to(device).reshape(-1)
    if prompt_ids.numel() == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. BOS)")
    max_new = min(config.max_new_tokens, target.max_positions - prompt_ids.numel())
    _sync(device)
    t0 = time.perf_counter()
    cache = target.new_cache(capacity=prompt_ids.numel() + max_new + 64)
    hidden_layers = tuple(getattr(proposer, "hidden_layers", ()) or ())
    prompt_hidden = prefill(target, cache, prompt_ids, hidden_layers)
    if proposer is not None:
        proposer.reset(prompt_ids)
        if hidden_layers:
            proposer.prefill_hidden(prompt_hidden)
    tokens = prompt_ids
    output: list[int] = []
    accept_lengths: list[int] = []
    proposed_by_depth: list[int] = []
    accepted_by_depth: list[int] = []
    n_proposed = n_accepted = 0
    draft_time = verify_time = 0.0
    finish = "length"
    while len(output) < max_new:
        room = max_new - len(output)
        t_draft = time.perf_counter()
        if proposer is None:
            draft = Draft.empty()
        else:
            draft = proposer.propose(tokens, room - 1, config.sampling, generator)
        _sync(device)
        t_verify = time.perf_counter()
        past = cache.get_seq_length()
        out = verify_forward(target, cache, tokens[-1:], draft, hidden_layers)
        logits = out.logits[0]  # [1 + n, V]
        verdict = accept(logits, draft, config.sampling, generator, verifier)
        commit_cache(cache, past, verdict)
        _sync(device)
        t_end = time.perf_counter()
        draft_time += t_verify - t_draft
        verify_time += t_end - t_verify
        step_tokens = draft.tokens[verdict.accepted].tolist() + [verdict.next_token]
        if len(draft):
            n_proposed += len(draft)
            n_accepted += len(verdict.accepted)
            _count_depths(draft, verdict, proposed_by_depth, accepted_by_depth)
        if proposer is not None:
            rows = torch.tensor([0] + [a + 1 for a in verdict.accepted], device=device)
            proposer.observe(
                StepFeedback(
                    num_proposed=len(draft),
                    num_accepted=len(verdict.accepted),
                    draft_seconds=t_verify - t_draft,
                    target_seconds=t_end - t_verify,
                    accepted=verdict.accepted,
                    committed=step_tokens,
                    target_logits=logits,
                    hidden_states=_pick_hidden(out, hidden_layers, rows) if hidden_layers else {},
                )
            )
        kept, reason = truncate(step_tokens, len(output), max_new, config.eos_token_ids)
        cut = stop_string_cut(tokenizer, output + kept, len(output) + 1, config.stop_strings)
        if cut is not None:
            kept, reason = (output + kept)[len(output) : cut], "stop"
        output.extend(kept)
        accept_lengths.append(len(kept))
        tokens = torch.cat([tokens, torch.tensor(kept, dtype=torch.long, device=device)])
        if reason is not None:
            finish = reason
            break
    _sync(device)
    return GenerationResult(
        output_ids=output,
        accept_lengths=accept_lengths,
        num_proposed=n_proposed,
        num_accepted=n_accepted,
        finish_reason=finish,
        wall_time=time.perf_counter() - t0,
        draft_time=draft_time,
        verify_time=verify_time,
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
