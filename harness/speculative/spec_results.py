"""The end-to-end speculative results file, schema "statebench-spec/2" (docs/speculative.md,
"Results"): pure data, validated on load, written atomically after every group of points.

One point per (backend, K, acceptance, depth), its identity (`key`). statebench-spec/1 is
the per-layer simulation's file (`statebench speculative` without --backends), another
content, not an older version of this one: it is refused here with a line that says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.results import STATUSES, one_line, write_json_atomic
from model.errors import UserError

SCHEMA = "statebench-spec/2"
#: the fields every point has, whatever its status, and their types
POINT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "backend": str, "k": int, "acceptance": str, "depth": int, "capacity": int, "tokens": int,
    "status": str, "reason": str}
#: what a point's steps read back ("read"; a point without it, older, read logits): with
#: "ids" the logits check is not made and ``logits_match_plain`` is None
READS = ("logits", "ids")
#: the fields a measured point has besides those
MEASURED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "generated": int, "tokens_match_greedy": bool, "logits_match_plain": (bool, type(None)),
    "state_ok": bool, "state": dict,
    "verifies": int, "accepted_hist": dict, "ms_per_token": (int, float),
    "verify_ms": dict, "verify_over_plain": (int, float), "speedup": (int, float),
    "rollback": dict, "plain_step_ms": dict, "plain_ms_per_token": (int, float)}
_TOP = {"schema": str, "created": str, "command": str, "environment": dict, "workload": dict,
        "points": list}


class _Group(Protocol):
    backend: str
    depth: int
    capacity: int
    tokens: int


def key(p: dict) -> tuple[str, int, str, int]:
    return (p["backend"], int(p["k"]), str(p["acceptance"]), int(p["depth"]))


def _bare(req: _Group, k: int, acceptance: str, status: str, reason: str) -> dict:
    return {"backend": req.backend, "k": int(k), "acceptance": str(acceptance),
            "depth": int(req.depth), "capacity": int(req.capacity), "tokens": int(req.tokens),
            "status": status, "reason": one_line(reason)}


def point_unavailable(req: _Group, k: int, acceptance: str, reason: str) -> dict:
    return _bare(req, k, acceptance, "unavailable", reason)


def point_failed(req: _Group, k: int, acceptance: str, reason: str) -> dict:
    return _bare(req, k, acceptance, "failed", reason)


def finite(o: object) -> object:
    """``o`` with every non-finite float as None (JSON has no inf or nan)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o


@dataclass
class SpecResults:
    created: str
    command: str
    environment: dict
    workload: dict
    points: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "created": self.created, "command": self.command,
                "environment": self.environment, "workload": self.workload,
                "points": self.points}

    def record(self, point: dict) -> None:
        """Add ``point``, in place of an earlier one of its key."""
        for i, p in enumerate(self.points):
            if key(p) == key(point):
                self.points[i] = point
                return
        self.points.append(point)

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, finite(self.to_dict()))


def _check(d: dict, fields: dict, where: str) -> None:
    """Each of ``fields`` present and of its type (a bool is not a number; a number may be
    None: a non-finite figure, ``finite``)."""
    for name, kind in fields.items():
        if name not in d:
            raise UserError(f"{where}: no {name!r}")
        v, kinds = d[name], kind if isinstance(kind, tuple) else (kind,)
        numeric = bool not in kinds and (int in kinds or float in kinds)
        if numeric and v is None:
            continue
        if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds):
            raise UserError(f"{where}.{name}: {v!r} is not {' or '.join(k.__name__ for k in kinds)}")


def read_of(p: dict) -> str:
    """What a point's steps read back: "logits" or "ids" (older points: logits)."""
    return str(p.get("read", "logits"))


def _check_read(p: dict, where: str) -> None:
    """``read`` one of ``READS``, and the logits check not made (None) only where ids were
    read: a point that read logits passed or failed it."""
    if read_of(p) not in READS:
        raise UserError(f"{where}.read: {p['read']!r}; accepted: {', '.join(READS)}")
    if p["logits_match_plain"] is None and read_of(p) != "ids":
        raise UserError(f"{where}.logits_match_plain: None, but the point read logits")


def validate(d: object, source: str = "results") -> None:
    """UserError (one line, naming the field) unless ``d`` is a statebench-spec/2 file."""
    if not isinstance(d, dict):
        raise UserError(f"{source}: not a JSON object")
    schema = d.get("schema")
    if schema == "statebench-spec/1":
        raise UserError(f"{source}: a per-layer simulation file (statebench-spec/1), not an "
                        "end-to-end one (statebench-spec/2)")
    if schema != SCHEMA:
        raise UserError(f"{source}: schema is {schema!r}, expected {SCHEMA!r}")
    _check(d, _TOP, source)
    seen = set()
    for i, p in enumerate(d["points"]):
        where = f"{source}: points[{i}]"
        if not isinstance(p, dict):
            raise UserError(f"{where}: not an object")
        _check(p, POINT_FIELDS, where)
        if p["status"] not in STATUSES:
            raise UserError(f"{where}.status: {p['status']!r}; accepted: {', '.join(STATUSES)}")
        if p["status"] == "ok":
            _check(p, MEASURED_FIELDS, where)
            _check_read(p, where)
        if key(p) in seen:
            raise UserError(f"{where}: {key(p)} is in the file twice")
        seen.add(key(p))


def load(path: str | Path) -> SpecResults:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    validate(d, str(path))
    return SpecResults(d["created"], d["command"], d["environment"], d["workload"],
                       list(d["points"]))
