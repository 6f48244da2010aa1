"""The SM clock sampler (harness/clocks.py) on a stand-in for nvidia-smi, and the report's
note for points timed at a low clock."""

from __future__ import annotations

import sys
import time

from harness import metrics
from harness.clocks import ClockSampler

# prints what `nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits -lms 50` does,
# an unreadable line among them, then keeps running until it is stopped
FAKE_SMI = [sys.executable, "-u", "-c",
            "import time\n"
            "for x in ('345', '[N/A]', '1980', '1980'):\n"
            "    print(x, flush=True); time.sleep(0.05)\n"
            "time.sleep(30)\n"]


def test_sampler_reads_clock_lines_and_stops():
    t0 = time.perf_counter()
    s = ClockSampler(FAKE_SMI)
    deadline = time.perf_counter() + 10
    while len(s.samples) < 3 and time.perf_counter() < deadline:
        time.sleep(0.02)
    s.stop()
    assert [mhz for _, mhz in s.samples] == [345.0, 1980.0, 1980.0]
    assert s._proc is not None and s._proc.poll() is not None  # the command was stopped
    whole = s.during(t0, time.perf_counter())
    assert whole == {"min": 345.0, "median": 1980.0, "max": 1980.0, "samples": 3,
                     "peak_seen": 1980.0}
    # a window shorter than the sampling period takes the first sample after it
    first_t = s.samples[0][0]
    assert s.during(first_t - 1e-4, first_t - 5e-5)["samples"] == 1
    assert s.during(time.perf_counter(), time.perf_counter() + 1) is None


def test_stop_waits_for_a_sample_after_a_short_window():
    s = ClockSampler(FAKE_SMI)
    deadline = time.perf_counter() + 10
    while not s.samples and time.perf_counter() < deadline:
        time.sleep(0.005)
    window = (time.perf_counter(), time.perf_counter() + 0.001)  # between two samples
    time.sleep(0.001)
    s.stop(after=window[1])
    got = s.during(*window)
    assert got is not None and got["samples"] == 1 and got["min"] in (345.0, 1980.0)


def test_sampler_without_the_command_records_nothing():
    s = ClockSampler(["statebench-no-such-command"])
    s.stop()
    assert s.samples == [] and s.during(0.0, 1e9) is None


def test_low_clock_is_noted():
    low = {"sm_clock_mhz": {"min": 345.0, "median": 390.0, "max": 390.0, "samples": 3,
                            "peak_seen": 1980.0}}
    high = {"sm_clock_mhz": {"min": 1950.0, "median": 1980.0, "max": 1980.0, "samples": 3,
                             "peak_seen": 1980.0}}
    assert "390 MHz" in metrics.low_clock(low) and "1980" in metrics.low_clock(low)
    assert metrics.low_clock(high) == ""
    assert metrics.low_clock({}) == ""
