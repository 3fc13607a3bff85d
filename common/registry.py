"""The method registry: one place that maps a method name to everything the rest of draftsmith needs of it.

A method declares itself in its own package: a :class:`MethodSpec` of real objects (its config dataclass, trainer,
trainable-module builder, proposer builder, exporters, decoding options, serving-engine counterpart, memory shape),
``SPEC`` in ``draftsmith.trainers.<name>.spec`` for a trained method, in ``draftsmith.inference.methods.<name>`` for a
training-free one. One composition root, :data:`CATALOGUE` (``draftsmith.launch.methods``), lists the specs; the
registry reads it the first time a method is looked up, so this bottom layer imports nothing above it and no shared
module names a method. ``draftsmith eval``, artefact loading, the recipe runner, ``draftsmith tune`` and
``draftsmith memory`` read the entries. A method's own command-line modules (``commands``, ``data_commands``,
``train``) are named by module path: they live in the command line above every spec.

Tests and plugins register objects directly::

    with registered(MethodSpec(name="toy", ...)):          # for the block only
        run_recipe("toy", [...])

The registry is a process-wide table on purpose (like transformers' ``AutoConfig.register``): a method added
with :func:`register` is visible to every command in the process; :func:`registered` removes it again.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import EvalOption, merge_options

CATALOGUE = "draftsmith.launch.methods"  # the composition root: its SPECS list every built-in method

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

Ref = Any  # "package.module:attribute" (a command-line module) or the object itself


def resolve(ref: Ref) -> Any:
    """The object a command-line reference names (imports ``module`` for ``"module:attribute"``)."""
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
    whose artefact comes from a search, not a trainer). ``memory`` maps the method's variants to
    ``shape(target, draft) -> MemoryShape`` (``draftsmith.trainers.memory``) for ``draftsmith memory``;
    ``calibrated_tree`` says ``draftsmith tune`` calibrates its static or dynamic tree, ``chain_options`` the decoding
    settings of the chain that calibration measures. ``default_config`` names the config (shipped with draftsmith,
    ``launch/configs/recipes``, found by name) ``draftsmith train NAME`` runs without ``--config``; ``config_defaults``
    are settings a variant fixes over its config's defaults (P-EAGLE: ``variant: peagle``)."""

    name: str
    summary: str
    proposer: Callable
    artefact_kind: str = "none"
    config: type | None = None  # the method's config dataclass (trained methods)
    trainer: type | None = None  # a FrozenTargetTrainer subclass (trained methods)
    models: tuple[str, ...] = ("target",)  # roles the recipe loads; "draft" = a separate draft model
    trainable: Callable | None = None
    eval_options: tuple[EvalOption, ...] = ()  # the proposer's decoding settings (`draftsmith eval` flags)
    eval_method: bool = False  # runnable as `draftsmith eval --method NAME` with no artefact
    eval_default: bool = False  # what `draftsmith eval` runs with neither --method nor --artefact (one method)
    # export format -> exporter(artefact_dir, manifest, fmt, out, target_model) -> Path (`draftsmith export`)
    export_formats: dict[str, Callable] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)  # `draftsmith NAME` -> module with add_parser(sub)
    data_commands: dict[str, str] = field(default_factory=dict)  # `draftsmith data NAME` -> module with add_parser
    train: Ref | None = None  # main(argv) -> int for `draftsmith train NAME` when the method has no trainer
    # serving engine -> EngineSetup -> EngineMethod (`draftsmith eval --engine`; draftsmith.inference.engines.vllm)
    engine_configs: dict[str, Callable] = field(default_factory=dict)
    memory: dict[str, Callable] = field(default_factory=dict)  # variant -> shape(target, draft) (`draftsmith memory`)
    calibrated_tree: bool = False  # `draftsmith tune` calibrates its tree after training
    chain_options: Callable[[int], dict] | None = None  # depth -> the chain's settings tree calibration measures
    default_config: str | None = None  # the shipped config `draftsmith train NAME` runs without --config
    config_defaults: dict[str, Any] = field(default_factory=dict)  # a variant's settings over its config's defaults

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


class Registry:
    """Method name -> :class:`MethodSpec`."""

    def __init__(self, specs: dict[str, MethodSpec] | None = None) -> None:
        self._given = None if specs is None else dict(specs)
        self._table: dict[str, MethodSpec] | None = None

    @property
    def _specs(self) -> dict[str, MethodSpec]:
        """The table: the given specs, else the composition root's (:data:`CATALOGUE`), read on first use."""
        if self._table is None:
            specs = self._given if self._given is not None else \
                {s.name: s for s in importlib.import_module(CATALOGUE).SPECS}
            self._table = dict(specs)
        return self._table

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


def export_formats() -> dict[str, tuple[str, ...]]:
    """Every export format the registered methods offer -> the methods whose artefacts it exports."""
    found: dict[str, tuple[str, ...]] = {}
    for name in REGISTRY.names():
        for fmt in REGISTRY.get(name).export_formats:
            found[fmt] = (*found.get(fmt, ()), name)
    return found


def default_method() -> str:
    """The method ``draftsmith eval`` runs with neither ``--method`` nor ``--artefact`` (the one ``eval_default``)."""
    found = [n for n in REGISTRY.names() if REGISTRY.get(n).eval_default]
    if len(found) != 1:
        raise ConfigError(f"exactly one method may be eval_default, found {found or 'none'}")
    return found[0]


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


