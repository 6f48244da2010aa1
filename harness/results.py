"""The results file (DESIGN §9): pure data, versioned, validated on load, written atomically.

Schema "statebench/2" (docs/results.md). A file holds one sweep: where it ran
(`environment`), what it ran (`workload`) and one `Point` per backend × context, each
once: (backend, context) is a point's identity (`Point.key`). Units are in the field names
(`step_ms`, `bytes_per_step`, `build_s`, `peak_rss_bytes`); the keys of a point's `details`
are registered in harness/details.py. Files of an older schema are upgraded in memory as
they load (`UPGRADES`, as pyperf does), never rewritten.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

from harness import details as details_registry
from model.atomic import atomic_file
from model.errors import UserError

SCHEMA = "statebench/2"
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
    #: the relative tolerance it was held to (metrics.logits_tolerance; None in results
    #: recorded before it was written: 1e-3, float32 activations)
    tolerance: float | None = None


class FrozenDetails(dict):
    """A point's details, read-only: a Point is pure data (a changed one is a new Point,
    `dataclasses.replace(point, details={**point.details, key: value})`). A dict still, so
    JSON, `dict(...)` and `.get` read it as one; the values themselves are not frozen."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("a point's details are read-only; make a new point with "
                        "dataclasses.replace(point, details={...})")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __copy__(self) -> FrozenDetails:
        return self

    def __deepcopy__(self, memo: dict) -> FrozenDetails:
        return FrozenDetails(copy.deepcopy(dict(self), memo))

    def __reduce__(self):
        return FrozenDetails, (dict(self),)


@dataclass(frozen=True)
class Point:
    """One measurement: decode `steps` tokens at depth `context` with one backend.

    Frozen: code that changes a point makes a new one (`dataclasses.replace`). Its details
    are checked against harness/details.py as it is made: an unregistered key is a bug."""

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
    details: Mapping[str, object] = field(default_factory=FrozenDetails)
    # filled by harness/repeats.py (null in schema-1 files made before repeats existed):
    # per fresh worker process {"step_ms": [...], "gpu_ms": [...] | None, "wall_s", "build_s",
    # "time_to_depth_s"}; the median's interval (stats.Interval); the slowest step
    # {"ms", "repeat", "step"}; the transients [{"ms", "repeat", "step"}]
    repeats: list[dict] | None = None
    step_ms_ci: dict | None = None
    step_ms_max: dict | None = None
    transients: list[dict] | None = None

    def __post_init__(self) -> None:
        details_registry.check(self.details, f"{self.backend} @ {self.context}")
        if not isinstance(self.details, FrozenDetails):
            object.__setattr__(self, "details", FrozenDetails(self.details))

    @property
    def key(self) -> tuple[str, int]:
        """The point's identity in a file: one backend at one context (docs/results.md)."""
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
        return {f.name: _plain_copy(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> Point:
        d = dict(d)
        for k in ("step_ms", "gpu_ms"):
            if d.get(k) is not None:
                d[k] = Stats(**d[k])
        if d.get("match") is not None:
            d["match"] = Match(**d["match"])
        return cls(**d)


def _plain_copy(v: object) -> object:
    """A field as plain JSON-ready data, sharing nothing with the point."""
    if is_dataclass(v):
        return asdict(v)
    return copy.deepcopy(dict(v) if isinstance(v, FrozenDetails) else v)


@dataclass
class Results:
    """A whole sweep."""

    created: str
    command: str
    environment: dict
    workload: dict
    points: list[Point] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "created": self.created, "command": self.command,
            "environment": self.environment, "workload": self.workload,
            "points": [p.to_dict() for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: dict, source: str = "results") -> Results:
        """A validated file's sweep, upgraded to the current schema where it is older."""
        d = upgrade(d, source)
        return cls(created=d["created"], command=d["command"], environment=d["environment"],
                   workload=d["workload"], points=[Point.from_dict(p) for p in d["points"]])

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
        model = w.get("model")
        what = Path(model["path"]).name if isinstance(model, dict) and "path" in model else (
            w.get("preset") or "?")
        return f"{what} · {w.get('steps', '?')} steps · {dev}".strip(" ·")

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())


class ResultsFile:
    """Where one sweep's results go, so that no run loses or replaces points unsaid.

    `check` refuses, before any work, a path that cannot be written or that holds a file
    this run did not make (unless `force`). Nothing is written before the first point: the
    first save creates the file and fails if one appeared meanwhile (a `force`d run
    replaces the old file then, not before). A save that fails raises a UserError naming
    the file and the points kept, after trying to keep them all in the temporary directory.
    """

    def __init__(self, path: str | Path, force: bool = False, make_parent: bool = False) -> None:
        self.path = Path(path)
        self.force = force
        self.make_parent = make_parent  # a default name's `results/` is made; a given one's not
        self.saved = 0  # points in the file this run wrote (0: it wrote none)

    def check(self) -> None:
        parent = self.path.parent
        if self.make_parent and not parent.exists():
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"cannot make {parent} for the results: "
                                f"{exc.strerror or exc}") from None
        check_out_file(self.path, self.force)

    def save(self, results: Results) -> None:
        """Write all of `results`; the first write never replaces a file unless `force`."""
        first = self.saved == 0 and not self.force
        try:
            write_json_atomic(self.path, results.to_dict(), replace=not first)
        except FileExistsError as exc:
            if not first:
                raise UserError(self._lost(results, exc)) from None
            raise UserError(f"{self.path} appeared while this run measured its first point; "
                            "it is left as it is and nothing was saved (pass --force to "
                            "replace it)") from None
        except (OSError, TypeError, ValueError) as exc:
            raise UserError(self._lost(results, exc)) from None
        self.saved = len(results.points)

    def _lost(self, results: Results, exc: Exception) -> str:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc, 120)
        kept = (f"{_points(self.saved)} {'is' if self.saved == 1 else 'are'} kept in "
                f"{self.path}" if self.saved else "no point was saved there")
        msg = f"cannot save results to {self.path} ({why}); the sweep stopped: {kept}"
        rescue = _rescue(self.path, results)
        if rescue:
            return f"{msg}; all {_points(len(results.points))} are in {rescue}"
        return msg + (f", the last {len(results.points) - self.saved} lost"
                      if len(results.points) > self.saved else "")

    def interrupted(self, how: str = "interrupted") -> str:
        """The line an interrupted sweep ends with: what was kept and where."""
        if self.saved:
            return (f"{how}; the {_points(self.saved)} measured so far "
                    f"{'is' if self.saved == 1 else 'are'} in {self.path}")
        if self.path.exists():
            return f"{how} before any point was saved; {self.path} is as it was"
        return f"{how} before any point was saved; no results file was written"


