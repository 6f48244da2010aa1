"""Intervals, comparisons and transients (harness/stats.py), against hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest

from harness import stats


def test_median_interval_hand_checked():
    # n = 10: k = 2 gives 1 - 2·(1 + 10)/1024 = 0.978; k = 3 gives 1 - 2·56/1024 = 0.891 < 0.95
    low, high, cov = stats.median_interval(list(range(10, 0, -1)))
    assert (low, high) == (2, 9) and cov == pytest.approx(1 - 22 / 1024)
    # n = 6: the range, 1 - 2/64; n = 5: no pair reaches 95 %, the range with its 1 - 2/32
    assert stats.median_interval([3, 1, 2, 6, 5, 4]) == (1, 6, pytest.approx(1 - 2 / 64))
    assert stats.median_interval([5, 1, 2, 3, 4]) == (1, 5, pytest.approx(1 - 2 / 32))
    assert stats.median_interval([7.0]) == (7.0, 7.0, 0.0)
    # n = 40: k = 14 (P(B(40, 1/2) ≤ 13) = 0.0192; ≤ 14 is 0.0403, twice that is above 5 %)
    low, high, cov = stats.median_interval(list(range(1, 41)))
    assert (low, high) == (14, 27) and cov == pytest.approx(1 - 2 * 0.019239, abs=1e-5)
    with pytest.raises(ValueError):
        stats.median_interval([])


def test_interval_widens_over_per_process_medians():
    one = stats.interval([[1.0, 1.1, 1.2, 1.3, 1.4, 1.5]])
    assert (one.low, one.high) == (1.0, 1.5) and "one process" in one.method
    # three processes of 10 steps, each tight, at 1, 2 and 3 ms: the 30 steps alone give
    # [x_10, x_21] = [1.09, 3.00] (k = 10: 1 - 2·P(B(30, 1/2) ≤ 9) = 0.957); the medians'
    # range [1.045, 3.045] widens it
    reps = [[lvl + i / 100 for i in range(10)] for lvl in (1.0, 2.0, 3.0)]
    assert stats.median_interval([x for r in reps for x in r])[:2] == (1.09, 3.0)
    iv = stats.interval(reps)
    assert (iv.low, iv.high) == (pytest.approx(1.045), pytest.approx(3.045))
    assert iv.coverage == pytest.approx(0.75)  # 1 - 2^(1-3): the range of 3 medians
    assert "3 per-process medians" in iv.method
    assert stats.Interval.from_dict(iv.to_dict()) == iv


def test_compare_says_no_difference_when_intervals_overlap():
    a, b = stats.Interval(1.0, 2.0, 0.95, ""), stats.Interval(1.9, 3.0, 0.95, "")
    c = stats.compare(1.5, a, 2.5, b)
    assert c.verdict == stats.NO_DIFFERENCE and not c.separated and c.speedup == pytest.approx(5 / 3)
    d = stats.compare(1.5, a, 2.5, stats.Interval(2.1, 3.0, 0.95, ""))
    assert d.verdict == stats.FASTER and d.separated
    assert stats.compare(2.5, stats.Interval(2.1, 3.0, 0.95, ""), 1.5, a).verdict == stats.SLOWER


def _processes(rng, level_ms, between, within, n_proc=3, steps=40):
    """Simulated timings: each process has its own level (spread `between`), its steps
    scatter around it (spread `within`)."""
    return [list(rng.normal(level_ms + rng.normal(0, between), within, steps))
            for _ in range(n_proc)]


def _verdict(fast, slow):
    m = stats.median
    return stats.compare(m([x for r in fast for x in r]), stats.interval(fast),
                         m([x for r in slow for x in r]), stats.interval(slow)).verdict


def test_simulated_distributions_that_differ_and_that_do_not():
    rng = np.random.default_rng(7)
    # 2.8 ms against 3.4 ms, processes within 0.05 ms of each other: an ordering
    assert _verdict(_processes(rng, 2.8, 0.05, 0.1), _processes(rng, 3.4, 0.05, 0.1)) == stats.FASTER
    # the same distribution twice: no difference, however many steps
    same = [_verdict(_processes(rng, 3.0, 0.05, 0.1), _processes(rng, 3.0, 0.05, 0.1))
            for _ in range(20)]
    assert same.count(stats.NO_DIFFERENCE) >= 19
    # the audit's case: each process tight, but processes spread 2.78-3.22 ms; a 0.1 ms gap in
    # the means is inside that spread, though the steps of one process each would separate
    fast = [[2.78 + 0.001 * i for i in range(40)], [3.0 + 0.001 * i for i in range(40)],
            [3.22 + 0.001 * i for i in range(40)]]
    slow = [[x + 0.1 for x in r] for r in fast]
    assert _verdict(fast, slow) == stats.NO_DIFFERENCE
    assert _verdict(fast[:1], slow[:1]) == stats.FASTER  # one process each would claim it


#: the recorded wgpu:reuse point at 512 on the H200 (the audit's "stdev 26 %")
REUSE_512 = [6.128996, 3.106157, 3.469651, 2.881907, 3.361264, 3.404106, 3.375206, 3.412358]


def test_a_slow_first_step_is_a_transient_not_noise():
    assert stats.transients(REUSE_512) == [0]
    # the old warning (stdev over all steps: 26 % of the mean) called it noise
    assert np.std(REUSE_512) / np.mean(REUSE_512) > 0.25
    assert stats.unstable([REUSE_512]) == ""
    assert "unstable" in stats.unstable([[1.0, 2.0, 1.0, 3.0, 2.0, 1.5]])
    assert stats.unstable([[1.0, 1.0, 1.0]]) == ""
    assert stats.slowest([REUSE_512]) == {"ms": 6.128996, "repeat": 0, "step": 0}


def test_a_stall_is_named_with_its_step():
    rng = np.random.default_rng(1)
    steady = list(rng.normal(2.8, 0.05, 40))
    stalled = steady[:17] + [36.0] + steady[18:]
    assert stats.transients(stalled) == [17]
    assert stats.slowest([steady, stalled]) == {"ms": 36.0, "repeat": 1, "step": 17}
    assert stats.transients(steady) == []
    assert stats.transients([1.0, 1.0, 1.0, 1.05]) == []  # all alike: MAD 0, 10 % floor


def _worker_point(step_ms, gpu_ms, gpu_reason):
    from harness.results import Match, Point, Stats
    return Point(backend="wgpu:stateful", context=16, capacity=32, steps=len(step_ms),
                 step_ms=Stats.of(step_ms), gpu_ms=Stats.of(gpu_ms) if gpu_reason == "" else None,
                 gpu_reason=gpu_reason, match=Match(True, 0.0, 0.0, 1.0),
                 bytes_per_step={"h2d": 8, "d2h": 4, "d2d": 0, "kernel": 100},
                 details={"step_ms_samples": step_ms, "gpu_ms_samples": gpu_ms})


def test_a_process_with_gpu_time_on_some_steps_gives_no_gpu_stats():
    """The worker's rule (GPU stats only when every step has one) holds after a repeat is
    summarised, and when a second process has all of its GPU times."""
    from harness import repeats
    partial = repeats.first(_worker_point([1.0, 1.1, 1.2, 1.0], [0.5, 0.6, 0.5],
                                          "GPU time missing on some steps"))
    assert partial.gpu_ms is None and partial.gpu_reason == "GPU time missing on some steps"
    both = repeats.add(partial, _worker_point([1.0, 1.0, 1.1, 1.0], [0.5] * 4, ""), 2, 2)
    assert both.gpu_ms is None and both.gpu_reason == "GPU time missing in some repeats"
    whole = repeats.first(_worker_point([1.0, 1.1, 1.2, 1.0], [0.5, 0.6, 0.5, 0.5], ""))
    assert whole.gpu_ms is not None and whole.gpu_ms.median == 0.5


def test_the_report_counts_every_transient_step():
    from harness import repeats, report
    steps = [1.0] * 30 + [9.0, 8.0]  # two stalls in one process: two transient steps
    p = repeats.first(_worker_point(steps, [0.5] * 32, ""))
    assert len(p.transients) == 2
    assert report._uncertainty_columns(p)["transients"] == 2
