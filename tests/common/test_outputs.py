"""Outputs checked before any model loads, locked by one run at a time, and write failures as one line
(draftsmith.common.outputs), and the writers of draftsmith.common.io keeping what they had."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest
from disk_faults import failing_writes, read_only

from draftsmith.common.errors import ConfigError, OutputError
from draftsmith.common.io import append_jsonl, atomic_write_text, recover_jsonl
from draftsmith.common.outputs import (
    LOCK_NAME,
    OutputLock,
    claim_output,
    lock_path,
    prepare_output,
    weights_bytes,
    write_error,
    write_failures,
)


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


# ------------------------------------------------------------------------------------------------- the checks


def test_an_output_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    for kind in ("file", "dir"):
        with pytest.raises(OutputError) as err:
            prepare_output(tmp_path / "file" / "sub" / "out.json", "--out", kind)
        assert "lies under" in one_line(err) and str(tmp_path / "file") in one_line(err)


def test_a_directory_where_a_file_goes_and_a_file_where_a_directory_goes_are_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="is a directory: pass a file path such as .*report.json"):
        prepare_output(tmp_path, "--out", "file", example="report.json")
    with pytest.raises(OutputError, match="is a file: pass a directory"):
        prepare_output(tmp_path / "file", "--output_dir", "dir")


@pytest.mark.parametrize("bad", ["", "  ", "a\x00b"])
def test_empty_and_malformed_paths_are_config_errors(bad):
    with pytest.raises(ConfigError) as err:
        prepare_output(bad, "--out")
    assert "--out" in one_line(err)


def test_the_directory_is_made_and_an_existing_file_is_fine(tmp_path):
    assert prepare_output(tmp_path / "a" / "b" / "r.json", "--out") == tmp_path / "a" / "b" / "r.json"
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "r.json").write_text("old")
    assert prepare_output(tmp_path / "r.json", "--out").read_text() == "old"
    assert prepare_output(tmp_path / "d", "--output_dir", "dir").is_dir()


def test_a_read_only_directory_is_refused_before_anything_is_written(tmp_path, monkeypatch, request):
    read_only(monkeypatch, request, tmp_path / "ro")
    with pytest.raises(OutputError) as err:
        prepare_output(tmp_path / "ro" / "sub" / "r.json", "--out")
    assert "--out" in one_line(err) and "cannot be written" in one_line(err)


def test_free_space_is_checked_against_a_stated_need(tmp_path):
    with pytest.raises(OutputError, match=r"needs at least .* \(the weights\): free space"):
        prepare_output(tmp_path / "o", "--out", "dir", need_bytes=1 << 62, need="the weights")
    prepare_output(tmp_path / "o", "--out", "dir", need_bytes=1)


def test_weights_bytes_counts_weight_files_only(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "config.json").write_text("{}")
    assert weights_bytes(tmp_path) == 10
    assert weights_bytes("org/model") is None and weights_bytes(None) is None


def test_a_claim_that_fails_removes_the_directories_it_made(tmp_path):
    with pytest.raises(RuntimeError), claim_output(tmp_path / "new" / "deep" / "r.json", "--out"):
        raise RuntimeError("the command failed before writing")
    assert not (tmp_path / "new").exists()
    with claim_output(tmp_path / "kept" / "r.json", "--out") as out:
        out.write_text("{}")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["r.json"]  # the lock is gone too


# --------------------------------------------------------------------------------------------------- the lock


@pytest.fixture
def other_process():
    """A live process that is not this one (its pid is what another run's lock would name)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _lock_of(pid: int, path) -> None:
    path.write_text(json.dumps({"pid": pid, "host": os.uname().nodename, "started": "earlier"}))


def test_a_second_run_is_refused_naming_the_first_runs_pid(tmp_path, other_process):
    out = tmp_path / "report.json"
    _lock_of(other_process.pid, lock_path(out))
    with pytest.raises(OutputError) as err:
        OutputLock(out, "--out").acquire()
    assert f"pid {other_process.pid}" in one_line(err) and "another draftsmith run" in one_line(err)
    assert json.loads(lock_path(out).read_text())["pid"] == other_process.pid  # left alone


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "run"
    out.mkdir()
    _lock_of(dead.pid, out / LOCK_NAME)
    with OutputLock(out, "--output_dir", "dir"):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (out / LOCK_NAME).exists()


def test_a_torn_lock_and_this_processs_own_are_stale(tmp_path):
    out = tmp_path / "a.jsonl"
    lock_path(out).write_text("{")
    OutputLock(out, "--out").acquire().release()
    _lock_of(os.getpid(), lock_path(out))  # a run of this process that ended without releasing
    OutputLock(out, "--out").acquire().release()
    assert not lock_path(out).exists()


def test_release_leaves_another_runs_lock_alone(tmp_path, other_process):
    out = tmp_path / "a.jsonl"
    lock = OutputLock(out, "--out").acquire()
    _lock_of(other_process.pid, lock_path(out))  # taken over behind this run's back
    lock.release()
    assert lock_path(out).exists()


def test_two_runs_on_one_output_one_wins(tmp_path):
    """Two processes claim the same output at once: exactly one gets it, the other is refused naming it."""
    out = tmp_path / "answers.jsonl"
    code = ("import sys, time; from draftsmith.common.outputs import OutputLock\n"
            "from draftsmith.common.errors import OutputError\n"
            "try:\n    lock = OutputLock(sys.argv[1], '--out').acquire()\n"
            "except OutputError as e:\n    print('refused', e); sys.exit(3)\n"
            "print('held'); sys.stdout.flush(); time.sleep(3)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = sorted((p.wait(timeout=60), p.stdout.read()) for p in procs)
    assert [r[0] for r in results] == [0, 3]
    assert "held" in results[0][1] and "another draftsmith run (pid" in results[1][1]


# ---------------------------------------------------------------------------------------------- write failures


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "no space left"), (errno.EACCES, "permission denied"),
                                         (errno.EROFS, "the file system is read-only")])
