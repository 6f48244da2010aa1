"""Orchestrate a sweep: backends × contexts, one worker per point, results saved after each.

The runner computes what every backend shares once per context (the reference's state at
depth L and its logits for the steps that follow), hands it to a worker by file, turns the
worker's measurement into a point with its floor and MBU, and writes the results file
atomically after every point so an interrupted sweep keeps points 1..k (DESIGN §10).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from backends.base import Backend, registry
from harness import calibrate as calibration
from harness import child, memory, metrics, repeats, worker
from harness.bandwidth import SIZE as CALIBRATION_SIZE
from harness.model_run import OrtReferenceWalk, UserModel
from harness.results import Point, Results, ResultsFile, one_line
from harness.wgpu_probe import WgpuProbe, probe_wgpu
from model import checksum
from model.errors import UserError
from model.reference import Reference
from model.workload import ModelConfig, Workload, preset, token_stream, weights_bytes

#: presets above this many parameters get a float32 reference (float64 would need 2× the memory)
FLOAT64_REFERENCE_MAX_PARAMS = 200_000_000
PREFILL_CHUNK = 256
WORKER_TIMEOUT_S = 1800.0
#: the default sweep's depths: the stateful cache is reached by dispatching every prefix token,
#: so on lavapipe (~50 ms a `small` step) these keep the default sweep near 2 minutes
DEFAULT_CONTEXTS = "64,256,512"
#: seconds of GPU load before each GPU point's warm-up steps (heater.heat)
DEFAULT_WARM_S = 2.0


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
    #: KernelOptions knobs for the WebNN pages (--kernel-option), KEY=VALUE as given
    kernel_options: list[str] = field(default_factory=list)

    def capacity_for(self, context: int) -> int:
        need = context + self.warmup + self.steps
        if self.capacity is None:
            return need
        if self.capacity < need:
            raise UserError(f"--capacity {self.capacity} is too small for context {context} + "
                            f"{self.warmup} warm-up + {self.steps} steps (needs {need})")
        return self.capacity


def parse_contexts(text: str) -> list[int]:
    """'64,256,1024' → [64, 256, 1024]; anything else is the user's error."""
    out: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise UserError(f"bad context {part!r} in --contexts; accepted: positive integers, "
                            "comma-separated (e.g. 64,256,1024)") from None
        if n <= 0:
            raise UserError(f"bad context {n} in --contexts; contexts must be positive integers")
        if n not in out:
            out.append(n)
    if not out:
        raise UserError("--contexts is empty; accepted: positive integers, comma-separated")
    return out


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


# -- the state every backend starts from ----------------------------------------------------

def reference_dtype(n_params: int) -> type[np.floating]:
    """The reference's data type for a model of `n_params` parameters (FLOAT64_REFERENCE_MAX_PARAMS)."""
    return np.float64 if n_params <= FLOAT64_REFERENCE_MAX_PARAMS else np.float32


class ReferenceWalk:
    """One reference walked up the contexts in ascending order.

    The prefix is prefilled once (each context continues from the last), and the logits the
    backends are checked against are computed on a look-ahead that is then rolled back, so
    a sweep to 16k costs one 16k prefill, not the sum of all contexts.
    """

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], seed: int,
                 length: int, capacity: int) -> None:
        dtype = reference_dtype(sum(int(w.size) for w in weights.values()))
        self.tokens = token_stream(cfg, length, seed)
        self.ref = Reference(cfg, weights, capacity, dtype=dtype)

    def arrays_at(self, context: int, capacity: int, ahead: int) -> dict[str, np.ndarray]:
        """State after `context` tokens (KV cut to `capacity`) and the next `ahead` logits."""
        ref = self.ref
        if context < ref.position:
            raise ValueError("contexts must be visited in ascending order")
        while ref.position < context:
            ref.prefill(self.tokens[ref.position:min(ref.position + PREFILL_CHUNK, context)],
                        logits=False)
        saved = ref.save()
        arrays = {"tokens": self.tokens[:context + ahead]}
        arrays.update({f"cache:{k}": v for k, v in ref.cache_arrays(capacity).items()})
        arrays["ref_logits"] = np.stack([ref.step(int(t)) for t in self.tokens[context:context + ahead]])
        ref.restore(saved)
        return arrays


