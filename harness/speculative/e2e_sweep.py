"""Sweep the end-to-end speculative points: backends × depths, every K and acceptance at
each (docs/speculative.md). The reference's state at each depth and its greedy tokens are
computed here once, handed to one worker process per backend and depth
(``e2e_point``) by file, and the results saved after every point the worker sends.
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
from harness.sources import NumpyReferenceWalk, ReferenceWalk, WorkloadSource, source_for
from harness.speculative.acceptance import Acceptance
from harness.speculative.e2e_point import PROGRESS_PREFIX, Emit, GroupRequest, measure_group
from harness.speculative.spec_results import SpecResults, point_unavailable
from model.workload import Workload

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
    #: a model file in place of the preset (``--model``): its K-token graphs, ORT's CPU EP
    #: its reference; ``preset`` is then only a label
    model: str | None = None
    #: what every step reads back (``--read``, ``e2e_point.READS``): logits, or the pages'
    #: argmax ids
    read: str = "logits"

    @property
    def greedy_tokens(self) -> int:
        return self.tokens + max(self.ks) - 1

    def capacity_for(self, depth: int) -> int:
        """Rows a point may write: the depth, the tokens generated past n by the last
        verify and the rows its dropped drafts write (K-1 past the kept)."""
        return depth + self.greedy_tokens

    def labels(self) -> list[str]:
        return [a.label for a in self.acceptances]


def depth_arrays(walk: ReferenceWalk, depth: int, capacity: int, greedy: int) -> dict:
    """A depth file's arrays: ``tokens`` (the depth's and the first one fed),
    ``cache:<past>`` (the state at depth), ``ref_greedy`` (the reference's ``greedy``
    tokens after the prompt) and ``vocab`` (its logits' width: a page reading ids shows
    none); the walk left at ``depth``. A model's walk
    (``OrtReferenceWalk``) gives its look-ahead as its own greedy tokens already: the first
    one fed is the reference's pick after the prompt, the rest its greedy continuation."""
    if not isinstance(walk, NumpyReferenceWalk):
        arrays = walk.arrays_at(depth, capacity, greedy + 1)
        arrays["vocab"] = np.asarray(arrays.pop("ref_logits").shape[-1], np.int64)
        arrays["ref_greedy"] = arrays["tokens"][depth + 1:].copy()
        arrays["tokens"] = arrays["tokens"][:depth + 1].copy()
        return arrays
    arrays = walk.arrays_at(depth, capacity, 1)
    arrays["vocab"] = np.asarray(arrays.pop("ref_logits").shape[-1], np.int64)
    ref = walk.ref
    saved, x, out = ref.save(), int(arrays["tokens"][depth]), []
    for _ in range(greedy):
        x = int(np.argmax(ref.step(x)))
        out.append(x)
    ref.restore(saved)
    arrays["ref_greedy"] = np.asarray(out, np.int64)
    return arrays


def header(cfg: SpecConfig, workload: Workload | None, environment: dict,
           source: WorkloadSource | None = None) -> SpecResults:
    """The results file's header: the preset's config, or (``workload`` None) the model's
    description (``ModelSource.describe``: its file, pairs, dims and tolerance)."""
    if workload is not None:
        c = workload.config
        what = {"preset": c.name, "dtype": c.dtype, "config": c.describe()}
    else:
        what = {"preset": cfg.preset, **source.describe(cfg.capacity_for(max(cfg.contexts)))}
    return SpecResults(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        command=cfg.command or "statebench speculative", environment=environment,
        workload={**what, "seed": cfg.seed,
                  "tokens": cfg.tokens, "k": cfg.ks, "acceptance": cfg.labels(),
                  "contexts": cfg.contexts, "warmup": cfg.warmup, "warm_s": cfg.warm_s,
                  "read": cfg.read})