def test_a_failed_write_is_one_line_naming_the_file_the_cause_and_what_was_kept(tmp_path, code, words):
    with pytest.raises(OutputError) as err, write_failures(tmp_path, lambda: "the 3 rows written so far"):
        raise OSError(code, os.strerror(code), str(tmp_path / "shard.bin"))
    text = one_line(err)
    assert text.startswith(f"cannot write {tmp_path / 'shard.bin'}: {words}")
    assert text.endswith("kept: the 3 rows written so far")


def test_library_write_failures_are_recognised_and_other_errors_pass(tmp_path):
    torch_full = RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
                              "data/0: file write failed")
    with pytest.raises(OutputError, match="the write failed"), write_failures(tmp_path, "nothing"):
        raise torch_full
    with pytest.raises(FileNotFoundError), write_failures(tmp_path, "nothing"):
        raise FileNotFoundError(errno.ENOENT, "gone", "x")  # a read, not a write
    with pytest.raises(RuntimeError, match="shape"), write_failures(tmp_path, "nothing"):
        raise RuntimeError("shape mismatch")


def test_write_error_keeps_the_inner_files_name_and_cause(tmp_path):
    inner = write_error(tmp_path / "a.json", OSError(errno.ENOSPC, "full"), "a.json as it was", exact=False)
    outer = write_error(tmp_path, inner, "the 2 rows so far")
    assert str(outer) == f"cannot write {tmp_path / 'a.json'}: {inner.reason}; kept: the 2 rows so far"


def test_append_jsonl_on_a_full_disk_keeps_the_earlier_lines_and_no_torn_one(tmp_path):
    """A real ENOSPC, from /dev/full: the write fails part-way and is cut off again."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path = tmp_path / "rows.jsonl"
    append_jsonl(path, [{"id": 1}])
    full = tmp_path / "full.jsonl"
    full.symlink_to("/dev/full")
    with pytest.raises(OutputError) as err:
        append_jsonl(full, [{"id": 2}])
    assert "no space left" in one_line(err) and "kept: the lines" in one_line(err)
    assert recover_jsonl(path) == [{"id": 1}]


def test_append_jsonl_cuts_a_partial_write_off(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    append_jsonl(path, [{"id": 1}])
    real_write = os.write

    def half_then_full(fd, data):  # the disk fills in the middle of the batch
        if len(data) > 10:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OutputError):
        append_jsonl(path, [{"id": 2, "text": "a longer row"}, {"id": 3}])
    monkeypatch.undo()
    assert path.read_text() == '{"id": 1}\n'


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_atomic_writes_keep_the_old_file_and_leave_no_temporary(tmp_path, monkeypatch, code):
    path = tmp_path / "meta.json"
    atomic_write_text(path, "old")
    failing_writes(monkeypatch, tmp_path, code, after=2)  # the temporary is made, its rename fails
    with pytest.raises(OutputError) as err:
        atomic_write_text(path, "new")
    monkeypatch.undo()
    assert one_line(err).startswith(f"cannot write {path}:") and "as it was before" in one_line(err)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]
