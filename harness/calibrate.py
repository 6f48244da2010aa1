"""Bandwidth calibration for floors (DESIGN §7) and the run's environment record.

Measured once at the start of a run: host memory bandwidth (a NumPy copy) for CPU backends;
through wgpu, where an adapter exists, host→device (write_buffer), device→host (map-read),
device→device (copy_buffer_to_buffer) and a streaming compute kernel (read + write).
Figures are GB/s (1e9 bytes/s), best of a few repetitions: a floor is a bound, so the fastest
observation is the honest one.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from backends.adapter import wgpu_adapter

SIZE = 64 * 1024 * 1024
REPEATS = 5

STREAM_WGSL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = gid.x + gid.y * n.x * 256u;
    if (i < arrayLength(&dst)) { dst[i] = src[i] * 1.0001; }
}
"""


def _best_gbps(nbytes: int, fn, repeats: int = REPEATS) -> float:
    fn()  # first touch / pipeline warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t0)
    return nbytes / max(best, 1)  # bytes per ns == GB/s


def _slope_gbps(nbytes: int, run_n, n: int = 8, repeats: int = 3) -> float:
    """Bandwidth of work submitted n times in one go, less the one-off cost of a submit and
    its wait: (n-1)·bytes / (t(n) - t(1)). A step's kernels run back to back in one submit,
    so this is the rate they can reach; the fixed overhead is measured by the step itself."""
    run_n(1)  # pipeline warm-up, first touch

    def best(k: int) -> int:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            run_n(k)
            times.append(time.perf_counter_ns() - t0)
        return min(times)

    return (n - 1) * nbytes / max(best(n) - best(1), 1)


def host_bandwidth(size: int = SIZE) -> dict:
    """NumPy copy of `size` bytes: reads and writes it, so 2·size bytes move."""
    src = np.ones(size // 4, np.float32)
    dst = np.empty_like(src)
    return {"copy_gbps": round(_best_gbps(2 * size, lambda: np.copyto(dst, src)), 3),
            "size_bytes": size}


def host_gemv_bandwidth(working_set: int) -> dict:
    """A float32 matrix-vector product (NumPy's BLAS, all cores) over a matrix the size of
    the preset's weights, capped at 1 GiB: the work a CPU decode step is, with the step's own
    cache residency (a 17 MB model re-read every step lives in the CPU's caches, which a
    64 MiB copy does not see)."""
    cols = 1024
    rows = max(min(working_set, 2**30) // (4 * cols), 64)
    m = np.full((rows, cols), 0.5, np.float32)
    v = np.full(cols, 0.5, np.float32)
    return {"gemv_gbps": round(_best_gbps(m.nbytes, lambda: m @ v), 3), "gemv_bytes": m.nbytes}


def adapter_summary() -> dict:
    adapter, why = wgpu_adapter()
    if adapter is None:
        return {"adapter": None, "reason": why}
    info = dict(adapter.info) if hasattr(adapter, "info") else {}
    return {"adapter": adapter.summary, "features": sorted(adapter.features),
            "info": {k: str(v) for k, v in info.items()}}


def wgpu_bandwidth(size: int = SIZE) -> dict:
    adapter, why = wgpu_adapter()
    if adapter is None:
        return {"reason": why}
    import wgpu

    BU = wgpu.BufferUsage
    device = adapter.request_device_sync()
    queue = device.queue
    size = min(size, int(adapter.limits.get("max-storage-buffer-binding-size", size)))
    size -= size % 16
    host = np.ones(size // 4, np.float32)
    a = device.create_buffer(size=size, usage=BU.STORAGE | BU.COPY_SRC | BU.COPY_DST)
    b = device.create_buffer(size=size, usage=BU.STORAGE | BU.COPY_SRC | BU.COPY_DST)
    readback = device.create_buffer(size=size, usage=BU.MAP_READ | BU.COPY_DST)
    fence = device.create_buffer(size=16, usage=BU.COPY_SRC | BU.COPY_DST)

    def wait():
        # reading 16 bytes back waits for all submitted work (portable across wgpu-py versions,
        # unlike on_submitted_work_done_sync)
        queue.read_buffer(fence, 0, 16)

    def upload(times: int = 1):
        for _ in range(times):
            queue.write_buffer(a, 0, host)
        wait()

    def copy(src=a, dst=b, times: int = 1):
        enc = device.create_command_encoder()
        for _ in range(times):
            enc.copy_buffer_to_buffer(src, 0, dst, 0, size)
        queue.submit([enc.finish()])
        wait()

    copy(a, readback)

    def download():
        readback.map_sync(wgpu.MapMode.READ)
        readback.read_mapped(copy=True)
        readback.unmap()

    shader = device.create_shader_module(code=STREAM_WGSL)
    pipeline = device.create_compute_pipeline(layout="auto",
                                              compute={"module": shader, "entry_point": "main"})
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": a, "offset": 0, "size": size}},
        {"binding": 1, "resource": {"buffer": b, "offset": 0, "size": size}},
    ])
    groups = -(-(size // 16) // 256)
    gx = min(groups, 65535)
    gy = -(-groups // gx)

    def stream(times: int = 1):
        enc = device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, group)
        for _ in range(times):
            cp.dispatch_workgroups(gx, gy, 1)
        cp.end()
        queue.submit([enc.finish()])
        wait()

    out = {
        "adapter": adapter.summary,
        "size_bytes": size,
        "h2d_gbps": round(_slope_gbps(size, upload), 3),
        "d2h_gbps": round(_best_gbps(size, download), 3),
        "d2d_gbps": round(_slope_gbps(2 * size, lambda k: copy(times=k)), 3),
        "stream_gbps": round(_slope_gbps(2 * size, stream), 3),
        "method": "h2d/d2d/stream: slope over 1 vs 8 in one submit; d2h: best of 5 map-reads",
    }
    for buf in (a, b, readback, fence):
        buf.destroy()
    return out


def calibrate(need_gpu: bool = True, size: int = SIZE, working_set: int | None = None) -> dict:
    """Bandwidths for the floors; a failing device only loses its own figures, with the reason.
    `working_set`: the weights' bytes, for the host matrix-vector figure CPU floors use."""
    cal: dict = {"host": host_bandwidth(size)}
    if working_set:
        cal["host"].update(host_gemv_bandwidth(working_set))
    if need_gpu:
        try:
            cal["wgpu"] = wgpu_bandwidth(size)
        except Exception as exc:  # noqa: BLE001 - a broken device must not stop the sweep
            cal["wgpu"] = {"reason": f"calibration failed: {' '.join(str(exc).split())[:200]}"}
    return cal


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _ort_devices() -> list[str] | str:
    try:
        import onnxruntime as ort

        if hasattr(ort, "get_ep_devices"):
            return [f"{d.ep_name}: {getattr(d.device, 'type', '')} "
                    f"{getattr(d.device, 'vendor', '')}".strip() for d in ort.get_ep_devices()]
        return list(ort.get_available_providers())
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc}"


def environment(calibration: dict | None = None, with_adapter: bool = True) -> dict:
    """Where the run happened (DESIGN §9): interpreter, CPU, packages, adapter, ORT, commit."""
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu(),
        "cpu_count": os.cpu_count(),
        "packages": {p: _version(p) for p in ("numpy", "onnx", "onnxruntime", "wgpu", "rich",
                                              "onnxruntime-ep-webgpu")},
        "ort_ep_devices": _ort_devices(),
        "git_commit": _git_commit(),
        "calibration": calibration or {},
    }
    env["wgpu"] = adapter_summary() if with_adapter else {"adapter": None, "reason": "not queried"}
    return env
