"""Injected file-system faults (reliability suite; see conftest.py): a read-only output directory and a disk that
fills up at the k-th write, raised from the writers of ``draftsmith data generate`` (its row file and meta), ``eval``
(journal, report), a recipe's checkpoints and artefact, and the feature cache. Tests run as root, where chmod stops
nothing, so the fault is simulated: :class:`FaultyDisk` wraps the file-opening and file-writing primitives (``open``,
``os.open``, ``os.replace``, ``os.mkdir``, ``torch.save``, safetensors' ``save_file``) for paths under one directory,
in the test only. Each fault must end the command with exit 2 and one ``error:`` line naming the path, leave nothing
half-written, and the same command rerun on a healthy disk must finish with the output of a run that never failed."""

from __future__ import annotations

import errno
import io
import os
import re
from pathlib import Path

import pytest

READ_ONLY = (errno.EACCES, errno.EROFS)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class FaultyDisk:
    """Writes under ``root`` (to paths matching ``match``) fail with ``code`` from the ``after``-th on (``after=1``: a
    read-only directory, where deleting fails too); ``after=None`` only counts them."""

    def __init__(self, root: Path, code: int = errno.ENOSPC, after: int | None = None, match: str = "") -> None:
        self.root, self.code, self.after, self.match = os.path.realpath(root), code, after, match
        self.writes, self.failed = 0, []

    def hit(self, path) -> None:
        try:
            name = os.fsdecode(os.fspath(path))
        except TypeError:
            return
        full = os.path.realpath(name)
        if (full != self.root and not full.startswith(self.root + os.sep)) or not re.search(self.match, full):
            return
        self.writes += 1
        if self.after is not None and self.writes >= self.after:
            self.failed.append(name)
            raise OSError(self.code, os.strerror(self.code), name)  # PermissionError for EACCES

    def swaps(self) -> dict:
        import safetensors.torch
        import torch

        real = {"open": io.open, "os_open": os.open, "replace": os.replace, "rename": os.rename, "mkdir": os.mkdir,
                "save": torch.save, "save_file": safetensors.torch.save_file, "unlink": os.unlink,
                "remove": os.remove, "rmdir": os.rmdir}

        def open_(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and set(kwargs.get("mode", mode)) & set("wax+"):
                self.hit(file)
            return real["open"](file, mode, *args, **kwargs)

        def os_open(path, flags, *args, **kwargs):
            if flags & WRITE_FLAGS:
                self.hit(path)
            return real["os_open"](path, flags, *args, **kwargs)

        def moving(name):
            def move(src, dst, *args, **kwargs):
                self.hit(dst)
                return real[name](src, dst, *args, **kwargs)
            return move

        def at_path(name, position=0):
            def call(*args, **kwargs):
                if len(args) > position and isinstance(args[position], (str, os.PathLike)):
                    self.hit(args[position])
                return real[name](*args, **kwargs)
            return call

        swaps = {io.open: open_, os.open: os_open, os.replace: moving("replace"), os.rename: moving("rename"),
                 os.mkdir: at_path("mkdir"), torch.save: at_path("save", 1), safetensors.torch.save_file:
                 at_path("save_file", 1)}
        if self.code in READ_ONLY:
            swaps.update({os.unlink: at_path("unlink"), os.remove: at_path("remove"), os.rmdir: at_path("rmdir")})
        return swaps


def reference(harness, pair, scenario) -> tuple[object, int, Path]:
    """The result of a run on a healthy disk, how many writes it made under the fault root, its output directory."""
    out = harness.fresh(f"{scenario.name}-reference".replace(" ", "-")) / "out"
    out.mkdir()
    disk = FaultyDisk(out / scenario.fault_root)
    with harness.swapped(disk.swaps()):
        outcome = harness.cli(scenario.argv(harness, pair, out))
    assert outcome.code == 0, outcome.stderr[-3000:]
    return scenario.result(out), disk.writes, out


def check_modes(harness, pair, scenario, out: Path) -> None:
    """The files a finished run wrote have the mode the umask gives (atomic writers included)."""
    shown = harness.command_line(scenario.argv(harness, pair, Path("OUT"))).replace(str(pair["target"].parent), "$PAIR")
    harness.report("file mode", [("file mode", m) for m in harness.file_modes(out)], shown)


def fault_and_rerun(harness, pair, scenarios, scenario, expected, code: int, after: int) -> None:
    """One fault: the faulted run's outcome, then a rerun on a healthy disk against ``expected``."""
    out = harness.fresh(f"{scenario.name}-{errno.errorcode[code]}-{after}".replace(" ", "-")) / "out"
    out.mkdir()
    (out / scenario.fault_root).mkdir(exist_ok=True)
    argv = scenario.argv(harness, pair, out)
    disk = FaultyDisk(out / scenario.fault_root, code, after)
    with harness.swapped(disk.swaps()):
        outcome = harness.cli(argv)
    kind = "read-only" if code in READ_ONLY else "disk full"
    harness.ledger.faults[f"{kind}: {scenario.name}"] += bool(disk.failed)
    line = harness.command_line(argv).replace(str(pair["target"].parent), "$PAIR").replace(str(out), "OUT")
    repro = (f"{line}   # with {errno.errorcode[code]} from the {after}-th write under OUT/{scenario.fault_root} "
             f"({disk.failed[0].replace(str(out), 'OUT') if disk.failed else 'never reached'})")
    found = harness.problems(outcome, out, may_succeed=not disk.failed)
    errors = [ln for ln in outcome.stderr.splitlines() if ln.startswith("error:")]
    if disk.failed and errors and str(out) not in errors[-1]:
        found.append(("error names no path", errors[-1][:300]))
    harness.report(f"fault: {kind}", found, repro, outcome)
    rerun = harness.cli(argv)
    found = harness.problems(rerun, out)
    if rerun.code == 0:
        got = scenario.result(out)
        lost = len(scenario.units(expected) - scenario.units(got))
        if scenario.name == "training":
            harness.ledger.steps_lost += lost
        else:
            harness.ledger.rows_lost += lost
        if got != expected:
            found.append(("rerun differs", scenarios.difference(expected, got)))
    harness.report(f"fault rerun: {kind}", found, repro + " ; then the same command again", rerun)


def fault_points(writes: int, sample: int | None) -> list[int]:
    """The k of the k-th write to fail at: all of 1..writes, or ``sample`` of them spread out (first and last in)."""
    if sample is None or writes <= sample:
        return list(range(1, writes + 1))
    return sorted({1, writes, *(1 + round(i * (writes - 1) / (sample - 1)) for i in range(sample))})


@pytest.mark.parametrize("name", ["data generate", "eval"])
def test_read_only_and_full_disks(harness, pair, scenarios, name):
    """Fast: each command on a read-only directory (EACCES, EROFS) and on a disk that fills in the middle."""
    scenario = scenarios.SCENARIOS[name]
    expected, writes, out = reference(harness, pair, scenario)
    for code, after in ((errno.EACCES, 1), (errno.EROFS, 1), (errno.ENOSPC, max(1, writes // 2))):
        fault_and_rerun(harness, pair, scenarios, scenario, expected, code, after)
    check_modes(harness, pair, scenario, out)


@pytest.mark.slow
@pytest.mark.parametrize("name, sample", [("data generate", None), ("eval", 8), ("training", 4),
                                          ("feature cache", 3)])
def test_a_full_disk_at_every_write(harness, pair, scenarios, name, sample):
    """Slow: the disk fills at the k-th write, for every k (or a spread-out sample of them for the recipe runs), and
    the output directory is read-only from the start."""
    scenario = scenarios.SCENARIOS[name]
    expected, writes, out = reference(harness, pair, scenario)
    assert writes > 0, f"{name} wrote nothing under its fault root"
    for after in fault_points(writes, sample):
        fault_and_rerun(harness, pair, scenarios, scenario, expected, errno.ENOSPC, after)
    if name in ("training", "feature cache"):
        fault_and_rerun(harness, pair, scenarios, scenario, expected, errno.EROFS, 1)
    check_modes(harness, pair, scenario, out)


def test_a_full_disk_as_a_feature_shard_lands(harness, pair, scenarios):
    """Found by the slow tier: ENOSPC as a finished shard was renamed into place left ``shard-00000.tmp`` behind, and
    the cache's progress bar ran on into the ``error:`` line."""
    out = harness.fresh("feature-cache-shard") / "out"
    (out / "cache").mkdir(parents=True)
    argv = scenarios.SCENARIOS["feature cache"].argv(harness, pair, out)
    disk = FaultyDisk(out / "cache", errno.ENOSPC, after=1, match=r"shard-\d+\.safetensors$")
    with harness.swapped(disk.swaps()):
        outcome = harness.cli(argv)
    harness.ledger.faults["disk full: feature cache"] += 1
    assert disk.failed, "the build never renamed a shard into place"
    repro = harness.command_line(argv).replace(str(pair["target"].parent), "$PAIR").replace(str(out), "OUT")
    harness.report("fault: disk full", harness.problems(outcome, out, may_succeed=False),
                   f"{repro}   # with ENOSPC as OUT/cache/*/shard-00000.safetensors is renamed into place", outcome)


@pytest.mark.parametrize("name", ["training", "feature cache"])
def test_weights_get_the_mode_the_umask_gives(harness, pair, scenarios, name):
    """safetensors creates its files 0600 whatever the umask: checkpoints, artefact weights and feature-cache shards
    were unreadable to the group sharing them. Every file of a finished run has the umask's mode."""
    scenario = scenarios.SCENARIOS[name]
    _, _, out = reference(harness, pair, scenario)
    assert list(out.rglob("*.safetensors")), "the run wrote no safetensors file"
    check_modes(harness, pair, scenario, out)
