"""Errors before work: every command checks its output, its device and its models' paths before any model loads,
refuses a second run on the same output, and turns a write that fails midway (a full disk, a read-only directory) into
one line saying what was kept. Each outcome is exit 2 with one ``error:`` line on stderr and no traceback."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from disk_faults import failing_writes, read_only

from draftsmith.common.outputs import lock_path
from draftsmith.launch.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = [{"question_id": i, "category": "math", "turns": [f"What is {i} plus {i}?"]} for i in range(3)]


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "usage:" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    return errors[0]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading a model fails the test: the errors below must come before any model loads."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad setting was refused")

    for module in ("draftsmith.launch.targets", "draftsmith.launch.recipe", "draftsmith.launch.eval_cli"):
        monkeypatch.setattr(f"{module}.load_model", refuse)


@pytest.fixture
def qfile(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def eval_argv(pair, qfile, out, *extra):
    return ["eval", "--target", str(pair["target"]), "--method", "draft", "--draft", str(pair["draft"]), "--questions",
            str(qfile), "--max-new-tokens", "4", "--warmup", "0", "--no-progress", "--threads", "1", "--out", str(out),
            *extra]


def generate_argv(pair, out, *extra):
    return ["data", "generate", "--target", str(pair["target"]), "--prompts", str(pair["dataset"]), "--limit", "4",
            "--batch-size", "1", "--max-new-tokens", "3", "--no-progress", "--out", str(out), *extra]


def recipe_argv(pair, out, *extra):
    return ["train", "distillspec", "--config", str(ROOT / "launch" / "configs" / "recipes" / "distillspec_test.yaml"),
            "--target", str(pair["target"]), "--draft", str(pair["draft"]), "--dataset", str(pair["dataset"]),
            "--output_dir", str(out), "eval_strategy=no", "report_to=none", "max_steps=4", "save_steps=2", *extra]


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a directory\n")
    return path


# ------------------------------------------------------------------------------------------ bad outputs, up front


@pytest.mark.parametrize("command", ["eval", "generate", "train"])
def test_an_output_under_a_file_is_refused_before_models_load(command, tiny_pair, qfile, a_file, capsys,
                                                              no_model_loads):
    argv = {"eval": lambda: eval_argv(tiny_pair, qfile, a_file / "r.json"),
            "generate": lambda: generate_argv(tiny_pair, a_file / "a.jsonl"),
            "train": lambda: recipe_argv(tiny_pair, a_file / "run")}[command]()
    assert main(argv) == 2
    line = one_error(capsys)
    assert f"lies under {a_file}, which is a file" in line


def test_outputs_of_the_wrong_kind_are_refused_before_models_load(tiny_pair, qfile, tmp_path, a_file, capsys,
                                                                  no_model_loads):
    assert main(eval_argv(tiny_pair, qfile, tmp_path)) == 2  # a directory for the report file
    assert "is a directory: pass a file path such as" in one_error(capsys)
    assert main(generate_argv(tiny_pair, tmp_path)) == 2
    assert "is a directory: pass a file path such as" in one_error(capsys)
    assert main(recipe_argv(tiny_pair, a_file)) == 2  # a file for the output directory
    assert "--output_dir" in (line := one_error(capsys)) and "is a file: pass a directory" in line


@pytest.mark.parametrize("command", ["eval", "generate", "train"])
def test_a_read_only_output_directory_is_refused_before_models_load(command, tiny_pair, qfile, tmp_path, capsys,
                                                                    monkeypatch, request, no_model_loads):
    ro = tmp_path / "ro"
    read_only(monkeypatch, request, ro)
    argv = {"eval": lambda: eval_argv(tiny_pair, qfile, ro / "eval" / "r.json"),
            "generate": lambda: generate_argv(tiny_pair, ro / "a.jsonl"),
            "train": lambda: recipe_argv(tiny_pair, ro / "run")}[command]()
    assert main(argv) == 2
    assert "cannot be written" in (line := one_error(capsys)) and str(ro) in line


def test_a_read_only_cache_directory_is_refused_before_the_zoo_build(tmp_path, qfile, capsys, monkeypatch, request):
    home = tmp_path / "home"
    read_only(monkeypatch, request, home)
    monkeypatch.setenv("DRAFTSMITH_HOME", str(home))
    monkeypatch.setattr("draftsmith.trainers.zoo.build_zoo", lambda *a, **k: pytest.fail("the zoo build started"))
    assert main(["eval", "--method", "ar", "--questions", str(qfile), "--out", str(tmp_path / "r.json")]) == 2
    assert "zoo directory" in (line := one_error(capsys)) and "cannot be written" in line


# ------------------------------------------------------------------------------------------------- the lock


@pytest.fixture
def other_run():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("command", ["eval", "generate", "train"])
def test_a_second_run_on_one_output_is_refused_naming_the_first(command, tiny_pair, qfile, tmp_path, capsys,
                                                                other_run, no_model_loads):
    out, lock = {"eval": (tmp_path / "r.json", lock_path(tmp_path / "r.json")),
                 "generate": (tmp_path / "a.jsonl", lock_path(tmp_path / "a.jsonl")),
                 "train": (tmp_path / "run", lock_path(tmp_path / "run", "dir"))}[command]
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"pid": other_run, "host": os.uname().nodename, "started": "now"}))
    argv = {"eval": lambda: eval_argv(tiny_pair, qfile, out), "generate": lambda: generate_argv(tiny_pair, out),
            "train": lambda: recipe_argv(tiny_pair, out)}[command]()
    assert main(argv) == 2
    assert f"another draftsmith run (pid {other_run}" in one_error(capsys)


# ------------------------------------------------------------------------------------ device, GGUF, resolver


@pytest.mark.parametrize("device", ["tpu9", "cuda:99", "banana:0"])
def test_a_bad_device_is_one_line(device, tiny_pair, qfile, tmp_path, capsys, no_model_loads):
    assert main(eval_argv(tiny_pair, qfile, tmp_path / "r.json", "--device", device)) == 2
    assert f"--device {device}" in one_error(capsys).replace("'", "")
    assert main(generate_argv(tiny_pair, tmp_path / "a.jsonl", "--device", device)) == 2
    assert "--device" in one_error(capsys)
    assert not (tmp_path / "r.json").exists() and not any(tmp_path.glob(".*.lock"))


@pytest.mark.parametrize("content", [b"GGUF\x00", b"GGUF" + b"\xff" * 40, b"not a gguf at all, really"])
def test_a_malformed_gguf_target_is_one_line(content, qfile, tmp_path, capsys, no_model_loads):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    assert main(["eval", "--target", str(bad), "--method", "ar", "--questions", str(qfile), "--out",
                 str(tmp_path / "r.json")]) == 2
    assert "--target" in (line := one_error(capsys)) and "not a readable GGUF file" in line
    assert main(["data", "generate", "--target", str(bad), "--prompts", "dev", "--out", str(tmp_path / "a.jsonl")]) == 2
    assert "not a readable GGUF file" in one_error(capsys)


def test_a_missing_target_is_named_not_reported_as_a_tokenizer_or_hub_error(tiny_pair, tmp_path, capsys,
                                                                            no_model_loads):
    missing = tmp_path / "nope" / "target"
    assert main(recipe_argv({**tiny_pair, "target": missing}, tmp_path / "run")) == 2
    line = one_error(capsys)
    assert f"--target {missing} does not exist" in line and "tokenizer" not in line and "Repo id" not in line
    assert main(recipe_argv({**tiny_pair, "draft": missing}, tmp_path / "run")) == 2
    assert f"--draft {missing} does not exist" in one_error(capsys)


@pytest.mark.parametrize("argv", [["eval", "--method", "ar", "--target", ""], ["eval", "--method", "draft", "--draft", ""],
                                  ["exit-layer", "--target", ""],
                                  ["data", "generate", "--target", "", "--prompts", "dev", "--out", "a.jsonl"]],
                         ids=["eval-target", "eval-draft", "exit-layer", "data-generate"])
def test_an_empty_model_path_is_refused_not_taken_for_the_zoos(argv, tmp_path, capsys, monkeypatch, no_model_loads):
    """``--target ''`` (a shell variable left empty) names no model: one line, never the zoo built in its place."""
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("draftsmith.trainers.zoo.build_zoo", lambda *a, **k: pytest.fail("the zoo build started"))
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert "'' is not a model" in one_error(capsys)


# ------------------------------------------------------------------------------------- writes failing midway


def fill_after(monkeypatch, module, calls: int, root: Path):
    """The disk under ``root`` fills up after ``calls`` calls of ``module.append_jsonl`` (the row or journal writer)."""
    real_append = module.append_jsonl
    made = []

    def append(path, rows):
        made.append(path)
        if len(made) > calls:
            failing_writes(monkeypatch, root, errno.ENOSPC)
        return real_append(path, rows)

    monkeypatch.setattr(module, "append_jsonl", append)


def test_a_full_disk_while_generating_keeps_the_rows_written_and_a_rerun_finishes(tiny_pair, tmp_path, capsys,
                                                                                  monkeypatch):
    from draftsmith.data import row_files

    clean = tmp_path / "clean" / "a.jsonl"
    assert main(generate_argv(tiny_pair, clean)) == 0
    out = tmp_path / "full" / "a.jsonl"
    fill_after(monkeypatch, row_files, 4, out.parent)  # two batches: each row's sum, then the row
    assert main(generate_argv(tiny_pair, out)) == 2
    line = one_error(capsys)
    assert f"cannot write {out}.sha256: no space left" in line and f"kept: the 2 complete rows in {out}" in line
    assert len(out.read_text().splitlines()) == 2
    monkeypatch.undo()
    assert main(generate_argv(tiny_pair, out)) == 0
    assert out.read_text() == clean.read_text()


def test_a_full_disk_while_evaluating_keeps_the_answered_questions(tiny_pair, qfile, tmp_path, capsys, monkeypatch):
    from draftsmith.inference.evaluation import journal as journal_module

    out = tmp_path / "eval" / "r.json"
    journal = out.with_name("r.partial.jsonl")
    fill_after(monkeypatch, journal_module, 1, out.parent)
    assert main(eval_argv(tiny_pair, qfile, out)) == 2
    line = one_error(capsys)
    assert f"cannot write {journal}: no space left" in line and f"kept: 1 answered questions in {journal}" in line
    monkeypatch.undo()
    assert main(eval_argv(tiny_pair, qfile, out)) == 0
    assert "resuming from" in capsys.readouterr().err
    assert json.loads(out.read_text())["num_questions"] == 3 and not journal.exists()


def test_a_full_disk_while_saving_a_checkpoint_names_the_last_complete_one(tiny_pair, tmp_path, capsys, monkeypatch):
    import transformers

    real_save = transformers.Trainer._save_checkpoint

    def second_fails(self, model, trial):
        if self.state.global_step > 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "checkpoint-4" / "x"))
        return real_save(self, model, trial)

    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", second_fails)
    out = tmp_path / "run"
    assert main(recipe_argv(tiny_pair, out)) == 2
    line = one_error(capsys)
    assert "no space left" in line and f"kept: the last complete checkpoint {out / 'checkpoint-2'}" in line
    assert not lock_path(out, "dir").exists()  # released when the run ended


# ---------------------------------------------------------------------------------------------- the scripts


def test_a_recipe_script_type_error_is_one_line_without_a_usage_dump(tiny_pair, tmp_path):
    """``python recipes/distillspec.py --max_steps 2.5`` printed argparse's 120-line usage before its error."""
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "distillspec.py"), "--max_steps", "2.5",
                           "--output_dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == ["error: --max_steps: expected a whole number, got '2.5' (see --help)"]