def depth_arrays(cfg: ModelConfig, weights: dict[str, np.ndarray], seed: int, context: int,
                 capacity: int, warmup: int, steps: int) -> dict[str, np.ndarray]:
    """Reference state after `context` teacher-forced tokens, and its logits for the next
    warmup + steps tokens (what every backend's logits are compared with)."""
    walk = ReferenceWalk(cfg, weights, seed, context + warmup + steps, capacity)
    return walk.arrays_at(context, capacity, warmup + steps)


# -- running one point ----------------------------------------------------------------------

def run_worker_subprocess(req: dict, timeout_s: float) -> Point:
    """`python -m harness.worker` for one point; a crash or hang becomes a failed point.

    An interrupt here kills the worker (subprocess.run does); a runner killed outright
    closes the pipe the worker watches (`parent_fd`), and the worker exits and removes its
    depth file (worker.exit_with_parent).
    """
    name, ctx, cap, steps = req["backend"], req["context"], req["capacity"], req["steps"]
    watched, alive = os.pipe()  # this end of it stays open, unwritten, while the runner lives
    try:
        # the cache files this process found whole, so the worker need not check them again
        proc = child.run_module("harness.worker", {**req, "parent_fd": watched}, timeout_s,
                                env={checksum.HANDOFF_ENV: checksum.handoff()},
                                pass_fds=(watched,))
    except subprocess.TimeoutExpired:
        return Point.failed(name, ctx, cap, steps, f"worker timed out after {timeout_s:.0f} s")
    finally:
        os.close(watched)
        os.close(alive)
    for line in proc.stderr.splitlines():
        if line.startswith(checksum.NOTICE_PREFIX):  # a rebuilt cache file is said, not hidden
            print(line, file=sys.stderr, flush=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    for line in lines[:-1]:  # what the worker found whole, for the next point's worker
        if line.startswith(checksum.HANDBACK_PREFIX):
            checksum.adopt(line[len(checksum.HANDBACK_PREFIX):])
    if proc.returncode == 0 and lines:
        try:
            return Point.from_dict(json.loads(lines[-1]))
        except (ValueError, TypeError) as exc:
            return Point.failed(name, ctx, cap, steps, f"worker sent a bad point: {exc}")
    return Point.failed(name, ctx, cap, steps, child.exit_reason("worker", proc))


def measure_once(req: dict, cls: type[Backend], rc: RunConfig) -> Point:
    """One worker's measurement of a point (in a fresh process unless --inprocess)."""
    t0 = time.perf_counter()
    if rc.inprocess:
        point = worker.measure(req, cls)
        if point.measured:
            point.details["peak_rss_scope"] = "process (--inprocess)"
    else:
        point = run_worker_subprocess(req, rc.timeout_s)
    point.details.setdefault("wall_s", round(time.perf_counter() - t0, 3))
    point.reason = one_line(point.reason)
    return point


def record(results: Results, point: Point) -> None:
    """Put `point` in `results`, in place of an earlier repeat of it."""
    for i, p in enumerate(results.points):
        if p.key == point.key:
            results.points[i] = point
            return
    results.points.append(point)


#: why a point of a model statebench did not write has no floor
NO_MODEL_FLOOR = ("no floor for a model statebench did not write (the bytes a step must move "
                  "are modelled for presets only)")


def finish_point(point: Point, cfg: ModelConfig | None, calib: dict) -> Point:
    """Add the floor (DESIGN §7) and MBU to a measured point (`cfg` None: a user's model)."""
    if not point.measured or point.weights_bytes is None:
        return point
    if cfg is None:
        point.details.setdefault("floor_reason", NO_MODEL_FLOOR)
        return point
    floor, why = metrics.floor_ms(point.backend, cfg, point.weights_bytes, point.context,
                                  point.capacity, calib, point.details)
    point.floor_ms = floor
    if floor is not None and point.step_ms.median > 0:
        point.mbu = floor / point.step_ms.median
    elif why:
        point.details.setdefault("floor_reason", why)
    return point


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


def new_results(rc: RunConfig, cfg: ModelConfig | None, calib: dict, probe: WgpuProbe | None,
                user: UserModel | None = None) -> Results:
    """The results' header; a user's model (`user`) in place of a preset's `cfg`."""
    model = ({"model": user.describe(max(rc.capacity_for(c) for c in rc.contexts)),
              "dtype": "float32"} if user is not None else
             {"preset": rc.preset, "dtype": cfg.dtype, "config": cfg.describe()})
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
    with _terminate_as_interrupt() as caught:
        try:
            return _measure_sweep(rc, sink, console, extra_backends, on_point)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            how = "terminated" if caught[0] == signal.SIGTERM else "interrupted"
            raise Interrupted(sink.interrupted(how), 128 + int(caught[0])) from None


def _measure_sweep(rc: RunConfig, sink: ResultsFile, console: Console | None,
                   extra_backends: dict[str, type[Backend]] | None,
                   on_point: Callable[[Point], None] | None) -> Results:
    user = UserModel.load(rc.model, rc.pairs) if rc.model else None
    cfg = None if user else preset(rc.preset)
    if rc.steps <= 0 or rc.warmup < 0 or rc.warm_s < 0 or rc.repeat <= 0:
        raise UserError("--steps and --repeat must be ≥ 1, --warmup and --warm-s ≥ 0")
    for ctx in rc.contexts:
        rc.capacity_for(ctx)  # fail on a too-small --capacity before any work
    ahead = rc.warmup + rc.steps
    if user is not None:
        user.check_positions(max(rc.contexts) + ahead - 1)
    classes = resolve_backends(rc.backends, extra_backends)
    if cfg is not None:
        check_memory(rc, cfg)
    sink.check()
    console = console or Console(stderr=True)
    # the reference first: a model it cannot run is refused before any calibration
    length, top = max(rc.contexts) + ahead, max(rc.capacity_for(c) for c in rc.contexts)
    walk = (OrtReferenceWalk(user, rc.seed, length, top) if user is not None else
            ReferenceWalk(cfg, Workload.build(cfg, rc.seed).weights, rc.seed, length, top))

    needs_gpu = any(not metrics.is_cpu(n) for n in classes)
    # the adapter (and its figures) from a child: a driver that aborts ends only the child
    probe = (probe_wgpu(CALIBRATION_SIZE if needs_gpu and rc.calibrate else None)
             if needs_gpu or rc.calibrate else None)
    working_set = user.size if user is not None else weights_bytes(cfg)
    calib = (calibration.calibrate(need_gpu=needs_gpu, working_set=working_set, probe=probe)
             if rc.calibrate else {})
    results = new_results(rc, cfg, calib, probe, user)

    label = f"model-{user.name}" if user is not None else rc.preset
    try:
        return _sweep_points(rc, sink, console, classes, results, walk, label,
                             refusal=user.refusal if user is not None else None,
                             model_req={} if user is None else {
                                 "preset": None, "model": str(user.path), "pairs": rc.pairs,
                                 "model_bytes": user.size, "tolerance": user.tolerance},
                             probe=probe, cfg=cfg, calib=calib, on_point=on_point)
    finally:
        if user is not None:
            walk.close()


def _sweep_points(rc: RunConfig, sink: ResultsFile, console: Console, classes: dict,
                  results: Results, walk: ReferenceWalk | OrtReferenceWalk, label: str, *,
                  refusal: Callable[[type[Backend]], str] | None, model_req: dict,
                  probe: WgpuProbe | None, cfg: ModelConfig | None, calib: dict,
                  on_point: Callable[[Point], None] | None) -> Results:
    """Every point of the sweep, contexts ascending, each saved as it comes. A user's model
    adds `model_req` to each worker's request, and `refusal` says which backends cannot run
    it (unavailable, with why, and the sweep goes on)."""
    contexts, ahead = sorted(rc.contexts), rc.warmup + rc.steps
    total = len(contexts) * len(classes) * rc.repeat
    registered = set(registry())  # outside the registry: tests' doubles, imported by path
    remove_stale_depth_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{DEPTH_DIR_PREFIX}{os.getpid()}-") as tmp, Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, disable=not console.is_terminal, transient=True,
    ) as progress:
        task = progress.add_task("reference", total=total)
        for ctx in contexts:
            cap = rc.capacity_for(ctx)
            progress.update(task, description=f"reference @ d{ctx}")
            depth_file = Path(tmp) / f"depth-{label}-{ctx}-{cap}.npz"
            np.savez(depth_file, **walk.arrays_at(ctx, cap, ahead))
            # repeats go round the backends, so a drift of the machine touches all alike
            for rep in range(1, rc.repeat + 1):
                for name, cls in classes.items():
                    progress.update(task, description=f"{name} @ d{ctx}" + (
                        f" ({rep}/{rc.repeat})" if rc.repeat > 1 else ""))
                    prev = results.point(name, ctx)
                    if prev is None or prev.measured:  # a point that failed is not retried
                        req = {"backend": name, "preset": rc.preset, "seed": rc.seed,
                               "context": ctx, "capacity": cap, "steps": rc.steps,
                               "warmup": rc.warmup, "warm_s": rc.warm_s,
                               "depth_file": str(depth_file)}
                        req.update(model_req)
                        if rc.kernel_options:
                            req["kernel_options"] = list(rc.kernel_options)
                        if name not in registered:
                            req["backend_path"] = f"{cls.__module__}:{cls.__qualname__}"
                        refused = probe.refuses(cls) if probe else ""
                        if not refused and refusal is not None:
                            refused = refusal(cls)
                        if refused:  # its own probe could abort the worker
                            point = Point.unavailable(name, ctx, cap, rc.steps, refused)
                        else:
                            point = measure_once(req, cls, rc)
                        point = (repeats.first(point) if prev is None
                                 else repeats.add(prev, point, rep, rc.repeat))
                        record(results, finish_point(point, cfg, calib))
                        sink.save(results)
                        if on_point and (rep == rc.repeat or not point.measured):
                            on_point(point)
                    progress.advance(task)
            depth_file.unlink(missing_ok=True)
    return results


