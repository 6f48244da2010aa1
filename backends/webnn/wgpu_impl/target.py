"""What the kernel generators need to know about the adapter (kernel variants per adapter;
backends/webnn/PERFORMANCE.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """``cpu``: a software adapter (llvmpipe, SwiftShader, WARP): invocations are SIMD lanes
    of a CPU thread, barriers are costly, one invocation per output column wins.
    ``subgroup``: the subgroup size when the device has the 'subgroup' feature enabled and
    the adapter reports one fixed size (NVIDIA: 32), else None (no subgroup ops)."""

    cpu: bool = False
    subgroup: int | None = None
    vendor: str = ""


def target_of(adapter: Any, features: Any) -> Target:
    info = dict(adapter.info)
    cpu = str(info.get("adapter_type", "")).lower() == "cpu"
    sub = None
    if "subgroup" in features:
        # wgpu-py spells the keys "subgroup_*" (newer) or "stackgroup_*" (0.2x/0.3x)
        lo = info.get("subgroup_min_size", info.get("stackgroup_min_size"))
        hi = info.get("subgroup_max_size", info.get("stackgroup_max_size"))
        if lo and lo == hi:
            sub = int(lo)
        elif info.get("vendor_id") == 0x10DE and not cpu:
            sub = 32  # NVIDIA: warps are 32 wide (the adapter reports the API's 4..128)
    return Target(cpu=cpu, subgroup=sub, vendor=str(info.get("vendor", "")))
