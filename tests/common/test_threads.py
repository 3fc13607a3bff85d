"""The thread choice: idle cores from two /proc/stat readings (fake ones here), the load-average fallback, and
the ``--threads`` / ``$DRAFTSMITH_THREADS`` overrides."""

from __future__ import annotations

import pytest
import torch

from draftsmith.common import threads
from draftsmith.common.errors import ConfigError

#                 user nice system idle iowait irq softirq steal guest guest_nice
STAT_BEFORE = """cpu  1000 0 200 5000 100 0 50 0 300 0
cpu0 500 0 100 2500 50 0 25 0 150 0
cpu1 500 0 100 2500 50 0 25 0 150 0
intr 12345 0 0
"""


def stat_after(busy: int, idle: int) -> str:
    """A reading ``busy`` user ticks and ``idle`` idle ticks after :data:`STAT_BEFORE` (guest time moves too)."""
    return f"cpu  {1000 + busy} 0 200 {5000 + idle} 100 0 50 0 {300 + busy} 0\n"


def test_a_sample_is_idle_plus_iowait_over_all_but_guest_time():
    assert threads.cpu_sample(STAT_BEFORE) == (5100, 6350)
    with pytest.raises(ValueError):
        threads.cpu_sample("intr 1 2 3\n")


@pytest.mark.parametrize("busy, idle, fraction, free", [
    (0, 100, 1.0, 2),  # right after `make test`: load average still > 1, cores idle -> both
    (50, 50, 0.5, 1),  # one core busy
    (100, 0, 0.0, 1),  # both busy: still one thread
    (25, 75, 0.75, 2),
])  # fmt: skip
def test_free_cores_come_from_the_idle_time_between_two_readings(busy, idle, fraction, free):
    before = threads.cpu_sample(STAT_BEFORE)
    got = threads.idle_fraction(before, threads.cpu_sample(stat_after(busy, idle)))
    assert got == pytest.approx(fraction)
    assert threads.free_cores(got, cpu_count=2) == free


def test_no_time_between_readings_gives_no_fraction_and_the_load_average_is_the_fallback(tmp_path, monkeypatch):
    sample = threads.cpu_sample(STAT_BEFORE)
    assert threads.idle_fraction(sample, sample) is None
    assert threads.loadavg_idle_fraction(1.5, 2) == 0.25 and threads.loadavg_idle_fraction(6, 2) == 0.0
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.5, 0.0, 0.0))
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    assert threads.measure_idle_fraction(path=tmp_path / "missing", sleep=pytest.fail) == 0.875


def test_measuring_reads_proc_stat_twice_around_the_window(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT_BEFORE)
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        stat.write_text(stat_after(busy=30, idle=90))

    assert threads.measure_idle_fraction(0.25, path=stat, sleep=sleep) == pytest.approx(0.75)
    assert slept == [0.25]


def test_choice_is_the_free_cores_capped_on_cpu_and_the_cap_elsewhere(monkeypatch):
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 8)
    assert threads.choose_threads(None, "cpu", cap=4, environ={}, measure=lambda: 0.25) == 2
    assert threads.choose_threads(None, "cpu", cap=4, environ={}, measure=lambda: 1.0) == 4
    assert threads.choose_threads(None, "cpu", cap=4, environ={}, measure=lambda: 0.0) == 1
    assert threads.choose_threads(None, "cuda", cap=4, environ={}, measure=pytest.fail) == 4


def test_overrides_win_without_measuring_the_flag_first():
    env = {threads.THREADS_ENV: "3"}
    assert threads.choose_threads(None, "cpu", cap=2, environ=env, measure=pytest.fail) == 3
    assert threads.choose_threads(5, "cpu", cap=2, environ=env, measure=pytest.fail) == 5
    assert threads.choose_threads("2", "cpu", cap=2, environ={threads.THREADS_ENV: "bad"}, measure=pytest.fail) == 2
    assert threads.choose_threads(None, "cpu", cap=2, environ={threads.THREADS_ENV: " "}, measure=lambda: 1.0) == 2


@pytest.mark.parametrize("value", [0, -1, "0", "two", "1.5", "", 2.0])
def test_a_bad_count_is_a_one_line_config_error(value):
    with pytest.raises(ConfigError, match=r"^--threads must be a positive integer.*pass --threads N") as err:
        threads.choose_threads(value, "cpu", cap=2, environ={})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=rf"^{threads.THREADS_ENV} must be .*set {threads.THREADS_ENV}=N"):
        threads.choose_threads(None, "cpu", cap=2, environ={threads.THREADS_ENV: f"{value}x"})


def test_torch_threads_restores_the_old_count():
    old = torch.get_num_threads()
    with threads.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == old
