"""What the kernel generators need to know about the adapter (kernel variants per adapter;
backends/webnn/PERFORMANCE.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.webnn.adapter import is_cpu_adapter


@dataclass(frozen=True)
class Target:
    """``cpu``: a software adapter (llvmpipe, SwiftShader, WARP): invocations are SIMD lanes
    of a CPU thread, barriers are costly, one invocation per output column wins.
    ``subgroup``: the subgroup size when the device has the 'subgroup' feature enabled and
    the adapter reports one fixed size (NVIDIA: 32), else None (no subgroup ops).
    ``f16``: the device has 'shader-f16' enabled (float16 arithmetic in any kernel).
    ``device_barrier``: the engine's ``storageBarrier()`` has device scope
    (``engines.Engine.device_barrier``), so a workgroup may read what another wrote before
    an atomic hand-over (the last-workgroup combines' default)."""

    cpu: bool = False
    subgroup: int | None = None
    vendor: str = ""
    max_storage: int = 8  # storage buffers per shader stage (WebGPU's default limit)
    shared_bytes: int = 16384  # workgroup memory per workgroup (WebGPU's default limit)
    f16: bool = False
    device_barrier: bool = False


def target_of(adapter: Any, subgroups: bool, f16: bool = False,
              device_barrier: bool = False) -> Target:
    """``subgroups``: the device has the engine's subgroup feature enabled; ``f16``:
    'shader-f16'."""
    info = dict(adapter.info)
    cpu = is_cpu_adapter(adapter)
    sub = None
    if subgroups:
        # wgpu-py spells the keys "subgroup_*" (newer) or "stackgroup_*" (0.2x/0.3x)
        lo = info.get("subgroup_min_size", info.get("stackgroup_min_size"))
        hi = info.get("subgroup_max_size", info.get("stackgroup_max_size"))
        if lo and lo == hi:
            sub = int(lo)
        elif info.get("vendor_id") == 0x10DE and not cpu:
            sub = 32  # NVIDIA: warps are 32 wide (the adapter reports the API's 4..128)
    lim = adapter.limits
    return Target(cpu=cpu, subgroup=sub, vendor=str(info.get("vendor", "")),
                  max_storage=int(lim.get("max-storage-buffers-per-shader-stage", 8)),
                  shared_bytes=int(lim.get("max-compute-workgroup-storage-size", 16384)),
                  f16=f16, device_barrier=device_barrier)