def run_worker(req: GroupRequest, timeout_s: float, on_point: Callable[[dict], None],
               say: Callable[[str], None] | None = None) -> None:
    """``python -m harness.speculative.e2e_point`` for one group, each point handed to
    ``on_point`` as the worker sends it (its line ``{"point": ...}``) and its progress lines
    to ``say``; a crash or a hang fails the points it had not sent, with the reason."""
    emit = Emit(on_point)

    def line(text: str) -> None:
        if not text.strip():
            return
        try:
            point = json.loads(text)["point"]
        except (ValueError, TypeError, KeyError):
            return  # not a point (a library's print): the exit status says what went wrong
        emit.point(point)

    def stderr(text: str) -> None:
        if say and text.startswith(PROGRESS_PREFIX):
            say(text[len(PROGRESS_PREFIX):])

    try:
        status, err = child.stream_module("harness.speculative.e2e_point", req.to_json(),
                                          timeout_s, line, stderr)
        why = "" if status == 0 else child.exit_reason(
            "worker", subprocess.CompletedProcess([], status, "", err))
    except subprocess.TimeoutExpired:
        why = f"worker timed out after {timeout_s:.0f} s"
    emit.fail_rest(req, why or "the worker sent no point for it")


@dataclass
class Sweep:
    """What the sweep needs besides its settings: the classes by name, the adapter probe's
    refusals, the workload (a preset's, or a test's own), where results go."""

    classes: dict[str, type[Backend]]
    refusals: dict[str, str] = field(default_factory=dict)
    workload: Workload | None = None
    out: Path | None = None
    on_group: Callable[[str, int, list[dict]], None] | None = None
    #: a worker's progress lines (its slow phases), as they come
    say: Callable[[str], None] | None = None
    #: the source the command already loaded (None: ``run`` makes it from the config)
    source: WorkloadSource | None = None


def _keeper(points: list[dict], results: SpecResults,
            out: Path | None) -> Callable[[dict], None]:
    """Where a group's points go: ``points``, ``results``, and ``out`` saved after each."""

    def keep(p: dict) -> None:
        points.append(p)
        results.record(p)
        if out is not None:
            results.save(out)

    return keep


def run(cfg: SpecConfig, sweep: Sweep, results: SpecResults) -> SpecResults:
    """Every point, depths ascending; ``results`` saved to ``sweep.out`` after each group.
    A test's workload (``sweep.workload``) runs in this process only."""
    # a test's own workload needs no source; else the command's, or one made here
    source = sweep.source or (None if sweep.workload is not None
                              else source_for(cfg.preset, cfg.model, seed=cfg.seed))
    workload = sweep.workload or source.workload()
    contexts = sorted(cfg.contexts)
    top = cfg.capacity_for(max(contexts))
    walk = (source.reference_walk(max(contexts) + 1, top + 1) if workload is None else
            NumpyReferenceWalk(workload.config, workload.weights, cfg.seed, max(contexts) + 1,
                               top))
    try:
        _groups(cfg, sweep, results, walk, source if workload is None else None)
    finally:
        walk.close()
    return results


def _groups(cfg: SpecConfig, sweep: Sweep, results: SpecResults, walk: ReferenceWalk,
            model: WorkloadSource | None) -> None:
    """Every backend at every depth, ascending (``run``); ``model``, a model's source (None
    for a preset), goes to the workers with each request, and a backend that cannot run it
    is unavailable with why."""
    contexts = sorted(cfg.contexts)
    wire = None if model is None else model.to_wire()
    with tempfile.TemporaryDirectory(prefix="statebench-spec-") as tmp:
        for depth in contexts:
            cap = cfg.capacity_for(depth)
            path = Path(tmp) / f"depth-{depth}.npz"
            np.savez(path, **depth_arrays(walk, depth, cap, cfg.greedy_tokens))
            for name, cls in sweep.classes.items():
                req = GroupRequest(backend=name, preset=cfg.preset, depth=depth, capacity=cap,
                                   tokens=cfg.tokens, ks=cfg.ks, acceptances=cfg.labels(),
                                   depth_file=str(path), seed=cfg.seed, warmup=cfg.warmup,
                                   warm_s=cfg.warm_s, options=cfg.options, source=wire,
                                   read=cfg.read)
                points: list[dict] = []
                keep = _keeper(points, results, sweep.out)

                refused = sweep.refusals.get(name, "") or (model.refusal(cls) if model else "")
                if refused:
                    for k, a in req.keys():
                        keep(point_unavailable(req, k, a, refused))
                elif cfg.inprocess or sweep.workload is not None:
                    measure_group(req, sweep.workload, cls, Emit(keep, sweep.say))
                else:
                    run_worker(req, cfg.timeout_s, keep, sweep.say)
                if sweep.on_group:
                    sweep.on_group(name, depth, points)
            path.unlink(missing_ok=True)
