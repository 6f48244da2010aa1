"""What a run says, point by point and in plain sentences (README "Reading the table").

One cell per point (the same in the terminal, Markdown and HTML reports): the median step
time with its interval, the cache bytes the step moved, the match, and the speedup over the
stateless baseline only where the intervals do not overlap. Under the table, sentences per
context: which modes are faster beyond the noise and by how much, and what each moved.

Cache traffic is computed from a point's byte categories and the workload's cache specs:
- across the host link: h2d and d2h less what is not cache (the logits; a transfer smaller
  than the state one step writes is ids or a status word, not cache);
- copied on the device: d2d copies, plus, for a graph that does not write its pairs in place
  (stateless, reuse, ORT without shared buffers), the present KV tensors written out whole
  (capacity rows; the context's rows for the `standard` flavour's concatenated present);
- written in place: a graph whose every pair is in place writes one row per KV pair and the
  whole recurrent states, nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness import metrics, stats
from harness.results import Point, Results
from model.workload import ModelConfig


@dataclass(frozen=True)
class CacheTraffic:
    """Cache bytes per step: across the host link (both ways), copied on the device, written
    in place."""

    link: float
    copied: float
    in_place: float

    @property
    def moved(self) -> float:
        """What the cell shows: the cache bytes a step moved beyond its own writes."""
        return self.link + self.copied


def model_config(results: Results) -> ModelConfig | metrics.StateBytes | None:
    """The run's model, from the file's workload.config, or a model run's state bytes
    (None where neither is readable)."""
    d = results.workload.get("config")
    if not isinstance(d, dict):
        return model_state(results)
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    try:
        kw = {k: v for k, v in d.items() if k in names}
        kw["layers"] = tuple(kw.get("layers", ()))
        return ModelConfig(**kw)
    except Exception:  # noqa: BLE001 - a config this code cannot rebuild: no traffic figures
        return None


def in_place(p: Point) -> bool:
    """Whether the point's graph wrote every cache pair in place (its details say)."""
    pairs = p.details.get("in_place")
    return isinstance(pairs, dict) and bool(pairs) and all(pairs.values())


def cache_traffic(p: Point, cfg: ModelConfig | metrics.StateBytes | None) -> CacheTraffic | None:
    if cfg is None or not p.measured or p.bytes_per_step is None:
        return None
    b, state = p.bytes_per_step, metrics.state_bytes(cfg)
    logits = p.details.get("logits_bytes")  # a backend whose logits are not the graph's type
    up, down = state.link_cache(b["h2d"], b["d2h"], p.capacity, logits)
    if in_place(p):
        return CacheTraffic(up + down, b["d2d"], float(state.written))
    rows = p.context if p.details.get("flavour") == "standard" else p.capacity
    return CacheTraffic(up + down, b["d2d"] + state.appended(max(rows, 1)), 0.0)


def model_state(results: Results) -> metrics.StateBytes | None:
    """A model run's state bytes, from workload.model.bytes (harness/sources.py)."""
    d = (results.workload.get("model") or {}).get("bytes", {}).get("state")
    try:
        return metrics.StateBytes.from_dict(d)
    except (TypeError, KeyError, ValueError):  # an older file, or a state not known
        return None


def interval_of(p: Point) -> stats.Interval | None:
    """The point's interval: recorded, or made from its samples (files before --repeat keep
    theirs in details.step_ms_samples); None where there are no samples."""
    if not p.measured:
        return None
    if p.step_ms_ci is not None:
        return stats.Interval.from_dict(p.step_ms_ci)
    samples = samples_of(p)
    return stats.interval(samples) if samples else None


def compare_points(p: Point | None, base: Point | None) -> stats.Comparison | None:
    """p against base; None unless both were measured and both match (a point that does not
    match is never faster). A file without samples gets verdict "": no interval to judge by."""
    if p is None or base is None or not (p.matches and base.matches):
        return None
    a, b = interval_of(p), interval_of(base)
    if a is None or b is None:
        return stats.Comparison("", base.step_ms.median / p.step_ms.median)
    return stats.compare(p.step_ms.median, a, base.step_ms.median, b)


