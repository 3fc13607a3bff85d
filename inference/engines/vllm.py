"""How each method runs in vLLM: its ``speculative_config``, the export it needs, and the draftsmith settings that
make draftsmith's loop draft the same chain (for the acceptance parity of ``draftsmith eval --engine both``).

Each method's registry entry names its function here (``MethodSpec.engine_configs["vllm"]``); a function takes an
:class:`EngineSetup` and returns an :class:`EngineMethod`. vLLM drafts chains of ``num_speculative_tokens`` (no
trees in its EAGLE/Medusa paths), so parity is measured on chains: EAGLE and Medusa with ``--tree chain``, the draft
model at a fixed length with no confidence stop, prompt lookup at a fixed length (vLLM's ``ngram`` proposes the
continuation of the longest match, up to ``num_speculative_tokens``).
"""

from __future__ import annotations

import json
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


def _need_artefact(setup: EngineSetup, recipe: str) -> Path:
    if setup.artefact_dir is None:
        raise ConfigError(f"{setup.method} runs in vLLM from its trained artefact: pass --artefact DIR (from "
                          f"recipes/{recipe}.py)")
    return setup.artefact_dir


def ngram(setup: EngineSetup) -> EngineMethod:
    """Prompt lookup: vLLM's ``ngram`` proposer with draftsmith's n-gram bounds."""
    lo, hi = int(setup.option("pld_min_ngram", 2)), int(setup.option("pld_max_ngram", 4))
    k = setup.length or DEFAULT_LENGTH
    config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    return EngineMethod(config, {"pld_tokens": k, "pld_length": "fixed", "pld_min_ngram": lo, "pld_max_ngram": hi,
                                 "tree": "chain"})


def draft_model(setup: EngineSetup) -> EngineMethod:
    """A separate draft model (plain or distilled): vLLM's ``draft_model`` with the same directory."""
    if setup.artefact_dir is not None:
        draft = setup.artefact_dir / (setup.manifest or {}).get("proposer", {}).get("model_dir", "draft")
    elif setup.draft_dir is not None:
        draft = Path(setup.draft_dir)
    else:
        raise ConfigError("the draft method needs a draft model: pass --draft PATH or --artefact DIR")
    k = setup.length or DEFAULT_LENGTH
    config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}
    return EngineMethod(config, {"draft_length": k, "draft_length_mode": "fixed", "confidence_threshold": 0.0,
                                 "draft_vocab": "full"})


def eagle(setup: EngineSetup) -> EngineMethod:
    """An EAGLE-1 head (``vllm-eagle`` export, method ``eagle``) or an EAGLE-3 head (``eagle3``, method ``eagle3``; a
    P-EAGLE head with ``parallel_drafting``)."""
    from draftsmith.inference.artefacts.eagle import export_eagle, load_eagle_head
    from draftsmith.inference.drafters.eagle import Eagle3Head

    head = load_eagle_head(_need_artefact(setup, "eagle"), setup.target_model)
    k = setup.length or DEFAULT_LENGTH
    fmt, method = ("eagle3", "eagle3") if isinstance(head, Eagle3Head) else ("vllm-eagle", "eagle")
    if setup.export_format == "speculators":
        if method != "eagle3":
            raise ConfigError("the speculators layout holds EAGLE-3 heads; this artefact is EAGLE-1: leave "
                              "--engine-export auto")
        fmt = "speculators"
    out = export_eagle(head, setup.target_model.config, fmt, setup.export_dir / fmt, speculative_tokens=k)
    config = {"method": method, "model": str(out), "num_speculative_tokens": k}
    if getattr(head, "mask_hidden", None) is not None:  # P-EAGLE: the block in one draft forward
        config["parallel_drafting"] = True
    return EngineMethod(config, {"tree": "chain", "draft_length": k})


def medusa(setup: EngineSetup) -> EngineMethod:
    """Medusa heads (``vllm-medusa`` export, method ``medusa``): at most one draft token per head; a Medusa-2
    artefact's adapted target is served as the model."""
    from draftsmith.inference.artefacts.medusa import ADAPTED_TARGET, export_medusa_artefact

    artefact = _need_artefact(setup, "medusa")
    out = export_medusa_artefact(artefact, setup.manifest or {}, "vllm-medusa", setup.export_dir / "medusa",
                                 setup.target_model)
    heads = int(json.loads((out / "config.json").read_text())["num_heads"])
    k = setup.length or min(heads, DEFAULT_LENGTH)
    if k > heads:
        raise ConfigError(f"these Medusa heads draft at most {heads} tokens: pass --draft-length {heads} or fewer")
    served = str(out / ADAPTED_TARGET) if (out / ADAPTED_TARGET).is_dir() else None
    chain = setup.export_dir / f"medusa_chain_{k}.json"  # the top-1 of the first k heads
    chain.write_text(json.dumps([[0] * depth for depth in range(1, k + 1)]))
    config = {"method": "medusa", "model": str(out), "num_speculative_tokens": k}
    return EngineMethod(config, {"tree": str(chain), "acceptance": "exact"}, served_model=served)


def dflash(setup: EngineSetup) -> EngineMethod:
    """A DFlash draft (``vllm-dflash`` export, method ``dflash``): the block's first ``num_speculative_tokens``
    masks, at most ``block_size - 1``."""
    from draftsmith.inference.artefacts.dflash import export_dflash, load_dflash_draft

    draft = load_dflash_draft(_need_artefact(setup, "dflash"), setup.target_model)
    k = setup.length or int(setup.option("draft_length", 0)) or draft.block_size - 1
    if k > draft.block_size - 1:
        raise ConfigError(f"this DFlash draft fills blocks of {draft.block_size}: pass --draft-length "
                          f"{draft.block_size - 1} or fewer")
    out = export_dflash(draft, setup.target_model.config, "vllm-dflash", setup.export_dir / "dflash")
    config = {"method": "dflash", "model": str(out), "num_speculative_tokens": k}
    return EngineMethod(config, {"tree": "chain", "draft_length": k})


__all__ = ["EngineMethod", "EngineSetup", "dflash", "draft_model", "eagle", "medusa", "ngram"]
