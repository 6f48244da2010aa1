"""Measure one backend × context point (DESIGN §5, §7); the runner only orchestrates.

Run as `python -m harness.worker`: reads one `WorkerRequest` (JSON) on stdin and writes one
`WorkerReply` (JSON: the point and the cache files found whole here, for the runner's next
workers) as the last line of stdout (``harness.wire``). A process per point keeps peak RSS per
backend honest and lets a crashed device take down only its own point. `measure()` is the
same thing in-process (tests, `--inprocess`). What differs between a preset and a model file
the request's source says (``harness.sources``); what differs between backends, the backend
class (``backends.base.Backend``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import resource
import sys
import threading
import time
import traceback

import numpy as np

from backends.base import Backend, ByteCounters, DepthState, registry
from harness.clocks import ClockSampler
from harness.gc_window import GcWindow, freeze_setup, thaw
from harness.heater import heat
from harness.host_facts import TimedWindow
from harness.metrics import compare_logits, mismatch_reason
from harness.results import BYTE_CATEGORIES, Point, Stats
from harness.wire import WorkerReply, WorkerRequest
from model import checksum


def load_depth(path: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    with np.load(path) as z:
        cache = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("cache:")}
        return z["tokens"], z["ref_logits"], cache


def backend_class(req: WorkerRequest) -> type[Backend]:
    return class_for(req.backend, req.backend_path)


def class_for(backend: str, backend_path: str | None) -> type[Backend]:
    """The registry's class of that name, or the class at ``module:qualname`` (a test's
    backend, outside the registry)."""
    if backend_path:
        mod, _, qual = backend_path.partition(":")
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj
    return registry()[backend]


def backend_options(cls: type[Backend], options: dict | None) -> object | None:
    """The backend's options record (``Backend.options_type``) from the request's data
    (``--kernel-option``: each point records what it ran with, details.kernel_options);
    None where none were given or the backend takes none."""
    kind = cls.options_type() if options is not None else None
    return None if kind is None else kind(**options)


def peak_rss_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def measure(req: WorkerRequest, cls: type[Backend] | None = None) -> Point:
    """Prepare, reach depth, warm up, time `steps` single-token steps; never raises Exception.

    Any exception becomes a `failed` point with a one-line reason; KeyboardInterrupt passes.
    """
    name, ctx, cap, steps = req.backend, req.context, req.capacity, req.steps
    try:
        cls = cls or backend_class(req)
        ok, why = cls.available()
        if not ok:
            return Point.unavailable(name, ctx, cap, steps, why or "not available")
        return _measure(req, cls)
    except Exception as exc:  # noqa: BLE001 - a backend's failure is a result, not a crash
        if os.environ.get("STATEBENCH_DEBUG"):
            traceback.print_exc()
        return Point.failed(name, ctx, cap, steps, f"{type(exc).__name__}: {exc}")


def _measure(req: WorkerRequest, cls: type[Backend]) -> Point:
    name, ctx, cap, steps, warmup = req.backend, req.context, req.capacity, req.steps, req.warmup
    source = req.source
    tokens, ref_logits, cache = load_depth(req.depth_file)
    wl = source.workload()
    backend = source.backend(cls, backend_options(cls, req.options))
    cache_bytes, weights_bytes = source.cache_bytes(ctx, cache), source.weights_bytes
    clocks: ClockSampler | None = None
    collector: GcWindow | None = None
    try:
        t0 = time.perf_counter_ns()
        try:
            backend.prepare(wl, cap)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot build a user's model
            why = source.prepare_refusal(exc)
            if why is None:
                raise
            return Point.unavailable(name, ctx, cap, steps, why)
        build_s = (time.perf_counter_ns() - t0) / 1e9

        t0 = time.perf_counter_ns()
        backend.reach_depth(DepthState(tokens=tokens[:ctx].copy(), cache=cache))
        time_to_depth_s = (time.perf_counter_ns() - t0) / 1e9
        # the GPU's clocks up before the warm-up steps, the same for every backend on a GPU,
        # and sampled (where nvidia-smi can) until the timed steps end
        clocks = None if cls.on_cpu else ClockSampler()
        heated_s, not_heated = ((0.0, "a CPU backend") if clocks is None
                                else heat(float(req.warm_s)))

        freeze_setup()  # setup's objects out of every later collection's scan
        logits: list[np.ndarray] = []
        for i in range(warmup):
            logits.append(np.array(backend.step(int(tokens[ctx + i])), np.float32, copy=True))

        step_ms: list[float] = []
        gpu_ms: list[float] = []
        host: list[dict[str, float]] = []  # per step, where the backend can tell
        total = ByteCounters()
        timed_from = time.perf_counter()
        window = TimedWindow.start()
        collector = GcWindow.start()
        for i in range(steps):
            backend.counters.reset()
            token = int(tokens[ctx + warmup + i])
            t0 = time.perf_counter_ns()
            out = backend.step(token)
            t1 = time.perf_counter_ns()
            step_ms.append((t1 - t0) / 1e6)
            logits.append(np.array(out, np.float32, copy=True))
            total.add(backend.counters)
            g = backend.gpu_time_ms()
            if g is not None:
                gpu_ms.append(float(g))
            hb = backend.host_breakdown_ms()
            if hb is not None:
                host.append(hb)

        timed_to = time.perf_counter()
        gc_seen = collector.stop()  # the collector over the timed steps alone
        host_seen = window.facts()  # the host over the timed steps alone
        sm_clock = None
        if clocks is not None:
            clocks.stop(after=timed_to)
            sm_clock = clocks.during(timed_from, timed_to)
        tol = source.tolerance
        match = compare_logits(logits, ref_logits[: warmup + steps], tol)
        reason = "" if match.ok else mismatch_reason(
            logits, ref_logits[: warmup + steps], tol, source.reference_name)
        details = dict(backend.details)
        if sm_clock is not None:
            details["sm_clock_mhz"] = sm_clock
        details["heated_s"] = round(heated_s, 3)
        if not_heated:
            details["not_heated"] = not_heated
        # the samples go to the point's repeats, where the warning and interval are made
        # (harness/repeats.py)
        details["step_ms_samples"] = [round(x, 6) for x in step_ms]
        if host:
            details["host_breakdown_ms"] = host_breakdown(host, step_ms, gpu_ms)
        details["host_cpus"] = host_seen
        details["gc_timed"] = gc_seen
        if gpu_ms:
            details["gpu_ms_samples"] = [round(x, 6) for x in gpu_ms]
        if gpu_ms and len(gpu_ms) == steps:
            gpu, gpu_reason = Stats.of(gpu_ms), ""
        else:
            gpu = None
            gpu_reason = "backend has no GPU timer" if not gpu_ms else "GPU time missing on some steps"
        dev = backend.device_bytes()
        return Point(
            backend=name, context=ctx, capacity=cap, steps=steps, status="ok", reason=reason,
            step_ms=Stats.of(step_ms), gpu_ms=gpu, gpu_reason=gpu_reason,
            build_s=build_s, time_to_depth_s=time_to_depth_s,
            bytes_per_step={k: getattr(total, k) / steps for k in BYTE_CATEGORIES},
            cache_bytes=cache_bytes, weights_bytes=weights_bytes, peak_rss_bytes=peak_rss_bytes(),
            device_bytes=None if dev is None else int(dev), match=match, details=_plain(details),
        )
    finally:
        if clocks is not None:
            clocks.stop()  # a failed point must not leave nvidia-smi running
        if collector is not None:
            collector.stop()  # nor the collector's callback counting (--inprocess)
        thaw()
        try:
            backend.close()
        except Exception:  # noqa: BLE001 - closing must not hide the measurement
            pass


def host_breakdown(host: list[dict[str, float]], step_ms: list[float],
                   gpu_ms: list[float]) -> dict[str, float]:
    """Each part of the host's time per step (the backend's ``host_breakdown_ms``), the
    median over the timed steps, and the median of wall minus GPU time where every step
    was timed on the GPU (docs/measuring.md, "Host time")."""
    out = {k: round(float(np.median([h[k] for h in host])), 4) for k in host[0]}
    if len(gpu_ms) == len(step_ms):
        out["wall_minus_gpu"] = round(float(np.median(np.subtract(step_ms, gpu_ms))), 4)
    return out


def _plain(d: dict) -> dict:
    """Details as JSON-safe plain data (backends may put numpy scalars or tuples there)."""
    return json.loads(json.dumps(d, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def exit_with_parent(fd: int, depth_file: str | None) -> None:
    """Watch the runner's pipe (`fd`, never written) in a daemon thread: its end of file
    means the runner is gone, even by SIGKILL, so this point is no one's: remove the depth
    file (and its directory, when that leaves it empty) and exit at once."""

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        if depth_file:
            with contextlib.suppress(OSError):
                os.unlink(depth_file)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(depth_file))
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main() -> int:
    # Backends and drivers may print; keep stdout for the reply.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    req = WorkerRequest.from_json(sys.stdin.read())
    if req.parent_fd is not None:
        exit_with_parent(req.parent_fd, req.depth_file)
    checksum.adopt(req.whole_files)  # the runner's verdicts: its files are not hashed again
    point = measure(req)
    # the cache files found whole here, for the runner's next workers
    out.write(WorkerReply(point, checksum.whole_files()).to_json() + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
