"""Bandwidth measurement for the floors (DESIGN §7): the host's, and the wgpu adapter's.

Host memory bandwidth is a NumPy copy (and a matrix-vector product the size of the weights),
for CPU backends. Through wgpu, where an adapter exists: host→device (staged writes, as the
WebNN context writes large tensors: `backends.webnn.host_link`), device→host (a copy to a
staging buffer, a map and a copy into an existing array, as the context reads into a page's
arrays), device→device (copy_buffer_to_buffer) and a streaming compute kernel (read + write).
Host figures are the best of a few repetitions and the link figures wall slopes: a floor is
a bound, so the fastest observation is the honest one. Figures are GB/s (1e9 bytes/s).

The device-side figures (d2d, stream) are timed by the GPU itself where the adapter has
'timestamp-query': a few back-to-back repetitions between two timestamps, best of a few
trials after a warm-up, over buffers larger than any on-chip cache on a discrete GPU. A
wall-clock slope (t(8) - t(1) over one submit) stands in only where timestamps are missing
or unusable: a 64 MB device copy takes tens of microseconds, which submit overhead and timer
noise swamp. Every figure passes `checked_gbps`: one that is not positive, not finite or
above a physical bound is recorded as None with a `<name>_reason`, never as a number, and
`<name>_method` says how each was measured.

The wgpu figures are measured in a child process (`harness.wgpu_probe`): a driver can abort
the process that asks it for an adapter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from backends.webnn.adapter import is_cpu_adapter, wgpu_adapter
from backends.webnn.host_link import HostLink
from harness.bandwidth_bounds import (  # noqa: F401 - the bounds, as they were named here
    LINK_MAX_GBPS,
    MEMORY_MAX_GBPS,
    WGPU_BOUNDS,
    checked_gbps,
)
from harness.stream_kernel import StreamKernel

SIZE = 64 * 1024 * 1024
#: device buffers on a discrete/integrated GPU: well past any L2/"infinity" cache (H200: 50 MB
#: L2, MI300: 256 MB), so the copy and the streaming kernel see device memory, not cache.
#: CPU adapters keep `size` (their memory is the host's, and they are slow).
GPU_SIZE = 256 * 1024 * 1024
REPEATS = 5
#: timestamped figures: repetitions in one timed pass, trials (best kept), warm-up seconds
TS_REPS = {"gpu": 8, "cpu": 2}
TS_TRIALS = {"gpu": 5, "cpu": 3}
TS_WARMUP_S = {"gpu": 0.3, "cpu": 0.0}

def record(out: dict, name: str, value, bound: float, method: str, why: str = "") -> None:
    """Set out[name_gbps] (a checked number or None), out[name_method] and, for None,
    out[name_reason]. `why`: the reason when `value` is None (nothing measured)."""
    v, bad = (None, why or "not measured") if value is None else checked_gbps(value, bound)
    out[f"{name}_gbps"] = v
    out[f"{name}_method"] = method
    if v is None:
        out[f"{name}_reason"] = f"{bad} [{method}]"


def _best_gbps(nbytes: int, fn, repeats: int = REPEATS) -> float:
    fn()  # first touch / pipeline warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t0)
    return nbytes / max(best, 1)  # bytes per ns == GB/s


def _slope_gbps(nbytes: int, run_n, n: int = 8, repeats: int = 3) -> tuple[float | None, str]:
    """Bandwidth of work submitted n times in one go, less the one-off cost of a submit and
    its wait: (n-1)·bytes / (t(n) - t(1)), or (None, why) when the difference is lost in the
    noise of t(1) (work this short needs GPU timestamps). A step's kernels run back to back
    in one submit, so this is the rate they can reach; the fixed overhead is measured by the
    step itself."""
    run_n(1)  # pipeline warm-up, first touch

    def times(k: int) -> list[int]:
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            run_n(k)
            out.append(time.perf_counter_ns() - t0)
        return out

    one, many = times(1), times(n)
    diff = min(many) - min(one)
    noise = max(one) - min(one)
    if diff <= 0 or diff <= noise:
        return None, (f"wall-clock slope lost in timer noise: t({n}) - t(1) = {diff / 1e3:.1f} µs, "
                      f"t(1) spread {noise / 1e3:.1f} µs")
    return (n - 1) * nbytes / diff, ""


def _timestamp_gbps(nbytes: int, timed: Callable[[], tuple[int, int]], trials: int,
                    warmup_s: float = 0.0) -> tuple[float | None, str]:
    """nbytes over the shortest GPU interval of `trials` runs of `timed`, which returns
    (GPU ns between its two timestamps, wall ns of its submit and wait). Runs `timed` for
    `warmup_s` seconds first (at least once) so clocks ramp up. A trial whose timestamps go
    backwards, or span more than its own wall time (ticks that are not nanoseconds), is
    discarded; (None, why) if none is left."""
    end = time.perf_counter() + warmup_s
    timed()
    while time.perf_counter() < end:
        timed()
    best, why = None, ""
    for _ in range(trials):
        gpu, wall = timed()
        if gpu <= 0:
            why = f"timestamps did not advance ({gpu} ns)"
        elif gpu > wall * 1.01:
            why = (f"timestamp interval {gpu} ns exceeds the submit's wall time {wall} ns "
                   "(timestamps not in nanoseconds)")
        else:
            best = gpu if best is None else min(best, gpu)
    if best is None:
        return None, why
    return nbytes / best, ""


def host_bandwidth(size: int = SIZE) -> dict:
    """NumPy copy of `size` bytes: reads and writes it, so 2·size bytes move."""
    src = np.ones(size // 4, np.float32)
    dst = np.empty_like(src)
    out = {"size_bytes": size}
    record(out, "copy", _best_gbps(2 * size, lambda: np.copyto(dst, src)), MEMORY_MAX_GBPS,
           "wall best-of")
    return out


def host_gemv_bandwidth(working_set: int) -> dict:
    """A float32 matrix-vector product (NumPy's BLAS, all cores) over a matrix the size of
    the preset's weights, capped at 1 GiB: the work a CPU decode step is, with the step's own
    cache residency (a 17 MB model re-read every step lives in the CPU's caches, which a
    64 MiB copy does not see)."""
    cols = 1024
    rows = max(min(working_set, 2**30) // (4 * cols), 64)
    m = np.full((rows, cols), 0.5, np.float32)
    v = np.full(cols, 0.5, np.float32)
    out = {"gemv_bytes": m.nbytes}
    record(out, "gemv", _best_gbps(m.nbytes, lambda: m @ v), MEMORY_MAX_GBPS, "wall best-of")
    return out




class WgpuBandwidthProbe:
    """The wgpu figures of one adapter (see the module's docstring), on a device of its own.

    Device buffers are `size` bytes on a CPU adapter and max(size, gpu_size) elsewhere, within
    the adapter's limits; the host link moves as many bytes as the device buffers on a GPU,
    `size` on a CPU adapter. `timestamps=False` forces the wall-clock slope. Copies are
    bracketed by timestamps written on the encoder where the adapter has
    'timestamp-query-inside-encoders', else (or with `copy_timestamps="passes"`) by two empty
    timestamped passes. Its buffers and the host link's staging are freed by `close()` (or
    leaving a `with` block) whether or not the measurement finished.
    """

    def __init__(self, adapter: Any, size: int = SIZE, gpu_size: int = GPU_SIZE,
                 timestamps: bool = True, copy_timestamps: str = "auto") -> None:
        self.summary = adapter.summary
        self.kind = "cpu" if is_cpu_adapter(adapter) else "gpu"
        feats = set(adapter.features)
        self.ts_why = ("timestamps not requested" if not timestamps else
                       "adapter has no 'timestamp-query'" if "timestamp-query" not in feats
                       else "")
        required = []
        if not self.ts_why:
            required.append("timestamp-query")
            if "timestamp-query-inside-encoders" in feats and copy_timestamps != "passes":
                required.append("timestamp-query-inside-encoders")
        lim = adapter.limits
        want = {k: lim[k] for k in ("max-buffer-size", "max-storage-buffer-binding-size") if k in lim}
        self._owned: list[Any] = []  # destroyed by close(), last made first
        self._link: HostLink | None = None
        try:
            # the device itself is let go of, not destroyed: wgpu's OpenGL backend aborted a
            # later submit in the process after a device.destroy() here
            self.device = adapter.request_device_sync(required_features=required,
                                                      required_limits=want)
            self._allocate(size, gpu_size)
        except BaseException:
            self.close()
            raise

    def _own(self, thing: Any) -> Any:
        self._owned.append(thing)
        return thing

    def _allocate(self, size: int, gpu_size: int) -> None:
        import wgpu

        BU = wgpu.BufferUsage
        device = self.device
        dev_size = size if self.kind == "cpu" else max(size, gpu_size)
        dev_size = min(dev_size, int(device.limits.get("max-storage-buffer-binding-size", dev_size)),
                       int(device.limits.get("max-buffer-size", dev_size)))
        self.dev_size = dev_size - dev_size % 16
        # the host link at the device size on a GPU: transfers the size a stateless page makes,
        # too large for a server's last-level cache (docs/measuring.md, "Bandwidths, floors
        # and MBU", has what smaller ones measured)
        link = self.dev_size if self.kind == "gpu" else min(size, self.dev_size)
        self.link_bytes = link - link % 16
        self.host = np.ones(self.link_bytes // 4, np.float32)
        self.sink = np.empty_like(self.host)  # the page's own array (readTensor(tensor, outputData))
        usage = BU.STORAGE | BU.COPY_SRC | BU.COPY_DST
        self.a = self._own(device.create_buffer(size=self.dev_size, usage=usage))
        self.b = self._own(device.create_buffer(size=self.dev_size, usage=usage))
        self.fence = self._own(device.create_buffer(size=16, usage=BU.COPY_SRC | BU.COPY_DST))
        self._link = HostLink(device, max_bytes=self.dev_size)
        self.encode_stream = StreamKernel(device, self.a, self.b, self.dev_size).encode

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
        while self._owned:
            self._owned.pop().destroy()

    def __enter__(self) -> WgpuBandwidthProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the timed work (each runs `times` repetitions and waits for the device) -------------

    def wait(self) -> None:
        # reading 16 bytes back waits for all submitted work (portable across wgpu-py versions,
        # unlike on_submitted_work_done_sync)
        self.device.queue.read_buffer(self.fence, 0, 16)

    def upload(self, times: int = 1) -> None:
        """As the WebNN context writes a large tensor between two dispatches: staged in a
        mapped arena, then copied (queue.write_buffer stages into fresh memory every call)."""
        for _ in range(times):
            self._link.write(self.a, self.host)
        self.wait()

    def download(self, times: int = 1) -> None:
        """As the WebNN context reads tensors into a page's arrays: a copy into persistent
        staging, one map, a copy out into an array that exists."""
        for _ in range(times):
            self._link.read_into(self.a, self.sink)

    def encode_copies(self, enc: Any, times: int) -> None:
        for _ in range(times):
            enc.copy_buffer_to_buffer(self.a, 0, self.b, 0, self.dev_size)

    def copy(self, times: int = 1) -> None:
        enc = self.device.create_command_encoder()
        self.encode_copies(enc, times)
        self.device.queue.submit([enc.finish()])
        self.wait()

    def stream(self, times: int = 1) -> None:
        enc = self.device.create_command_encoder()
        self.encode_stream(enc, times)
        self.device.queue.submit([enc.finish()])
        self.wait()

    # -- the figures --------------------------------------------------------------------------

    def timestamped(self) -> tuple[dict[str, tuple[float | None, str]], str]:
        """({"stream"|"d2d": (GB/s or None, why)}, how they were timed) from GPU timestamps;
        raises where the timestamps themselves fail."""
        import wgpu
        from wgpu.backends.wgpu_native.extras import write_timestamp

        device, queue = self.device, self.device.queue
        reps, trials = TS_REPS[self.kind], TS_TRIALS[self.kind]
        # the query set is left to the garbage collector: wgpu-py's destroy() drops it at
        # once, and on wgpu's OpenGL backend a later write on another device then aborts
        qs = device.create_query_set(type="timestamp", count=2)
        qbuf = self._own(device.create_buffer(
            size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC))

        def timed(encode: Callable[[Any], None]) -> Callable[[], tuple[int, int]]:
            def run() -> tuple[int, int]:
                enc = device.create_command_encoder()
                encode(enc)
                enc.resolve_query_set(qs, 0, 2, qbuf, 0)
                cmd = enc.finish()
                t0 = time.perf_counter_ns()
                queue.submit([cmd])
                t = np.frombuffer(queue.read_buffer(qbuf, 0, 16), np.uint64)
                return int(t[1]) - int(t[0]), time.perf_counter_ns() - t0
            return run

        stream_ts = timed(lambda enc: self.encode_stream(enc, reps, {
            "query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}))
        on_encoder = "timestamp-query-inside-encoders" in device.features

        def bracket_copies(enc: Any) -> None:
            if on_encoder:
                write_timestamp(enc, qs, 0)
                self.encode_copies(enc, reps)
                write_timestamp(enc, qs, 1)
            else:  # an empty pass ending at timestamp 0, the copies, one beginning at 1
                enc.begin_compute_pass(timestamp_writes={
                    "query_set": qs, "end_of_pass_write_index": 0}).end()
                self.encode_copies(enc, reps)
                enc.begin_compute_pass(timestamp_writes={
                    "query_set": qs, "beginning_of_pass_write_index": 1}).end()

        moved = 2 * self.dev_size * reps
        # the stream first: its warm-up ramps the clocks for both
        figures = {"stream": _timestamp_gbps(moved, stream_ts, trials, TS_WARMUP_S[self.kind]),
                   "d2d": _timestamp_gbps(moved, timed(bracket_copies), trials)}
        how = (f"{reps} repetitions between two GPU timestamps (copies "
               f"{'bracketed on the encoder' if on_encoder else 'between two empty passes'}"
               f"), best of {trials} trials after a warm-up")
        return figures, how

    def measure(self) -> dict:
        out: dict = {"adapter": self.summary, "adapter_type": self.kind,
                     "size_bytes": self.dev_size, "link_bytes": self.link_bytes}
        measured: dict[str, tuple[float | None, str]] = {}
        ts_why = self.ts_why
        if not ts_why:
            try:
                measured, out["timestamps"] = self.timestamped()
            except Exception as exc:  # noqa: BLE001 - timestamps are an improvement, not a need
                ts_why = f"timestamps failed: {' '.join(str(exc).split())[:200]}"
        if ts_why:
            out["timestamps"] = ts_why
        slope = "wall slope"
        for name, run_n in (("stream", self.stream), ("d2d", self.copy)):
            gbps, why = measured.get(name, (None, ts_why))
            method = "timestamps"
            if gbps is not None:
                gbps, bad = checked_gbps(gbps, WGPU_BOUNDS[name])
                why = bad and f"{bad} [timestamps]"
            if gbps is None:  # no usable timestamps for this one: the wall-clock slope
                out[f"{name}_timestamp_reason"] = why
                gbps, why = _slope_gbps(2 * self.dev_size, run_n)
                method = slope
            record(out, name, gbps, WGPU_BOUNDS[name], method, why)
        gbps, why = _slope_gbps(self.link_bytes, self.upload)
        record(out, "h2d", gbps, WGPU_BOUNDS["h2d"], slope, why)
        gbps, why = _slope_gbps(self.link_bytes, self.download)
        record(out, "d2h", gbps, WGPU_BOUNDS["d2h"], slope, why)
        out["method"] = ("stream/d2d: GPU timestamps where available, else wall slope over 1 vs 8 "
                         "in one submit; h2d: wall slope of mapped-staging writes and copies; d2h: "
                         "wall slope of copies to a staging buffer, map-reads and copies into one "
                         "host array (both the WebNN context's own paths)")
        return out


def wgpu_bandwidth(size: int = SIZE, gpu_size: int = GPU_SIZE, timestamps: bool = True,
                   copy_timestamps: str = "auto") -> dict:
    """The wgpu figures of this process's adapter (`WgpuBandwidthProbe`), or {"reason": why
    there is none}. Call it in a child process (`harness.wgpu_probe`) where a driver crash
    must not end the caller."""
    adapter, why = wgpu_adapter()
    if adapter is None:
        return {"reason": why}
    with WgpuBandwidthProbe(adapter, size, gpu_size, timestamps, copy_timestamps) as probe:
        return probe.measure()
