"""The results file (DESIGN §9): pure data, versioned, validated on load, written atomically.

Schema "statebench/1". A file holds one sweep: where it ran (`environment`), what it ran
(`workload`) and one `Point` per backend × context. Units are in the field names
(`step_ms`, `bytes_per_step`, `build_s`, `peak_rss_bytes`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from model.atomic import atomic_file
from model.errors import UserError

SCHEMA = "statebench/1"
STATUSES = ("ok", "unavailable", "failed")
BYTE_CATEGORIES = ("h2d", "d2h", "d2d", "kernel")


@dataclass(frozen=True)
class Stats:
    """Median and p10/p90 of per-step samples (milliseconds)."""

    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        import numpy as np

        a = np.asarray(samples, dtype=np.float64)
        return cls(float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90)))


@dataclass(frozen=True)
class Match:
    """Logits of every step against the float64 reference (DESIGN §6)."""

    ok: bool
    max_abs: float
    max_rel: float
    argmax_agree: float  # fraction of steps whose argmax equals the reference's


@dataclass
class Point:
    """One measurement: decode `steps` tokens at depth `context` with one backend."""

    backend: str
    context: int
    capacity: int
    steps: int
    status: str = "ok"
    reason: str = ""
    step_ms: Stats | None = None
    gpu_ms: Stats | None = None
    gpu_reason: str = ""
    build_s: float | None = None
    time_to_depth_s: float | None = None
    bytes_per_step: dict[str, float] | None = None
    cache_bytes: int | None = None
    weights_bytes: int | None = None
    floor_ms: float | None = None
    mbu: float | None = None
    peak_rss_bytes: int | None = None
    device_bytes: int | None = None
    match: Match | None = None
    details: dict = field(default_factory=dict)
    # optional (absent from files made before repeats existed; harness/repeats.py fills them):
    # per fresh worker process {"step_ms": [...], "gpu_ms": [...] | None, "wall_s", "build_s",
    # "time_to_depth_s"}; the median's interval (stats.Interval); the slowest step
    # {"ms", "repeat", "step"}; the transients [{"ms", "repeat", "step"}]
    repeats: list[dict] | None = None
    step_ms_ci: dict | None = None
    step_ms_max: dict | None = None
    transients: list[dict] | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.backend, self.context)

    @property
    def measured(self) -> bool:
        return self.status == "ok" and self.step_ms is not None

    @property
    def matches(self) -> bool:
        return self.measured and self.match is not None and self.match.ok

    @property
    def bytes_total(self) -> float | None:
        return None if self.bytes_per_step is None else float(sum(self.bytes_per_step.values()))

    @classmethod
    def unavailable(cls, backend: str, context: int, capacity: int, steps: int, reason: str) -> Point:
        return cls(backend, context, capacity, steps, status="unavailable", reason=reason)

    @classmethod
    def failed(cls, backend: str, context: int, capacity: int, steps: int, reason: str) -> Point:
        return cls(backend, context, capacity, steps, status="failed", reason=one_line(reason))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Point:
        d = dict(d)
        for k in ("step_ms", "gpu_ms"):
            if d.get(k) is not None:
                d[k] = Stats(**d[k])
        if d.get("match") is not None:
            d["match"] = Match(**d["match"])
        return cls(**d)


@dataclass
class Results:
    """A whole sweep."""

    created: str
    command: str
    environment: dict
    workload: dict
    points: list[Point] = field(default_factory=list)
    schema: str = SCHEMA

    def to_dict(self) -> dict:
        return {
            "schema": self.schema, "created": self.created, "command": self.command,
            "environment": self.environment, "workload": self.workload,
            "points": [p.to_dict() for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: dict, source: str = "results") -> Results:
        validate(d, source)
        return cls(created=d["created"], command=d["command"], environment=d["environment"],
                   workload=d["workload"], points=[Point.from_dict(p) for p in d["points"]],
                   schema=d["schema"])

    def point(self, backend: str, context: int) -> Point | None:
        for p in self.points:
            if p.key == (backend, context):
                return p
        return None

    @property
    def backends(self) -> list[str]:
        return list(dict.fromkeys(p.backend for p in self.points))

    @property
    def contexts(self) -> list[int]:
        return sorted({p.context for p in self.points})

    @property
    def label(self) -> str:
        """Workload and device, for titles."""
        w = self.workload
        dev = self.environment.get("wgpu", {}).get("adapter") or self.environment.get("cpu", "")
        return f"{w.get('preset', '?')} · {w.get('steps', '?')} steps · {dev}".strip(" ·")

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())


def one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write JSON through `atomic_file`: never half-written."""
    with atomic_file(path, "w") as f:
        json.dump(data, f, indent=1, allow_nan=False, default=_jsonable)
        f.write("\n")


