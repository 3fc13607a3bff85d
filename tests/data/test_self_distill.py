"""Self-distillation: batched answers equal one-at-a-time answers, sampling is per row, runs resume after a kill
with every prompt answered once, and a file made with other settings or another target is refused."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.common.errors import ConfigError, DataError
from draftsmith.common.models import target_identity
from draftsmith.data.chat import BadRow
from draftsmith.data.generation import inverse_cdf, nucleus_probs, sample_completions
from draftsmith.data.row_files import (
    append_rows,
    meta_path,
    recover_rows,
    row_seed,
    sums_path,
    weights_sample_sha256,
)
from draftsmith.data.self_distill import (
    META_FORMAT,
    answer_row,
    answered_by,
    dataset_prompts,
    generate_answers,
    length_batches,
    prompt_id,
    prompts_sha256,
    row_prompt,
)
from draftsmith.data.tiny_models import char_tokenizer, random_model

SETTINGS = {"max_new_tokens": 12, "progress": False}


class Killed(Exception):
    """Stands in for a kill between two batches."""



@pytest.fixture(scope="module")
def prompts():
    """Nine prompts of different lengths (so batches need padding); the third has an earlier exchange."""
    out = [[{"role": "user", "content": f"What is {i} plus {i}?" + " and more" * (i % 4)}] for i in range(9)]
    out[2] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2 plus 2?"}]
    return out


def _kill_after(batches: int):
    seen = []

    def on_batch(stats):
        seen.append(stats)
        if len(seen) == batches:
            raise Killed

    return on_batch


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ decoding


def test_batched_greedy_equals_one_at_a_time_token_for_token(model, tok, prompts):
    ids = [tok.apply_chat_template(p, tokenize=True, add_generation_prompt=True, return_dict=False) for p in prompts]
    settings = {"max_new_tokens": 16, "pad_token_id": 0, "eos_ids": [2]}
    batched = sample_completions(model, ids, **settings)  # one left-padded batch of 9
    one_by_one = [sample_completions(model, [p], **settings)[0] for p in ids]
    assert batched == one_by_one
    assert len({len(p) for p in ids}) > 3  # really padded


def test_batched_file_equals_sequential_file(model, tok, prompts, tmp_path):
    batched = generate_answers(model, tok, prompts, tmp_path / "b.jsonl", batch_size=4, **SETTINGS)
    sequential = generate_answers(model, tok, prompts, tmp_path / "s.jsonl", batch_size=1, **SETTINGS)
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "s.jsonl").read_text()
    assert batched["rows"] == sequential["rows"] == 9 and batched["tokens"] == sequential["tokens"] > 0
    rows = _rows(tmp_path / "b.jsonl")
    assert [r["id"] for r in rows] == [prompt_id(p) for p in prompts]  # prompt order, not batch order
    assert rows[2]["messages"][:-1] == prompts[2] and rows[2]["messages"][-1]["role"] == "assistant"
    assert all(r["finish"] in ("eos", "length") and 1 <= r["num_tokens"] <= 12 for r in rows)


def test_sampling_is_reproducible_per_row_whatever_the_batching(model, tok, prompts, tmp_path):
    sampled = {"temperature": 0.9, "top_p": 0.8, "seed": 3, **SETTINGS}
    generate_answers(model, tok, prompts, tmp_path / "a.jsonl", batch_size=5, **sampled)
    generate_answers(model, tok, prompts, tmp_path / "b.jsonl", batch_size=2, **sampled)
    generate_answers(model, tok, prompts, tmp_path / "c.jsonl", batch_size=5, **(sampled | {"seed": 4}))
    generate_answers(model, tok, prompts, tmp_path / "g.jsonl", batch_size=5, **SETTINGS)
    a, b, c, g = (_rows(tmp_path / f"{n}.jsonl") for n in "abcg")
    assert a == b
    assert [r["messages"][-1] for r in a] != [r["messages"][-1] for r in c]
    assert [r["messages"][-1] for r in a] != [r["messages"][-1] for r in g]
    assert row_seed(3, "x") == row_seed(3, "x") != row_seed(3, "y")


def test_inverse_cdf_draws_the_nucleus_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = nucleus_probs(logits, temperature=1.0, top_p=0.8)  # 0.5 + 0.3 reaches 0.8: the rest dropped
    assert probs[0].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    n = 1000
    u = (torch.arange(n) + 0.5) / n  # an even grid of uniforms
    tokens = inverse_cdf(probs.expand(n, -1), u)
    assert torch.bincount(tokens, minlength=4).tolist() == [625, 375, 0, 0]
    assert inverse_cdf(probs, torch.tensor([0.99999999])).item() == 1  # never a token without mass
    hot = nucleus_probs(torch.tensor([[1.0, 2.0, 0.0]]), temperature=0.01, top_p=1.0)
    assert inverse_cdf(hot, torch.tensor([0.5])).item() == 1


def test_length_batches_and_rows(tok):
    assert length_batches([3, 9, 1, 9, 5], batch_size=2) == [[1, 3], [0, 4], [2]]
    prompt = [{"role": "user", "content": "hi"}]
    row = answer_row("p1", prompt, tok.encode("ok") + [2], tok, eos_ids=[2])
    assert row == {"id": "p1", "messages": [*prompt, {"role": "assistant", "content": "ok"}], "num_tokens": 3,
                   "finish": "eos"}
    assert answer_row("p1", prompt, tok.encode("ok"), tok, eos_ids=[2])["finish"] == "length"


# ------------------------------------------------------------------------------------------------ resuming


def test_resume_after_a_kill_answers_every_prompt_once(model, tok, prompts, tmp_path):
    full = tmp_path / "full.jsonl"
    generate_answers(model, tok, prompts, full, batch_size=3, **SETTINGS)
    out = tmp_path / "out.jsonl"
    with pytest.raises(Killed):
        generate_answers(model, tok, prompts, out, batch_size=3, on_batch=_kill_after(1), **SETTINGS)
    assert len(_rows(out)) == 3
    progress = json.loads(meta_path(out).read_text())["progress"]
    assert progress["rows"] == 3 and progress["complete"] is False
    with open(out, "a") as fh:  # killed while writing the next batch: a torn line
        fh.write('{"id": "abc", "messages": [{"role": "us')
    stats = generate_answers(model, tok, prompts, out, batch_size=2, **SETTINGS)
    assert stats["new_rows"] == 6 and stats["rows"] == 9 and stats["complete"]
    assert out.read_text() == full.read_text()  # same rows, same order, nothing twice
    again = generate_answers(model, tok, prompts, out, batch_size=3, **SETTINGS)
    assert again["new_rows"] == 0 and out.read_text() == full.read_text()
    meta = json.loads(meta_path(out).read_text())
    assert [r["rows"] for r in meta["runs"]] == [3, 6, 0] and [r["batch_size"] for r in meta["runs"]] == [3, 2, 3]


def test_recover_rows_cuts_only_a_torn_last_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a", "messages": []}\n{"id": "b", "mess')
    assert [r["id"] for r in recover_rows(path)] == ["a"]
    assert path.read_text() == '{"id": "a", "messages": []}\n'
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(DataError, match="line 2 .*--overwrite"):
        recover_rows(path)


def test_a_row_edited_since_it_was_written_is_refused_on_resume_with_its_line(model, tok, prompts, tmp_path):
    """Every row's sha256 goes to ``<out>.sha256`` before the row: a resume refuses a row changed since, naming its
    line; a row removed from the end (as a kill would leave) is answered again."""
    out = tmp_path / "out.jsonl"
    with pytest.raises(Killed):
        generate_answers(model, tok, prompts, out, batch_size=2, on_batch=_kill_after(2), **SETTINGS)
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and len(sums_path(out).read_text().splitlines()) == 4
    edited = lines[:2] + [lines[2].replace('"num_tokens": ', '"num_tokens": 1')] + lines[3:]
    out.write_text("\n".join(edited) + "\n")
    with pytest.raises(DataError, match=r"out\.jsonl line 3 was changed since it was written.*--overwrite") as err:
        generate_answers(model, tok, prompts, out, batch_size=2, **SETTINGS)
    assert "\n" not in str(err.value)
    out.write_text("\n".join(lines[:3]) + "\n")  # the edit undone, the last row gone: resumed
    assert generate_answers(model, tok, prompts, out, batch_size=2, **SETTINGS)["rows"] == 9
    assert recover_rows(out) and len(sums_path(out).read_text().splitlines()) == 9  # rewritten in prompt order


def test_rows_with_line_separators_inside_and_files_without_sums_are_read(tmp_path):
    path = tmp_path / "r.jsonl"
    append_rows(path, [{"id": "a", "text": "one\u2028two\x85three"}, {"id": "b"}])
    assert [r["id"] for r in recover_rows(path)] == ["a", "b"]
    sums_path(path).unlink()  # written before rows had sums: they get them
    assert len(recover_rows(path)) == 2 and len(sums_path(path).read_text().splitlines()) == 2


def test_resume_refuses_other_settings_or_target(model, tok, prompts, tmp_path):
    out = tmp_path / "out.jsonl"
    with pytest.raises(Killed):
        generate_answers(model, tok, prompts, out, batch_size=4, on_batch=_kill_after(1), **SETTINGS)
    for change in ({"temperature": 0.5}, {"max_new_tokens": 7}, {"top_p": 0.9}, {"seed": 1}):
        with pytest.raises(ConfigError, match="other settings.*--overwrite") as err:
            generate_answers(model, tok, prompts, out, batch_size=4, **(SETTINGS | change))
        assert "\n" not in str(err.value)
    other = random_model("llama", seed=1, layers=2)  # same config, other weights
    for target in (other, random_model("llama", seed=0, layers=1)):
        with pytest.raises(ConfigError, match="another target"):
            generate_answers(target, tok, prompts, out, batch_size=4, **SETTINGS)
    with pytest.raises(ConfigError, match="not in this prompt set"):
        generate_answers(model, tok, prompts[5:], out, batch_size=4, **SETTINGS)
    stats = generate_answers(other, tok, prompts, out, batch_size=4, overwrite=True, **SETTINGS)
    assert stats["new_rows"] == 9
    meta_path(out).unlink()
    with pytest.raises(ConfigError, match="no readable"):
        generate_answers(other, tok, prompts, out, batch_size=4, **SETTINGS)


def test_meta_records_settings_target_source_and_speed(model, tok, prompts, tmp_path):
    out = tmp_path / "deep" / "out.jsonl"
    ids = [f"q{i}" for i in range(len(prompts))]
    stats = generate_answers(model, tok, prompts, out, ids=ids, source="questions:test", batch_size=4, seed=5,
                             temperature=0.7, top_p=0.95, target_name="tiny-target", **SETTINGS)
    meta = json.loads(meta_path(out).read_text())
    assert meta["format"] == META_FORMAT
    assert meta["settings"] == {"temperature": 0.7, "top_p": 0.95, "seed": 5, "max_new_tokens": 12}
    assert meta["target"] == target_identity(model, tok, "tiny-target") | {
        "weights_sample_sha256": weights_sample_sha256(model)}
    assert meta["prompts"] == {"source": "questions:test", "count": 9, "sha256": prompts_sha256(ids, prompts)}
    assert meta["draftsmith_version"] and {"torch", "transformers", "device", "threads"} <= meta["environment"].keys()
    progress = meta["progress"]
    assert progress["rows"] == 9 and progress["tokens"] == sum(r["num_tokens"] for r in _rows(out))
    assert progress["seconds"] > 0 and progress["tokens_per_s"] == pytest.approx(progress["tokens"] / progress["seconds"])
    assert progress["complete"] and stats["tokens_per_s"] == progress["tokens_per_s"]
    assert [r["id"] for r in _rows(out)] == ids and "sha256_json" in meta["sampling"]


def test_prompts_too_long_for_the_target_are_skipped_and_counted(tok, tmp_path):
    short = random_model("llama", seed=0, layers=1, max_positions=40)
    prompts = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "x" * 40}]]
    stats = generate_answers(short, tok, prompts, tmp_path / "o.jsonl", batch_size=2, **SETTINGS)
    assert stats["rows"] == 1 and stats["too_long"] == 1 and stats["complete"]
    assert stats["too_long_ids"] == [prompt_id(prompts[1])]
    with pytest.raises(ConfigError, match="max-new-tokens"):
        generate_answers(short, tok, prompts, tmp_path / "p.jsonl", max_new_tokens=40, progress=False)


def test_bad_arguments_are_one_line_errors(model, tok, prompts, tmp_path):
    for bad, match in (({"batch_size": 0}, "batch-size"), ({"temperature": -1}, "temperature"),
                       ({"top_p": 0.0}, "top-p"), ({"max_new_tokens": 0}, "max-new-tokens")):
        with pytest.raises(ConfigError, match=match):
            generate_answers(model, tok, prompts, tmp_path / "x.jsonl", **(SETTINGS | bad))
    with pytest.raises(DataError, match="repeats"):
        generate_answers(model, tok, prompts[:2], tmp_path / "x.jsonl", ids=["a", "a"], **SETTINGS)
    strict = char_tokenizer()
    strict.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(DataError, match="rejected prompt .*roles must alternate"):
        generate_answers(model, strict, prompts[:1], tmp_path / "x.jsonl", **SETTINGS)
    with pytest.raises(DataError, match="user turn"):
        generate_answers(model, tok, [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]],
                         tmp_path / "x.jsonl", **SETTINGS)


# ------------------------------------------------------------------------------------------------ prompts


def test_row_prompt_reads_every_chat_format():
    user, answer = {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}
    assert row_prompt({"messages": [user, answer]}, "messages") == [user]
    assert row_prompt({"messages": [user]}, "messages") == [user]  # a prompt-only row
    assert row_prompt({"messages": [user, answer, user, answer]}, "messages") == [user, answer, user]
    assert row_prompt({"conversations": [{"from": "human", "value": "Q"}]}, "sharegpt") == [user]
    assert row_prompt({"instruction": "Q", "output": "A"}, "alpaca") == [user]
    assert row_prompt({"instruction": "Q"}, "alpaca") == [user]
    with pytest.raises(BadRow):
        row_prompt({"messages": [{"role": "wizard", "content": "Q"}]}, "messages")
    with pytest.raises(BadRow):
        row_prompt({"instruction": ""}, "alpaca")


def test_dataset_prompts_count_bad_rows(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "A"}]}
            for i in range(30)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    prompts, report = dataset_prompts(path)
    assert len(prompts) == 30 and prompts[3] == [{"role": "user", "content": "Q3"}]
    assert report.skipped == 1 and report.first_bad_line == 31
    with pytest.raises(DataError, match="not usable prompts"):
        dataset_prompts(path, max_bad_fraction=0.0)


def test_answered_by_names_the_target_that_wrote_a_file_and_refuses_any_other(model, tok, prompts, tmp_path):
    out = tmp_path / "answers.jsonl"
    generate_answers(model, tok, prompts[:3], out, batch_size=3, target_name="tiny", **SETTINGS)
    record = answered_by(out, model, tok, "tiny")
    assert record["config_sha256"] == target_identity(model, tok)["config_sha256"]
    assert record["weights_sample_sha256"] == weights_sample_sha256(model)
    with pytest.raises(ConfigError, match="holds the answers of another target.*draftsmith data generate --target x"):
        answered_by(out, random_model("llama", seed=1, layers=2), tok, "x")  # same config, other weights
    meta_path(out).unlink()
    with pytest.raises(ConfigError, match="no .meta.json of `draftsmith data generate`") as err:
        answered_by(out, model, tok)
    assert "\n" not in str(err.value)


def test_the_weights_sample_names_a_target_whatever_precision_it_is_held_in():
    """Answers written by the bfloat16 target (dtype=auto on a bfloat16 CPU) train a float32 run, and back."""
    import copy

    from draftsmith.data.tiny_models import random_model

    model = random_model("llama", seed=0)
    half = copy.deepcopy(model).to(torch.bfloat16)
    assert weights_sample_sha256(model) == weights_sample_sha256(half)
    assert weights_sample_sha256(model) != weights_sample_sha256(random_model("llama", seed=1))
