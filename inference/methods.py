"""Proposer builders the method registry points at (``draftsmith.common.registry``).

Each builder takes a :class:`ProposerContext` and returns a proposer (None = plain AR). A setting is taken from
the command line first, then from the artefact's manifest, then from the method's evaluation defaults
(:meth:`ProposerContext.option`), so an artefact carries its own decoding settings and a user can still
override them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.eval_options import option_source, resolve_option
from draftsmith.common.models import load_model
from draftsmith.common.registry import REGISTRY, resolve
from draftsmith.inference.artefacts.reader import check_target, read_manifest

AUTO_TREE_TOKENS = 64  # the most tokens a cost-sized EAGLE tree (--tree-nodes auto) verifies in one forward


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
    return resolve(spec.proposer)(ctx), manifest


def no_proposer(ctx: ProposerContext) -> None:
    return None


def _artefact_draft(ctx: ProposerContext):
    """The draft model of a ``draft_model`` artefact, on the target's device and dtype."""
    sub = ctx.artefact_dir / ctx.manifest["proposer"].get("model_dir", "draft")
    if not (sub / "config.json").is_file():
        raise ArtefactError(f"{sub}/config.json is missing: the artefact's draft model directory is incomplete")
    draft = load_model(sub, ctx.target_model.dtype, ctx.target_model.device, what="artefact's draft",
                       use_safetensors=True)
    return draft.eval(), str(sub)


def draft_model_proposer(ctx: ProposerContext):
    """A separate draft model: the caller's, else the artefact's; refused unless it shares the target's
    vocabulary."""
    from draftsmith.inference.core.draft_length import DraftLengthPolicy
    from draftsmith.inference.proposers.draft_model import DraftModelProposer, check_same_tokenizer, draft_vocab_of

    if ctx.draft_model is not None:
        draft = ctx.draft_model.to(ctx.target_model.device, ctx.target_model.dtype).eval()
        name = str(getattr(draft.config, "_name_or_path", "") or "draft")
    elif ctx.artefact_dir is not None:
        draft, name = _artefact_draft(ctx)
    else:
        raise ConfigError("the draft method needs a draft model: pass --draft PATH (a draft sharing the target's "
                          "tokenizer)")
    check_same_tokenizer(ctx.target_model, draft, draft_name=name)
    length = draft_length(ctx)
    policy = DraftLengthPolicy(length=length, mode=ctx.option("draft_length_mode"),
                               max_length=_max_length(ctx, length), relative_verify=_relative_verify(ctx))
    vocab = ctx.option("draft_vocab")
    if vocab not in ("auto", "full"):
        raise ConfigError(f"draft vocabulary must be auto (the draft's config.draft_vocab when it has one) or full, "
                          f"got {vocab!r}")
    return DraftModelProposer(draft, policy, confidence_threshold=float(ctx.option("confidence_threshold")),
                              vocab=draft_vocab_of(draft) if vocab == "auto" else None)


def _max_length(ctx: ProposerContext, length: int) -> int:
    """The longest draft an adaptive length policy may grow to: ``draft_max_length`` (what ``draftsmith tune``
    profiled), default 16."""
    top = ctx.option("draft_max_length")
    top = 16 if top is None else int(top)
    if top < length:
        raise ConfigError(f"draft max length {top} is below the draft length {length}: raise --draft-max-length")
    return top


def _relative_verify(ctx: ProposerContext):
    """The artefact's measured verification curve (recorded by ``draftsmith tune``) for the Leviathan length
    rule, or None."""
    from draftsmith.inference.evaluation.cost import CostModel

    recorded = ((ctx.manifest or {}).get("tuning") or {}).get("cost_model")
    return CostModel.from_dict(recorded).relative_verify if recorded else None


