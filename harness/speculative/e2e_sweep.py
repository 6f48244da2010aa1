"""Sweep the end-to-end speculative points: backends × depths, every K and acceptance at
each (docs/speculative.md). The reference's state at each depth and its greedy tokens are
computed here once, handed to one worker process per backend and depth
(``e2e_point``) by file, and the results saved after every worker.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from backends.base import Backend
from harness import child
from harness.sources import NumpyReferenceWalk, PresetSource
from harness.speculative.acceptance import Acceptance
from harness.speculative.e2e_point import GroupRequest, measure_group
from harness.speculative.spec_results import SpecResults, point_failed, point_unavailable
from model.workload import Workload

#: the most tokens a K-token graph takes here (a verify's K; the issue's cells are 4 and 8)
MAX_K = 64
#: seconds one worker (a backend at one depth, every K and acceptance) may take
WORKER_TIMEOUT_S = 3600.0


@dataclass
class SpecConfig:
    preset: str
    backends: list[str]
    ks: list[int]
    acceptances: list[Acceptance]
    contexts: list[int]
    tokens: int = 32
    warmup: int = 2
    warm_s: float = 0.0
    seed: int = 0
    inprocess: bool = False
    timeout_s: float = WORKER_TIMEOUT_S
    command: str = ""
    #: the pages' KernelOptions as data (``as_dict``), None: their defaults
    options: dict | None = None

    @property
    def greedy_tokens(self) -> int:
        return self.tokens + max(self.ks) - 1

    def capacity_for(self, depth: int) -> int:
        """Rows a point may write: the depth, the tokens generated past n by the last
        verify and the rows its dropped drafts write (K-1 past the kept)."""
        return depth + self.greedy_tokens

    def labels(self) -> list[str]:
        return [a.label for a in self.acceptances]


def depth_arrays(walk: NumpyReferenceWalk, depth: int, capacity: int, greedy: int) -> dict:
    """A depth file's arrays: ``tokens`` (the depth's and the first one fed),
    ``cache:<past>`` (the state at depth) and ``ref_greedy`` (the reference's ``greedy``
    tokens after the prompt); the walk left at ``depth``."""
    arrays = walk.arrays_at(depth, capacity, 1)
    arrays.pop("ref_logits")
    ref = walk.ref
    saved, x, out = ref.save(), int(arrays["tokens"][depth]), []
    for _ in range(greedy):
        x = int(np.argmax(ref.step(x)))
        out.append(x)
    ref.restore(saved)
    arrays["ref_greedy"] = np.asarray(out, np.int64)
    return arrays


def header(cfg: SpecConfig, workload: Workload, environment: dict) -> SpecResults:
    c = workload.config
    return SpecResults(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        command=cfg.command or "statebench speculative", environment=environment,
        workload={"preset": c.name, "dtype": c.dtype, "config": c.describe(), "seed": cfg.seed,
                  "tokens": cfg.tokens, "k": cfg.ks, "acceptance": cfg.labels(),
                  "contexts": cfg.contexts, "warmup": cfg.warmup, "warm_s": cfg.warm_s})


def run_worker(req: GroupRequest, timeout_s: float) -> list[dict]:
    """``python -m harness.speculative.e2e_point`` for one group; a crash or a hang fails
    its points with the reason."""
    try:
        proc = child.run_module("harness.speculative.e2e_point", req.to_json(), timeout_s)
    except subprocess.TimeoutExpired:
        return [point_failed(req, k, a, f"worker timed out after {timeout_s:.0f} s")
                for k, a in req.keys()]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode == 0 and lines:
        try:
            points = json.loads(lines[-1])
            if isinstance(points, list):
                return points
        except ValueError:
            pass
    why = child.exit_reason("worker", proc)
    return [point_failed(req, k, a, why) for k, a in req.keys()]


@dataclass
class Sweep:
    """What the sweep needs besides its settings: the classes by name, the adapter probe's
    refusals, the workload (a preset's, or a test's own), where results go."""

    classes: dict[str, type[Backend]]
    refusals: dict[str, str] = field(default_factory=dict)
    workload: Workload | None = None
    out: Path | None = None
    on_group: Callable[[str, int, list[dict]], None] | None = None


def run(cfg: SpecConfig, sweep: Sweep, results: SpecResults) -> SpecResults:
    """Every point, depths ascending; ``results`` saved to ``sweep.out`` after each group.
    A test's workload (``sweep.workload``) runs in this process only."""
    source = PresetSource(cfg.preset, cfg.seed)
    workload = sweep.workload or source.workload()
    contexts = sorted(cfg.contexts)
    walk = NumpyReferenceWalk(workload.config, workload.weights, cfg.seed, max(contexts) + 1,
                              cfg.capacity_for(max(contexts)))
    with tempfile.TemporaryDirectory(prefix="statebench-spec-") as tmp:
        for depth in contexts:
            cap = cfg.capacity_for(depth)
            path = Path(tmp) / f"depth-{depth}.npz"
            np.savez(path, **depth_arrays(walk, depth, cap, cfg.greedy_tokens))
            for name, cls in sweep.classes.items():
                req = GroupRequest(backend=name, preset=cfg.preset, depth=depth, capacity=cap,
                                   tokens=cfg.tokens, ks=cfg.ks, acceptances=cfg.labels(),
                                   depth_file=str(path), seed=cfg.seed, warmup=cfg.warmup,
                                   warm_s=cfg.warm_s, options=cfg.options)
                refused = sweep.refusals.get(name, "")
                if refused:
                    points = [point_unavailable(req, k, a, refused) for k, a in req.keys()]
                elif cfg.inprocess or sweep.workload is not None:
                    points = measure_group(req, sweep.workload, cls)
                else:
                    points = run_worker(req, cfg.timeout_s)
                for p in points:
                    results.record(p)
                if sweep.out is not None:
                    results.save(sweep.out)
                if sweep.on_group:
                    sweep.on_group(name, depth, points)
            path.unlink(missing_ok=True)
    return results
