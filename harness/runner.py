"""Orchestrate a sweep: backends × contexts, one worker per point, results saved after each.

The runner computes what every backend shares once per context (the reference's state at
depth L and its logits for the steps that follow), hands it to a worker by file, turns the
worker's measurement into a point with its floor and MBU, and writes the results file
atomically after every point so an interrupted sweep keeps points 1..k (DESIGN §10). What
differs between a preset and a model file it asks the sweep's `WorkloadSource`
(``harness.sources``); it talks to its workers in `WorkerRequest` and `WorkerReply`
(``harness.wire``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from backends.base import Backend, registry
from harness import calibrate as calibration
from harness import child, repeats, worker
from harness.bandwidth import SIZE as CALIBRATION_SIZE
from harness.results import Point, Results, ResultsFile, one_line
from harness.sources import ReferenceWalk, WorkloadSource, source_for
from harness.sweep_args import (  # noqa: F401 - the sweep's defaults, as named here before
    DEFAULT_CONTEXTS,
    DEFAULT_WARM_S,
    WORKER_TIMEOUT_S,
    parse_contexts,
)
from harness.wgpu_probe import WgpuProbe, probe_wgpu
from harness.wire import WorkerReply, WorkerRequest
from model import checksum
from model.errors import UserError

if TYPE_CHECKING:
    from backends.webnn.wgpu_impl.options import KernelOptions



@dataclass
class RunConfig:
    preset: str = "small"
    backends: list[str] = field(default_factory=list)
    contexts: list[int] = field(default_factory=lambda: parse_contexts(DEFAULT_CONTEXTS))
    steps: int = 16
    warmup: int = 2
    warm_s: float = DEFAULT_WARM_S
    capacity: int | None = None
    seed: int = 0
    #: fresh worker processes per point (harness/repeats.py)
    repeat: int = 1
    inprocess: bool = False
    timeout_s: float = WORKER_TIMEOUT_S
    calibrate: bool = True
    command: str = ""
    #: a model statebench did not write, in place of `preset` (harness.model_run)
    model: str | None = None
    #: its cache pairs named by hand (--pairs), past -> present
    pairs: dict[str, str] = field(default_factory=dict)
    #: the WebNN pages' knobs (--kernel-option, parsed once); None: each page's defaults
    kernel_options: KernelOptions | None = None

    def source(self) -> WorkloadSource:
        """The workload this sweep measures (`model` where given, else `preset`)."""
        return source_for(self.preset, self.model, self.pairs, self.seed)

    def capacity_for(self, context: int) -> int:
        need = context + self.warmup + self.steps
        if self.capacity is None:
            return need
        if self.capacity < need:
            raise UserError(f"--capacity {self.capacity} is too small for context {context} + "
                            f"{self.warmup} warm-up + {self.steps} steps (needs {need})")
        return self.capacity


def default_out(preset_name: str) -> Path:
    """results/run-<preset>-<date>-<time>.<microseconds>-<pid>.json: two runs started in the
    same second (or microsecond, in two processes) never share a name; the first save
    creates the file exclusively all the same (ResultsFile)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S.%f")
    path = Path("results") / f"run-{preset_name}-{stamp}-{os.getpid()}.json"
    n = 1
    while path.exists():  # the same process within one microsecond
        n += 1
        path = path.with_name(f"run-{preset_name}-{stamp}-{os.getpid()}-{n}.json")
    return path


# -- running one point ----------------------------------------------------------------------