# -- sizes, signals and temporary files: nothing lost, nothing left behind ------------------

#: a sweep's temporary directory for depth files is DEPTH_DIR_PREFIX<pid>-<random>
DEPTH_DIR_PREFIX = "statebench-depth-"


def sweep_memory_bytes(cfg: ModelConfig, capacity: int, length: int, ahead: int) -> int:
    """A lower bound on the memory a sweep holds at once at `capacity` rows, `length` tokens
    and `ahead` (warm-up + timed) steps: the reference's weights and state (twice:
    `ReferenceWalk.arrays_at` keeps a copy to roll back to), the state in the graphs' types
    for the depth file, the reference's logits for the steps (in the runner and in the
    worker, which also keeps its own in float32), and in the worker the weights, the depth
    file's state and the backend's own cache."""
    params = cfg.describe()["parameters"]
    ref_item = np.dtype(reference_dtype(params)).itemsize
    return (params * (ref_item + 4) + 2 * memory.state_bytes(cfg, capacity, ref_item)
            + 3 * memory.state_bytes(cfg, capacity) + 8 * length
            + ahead * cfg.vocab * (2 * ref_item + 4))


def check_memory(rc: RunConfig, cfg: ModelConfig) -> None:
    """Refuse a sweep that cannot fit in this machine's memory, before any work."""
    cap = max(rc.capacity_for(c) for c in rc.contexts)
    ahead = rc.warmup + rc.steps
    memory.require(sweep_memory_bytes(cfg, cap, max(rc.contexts) + ahead, ahead),
                   f"{rc.preset} at context {max(rc.contexts)} (capacity {cap}) with "
                   f"{ahead} warm-up and timed steps",
                   "use smaller --contexts, --capacity or --steps")


class Interrupted(KeyboardInterrupt):
    """A sweep stopped by SIGINT or SIGTERM: `message` says which points were kept and
    where; `status` is the exit status (128 + the signal's number: 130, 143)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message, self.status = message, status


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[list[int]]:
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