def check_out_file(path: str | Path, force: bool = False) -> Path:
    """Refuse an --out that cannot take the file, before anything is measured: a folder, a
    folder that does not exist or where no file can be made, or an existing file (unless
    `force`)."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; name a file")
    folder = out.parent
    if not folder.is_dir():
        raise UserError(f"--out {out}: the folder {folder} does not exist" if not folder.exists()
                        else f"--out {out}: {folder} is a file, not a folder")
    if (out.exists() or out.is_symlink()) and not force:
        raise UserError(f"--out {out}: the file exists; pass --force to replace it")
    check_writable(folder, out)
    return out


def check_writable(folder: Path, out: str | Path) -> None:
    """UserError naming `out` where no file can be made in `folder`: the probe (make and
    remove a file, as an atomic save does) holds for root, ACLs and read-only mounts alike."""
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write in {folder}: {exc.strerror or exc}") from None


def _points(n: int) -> str:
    return f"{n} point{'' if n == 1 else 's'}"


def _rescue(path: Path, results: Results) -> Path | None:
    """Where all of `results` were written when `path` could not take them, or None."""
    try:
        fd, name = tempfile.mkstemp(prefix=f"{path.stem}-rescued-", suffix=".json")
        os.close(fd)
    except OSError:
        return None
    try:
        write_json_atomic(name, results.to_dict())
    except (OSError, TypeError, ValueError):
        Path(name).unlink(missing_ok=True)
        return None
    return Path(name)


def one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def write_json_atomic(path: str | Path, data: dict, replace: bool = True) -> None:
    """Write JSON through `atomic_file`: never half-written; with `replace` False, an
    existing `path` is left alone (FileExistsError)."""
    with atomic_file(path, "w", replace=replace) as f:
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
#: point fields a statebench/1 file may lack (added after it was first written, with no new
#: schema then); statebench/2 files have them all, null where a point has none
_OPTIONAL_POINT_FIELDS = {
    "repeats": (list, type(None)), "step_ms_ci": (dict, type(None)),
    "step_ms_max": (dict, type(None)), "transients": (list, type(None)),
}


#: numbers of a point (and of its nested figures) that must be ≥ 0; step times must be > 0
_NON_NEGATIVE = ("context", "capacity", "steps", "build_s", "time_to_depth_s", "cache_bytes",
                 "weights_bytes", "floor_ms", "mbu", "peak_rss_bytes", "device_bytes")
_STATS = ("median", "p10", "p90")
_MATCH = {"ok": (bool,), "max_abs": (float, int), "max_rel": (float, int),
          "argmax_agree": (float, int)}
#: the workload's figures (each optional: older files lack some) -> accepted types
_WORKLOAD_FIELDS = {"preset": (str,), "seed": (int,), "dtype": (str,), "config": (dict,),
                    "steps": (int,), "warmup": (int,), "warm_s": (float, int),
                    "contexts": (list,), "capacity": (int, type(None)), "repeat": (int,),
                    "model": (dict,)}


class _Bad(Exception):
    """A field that cannot be right: its path and why (`validate` adds the file's name)."""


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _nonfinite(v: object, where: str) -> str | None:
    """The path of the first NaN or infinity anywhere in `v` (the writer never writes one)."""
    if isinstance(v, float) and not math.isfinite(v):
        return where
    if isinstance(v, dict):
        items = ((f"{where}.{k}", x) for k, x in v.items())
    elif isinstance(v, list):
        items = ((f"{where}[{i}]", x) for i, x in enumerate(v))
    else:
        return None
    for w, x in items:
        found = _nonfinite(x, w)
        if found:
            return found
    return None


def _figure(v: object, where: str, *, positive: bool = False) -> None:
    """`v` must be a number ≥ 0 (> 0 when `positive`); finiteness is checked file-wide."""
    if not _is_number(v):
        raise _Bad(f"{where} is {v!r}, not a number")
    if v < 0 or (positive and v == 0):
        raise _Bad(f"{where} is {v!r}; it must be {'> 0' if positive else '≥ 0'}")


def _check_workload(w: dict) -> None:
    for k, types in _WORKLOAD_FIELDS.items():
        v = w.get(k)
        if k in w and (not isinstance(v, types) or isinstance(v, bool)):
            raise _Bad(f"workload.{k} is {v!r}, of the wrong type")
        if k in ("steps", "warmup", "warm_s", "capacity", "repeat") and v is not None:
            _figure(v, f"workload.{k}", positive=k in ("capacity", "repeat"))
    for i, c in enumerate(w.get("contexts") or []):
        if not isinstance(c, int) or isinstance(c, bool) or c <= 0:
            raise _Bad(f"workload.contexts[{i}] is {c!r}, not a positive integer")


def _check_point(p: object, where: str, current: bool = True) -> None:
    """`current`: a statebench/2 point, which has every field (a statebench/1 point may lack
    the optional ones)."""
    if not isinstance(p, dict):
        raise _Bad(f"{where} is not an object")
    unknown = set(p) - set(_POINT_FIELDS) - set(_OPTIONAL_POINT_FIELDS)
    if unknown:
        raise _Bad(f"{where} has unknown field {sorted(unknown)[0]!r}")
    required = {**_POINT_FIELDS, **_OPTIONAL_POINT_FIELDS} if current else _POINT_FIELDS
    for k, types in required.items():
        if k not in p:
            raise _Bad(f"{where} lacks {k!r}")
        v = p[k]
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            raise _Bad(f"{where}.{k} has the wrong type")
        if k in _NON_NEGATIVE and v is not None:
            _figure(v, f"{where}.{k}")
    if p["status"] not in STATUSES:
        raise _Bad(f"{where}.status {p['status']!r} not one of {', '.join(STATUSES)}")
    for k in ("step_ms", "gpu_ms"):
        if p[k] is not None and set(p[k]) != set(_STATS):
            raise _Bad(f"{where}.{k} must have median, p10, p90")
        for s in _STATS if p[k] is not None else ():
            # a step takes time: a zero step time would divide the gate's ratios by zero
            _figure(p[k][s], f"{where}.{k}.{s}", positive=k == "step_ms")
    if p["bytes_per_step"] is not None:
        if set(p["bytes_per_step"]) != set(BYTE_CATEGORIES):
            raise _Bad(f"{where}.bytes_per_step must have {', '.join(BYTE_CATEGORIES)}")
        for k in BYTE_CATEGORIES:
            _figure(p["bytes_per_step"][k], f"{where}.bytes_per_step.{k}")
    bad_details = details_registry.problem(p["details"])
    if bad_details:
        raise _Bad(f"{where}.details {bad_details}")
    if p["match"] is not None:
        if current and "tolerance" not in p["match"]:
            raise _Bad(f"{where}.match lacks 'tolerance'")
        if set(p["match"]) - {"tolerance"} != set(_MATCH):
            raise _Bad(f"{where}.match must have ok, max_abs, max_rel, argmax_agree "
                       "(and a tolerance)")
        tol = p["match"].get("tolerance")
        if tol is not None and not (_is_number(tol) and 0 < tol < 1):
            raise _Bad(f"{where}.match.tolerance is {tol!r}, not a fraction in (0, 1)")
        for k, types in _MATCH.items():
            v = p["match"][k]
            if bool in types and not isinstance(v, bool):
                raise _Bad(f"{where}.match.{k} is {v!r}, not true or false")
            if bool not in types:
                _figure(v, f"{where}.match.{k}")
        if p["match"]["argmax_agree"] > 1:
            raise _Bad(f"{where}.match.argmax_agree is {p['match']['argmax_agree']!r}; "
                       "it is a fraction (≤ 1)")
    if p["status"] == "ok" and (p["step_ms"] is None or p["match"] is None):
        raise _Bad(f"{where} is ok but lacks step_ms or match")
    _check_repeat_fields(p, where)


def _check_repeat_fields(p: dict, where: str) -> None:
    """The optional fields --repeat added: steps per process, the interval, the slowest step
    and the transients (absent from older files)."""
    _check_fields(p, _OPTIONAL_POINT_FIELDS, where)
    for i, r in enumerate(p.get("repeats") or []):
        if not isinstance(r, dict) or not isinstance(r.get("step_ms"), list):
            raise _Bad(f"{where}.repeats[{i}] lacks a step_ms list")
        for k in ("step_ms", "gpu_ms"):
            if r.get(k) is not None and not isinstance(r[k], list):
                raise _Bad(f"{where}.repeats[{i}].{k} is not a list")
            for j, x in enumerate(r.get(k) or []):
                _figure(x, f"{where}.repeats[{i}].{k}[{j}]", positive=k == "step_ms")
    ci = p.get("step_ms_ci")
    if ci is not None:
        for k in ("low", "high", "coverage"):
            _figure(ci.get(k), f"{where}.step_ms_ci.{k}")
        if ci["low"] > ci["high"] or not isinstance(ci.get("method"), str):
            raise _Bad(f"{where}.step_ms_ci must have low ≤ high and a method")
    steps = [("step_ms_max", p.get("step_ms_max"))] if p.get("step_ms_max") is not None else []
    steps += [(f"transients[{i}]", t) for i, t in enumerate(p.get("transients") or [])]
    for name, t in steps:
        if not (isinstance(t, dict) and all(isinstance(t.get(j), int) and not isinstance(t.get(j), bool)
                                            for j in ("repeat", "step"))):
            raise _Bad(f"{where}.{name} must have ms, repeat and step")
        _figure(t.get("ms"), f"{where}.{name}.ms")


def validate(d: object, source: str = "results") -> None:
    """A UserError naming `source` and the first field that cannot be right, if any, or the
    first point that is in the file twice. A file of an older schema in `UPGRADES` is
    checked by its own schema's rules."""
    try:
        if not isinstance(d, dict):
            raise _Bad("top level is not an object")
        schema = d.get("schema")
        if schema != SCHEMA and schema not in UPGRADES:
            raise _Bad(f"schema is {schema!r}, expected {SCHEMA!r} (or one this code upgrades: "
                       f"{', '.join(UPGRADES)})")
        for k, t in _REQUIRED_TOP.items():
            if not isinstance(d.get(k), t):
                raise _Bad(f"missing or wrong type: {k}")
        where = _nonfinite(d, "")
        if where:
            raise _Bad(f"{where.lstrip('.')} is not finite")
        _check_workload(d["workload"])
        _check_config(d["workload"].get("config", {}))
        _check_environment(d["environment"])
        for i, p in enumerate(d["points"]):
            _check_point(p, f"points[{i}]", current=schema == SCHEMA)
    except _Bad as exc:
        raise UserError(f"{source}: not a statebench results file: {exc}") from None
    twice = duplicate(d["points"])
    if twice:
        (backend, context), first, again = twice
        raise UserError(f"{source}: {backend} at context {context} is in the file twice "
                        f"(points[{first}] and points[{again}]); a results file holds each "
                        "backend × context once: remove one, or measure the sweep again")


def duplicate(points: list) -> tuple[tuple[str, int], int, int] | None:
    """The first point identity (`Point.key`: backend, context) held twice in `points`
    (dicts or Points), with the indices of its two copies; None where each is there once."""
    seen: dict[tuple[str, int], int] = {}
    for i, p in enumerate(points):
        key = p.key if isinstance(p, Point) else (p["backend"], p["context"])
        if key in seen:
            return key, seen[key], i
        seen[key] = i
    return None


# -- older schemas, upgraded in memory as they load ------------------------------------------

def _from_1(d: dict) -> dict:
    """statebench/1 → 2: the fields added to /1 after it was first written (the repeats'
    four, the match's tolerance) become present, null where the file lacks them; the
    details keys were all registered from /1's writers, so they stay as they are."""
    points = []
    for p in d["points"]:
        p = {**p, **{k: p.get(k) for k in _OPTIONAL_POINT_FIELDS}}
        if p["match"] is not None:
            p["match"] = {"tolerance": None, **p["match"]}
        points.append(p)
    return {**d, "schema": "statebench/2", "points": points}


#: schema → (the next schema, how a file of it becomes one of that); applied in turn
UPGRADES: dict[str, tuple[str, Callable[[dict], dict]]] = {"statebench/1": ("statebench/2", _from_1)}


def upgrade(d: object, source: str = "results") -> dict:
    """`d` validated under its own schema, then upgraded step by step to SCHEMA (a new
    dict: `d` is left as it was); a UserError naming `source` where it cannot be read."""
    validate(d, source)
    while d["schema"] != SCHEMA:
        _, step = UPGRADES[d["schema"]]
        d = step(d)
    return d


_NONE = type(None)
#: the environment's parts that reports read, and their types; any may be absent (files made
#: before it was recorded), none may be of another type
_ENVIRONMENT_FIELDS = {
    "python": (str, _NONE), "platform": (str, _NONE), "cpu": (str, _NONE),
    "cpu_count": (int, _NONE), "packages": (dict,), "ort_ep_devices": (list,),
    "git_commit": (str, _NONE), "source_digest": (str, _NONE), "calibration": (dict,),
    "wgpu": (dict,), "merged_from": (list,),
}
_PART_FIELDS = {"file": (str,), "created": (str,), "command": (str,), "calibration": (dict,)}


def _check_fields(d: dict, fields: dict, where: str, required: bool = False) -> None:
    for k, types in fields.items():
        if k not in d:
            if required:
                raise _Bad(f"{where} lacks {k!r}")
            continue
        if isinstance(d[k], bool) or not isinstance(d[k], types):
            raise _Bad(f"{where}.{k} has the wrong type")


#: the model shapes a report reads from `workload.config` (ModelConfig.describe)
_CONFIG_FIELDS = {
    "name": (str,), "layers": (list,), "dtype": (str,), "weights": (str,), "kv_cache": (str,),
    "rope_theta": (int, float), "rms_eps": (int, float),
    **{k: (int,) for k in ("hidden", "ffn", "vocab", "q_heads", "kv_heads", "head_dim",
                           "gdn_qk_heads", "gdn_v_heads", "gdn_qk_dim", "gdn_v_dim",
                           "parameters")},
}


def _check_config(cfg: dict) -> None:
    _check_fields(cfg, _CONFIG_FIELDS, "workload.config")
    for i, kind in enumerate(cfg.get("layers", [])):
        if not isinstance(kind, str):
            raise _Bad(f"workload.config.layers[{i}] is {kind!r}, not a layer kind")


def _check_environment(env: dict) -> None:
    """The `environment` block has the shape `calibrate.environment` writes, so a report
    never trips on it (finiteness is checked file-wide)."""
    _check_fields(env, _ENVIRONMENT_FIELDS, "environment")
    for k, v in env.get("packages", {}).items():
        if not isinstance(v, (str, _NONE)):
            raise _Bad(f"environment.packages.{k} has the wrong type")
    _check_fields(env.get("wgpu", {}), {"adapter": (str, _NONE), "reason": (str,)},
                  "environment.wgpu")
    calibrations = [("environment.calibration", env.get("calibration", {}))]
    for i, part in enumerate(env.get("merged_from", [])):
        where = f"environment.merged_from[{i}]"
        if not isinstance(part, dict):
            raise _Bad(f"{where} is not an object")
        _check_fields(part, _PART_FIELDS, where, required=True)
        calibrations.append((f"{where}.calibration", part["calibration"]))
    for where, cal in calibrations:
        for side in ("host", "wgpu"):
            figures = cal.get(side, {})
            if not isinstance(figures, dict):
                raise _Bad(f"{where}.{side} is not an object")
            for k, v in figures.items():
                if k.endswith("_gbps") and not (_is_number(v) or v is None):
                    raise _Bad(f"{where}.{side}.{k} is not a number")


def load(path: str | Path) -> Results:
    """Read and validate a results file; any problem is a UserError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such results file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a results file (not UTF-8 text: byte {exc.object[exc.start]:#04x}"
                        f" at offset {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # a 5000-digit number, nesting 10⁵ deep
        raise UserError(f"{path}: not a statebench results file: {one_line(exc, 120)}") from None
    return Results.from_dict(data, str(path))
