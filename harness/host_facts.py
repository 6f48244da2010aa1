"""What the host was doing while a point's steps were timed (``details.host_cpus``).

Processes of one point can spend different host time a step at the same GPU time, and where
they run does not explain it (measured: FINDINGS 27 and 28, docs/measuring.md "Host time").
These facts tell the remaining causes apart per process: a stepping thread that lost its CPU
(``on_cpu`` below 1: preempted, or waiting in the kernel rather than spinning), a hypervisor
that gave the machine's CPUs to others (``steal_ms``), or neither (the same work simply ran
slower: the clock, the caches).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass


def _steal_ticks() -> int | None:
    """Ticks the hypervisor ran something else on this machine's CPUs, all CPUs summed
    (/proc/stat's "cpu" line, 8th value), or None where Linux does not tell."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        with open("/proc/stat") as f:
            return int(f.readline().split()[8])
    return None


def where_running() -> dict[str, int]:
    """The CPUs this process may run on, the one its calling thread ran on last and the
    process's threads (the driver's included), where Linux tells."""
    out: dict[str, int] = {}
    with contextlib.suppress(AttributeError, OSError):
        out["allowed"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, IndexError, ValueError):
        with open("/proc/thread-self/stat") as f:  # field 39, after the ")" ending comm
            out["last"] = int(f.read().rsplit(")", 1)[1].split()[36])
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/self/status") as f:
            out["threads"] = int(next(ln for ln in f if ln.startswith("Threads:")).split()[1])
    return out


@dataclass
class TimedWindow:
    """The host's clocks at the start of the timed steps; ``facts()`` at their end."""

    wall_ns: int
    thread_ns: int
    steal: int | None

    @classmethod
    def start(cls) -> TimedWindow:
        return cls(time.perf_counter_ns(), time.thread_time_ns(), _steal_ticks())

    def facts(self) -> dict[str, float]:
        """``where_running()`` plus, over the window (``window_ms``): ``on_cpu``, the calling
        thread's CPU time over the wall time (1.0: it ran throughout, spinning waits
        included; the kernel accounts CPU time in its own steps, so a window of a few ms
        can read above 1), and ``steal_ms``, the machine's steal time (its ticks are
        coarse: 10 ms at the usual 100 Hz, summed over every CPU)."""
        wall = time.perf_counter_ns() - self.wall_ns
        out: dict[str, float] = dict(where_running())
        out["window_ms"] = round(wall / 1e6, 3)
        if wall > 0:
            out["on_cpu"] = round((time.thread_time_ns() - self.thread_ns) / wall, 3)
        end = _steal_ticks()
        if self.steal is not None and end is not None:
            out["steal_ms"] = round((end - self.steal) * 1000 / os.sysconf("SC_CLK_TCK"), 1)
        return out
