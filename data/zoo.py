"""The built-in model zoo, the data side: what a zoo is (specs and sizes), the tokenizer stage,
the packed rows its models train and are scored on, and reading a built zoo.

A zoo of ``size`` lives in ``$DRAFTSMITH_HOME/zoo/<size>/`` (:func:`draftsmith.common.paths.zoo_dir`):

- ``tokenizer/`` byte-level BPE with a chat template (:mod:`draftsmith.data.tokenizer`);
- ``target/`` and ``draft/`` models of the spec's family, Llama by default (ordinary Hugging Face directories,
  safetensors); ``tiny-<family>`` (:func:`family_size`) is the tiny zoo in Qwen2, Qwen3, Gemma 3, OLMo2 or
  Mistral layers, on the same corpus, tokenizer, shapes and budgets;
- ``manifest.json`` (configs, parameter counts, tokens seen, held-out losses, train times, corpus hash, seed,
  build time).

:func:`draftsmith.trainers.zoo.build_zoo` builds it with the loop of :mod:`draftsmith.trainers.pretrain`;
this module only describes and reads it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
import transformers

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.io import read_json
from draftsmith.common.paths import zoo_path
from draftsmith.data.corpus import corpus_splits, example_texts
from draftsmith.data.draft_vocab import draft_vocabulary
from draftsmith.data.tiny_models import ROPE_FAMILIES, family_extras
from draftsmith.data.tokenizer import encode_examples, train_tokenizer

MANIFEST_FORMAT = "draftsmith-zoo/1"
MODEL_ROLES = ("target", "draft")
PRECISIONS = ("auto", "bf16", "fp32")
ZOO_FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "olmo2", "mistral")  # the decoder families a tiny zoo is built in
GEMMA3_WINDOW = 128  # a Gemma 3 zoo's sliding window: shorter than the long chat rows, so that it matters
STAGES = ("tokenizer", *MODEL_ROLES)


@dataclass
class ModelSpec:
    """Shape and training budget of one zoo model (a ``LlamaForCausalLM`` with tied embeddings)."""

    layers: int = field(metadata={"help": "number of decoder layers"})
    hidden: int = field(metadata={"help": "hidden size (width)"})
    intermediate: int = field(metadata={"help": "MLP intermediate size"})
    heads: int = field(metadata={"help": "attention heads; hidden must be divisible by heads"})
    kv_heads: int = field(metadata={"help": "key/value heads (grouped-query attention); divides heads"})
    tokens: int = field(metadata={"help": "training budget in tokens (rounded up to whole steps)"})
    lr: float = field(metadata={"help": "peak AdamW learning rate"})
    warmup_steps: int = field(default=20, metadata={"help": "linear warmup steps before the cosine decay"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final learning rate as a fraction of lr"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay on matrices (not norms)"})
    grad_clip: float = field(default=1.0, metadata={"help": "global gradient-norm clip"})
    init_from_target: bool = field(
        default=False,
        metadata={"help": "start from the target's embedding, first `layers` layers and final norm (the draft "
                  "then has the target's width and head shapes)"},
    )
    freeze_embeddings: bool = field(
        default=False, metadata={"help": "keep the (tied) embedding and LM head frozen while training"}
    )
    draft_vocab: int = field(
        default=0,
        metadata={"help": "draft only among the N tokens most frequent in the training rows (plus the special "
                  "tokens): recorded as config.draft_vocab, it cuts the LM head of every draft step; 0 = all"},
    )

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "intermediate", "heads", "kv_heads", "tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ModelSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ConfigError(
                f"ModelSpec: hidden ({self.hidden}) must be divisible by heads ({self.heads}) and heads by "
                f"kv_heads ({self.kv_heads}); change the widths or head counts"
            )
        if not 0 < self.lr < 1 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise ConfigError("ModelSpec: need 0 < lr < 1, 0 <= min_lr_ratio <= 1 and warmup_steps >= 0")


@dataclass
class ZooSpec:
    """Everything that determines a zoo build; two builds with equal specs give identical weights."""

    size: str = field(metadata={"help": "name of the size (tiny, small, or anything for a custom spec)"})
    target: ModelSpec = field(metadata={"help": "the target model"})
    draft: ModelSpec = field(metadata={"help": "the draft model (smaller, trained on fewer tokens)"})
    vocab_size: int = field(default=4096, metadata={"help": "BPE vocabulary size, special tokens included"})
    seq_len: int = field(default=512, metadata={"help": "packed training sequence length"})
    batch_size: int = field(default=8, metadata={"help": "sequences per optimizer step"})
    max_positions: int = field(default=2048, metadata={"help": "max_position_embeddings of both models"})
    seed: int = field(default=0, metadata={"help": "seeds initialisation and data order of every stage"})
    checkpoint_every: int = field(default=50, metadata={"help": "optimizer steps between resumable checkpoints"})
    eval_batch_size: int = field(default=8, metadata={"help": "sequences per held-out evaluation forward"})
    eval_tokens: int | None = field(default=None, metadata={"help": "cap on held-out tokens scored; None = all"})
    precision: str = field(
        default="auto",
        metadata={
            "help": "training matmul precision: fp32, bf16 (autocast; weights stay fp32) or auto (bf16 "
            "where the hardware does it natively: CUDA with bf16, CPUs with AVX512-BF16/AMX)"
        },
    )
    max_train_examples: int | None = field(
        default=None, metadata={"help": "use only the first N train examples (reduced test builds); None = all"}
    )
    target_import: str | None = field(
        default=None,
        metadata={"help": "a real target imported instead of trained (draftsmith.data.model_import); the tokenizer "
                  "is then the target's and `target` only describes its shape"},
    )
    family: str = field(
        default="llama",
        metadata={"help": "the decoder family of both models: " + ", ".join(ZOO_FAMILIES) + " (Qwen2's biases, "
                  "Qwen3's and OLMo2's query/key norms, Gemma 3's sliding windows and four norms a layer)"},
    )

    def __post_init__(self) -> None:
        if isinstance(self.target, dict):
            self.target = ModelSpec(**self.target)
        if isinstance(self.draft, dict):
            self.draft = ModelSpec(**self.draft)
        if self.vocab_size < 262:
            raise ConfigError(f"ZooSpec.vocab_size must be >= 262 (6 specials + 256 bytes), got {self.vocab_size}")
        if min(self.seq_len, self.batch_size, self.checkpoint_every, self.eval_batch_size) < 1:
            raise ConfigError("ZooSpec: seq_len, batch_size, checkpoint_every and eval_batch_size must be >= 1")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"ZooSpec.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.draft.init_from_target and self.target_import is None:
            raise ConfigError("ZooSpec: draft.init_from_target needs target_import (a real target to start from)")
        if self.family not in ZOO_FAMILIES:
            raise ConfigError(f"ZooSpec.family must be one of {', '.join(ZOO_FAMILIES)}, got {self.family!r}")
        if self.max_positions < self.seq_len:
            raise ConfigError(f"ZooSpec.max_positions ({self.max_positions}) must be >= seq_len ({self.seq_len})")

    def model(self, role: str) -> ModelSpec:
        return {"target": self.target, "draft": self.draft}[role]

    def steps(self, role: str) -> int:
        return math.ceil(self.model(role).tokens / (self.batch_size * self.seq_len))


ZOO_SIZES: dict[str, Callable[[], ZooSpec]] = {
    # tiny: 4.2M-parameter target, 0.9M draft; builds in < 10 minutes on 2 CPU cores, tokenizer included.
    # Loss here is limited by optimizer steps more than by tokens, hence small batches (1,024 tokens a step).
    # The target gets ~2x the draft's tokens so that its extra capacity shows in the held-out loss.
    "tiny": lambda: ZooSpec(
        size="tiny",
        target=ModelSpec(layers=4, hidden=256, intermediate=688, heads=4, kv_heads=4, tokens=1_000_000, lr=1e-3),
        draft=ModelSpec(layers=2, hidden=128, intermediate=344, heads=4, kv_heads=4, tokens=500_000, lr=2e-3),
        seq_len=512,
        batch_size=2,
    ),
    # small: 27M target, 4.2M draft; budgeted for ~2 hours on 2 CPU cores (minutes on one GPU): measured with
    # one thread on a busy machine, the target trains at ~550 tokens/s (~100 min) and the draft at ~2,700.
    "small": lambda: ZooSpec(
        size="small",
        target=ModelSpec(
            layers=8, hidden=512, intermediate=1536, heads=8, kv_heads=4, tokens=3_200_000, lr=6e-4, warmup_steps=50
        ),
        draft=ModelSpec(layers=4, hidden=256, intermediate=688, heads=4, kv_heads=4, tokens=1_200_000, lr=1e-3),
        seq_len=512,
        batch_size=4,
        checkpoint_every=100,
    ),
}


# smollm2: the real target SmolLM2-135M-Instruct (imported, not trained) and a 2-layer draft of its width that
# starts from the target's embedding, first two layers and final norm, shares its frozen tied embedding/LM head
# and trains its layers on the corpus. Why this shape: docs/BENCHMARKS.md ("Real target").
ZOO_SIZES["smollm2"] = lambda: ZooSpec(
    size="smollm2",
    target_import="smollm2-135m",
    target=ModelSpec(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, tokens=1, lr=1e-3),
    draft=ModelSpec(layers=2, hidden=576, intermediate=1536, heads=9, kv_heads=3, tokens=700_000, lr=5e-4,
                    warmup_steps=20, init_from_target=True, freeze_embeddings=True, draft_vocab=8192),
    vocab_size=49152,
    seq_len=512,
    batch_size=4,
    max_positions=8192,
    checkpoint_every=20,
    eval_tokens=40_000,
    precision="fp32",  # bf16 autocast is several times slower on CPUs without native bf16 matmuls
)


def family_size(size: str, family: str = "llama") -> str:
    """The zoo of ``size`` built in ``family``: ``size`` itself for Llama, else ``<size>-<family>`` (tiny only)."""
    if family == "llama":
        return size
    if family not in ZOO_FAMILIES or size != "tiny":
        raise ConfigError(f"zoos of other families are built at size tiny, in one of {', '.join(ZOO_FAMILIES)}: "
                          f"not {size!r} in {family!r}")
    return f"{size}-{family}"


# tiny-<family>: the tiny zoo's corpus, tokenizer, shapes and budgets, its models of another decoder family
for _family in ZOO_FAMILIES[1:]:
    ZOO_SIZES[family_size("tiny", _family)] = lambda f=_family: replace(ZOO_SIZES["tiny"](), size=f"tiny-{f}",
                                                                         family=f)


# named real targets whose zoo holds a draft for them: `--target smollm2-135m` defaults the draft to that zoo's
ZOO_FOR_TARGET = {"smollm2-135m": "smollm2"}


def zoo_size_for_target(target: str | None) -> str | None:
    """The zoo size whose draft belongs to the named target ``target`` (None for any other target)."""
    return ZOO_FOR_TARGET.get(str(target)) if target is not None else None


def frequent_tokens(rows: torch.Tensor, vocab_size: int, n: int, always: list[int] = ()) -> tuple[list[int], float]:
    """``(ids, coverage)``: the zoo draft's vocabulary, the ``n`` most frequent token ids of ``rows`` ``[N, T]``
    (:func:`draftsmith.data.draft_vocab.draft_vocabulary`) plus ``always`` (special tokens), sorted, and the fraction
    of the tokens of ``rows`` they cover."""
    counts = torch.bincount(rows.flatten(), minlength=vocab_size)  # [V]
    ids = sorted(set(draft_vocabulary(counts, n).tolist()) | set(always))
    return ids, float(counts[ids].sum()) / max(1, int(counts.sum()))


def zoo_spec(size: str) -> ZooSpec:
    """The built-in spec of ``size`` (one of :data:`ZOO_SIZES`)."""
    if size not in ZOO_SIZES:
        raise ConfigError(f"unknown zoo size {size!r}; use one of {', '.join(ZOO_SIZES)}")
    return ZOO_SIZES[size]()


# ----------------------------------------------------------------------------------------------------- models


def zoo_model_config(spec: ZooSpec, role: str) -> transformers.PretrainedConfig:
    """The config of the zoo's ``role`` model in ``spec.family`` (tied embeddings, specials 0/1/2 = pad/bos/eos):
    Llama's fields, and what the family needs beside them (:func:`~draftsmith.data.tiny_models.family_extras`)."""
    m = spec.model(role)
    cfg = ROPE_FAMILIES[spec.family](
        vocab_size=spec.vocab_size,
        hidden_size=m.hidden,
        intermediate_size=m.intermediate,
        num_hidden_layers=m.layers,
        num_attention_heads=m.heads,
        num_key_value_heads=m.kv_heads,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **family_extras(spec.family, m.hidden, m.heads, m.layers, GEMMA3_WINDOW),
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def param_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------------- data


def zoo_examples(spec: ZooSpec) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)`` corpus examples of a build (train cut to ``spec.max_train_examples``)."""
    splits = corpus_splits()
    train = splits["train"]
    if spec.max_train_examples is not None:
        train = train[: spec.max_train_examples]
    return train, splits["heldout"]


def train_zoo_tokenizer(spec: ZooSpec, train: list[dict]) -> transformers.PreTrainedTokenizerFast:
    """The tokenizer stage: the byte-level BPE of ``spec.vocab_size`` trained on the texts of ``train``."""
    return train_tokenizer((t for e in train for t in example_texts(e)), spec.vocab_size, spec.max_positions)


def pack(sequences: list[list[int]], seq_len: int, pad_id: int = 0, keep_tail: bool = False) -> torch.Tensor:
    """Concatenate token sequences and cut them into rows of ``seq_len``.  # [N, seq_len]

    With ``keep_tail`` the last partial row is padded with ``pad_id`` (score it with
    :func:`draftsmith.trainers.pretrain.heldout_loss`, which ignores the padding); otherwise it is dropped."""
    stream = torch.tensor([t for seq in sequences for t in seq], dtype=torch.long)
    n_full = stream.numel() // seq_len
    rows = stream[: n_full * seq_len].view(n_full, seq_len)
    tail = stream[n_full * seq_len :]
    if keep_tail and tail.numel():
        rows = torch.cat([rows, F.pad(tail, (0, seq_len - tail.numel()), value=pad_id)[None]])
    return rows


def shuffled(items: list, seed: int) -> list:
    """A copy of ``items`` in a seeded random order (torch generator, platform independent)."""
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    return [items[i] for i in order]


@dataclass(frozen=True)
class ZooRows:
    """The packed token rows a zoo build trains on and scores with."""

    train: torch.Tensor  # [N, T], train examples in seeded order, the last partial row dropped
    heldout: torch.Tensor  # [M, T], flat positions >= n_heldout are padding
    n_heldout: int  # real held-out tokens
    train_tokens: int  # tokens of all train examples


def zoo_rows(
    tokenizer: transformers.PreTrainedTokenizerBase, spec: ZooSpec, train: list[dict], heldout: list[dict]
) -> ZooRows:
    """Encode, order (``spec.seed``) and pack the examples into ``spec.seq_len`` rows; held-out text is cut to
    ``spec.eval_tokens`` when set."""
    train_ids = encode_examples(tokenizer, shuffled(train, spec.seed))
    heldout_ids = encode_examples(tokenizer, heldout)
    train_rows = pack(train_ids, spec.seq_len)  # [N, T]
    if train_rows.shape[0] < spec.batch_size:
        raise ConfigError(
            f"only {train_rows.shape[0]} training rows for batch_size {spec.batch_size}; "
            "use more train examples or a smaller batch_size/seq_len"
        )
    if spec.eval_tokens is not None:
        heldout_ids = [[t for seq in heldout_ids for t in seq][: spec.eval_tokens]]
    n_heldout = sum(len(s) for s in heldout_ids)
    return ZooRows(
        train=train_rows,
        heldout=pack(heldout_ids, spec.seq_len, keep_tail=True),
        n_heldout=n_heldout,
        train_tokens=sum(len(s) for s in train_ids),
    )


# ------------------------------------------------------------------------------------------------ a built zoo


def read_zoo_manifest(size: str = "tiny", home: str | os.PathLike | None = None) -> dict:
    """The manifest of a built zoo (raises :class:`DraftsmithError` if it is not built)."""
    path = zoo_path(size, "manifest.json", home)
    manifest = read_json(path)
    if manifest is None:
        raise DraftsmithError(f"no zoo manifest at {path}; build it with `draftsmith zoo build --size {size}`")
    return manifest


def load_zoo(
    size: str = "tiny", home: str | os.PathLike | None = None
) -> tuple[transformers.PreTrainedTokenizerBase, transformers.PreTrainedModel, transformers.PreTrainedModel]:
    """``(tokenizer, target, draft)`` of the built zoo of ``size`` in eval mode (raises :class:`DraftsmithError`
    if it is not built; :func:`draftsmith.trainers.zoo.ensure_zoo` builds it)."""
    read_zoo_manifest(size, home)
    tokenizer = transformers.AutoTokenizer.from_pretrained(zoo_path(size, "tokenizer", home))
    target = transformers.AutoModelForCausalLM.from_pretrained(zoo_path(size, "target", home)).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(zoo_path(size, "draft", home)).eval()
    return tokenizer, target, draft


__all__ = [
    "ModelSpec",
    "ZooSpec",
    "ZOO_SIZES",
    "zoo_spec",
    "frequent_tokens",
    "ZOO_FOR_TARGET",
    "zoo_size_for_target",
    "ZOO_FAMILIES",
    "family_size",
    "zoo_model_config",
    "param_count",
    "zoo_examples",
    "train_zoo_tokenizer",
    "pack",
    "shuffled",
    "ZooRows",
    "zoo_rows",
    "read_zoo_manifest",
    "load_zoo",
]