def baseline_point(results: Results, p: Point) -> Point | None:
    base = metrics.stateless_baseline(results.points, p.backend)
    if base is None or base == p.backend:
        return None
    return results.point(base, p.context)


def over_baseline(results: Results, p: Point) -> stats.Comparison | None:
    return compare_points(p, baseline_point(results, p))


# -- the cell -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """A measured point as the table shows it; `verdict` is "" for a baseline."""

    time: str
    interval: str
    cache: str
    matches: bool
    verdict: str
    faster: bool
    noisy: bool

    def lines(self) -> list[str]:
        return [self.time, self.interval, self.cache,
                ("✓" if self.matches else "✗ mismatch") + (f" {self.verdict}" if self.verdict else "")]


def verdict_text(c: stats.Comparison | None) -> str:
    if c is None:
        return ""
    if c.verdict == stats.NO_DIFFERENCE:
        return "no difference"
    if c.verdict == "":
        return f"{c.speedup:.2f}× (no interval)"
    if c.verdict == stats.SLOWER:
        return f"{1 / c.speedup:.2f}× slower"
    return f"{c.speedup:.2f}× faster"


def cell(results: Results, p: Point, cfg: ModelConfig | None) -> Cell:
    iv = interval_of(p)
    traffic = cache_traffic(p, cfg)
    c = over_baseline(results, p) if p.matches else None
    return Cell(
        time=f"{p.step_ms.median:.3f} ms",
        interval=f"[{iv.low:.3f}, {iv.high:.3f}]" if iv else "[no interval]",
        cache="cache " + (metrics.human_bytes(traffic.moved) if traffic else "?"),
        matches=p.matches, verdict=verdict_text(c),
        faster=c is not None and c.verdict == stats.FASTER,
        noisy=bool(warning_of(p)))


CELL_CAPTION = ("each cell: median step time · its interval · cache bytes moved per step (host "
                "link and device copies) · match ✓/✗ and the speedup over the stateless baseline "
                "where the intervals do not overlap")


# -- the sentences -----------------------------------------------------------------------

def _moved_phrase(t: CacheTraffic) -> str:
    parts = []
    if t.link:
        parts.append(f"moved {metrics.human_bytes(t.link)} of cache across the host link")
    if t.copied:
        parts.append(f"copied {metrics.human_bytes(t.copied)} of cache on the device")
    if t.in_place:
        parts.append(f"wrote {metrics.human_bytes(t.in_place)} in place")
    if not (t.link or t.copied):
        parts.append("moved no cache" if parts else "moved no cache and wrote none")
    return " and ".join(parts)


def _names(points: list[Point]) -> str:
    names = [p.backend for p in points]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _family(backend: str) -> str:
    return backend.split(":", 1)[0]


def context_sentences(results: Results, ctx: int, cfg: ModelConfig | None) -> list[str]:
    """What the points at one context moved, and which are faster beyond the noise."""
    pts = [p for p in results.points if p.context == ctx and p.measured]
    out = []
    by_traffic: dict[str, list[Point]] = {}
    for p in pts:
        t = cache_traffic(p, cfg)
        if t is not None:
            by_traffic.setdefault(_moved_phrase(t), []).append(p)
    if by_traffic:
        out.append(f"At {ctx}, per step: " + "; ".join(f"{_names(ps)} {phrase}"
                                                       for phrase, ps in by_traffic.items()) + ".")
    faster, level, slower = [], [], []
    for p in pts:
        c = over_baseline(results, p)
        if c is None:
            continue
        base = baseline_point(results, p).backend
        if c.verdict == stats.FASTER:
            faster.append(f"{p.backend} {c.speedup:.2f}× over {base}")
        elif c.verdict == stats.SLOWER:
            slower.append(f"{p.backend} {1 / c.speedup:.2f}× slower than {base}")
        else:
            level.append(f"{p.backend} against {base}")
    if faster:
        out.append("Faster beyond the noise: " + ", ".join(faster) + ".")
    if slower:
        out.append("Slower beyond the noise: " + ", ".join(slower) + ".")
    if level:
        out.append("No difference (intervals overlap): " + ", ".join(level) + ".")
    out += _in_place_sentences(pts)
    return out


