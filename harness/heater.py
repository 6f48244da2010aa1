"""Raise the GPU's clocks before a point is timed (FINDINGS 16).

A GPU's clock governor raises the clock only under sustained load. On the H200
(`results/h200/2026-11-29-6d7dec3/nvidia-smi-call3.csv.gz`, sampled every 250 ms) the SM clock idles at
345 MHz and reaches 1980 MHz within half a second of continuous work. Under bursty work it
crawls: a reuse page stepping in bursts, with its 1 GB cache rewritten from the host
between them, reached only 1095 MHz, and its graph took 7.2 ms of GPU time where the kernel
bench, stepping continuously, measured 5.0 ms with the same copy kernel. A page-owned cache
is written, not walked, so its timed steps would start on a cold GPU. Before its warm-up
steps, every point that runs on a GPU therefore gets the same continuous load for the same
time: a streaming kernel, back to back. The clock belongs to the chip, so this serves wgpu
and ORT's WebGPU EP alike. A CPU adapter has no such clock, so nothing runs there.
"""

from __future__ import annotations

import time

from backends.webnn.adapter import is_cpu_adapter, wgpu_adapter
from harness.stream_kernel import StreamKernel

#: bytes read and written per dispatch on a GPU (past a 50 MB L2) and on a CPU adapter (tests)
GPU_BYTES = 64 << 20
CPU_BYTES = 64 << 10
#: dispatches per submit: ~3 ms of work at 3 TB/s, so the wait between submits is a few %
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
