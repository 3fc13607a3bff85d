"""Draft & Verify's search (Zhang et al. 2023) with Optuna: which attention and MLP sublayers the target skips
while it drafts for itself, so that self-speculative decoding is fastest.

The study has one boolean per sublayer (``attn_<i>``, ``mlp_<i>``; the first and last layers pinned to run, as in
the paper, unless ``pin_ends=False``), TPE by default (``random`` selectable), seeded. A trial's objective is the
*measured* seconds per generated token of self-speculative decoding with that skip set (the
:class:`~draftsmith.inference.proposers.self_spec.SkipLayerProposer` with adaptive draft-exiting) over the
calibration prompts, greedy; after each prompt the running value is reported, so a trial whose first prompts are
hopeless is pruned (median pruner). A skip set that skips nothing is scored as plain decoding. The study lives in
an SQLite file (``storage``), so a killed search rerun continues it (finished trials are kept and not repeated)
and ``optuna-dashboard sqlite:///.../study.db`` shows it as it is.

The baselines the search is compared against are measured the same way: every other layer skipped, and the last
half of the layers skipped (an untrained early exit at ``L/2``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.adapter import ModelAdapter
from draftsmith.inference.draft_length import DraftLengthPolicy
from draftsmith.inference.generate import GenerationConfig, generate
from draftsmith.inference.proposers.self_spec import AdaptiveThreshold, SkipLayerProposer

SAMPLERS = ("tpe", "random")
STUDY = "draftsmith-layer-skip"


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
    draft_length: int = 8  # the longest draft; adaptive draft-exiting usually stops earlier
    max_new_tokens: int = 48
    pin_ends: bool = True
    sampler: str = "tpe"
    seed: int = 0
    threshold: dict = field(default_factory=lambda: AdaptiveThreshold().to_dict())

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"sampler {self.sampler!r} is unknown: choose one of {', '.join(SAMPLERS)}")
        if self.draft_length < 1 or self.max_new_tokens < 1:
            raise ConfigError("draft_length and max_new_tokens must be >= 1")


def skip_set_of(params: dict[str, bool], num_layers: int) -> SkipSet:
    """A trial's parameters as a skip set."""
    return SkipSet(tuple(i for i in range(num_layers) if params.get(f"attn_{i}", False)),
                   tuple(i for i in range(num_layers) if params.get(f"mlp_{i}", False)))


def baselines(num_layers: int) -> dict[str, SkipSet]:
    """Every other layer (1, 3, 5, ...) and the last half, both sublayers of each."""
    every_other = tuple(range(1, num_layers, 2))
    last_half = tuple(range(num_layers // 2, num_layers))
    return {"every_other_layer": SkipSet(every_other, every_other), "last_half": SkipSet(last_half, last_half)}


def proposer_for(skip: SkipSet, settings: SearchSettings) -> SkipLayerProposer | None:
    if skip.empty():
        return None
    return SkipLayerProposer(skip_attention=skip.attention, skip_mlp=skip.mlp,
                             policy=DraftLengthPolicy(length=settings.draft_length, max_length=settings.draft_length),
                             stop=AdaptiveThreshold(**settings.threshold))


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


def search(target, prompts: Sequence[torch.Tensor], storage: str, n_trials: int, settings: SearchSettings,
           timeout: float | None = None, eos: Sequence[int] = (), progress: bool = True):
    """Run (or continue) the study in ``storage`` until it holds ``n_trials`` finished trials; returns the study."""
    import optuna

    adapter = ModelAdapter(target)
    layers = adapter.num_layers
    free = range(1, layers - 1) if settings.pin_ends and layers > 2 else range(layers)
    sampler = optuna.samplers.TPESampler(seed=settings.seed) if settings.sampler == "tpe" else \
        optuna.samplers.RandomSampler(seed=settings.seed)
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="minimize", sampler=sampler,
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0),
                                load_if_exists=True)
    done = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    left = max(0, n_trials - len(done))

    def objective(trial) -> float:
        params = {f"{kind}_{i}": trial.suggest_categorical(f"{kind}_{i}", [False, True])
                  for i in free for kind in ("attn", "mlp")}
        skip = skip_set_of(params, layers)

        def report(i: int, value: float) -> bool:
            trial.report(value, i)
            return trial.should_prune()

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


__all__ = ["SAMPLERS", "SearchSettings", "SkipSet", "baselines", "best_skip_set", "proposer_for", "search",
           "seconds_per_token", "skip_set_of", "study_summary"]
