"""Raise the GPU's clocks before a point is timed (FINDINGS 16).

A GPU's clock governor raises the clock only under sustained load, and a page-owned cache is
written, not walked, so without this its timed steps would start on a cold GPU (the clocks
and times measured on the H200 are in FINDINGS 16 and docs/measuring.md, "A point"). Before
its warm-up steps, every point that runs on a GPU therefore gets the same continuous load for
the same time: a streaming kernel, back to back. The clock belongs to the chip, so this serves
wgpu and ORT's WebGPU EP alike. A CPU adapter has no such clock, so nothing runs there.
"""

from __future__ import annotations

import time

from backends.webnn.adapter import is_cpu_adapter, wgpu_adapter
from harness.stream_kernel import StreamKernel

#: bytes read and written per dispatch on a GPU (past a 50 MB L2) and on a CPU adapter (tests)
GPU_BYTES = 64 << 20
CPU_BYTES = 64 << 10
#: dispatches per submit: 64 × 128 MiB moved, milliseconds of work at HBM rates, so the wait
#: between submits is a small share of the load
PER_SUBMIT = 64


def heat(seconds: float, on_cpu_adapter: bool = False) -> tuple[float, str]:
    """Keep the GPU busy for `seconds`; returns (seconds of load, "") or (0, why none ran).
    `on_cpu_adapter` runs it on a CPU adapter as well (tests)."""
    if seconds <= 0:
        return 0.0, "no time asked"
    adapter, why = wgpu_adapter()
    if adapter is None:
        return 0.0, why
    cpu = is_cpu_adapter(adapter)
    if cpu and not on_cpu_adapter:
        return 0.0, "a CPU adapter has no GPU clock to raise"
    try:
        return _run(adapter, CPU_BYTES if cpu else GPU_BYTES, seconds), ""
    except Exception as exc:  # noqa: BLE001 - a warm-up that fails must not cost the point
        return 0.0, f"heater failed: {' '.join(str(exc).split())[:200]}"


def _run(adapter, nbytes: int, seconds: float) -> float:
    """The streaming kernel back to back on a device of its own; seconds it ran."""
    import wgpu

    device = adapter.request_device_sync()
    try:
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        src, dst = (device.create_buffer(size=nbytes, usage=usage) for _ in range(2))
        fence = device.create_buffer(size=16, usage=usage | wgpu.BufferUsage.COPY_DST)
        kernel = StreamKernel(device, src, dst, nbytes)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            enc = device.create_command_encoder()
            kernel.encode(enc, PER_SUBMIT)
            device.queue.submit([enc.finish()])
            device.queue.read_buffer(fence, 0, 16)  # waits for the submit (as calibrate does)
        return time.perf_counter() - t0
    finally:
        device.destroy()
