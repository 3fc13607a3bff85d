"""Draft & Verify's search (Zhang et al. 2023) with Optuna: which attention and MLP sublayers the target skips
while it drafts for itself, so that self-speculative decoding is fastest.

The study has one boolean per sublayer (``attn_<i>``, ``mlp_<i>``), all 2L of them as the reference searches
(searching.py: one variable per attention and per MLP of every layer, the first and last included; its published
LLaMA-2-70B set skips the last layer's attention); ``pin_ends=True`` keeps the first and last layers running
instead. TPE by default (``random`` selectable; the reference uses Gaussian-process Bayesian optimisation), seeded.
A trial's objective is the *measured* seconds per generated token of self-speculative decoding with that skip set
(the :class:`~draftsmith.inference.proposers.draft_verify.DraftVerifyProposer` with adaptive draft-exiting) over the
calibration prompts, greedy; after each prompt the running value is reported, so a trial whose first half of the
prompts is worse than the median of earlier trials is pruned (median pruner, after 5 complete trials; timing noise
makes an earlier verdict unreliable). A skip set that skips nothing is scored as plain decoding. Selectable instead
(``objective="predicted"``): the seconds per token predicted from the skip set's teacher-forced agreement with the
full model along the target's answers and the measured per-sublayer costs (cheap and free of timing noise;
:func:`predicted_seconds_per_token`). The study lives in an SQLite file (``storage``), so a killed search rerun
continues it (finished trials are kept and not repeated) and ``optuna-dashboard sqlite:///.../study.db`` shows it as
it is.

The baselines the search is compared against are measured the same way: every other layer skipped, and the last
half of the layers skipped (an untrained early exit at ``L/2``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.proposers.draft_verify import AdaptiveThreshold, DraftVerifyProposer

SAMPLERS = ("tpe", "random")
OBJECTIVES = ("measured", "predicted")
STUDY = "draftsmith-draft-verify"


@dataclass(frozen=True)
class SkipSet:
    attention: tuple[int, ...] = ()
    mlp: tuple[int, ...] = ()

    def empty(self) -> bool:
        return not (self.attention or self.mlp)

    def picture(self, num_layers: int) -> dict[str, str]:
        """One character per layer: ``x`` = skipped while drafting, ``.`` = run."""
        return {"attention": "".join("x" if i in self.attention else "." for i in range(num_layers)),
                "mlp": "".join("x" if i in self.mlp else "." for i in range(num_layers))}

    def to_dict(self) -> dict[str, list[int]]:
        return {"skip_attention": list(self.attention), "skip_mlp": list(self.mlp)}


@dataclass
class SearchSettings:
    draft_length: int = 8  # the longest draft (the reference's max_step_draft); adaptive draft-exiting stops earlier
    max_new_tokens: int = 48  # tokens per calibration answer
    pin_ends: bool = False  # True: keep the first and last layers out of the search (the reference searches all)
    sampler: str = "tpe"  # Optuna's TPE, or "random"
    seed: int = 0  # the sampler's seed
    objective: str = "measured"  # or "predicted": teacher-forced agreement and sublayer costs (noise-free)
    # the adaptive draft-exiting rule every trial drafts with (AdaptiveThreshold.to_dict; default: the reference's)
    threshold: dict = field(default_factory=lambda: AdaptiveThreshold().to_dict())

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"sampler {self.sampler!r} is unknown: choose one of {', '.join(SAMPLERS)}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective {self.objective!r} is unknown: choose one of {', '.join(OBJECTIVES)}")
        if self.draft_length < 1 or self.max_new_tokens < 1:
            raise ConfigError("draft_length and max_new_tokens must be >= 1")


def search_space(num_layers: int, pin_ends: bool = False) -> list[str]:
    """The study's variables: ``attn_<i>`` and ``mlp_<i>`` of every layer (2L, as the reference searches), or of
    layers 1..L-2 with ``pin_ends`` (on a target of at most 2 layers nothing is pinned)."""
    layers = range(1, num_layers - 1) if pin_ends and num_layers > 2 else range(num_layers)
    return [f"{kind}_{i}" for i in layers for kind in ("attn", "mlp")]


def skip_set_of(params: dict[str, bool], num_layers: int) -> SkipSet:
    """A trial's parameters as a skip set."""
    return SkipSet(tuple(i for i in range(num_layers) if params.get(f"attn_{i}", False)),
                   tuple(i for i in range(num_layers) if params.get(f"mlp_{i}", False)))


