"""Settings typed one way, from YAML and from the command line alike, against the config dataclasses' field types.

A YAML value reaches a dataclass as the YAML loader made it (``max_steps: 2.5`` a float, ``evaluate: "no"`` a string)
and a command-line value as argparse converts it; both go through :func:`coerce` here, so ``max_steps: 2.5`` and
``--max_steps 2.5`` are refused with the same words, ``"3"`` is 3 and ``"no"`` is false in both. :func:`settings_parser`
is ``transformers.HfArgumentParser`` with that conversion and one-line errors (:class:`ConfigError`, no usage dump).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from draftsmith.common.errors import ConfigError

_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "text", dict: "a mapping",
          list: "a list"}
_TRUE, _FALSE = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")  # HfArgumentParser's string_to_bool


def describe(tp) -> str:
    """What a value of type ``tp`` is, in words (``int | None`` -> 'a whole number or null')."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys("null" if a is type(None) else describe(a) for a in args))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (list, tuple):
        return f"a list of {describe(args[0]).removeprefix('a ')}" if args else "a list"
    if origin is dict:
        return "a mapping"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in tp)
    return _NAMES.get(tp, f"a {getattr(tp, '__name__', tp)}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def coerce(value: Any, tp) -> Any:
    """``value`` as a setting of type ``tp``: checked, and text converted as the command line converts it (``"3"`` for
    an int is 3, ``"yes"`` for a bool is true). Raises ``ValueError('expected ..., got ...')``. Floats must not be
    NaN; an int is never given as a float (``2.0`` is refused, as ``--max_steps 2.0`` is)."""
    if not _fits(value, tp):
        raise ValueError(f"expected {describe(tp)}, got {_shown(value)}")
    return _convert(value, tp)


def _fits(value: Any, tp) -> bool:
    try:
        _convert(value, tp)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


def _convert(value: Any, tp) -> Any:  # noqa: C901 -- one branch per kind of type, read top to bottom
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in sorted((a for a in args if a is not type(None)), key=lambda a: a is str):  # text last
            if _fits(value, option):
                return _convert(value, option)
        raise ValueError
    if origin is typing.Literal:
        if value in args:
            return value
        raise ValueError
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list):
            raise ValueError
        return [_convert(v, args[0]) for v in value] if args else list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ValueError
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            return int(value)
        raise ValueError
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        number = float(value)
        if math.isnan(number):
            raise ValueError
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value.value
        if isinstance(value, str) and value in {m.value for m in tp}:
            return value
        raise ValueError
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ValueError
    return value


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """``{field name: type}`` of a dataclass (its init fields), annotations resolved."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def check_values(values: Mapping[str, Any], classes: Iterable[type], source: str) -> dict[str, Any]:
    """``values`` (YAML: field -> value) of the dataclasses ``classes`` coerced to their fields' types; the first
    wrong one is a one-line :class:`ConfigError` naming ``source`` and the field."""
    types_ = {}
    for cls in classes:
        types_.update(field_types(cls))
    out = {}
    for key, value in values.items():
        try:
            out[key] = coerce(value, types_[key]) if key in types_ else value
        except ValueError as err:
            raise ConfigError(f"{source}: {key}: {err} (see --help)") from None
    return out


def _converter(tp):
    import argparse

    def convert(text: str):
        try:
            return coerce(text, tp)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = describe(tp)
    return convert


def one_line(message: str) -> str:
    """argparse's error as one line naming the flag once: ``argument --max_steps/--max-steps: X`` -> ``--max_steps:
    X (see --help)``."""
    text = " ".join(message.split())
    match = re.match(r"^argument (-{1,2}[^/:\s]+)(?:/[^:]*)?: (.*)$", text)
    if match:
        text = f"{match.group(1)}: {match.group(2)}"
    return f"{text} (see --help)"


def settings_parser(classes: list[type]):
    """``transformers.HfArgumentParser`` over ``classes`` whose number and boolean flags convert through
    :func:`coerce` and whose errors are one :class:`ConfigError` line (argparse would print its usage and exit)."""
    import transformers

    class OneLineParser(transformers.HfArgumentParser):
        def error(self, message: str):
            raise ConfigError(one_line(message))

    parser = OneLineParser(classes)
    hints = {}
    for cls in classes:
        hints.update(field_types(cls))
    plain = (int, float, bool)
    for action in parser._actions:
        tp = hints.get(action.dest)
        if tp is None or action.choices is not None or action.nargs in ("+", "*"):
            continue
        base = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if len(base) == 1 and base[0] in plain:
            action.type = _converter(tp)
    return parser


__all__ = ["check_values", "coerce", "describe", "field_types", "one_line", "settings_parser"]
