"""Choosing LayerSkip's exit layer ``E`` (and the draft length) for early-exit self-speculation, from measurements.

On calibration sequences (prompts with the target's own greedy answers) one forward gives every layer's hidden
state; each layer's *exit* (the model's final norm and LM head on it) is compared with the full model's next
token: ``a_E`` = the top-1 agreement of exit ``E`` over the answer positions. Costs are measured on the target
itself, drafts and verifications in the same timing rounds: ``c(E)`` = seconds of one token through layers ``0 .. E-1`` plus the norm and LM head (a draft step), and
``V(n)`` = seconds of a full forward over ``n`` tokens. With the draft's cache reused, a step that drafts ``k``
tokens runs ``k`` draft steps and the remaining ``L - E`` layers over ``k + 1`` tokens, so::

    E[tau | E, k] = (1 - a_E^(k+1)) / (1 - a_E)                   (Leviathan et al. 2023, eq. 1)
    step(E, k)    = k c(E) + (L - E) / L * V(k + 1)
    speedup(E, k) = E[tau | E, k] * V(1) / step(E, k)

and the (E, k) with the highest predicted speedup is chosen; the whole table is kept (the artefact records it).
Agreement is a per-token average, so the prediction assumes acceptances independent of depth; the evaluator
then measures the real figure (``draftsmith eval --method early-exit --exit-layer E``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.evaluation.cost import _seconds


@dataclass(frozen=True)
class ExitChoice:
    exit_layer: int
    draft_length: int
    agreement: float
    predicted_tau: float
    predicted_speedup: float


@torch.inference_mode()
def exit_agreement(target, sequences: Sequence[Sequence[int]], answer_starts: Sequence[int]) -> list[float]:
    """``[L]``: for exit ``E = 1 .. L`` (index ``E - 1``), how often the argmax of the final norm and LM head on the
    layer-``E`` hidden state equals the full model's, over the answer positions of ``sequences`` (position ``t``
    predicts token ``t + 1``; ``answer_starts[i]`` is where sequence ``i``'s answer begins)."""
    adapter = target if isinstance(target, ModelAdapter) else ModelAdapter(target)
    layers = adapter.num_layers
    hits = torch.zeros(layers)
    total = 0
    for seq, start in zip(sequences, answer_starts):
        ids = torch.tensor([list(seq)], device=adapter.device)
        out = adapter.forward(ids, output_hidden_states=range(1, layers + 1))
        rows = slice(max(0, start - 1), ids.shape[1] - 1)  # positions whose next token is an answer token
        final = out.logits[0, rows].argmax(-1)
        for e in range(1, layers + 1):
            exit_ = adapter.logits(adapter.norm(out.hidden_states[e][0, rows])).argmax(-1) if e < layers else final
            hits[e - 1] += int((exit_ == final).sum())
        total += int(final.numel())
    return (hits / max(1, total)).tolist()


@torch.inference_mode()
def exit_costs(target, prefix_tokens: int = 128, repeats: int = 7,
               verify_sizes: Sequence[int] = ()) -> tuple[dict[int, float], dict[int, float]]:
    """``(exit seconds, verify seconds)``: one token through layers ``0 .. E-1`` plus the norm and LM head for every
    ``E = 1 .. L``, and a full forward over ``n`` tokens for every ``n`` in ``verify_sizes`` (and 1), all after the
    same cached prefix and timed in the same round-robin rounds (the fastest of ``repeats`` kept), so a burst of
    load from other processes hits drafts and verifications alike."""
    from draftsmith.inference.evaluation.cost import monotone

    adapter = target if isinstance(target, ModelAdapter) else ModelAdapter(target)
    sizes = sorted({1, *[int(n) for n in verify_sizes]})
    prefix_tokens = max(1, min(prefix_tokens, adapter.max_positions - max(sizes) - 1))
    ids = torch.randint(0, adapter.vocab_size, (1, prefix_tokens + max(sizes)),
                        generator=torch.Generator().manual_seed(0)).to(adapter.device)
    cache = adapter.new_cache(capacity=prefix_tokens + max(sizes) + 8)
    adapter.forward(ids[:, :prefix_tokens], cache, compute_logits=False)
    jobs = {("exit", e): {"exit_layer": e, "n": 1} for e in range(1, adapter.num_layers + 1)}
    jobs |= {("verify", n): {"exit_layer": None, "n": n} for n in sizes}
    best = {key: float("inf") for key in jobs}

    def step(job: dict) -> None:
        adapter.forward(ids[:, prefix_tokens: prefix_tokens + job["n"]], cache, exit_layer=job["exit_layer"])
        cache.crop(prefix_tokens)

    for r in range(2 + repeats):
        for key, job in jobs.items():
            seconds = _seconds(lambda j=job: step(j), adapter.device)
            if r >= 2:
                best[key] = min(best[key], seconds)
    exits = {e: s for (kind, e), s in best.items() if kind == "exit"}
    verify = monotone({n: s for (kind, n), s in best.items() if kind == "verify"})
    return exits, verify


def predict(agreement: Sequence[float], costs: dict[int, float], verify: dict[int, float], num_layers: int,
            lengths: Sequence[int] = (1, 2, 3, 4, 5, 6, 8)) -> list[ExitChoice]:
    """Every (exit layer, draft length) with its predicted tau and speedup (module docstring), best first. The last
    layer is not an exit (its draft would be the model itself)."""
    from draftsmith.inference.evaluation.cost import CostModel

    curve = CostModel(verify_seconds=verify)
    out = []
    for e in range(1, num_layers):
        a = min(float(agreement[e - 1]), 1.0 - 1e-9)
        for k in lengths:
            tau = (1.0 - a ** (k + 1)) / (1.0 - a)
            step = k * costs[e] + (num_layers - e) / num_layers * curve.verify(k + 1)
            out.append(ExitChoice(e, k, round(a, 5), round(tau, 4), round(tau * curve.verify(1) / step, 4)))
    return sorted(out, key=lambda c: -c.predicted_speedup)


def choose_exit(target, sequences: Sequence[Sequence[int]], answer_starts: Sequence[int],
                lengths: Sequence[int] = (1, 2, 3, 4, 5, 6, 8)) -> dict:
    """Measure and predict (module docstring): ``{"chosen", "runner_up", "agreement", "exit_seconds",
    "verify_seconds", "table"}``, JSON-ready."""
    adapter = target if isinstance(target, ModelAdapter) else ModelAdapter(target)
    agreement = exit_agreement(adapter, sequences, answer_starts)
    costs, verify = exit_costs(adapter, verify_sizes=[k + 1 for k in lengths])
    ranked = predict(agreement, costs, verify, adapter.num_layers, lengths)
    return {"chosen": asdict(ranked[0]), "runner_up": asdict(ranked[1]) if len(ranked) > 1 else None,
            "agreement": [round(a, 5) for a in agreement], "exit_seconds": {str(e): s for e, s in costs.items()},
            "verify_seconds": {str(n): s for n, s in verify.items()}, "table": [asdict(c) for c in ranked]}


__all__ = ["ExitChoice", "choose_exit", "exit_agreement", "exit_costs", "predict"]
