"""How each method runs in vLLM: its ``speculative_config``, the export it needs, and the draftsmith settings that
make draftsmith's loop draft the same chain (for the acceptance parity of ``draftsmith eval --engine both``).

Each method declares its function (``MethodSpec.engine_configs["vllm"]``, beside its proposer builder in
``draftsmith.inference.methods.<name>``); a function takes an :class:`EngineSetup` and returns an :class:`EngineMethod`. vLLM drafts chains of ``num_speculative_tokens`` (no
trees in its EAGLE/Medusa paths), so parity is measured on chains: EAGLE and Medusa with ``--tree chain``, the draft
model at a fixed length with no confidence stop, prompt lookup at a fixed length (vLLM's ``ngram`` proposes the
continuation of the longest match, up to ``num_speculative_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ConfigError


@dataclass
class EngineSetup:
    """What a method's engine function may use."""

    method: str
    length: int | None  # draft tokens per step (vLLM's num_speculative_tokens); None = the method's default
    export_dir: Path  # a scratch directory for the engine's copy of the artefact
    target_model: Any
    artefact_dir: Path | None = None
    manifest: dict | None = None
    draft_dir: str | None = None  # a separate draft model's directory (--draft or the zoo's)
    options: dict = field(default_factory=dict)  # the command line's evaluation options (None = not given)
    export_format: str = "auto"  # auto: each method's own layout; speculators: vllm-project/speculators' (EAGLE-3)

    def option(self, name: str, default: Any) -> Any:
        value = self.options.get(name)
        if value is None and self.manifest is not None:
            value = (self.manifest.get("proposer") or {}).get(name)
        return default if value is None else value


@dataclass
class EngineMethod:
    """The engine side of a method: vLLM's ``speculative_config``, the model vLLM serves when it is not the target
    itself (Medusa-2's adapted target), and the draftsmith evaluation options that draft the same chain."""

    speculative_config: dict
    draftsmith_options: dict
    served_model: str | None = None
    engine_method: str = ""  # vLLM's name for it (report)

    def __post_init__(self) -> None:
        self.engine_method = self.engine_method or str(self.speculative_config.get("method"))


DEFAULT_LENGTH = 5  # draft tokens per step when --draft-length is not given (Medusa: its heads, at most this)


def need_artefact(setup: EngineSetup, recipe: str) -> Path:
    if setup.artefact_dir is None:
        raise ConfigError(f"{setup.method} runs in vLLM from its trained artefact: pass --artefact DIR (from "
                          f"recipes/{recipe}.py)")
    return setup.artefact_dir


__all__ = ["DEFAULT_LENGTH", "EngineMethod", "EngineSetup", "need_artefact"]
