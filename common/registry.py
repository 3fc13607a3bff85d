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
from draftsmith.common.eval_options import (
    DRAFT_LENGTH,
    SEED,
    TREE,
    TREE_CALIBRATION,
    TREE_NODES,
    TREE_TOP_K,
    EvalOption,
    draft_model_options,
    merge_options,
    self_drafting_options,
)

# What an artefact directory holds besides manifest.json (docs/ARCHITECTURE.md; docs/EXPORT.md for the exports).
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
    set, ``tokenizer=`` the target's tokenizer, when its signature takes them) and returns the module the trainer
    optimises (default: the draft model).
    ``eval_options`` declare the proposer's decoding settings (:mod:`draftsmith.common.eval_options`): ``draftsmith
    eval`` makes its method flags from them and ``ProposerContext.option`` resolves each (command line, else the
    artefact's, else the declared default). ``export_formats`` name the ``draftsmith export`` formats of the
    method's artefacts and their exporters; ``commands`` the method's own ``draftsmith`` subcommands (name -> module
    with ``add_parser(subparsers)``), ``data_commands`` its ``draftsmith data`` actions (the same protocol), and
    ``train`` a ``main(argv) -> int`` that ``draftsmith train NAME`` runs instead of the recipe runner (methods
    whose artefact comes from a search, not a trainer)."""

    name: str
    summary: str
    proposer: Ref
    artefact_kind: str = "none"
    config: Ref | None = None  # the method's config dataclass (trained methods)
    trainer: Ref | None = None  # a FrozenTargetTrainer subclass (trained methods)
    models: tuple[str, ...] = ("target",)  # roles the recipe loads; "draft" = a separate draft model
    trainable: Ref | None = None
    eval_options: tuple[EvalOption, ...] = ()  # the proposer's decoding settings (`draftsmith eval` flags)
    eval_method: bool = False  # runnable as `draftsmith eval --method NAME` with no artefact
    # export format -> exporter(artefact_dir, manifest, fmt, out, target_model) -> Path (`draftsmith export`)
    export_formats: dict[str, Ref] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)  # `draftsmith NAME` -> module with add_parser(sub)
    data_commands: dict[str, str] = field(default_factory=dict)  # `draftsmith data NAME` -> module with add_parser
    train: Ref | None = None  # main(argv) -> int for `draftsmith train NAME` when the method has no trainer
    # serving engine -> EngineSetup -> EngineMethod (`draftsmith eval --engine`; draftsmith.inference.engines.vllm)
    engine_configs: dict[str, Ref] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.artefact_kind not in ARTEFACT_KINDS:
            raise ConfigError(f"method {self.name!r}: artefact_kind={self.artefact_kind!r} is unknown: choose one of "
                              f"{', '.join(ARTEFACT_KINDS)}")
        bad = [r for r in self.models if r not in MODEL_ROLES]
        if bad or "target" not in self.models:
            raise ConfigError(f"method {self.name!r}: models={self.models!r} must include 'target' and may add 'draft'")
        if (self.config is None) != (self.trainer is None):
            raise ConfigError(f"method {self.name!r}: give both config and trainer (a trained method) or neither")
        names = [o.name for o in self.eval_options]
        if len(set(names)) != len(names):
            raise ConfigError(f"method {self.name!r}: evaluation options declared twice: {sorted(names)}")

    @property
    def trained(self) -> bool:
        return self.trainer is not None

    @property
    def trainable_by_command(self) -> bool:
        """``draftsmith train NAME`` runs it: the recipe runner (a trainer) or the method's own ``train``."""
        return self.trained or self.train is not None

    def option_declarations(self) -> dict[str, EvalOption]:
        return {o.name: o for o in self.eval_options}


# -- method-specific evaluation options (the shared ones: draftsmith.common.eval_options) ------------------------

PROMPT_LOOKUP_OPTIONS = (
    EvalOption("pld_tokens", int, 24, metavar="N", help="prompt lookup: longest draft, tokens copied per step"),
    EvalOption("pld_max_ngram", int, 4, metavar="N", help="prompt lookup: longest n-gram matched, tried first"),
    EvalOption("pld_min_ngram", int, 2, metavar="N",
               help="prompt lookup: shortest n-gram matched (1 also copies after a lone matching token)"),
    EvalOption("pld_length", str, "cost", choices=("adaptive", "fixed", "cost"),
               help="prompt lookup: from how often copies are accepted, the draft size that commits the most tokens "
                    "per second on the target's verification cost, measured at the start (cost), or the longest draft "
                    "whose copies stay above --pld-threshold (adaptive), or always --pld-tokens (fixed)"),
    EvalOption("pld_threshold", float, 0.15, metavar="P",
               help="prompt lookup, --pld-length adaptive: draft a copied token (a tree node) only while its estimated "
                    "chance of acceptance is at least P (lower where verifying more tokens is cheap, e.g. on a GPU)"),
    TREE.default_to("chain"),
)
EXIT_LAYER = EvalOption("exit_layer", int, metavar="E",
                        help="early exit: draft with the target's first E layers (LayerSkip self-speculation; a "
                             "LayerSkip artefact's chosen E, else a quarter of the layers)")
SKIP_ATTENTION = EvalOption("skip_attention", str, metavar="L,L",
                            help="draft-verify: the layers whose attention the draft skips (e.g. 1,3,5)")
SKIP_MLP = EvalOption("skip_mlp", str, metavar="L,L", help="draft-verify: the layers whose MLP the draft skips")
ADAPTIVE_THRESHOLD = EvalOption("threshold", dict, flag=None)  # the searched artefact's adaptive-exit rule
THRESHOLD_RULE = EvalOption("threshold_rule", str, choices=("reference", "unsmoothed"),
                            help="draft-verify: the adaptive draft-exiting rule: reference (the reference code's: "
                                 "threshold from 0.8 towards acceptance 0.9, both smoothed, held after a full-length "
                                 "draft) or unsmoothed (draftsmith's earlier rule: from 0.6 towards 0.8, whole steps); "
                                 "unset: the artefact's rule, else reference")
MEDUSA_OPTIONS = (
    TREE.default_to("auto"), TREE_NODES.default_to(32), TREE_CALIBRATION,
    EvalOption("acceptance", str, "exact", choices=("exact", "typical"),
               help="head drafters: exact (lossless) or typical (Medusa's typical acceptance: the longest candidate "
                    "whose tokens pass p > min(E, D exp(-entropy)), ties by likelihood, then the target's argmax; "
                    "LOSSY under sampling, labelled so in the report)"),
    EvalOption("typical_epsilon", float, 0.09, metavar="E",
               help="typical acceptance: epsilon, the hard probability threshold"),
    EvalOption("typical_delta", float, metavar="D",
               help="typical acceptance: delta, the entropy-scaled threshold (unset: sqrt(epsilon), the reference's "
                    "recommendation, 0.3 at epsilon 0.09)"),
)
EAGLE_OPTIONS = (
    TREE.default_to("dynamic"), TREE_NODES.default_to(32), DRAFT_LENGTH.default_to(5), TREE_TOP_K.default_to(8),
    TREE_CALIBRATION,
    EvalOption("tree_depth", int, 5, metavar="D", help="eagle --tree dynamic: levels the head expands"),
)


def _builtin() -> dict[str, MethodSpec]:
    inference = "draftsmith.inference.methods"
    engines = "draftsmith.inference.engines.vllm"
    return {
        spec.name: spec
        for spec in (
            MethodSpec(name="ar", summary="plain autoregressive decoding (the reference)", proposer=f"{inference}:no_proposer",
                       eval_method=True),
            MethodSpec(name="draft", summary="a separate draft model, untrained (Leviathan et al. 2023)",
                       engine_configs={"vllm": f"{engines}:draft_model"},
                       proposer=f"{inference}:draft_model_proposer", artefact_kind="draft_model",
                       models=("target", "draft"), eval_method=True,
                       eval_options=draft_model_options(length=4, confidence=0.4)),
            MethodSpec(name="pld", summary="prompt lookup decoding (training-free n-gram copying)",
                       engine_configs={"vllm": f"{engines}:ngram"},
                       proposer=f"{inference}:prompt_lookup_proposer", eval_method=True,
                       eval_options=PROMPT_LOOKUP_OPTIONS),
            MethodSpec(name="early-exit", summary="the target's first E layers draft for it, verified by the rest "
                       "with the draft's cache reused (LayerSkip, Elhoushi et al. 2024)",
                       proposer=f"{inference}:early_exit_proposer", eval_method=True,
                       eval_options=(EXIT_LAYER, *self_drafting_options(4))),
            MethodSpec(name="layerskip", summary="layer dropout and early-exit losses so the target drafts with its "
                       "first layers (LayerSkip, Elhoushi et al. 2024)",
                       proposer=f"{inference}:early_exit_proposer", artefact_kind="adapted_target",
                       config="draftsmith.trainers.layerskip:LayerSkipConfig",
                       trainer="draftsmith.trainers.layerskip:LayerSkipTrainer",
                       trainable="draftsmith.trainers.layerskip:build_layerskip_model",
                       commands={"exit-layer": "draftsmith.launch.exit_cli"},
                       eval_options=(EXIT_LAYER, *self_drafting_options(4))),
            MethodSpec(name="draft-verify", summary="the target drafts with searched attention/MLP sublayers skipped "
                       "(Draft & Verify, Zhang et al. 2023)", proposer=f"{inference}:draft_verify_proposer",
                       artefact_kind="none", eval_method=True,
                       eval_options=(SKIP_ATTENTION, SKIP_MLP, DRAFT_LENGTH.default_to(8), ADAPTIVE_THRESHOLD,
                                     THRESHOLD_RULE),
                       train="draftsmith.launch.draft_verify:main"),
            MethodSpec(name="distillspec", summary="a draft model distilled into its target (Zhou et al. 2023)",
                       engine_configs={"vllm": f"{engines}:draft_model"},
                       proposer=f"{inference}:draft_model_proposer", artefact_kind="draft_model",
                       models=("target", "draft"), config="draftsmith.trainers.distillspec:DistillSpecConfig",
                       trainer="draftsmith.trainers.distillspec:DistillSpecTrainer",
                       trainable="draftsmith.trainers.distillspec:build_draft",
                       eval_options=draft_model_options(length=4, confidence=0.4)),
            MethodSpec(name="medusa", summary="Medusa-1 heads on the frozen target, static token tree (Cai et al. 2024)",
                       proposer=f"{inference}:medusa_proposer", artefact_kind="heads",
                       config="draftsmith.trainers.medusa:MedusaConfig",
                       trainer="draftsmith.trainers.medusa:MedusaTrainer",
                       trainable="draftsmith.trainers.medusa:build_heads",
                       export_formats={"vllm-medusa": "draftsmith.inference.artefacts.medusa:export_medusa_artefact"},
                       engine_configs={"vllm": f"{engines}:medusa"},
                       eval_options=MEDUSA_OPTIONS),
            MethodSpec(name="eagle", summary="EAGLE-1 feature-level draft head on the frozen target (Li et al. 2024)",
                       proposer=f"{inference}:eagle_proposer", artefact_kind="heads",
                       config="draftsmith.trainers.eagle:EagleConfig",
                       trainer="draftsmith.trainers.eagle:EagleTrainer",
                       trainable="draftsmith.trainers.eagle:build_eagle_head",
                       export_formats={fmt: "draftsmith.inference.artefacts.eagle:export_eagle_artefact"
                                       for fmt in ("eagle3", "vllm-eagle", "sglang-eagle", "speculators")},
                       engine_configs={"vllm": f"{engines}:eagle"},
                       eval_options=EAGLE_OPTIONS),
            MethodSpec(name="dflash", summary="a block-diffusion draft that fills a block of mask tokens in one forward "
                       "from the target's hidden states (DFlash, Chen et al. 2026)",
                       proposer=f"{inference}:dflash_proposer", artefact_kind="heads",
                       config="draftsmith.trainers.dflash:DFlashConfig",
                       trainer="draftsmith.trainers.dflash:DFlashTrainer",
                       trainable="draftsmith.trainers.dflash:build_dflash",
                       export_formats={"vllm-dflash": "draftsmith.inference.artefacts.dflash:export_dflash_artefact"},
                       engine_configs={"vllm": f"{engines}:dflash"},
                       eval_options=(DRAFT_LENGTH.default_to(0), TREE.default_to("chain"), TREE_NODES.default_to(32),
                                     TREE_CALIBRATION)),
            MethodSpec(name="bita", summary="prompt and mask tokens tuned on the frozen target, which drafts and verifies "
                       "in one forward (BiTA, Lin et al. 2024); without an artefact: untrained embeddings",
                       proposer=f"{inference}:bita_proposer", artefact_kind="embeddings",
                       config="draftsmith.trainers.bita:BitaConfig", trainer="draftsmith.trainers.bita:BitaTrainer",
                       trainable="draftsmith.trainers.bita:build_bita", eval_method=True,
                       eval_options=(TREE.default_to("chain"), TREE_TOP_K.default_to(5), SEED)),
            MethodSpec(name="jacobi", summary="Jacobi decoding: the target refines a guess of the next block in the "
                       "forward that verifies it (Santilli et al. 2023)", proposer=f"{inference}:jacobi_proposer",
                       eval_method=True, eval_options=(DRAFT_LENGTH.default_to(16), SEED)),
            MethodSpec(name="cllm", summary="consistency training on the target's Jacobi trajectories so Jacobi decoding "
                       "converges in few steps (CLLM, Kou et al. 2024)", proposer=f"{inference}:jacobi_proposer",
                       artefact_kind="adapted_target", config="draftsmith.trainers.cllm:CllmConfig",
                       trainer="draftsmith.trainers.cllm:CllmTrainer",
                       trainable="draftsmith.trainers.cllm:build_cllm_model",
                       data_commands={"jacobi": "draftsmith.launch.jacobi_cli"}, eval_options=(DRAFT_LENGTH.default_to(16), SEED)),
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


def eval_flags() -> dict:
    """Every method's command-line evaluation options, one per name (:func:`merge_options`)."""
    return merge_options((name, REGISTRY.get(name).eval_options) for name in REGISTRY.names())


def method_commands(field_name: str = "commands") -> dict[str, str]:
    """The subcommands the registered methods add (``commands``, or ``data_commands`` for ``draftsmith data``):
    name -> module."""
    found: dict[str, str] = {}
    for name in REGISTRY.names():
        for command, module in getattr(REGISTRY.get(name), field_name).items():
            if found.setdefault(command, module) != module:
                raise ConfigError(f"method {name!r} adds the command {command!r}, which another method adds too")
    return found


def export_formats() -> dict[str, str]:
    """Every export format the registered methods offer -> the method whose artefacts it exports."""
    return {fmt: name for name in REGISTRY.names() for fmt in REGISTRY.get(name).export_formats}


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


