"""One sweep from several results files of the same workload and code.

A GPU call is limited to ten minutes, so a recorded sweep is often split over calls (one
file for 16384, one for 512 and 2048, ...). Side by side, such files make one column per
file and backend; merged, they read as the one sweep they are. Every point keeps the
floor and MBU it was given against its own call's calibration, and the merged file lists
each part's file, command and calibration.

A point (backend, context: `Point.key`) in two parts is refused, not kept once: which copy is
the right one is not the merge's to guess (a part holding one twice is refused as it loads).
"""

from __future__ import annotations

from harness import metrics
from harness.results import Results
from model.errors import UserError

#: what must agree for files to be one sweep
WORKLOAD_KEYS = ("preset", "seed", "dtype", "steps", "warmup", "warm_s")


def merge(parts: list[Results], names: list[str]) -> Results:
    """The points of `parts` (named `names` in messages) as one Results; UserError where
    they are not one workload on one code and adapter, repeat a point, or one's calibration
    is implausible."""
    first, base = parts[0], names[0]
    seen: dict[tuple[str, int], str] = {}
    for r, name in zip(parts, names, strict=True):
        for key in WORKLOAD_KEYS:
            if r.workload.get(key) != first.workload.get(key):
                raise UserError(f"cannot merge {name}: its {key} is {r.workload.get(key)!r} "
                                f"where {base} has {first.workload.get(key)!r}")
        for what, get in (("sources", lambda e: e.get("source_digest")),
                          ("adapter", lambda e: e.get("wgpu", {}).get("adapter"))):
            if get(r.environment) != get(first.environment):
                raise UserError(f"cannot merge {name}: its {what} ({get(r.environment)}) "
                                f"differ from {base}'s ({get(first.environment)})")
        bad = metrics.calibration_problems(r.environment.get("calibration", {}))
        if bad:
            raise UserError(f"cannot merge {name}: its calibration is implausible "
                            f"({'; '.join(bad)})")
        for p in r.points:
            if p.key in seen:
                raise UserError(f"cannot merge {name}: {p.backend} at {p.context} is also in "
                                f"{seen[p.key]}")
            seen[p.key] = name
    env = dict(first.environment)
    env["merged_from"] = [{"file": name, "created": r.created, "command": r.command,
                           "calibration": r.environment.get("calibration", {})}
                          for r, name in zip(parts, names, strict=True)]
    points = [p for r in parts for p in r.points]
    order = {b: i for i, b in enumerate(dict.fromkeys(p.backend for p in points))}
    points.sort(key=lambda p: (p.context, order[p.backend]))
    return Results(created=min(r.created for r in parts),
                   command=" + ".join(r.command for r in parts), environment=env,
                   workload=dict(first.workload, contexts=sorted({p.context for p in points})),
                   points=points)
