"""kill -9 at random points (reliability suite; see conftest.py) of a short training (between steps, while a
checkpoint is being saved, while the artefact is being written), of ``draftsmith data generate``, of the feature cache
build and of ``draftsmith eval``: the same command rerun must finish with the output of a run that was never killed
(weights, losses and manifest numbers; rows; cache shards; answers, steps and tau; never timings), with nothing
half-written left. Subprocesses on one thread; the reference and the reruns go through tests/launch/test_recipes.py's
``run``, as its kill-and-resume test does. ``DRAFTSMITH_RELIABILITY_SEED`` fixes the kill points,
``DRAFTSMITH_RELIABILITY_KILLS`` sets how many random ones each command gets (default 1)."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = tuple(sys.modules["draftsmith_reliability_scenarios"].RECIPES)  # conftest.py loaded scenarios.py
KILLS = int(os.environ.get("DRAFTSMITH_RELIABILITY_KILLS", "1"))
SEED = int(os.environ.get("DRAFTSMITH_RELIABILITY_SEED", str(random.SystemRandom().randrange(10**6))))


def launch_helpers():
    """tests/launch/test_recipes.py (its ``run``: a subprocess on one thread that must exit 0)."""
    spec = importlib.util.spec_from_file_location("draftsmith_reliability_launch_recipes",
                                                  ROOT / "tests" / "launch" / "test_recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command(argv: list) -> list[str]:
    return [sys.executable, "-m", "draftsmith.launch.cli", *map(str, argv)]


def kill_when(cmd: list[str], ready, delay: float, timeout: float = 900) -> bool:
    """Start ``cmd``, SIGKILL it ``delay`` seconds after ``ready()`` first holds; whether it died by the kill (False:
    it finished first)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None and not ready() and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return proc.returncode == -signal.SIGKILL


# ------------------------------------------------------------------------------------------- kill points


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def _mid_checkpoint(out: Path) -> bool:
    return any(p.is_dir() and not (p / "trainer_state.json").is_file() for p in out.glob("checkpoint-*"))


def _cache_started(out: Path) -> bool:
    return any((out / "cache").glob("*/manifest.json"))


def kill_points(name: str, rng: random.Random) -> list[tuple[str, object, float]]:
    """``[(label, ready(out) -> bool, delay)]``: where to kill ``name``; the fixed points first, then random ones."""
    from draftsmith.launch.recipe import complete_checkpoints

    fixed = {"training": [("while a checkpoint is saved", _mid_checkpoint, 0.0),
                          ("while the artefact is written", lambda out: (out / "artefact").exists(), 0.0)],
             "feature cache": [("while the cache is built", _cache_started, 0.0)]}.get(name, [])
    def after_lines(file: str, most: int, unit: str, late: float):
        n = rng.randint(1, most)
        return f"after {n} {unit}", lambda out: _lines(out / file) >= n, rng.uniform(0, late)

    random_ones = {
        "training": lambda: ("between steps", lambda out: bool(complete_checkpoints(out)), rng.uniform(0, 2)),
        "data generate": lambda: after_lines("answers.jsonl", 5, "rows", 0.2),
        "eval": lambda: after_lines("report.partial.jsonl", 2, "answers", 0.3),
        "feature cache": lambda: ("while the cache is built", _cache_started, rng.uniform(0, 0.5)),
    }[name]
    return fixed + [random_ones() for _ in range(KILLS)]


# ------------------------------------------------------------------------------------------------- the test


@pytest.mark.slow
@pytest.mark.parametrize("name", ["training", "data generate", "feature cache", "eval",
                                  *(f"training {recipe}" for recipe in RECIPES)])
def test_a_rerun_after_kill_9_finishes_as_if_never_killed(harness, pair, scenarios, name):
    """Every recipe and variant (``training <recipe>``), data generation, the feature cache and evaluation."""
    run = launch_helpers().run
    scenario = scenarios.recipe_scenario(name.split()[1]) if name.startswith("training ") else scenarios.SCENARIOS[name]
    kind = "training" if name.startswith("training") else name
    rng = random.Random(f"{SEED}:{name}")
    ref_out = harness.fresh(f"kill-{name}-reference".replace(" ", "-")) / "out"
    run(command(scenario.argv(harness, pair, ref_out)))
    expected = scenario.result(ref_out)
    for label, ready, delay in kill_points(kind, rng):
        out = harness.fresh(f"kill-{name}".replace(" ", "-")) / "out"
        argv = scenario.argv(harness, pair, out)
        killed = kill_when(command(argv), lambda ready=ready, out=out: ready(out), delay)
        harness.ledger.faults[f"kill -9: {name}"] += killed
        line = harness.command_line(argv).replace(str(pair["target"].parent), "$PAIR").replace(str(out), "OUT")
        repro = f"{line}   # kill -9 {label} (+{delay:.2f} s; seed {SEED}), then the same command again"
        found = []
        try:
            run(command(argv))
        except AssertionError as err:
            found.append(("rerun failed", str(err).strip().splitlines()[-1][:300]))
        else:
            found += [("half-written file", d) for d in harness.half_written(out, finished=True)]
            got = scenario.result(out)
            lost = len(scenario.units(expected) - scenario.units(got))
            if kind == "training":
                harness.ledger.steps_lost += lost
            else:
                harness.ledger.rows_lost += lost
            if got != expected:
                found.append(("rerun differs", scenarios.difference(expected, got)))
        harness.report(f"kill: {name}", found, repro)



def test_a_run_killed_after_its_last_checkpoint_trains_no_extra_step(harness, pair, scenarios):
    """Found by the kill test, made deterministic: killed after its last checkpoint (at ``max_steps``) but before its
    artefact, the rerun resumed from that checkpoint and trained one step more (5 of ``max_steps=4``), so its weights
    and manifest differed from an unbroken run's. The state a kill leaves there is the checkpoints alone."""
    import shutil

    scenario = scenarios.SCENARIOS["training"]
    done = harness.fresh("last-checkpoint-reference") / "out"
    assert harness.cli(scenario.argv(harness, pair, done)).code == 0
    out = harness.fresh("last-checkpoint") / "out"
    for checkpoint in done.glob("checkpoint-*"):
        shutil.copytree(checkpoint, out / checkpoint.name)
    argv = scenario.argv(harness, pair, out)
    harness.ledger.faults["kill -9: training (after its last checkpoint)"] += 1
    rerun = harness.cli(argv)
    found = harness.problems(rerun, out)
    if rerun.code == 0 and scenario.result(out) != scenario.result(done):
        found.append(("rerun differs", scenarios.difference(scenario.result(done), scenario.result(out))))
    line = harness.command_line(argv).replace(str(pair["target"].parent), "$PAIR").replace(str(out), "OUT")
    harness.report("kill: training", found, f"{line}   # OUT holding only the checkpoints of a finished run", rerun)