def early_exit_proposer(ctx: ProposerContext):
    """LayerSkip's self-speculation on any Llama-style or GPT-2 target: the first ``exit_layer`` layers draft a chain
    of ``draft_length`` tokens, the verification runs the remaining layers only, reusing the draft's cache."""
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.core.draft_length import DraftLengthPolicy
    from draftsmith.inference.proposers.layerskip import EarlyExitProposer

    exit_layer = ctx.option("exit_layer")
    if exit_layer is None and ctx.manifest is not None:  # a LayerSkip artefact trained without a chosen E
        exit_layer = max(1, ModelAdapter(ctx.target_model).num_layers // 4)
    if exit_layer is None:
        raise ConfigError("early-exit drafts with the target's first E layers: pass --exit-layer E")
    length = draft_length(ctx)
    policy = DraftLengthPolicy(length=length, mode=ctx.option("draft_length_mode"),
                               max_length=_max_length(ctx, length), relative_verify=_relative_verify(ctx))
    return EarlyExitProposer(int(exit_layer), policy)


def _layer_list(value) -> list[int]:
    """Layer numbers from a list or a comma-separated string ("1,3,5")."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            return [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"layer list {value!r}: give comma-separated layer numbers, e.g. 1,3,5") from None
    return [int(x) for x in value]


def draft_verify_proposer(ctx: ProposerContext):
    """Draft & Verify's self-speculation from a searched artefact (``recipes/draft_verify.py``) or from skip lists
    on the command line: the target minus its skip set drafts, stopping adaptively by the rule ``--threshold-rule``
    names, else the artefact's threshold rule, else the reference code's rule (which the search drafts with too)."""
    from draftsmith.inference.core.draft_length import DraftLengthPolicy
    from draftsmith.inference.proposers.draft_verify import AdaptiveThreshold, DraftVerifyProposer

    attention, mlp = _layer_list(ctx.option("skip_attention")), _layer_list(ctx.option("skip_mlp"))
    if not attention and not mlp:
        if ctx.manifest is not None:  # the search found no skip set faster than plain decoding on this target
            return None
        raise ConfigError("draft-verify needs a skip set: pass --artefact DIR (from recipes/draft_verify.py), or "
                          "--skip-attention/--skip-mlp with layer numbers")
    length = int(ctx.option("draft_length"))
    rule = ctx.option("threshold_rule")
    stop = AdaptiveThreshold.preset(rule) if rule else AdaptiveThreshold.from_dict(ctx.option("threshold"))
    return DraftVerifyProposer(skip_attention=attention or (), skip_mlp=mlp or (),
                             policy=DraftLengthPolicy(length=length, max_length=max(16, length)), stop=stop)


def prompt_lookup_proposer(ctx: ProposerContext):
    """Prompt lookup: longest-match-first n-gram copying, each draft sized from the copies' measured acceptance on the
    target's verification cost, measured now (``--pld-length cost``, default; ``adaptive``: a fixed acceptance
    threshold instead; ``fixed``: always ``--pld-tokens``), as one voted chain (``--tree chain``, default) or as a
    tree of the several occurrences' candidates (``--tree dynamic``)."""
    from draftsmith.inference.proposers.prompt_lookup import PromptLookupProposer

    length = ctx.option("pld_length")
    if length not in ("adaptive", "fixed", "cost"):
        raise ConfigError(f"prompt lookup draft length must be adaptive, fixed or cost, got {length!r}")
    tree = str(ctx.option("tree"))
    if tree not in ("chain", "dynamic"):
        raise ConfigError(f"prompt lookup --tree {tree}: give chain (one voted chain) or dynamic (the candidates of "
                          "several occurrences as a token tree)")
    tokens = int(ctx.option("pld_tokens"))
    cost = tree_verify_cost(ctx.target_model, tokens) if length == "cost" else None  # measured now
    try:
        return PromptLookupProposer(num_draft_tokens=tokens,
                                    max_ngram=int(ctx.option("pld_max_ngram")),
                                    min_ngram=int(ctx.option("pld_min_ngram")),
                                    adaptive=length != "fixed",
                                    threshold=float(ctx.option("pld_threshold")),
                                    tree=tree == "dynamic", verify_cost=cost)
    except ValueError as e:
        raise ConfigError(f"prompt lookup: {e}") from None


def tree_calibration(ctx: ProposerContext) -> dict | None:
    """The artefact's tree calibration (``proposer.tree_calibration``, written by ``draftsmith tune``:
    :mod:`~draftsmith.inference.evaluation.tree_calibration`), or None without one or with ``--tree-calibration off``."""
    if str(ctx.option("tree_calibration")) == "off":
        return None
    return ((ctx.manifest or {}).get("proposer") or {}).get("tree_calibration")


