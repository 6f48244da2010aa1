"""One point measured in several fresh worker processes (`--repeat N`, pyperf-style), kept as one.

A worker's point carries its steps in details (step_ms_samples, gpu_ms_samples); `first` moves
them into the point's `repeats`, `add` folds a later repeat in, and both recompute what the
samples say (`summarise`): pooled median and p10/p90, the interval of the median
(harness/stats.py), the slowest step and the transients, and the unstable warning.
Everything but the samples is deterministic or per-process: bytes per step are counted, so
repeats agree (where they do not, the point's figure is their mean and `details.bytes_differ`
says so, rather than a GPU run losing the point), the logits' match is the worst repeat's,
build and time to depth are the median repeat's, peak RSS and device bytes the largest. A
WebNN page's host-time breakdown and the host CPUs it ran on are per process too: each repeat
keeps its own, and the point's breakdown is the median of each part over the repeats (the
part one slow process spends its extra time in shows in that repeat, not in the point).
"""

from __future__ import annotations

from dataclasses import replace

from harness import stats
from harness.results import Match, Point, Stats

#: per-process details a repeat keeps where the worker recorded them (besides its samples,
#: wall, build and time to depth, and bytes, which every repeat has)
_PER_REPEAT = ("sm_clock_mhz", "host_breakdown_ms", "host_cpus", "gc_timed")


def _repeat_of(p: Point) -> dict:
    """The samples and per-process facts of a measured single-process point."""
    d = p.details
    return {"step_ms": list(d.get("step_ms_samples") or []),
            "gpu_ms": list(d["gpu_ms_samples"]) if d.get("gpu_ms_samples") else None,
            "wall_s": d.get("wall_s"), "build_s": p.build_s,
            "time_to_depth_s": p.time_to_depth_s, "bytes_per_step": dict(p.bytes_per_step or {}),
            **{k: d[k] for k in _PER_REPEAT if k in d}}


def _moved(details: dict) -> dict:
    """Details without what the repeats now hold."""
    return {k: v for k, v in details.items()
            if k not in ("step_ms_samples", "gpu_ms_samples", "warning", "wall_s", "host_cpus",
                         "gc_timed")}


def first(p: Point) -> Point:
    """A worker's point as repeat 1 of its point."""
    if not p.measured:
        return p
    return summarise(replace(p, repeats=[_repeat_of(p)], details=_moved(p.details)))


def add(prev: Point, new: Point, index: int, total: int) -> Point:
    """`prev` (repeats 1..index-1) with repeat `index` of `total` folded in."""
    if not new.measured:
        return replace(new, reason=f"repeat {index} of {total}: {new.reason}",
                       repeats=prev.repeats)
    reps = [*(prev.repeats or []), _repeat_of(new)]
    a, b = prev.match, new.match
    match = Match(a.ok and b.ok, max(a.max_abs, b.max_abs), max(a.max_rel, b.max_rel),
                  min(a.argmax_agree, b.argmax_agree), b.tolerance)
    details = dict(prev.details)
    counted = [r["bytes_per_step"] for r in reps if r.get("bytes_per_step")]
    bytes_per_step = {k: sum(b[k] for b in counted) / len(counted) for k in counted[0]}
    if any(b != counted[0] for b in counted):
        details["bytes_differ"] = ("bytes per step differ between processes (total "
                                   + ", ".join(f"{sum(b.values()):.0f}" for b in counted)
                                   + "); the mean is recorded")
    clocks = [r["sm_clock_mhz"] for r in reps if isinstance(r.get("sm_clock_mhz"), dict)]
    if clocks:  # the lowest-clocked repeat, so a low clock is noted (metrics.low_clock)
        details["sm_clock_mhz"] = min(clocks, key=lambda c: c.get("median") or 0)
    host = [r["host_breakdown_ms"] for r in reps if isinstance(r.get("host_breakdown_ms"), dict)]
    if host:
        details["host_breakdown_ms"] = _median_parts(host)
    return summarise(replace(
        prev, repeats=reps, match=match, details=details, bytes_per_step=bytes_per_step,
        build_s=_median_of(reps, "build_s"), time_to_depth_s=_median_of(reps, "time_to_depth_s"),
        peak_rss_bytes=_largest(prev.peak_rss_bytes, new.peak_rss_bytes),
        device_bytes=_largest(prev.device_bytes, new.device_bytes)))


def _median_parts(parts: list[dict[str, float]]) -> dict[str, float]:
    """Each key's median over the dicts that have it (the repeats' host-time breakdowns)."""
    keys = [k for k in parts[0] if all(k in p for p in parts)]
    return {k: round(stats.median([p[k] for p in parts]), 4) for k in keys}


def _median_of(reps: list[dict], key: str) -> float | None:
    vals = [r[key] for r in reps if isinstance(r.get(key), (int, float))]
    return stats.median(vals) if vals else None


def _largest(a: int | None, b: int | None) -> int | None:
    vals = [v for v in (a, b) if v is not None]
    return max(vals) if vals else None


def summarise(p: Point) -> Point:
    """The point's figures recomputed from its repeats' samples."""
    steps = [r["step_ms"] for r in p.repeats or [] if r["step_ms"]]
    if not steps:
        return p
    pooled = [x for r in steps for x in r]
    # a repeat's GPU samples count only when every step has one (the worker's own rule)
    gpu = [r.get("gpu_ms") if r.get("gpu_ms") and len(r["gpu_ms"]) == len(r["step_ms"] or [])
           else None for r in p.repeats]
    details = {k: v for k, v in p.details.items() if k != "warning"}
    warning = stats.unstable(steps)
    if warning:
        details["warning"] = warning
    details["wall_s"] = round(sum(r.get("wall_s") or 0.0 for r in p.repeats), 3)
    if all(gpu):
        gpu_ms, gpu_reason = Stats.of([x for g in gpu for x in g]), ""
    elif len(gpu) == 1 or not any(gpu):
        gpu_ms, gpu_reason = p.gpu_ms, p.gpu_reason
    else:
        gpu_ms, gpu_reason = None, "GPU time missing in some repeats"
    return replace(
        p, step_ms=Stats.of(pooled), gpu_ms=gpu_ms, gpu_reason=gpu_reason,
        step_ms_ci=stats.interval(steps).to_dict(), step_ms_max=stats.slowest(steps),
        transients=stats.transient_steps(steps),
        details=details)
