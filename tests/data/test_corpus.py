"""The shipped corpus: files and licenses in the package, readers, the held-out split, the eval questions."""

from __future__ import annotations

import gzip
import hashlib
import json
import re

import pytest

from draftsmith.common.errors import DataError
from draftsmith.data import corpus


@pytest.fixture(scope="module")
def splits():
    return corpus.corpus_splits()


# ------------------------------------------------------------------------------------------- shipped files


def test_every_shipped_file_is_in_the_package_with_its_license():
    root = corpus.corpora_dir()
    assert root.is_dir() and root.parent.name == "data"
    for relpath in corpus.CORPUS_FILES:
        path = root / relpath
        assert path.is_file() and path.suffix == ".gz", relpath
        assert (path.parent / "LICENSE").is_file(), f"no LICENSE beside {relpath}"
        assert gzip.decompress(path.read_bytes())  # a valid, non-empty gzip stream


def test_sources_md_checksums_match_the_shipped_files():
    sources = (corpus.corpora_dir() / "SOURCES.md").read_text()
    for relpath in corpus.CORPUS_FILES:
        data = (corpus.corpora_dir() / relpath).read_bytes()
        shipped, upstream = hashlib.sha256(data).hexdigest(), hashlib.sha256(gzip.decompress(data)).hexdigest()
        row = next(line for line in sources.splitlines() if line.startswith(f"| {relpath} |") and shipped in line)
        assert upstream in row
    assert corpus.corpus_sha256() in sources


def test_corpus_sha256_is_a_stable_content_hash():
    digest = corpus.corpus_sha256()
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert corpus.corpus_sha256() == digest


def test_dev_questions_are_shipped_in_spec_bench_format():
    path = corpus.dev_questions_path()
    assert path.parent == corpus.eval_dir()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 324
    assert {r["category"] for r in rows} == {"coding", "math_reasoning"}
    assert len({r["question_id"] for r in rows}) == len(rows)
    assert all(r["turns"] and all(isinstance(t, str) and t for t in r["turns"]) for r in rows)
    for name in ("humaneval", "gsm8k"):
        assert (corpus.eval_dir() / name / "LICENSE").is_file()
    assert (corpus.eval_dir() / "SOURCES.md").is_file()


def test_project_code_never_reads_the_shared_folder():
    from draftsmith.common import threads
    from draftsmith.data import tokenizer, zoo
    from draftsmith.launch import zoo_cli
    from draftsmith.trainers import pretrain
    from draftsmith.trainers import zoo as zoo_build

    for module in (corpus, tokenizer, zoo, zoo_cli, pretrain, zoo_build, threads):
        assert "/work/shared" not in open(module.__file__).read()


# --------------------------------------------------------------------------------------------------- readers


def test_instruction_rows_become_user_assistant_turns():
    rows = [
        {"instruction": "Add", "input": "2 and 3", "response": "5"},
        {"instruction": "Say hi", "input": "", "response": "hi"},
        {"instruction": "", "input": "x", "response": "dropped: no instruction"},
        {"instruction": "dropped: no response", "input": "", "response": "  "},
    ]
    out = list(corpus.instruction_examples(json.dumps(rows), "src"))
    assert out == [
        {"source": "src", "messages": [{"role": "user", "content": "Add\n\n2 and 3"},
                                       {"role": "assistant", "content": "5"}]},
        {"source": "src", "messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]},
    ]  # fmt: skip


def test_question_answer_rows_become_user_assistant_turns():
    text = '{"question": "1+1?", "answer": "2\\n#### 2"}\n\n{"question": "", "answer": "x"}\n'
    assert list(corpus.question_answer_examples(text, "gsm")) == [
        {"source": "gsm", "messages": [{"role": "user", "content": "1+1?"},
                                       {"role": "assistant", "content": "2\n#### 2"}]}
    ]  # fmt: skip


def test_plain_text_is_chunked_at_paragraph_boundaries():
    paragraphs = [f"Speaker {i}:\n" + "word " * (i % 7 + 3) for i in range(40)]
    text = "\n\n".join(paragraphs) + "\n"
    chunks = list(corpus.plain_text_examples(text, "play", chunk_chars=200))
    assert len(chunks) > 3 and all(set(c) == {"source", "text"} for c in chunks)
    assert all(len(c["text"]) >= 200 for c in chunks[:-1])  # each chunk but the last reaches the target size
    rejoined = [p for c in chunks for p in c["text"].split("\n\n")]
    assert rejoined == [p.strip("\n") for p in paragraphs]  # nothing lost, nothing cut, order kept


# ------------------------------------------------------------------------------------------------ the split


def test_splits_are_disjoint_and_about_two_percent(splits):
    train, heldout = splits["train"], splits["heldout"]
    train_keys = {corpus.example_key(e) for e in train}
    heldout_keys = {corpus.example_key(e) for e in heldout}
    assert not train_keys & heldout_keys
    assert len(train_keys) == len(train) and len(heldout_keys) == len(heldout)  # duplicates kept once
    assert 0.01 < len(heldout) / (len(train) + len(heldout)) < 0.03
    sources = {e["source"] for e in train}
    assert len(sources) == len(corpus.CORPUS_FILES) and sources == {e["source"] for e in heldout}


def test_split_depends_on_content_only(splits):
    for example in splits["heldout"][:20]:
        assert corpus.split_of(example) == "heldout"
        assert corpus.split_of({**example, "source": "elsewhere"}) == "heldout"
    for example in splits["train"][:20]:
        assert corpus.split_of(example) == "train"


def test_examples_are_chat_or_text(splits):
    for example in splits["train"]:
        if "messages" in example:
            assert [m["role"] for m in example["messages"]] == ["user", "assistant"]
            assert all(m["content"] and m["content"] == m["content"].strip() for m in example["messages"])
        else:
            assert example["text"].strip() and example["source"].startswith("tinyshakespeare")
    assert sum(len("".join(corpus.example_texts(e))) for e in splits["train"]) > 10_000_000


def test_load_corpus_matches_splits_and_rejects_unknown_split(splits):
    assert corpus.load_corpus("heldout") == splits["heldout"]
    with pytest.raises(DataError, match="unknown corpus split"):
        corpus.load_corpus("validation")