def baselines(num_layers: int) -> dict[str, SkipSet]:
    """Every other layer (1, 3, 5, ...) and the last half, both sublayers of each."""
    every_other = tuple(range(1, num_layers, 2))
    last_half = tuple(range(num_layers // 2, num_layers))
    return {"every_other_layer": SkipSet(every_other, every_other), "last_half": SkipSet(last_half, last_half)}


def proposer_for(skip: SkipSet, settings: SearchSettings) -> DraftVerifyProposer | None:
    if skip.empty():
        return None
    return DraftVerifyProposer(skip_attention=skip.attention, skip_mlp=skip.mlp,
                             policy=DraftLengthPolicy(length=settings.draft_length, max_length=settings.draft_length),
                             stop=AdaptiveThreshold.from_dict(settings.threshold))


@torch.inference_mode()
def seconds_per_token(adapter: ModelAdapter, prompts: Sequence[torch.Tensor], skip: SkipSet, settings: SearchSettings,
                      eos: Sequence[int] = (), report: Callable[[int, float], bool] | None = None) -> tuple[float, float]:
    """``(seconds per generated token, tau)`` of greedy decoding with ``skip`` over ``prompts``; ``report(i, value)``
    after prompt ``i`` returns True to stop early (pruning)."""
    proposer = proposer_for(skip, settings)
    config = GenerationConfig(max_new_tokens=settings.max_new_tokens, eos_token_ids=tuple(eos))
    seconds, tokens, accepted, steps = 0.0, 0, 0, 0
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        result = generate(adapter, prompt, config, proposer)
        seconds += time.perf_counter() - t0
        tokens += len(result.output_ids)
        accepted += sum(result.accept_lengths)
        steps += len(result.accept_lengths)
        if report is not None and report(i, seconds / max(1, tokens)):
            break
    return seconds / max(1, tokens), accepted / max(1, steps)


@torch.inference_mode()
def skip_agreement(adapter: ModelAdapter, sequences: Sequence[torch.Tensor], starts: Sequence[int],
                   skip: SkipSet) -> float:
    """How often the skip set's next token equals the full model's along ``sequences`` (teacher-forced, from
    position ``starts[i] - 1`` on): the draft's per-token acceptance under greedy verification."""
    hits = total = 0
    for seq, start in zip(sequences, starts):
        ids = seq[None].to(adapter.device)
        rows = slice(max(0, start - 1), ids.shape[1] - 1)
        full = adapter.forward(ids).logits[0, rows].argmax(-1)
        draft = adapter.forward(ids, skip_attention=skip.attention, skip_mlp=skip.mlp).logits[0, rows].argmax(-1)
        hits += int((draft == full).sum())
        total += full.numel()
    return hits / max(1, total)


@torch.inference_mode()
def sublayer_seconds(adapter: ModelAdapter, prefix_tokens: int = 64, repeats: int = 5) -> dict[str, float]:
    """Seconds one decoding token spends in each sublayer (``attn_<i>``, ``mlp_<i>``) and in a whole step (``full``).

    The layers of a decoder share one shape, so a kind's sublayers cost alike: ``attn_<i> = (full - t(every attention
    skipped)) / L`` and likewise for the MLPs (fastest of ``repeats``, round-robin). Timing each sublayer alone would
    leave a difference of ~1/L of a step inside the step's own noise, and summing the positive parts of 2L noisy
    differences overstates what a skip set saves (on SmolLM2 beside other jobs: a predicted 1.5x, measured 0.64x)."""
    from draftsmith.inference.evaluation.cost import _seconds

    ids = torch.randint(0, adapter.vocab_size, (1, prefix_tokens + 1), generator=torch.Generator().manual_seed(0))
    ids = ids.to(adapter.device)
    cache = adapter.new_cache(capacity=prefix_tokens + 8)
    adapter.forward(ids[:, :prefix_tokens], cache, compute_logits=False)
    every = list(range(adapter.num_layers))
    variants = {"full": {}, "attn": {"skip_attention": every}, "mlp": {"skip_mlp": every}}
    best = {k: float("inf") for k in variants}

    def step(kwargs: dict) -> None:
        adapter.forward(ids[:, prefix_tokens:], cache, **kwargs)
        cache.crop(prefix_tokens)

    for r in range(1 + repeats):
        for name, kwargs in variants.items():
            seconds = _seconds(lambda k=kwargs: step(k), adapter.device)
            if r:
                best[name] = min(best[name], seconds)
    full = best["full"]
    each = {kind: max(0.0, full - best[kind]) / adapter.num_layers for kind in ("attn", "mlp")}
    return {"full": full} | {f"{kind}_{i}": each[kind] for kind in ("attn", "mlp") for i in every}


def predicted_seconds_per_token(agreement: float, skip: SkipSet, costs: dict[str, float], verify: dict[int, float],
                                max_length: int) -> float:
    """The noise-free objective: seconds per generated token at the best draft length, from the skip set's
    agreement ``a`` and its draft cost ``c = full - sum of the skipped sublayers' costs``::

        tau(k) = (1 - a^(k+1)) / (1 - a),    seconds per token = min_k (k c + V(k + 1)) / tau(k)"""
    from draftsmith.inference.evaluation.cost import CostModel

    curve = CostModel(verify_seconds=verify)
    draft = costs["full"] - sum(costs[f"attn_{i}"] for i in skip.attention) - sum(costs[f"mlp_{i}"] for i in skip.mlp)
    draft = max(draft, 0.05 * costs["full"])
    a = min(agreement, 1.0 - 1e-9)
    return min((k * draft + curve.verify(k + 1)) / ((1.0 - a ** (k + 1)) / (1.0 - a)) for k in range(1, max_length + 1))


def search(target, prompts: Sequence[torch.Tensor], storage: str, n_trials: int, settings: SearchSettings,
           timeout: float | None = None, eos: Sequence[int] = (), progress: bool = True):
    """Run (or continue) the study in ``storage`` until it holds ``n_trials`` finished trials; returns the study.
    ``settings.objective``: ``measured`` seconds per token (default), or ``predicted`` from teacher-forced agreement
    along the target's greedy answers to ``prompts`` and measured sublayer costs."""
    import optuna

    adapter = ModelAdapter(target)
    if settings.objective == "predicted":
        from draftsmith.inference.evaluation.cost import measure_verify_curve

        config = GenerationConfig(max_new_tokens=settings.max_new_tokens, eos_token_ids=tuple(eos))
        sequences = [torch.cat([p, torch.tensor(generate(adapter, p, config).output_ids, dtype=torch.long)])
                     for p in prompts]
        starts = [p.numel() for p in prompts]
        costs = sublayer_seconds(adapter)
        verify = measure_verify_curve(adapter, sizes=range(1, settings.draft_length + 2))
    layers = adapter.num_layers
    variables = search_space(layers, settings.pin_ends)
    sampler = optuna.samplers.TPESampler(seed=settings.seed) if settings.sampler == "tpe" else \
        optuna.samplers.RandomSampler(seed=settings.seed)
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="minimize", sampler=sampler,
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=5,
                                                                   n_warmup_steps=max(0, len(prompts) // 2 - 1)),
                                load_if_exists=True)
    done = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    left = max(0, n_trials - len(done))

    def objective(trial) -> float:
        params = {name: trial.suggest_categorical(name, [False, True]) for name in variables}
        skip = skip_set_of(params, layers)

        def report(i: int, value: float) -> bool:
            trial.report(value, i)
            return trial.should_prune()

        if settings.objective == "predicted":
            agreement = skip_agreement(adapter, sequences, starts, skip) if not skip.empty() else 0.0
            value = predicted_seconds_per_token(agreement, skip, costs, verify, settings.draft_length) \
                if not skip.empty() else verify[1]
            trial.set_user_attr("agreement", agreement)
            trial.set_user_attr("skip", skip.to_dict())
            return value
        value, tau = seconds_per_token(adapter, prompts, skip, settings, eos, report)
        trial.set_user_attr("tau", tau)
        trial.set_user_attr("skip", skip.to_dict())
        if trial.should_prune():
            raise optuna.TrialPruned()
        return value

    if left:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study.optimize(objective, n_trials=left, timeout=timeout, show_progress_bar=progress, gc_after_trial=False)
    return study


def best_skip_set(study, num_layers: int) -> SkipSet:
    return skip_set_of(study.best_trial.params, num_layers)


def study_summary(study, num_layers: int, top: int = 5) -> dict:
    """The study's best trials and counts, JSON-ready (for the artefact's manifest)."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    best = sorted(complete, key=lambda t: t.value)[:top]
    return {"trials": len(study.trials), "complete": len(complete), "pruned": len(pruned),
            "best": [{"number": t.number, "seconds_per_token": t.value, "tau": t.user_attrs.get("tau"),
                      **skip_set_of(t.params, num_layers).to_dict()} for t in best],
            "history": [t.value for t in complete]}


__all__ = ["OBJECTIVES", "SAMPLERS", "predicted_seconds_per_token", "skip_agreement", "sublayer_seconds", "SearchSettings", "SkipSet", "baselines", "best_skip_set", "proposer_for", "search", "search_space",
           "seconds_per_token", "skip_set_of", "study_summary"]
