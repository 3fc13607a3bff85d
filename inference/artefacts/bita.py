"""BiTA's artefact: the prompt and mask embeddings of an ``embeddings`` artefact directory."""

from __future__ import annotations

import os
from pathlib import Path

from draftsmith.common.errors import ArtefactError
from draftsmith.common.io import read_json
from draftsmith.inference.artefacts.reader import config_misfit, read_weights
from draftsmith.inference.drafters.bita import CONFIG_FILE, WEIGHTS_FILE, BitaEmbeddings


def load_bita_artefact(directory: str | os.PathLike) -> BitaEmbeddings:
    """The prompt and mask embeddings of a BiTA (``embeddings``) artefact directory."""
    directory = Path(directory)
    config = read_json(directory / CONFIG_FILE)
    if not isinstance(config, dict) or config.get("method") != "bita":
        raise ArtefactError(f"{directory}/{CONFIG_FILE} is missing or not BiTA's: pass an artefact of recipes/bita.py")
    try:
        module = BitaEmbeddings.from_artefact_config(config)
        module.load_state_dict(read_weights(directory / WEIGHTS_FILE))
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise config_misfit(directory / CONFIG_FILE, err) from None
    return module


__all__ = ["load_bita_artefact"]
