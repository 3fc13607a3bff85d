"""How many CPU threads a job uses: the cores that are idle now, unless the user says how many.

On a shared machine a spinning OpenMP thread on a core another process is using makes training several times
slower (measured on 2 busy cores: 2 threads ran at 1/7 the speed of 1), while an idle core left unused doubles
the time. The load average cannot tell the two apart right after a burst of work (``make test`` keeps it above 1
for minutes after the cores went idle), so idle cores are measured from ``/proc/stat`` over a short window; the
load average is the fallback where ``/proc/stat`` is missing. ``--threads`` or ``$DRAFTSMITH_THREADS`` override
the measurement.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from draftsmith.common.errors import ConfigError

THREADS_ENV = "DRAFTSMITH_THREADS"
PROC_STAT = "/proc/stat"
IDLE_WINDOW_S = 0.5

# (idle, total) CPU time of the whole machine, in /proc/stat ticks
CpuSample = tuple[int, int]


def cpu_sample(stat_text: str) -> CpuSample:
    """``(idle, total)`` ticks of the aggregate ``cpu`` line of a ``/proc/stat`` reading.

    Idle counts ``idle`` + ``iowait``; the total is user, nice, system, idle, iowait, irq, softirq and steal
    (guest time is already inside user time, so it is left out)."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(v) for v in fields[1:9]]
            return sum(ticks[3:5]), sum(ticks)
    raise ValueError("no aggregate 'cpu' line in the /proc/stat reading")


def idle_fraction(before: CpuSample, after: CpuSample) -> float | None:
    """Fraction of all CPU time that was idle between two samples, in [0, 1]; None if no time passed."""
    idle, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return None
    return min(1.0, max(0.0, idle / total))


def loadavg_idle_fraction(load: float, cpu_count: int) -> float:
    """The idle fraction the 1-minute load average suggests (the fallback where /proc/stat is missing)."""
    return min(1.0, max(0.0, 1.0 - load / max(1, cpu_count)))


def free_cores(idle: float, cpu_count: int) -> int:
    """Cores free now: ``round(idle * cpu_count)``, at least 1."""
    return max(1, round(idle * cpu_count))


def read_cpu_sample(path: str | os.PathLike = PROC_STAT) -> CpuSample | None:
    """The current ``(idle, total)`` sample, or None where ``path`` is missing or unreadable."""
    try:
        return cpu_sample(Path(path).read_text())
    except (OSError, ValueError):
        return None


def measure_idle_fraction(
    window_s: float = IDLE_WINDOW_S,
    path: str | os.PathLike = PROC_STAT,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Idle fraction of the machine over the next ``window_s`` seconds (from the load average without
    ``/proc/stat``; 1.0 where neither exists)."""
    before = read_cpu_sample(path)
    if before is not None:
        sleep(window_s)
        after = read_cpu_sample(path)
        fraction = None if after is None else idle_fraction(before, after)
        if fraction is not None:
            return fraction
    if hasattr(os, "getloadavg"):
        return loadavg_idle_fraction(os.getloadavg()[0], os.cpu_count() or 1)
    return 1.0


def parse_threads(value: int | str, name: str, fix: str) -> int:
    """``value`` as a positive thread count, else a one-line :class:`ConfigError` naming ``name`` and ``fix``."""
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigError(f"{name} must be a positive integer (CPU threads), got {value!r}; {fix}")
    return int(text)


def threads_override(requested: int | str | None, environ: Mapping[str, str]) -> int | None:
    """The thread count the user asked for: ``requested`` (``--threads``), else ``$DRAFTSMITH_THREADS`` (empty
    counts as unset), else None."""
    if requested is not None:
        return parse_threads(requested, "--threads", "pass --threads N with N >= 1, or leave it out to use the idle cores")
    value = environ.get(THREADS_ENV, "")
    if not value.strip():
        return None
    return parse_threads(value, THREADS_ENV, f"set {THREADS_ENV}=N with N >= 1, or unset it to use the idle cores")


def choose_threads(
    requested: int | str | None,
    device: str,
    cap: int,
    environ: Mapping[str, str] | None = None,
    measure: Callable[[], float] = measure_idle_fraction,
) -> int:
    """Intra-op threads for a job on ``device``: the override (:func:`threads_override`) if any; else on CPU the
    free cores (:func:`free_cores` of the measured idle fraction), at most ``cap`` (torch's default, the physical
    cores); else ``cap``."""
    override = threads_override(requested, os.environ if environ is None else environ)
    if override is not None:
        return override
    if device != "cpu":
        return cap
    return max(1, min(cap, free_cores(measure(), os.cpu_count() or 1)))


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run with ``threads`` torch intra-op threads, restoring the old value after."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)
