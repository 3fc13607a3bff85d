"""Where draftsmith keeps what it builds and imports: one home, ``$DRAFTSMITH_HOME`` (default
``~/.cache/draftsmith``), and the directories under it. Every reader of these paths goes through these functions::

    <home>/zoo/<size>/      a built model zoo: tokenizer/, target/, draft/, manifest.json (draftsmith.data.zoo)
    <home>/models/<dir>/    real models imported from the package registry (draftsmith.data.model_import)
    <home>/features/        offline hidden-state feature caches (draftsmith.data.feature_cache)
    <home>/engines/<name>/  serving-engine environments (draftsmith.inference.engines.environment)

``home`` arguments override the environment (``--home DIR`` on the command line)."""

from __future__ import annotations

import os
from pathlib import Path

from draftsmith.common.errors import ConfigError

HOME_ENV = "DRAFTSMITH_HOME"
DEFAULT_HOME = Path("~") / ".cache" / "draftsmith"
ZOO_PARTS = ("tokenizer", "target", "draft", "manifest.json")  # what a built zoo directory holds


def draftsmith_home(home: str | os.PathLike | None = None) -> Path:
    """``home``, else ``$DRAFTSMITH_HOME``, else ``~/.cache/draftsmith`` (user-expanded, made absolute: a relative
    one names the same directory in processes that run elsewhere, such as the engine's)."""
    if home is not None:
        return Path(home).expanduser().absolute()
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser().absolute()  # the engine runs elsewhere


def zoo_dir(size: str = "tiny", home: str | os.PathLike | None = None) -> Path:
    """Where the zoo of ``size`` lives: ``<home>/zoo/<size>`` (it may not be built yet). ``size`` is a plain name."""
    if not size or "/" in size or "\\" in size or size.startswith("."):
        raise ConfigError(f"invalid zoo size {size!r}: a zoo size is a plain name such as tiny, small or smollm2")
    return draftsmith_home(home) / "zoo" / size


def zoo_path(size: str, part: str, home: str | os.PathLike | None = None) -> Path:
    """One part of the zoo of ``size`` (one of :data:`ZOO_PARTS`): ``<home>/zoo/<size>/<part>``."""
    if part not in ZOO_PARTS:
        raise ConfigError(f"a zoo holds no {part!r}: choose one of {', '.join(ZOO_PARTS)}")
    return zoo_dir(size, home) / part


def models_dir(home: str | os.PathLike | None = None) -> Path:
    """Where imported real models live: ``<home>/models``."""
    return draftsmith_home(home) / "models"


def features_dir(home: str | os.PathLike | None = None) -> Path:
    """The default root of the offline feature caches: ``<home>/features``."""
    return draftsmith_home(home) / "features"


def engines_dir(home: str | os.PathLike | None = None) -> Path:
    """Where serving-engine environments live: ``<home>/engines``."""
    return draftsmith_home(home) / "engines"


__all__ = ["HOME_ENV", "DEFAULT_HOME", "ZOO_PARTS", "draftsmith_home", "zoo_dir", "zoo_path", "models_dir",
           "features_dir", "engines_dir"]
