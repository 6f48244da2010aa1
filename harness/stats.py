"""Uncertainty of a point's step time, and comparisons that respect it (README "Intervals").

Distribution-free throughout: no normality, no scipy. A point's samples are its timed steps,
grouped by the fresh worker process (repeat) that timed them.

- The interval of the median over all steps is the order-statistic one: [x_(k), x_(n+1-k)] of
  the sorted steps covers the median with probability 1 - 2·P(Binomial(n, 1/2) ≤ k-1) for any
  continuous distribution of independent steps; k is the largest with coverage ≥ LEVEL.
- Steps of one process are not independent of that process (its allocation, its clocks, its
  compiled pipelines), so with two or more repeats the interval is widened to take in the
  same interval over the per-repeat medians (with 3-8 repeats that is their full range, which
  covers the median process with probability 1 - 2^(1-N): 75 % at 3, 94 % at 5).
- Two intervals that overlap are "no difference"; a comparison states an ordering only where
  they do not (a conservative test: two disjoint 95 % intervals).
- A transient is a step far slower than its own repeat's median (beyond TRANSIENT_MADS scaled
  MADs and TRANSIENT_FRACTION of the median): a cold first step, a stall. Transients stay in
  the data (the median is robust to them) and are named, so they are not mistaken for noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from math import comb

#: the confidence level intervals aim for
LEVEL = 0.95
#: a step this many scaled MADs (1.4826·MAD, a standard deviation for normal data) above its
#: repeat's median is a transient ...
TRANSIENT_MADS = 5.0
#: ... and at least this fraction above it (steps that are all alike have a MAD of zero)
TRANSIENT_FRACTION = 0.10
#: the coefficient of variation, transients left out, at and above which a point is unstable
UNSTABLE_CV = 0.10

NO_DIFFERENCE, FASTER, SLOWER = "no difference", "faster", "slower"


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("median of no samples")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _binom_half_cdf(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) ≤ k), exactly."""
    return sum(comb(n, i) for i in range(k + 1)) / 2**n if k >= 0 else 0.0


def median_interval(samples: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(low, high, coverage): the order-statistic interval for the median of `samples`.

    The narrowest symmetric pair of order statistics whose coverage is at least `level`; where
    no pair reaches it (fewer than 6 samples at 95 %) the full range, with the coverage it has.
    """
    s = sorted(samples)
    n = len(s)
    if n == 0:
        raise ValueError("an interval of no samples")
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * _binom_half_cdf(k, n) >= level:
        k += 1
    return s[k - 1], s[n - k], 1 - 2 * _binom_half_cdf(k - 1, n)


@dataclass(frozen=True)
class Interval:
    """Where the median step time lies; `coverage` is the guaranteed probability of the part
    that sets the method (per-repeat medians from 3 repeats, else the steps)."""

    low: float
    high: float
    coverage: float
    method: str

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Interval:
        return cls(float(d["low"]), float(d["high"]), float(d["coverage"]), str(d["method"]))


def interval(repeats: Sequence[Sequence[float]], level: float = LEVEL) -> Interval:
    """The interval of the median step time over every step of every repeat (see the module)."""
    repeats = [list(r) for r in repeats if len(r)]
    if not repeats:
        raise ValueError("an interval of no samples")
    pooled = [x for r in repeats for x in r]
    low, high, cov = median_interval(pooled, level)
    method = f"order statistics of {len(pooled)} steps ({cov:.1%})"
    if len(repeats) == 1:
        return Interval(low, high, cov, method + ", one process")
    mlow, mhigh, mcov = median_interval([median(r) for r in repeats], level)
    method += f" widened by {len(repeats)} per-process medians ({mcov:.1%})"
    return Interval(min(low, mlow), max(high, mhigh), mcov if len(repeats) >= 3 else cov, method)


@dataclass(frozen=True)
class Comparison:
    """A point against a baseline: `speedup` is base median / point median; `verdict` says
    whether that is outside the noise."""

    verdict: str
    speedup: float

    @property
    def separated(self) -> bool:
        return self.verdict != NO_DIFFERENCE


def compare(point_median: float, point_iv: Interval, base_median: float,
            base_iv: Interval) -> Comparison:
    """FASTER or SLOWER only where the two intervals do not overlap."""
    speedup = base_median / point_median
    if point_iv.overlaps(base_iv):
        return Comparison(NO_DIFFERENCE, speedup)
    return Comparison(FASTER if point_iv.high < base_iv.low else SLOWER, speedup)


def transients(samples: Sequence[float]) -> list[int]:
    """Indices of steps far slower than the rest of their repeat (see TRANSIENT_MADS)."""
    if len(samples) < 3:
        return []
    med = median(samples)
    mad = 1.4826 * median([abs(x - med) for x in samples])
    limit = med + max(TRANSIENT_MADS * mad, TRANSIENT_FRACTION * med)
    return [i for i, x in enumerate(samples) if x > limit]


def transient_steps(repeats: Sequence[Sequence[float]]) -> list[dict]:
    """The transients of every repeat: [{"ms", "repeat", "step"}] (0-based indices)."""
    return [{"ms": r[i], "repeat": k, "step": i}
            for k, r in enumerate(repeats) for i in transients(r)]


def slowest(repeats: Sequence[Sequence[float]]) -> dict:
    """The slowest step of all: {"ms", "repeat", "step"} (0-based indices)."""
    ms, r, i = max((x, r, i) for r, steps in enumerate(repeats) for i, x in enumerate(steps))
    return {"ms": ms, "repeat": r, "step": i}


def unstable(repeats: Sequence[Sequence[float]]) -> str:
    """pyperf-style warning over the steady steps (transients left out), or ""."""
    steady = []
    for r in repeats:
        skip = set(transients(r))
        steady += [x for i, x in enumerate(r) if i not in skip]
    if len(steady) < 3:
        return ""
    mean = sum(steady) / len(steady)
    if mean <= 0:
        return ""
    cv = (sum((x - mean) ** 2 for x in steady) / len(steady)) ** 0.5 / mean
    if cv >= UNSTABLE_CV:
        return (f"unstable: stdev is {cv:.0%} of the mean (transients left out); use more "
                "--steps, --repeat or a quieter machine")
    return ""
