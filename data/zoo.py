"""The built-in model zoo: a tokenizer, a target and a draft pretrained by draftsmith on its shipped corpus.

``build_zoo("tiny")`` trains, deterministically from ``spec.seed``, three stages into
``$DRAFTSMITH_HOME/zoo/<size>/`` (default ``~/.cache/draftsmith``):

- ``tokenizer/`` byte-level BPE with a chat template (:mod:`draftsmith.data.tokenizer`);
- ``target/`` and ``draft/`` Llama models (ordinary Hugging Face directories, safetensors), each trained
  independently from scratch on the train split of the corpus (chat-formatted, packed into fixed-length
  sequences) with AdamW and a warmup + cosine learning rate, and scored on the held-out split;

then writes ``manifest.json`` (configs, parameter counts, tokens seen, held-out losses, train times, corpus
hash, seed, build time). Token budgets, not minutes, set how long each model trains, so the bigger target ends
with the lower held-out loss.

Work is resumable: every ``spec.checkpoint_every`` steps the model, optimizer and step (the data position
follows from the step) are written atomically under ``.build/``; a finished stage is skipped on rerun; the
build directory is locked while a build runs.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from tqdm.auto import tqdm

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.io import atomic_write_text, environment, sha256_file

MANIFEST_FORMAT = "draftsmith-zoo/1"
MODEL_ROLES = ("target", "draft")
PRECISIONS = ("auto", "bf16", "fp32")
STAGES = ("tokenizer", *MODEL_ROLES)

# called after every optimizer step with (stage, step); raising from it interrupts the build (tests use it)
StepHook = Callable[[str, int], None]


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


def zoo_spec(size: str) -> ZooSpec:
    """The built-in spec of ``size`` (one of :data:`ZOO_SIZES`)."""
    if size not in ZOO_SIZES:
        raise ConfigError(f"unknown zoo size {size!r}; use one of {', '.join(ZOO_SIZES)}")
    return ZOO_SIZES[size]()


def draftsmith_home(home: str | os.PathLike | None = None) -> Path:
    """``home``, else ``$DRAFTSMITH_HOME``, else ``~/.cache/draftsmith``."""
    if home is not None:
        return Path(home).expanduser()
    return Path(os.environ.get("DRAFTSMITH_HOME") or Path.home() / ".cache" / "draftsmith").expanduser()


def zoo_dir(size: str = "tiny", home: str | os.PathLike | None = None) -> Path:
    """Where the zoo of ``size`` lives: ``<home>/zoo/<size>`` (it may not be built yet)."""
    if not size or "/" in size or size.startswith("."):
        raise ConfigError(f"invalid zoo size {size!r}; use one of {', '.join(ZOO_SIZES)}")
    return draftsmith_home(home) / "zoo" / size


# ----------------------------------------------------------------------------------------------- small helpers


def atomic_torch_save(obj: object, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def default_threads(device: str) -> int:
    """Intra-op CPU threads for a build: torch's default, lowered to the cores other processes leave idle.

    On a busy machine a second spinning OpenMP thread makes training several times slower, not faster
    (measured here: 2 threads ran at 1/7 the speed of 1 while other jobs used the cores)."""
    threads = torch.get_num_threads()
    if device == "cpu" and hasattr(os, "getloadavg"):
        idle = (os.cpu_count() or 1) - round(os.getloadavg()[0])
        threads = max(1, min(threads, idle))
    return threads


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run with ``threads`` intra-op threads, restoring the old value after."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` (a sibling ``.lock`` file) so two builds never interleave."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock_path = directory.with_name(f".{directory.name}.lock")
    with open(lock_path, "w") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX: no locking
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written directory into place (replacing an older one)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


# ------------------------------------------------------------------------------------------------------- data


def pack(sequences: list[list[int]], seq_len: int, pad_id: int = 0, keep_tail: bool = False) -> torch.Tensor:
    """Concatenate token sequences and cut them into rows of ``seq_len``.  # [N, seq_len]

    With ``keep_tail`` the last partial row is padded with ``pad_id`` (use :func:`heldout_loss`, which
    ignores the padding); otherwise it is dropped."""
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


def batch_rows(step: int, batch_size: int, n_rows: int, seed: int) -> torch.Tensor:
    """Row indices of the batch at ``step``: epochs of seeded permutations, so a step fixes the data position."""
    first = step * batch_size
    epochs = {(first + k) // n_rows for k in range(batch_size)}
    perms = {e: torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed * 100_003 + e)) for e in epochs}
    return torch.stack([perms[(first + k) // n_rows][(first + k) % n_rows] for k in range(batch_size)])


# ----------------------------------------------------------------------------------------------------- models


def llama_config(spec: ZooSpec, role: str) -> transformers.LlamaConfig:
    """The ``LlamaConfig`` of the zoo's ``role`` model (tied embeddings, specials 0/1/2 = pad/bos/eos)."""
    m = spec.model(role)
    cfg = transformers.LlamaConfig(
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
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    """The autocast dtype for training (``None``: plain fp32); ``auto`` picks bf16 only where it is native."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    try:  # oneDNN reports whether this CPU has native bf16 (AVX512-BF16 or AMX)
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None
    except (AttributeError, RuntimeError):
        return None


def param_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, total: int, m: ModelSpec) -> float:
    """Linear warmup to ``m.lr`` over ``m.warmup_steps``, then cosine decay to ``m.lr * m.min_lr_ratio``."""
    if step < m.warmup_steps:
        return m.lr * (step + 1) / m.warmup_steps
    progress = (step - m.warmup_steps) / max(1, total - m.warmup_steps)
    return m.lr * (m.min_lr_ratio + (1 - m.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model: torch.nn.Module, m: ModelSpec) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (norm weights are not decayed)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": m.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=m.lr, betas=(0.9, 0.95), eps=1e-8)


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Summed next-token cross-entropy: -sum_t log p(x_{t+1} | x_<=t) over the non-padding targets."""
    # logits [B, T, V], input_ids [B, T], pad_mask [B, T] (True = padding)
    labels = input_ids[:, 1:].clone()
    if pad_mask is not None:
        labels[pad_mask[:, 1:]] = -100
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum")


@torch.inference_mode()
def heldout_loss(
    model: torch.nn.Module, rows: torch.Tensor, n_real: int, batch_size: int, device: str
) -> tuple[float, int]:
    """``(mean next-token loss in nats/token, number of scored targets)`` of ``model`` on packed ``rows``
    whose first ``n_real`` flat positions are real tokens (the rest is padding)."""
    # rows [N, T]; tokens at flat positions >= n_real are padding
    model.eval()
    total, count = 0.0, 0
    seq_len = rows.shape[1]
    for start in range(0, rows.shape[0], batch_size):
        x = rows[start : start + batch_size].to(device)  # [b, T]
        flat_pos = torch.arange(start * seq_len, (start + x.shape[0]) * seq_len, device=device).view_as(x)
        pad = flat_pos >= n_real  # [b, T]
        total += lm_loss(model(input_ids=x).logits, x, pad).item()
        count += int((~pad[:, 1:]).sum())
    return total / max(1, count), count


def train_model(
    model: torch.nn.Module,
    rows: torch.Tensor,
    m: ModelSpec,
    spec: ZooSpec,
    stage: str,
    seed: int,
    checkpoint: Path,
    device: str,
    on_step: StepHook | None = None,
    progress: bool = True,
) -> dict:
    """Train ``model`` on packed ``rows`` [N, T] for ``spec.steps(stage)`` steps, resuming from ``checkpoint``.

    Returns ``{"steps", "tokens_seen", "train_seconds", "final_train_loss", "precision"}``."""
    total = spec.steps(stage)
    dtype = autocast_dtype(spec.precision, device)
    optimizer = make_optimizer(model, m)
    state = {"step": 0, "train_seconds": 0.0, "loss_ema": None}
    if checkpoint.exists():
        saved = torch.load(checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
    tokens_per_step = spec.batch_size * spec.seq_len
    bar = tqdm(total=total, initial=state["step"], desc=f"zoo {spec.size} {stage}", unit="step", disable=not progress)
    model.train()
    while state["step"] < total:
        step = state["step"]
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total, m)
        x = rows[batch_rows(step, spec.batch_size, rows.shape[0], seed)].to(device)  # [B, T]
        with torch.autocast(device.split(":")[0], dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(input_ids=x).logits  # [B, T, V]
        loss = lm_loss(logits, x) / (x.shape[0] * (x.shape[1] - 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), m.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        ema = state["loss_ema"]
        state = {
            "step": step + 1,
            "train_seconds": state["train_seconds"] + time.perf_counter() - started,
            "loss_ema": value if ema is None else 0.95 * ema + 0.05 * value,
        }
        if state["step"] % spec.checkpoint_every == 0 and state["step"] < total:
            atomic_torch_save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, checkpoint
            )
        bar.update(1)
        bar.set_postfix(
            loss=f"{state['loss_ema']:.3f}",
            tok_s=f"{state['step'] * tokens_per_step / max(state['train_seconds'], 1e-9):.0f}",
        )
        if on_step is not None:
            on_step(stage, state["step"])
    bar.close()
    return {
        "steps": total,
        "tokens_seen": total * tokens_per_step,
        "train_seconds": round(state["train_seconds"], 3),
        "final_train_loss": None if state["loss_ema"] is None else round(state["loss_ema"], 4),
        "precision": "fp32" if dtype is None else "bf16 autocast",
    }


# ------------------------------------------------------------------------------------------------------ build


def _fingerprint(spec: ZooSpec, corpus_hash: str) -> dict:
    return {"spec": asdict(spec), "corpus_sha256": corpus_hash}


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _stage_done(out: Path, stage: str) -> dict | None:
    record = _read_json(out / ".build" / f"{stage}.json")
    return record if record is not None and (out / stage).is_dir() else None


def _environment(device: str) -> dict:
    import tokenizers

    return environment(tokenizers=tokenizers.__version__, device=device, threads=torch.get_num_threads())


def _build_tokenizer(out: Path, spec: ZooSpec, train: list[dict]) -> dict:
    from draftsmith.data.corpus import example_texts
    from draftsmith.data.tokenizer import train_tokenizer

    started = time.perf_counter()
    tokenizer = train_tokenizer((t for e in train for t in example_texts(e)), spec.vocab_size, spec.max_positions)
    tmp = out / ".build" / "tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    publish_dir(tmp, out / "tokenizer")
    return {
        "path": "tokenizer",
        "vocab_size": len(tokenizer),
        "sha256": sha256_file(out / "tokenizer" / "tokenizer.json"),
        "train_seconds": round(time.perf_counter() - started, 3),
    }


def _build_model(
    out: Path,
    spec: ZooSpec,
    role: str,
    train_rows: torch.Tensor,
    heldout: tuple[torch.Tensor, int],
    device: str,
    on_step: StepHook | None,
    progress: bool,
) -> dict:
    started = time.perf_counter()
    seed = spec.seed * 1000 + MODEL_ROLES.index(role) + 1  # target and draft are independent
    torch.manual_seed(seed)
    config = llama_config(spec, role)
    model = transformers.LlamaForCausalLM(config).to(device)
    checkpoint = out / ".build" / f"{role}.ckpt.pt"
    stats = train_model(model, train_rows, spec.model(role), spec, role, seed, checkpoint, device, on_step, progress)
    rows, n_real = heldout
    loss, n_scored = heldout_loss(model, rows, n_real, spec.eval_batch_size, device)
    tmp = out / ".build" / f"{role}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.to("cpu").save_pretrained(tmp, safe_serialization=True)
    publish_dir(tmp, out / role)
    checkpoint.unlink(missing_ok=True)
    return {
        "path": role,
        "config": config.to_diff_dict(),
        "parameters": param_count(model),
        **stats,
        "tokens_per_second": round(stats["tokens_seen"] / max(stats["train_seconds"], 1e-9), 1),
        "heldout_loss": round(loss, 4),
        "heldout_tokens": n_scored,
        "weights_sha256": sha256_file(out / role / "model.safetensors"),
        "stage_seconds": round(time.perf_counter() - started, 3),
    }


def build_zoo(
    size: str = "tiny",
    home: str | os.PathLike | None = None,
    spec: ZooSpec | None = None,
    force: bool = False,
    *,
    device: str | None = None,
    threads: int | None = None,
    progress: bool = True,
    on_step: StepHook | None = None,
) -> Path:
    """Build (or finish building) the zoo of ``size`` and return its directory.

    ``spec`` overrides the built-in spec of ``size`` (e.g. a reduced one in tests). An existing complete zoo
    is returned as is; if it was built from a different spec or corpus, this raises unless ``force``, which
    rebuilds from scratch. An interrupted build resumes from its last checkpoint. ``on_step(stage, step)``
    is called after every optimizer step. ``threads`` defaults to :func:`default_threads`; weights are
    bit-identical across builds with the same spec, machine and thread count."""
    from draftsmith.data.corpus import corpus_sha256, corpus_splits
    from draftsmith.data.tokenizer import encode_examples

    spec = spec if spec is not None else zoo_spec(size)
    out = zoo_dir(size, home)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = threads or default_threads(device)
    corpus_hash = corpus_sha256()
    fingerprint = _fingerprint(spec, corpus_hash)
    with build_lock(out), torch_threads(threads):
        manifest = _read_json(out / "manifest.json")
        if manifest is not None and not force:
            if _fingerprint(ZooSpec(**manifest["spec"]), manifest["corpus_sha256"]) != fingerprint:
                raise ConfigError(
                    f"the zoo at {out} was built from a different spec or corpus; "
                    f"rebuild it by adding --force (`draftsmith zoo build --size {size} --force`)"
                )
            return out
        build = out / ".build"
        if force or _read_json(build / "fingerprint.json") != fingerprint:
            for name in (*STAGES, ".build", "manifest.json"):  # stale partial work: start over
                target = out / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
        build.mkdir(parents=True, exist_ok=True)
        atomic_write_text(build / "fingerprint.json", json.dumps(fingerprint, indent=1))

        started = time.perf_counter()
        splits = corpus_splits()
        train, heldout = splits["train"], splits["heldout"]
        data_seconds = time.perf_counter() - started
        if spec.max_train_examples is not None:
            train = train[: spec.max_train_examples]
        records = {}
        record = _stage_done(out, "tokenizer")
        if record is None:
            record = _build_tokenizer(out, spec, train)
            atomic_write_text(build / "tokenizer.json", json.dumps(record, indent=1))
        records["tokenizer"] = record

        started = time.perf_counter()
        tokenizer = transformers.AutoTokenizer.from_pretrained(out / "tokenizer")
        train_ids = encode_examples(tokenizer, shuffled(train, spec.seed))
        heldout_ids = encode_examples(tokenizer, heldout)
        train_rows = pack(train_ids, spec.seq_len)  # [N, T]
        if train_rows.shape[0] < spec.batch_size:
            raise ConfigError(
                f"only {train_rows.shape[0]} training rows for batch_size {spec.batch_size}; "
                "use more train examples or a smaller batch_size/seq_len"
            )
        if spec.eval_tokens is not None:
            heldout_flat = [t for seq in heldout_ids for t in seq][: spec.eval_tokens]
            heldout_ids = [heldout_flat]
        n_heldout = sum(len(s) for s in heldout_ids)
        heldout_rows = pack(heldout_ids, spec.seq_len, keep_tail=True)
        data_seconds += time.perf_counter() - started

        for role in MODEL_ROLES:
            record = _stage_done(out, role)
            if record is None:
                record = _build_model(out, spec, role, train_rows, (heldout_rows, n_heldout), device, on_step, progress)
                atomic_write_text(build / f"{role}.json", json.dumps(record, indent=1))
            records[role] = record

        from draftsmith.common import __version__

        manifest = {
            "format": MANIFEST_FORMAT,
            "size": size,
            "draftsmith_version": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seed": spec.seed,
            "corpus_sha256": corpus_hash,
            "corpus": {
                "train_examples": len(train),
                "heldout_examples": len(heldout),
                "train_tokens": sum(len(s) for s in train_ids),
                "heldout_tokens_scored": n_heldout,
            },
            "spec": asdict(spec),
            "tokenizer": records["tokenizer"],
            "models": {role: records[role] for role in MODEL_ROLES},
            "build_seconds": round(
                records["tokenizer"]["train_seconds"]
                + data_seconds
                + sum(records[role]["stage_seconds"] for role in MODEL_ROLES),
                1,
            ),
            "environment": _environment(device),
        }
        atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(build, ignore_errors=True)
    return out


def read_manifest(size: str = "tiny", home: str | os.PathLike | None = None) -> dict:
    """The manifest of a built zoo (raises :class:`DraftsmithError` if it is not built)."""
    path = zoo_dir(size, home) / "manifest.json"
    manifest = _read_json(path)
    if manifest is None:
        raise DraftsmithError(f"no zoo manifest at {path}; build it with `draftsmith zoo build --size {size}`")
    return manifest


def ensure_zoo(size: str = "tiny", home: str | os.PathLike | None = None, **build_kwargs) -> Path:
    """The zoo directory of ``size``, building it first if it is missing or unfinished."""
    out = zoo_dir(size, home)
    if (out / "manifest.json").is_file():
        return out
    return build_zoo(size, home, **build_kwargs)


def load_zoo(
    size: str = "tiny", home: str | os.PathLike | None = None
) -> tuple[transformers.PreTrainedTokenizerBase, transformers.PreTrainedModel, transformers.PreTrainedModel]:
    """``(tokenizer, target, draft)`` of the zoo of ``size`` in eval mode (built first if missing)."""
    out = ensure_zoo(size, home)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "tokenizer")
    target = transformers.AutoModelForCausalLM.from_pretrained(out / "target").eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(out / "draft").eval()
    return tokenizer, target, draft


__all__ = [
    "ModelSpec",
    "ZooSpec",
    "ZOO_SIZES",
    "zoo_spec",
    "zoo_dir",
    "build_zoo",
    "ensure_zoo",
    "load_zoo",
    "read_manifest",
]
