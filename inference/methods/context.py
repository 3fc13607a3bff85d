"""What every proposer builder takes (:class:`ProposerContext`) and the one way an artefact becomes a proposer
(:func:`load_artefact`).

A builder takes a :class:`ProposerContext` and returns a proposer (None = plain AR). A setting is taken from the
command line first, then from the artefact's manifest, then from the method's declared default
(:meth:`ProposerContext.option`), so an artefact carries its own decoding settings and a user can still override them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ConfigError
from draftsmith.common.eval_options import option_source, resolve_option
from draftsmith.common.registry import REGISTRY
from draftsmith.inference.artefacts.reader import check_target, read_manifest


@dataclass
class ProposerContext:
    """What a proposer builder may use."""

    target_model: Any
    method: str  # the registry name whose evaluation options the builder reads
    tokenizer: Any = None
    artefact_dir: Path | None = None
    manifest: dict | None = None  # the artefact's, when there is one
    options: dict[str, Any] = field(default_factory=dict)  # command-line settings; None = not given
    draft_model: Any = None  # a draft model given by the caller (wins over the artefact's)

    def option(self, name: str) -> Any:
        """Command line, else the artefact's proposer settings, else the method's declared default (its
        ``EvalOption`` in the registry entry)."""
        declared = REGISTRY.get(self.method).option_declarations()
        return resolve_option(name, declared, self.options, self.manifest, self.method)

    def option_source(self, name: str) -> str:
        """Where :meth:`option`'s value came from (the flag, the artefact's manifest, the default), for messages."""
        return option_source(name, REGISTRY.get(self.method).option_declarations(), self.options, self.manifest)


def draft_length(ctx: ProposerContext) -> int:
    """The ``draft_length`` option, at least 1; a bad value names where it came from."""
    length = int(ctx.option("draft_length"))
    if length < 1:
        raise ConfigError(f"draft length must be at least 1, got {length} from {ctx.option_source('draft_length')}")
    return length


def load_artefact(
    directory: str | Path,
    target_model,
    target_tokenizer=None,
    allow_target_mismatch: bool = False,
    draft_model=None,
    manifest: dict | None = None,
    **options,
):
    """Read and check an artefact (:func:`draftsmith.inference.artefacts.reader.read_manifest`: its manifest, its
    method and kind, every file), compare it with ``target_model``, and build its proposer through the method
    registry (``options``: command-line decoding settings, None = the artefact's own; ``draft_model`` replaces the
    artefact's draft, e.g. the draft before training; ``manifest``: what :func:`read_manifest` returned for this
    directory already, so its files are not hashed again).

    Returns ``(proposer, manifest)``."""
    directory = Path(directory)
    manifest = read_manifest(directory) if manifest is None else manifest  # its method and kind checked there
    check_target(manifest, target_model, target_tokenizer, allow_target_mismatch)
    spec = REGISTRY.get(manifest["method"])
    ctx = ProposerContext(target_model=target_model, method=spec.name, tokenizer=target_tokenizer, artefact_dir=directory,
                          manifest=manifest, options=options, draft_model=draft_model)
    return spec.proposer(ctx), manifest


def max_length(ctx: ProposerContext, length: int) -> int:
    """The longest draft an adaptive length policy may grow to: ``draft_max_length`` (what ``draftsmith tune``
    profiled), default 16."""
    top = ctx.option("draft_max_length")
    top = 16 if top is None else int(top)
    if top < length:
        raise ConfigError(f"draft max length {top} is below the draft length {length}: raise --draft-max-length")
    return top


def relative_verify(ctx: ProposerContext):
    """The artefact's measured verification curve (recorded by ``draftsmith tune``) for the Leviathan length
    rule, or None."""
    from draftsmith.inference.evaluation.cost import CostModel

    recorded = ((ctx.manifest or {}).get("tuning") or {}).get("cost_model")
    return CostModel.from_dict(recorded).relative_verify if recorded else None


def tree_calibration(ctx: ProposerContext) -> dict | None:
    """The artefact's tree calibration (``proposer.tree_calibration``, written by ``draftsmith tune``:
    :mod:`~draftsmith.inference.evaluation.tree_calibration`), or None without one or with ``--tree-calibration off``."""
    if str(ctx.option("tree_calibration")) == "off":
        return None
    return ((ctx.manifest or {}).get("proposer") or {}).get("tree_calibration")
