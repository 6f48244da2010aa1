"""The host facts a point records about its timed steps (harness/host_facts.py), on this
machine's own Linux: where the process runs, and whether its thread had a CPU."""

from __future__ import annotations

import os
import time

import pytest

from harness.host_facts import TimedWindow, where_running

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc on this platform")


@linux
def test_where_running_names_real_cpus():
    got = where_running()
    assert 1 <= got["allowed"] <= os.cpu_count()
    assert 0 <= got["last"] < os.cpu_count() and got["threads"] >= 1


@linux
def test_a_busy_window_was_on_cpu_and_a_sleeping_one_was_not():
    """``on_cpu`` is the thread's CPU time over the wall time: near 1 for a thread that spins
    through the window, near 0 for one that sleeps through it; steal is counted, never
    negative."""
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    busy = TimedWindow.start()
    end = time.perf_counter() + 0.15
    while time.perf_counter() < end:
        pass
    spun = busy.facts()
    # what the thread got of a core, measured apart (a loaded 2-core box may give it half)
    share = (time.thread_time() - cpu0) / (time.perf_counter() - wall0)
    asleep = TimedWindow.start()
    time.sleep(0.15)
    slept = asleep.facts()
    assert abs(spun["on_cpu"] - share) < 0.15, (spun, share)
    assert spun["on_cpu"] > 0.2
    assert 0.0 <= slept["on_cpu"] < 0.2 and slept["on_cpu"] < spun["on_cpu"] / 2
    assert spun["steal_ms"] >= 0.0 and slept["steal_ms"] >= 0.0
    assert spun["allowed"] >= 1
