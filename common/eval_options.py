"""Evaluation options: the decoding settings a method's proposer takes, declared once in its registry entry.

A method lists its options in ``MethodSpec.eval_options``; from those declarations alone

- ``draftsmith eval`` builds its method flags (:func:`merge_options`: one flag per option name across all methods,
  its help naming each method's default), and
- ``ProposerContext.option`` resolves a value: the command line, else the artefact manifest's ``proposer``
  settings, else the method's declared default.

Options several methods share are defined here once (:data:`DRAFT_LENGTH`, :data:`TREE`, ...) and declared with
the method's own default through :meth:`EvalOption.default_to`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from draftsmith.common.errors import ConfigError

OPTION_TYPES = (int, float, str)


@dataclass(frozen=True)
class EvalOption:
    """One decoding setting of a method's proposer.

    Args:
        name: the setting's name in the manifest's ``proposer`` section and in ``ProposerContext.option``.
        type: ``int``, ``float`` or ``str`` (what the command line parses the value as).
        default: the method's value when neither the command line nor the artefact sets it.
        help: the flag's help text, without the default (``draftsmith eval --help`` appends each method's).
        choices: the values allowed, or None for any value of ``type``.
        flag: the command-line flag; ``""`` = ``--`` + the name with dashes; None = not on the command line (the
            artefact's value or the default only).
        metavar: the flag's metavar in ``--help``.
    """

    name: str
    type: type = str
    default: Any = None
    help: str = ""
    choices: tuple | None = None
    flag: str | None = ""
    metavar: str | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ConfigError(f"evaluation option {self.name!r}: the name must be a Python identifier")
        if self.flag is not None and self.type not in OPTION_TYPES:
            raise ConfigError(f"evaluation option {self.name!r}: a command-line option is an int, float or str")

    @property
    def cli_flag(self) -> str | None:
        return None if self.flag is None else (self.flag or "--" + self.name.replace("_", "-"))

    def default_to(self, default: Any) -> EvalOption:
        """This option with the method's own default."""
        return dataclasses.replace(self, default=default)


def defaults_from(config: type, options: tuple[EvalOption, ...], names: Iterable[str]) -> tuple[EvalOption, ...]:
    """``options`` with the defaults of ``names`` taken from the method's config dataclass (its fields of the same
    names): the config is the one source of a trained method's decoding defaults, which its spec derives."""
    fields = {f.name: f.default for f in dataclasses.fields(config)}
    names = tuple(names)
    missing = [n for n in names if fields.get(n, dataclasses.MISSING) is dataclasses.MISSING]
    unknown = [n for n in names if n not in {o.name for o in options}]
    if missing or unknown:
        raise ConfigError(f"{config.__name__}: no default for {missing} or no option for {unknown}: declare both")
    return tuple(o.default_to(fields[o.name]) if o.name in names else o for o in options)


@dataclass(frozen=True)
class MergedOption:
    """An option name across every method that declares it: one command-line flag."""

    option: EvalOption  # the first declaration (flag, type, help)
    choices: tuple | None
    defaults: dict[str, Any]  # method -> its default

    def help(self) -> str:
        known = {m: d for m, d in self.defaults.items() if d is not None}
        listed = ", ".join(f"{m} {d}" for m, d in known.items())
        return self.option.help + (f" (default: {listed}; or the artefact's)" if listed else " (default: the artefact's)")


def merge_options(declared: Iterable[tuple[str, tuple[EvalOption, ...]]]) -> dict[str, MergedOption]:
    """``(method, options)`` pairs -> one :class:`MergedOption` per option name that has a flag.

    Methods sharing a name must agree on its type and flag; choices are the union (None when any method takes any
    value)."""
    merged: dict[str, MergedOption] = {}
    for method, options in declared:
        for opt in options:
            if opt.cli_flag is None:
                continue
            seen = merged.get(opt.name)
            if seen is None:
                merged[opt.name] = MergedOption(opt, opt.choices, {method: opt.default})
                continue
            if (seen.option.type, seen.option.cli_flag) != (opt.type, opt.cli_flag):
                raise ConfigError(f"method {method!r} declares evaluation option {opt.name!r} as {opt.type.__name__} "
                                  f"{opt.cli_flag}, another method as {seen.option.type.__name__} {seen.option.cli_flag}: "
                                  "declare it alike (one flag per name)")
            choices = None if seen.choices is None or opt.choices is None else tuple(
                dict.fromkeys(seen.choices + opt.choices))
            merged[opt.name] = MergedOption(seen.option, choices, seen.defaults | {method: opt.default})
    return merged


def resolve_option(name: str, declared: dict[str, EvalOption], command_line: dict[str, Any], manifest: dict | None,
                   method: str) -> Any:
    """The value of ``name`` for ``method``: the command line, else the artefact's proposer settings, else the
    declared default. An option ``method`` does not declare is a programming error."""
    if name not in declared:
        raise ConfigError(f"method {method!r} reads evaluation option {name!r} but does not declare it: add an "
                          "EvalOption to its registry entry")
    value = command_line.get(name)
    if value is None and manifest is not None:
        value = (manifest.get("proposer") or {}).get(name)
    return declared[name].default if value is None else value


def option_source(name: str, declared: dict[str, EvalOption], command_line: dict[str, Any],
                  manifest: dict | None) -> str:
    """Where :func:`resolve_option`'s value of ``name`` came from, for messages: the flag, the artefact's
    manifest, or the method's default."""
    flag = (declared[name].cli_flag if name in declared else None) or "--" + name.replace("_", "-")
    if command_line.get(name) is not None:
        return flag
    if manifest is not None and (manifest.get("proposer") or {}).get(name) is not None:
        return f"the artefact's manifest.json (proposer.{name}; {flag} overrides it)"
    return f"the method's default ({flag} overrides it)"


# -- options shared by several methods ------------------------------------------------------------------------------

DRAFT_LENGTH = EvalOption("draft_length", int, metavar="K",
                          help="draft tokens per step (the block size for Jacobi decoding), a fixed length unless "
                               "--draft-length-mode says otherwise")
DRAFT_LENGTH_MODE = EvalOption("draft_length_mode", str, "fixed", choices=("fixed", "heuristic", "leviathan"),
                               help="fixed, grow/shrink heuristic, or Leviathan's expected-speedup optimum")
DRAFT_MAX_LENGTH = EvalOption("draft_max_length", int, metavar="K",
                              help="the longest draft the heuristic and Leviathan policies may grow to (16 when unset)")
CONFIDENCE = EvalOption("confidence_threshold", float, flag="--draft-confidence", metavar="P",
                        help="draft model: stop a draft after a token the draft gives probability < P (0 = always draft "
                             "--draft-length tokens)")
DRAFT_VOCAB = EvalOption("draft_vocab", str, "auto", choices=("auto", "full"),
                         help="draft model: auto = draft only among the tokens of the draft's config.draft_vocab when it "
                              "has one (a cheaper LM head), full = the whole vocabulary")
TREE = EvalOption("tree", str, metavar="SHAPE",
                  help="the draft's shape: medusa auto (grown from the heads' measured accuracies), chain or a JSON file "
                       "of choice paths; eagle chain or dynamic (EAGLE-2; a P-EAGLE head: chain, auto or a JSON file, "
                       "a static tree over its block as medusa's); dflash chain, auto or a JSON file (likewise); pld "
                       "chain (one chain voted from the earlier occurrences) or dynamic (their candidates as a token "
                       "tree, at most --pld-tokens nodes); bita chain or triangle (the upper-triangle tree)")
TREE_NODES = EvalOption("tree_nodes", str, metavar="N|auto",
                        help="nodes of the auto tree of medusa, P-EAGLE or DFlash, or the dynamic tree's total tokens "
                             "(eagle); auto = sized on this target's measured verification cost")
TREE_TOP_K = EvalOption("tree_top_k", int, metavar="K",
                        help="nodes expanded per level and children per node (eagle --tree dynamic), or candidates per "
                             "mask position (bita)")
TREE_CALIBRATION = EvalOption("tree_calibration", str, "auto", choices=("auto", "off"),
                              help="medusa/eagle trees: auto = score nodes with the artefact's tree calibration "
                                   "(`draftsmith tune`: per-depth acceptance measured on held-out prompts) when it has "
                                   "one; off = the heads' raw probabilities and the trainer's per-head accuracies")
SEED = EvalOption("seed", int, 0, flag=None)  # the artefact's initialisation seed; `eval --seed` seeds sampling


def draft_model_options(length: int = 4, confidence: float = 0.4) -> tuple[EvalOption, ...]:
    """The options of a separate draft model (the plain draft and DistillSpec's)."""
    return (DRAFT_LENGTH.default_to(length), DRAFT_LENGTH_MODE, DRAFT_MAX_LENGTH, CONFIDENCE.default_to(confidence),
            DRAFT_VOCAB)


def self_drafting_options(length: int) -> tuple[EvalOption, ...]:
    """The draft-length options of a method whose target drafts for itself (early exit, Draft & Verify)."""
    return DRAFT_LENGTH.default_to(length), DRAFT_LENGTH_MODE, DRAFT_MAX_LENGTH


__all__ = ["CONFIDENCE", "DRAFT_LENGTH", "DRAFT_LENGTH_MODE", "DRAFT_MAX_LENGTH", "DRAFT_VOCAB", "EvalOption",
           "MergedOption", "SEED", "TREE", "TREE_CALIBRATION", "TREE_NODES",
           "TREE_TOP_K", "draft_model_options", "merge_options",
           "resolve_option", "self_drafting_options"]
