"""The method registry: one place that maps a method name to everything the rest of draftsmith needs of it.

An entry (:class:`MethodSpec`) names the method's config dataclass, its trainer, the models it starts from, the
kind of artefact it writes, the function that builds its proposer (from an artefact, or from command-line
options for training-free methods) and its evaluation defaults. ``draftsmith eval --method/--artefact``,
artefact loading and the recipe runner (``draftsmith.launch.recipe``) read it; nothing else lists methods.

Entries refer to code by dotted path (``"draftsmith.trainers.distillspec:DistillSpecTrainer"``) so that the
registry, at the bottom layer, imports nothing above it; the path is imported only when the entry is used.
A callable or class works too (tests and plugins register objects directly)::

    with registered(MethodSpec(name="toy", ...)):          # for the block only
        run_recipe("toy", [...])

The registry is a process-wide table on purpose (like transformers' ``AutoConfig.register``): a method added
with :func:`register` is visible to every command in the process; :func:`registered` removes it again.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from draftsmith.common.errors import ConfigError

# What an artefact directory holds besides manifest.json (DESIGN.md "Artefact kinds").
ARTEFACT_KINDS = {
    "draft_model": "a plain Hugging Face draft model directory (draft/)",
    "heads": "head weights in safetensors (heads.safetensors) plus their config",
    "lora_adapter": "a peft LoRA adapter of the target (adapter/) plus the decoding settings",
    "adapted_target": "the full adapted target (model/) plus the decoding settings",
    "embeddings": "tuned embeddings only (embeddings.safetensors)",
    "none": "no weights: the decoding settings alone (e.g. a searched skip set)",
}
MODEL_ROLES = ("target", "draft")

Ref = Any  # "package.module:attribute" or the object itself


def resolve(ref: Ref) -> Any:
    """The object a registry reference names (imports ``module`` for ``"module:attribute"``)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    if not attr:
        raise ConfigError(f"registry reference {ref!r} must read 'package.module:attribute'")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class MethodSpec:
    """Everything draftsmith needs to train, save, load and evaluate one method.

    ``proposer`` is called as ``proposer(ctx)`` with a :class:`draftsmith.inference.methods.ProposerContext`
    (target, tokenizer, artefact directory and manifest or None, command-line options, draft model if any)
    and returns the proposer (None = plain AR). ``trainable`` (trained methods) is called as
    ``trainable(models, config)`` with the loaded models by role (and ``train_dataset=`` the tokenized training
    set, when its signature takes it) and returns the module the trainer optimises (default: the draft model). ``eval_defaults`` fill the options neither the command line nor the artefact
    set."""

    name: str
    summary: str
    proposer: Ref
    artefact_kind: str = "none"
    config: Ref | None = None  # the method's config dataclass (trained methods)
    trainer: Ref | None = None  # a FrozenTargetTrainer subclass (trained methods)
    models: tuple[str, ...] = ("target",)  # roles the recipe loads; "draft" = a separate draft model
    trainable: Ref | None = None
    eval_defaults: dict[str, Any] = field(default_factory=dict)
    eval_method: bool = False  # runnable as `draftsmith eval --method NAME` with no artefact

    def __post_init__(self) -> None:
        if self.artefact_kind not in ARTEFACT_KINDS:
            raise ConfigError(f"method {self.name!r}: artefact_kind={self.artefact_kind!r} is unknown: choose one of "
                              f"{', '.join(ARTEFACT_KINDS)}")
        bad = [r for r in self.models if r not in MODEL_ROLES]
        if bad or "target" not in self.models:
            raise ConfigError(f"method {self.name!r}: models={self.models!r} must include 'target' and may add 'draft'")
        if (self.config is None) != (self.trainer is None):
            raise ConfigError(f"method {self.name!r}: give both config and trainer (a trained method) or neither")

    @property
    def trained(self) -> bool:
        return self.trainer is not None


