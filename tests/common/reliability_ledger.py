"""The reliability suite's ledger (tests/reliability): what a pytest run tried and what broke, printed at its end.

A pytest plugin (``pytest_plugins`` of tests/conftest.py, so that pytest-xdist's controller has it too): each worker
sends its ledger's :meth:`Ledger.state` when it finishes, and the controller adds them up before the summary."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LEDGER = pytest.StashKey["Ledger"]()


@dataclass
class Violation:
    area: str
    kind: str  # traceback, hang, exit code, error lines, usage dump, half-written file, file mode, lost rows, ...
    detail: str
    reproducer: str


@dataclass
class Ledger:
    """What the pytest run tried and what broke; printed at the end (``pytest_terminal_summary``)."""

    survey: bool = False
    inputs: Counter = field(default_factory=Counter)  # by area
    faults: Counter = field(default_factory=Counter)  # by kind
    outcomes: Counter = field(default_factory=Counter)  # exit 0 / exit 2 / accepted / other
    seconds: Counter = field(default_factory=Counter)  # command time by area
    slowest: dict[str, tuple[float, str]] = field(default_factory=dict)  # by area: the slowest input
    rows_lost: int = 0
    steps_lost: int = 0
    violations: dict[tuple[str, str, str], Violation] = field(default_factory=dict)
    seen: Counter = field(default_factory=Counter)  # violations by signature, with repeats

    @property
    def ran(self) -> bool:
        return bool(self.inputs or self.faults)

    def record(self, v: Violation, count: int = 1) -> None:
        """``count`` sightings of ``v``'s class, which keeps its shortest reproducer."""
        key = (v.area, v.kind, _signature(v.detail))
        self.seen[key] += count
        old = self.violations.get(key)
        if old is None or len(v.reproducer) < len(old.reproducer):
            self.violations[key] = v

    def note_time(self, area: str, seconds: float, reproducer: str) -> None:
        """``area``'s slowest input so far."""
        if seconds > self.slowest.get(area, (0.0, ""))[0]:
            self.slowest[area] = (seconds, reproducer)

    def tracebacks(self) -> int:
        return sum(n for (_, kind, _), n in self.seen.items() if kind in ("traceback", "hang"))

    def state(self) -> dict:
        """Everything recorded, in the plain types a pytest-xdist worker sends its controller (:meth:`absorb`)."""
        return {"inputs": dict(self.inputs), "faults": dict(self.faults), "outcomes": dict(self.outcomes),
                "seconds": dict(self.seconds), "slowest": {k: list(v) for k, v in self.slowest.items()},
                "lost": [self.rows_lost, self.steps_lost],
                "violations": [[[v.area, v.kind, v.detail, v.reproducer], self.seen[k]]
                               for k, v in self.violations.items()]}

    def absorb(self, state: dict) -> None:
        """Add another ledger's :meth:`state` (a worker's) to this one."""
        for name in ("inputs", "faults", "outcomes", "seconds"):
            getattr(self, name).update(state[name])
        for area, (seconds, reproducer) in state["slowest"].items():
            self.note_time(area, seconds, reproducer)
        self.rows_lost += state["lost"][0]
        self.steps_lost += state["lost"][1]
        for fields, count in state["violations"]:
            self.record(Violation(*fields), count)

    def to_dict(self) -> dict:
        return {"inputs": dict(self.inputs), "inputs_total": sum(self.inputs.values()),
                "faults": dict(self.faults), "faults_total": sum(self.faults.values()),
                "outcomes": dict(self.outcomes), "tracebacks": self.tracebacks(), "rows_lost": self.rows_lost,
                "steps_lost": self.steps_lost, "violations": sum(self.seen.values()),
                "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
                "classes": [{"area": v.area, "kind": v.kind, "detail": v.detail, "count": self.seen[k],
                             "reproducer": v.reproducer} for k, v in sorted(self.violations.items())]}

    def summary_lines(self) -> list[str]:
        d = self.to_dict()
        lines = [f"inputs tried: {d['inputs_total']} ({_counts(self.inputs)})",
                 f"faults injected: {d['faults_total']} ({_counts(self.faults)})",
                 f"outcomes: {_counts(self.outcomes)}",
                 f"tracebacks: {d['tracebacks']}; rows lost: {self.rows_lost}; steps lost: {self.steps_lost}; "
                 f"broken promises: {d['violations']} in {len(self.violations)} classes"]
        if os.environ.get("DRAFTSMITH_RELIABILITY_TIMES") == "1":  # where the time goes, to size the tiers
            lines += [f"  {area}: {self.seconds[area]:.1f} s; slowest {t:.1f} s: {repro}"
                      for area, (t, repro) in sorted(self.slowest.items())]
        for c in d["classes"]:
            lines += [f"  [{c['area']}] {c['kind']} x{c['count']}: {c['detail'][:300]}", f"      {c['reproducer'][:900]}"]
        return lines


def _counts(counter: Counter) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counter.items())) or "none"


def _signature(detail: str) -> str:
    """A violation's class: its text from ``error:`` on, with flags, paths, numbers and quoted values blanked out."""
    text = detail[detail.find("error:"):] if "error:" in detail else detail
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"--[\w.-]+", "--FLAG", re.sub(r"/[\w./+-]+", "PATH", text))
    return re.sub(r"\d+", "N", text)[:160]


def pytest_configure(config) -> None:
    config.stash[LEDGER] = Ledger(survey=os.environ.get("DRAFTSMITH_RELIABILITY_SURVEY") == "1")


def pytest_sessionfinish(session) -> None:
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: its ledger goes to the controller's summary
        session.config.workeroutput["reliability_ledger"] = session.config.stash[LEDGER].state()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: add a finished worker's ledger to the one the summary prints."""
    state = getattr(node, "workeroutput", {}).get("reliability_ledger")
    if state is not None:
        node.config.stash[LEDGER].absorb(state)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    ledger = config.stash.get(LEDGER, None)
    if ledger is None or not ledger.ran or hasattr(config, "workeroutput"):
        return
    terminalreporter.section("reliability")
    for line in ledger.summary_lines():
        terminalreporter.write_line(line)
    target = os.environ.get("DRAFTSMITH_RELIABILITY_SUMMARY")
    if target:
        Path(target).write_text(json.dumps(ledger.to_dict(), indent=1) + "\n")