def _in_place_sentences(pts: list[Point]) -> list[str]:
    """Each in-place point against the same family's device-resident points that copy."""
    out = []
    for p in pts:
        if not in_place(p):
            continue
        for q in pts:
            if (q is p or _family(q.backend) != _family(p.backend) or in_place(q)
                    or metrics.is_stateless(q.backend, q.details)):
                continue
            c = compare_points(p, q)
            if c is None:
                continue
            a, b = interval_of(p), interval_of(q)
            figures = (f" ({p.step_ms.median:.3f} ms [{a.low:.3f}, {a.high:.3f}] against "
                       f"{q.step_ms.median:.3f} ms [{b.low:.3f}, {b.high:.3f}])" if a and b else "")
            if c.verdict == stats.FASTER:
                what = f"{c.speedup:.2f}× faster"
            elif c.verdict == stats.SLOWER:
                what = f"{1 / c.speedup:.2f}× slower"
            else:
                what = "no difference" if c.verdict else f"{c.speedup:.2f}× (no interval)"
            out.append(f"{p.backend} against {q.backend}: {what}{figures}.")
    return out


def cpu_adapter_sentence(results: Results, cfg: ModelConfig | None) -> str:
    """On a CPU adapter: times are compute-bound and the bytes are the evidence (with the cache's
    share of a step's bytes at the deepest context, which says why)."""
    info = results.environment.get("wgpu", {}).get("info", {})
    wgpu_points = [p for p in results.points if p.measured and not metrics.is_cpu(p.backend)]
    if info.get("adapter_type") != "CPU" or not wgpu_points:
        return ""
    deepest = max(p.context for p in wgpu_points)
    shares = [p.cache_bytes / p.bytes_total for p in wgpu_points
              if p.context == deepest and p.cache_bytes and p.bytes_total]
    share = (f" (at {deepest} the cache is {max(shares):.0%} of the bytes a step reads and writes)"
             if shares else "")
    return (f"The wgpu adapter here is a CPU ({results.environment['wgpu'].get('adapter')}): a step's "
            f"time is compute{share}, so times barely separate; the cache bytes are the evidence.")


def sentences(results: Results) -> list[str]:
    """The plain sentences under the table, computed from the run."""
    cfg = model_config(results)
    out = []
    for ctx in results.contexts:
        out += context_sentences(results, ctx, cfg)
    cpu = cpu_adapter_sentence(results, cfg)
    if cpu:
        out.append(cpu)
    if any(metrics.is_cpu(p.backend) and (t := cache_traffic(p, cfg)) is not None and t.link
           for p in results.points):
        out.append("On ONNX Runtime's CPU EP host and device memory are one: its 'host link' "
                   "bytes are copies across the session interface, in host memory.")
    return out


# -- per-point notes: transients and noise --------------------------------------------------

def samples_of(p: Point) -> list[list[float]]:
    """The point's steps per process (files before --repeat: one process, from details)."""
    if p.repeats:
        return [r["step_ms"] for r in p.repeats if r["step_ms"]]
    samples = p.details.get("step_ms_samples")
    return [list(samples)] if samples else []


def warning_of(p: Point) -> str:
    """The point's unstable warning, transients left out (older files called a slow first
    step noise: their warning is recomputed from the samples)."""
    if p.repeats is None and samples_of(p):
        return stats.unstable(samples_of(p))
    return str(p.details.get("warning") or "")


def transient_notes(p: Point) -> list[str]:
    """One phrase naming the point's transient steps (which process, which step, how slow
    against the median); [] where there are none."""
    if not p.measured:
        return []
    reps = samples_of(p)
    found = p.transients if p.transients is not None else stats.transient_steps(reps)
    if not found:
        return []
    if len(reps) > 1:
        where = ", ".join(f"process {t['repeat'] + 1} step {t['step']}" for t in found)
    else:
        where = ("timed step " if len(found) == 1 else "timed steps ") + ", ".join(
            str(t["step"]) for t in found)
    low, high = min(t["ms"] for t in found), max(t["ms"] for t in found)
    took = f"{low:.3f} ms" if len(found) == 1 else f"{low:.3f}–{high:.3f} ms"
    return [f"transient{'s' if len(found) > 1 else ''}: {where} took {took} against a median of "
            f"{p.step_ms.median:.3f} ms (kept in the data; the median is robust to them)"]
