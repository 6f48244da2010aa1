"""The GPU's SM clock while a point is timed, where `nvidia-smi` can tell (FINDINGS 16).

GPU time depends on the clock the governor chose, and the governor raises it only under
sustained load. A step timed at a low clock is a slower step, not a slower method. So the
worker samples the clock through the warm-up and the timed steps, and it records what the
timed steps ran at beside their times. Where no `nvidia-smi` exists (lavapipe, other
vendors), nothing is recorded.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Sequence

#: one SM clock reading (MHz) per line, every 50 ms
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
              "-lms", "50")


class ClockSampler:
    """Reads clock samples from a command's output lines in a thread; each sample is
    stamped with `time.perf_counter()` when it arrives. `command` is for tests."""

    def __init__(self, command: Sequence[str] = NVIDIA_SMI) -> None:
        self.samples: list[tuple[float, float]] = []  # (perf_counter, MHz)
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        if shutil.which(command[0]) is None:
            return
        try:
            self._proc = subprocess.Popen(list(command), stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                mhz = float(line.split(",")[0])
            except ValueError:
                continue  # "[N/A]" and the like
            self.samples.append((time.perf_counter(), mhz))

    def stop(self, after: float | None = None, wait_s: float = 0.25) -> None:
        """Stop sampling; with `after` (a perf_counter time), first wait up to `wait_s` for
        a sample later than it, so a window shorter than the period still gets a reading
        (a sweep's stateful steps take ~30 ms in all; the period is 50 ms)."""
        if after is not None and self._thread is not None:
            deadline = time.perf_counter() + wait_s
            while (not self.samples or self.samples[-1][0] <= after) and \
                    time.perf_counter() < deadline and self._thread.is_alive():
                time.sleep(0.005)
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def during(self, start: float, end: float) -> dict | None:
        """The clock over [start, end] (perf_counter seconds): the samples inside it, or the
        first after it when the window is shorter than the sampling period; None without
        samples."""
        inside = [mhz for t, mhz in self.samples if start <= t <= end]
        if not inside:
            inside = [mhz for t, mhz in self.samples if t > end][:1]
        if not inside:
            return None
        inside.sort()
        return {"min": inside[0], "median": inside[len(inside) // 2], "max": inside[-1],
                "samples": len(inside),
                "peak_seen": max(mhz for _, mhz in self.samples)}