def run_worker_subprocess(req: WorkerRequest, timeout_s: float) -> Point:
    """`python -m harness.worker` for one point; a crash or hang becomes a failed point.

    An interrupt here kills the worker (subprocess.run does); a runner killed outright
    closes the pipe the worker watches (`parent_fd`), and the worker exits and removes its
    depth file (worker.exit_with_parent).
    """
    name, ctx, cap, steps = req.backend, req.context, req.capacity, req.steps
    watched, alive = os.pipe()  # this end of it stays open, unwritten, while the runner lives
    try:
        # the cache files this process found whole, so the worker need not check them again
        sent = replace(req, parent_fd=watched, whole_files=checksum.whole_files())
        proc = child.run_module("harness.worker", sent.to_json(), timeout_s, pass_fds=(watched,))
    except subprocess.TimeoutExpired:
        return Point.failed(name, ctx, cap, steps, f"worker timed out after {timeout_s:.0f} s")
    finally:
        os.close(watched)
        os.close(alive)
    for line in proc.stderr.splitlines():
        if line.startswith(checksum.NOTICE_PREFIX):  # a rebuilt cache file is said, not hidden
            print(line, file=sys.stderr, flush=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode == 0 and lines:
        try:
            reply = WorkerReply.from_json(lines[-1])
        except (ValueError, TypeError, KeyError) as exc:
            return Point.failed(name, ctx, cap, steps, f"worker sent a bad point: {exc}")
        checksum.adopt(reply.whole_files)  # what the worker found whole, for the next worker
        return reply.point
    return Point.failed(name, ctx, cap, steps, child.exit_reason("worker", proc))


def measure_once(req: WorkerRequest, cls: type[Backend], rc: RunConfig) -> Point:
    """One worker's measurement of a point (in a fresh process unless --inprocess)."""
    t0 = time.perf_counter()
    if rc.inprocess:
        point = worker.measure(req, cls)
        if point.measured:
            point = replace(point, details={**point.details, "peak_rss_scope": "process (--inprocess)"})
    else:
        point = run_worker_subprocess(req, rc.timeout_s)
    wall = {"wall_s": round(time.perf_counter() - t0, 3)}
    return replace(point, details=_with_default(point.details, wall), reason=one_line(point.reason))


def record(results: Results, point: Point) -> None:
    """Put `point` in `results`, in place of an earlier repeat of it."""
    for i, p in enumerate(results.points):
        if p.key == point.key:
            results.points[i] = point
            return
    results.points.append(point)


def finish_point(point: Point, source: WorkloadSource, calib: dict) -> Point:
    """Add the floor (DESIGN §7: the source's) and MBU to a measured point."""
    if not point.measured or point.weights_bytes is None:
        return point
    floor, why = source.floor(point, calib)
    if floor is not None and point.step_ms.median > 0:
        return replace(point, floor_ms=floor, mbu=floor / point.step_ms.median)
    if why:
        return replace(point, floor_ms=floor,
                       details=_with_default(point.details, {"floor_reason": why}))
    return replace(point, floor_ms=floor)


def _with_default(details: Mapping[str, object], defaults: dict[str, object]) -> dict:
    """``details`` with each of ``defaults`` it lacks added at the end (``dict.setdefault``
    on a copy: a point's details are read-only, and their order is the file's)."""
    return {**details, **{k: v for k, v in defaults.items() if k not in details}}


# -- the sweep ------------------------------------------------------------------------------

def resolve_backends(names: Sequence[str], extra: dict[str, type[Backend]] | None = None
                     ) -> dict[str, type[Backend]]:
    known = dict(extra or {})
    if any(n not in known for n in names):
        known = {**registry(), **known}
    missing = [n for n in names if n not in known]
    if missing:
        raise UserError(f"unknown backend {missing[0]!r}; accepted: {', '.join(sorted(known))}")
    return {n: known[n] for n in names}


def new_results(rc: RunConfig, source: WorkloadSource, calib: dict,
                probe: WgpuProbe | None) -> Results:
    """The results' header: what `source` says of the workload, and how it was swept."""
    model = source.describe(max(rc.capacity_for(c) for c in rc.contexts))
    return Results(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        command=rc.command or "statebench run",
        environment=calibration.environment(calib, probe.adapter if probe else None),
        workload={**model, "seed": rc.seed,
                  "steps": rc.steps, "warmup": rc.warmup, "warm_s": rc.warm_s,
                  "repeat": rc.repeat,
                  "contexts": rc.contexts,
                  "capacity": rc.capacity},
    )


def run_sweep(rc: RunConfig, out: str | Path | ResultsFile, console: Console | None = None,
              extra_backends: dict[str, type[Backend]] | None = None,
              on_point: Callable[[Point], None] | None = None) -> Results:
    """Measure every backend at every context; save `out` after each point and return it all.

    `out` is checked before any work and written from the first point on, never over a file
    this run did not make unless it is a `ResultsFile` with `force`. SIGINT or SIGTERM ends
    the sweep with `Interrupted` (its message says what was kept), the worker in flight
    stopped and the depth files removed. `extra_backends` maps names to classes outside the
    registry (tests' doubles). Progress goes to `console` (stderr by default) and is
    disabled when it is not a terminal.
    """
    sink = out if isinstance(out, ResultsFile) else ResultsFile(out)
    with terminate_as_interrupt() as caught:
        try:
            return _measure_sweep(rc, sink, console, extra_backends, on_point)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            how, status = stopped_by(caught)
            raise Interrupted(sink.interrupted(how), status) from None


def _measure_sweep(rc: RunConfig, sink: ResultsFile, console: Console | None,
                   extra_backends: dict[str, type[Backend]] | None,
                   on_point: Callable[[Point], None] | None) -> Results:
    source = rc.source()
    if rc.steps <= 0 or rc.warmup < 0 or rc.warm_s < 0 or rc.repeat <= 0:
        raise UserError("--steps and --repeat must be ≥ 1, --warmup and --warm-s ≥ 0")
    for ctx in rc.contexts:
        rc.capacity_for(ctx)  # fail on a too-small --capacity before any work
    ahead = rc.warmup + rc.steps
    length, top = max(rc.contexts) + ahead, max(rc.capacity_for(c) for c in rc.contexts)
    source.check_positions(length - 1)
    classes = resolve_backends(rc.backends, extra_backends)
    source.check_memory(top, length, ahead, max(rc.contexts))
    sink.check()
    console = console or Console(stderr=True)
    # the reference first: a model it cannot run is refused before any calibration
    walk = source.reference_walk(length, top)
    try:
        needs_gpu = any(not cls.on_cpu for cls in classes.values())
        # the adapter (and its figures) from a child: a driver that aborts ends only the child
        probe = (probe_wgpu(CALIBRATION_SIZE if needs_gpu and rc.calibrate else None)
                 if needs_gpu or rc.calibrate else None)
        calib = (calibration.calibrate(need_gpu=needs_gpu, working_set=source.working_set,
                                       probe=probe) if rc.calibrate else {})
        results = new_results(rc, source, calib, probe)
        return _sweep_points(rc, sink, console, classes, results, walk,
                             Sweep(source, probe, calib, on_point))
    finally:
        walk.close()


@dataclass(frozen=True)
class Sweep:
    """What every point of a sweep shares besides its settings (`RunConfig`): the workload,
    the adapter the probe found, the calibration, and who hears of each point."""

    source: WorkloadSource
    probe: WgpuProbe | None
    calibration: dict
    on_point: Callable[[Point], None] | None = None


def _sweep_points(rc: RunConfig, sink: ResultsFile, console: Console, classes: dict,
                  results: Results, walk: ReferenceWalk, sweep: Sweep) -> Results:
    """Every point of the sweep, contexts ascending, each saved as it comes. A backend the
    probe or the source refuses is unavailable, with why, and the sweep goes on."""
    source, probe = sweep.source, sweep.probe
    contexts, ahead = sorted(rc.contexts), rc.warmup + rc.steps
    total = len(contexts) * len(classes) * rc.repeat
    registered = set(registry())  # outside the registry: tests' doubles, imported by path
    options = None if rc.kernel_options is None else rc.kernel_options.as_dict()
    remove_stale_depth_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{DEPTH_DIR_PREFIX}{os.getpid()}-") as tmp, Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, disable=not console.is_terminal, transient=True,
    ) as progress:
        task = progress.add_task("reference", total=total)
        for ctx in contexts:
            cap = rc.capacity_for(ctx)
            progress.update(task, description=f"reference @ d{ctx}")
            depth_file = Path(tmp) / f"depth-{source.label}-{ctx}-{cap}.npz"
            np.savez(depth_file, **walk.arrays_at(ctx, cap, ahead))
            # repeats go round the backends, so a drift of the machine touches all alike
            for rep in range(1, rc.repeat + 1):
                for name, cls in classes.items():
                    progress.update(task, description=f"{name} @ d{ctx}" + (
                        f" ({rep}/{rc.repeat})" if rc.repeat > 1 else ""))
                    prev = results.point(name, ctx)
                    if prev is None or prev.measured:  # a point that failed is not retried
                        req = WorkerRequest(
                            backend=name, source=source, context=ctx, capacity=cap,
                            steps=rc.steps, warmup=rc.warmup, depth_file=str(depth_file),
                            warm_s=rc.warm_s, options=options,
                            backend_path=(None if name in registered
                                          else f"{cls.__module__}:{cls.__qualname__}"))
                        refused = probe.refuses(cls) if probe else ""
                        if not refused:
                            refused = source.refusal(cls)
                        if refused:  # its own probe could abort the worker
                            point = Point.unavailable(name, ctx, cap, rc.steps, refused)
                        else:
                            point = measure_once(req, cls, rc)
                        point = (repeats.first(point) if prev is None
                                 else repeats.add(prev, point, rep, rc.repeat))
                        record(results, finish_point(point, source, sweep.calibration))
                        sink.save(results)
                        if sweep.on_point and (rep == rc.repeat or not point.measured):
                            sweep.on_point(point)
                    progress.advance(task)
            depth_file.unlink(missing_ok=True)
    return results


