"""The corpus draftsmith ships (``data/corpora``) turned into chat and plain-text training examples.

Every example is a dict with a ``source`` key and either ``messages`` (a user turn and an assistant turn, the
OpenAI chat form) or ``text`` (a plain-text chunk). A deterministic ~2% of the examples, chosen by the sha256
of each example's content (so the choice does not depend on order), form the held-out split that training
never sees::

    train = load_corpus("train")      # list of {"source", "messages"} / {"source", "text"}
    heldout = load_corpus("heldout")

The shipped files are found through the package (``Path(__file__).parent``), never through an absolute path.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path

from draftsmith.common.errors import DataError

SPLITS = ("train", "heldout")
HELDOUT_PER_MILLE = 20  # ~2% of the examples are held out
SHAKESPEARE_CHUNK_CHARS = 1500

# shipped file (relative to data/corpora) -> reader name; sorted by path (corpus_sha256 depends on the order)
CORPUS_FILES = {
    "gpteacher/codegen-instruct.json.gz": "instruction",
    "gpteacher/roleplay-simple-deduped-roleplay-instruct.json.gz": "instruction",
    "gpteacher/toolformer-dedupe-only-dataset.json.gz": "instruction",
    "gsm8k/train.jsonl.gz": "question_answer",
    "tinyshakespeare/input.txt.gz": "plain_text",
}


def corpora_dir() -> Path:
    """The directory of the shipped training corpus (inside the installed package)."""
    return Path(__file__).parent / "corpora"


def eval_dir() -> Path:
    """The directory of the shipped evaluation questions (inside the installed package)."""
    return Path(__file__).parent / "eval"


# bundled question sets by name (Spec-Bench question format; provenance in data/eval/SOURCES.md)
QUESTION_SETS = {
    "dev": "dev_questions.jsonl",  # 324: HumanEval prompts (coding) and GSM8K test questions (math_reasoning)
    "broad": "dev_broad.jsonl",  # 244 in 12 categories: writing, roleplay, reasoning, math, coding, extraction, ...
    "openings": "openings.jsonl",  # 74 texts to continue, no chat turns: a base model's prompts (corpus_openings)
}


def question_set_path(name: str = "dev") -> Path:
    """The file of a bundled question set (``dev``, the evaluator's default, or ``broad``)."""
    if name not in QUESTION_SETS:
        raise DataError(f"no bundled question set {name!r}: choose one of {', '.join(QUESTION_SETS)}, or pass a file")
    path = eval_dir() / QUESTION_SETS[name]
    if not path.is_file():
        raise DataError(f"the shipped question file {path} is missing; reinstall draftsmith (`pip install -e .`)")
    return path


def dev_questions_path() -> Path:
    """The evaluator's default question set (Spec-Bench question format, 324 questions)."""
    return question_set_path("dev")


def read_shipped(relpath: str) -> str:
    """The decompressed text of one shipped corpus file, e.g. ``"gsm8k/train.jsonl.gz"``."""
    path = corpora_dir() / relpath
    if not path.is_file():
        raise DataError(f"the shipped corpus file {path} is missing; reinstall draftsmith (`pip install -e .`)")
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8")


def corpus_sha256() -> str:
    """sha256 of the lines ``<shipped file>\\t<sha256 of its decompressed bytes>\\n`` in path order.

    It identifies the corpus content (not its compression); the zoo manifest records it."""
    outer = hashlib.sha256()
    for relpath in sorted(CORPUS_FILES):
        inner = hashlib.sha256(read_shipped(relpath).encode("utf-8")).hexdigest()
        outer.update(f"{relpath}\t{inner}\n".encode())
    return outer.hexdigest()


def chat_example(user: str, assistant: str, source: str) -> dict:
    """``{"source", "messages": [user turn, assistant turn]}``."""
    return {
        "source": source,
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
    }


def instruction_examples(text: str, source: str) -> Iterator[dict]:
    """GPTeacher / Alpaca-like rows ``{instruction, input, response}`` (a JSON list) -> chat examples.

    The user turn is the instruction, followed by a blank line and the input when the input is not empty.
    Rows with an empty instruction or response are skipped."""
    for row in json.loads(text):
        instruction = (row.get("instruction") or "").strip()
        extra = (row.get("input") or "").strip()
        response = (row.get("response") or row.get("output") or "").strip()
        if not instruction or not response:
            continue
        user = f"{instruction}\n\n{extra}" if extra else instruction
        yield chat_example(user, response, source)


def question_answer_examples(text: str, source: str) -> Iterator[dict]:
    """GSM8K rows ``{question, answer}`` (JSON lines) -> chat examples; empty rows are skipped."""
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        question, answer = (row.get("question") or "").strip(), (row.get("answer") or "").strip()
        if question and answer:
            yield chat_example(question, answer, source)


def plain_text_examples(text: str, source: str, chunk_chars: int = SHAKESPEARE_CHUNK_CHARS) -> Iterator[dict]:
    """Plain text -> ``{"source", "text"}`` chunks of whole blank-line-separated paragraphs.

    Paragraphs are joined until a chunk reaches ``chunk_chars`` characters (a single longer paragraph is
    kept whole), so no speech is cut in the middle."""
    paragraphs = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
    chunk: list[str] = []
    size = -2  # length of "\n\n".join(chunk)
    for paragraph in paragraphs:
        chunk.append(paragraph)
        size += len(paragraph) + 2
        if size >= chunk_chars:
            yield {"source": source, "text": "\n\n".join(chunk)}
            chunk, size = [], -2
    if chunk:
        yield {"source": source, "text": "\n\n".join(chunk)}


READERS = {
    "instruction": instruction_examples,
    "question_answer": question_answer_examples,
    "plain_text": plain_text_examples,
}


def example_key(example: dict) -> str:
    """sha256 of an example's content (its messages or text, not its source), used to split it."""
    content = example["messages"] if "messages" in example else example["text"]
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def split_of_key(key: str) -> str:
    """``"heldout"`` for a deterministic ~2% of content hashes, else ``"train"``."""
    return "heldout" if int(key[:8], 16) % 1000 < HELDOUT_PER_MILLE else "train"


def split_of(example: dict) -> str:
    """The split an example belongs to (decided by its content alone, see :func:`example_key`)."""
    return split_of_key(example_key(example))


def iter_corpus() -> Iterator[dict]:
    """Every example of the shipped corpus, in file order, both splits."""
    for relpath, reader in CORPUS_FILES.items():
        source = relpath.split("/")[0] + "/" + relpath.split("/")[-1].split(".")[0]
        yield from READERS[reader](read_shipped(relpath), source)


def corpus_splits() -> dict[str, list[dict]]:
    """``{"train": [...], "heldout": [...]}`` in one pass over the corpus, each in file order.

    An example whose content repeats an earlier one is kept once (duplicates always share a split, since
    the split is decided by content)."""
    seen: set[str] = set()
    out: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for example in iter_corpus():
        key = example_key(example)
        if key in seen:
            continue
        seen.add(key)
        out[split_of_key(key)].append(example)
    return out


def load_corpus(split: str = "train") -> list[dict]:
    """The examples of one split (``"train"`` or ``"heldout"``), in file order (see :func:`corpus_splits`)."""
    if split not in SPLITS:
        raise DataError(f"unknown corpus split {split!r}; use one of {', '.join(SPLITS)}")
    return corpus_splits()[split]


def example_texts(example: dict) -> list[str]:
    """The raw strings in an example (message contents or the text), e.g. to train a tokenizer on."""
    if "messages" in example:
        return [m["content"] for m in example["messages"]]
    return [example["text"]]


def corpus_openings(per_source: int = 16, chars: int = 80) -> list[dict]:
    """Completion prompts for a base model: the first ``chars`` characters (cut at a space) of the answers of the
    held-out corpus, the first ``per_source`` of each source, as Spec-Bench rows with ``completion: true`` (the
    text is continued as is, without the chat template). The shipped ``openings`` set is this list."""
    rows, taken = [], {}
    for example in load_corpus("heldout"):
        origin, _, subset = example.get("source", "corpus").partition("/")
        source = subset.split("-")[0] if origin == "gpteacher" else origin  # gpteacher's subsets: codegen, roleplay ...
        text = example["messages"][-1]["content"] if "messages" in example else example["text"]
        if taken.get(source, 0) >= per_source or len(text) <= chars:
            continue
        taken[source] = taken.get(source, 0) + 1
        cut = text[:chars]
        opening = cut[: cut.rfind(" ")] if " " in cut.strip() else cut
        rows.append({"question_id": f"{source}-{taken[source]}", "category": source, "turns": [opening.rstrip()],
                     "completion": True})
    return rows


def random_subset(items: list, n: int | None, seed: int) -> list:
    """``n`` of ``items`` drawn at random (seeded); all of them, in order, when ``n`` is None or not smaller."""
    if n is None or n >= len(items):
        return items
    return random.Random(seed).sample(items, n)


def balanced_subset(rows: list[dict], n: int | None, seed: int) -> list[dict]:
    """``n`` rows with an equal share from every ``source`` (a source smaller than its share gives all it has and
    the rest is shared among the others), seeded; all rows when ``n`` is None."""
    if n is None or n >= len(rows):
        return rows
    by_source: dict[str, list[dict]] = {}
    for row in rows:
        by_source.setdefault(row.get("source", ""), []).append(row)
    quota, left, picked = {}, n, []
    for name in sorted(by_source, key=lambda k: len(by_source[k])):  # smallest first: leftovers flow to larger
        share = left // (len(by_source) - len(quota))
        quota[name] = min(share, len(by_source[name]))
        left -= quota[name]
    for name in sorted(by_source):
        picked += random_subset(by_source[name], quota[name], seed)
    random.Random(seed).shuffle(picked)
    return picked
