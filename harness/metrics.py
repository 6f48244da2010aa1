"""Derived figures: logits agreement (DESIGN §6), floors and MBU (§7), speedup over stateless.

Pure functions over arrays, configs and `Point`s; nothing here measures or prints.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.bandwidth_bounds import WGPU_BOUNDS, checked_gbps
from harness.results import Match, Point
from model.workload import ModelConfig, cache_specs, valid_cache_bytes

#: relative tolerance on max|Δlogits| / max|ref logits| for float32 activations; the
#: reference's top-1/top-2 gap (relative to max|ref|) above which the argmax must agree is
#: the same figure (``logits_tolerance`` gives float16 activations theirs)
FLOAT32_TOLERANCE = 1e-3
#: one float16 ULP relative to the value it rounds: 2^-10 at the bottom of a binade (the
#: unit WPT's WebNN conformance tests count float16 budgets in)
F16_ULP = 2.0 ** -10
#: float16 ULPs one decoder layer may lose on its path from the residual stream to its
#: update, by WPT's per-op budgets (webnn/resources/utils.js) with every matmul, reduction
#: and softmax accumulating in float32 (rounded to float16 once, 1 ULP; WPT's 2K ULP for a
#: matmul assume float16 accumulation): RMSNorm 7 (mul 1, reduceMean 1, add 1, sqrt 1,
#: div 2, mul 1); q/k/v 1; RoPE 3 (mul, mul, sub); scores 1, scale 1, softmax 1, probs·V 1;
#: o_proj 1, residual add 1; RMSNorm 7; gate 1, sigmoid 3, mul 1, mul 1, down 1, add 1.
#: A gated delta layer (computed in float32 between casts) loses less; it counts the same.
F16_LAYER_ULPS = 32
#: the final RMSNorm (7) and the LM head (1)
F16_HEAD_ULPS = 8


def logits_tolerance(cfg: ModelConfig) -> float:
    """The relative logits tolerance of a model's activations (docs/measuring.md).

    float32: 1e-3. float16: the model's budget B = F16_LAYER_ULPS·layers + F16_HEAD_ULPS
    float16 ULPs, accumulated as a random walk (independent round-to-nearest errors carried
    by the residual stream, RMSNorm keeping them relative): sqrt(B)·2^-10. The logits' max
    error relative to their max is about the final hidden state's relative error (the
    head's columns are random), so the same figure bounds max|Δ|/max|ref|. llama-1b (16
    layers): 2.2e-2; tiny (2 layers): 8.3e-3."""
    if cfg.dtype != "float16":
        return FLOAT32_TOLERANCE
    return float16_tolerance(len(cfg.layers))


def float16_tolerance(layers: int) -> float:
    """``logits_tolerance`` of a decoder of ``layers`` layers with float16 activations."""
    budget = F16_LAYER_ULPS * layers + F16_HEAD_ULPS
    return max(FLOAT32_TOLERANCE, float(np.sqrt(budget)) * F16_ULP)

NONFINITE = 1e300

#: the baselines speedups are computed against, in order of preference
STATELESS_BASELINES = ("wgpu:stateless", "ort-cpu:copy")


def compare_logits(got: list[np.ndarray], ref: np.ndarray,
                   tol: float = FLOAT32_TOLERANCE) -> Match:
    """Every step's logits against the reference's (steps, vocab).

    ok: max|Δ|/max|ref| within ``tol`` (``logits_tolerance``) on every step, and the argmax
    agrees on every step where the reference's top-1/top-2 gap is clear (> tol·max|ref|).
    The tolerance is recorded in the Match.
    """
    gap_tol = tol
    ref = np.asarray(ref, np.float64)
    if len(got) != len(ref):
        raise ValueError(f"{len(got)} steps of logits for {len(ref)} reference steps")
    max_abs = max_rel = 0.0
    agree = 0
    ok = True
    for g, r in zip(got, ref, strict=True):
        g = np.asarray(g, np.float64).reshape(-1)
        if g.shape != r.shape:
            raise ValueError(f"logits shape {g.shape}, expected {r.shape}")
        if not np.all(np.isfinite(g)):
            # JSON has no inf: a non-finite output is recorded as the largest error there is
            return Match(False, NONFINITE, NONFINITE, agree / len(ref), tol)
        scale = float(np.max(np.abs(r))) or 1.0
        d = float(np.max(np.abs(g - r)))
        max_abs, max_rel = max(max_abs, d), max(max_rel, d / scale)
        top2 = np.partition(r, -2)[-2:]
        same = int(np.argmax(g)) == int(np.argmax(r))
        agree += same
        if d / scale > tol or (not same and float(top2[1] - top2[0]) > gap_tol * scale):
            ok = False
    return Match(ok, max_abs, max_rel, agree / len(ref), tol)


def mismatch_reason(got: list[np.ndarray], ref: np.ndarray, tol: float = FLOAT32_TOLERANCE,
                    reference: str = "the float64 reference") -> str:
    """Why `compare_logits` said no, in one line: the worst error, where it is, and the first
    step whose clear argmax differs (steps count from the first warm-up step); ``reference``
    names what the logits were compared with."""
    gap_tol = tol
    worst: tuple[float, float, int, int] | None = None  # rel, abs, step, vocab index
    argmax = ""
    for s, (g, r) in enumerate(zip(got, np.asarray(ref, np.float64), strict=True)):
        g = np.asarray(g, np.float64).reshape(-1)
        nonfinite = ~np.isfinite(g)
        if nonfinite.any():
            i = int(np.argmax(nonfinite))
            return f"logits not finite at step {s}, vocab index {i} ({g[i]})"
        scale = float(np.max(np.abs(r))) or 1.0
        diff = np.abs(g - r)
        i = int(np.argmax(diff))
        if worst is None or diff[i] / scale > worst[0]:
            worst = (float(diff[i] / scale), float(diff[i]), s, i)
        top2 = np.partition(r, -2)[-2:]
        a, b = int(np.argmax(g)), int(np.argmax(r))
        if not argmax and a != b and float(top2[1] - top2[0]) > gap_tol * scale:
            argmax = f"; argmax {a} where the reference's is {b} at step {s}"
    if worst is None:
        return "no logits to compare"
    rel, d, s, i = worst
    return (f"logits differ from {reference}: max abs {d:.3g}, max rel {rel:.2e} "
            f"(tolerance {tol:.1e}) at step {s}, vocab index {i}{argmax}")


@dataclass(frozen=True)
class StateBytes:
    """A workload's state as the floor and the cache cells count it (DESIGN §7), whatever
    wrote the workload: a preset's cache specs (`of_config`) or a model file's pairs at
    their pinned shapes (``harness.model_bytes``). ``rows``: each append pair's bytes per
    row (one token); ``whole``: each overwrite pair's bytes (a recurrent state, a conv
    window); ``new_rows``: rows an append pair gains a step; ``logits``: bytes of the
    logits a step reads back; ``feeds`` + ``feeds_per_row`` × capacity: bytes of the other
    inputs a page writes a step (a model's ``attention_mask`` is capacity + 1 long; a
    preset's ids are not told apart: 0)."""

    rows: tuple[int, ...]
    whole: tuple[int, ...]
    logits: int
    new_rows: int = 1
    feeds: int = 0
    feeds_per_row: int = 0

    @classmethod
    def of_config(cls, cfg: ModelConfig) -> StateBytes:
        specs = cache_specs(cfg, 1)  # capacity 1: an append spec is one row
        return cls(tuple(s.nbytes for s in specs if s.kind == "append"),
                   tuple(s.nbytes for s in specs if s.kind != "append"),
                   cfg.vocab * LOGITS_ITEMSIZE)

    def full(self, capacity: int) -> int:
        """Every state tensor at ``capacity`` rows: what a stateless page moves each way."""
        return sum(self.rows) * capacity + sum(self.whole)

    def valid(self, depth: int) -> int:
        """What a step at ``depth`` must read: the valid rows and every whole state."""
        return sum(self.rows) * depth + sum(self.whole)

    @property
    def written(self) -> int:
        """What a step must write: its new rows and every whole state."""
        return sum(self.rows) * self.new_rows + sum(self.whole)

    def appended(self, rows: int) -> int:
        """The append pairs at ``rows`` rows: a present a graph writes out whole."""
        return sum(self.rows) * rows

    def fed(self, capacity: int) -> int:
        """The inputs other than the state a step writes at ``capacity``."""
        return self.feeds + self.feeds_per_row * capacity

    def link_cache(self, h2d: float, d2h: float, capacity: int,
                   logits: int | None = None) -> tuple[float, float]:
        """The cache bytes of a step's host-link traffic, up and down: the counted bytes less
        the other inputs and the logits (``logits``: as the backend read them, where that is
        not the graph's type); what is left below the state one step writes is not cache
        (ids, a status word)."""
        up, down = h2d - self.fed(capacity), d2h - (self.logits if logits is None else logits)
        return (up if up >= self.written else 0.0), (down if down >= self.written else 0.0)

    def to_dict(self) -> dict:
        return {"row_bytes": list(self.rows), "whole_bytes": list(self.whole),
                "logits_bytes": self.logits, "new_rows": self.new_rows,
                "feeds_bytes": self.feeds, "feeds_bytes_per_row": self.feeds_per_row}

    @classmethod
    def from_dict(cls, d: dict) -> StateBytes:
        return cls(tuple(int(x) for x in d["row_bytes"]), tuple(int(x) for x in d["whole_bytes"]),
                   int(d["logits_bytes"]), int(d.get("new_rows", 1)), int(d.get("feeds_bytes", 0)),
                   int(d.get("feeds_bytes_per_row", 0)))


#: a logits element as a preset's backends return it
LOGITS_ITEMSIZE = 4


def state_bytes(state: ModelConfig | StateBytes) -> StateBytes:
    """``state`` as `StateBytes` (a preset's config is made one)."""
    return state if isinstance(state, StateBytes) else StateBytes.of_config(state)


def full_cache_bytes(cfg: ModelConfig | StateBytes, capacity: int) -> int:
    """Bytes of every cache tensor at capacity: what a stateless page uploads and downloads."""
    return state_bytes(cfg).full(capacity)


def written_state_bytes(cfg: ModelConfig | StateBytes) -> int:
    """Bytes a step must write into the state: one new K and V row per attention layer,
    the whole recurrent state per GDN layer."""
    return state_bytes(cfg).written


def floor_bytes(cfg: ModelConfig | StateBytes, weights_bytes: int, depth: int) -> int:
    """The fewest bytes a step at `depth` must move on the device (DESIGN §7)."""
    if isinstance(cfg, ModelConfig):
        return weights_bytes + valid_cache_bytes(cfg, depth) + written_state_bytes(cfg)
    return weights_bytes + cfg.valid(depth) + cfg.written


def _registered(backend: str) -> type | None:
    """The class registered as ``backend`` (None: a name no backend has, e.g. a test's double
    or a backend since removed, read from a results file)."""
    from backends.base import registry

    return registry().get(backend)


def is_stateless(backend: str, details: dict | None = None) -> bool:
    """Backends whose cache lives on the host and crosses the link both ways every step: the
    registered class says so (``Backend.host_cache``), or the point's details do."""
    return (bool(getattr(_registered(backend), "host_cache", False))
            or bool((details or {}).get("host_cache")))


def is_cpu(backend: str) -> bool:
    """Whether the backend registered as ``backend`` computes on the host's CPU
    (``Backend.on_cpu``)."""
    return bool(getattr(_registered(backend), "on_cpu", False))


def _gbps(cal: dict, name: str) -> float | None:
    """cal[name_gbps] when it is a positive finite number; None (no floor) otherwise: the
    calibration records a bandwidth it could not measure as None, with name_reason."""
    v = cal.get(f"{name}_gbps")
    return float(v) if isinstance(v, (int, float)) and np.isfinite(v) and v > 0 else None


def floor_ms(backend: str, cfg: ModelConfig | StateBytes, weights_bytes: int, depth: int, capacity: int,
             calibration: dict, details: dict | None = None) -> tuple[float | None, str]:
    """(floor in ms, "") or (None, why not) from the calibrated bandwidths (GB/s = bytes/ns)."""
    host = calibration.get("host") or {}
    gpu = calibration.get("wgpu") or {}
    if is_cpu(backend):
        bw, copy_bw = _gbps(host, "gemv") or _gbps(host, "copy"), _gbps(host, "copy")
        if not (bw and copy_bw):
            return None, host.get("copy_reason") or "no host memory bandwidth calibrated"
        ms = floor_bytes(cfg, weights_bytes, depth) / bw / 1e6
        if is_stateless(backend, details):
            ms += 2 * full_cache_bytes(cfg, capacity) / copy_bw / 1e6
        return ms, ""
    bw = _gbps(gpu, "stream")
    if not bw:
        return None, (gpu.get("stream_reason") or gpu.get("reason")
                      or "no device bandwidth calibrated")
    ms = floor_bytes(cfg, weights_bytes, depth) / bw / 1e6
    if is_stateless(backend, details):
        up, down = _gbps(gpu, "h2d"), _gbps(gpu, "d2h")
        if not (up and down):
            return None, (gpu.get("h2d_reason") or gpu.get("d2h_reason")
                          or "no host link bandwidth calibrated")
        cache = full_cache_bytes(cfg, capacity)
        ms += cache / up / 1e6 + cache / down / 1e6
    return ms, ""


def stateless_baseline(points: list[Point], backend: str | None = None) -> str | None:
    """The backend speedups and gate ratios are taken over, for `backend`.

    Its own family's stateless mode first (`<family>:stateless`, then `<family>:copy`: the same
    device and runtime, so the ratio isolates how the state is carried), else the first of
    STATELESS_BASELINES; only one with a matching measurement in `points` counts (a baseline
    that failed cannot anchor a ratio).
    """
    family = backend.split(":", 1)[0] if backend else None
    own = (f"{family}:stateless", f"{family}:copy") if family else ()
    for name in (*own, *STATELESS_BASELINES):
        if any(p.backend == name and p.matches for p in points):
            return name
    return None


def speedup(point: Point | None, base: Point | None) -> float | None:
    """base step time / point step time, only when both measured and both match.

    A point that does not match is never reported as faster (DESIGN §6).
    """
    if point is None or base is None or not (point.matches and base.matches):
        return None
    return base.step_ms.median / point.step_ms.median


def ratio(point: Point | None, base: Point | None) -> float | None:
    """point step time / base step time (the gate's same-run ratio), when both were measured."""
    if point is None or base is None or not (point.measured and base.measured):
        return None
    return point.step_ms.median / base.step_ms.median


def human_bytes(n: float | None, short: bool = False) -> str:
    """`3.0 MiB`, `512 B`; `short` gives `3.0M` and a bare `512`, for narrow table cells."""
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            break
        n /= 1024
    if unit == "B":
        return f"{n:.0f}" if short else f"{n:.0f} B"
    return f"{n:.1f}{unit[0]}" if short else f"{n:.1f} {unit}"


#: an SM clock median below this fraction of the highest the point saw means the timed steps
#: ran before the governor raised the clock, or after it dropped (FINDINGS 16)
CLOCK_LOW_FRACTION = 0.8


def low_clock(details: dict) -> str:
    """A note when the timed steps ran at a low SM clock (details["sm_clock_mhz"], recorded
    where nvidia-smi exists); "" otherwise."""
    c = details.get("sm_clock_mhz")
    if not isinstance(c, dict) or not c.get("peak_seen"):
        return ""
    if c["median"] >= CLOCK_LOW_FRACTION * c["peak_seen"]:
        return ""
    return (f"SM clock {c['median']:.0f} MHz during the timed steps, against {c['peak_seen']:.0f} "
            "MHz seen in this point: a GPU that was not fully clocked (or a page that leaves it "
            "idle)")


#: a step cannot beat the fewest bytes it must move at the measured bandwidth; an MBU above
#: this means the floor's calibration under-measured the device (or the link), not a fast step
MBU_PLAUSIBLE_MAX = 1.05


def calibration_problems(calibration: dict) -> list[str]:
    """Recorded bandwidths that cannot be true (files made before the calibration checked
    its own figures, e.g. a wall-clock slope lost in submit noise): floors and MBU computed
    from them are not evidence."""
    out = []
    for key, bound in WGPU_BOUNDS.items():
        value = calibration.get("wgpu", {}).get(f"{key}_gbps")
        if value is not None:
            ok, why = checked_gbps(value, bound)
            if ok is None:
                out.append(f"{key} {why}")
    return out


def gpu_mbu(p: Point) -> float | None:
    """The floor over the step's GPU time (timestamp queries), for backends whose cache stays
    on the device: how close the kernels come to the bandwidth floor, host time aside. None
    where there is no GPU time or no floor, and for host-cache backends (their floor counts
    the link, which the GPU time does not)."""
    if (p.status != "ok" or p.floor_ms is None or p.gpu_ms is None or p.gpu_ms.median <= 0
            or is_stateless(p.backend, p.details)):
        return None
    return p.floor_ms / p.gpu_ms.median


def plausible_mbu(mbu: float | None) -> float | None:
    """The MBU when it can be true, else None (reported as a calibration problem)."""
    return mbu if mbu is not None and 0 < mbu <= MBU_PLAUSIBLE_MAX else None
