"""The runner↔worker wire: one `WorkerRequest` in on stdin, one `WorkerReply` out as the
last line of stdout, each one JSON message (as pyperf's worker sends its run back).

Both carry the cache files their sender found whole (``checksum.whole_files``), so neither
the runner nor the next point's worker hashes a multi-GB ``weights.bin`` again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from harness.results import Point
from harness.sources import WorkloadSource, from_wire


@dataclass(frozen=True)
class WorkerRequest:
    """One backend × context point to measure (DESIGN §5, §7)."""

    backend: str
    source: WorkloadSource
    context: int
    capacity: int
    steps: int
    warmup: int
    #: the runner's .npz of this depth: ``tokens`` (context + warmup + steps), ``ref_logits``
    #: (warmup + steps, vocab) and ``cache:<past name>`` (the reference's state at depth
    #: ``context``: a preset's cut to capacity, a model's each cache's valid rows)
    depth_file: str
    #: seconds of GPU load before the warm-up steps (``heater.heat``)
    warm_s: float = 0.0
    #: the backend's options record as data (``Backend.options_type``: ``KernelOptions``'s
    #: ``as_dict``), None for its defaults
    options: dict | None = None
    #: "module:Class" of a backend outside the registry (tests' doubles), imported by path
    backend_path: str | None = None
    #: a pipe the runner holds open while it lives (``worker.exit_with_parent``)
    parent_fd: int | None = None
    #: the cache files the runner found whole (``checksum.whole_files``)
    whole_files: list = field(default_factory=list)

    def to_json(self) -> str:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["source"] = self.source.to_wire()
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> WorkerRequest:
        d = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown request fields {', '.join(unknown)}")
        return cls(**{**d, "source": from_wire(d["source"])})


@dataclass(frozen=True)
class WorkerReply:
    """What a worker measured, and the cache files it found whole."""

    point: Point
    whole_files: list = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"point": self.point.to_dict(), "whole_files": self.whole_files},
                          allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> WorkerReply:
        d = json.loads(text)
        return cls(Point.from_dict(d["point"]), list(d.get("whole_files") or []))