# -- sizes, signals and temporary files: nothing lost, nothing left behind ------------------

#: a sweep's temporary directory for depth files is DEPTH_DIR_PREFIX<pid>-<random>
DEPTH_DIR_PREFIX = "statebench-depth-"


class Interrupted(KeyboardInterrupt):
    """A sweep stopped by SIGINT or SIGTERM: `message` says which points were kept and
    where; `status` is the exit status (128 + the signal's number: 130, 143)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message, self.status = message, status


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM (`kill`, a scheduler's stop) raises KeyboardInterrupt as Ctrl-C does, so a
    terminated sweep keeps its points and stops its worker; yields [the signal caught]."""
    caught = [int(signal.SIGINT)]

    def on_term(signum, frame):
        caught[0] = signum
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield caught  # signal handlers can only be set in the main thread
        return
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield caught
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped_by(caught: list[int]) -> tuple[str, int]:
    """(how a run was stopped, its exit status: 128 + the signal) from what
    ``terminate_as_interrupt`` caught."""
    how = "terminated" if caught[0] == signal.SIGTERM else "interrupted"
    return how, 128 + int(caught[0])


def remove_stale_depth_dirs() -> None:
    """Remove depth directories of sweeps that were killed outright (SIGKILL, a lost
    machine) between points: their process is gone, so nothing else will."""
    for d in Path(tempfile.gettempdir()).glob(f"{DEPTH_DIR_PREFIX}*-*"):
        pid = d.name[len(DEPTH_DIR_PREFIX):].split("-", 1)[0]
        if d.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True