@pytest.mark.parametrize("argv", [["eval", "--limit", "x"], ["export", "--out"], ["data", "generate", "--nope"],
                                  ["tune", "--zoo=1.5"], ["nosuchcommand"],
                                  ["exit-layer", "--prompts=--"]])  # argparse leaves an int option an empty list
def test_a_bad_flag_of_any_subcommand_is_one_line_without_a_usage_dump(argv, capsys):
    from draftsmith.launch.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and err.startswith("error: draftsmith"), err
    assert "usage:" not in err and "--help" in err


def test_a_yaml_key_with_a_line_break_is_named_on_one_line(tiny_pair, tmp_path, capsys):
    """A config holding ``"a\\nb": 1`` printed ``unknown setting(s) a`` and ``b: ...`` on a second line."""
    from draftsmith.launch.cli import main

    config = tmp_path / "config.yaml"
    config.write_text('"a\\nb": 1\n"c\\rd": 2\n')
    code = main(["train", "distillspec", "--config", str(config), "--target", str(tiny_pair["target"]),
                 "--draft", str(tiny_pair["draft"]), "--dataset", str(tiny_pair["dataset"]),
                 "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "'a\\nb'" in err and "'c\\rd'" in err, err


def test_repeatable_options_still_take_lists():
    """``data generate --limit`` is given once per prompt set: a list is its value, not the empty-list slip."""
    from draftsmith.launch.cli import build_parser

    args = build_parser().parse_args(["data", "generate", "--target", "t", "--prompts", "corpus", "--limit", "3", "--limit", "4",
                                      "--out", "x.jsonl"])
    assert args.limit == [3, 4]


@pytest.mark.parametrize("extra", [["--concurrency", "4"], ["--engine-python", "/usr/bin/python3"],
                                   ["--engine-export", "speculators"]])
def test_engine_options_without_engine_are_refused_not_ignored(extra, tiny_pair, qfile, tmp_path, capsys,
                                                               no_model_loads):
    assert main(eval_argv(tiny_pair, qfile, tmp_path / "r.json", *extra)) == 2
    line = one_error(capsys)
    assert f"{extra[0]} applies only with --engine" in line and "add --engine vllm" in line
    if extra[0] == "--engine-python":  # data generate takes it too
        assert main(generate_argv(tiny_pair, tmp_path / "a.jsonl", *extra)) == 2
        assert "--engine-python applies only with --engine" in one_error(capsys)
        assert not (tmp_path / "a.jsonl").exists()


def test_a_recipe_refused_after_its_output_is_claimed_leaves_no_directory_behind(tiny_pair, tmp_path, capsys):
    out = tmp_path / "new" / "run"
    assert main(recipe_argv(tiny_pair, out, "eval_examples=100000")) == 2  # the data cannot hold its held-out rows
    assert "eval_examples=100000" in one_error(capsys)
    assert not (tmp_path / "new").exists()