def _builtin() -> dict[str, MethodSpec]:
    inference = "draftsmith.inference.methods"
    return {
        spec.name: spec
        for spec in (
            MethodSpec(name="ar", summary="plain autoregressive decoding (the reference)", proposer=f"{inference}:no_proposer",
                       eval_method=True),
            MethodSpec(name="draft", summary="a separate draft model, untrained (Leviathan et al. 2023)",
                       proposer=f"{inference}:draft_model_proposer", artefact_kind="draft_model",
                       models=("target", "draft"), eval_method=True,
                       eval_defaults={"draft_length": 4, "draft_length_mode": "fixed", "confidence_threshold": 0.4}),
            MethodSpec(name="pld", summary="prompt lookup decoding (training-free n-gram copying)",
                       proposer=f"{inference}:prompt_lookup_proposer", eval_method=True,
                       eval_defaults={"pld_tokens": 24, "pld_max_ngram": 4, "pld_min_ngram": 2,
                                      "pld_length": "cost", "pld_threshold": 0.15}),
            MethodSpec(name="early-exit", summary="the target's first E layers draft for it, verified by the rest "
                       "with the draft's cache reused (LayerSkip, Elhoushi et al. 2024)",
                       proposer=f"{inference}:early_exit_proposer", eval_method=True,
                       eval_defaults={"draft_length": 4, "draft_length_mode": "fixed"}),
            MethodSpec(name="layerskip", summary="layer dropout and early-exit losses so the target drafts with its "
                       "first layers (LayerSkip, Elhoushi et al. 2024)",
                       proposer=f"{inference}:early_exit_proposer", artefact_kind="adapted_target",
                       config="draftsmith.trainers.layerskip:LayerSkipConfig",
                       trainer="draftsmith.trainers.layerskip:LayerSkipTrainer",
                       trainable="draftsmith.trainers.layerskip:build_layerskip_model",
                       eval_defaults={"draft_length": 4, "draft_length_mode": "fixed"}),
            MethodSpec(name="draft-verify", summary="the target drafts with searched attention/MLP sublayers skipped "
                       "(Draft & Verify, Zhang et al. 2023)", proposer=f"{inference}:skip_layer_proposer",
                       artefact_kind="none", eval_method=True, eval_defaults={"draft_length": 8}),
            MethodSpec(name="distillspec", summary="a draft model distilled into its target (Zhou et al. 2023)",
                       proposer=f"{inference}:draft_model_proposer", artefact_kind="draft_model",
                       models=("target", "draft"), config="draftsmith.trainers.distillspec:DistillSpecConfig",
                       trainer="draftsmith.trainers.distillspec:DistillSpecTrainer",
                       trainable="draftsmith.trainers.distillspec:build_draft",
                       eval_defaults={"draft_length": 4, "draft_length_mode": "fixed", "confidence_threshold": 0.4}),
            MethodSpec(name="medusa", summary="Medusa-1 heads on the frozen target, static token tree (Cai et al. 2024)",
                       proposer=f"{inference}:medusa_proposer", artefact_kind="heads",
                       config="draftsmith.trainers.medusa:MedusaConfig",
                       trainer="draftsmith.trainers.medusa:MedusaTrainer",
                       trainable="draftsmith.trainers.medusa:build_heads",
                       eval_defaults={"tree": "auto", "tree_nodes": 32}),
            MethodSpec(name="eagle", summary="EAGLE-1 feature-level draft head on the frozen target (Li et al. 2024)",
                       proposer=f"{inference}:eagle_proposer", artefact_kind="heads",
                       config="draftsmith.trainers.eagle:EagleConfig",
                       trainer="draftsmith.trainers.eagle:EagleTrainer",
                       trainable="draftsmith.trainers.eagle:build_eagle_head",
                       eval_defaults={"tree": "dynamic", "tree_depth": 5, "tree_top_k": 8, "tree_nodes": 32,
                                      "draft_length": 5}),
            MethodSpec(name="bita", summary="prompt and mask tokens tuned on the frozen target, which drafts and verifies "
                       "in one forward (BiTA, Lin et al. 2024); without an artefact: untrained embeddings",
                       proposer=f"{inference}:bita_proposer", artefact_kind="embeddings",
                       config="draftsmith.trainers.bita:BitaConfig", trainer="draftsmith.trainers.bita:BitaTrainer",
                       trainable="draftsmith.trainers.bita:build_bita", eval_method=True,
                       eval_defaults={"tree": "chain", "tree_top_k": 5}),
            MethodSpec(name="jacobi", summary="Jacobi decoding: the target refines a guess of the next block in the "
                       "forward that verifies it (Santilli et al. 2023)", proposer=f"{inference}:jacobi_proposer",
                       eval_method=True, eval_defaults={"draft_length": 16}),
            MethodSpec(name="cllm", summary="consistency training on the target's Jacobi trajectories so Jacobi decoding "
                       "converges in few steps (CLLM, Kou et al. 2024)", proposer=f"{inference}:jacobi_proposer",
                       artefact_kind="adapted_target", config="draftsmith.trainers.cllm:CllmConfig",
                       trainer="draftsmith.trainers.cllm:CllmTrainer",
                       trainable="draftsmith.trainers.cllm:build_cllm_model", eval_defaults={"draft_length": 16}),
        )
    }


class Registry:
    """Method name -> :class:`MethodSpec`."""

    def __init__(self, specs: dict[str, MethodSpec] | None = None) -> None:
        self._specs: dict[str, MethodSpec] = dict(_builtin() if specs is None else specs)

    def names(self, *, eval_method: bool | None = None, trained: bool | None = None) -> list[str]:
        return [n for n, s in self._specs.items()
                if (eval_method is None or s.eval_method == eval_method) and (trained is None or s.trained == trained)]

    def get(self, name: str) -> MethodSpec:
        if name not in self._specs:
            raise ConfigError(f"method {name!r} is not known to this draftsmith (known: {', '.join(self._specs)}): "
                              "check the name, or upgrade draftsmith")
        return self._specs[name]

    def register(self, spec: MethodSpec, replace: bool = False) -> None:
        if spec.name in self._specs and not replace:
            raise ConfigError(f"method {spec.name!r} is already registered: pick another name, or pass replace=True")
        self._specs[spec.name] = spec

    def unregister(self, name: str) -> None:
        self._specs.pop(name, None)


REGISTRY = Registry()


def get_method(name: str) -> MethodSpec:
    return REGISTRY.get(name)


def register(spec: MethodSpec, replace: bool = False) -> None:
    """Add a method to the process-wide registry."""
    REGISTRY.register(spec, replace)


@contextlib.contextmanager
def registered(spec: MethodSpec) -> Iterator[MethodSpec]:
    """Register ``spec`` for the block, then remove it."""
    REGISTRY.register(spec)
    try:
        yield spec
    finally:
        REGISTRY.unregister(spec.name)