def static_tree(ctx: ProposerContext, heads: int):
    """The static tree of a Medusa artefact, or of a block drafter (P-EAGLE, DFlash: block slot ``d`` plays head ``d``'s
    part): ``--tree chain`` (top-1 of each head), a JSON file of choice paths,
    or ``auto`` (default): the top-1 chain through every head, then grown greedily from the heads' top-k accuracies
    — conditional ones measured in the decode loop on held-out prompts when the artefact is calibrated
    (:func:`tree_calibration`), else those the trainer measured per head on held-out data (the manifest's
    ``training.head_accuracy``), else a typical profile — ``tree_nodes`` nodes, or, with ``--tree-nodes auto``, the
    count with the best predicted speedup on the target's measured verification cost."""
    import json

    import torch

    from draftsmith.inference.core.trees import chain_choices, default_accuracy, greedy_choices, tree_from_choices

    tree = str(ctx.option("tree"))
    nodes = ctx.option("tree_nodes")
    if tree == "chain":
        return tree_from_choices(chain_choices(heads))
    if tree == "auto":
        calibration = tree_calibration(ctx)
        accuracy = (calibration or {}).get("rank_accuracy") or \
            ((ctx.manifest or {}).get("training") or {}).get("head_accuracy")
        accuracy = torch.tensor(accuracy)[:heads] if accuracy else default_accuracy(heads)
        if str(nodes) == "auto":  # the size whose predicted speedup is best on this target's measured cost
            nodes = medusa_tree_size(ctx.target_model, accuracy, chain=heads)["nodes"]
        if not str(nodes).isdigit() or int(nodes) < 1:
            raise ConfigError(f"--tree-nodes {nodes}: give a number of nodes >= 1, or auto")
        return tree_from_choices(greedy_choices(accuracy, int(nodes), chain=heads))
    path = Path(tree)
    try:
        choices = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--tree {tree}: not chain, auto or a readable JSON file of choice paths ({err})") from None
    return tree_from_choices(choices)


def tree_verify_cost(target_model, max_nodes: int = 64):
    """The target's verification cost for trees of up to ``max_nodes`` nodes, measured now (a
    :class:`~draftsmith.inference.evaluation.cost.CostModel` over 1 .. ``max_nodes + 1`` tokens, interpolated between powers of
    two)."""
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.evaluation.cost import CostModel, measure_verify_curve

    sizes = sorted(n for n in {1, 2, 3, 5, 9, 17, 33, max_nodes + 1} if n <= max_nodes + 1)
    return CostModel(measure_verify_curve(ModelAdapter(target_model), sizes=sizes, repeats=5))


def medusa_tree_size(target_model, accuracy, max_nodes: int = 64, chain: int = 0) -> dict:
    """:func:`~draftsmith.inference.core.trees.tree_size_for_cost` on the target's verification cost, measured now."""
    from draftsmith.inference.core.trees import tree_size_for_cost

    return tree_size_for_cost(accuracy, tree_verify_cost(target_model, max_nodes).relative_verify, max_nodes, chain)


def medusa_proposer(ctx: ProposerContext):
    """Medusa heads from a ``heads`` artefact over the target's last hidden state, drafting a static tree."""
    from draftsmith.inference.artefacts.medusa import load_heads_artefact
    from draftsmith.inference.proposers.medusa import MedusaProposer

    if ctx.artefact_dir is None:
        raise ConfigError("medusa runs from its trained heads: pass --artefact DIR (from recipes/medusa.py)")
    heads = load_heads_artefact(ctx.artefact_dir)
    target = ctx.target_model
    heads.to(target.device, target.dtype)
    acceptance = ctx.option("acceptance")
    if acceptance not in ("exact", "typical"):
        raise ConfigError(f"acceptance must be exact (lossless) or typical (Medusa's, lossy), got {acceptance!r}")
    typical = None
    if acceptance == "typical":
        delta = ctx.option("typical_delta")  # None: sqrt(epsilon)
        typical = (float(ctx.option("typical_epsilon")), None if delta is None else float(delta))
    return MedusaProposer(heads, target.get_output_embeddings(), static_tree(ctx, heads.num_heads), typical=typical)