def _jsonable(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# -- validation: a bad file is the user's error (one line, exit 2), never a traceback ---------

_REQUIRED_TOP = {"schema": str, "created": str, "command": str, "environment": dict,
                 "workload": dict, "points": list}
_POINT_FIELDS = {
    "backend": (str,), "context": (int,), "capacity": (int,), "steps": (int,), "status": (str,),
    "reason": (str,), "step_ms": (dict, type(None)), "gpu_ms": (dict, type(None)),
    "gpu_reason": (str,), "build_s": (float, int, type(None)),
    "time_to_depth_s": (float, int, type(None)), "bytes_per_step": (dict, type(None)),
    "cache_bytes": (int, type(None)), "weights_bytes": (int, type(None)),
    "floor_ms": (float, int, type(None)), "mbu": (float, int, type(None)),
    "peak_rss_bytes": (int, type(None)), "device_bytes": (int, type(None)),
    "match": (dict, type(None)), "details": (dict,),
}
#: point fields a file may lack (added after schema statebench/1 was first written)
_OPTIONAL_POINT_FIELDS = {
    "repeats": (list, type(None)), "step_ms_ci": (dict, type(None)),
    "step_ms_max": (dict, type(None)), "transients": (list, type(None)),
}


def validate(d: object, source: str = "results") -> None:
    def bad(msg: str) -> UserError:
        return UserError(f"{source}: not a statebench results file: {msg}")

    if not isinstance(d, dict):
        raise bad("top level is not an object")
    if d.get("schema") != SCHEMA:
        raise bad(f"schema is {d.get('schema')!r}, expected {SCHEMA!r}")
    for k, t in _REQUIRED_TOP.items():
        if not isinstance(d.get(k), t):
            raise bad(f"missing or wrong type: {k}")
    for i, p in enumerate(d["points"]):
        where = f"points[{i}]"
        if not isinstance(p, dict):
            raise bad(f"{where} is not an object")
        unknown = set(p) - set(_POINT_FIELDS) - set(_OPTIONAL_POINT_FIELDS)
        if unknown:
            raise bad(f"{where} has unknown field {sorted(unknown)[0]!r}")
        for k, types in {**_POINT_FIELDS, **_OPTIONAL_POINT_FIELDS}.items():
            if k not in p:
                if k in _OPTIONAL_POINT_FIELDS:
                    continue
                raise bad(f"{where} lacks {k!r}")
            v = p[k]
            if isinstance(v, bool) and bool not in types:
                raise bad(f"{where}.{k} has the wrong type")
            if not isinstance(v, types):
                raise bad(f"{where}.{k} has the wrong type")
            if isinstance(v, float) and not math.isfinite(v):
                raise bad(f"{where}.{k} is not finite")
        if p["status"] not in STATUSES:
            raise bad(f"{where}.status {p['status']!r} not one of {', '.join(STATUSES)}")
        for k in ("step_ms", "gpu_ms"):
            if p[k] is not None and set(p[k]) != {"median", "p10", "p90"}:
                raise bad(f"{where}.{k} must have median, p10, p90")
        if p["bytes_per_step"] is not None and set(p["bytes_per_step"]) != set(BYTE_CATEGORIES):
            raise bad(f"{where}.bytes_per_step must have {', '.join(BYTE_CATEGORIES)}")
        if p["match"] is not None and set(p["match"]) != {"ok", "max_abs", "max_rel", "argmax_agree"}:
            raise bad(f"{where}.match must have ok, max_abs, max_rel, argmax_agree")
        if p["status"] == "ok" and (p["step_ms"] is None or p["match"] is None):
            raise bad(f"{where} is ok but lacks step_ms or match")
        problem = _sample_fields_problem(p)
        if problem:
            raise bad(f"{where}.{problem}")


def _nonnegative(v: object) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0)


def _sample_fields_problem(p: dict) -> str:
    """What is wrong with a point's optional repeat fields ("" when nothing is)."""
    for i, r in enumerate(p.get("repeats") or []):
        if not isinstance(r, dict) or not isinstance(r.get("step_ms"), list):
            return f"repeats[{i}] lacks a step_ms list"
        for k in ("step_ms", "gpu_ms"):
            if r.get(k) is not None and not (isinstance(r[k], list)
                                             and all(_nonnegative(x) for x in r[k])):
                return f"repeats[{i}].{k} must be a list of finite numbers ≥ 0"
    ci = p.get("step_ms_ci")
    if ci is not None and not (all(_nonnegative(ci.get(k)) for k in ("low", "high", "coverage"))
                               and ci["low"] <= ci["high"] and isinstance(ci.get("method"), str)):
        return "step_ms_ci must have finite low ≤ high, coverage and method"
    for k, items in (("step_ms_max", [p.get("step_ms_max")]), ("transients", p.get("transients"))):
        for it in items or []:
            if it is not None and not (isinstance(it, dict) and _nonnegative(it.get("ms"))
                                       and all(isinstance(it.get(j), int) for j in ("repeat", "step"))):
                return f"{k} must have ms, repeat and step"
    return ""


def load(path: str | Path) -> Results:
    """Read and validate a results file; any problem is a UserError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no such results file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    return Results.from_dict(data, str(path))