def eagle_proposer(ctx: ProposerContext):
    """An EAGLE-1 or EAGLE-3 head from a ``heads`` artefact over the target's features, drafting EAGLE-2's dynamic tree
    (``tree_depth`` levels of ``tree_top_k``, ``tree_nodes`` kept; the default) or a chain of ``draft_length``; a
    P-EAGLE head drafts its block of ``draft_length`` in one forward, as a chain or a static tree over the block's top-k
    (:func:`static_tree`)."""
    from draftsmith.inference.artefacts.eagle import load_eagle_head
    from draftsmith.inference.drafters.peagle import PEagleHead
    from draftsmith.inference.proposers.eagle import TREES, EagleProposer
    from draftsmith.inference.proposers.peagle import PEagleProposer

    if ctx.artefact_dir is None:
        raise ConfigError("eagle runs from its trained head: pass --artefact DIR (from recipes/eagle.py)")
    tree = str(ctx.option("tree"))
    target = ctx.target_model
    head = load_eagle_head(ctx.artefact_dir, target)
    head.to(target.device)
    if isinstance(head, PEagleHead):  # P-EAGLE: the block from one head forward per step, a chain or a static tree
        if tree == "dynamic":
            raise ConfigError("--tree dynamic: P-EAGLE drafts its block as a chain or a static tree over the block's "
                              "top-k (--tree chain|auto|FILE.json)")
        length = int(ctx.option("draft_length"))
        shape = None if tree == "chain" else static_tree(ctx, length)
        return PEagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(), length=length,
                              tree=shape)
    if tree not in TREES:
        raise ConfigError(f"--tree {tree}: EAGLE drafts a chain or EAGLE-2's dynamic tree (--tree chain|dynamic)")
    total = str(ctx.option("tree_nodes"))
    if total != "auto" and (not total.isdigit() or int(total) < 1):
        raise ConfigError(f"--tree-nodes {total}: EAGLE's dynamic tree keeps a number of tokens (e.g. 32) or auto")
    cost = None
    if total == "auto":  # sized per step on the measured verification cost, up to AUTO_TREE_TOKENS
        total = AUTO_TREE_TOKENS
        cost = tree_verify_cost(target, total) if tree == "dynamic" else None
    return EagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(),
                         length=int(ctx.option("draft_length")), tree=tree, depth=int(ctx.option("tree_depth")),
                         top_k=int(ctx.option("tree_top_k")), total_tokens=int(total), verify_cost=cost,
                         temperatures=(tree_calibration(ctx) or {}).get("temperatures"))


def dflash_proposer(ctx: ProposerContext):
    """A DFlash draft from a ``heads`` artefact: each step one draft forward fills the block's ``draft_length`` masks
    (0: all of them, ``block_size - 1``), verified as a chain (``--tree chain``, default) or as a static tree over the
    slots' top-k (``--tree auto|FILE``, :func:`static_tree`)."""
    from draftsmith.inference.artefacts.dflash import load_dflash_draft
    from draftsmith.inference.proposers.dflash import DFlashProposer

    if ctx.artefact_dir is None:
        raise ConfigError("dflash runs from its trained draft: pass --artefact DIR (from recipes/dflash.py)")
    target = ctx.target_model
    draft = load_dflash_draft(ctx.artefact_dir, target).to(target.device, target.dtype)
    length = int(ctx.option("draft_length") or 0) or draft.block_size - 1
    tree = str(ctx.option("tree"))
    shape = None if tree == "chain" else static_tree(ctx, length)
    return DFlashProposer(draft, target.get_input_embeddings(), target.get_output_embeddings(), length=length,
                          tree=shape)


def bita_proposer(ctx: ProposerContext):
    """BiTA's mask tokens from an ``embeddings`` artefact; without one (``--method bita``), embeddings started from the
    target's vocabulary and never trained: the "before training" reference. Drafts a chain of the masks' top-1
    tokens (default) or the upper-triangle tree (``--tree triangle``, ``--tree-top-k``)."""
    from draftsmith.inference.artefacts.bita import load_bita_artefact
    from draftsmith.inference.core.adapter import ModelAdapter
    from draftsmith.inference.drafters.bita import MASK_TOKENS, PROMPT_TOKENS, BitaEmbeddings
    from draftsmith.inference.proposers.bita import TREES, BitaProposer

    tree = str(ctx.option("tree"))
    if tree not in TREES:
        raise ConfigError(f"--tree {tree}: BiTA drafts a chain or the upper-triangle tree (--tree chain|triangle)")
    target = ctx.target_model
    if ctx.artefact_dir is not None:
        embeddings = load_bita_artefact(ctx.artefact_dir)
        embeddings.check_target(target)
    else:
        embeddings = BitaEmbeddings.for_target(target, prompt_tokens=PROMPT_TOKENS, mask_tokens=MASK_TOKENS)
        embeddings.init_from_target(ModelAdapter(target), seed=int(ctx.option("seed")))
    embeddings.to(target.device)
    return BitaProposer(embeddings, tree=tree, top_k=int(ctx.option("tree_top_k")))


def jacobi_proposer(ctx: ProposerContext):
    """Jacobi decoding: each step's draft is the current guess of the next ``draft_length`` tokens (CLLM's block,
    16 by default), refined by the same forward that verifies it. Any target (``--method jacobi``: the reference
    before consistency training) or a CLLM artefact's fine-tuned model."""
    from draftsmith.inference.proposers.jacobi import JacobiProposer

    return JacobiProposer(block=int(ctx.option("draft_length")), seed=int(ctx.option("seed")))
