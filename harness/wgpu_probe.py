"""The wgpu adapter, and its bandwidths, asked for in a child process.

A driver can abort the process that enumerates adapters: Mesa's OpenGL driver with a bad
GLSL version override panics inside wgpu-native, where Rust cannot unwind (SIGABRT, no
Python exception). So the sweep's parent and `statebench backends` never ask wgpu
themselves: `probe_wgpu()` runs `python -m harness.wgpu_probe`, and a crash there becomes a
reason that marks the wgpu backends unavailable while everything else goes on.

The child reads {"bandwidth_size": bytes or null} on stdin and writes one JSON line with the
adapter record ({"adapter": ...}, the environment's `wgpu` entry), then, when asked, one with
the calibration's figures ({"bandwidth": ...}), so a crash while measuring keeps the adapter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from harness import child

#: the child's time limit: a 256 MB calibration on a CPU adapter takes tens of seconds
PROBE_TIMEOUT_S = 900.0
#: backend APIs on which the wgpu backends have every feature they use; on OpenGL wgpu has
#: no 'shader-f16' (float16 caches) and no subgroups
NATIVE_BACKEND_TYPES = ("Vulkan", "Metal", "D3D12")


@dataclass(frozen=True)
class WgpuProbe:
    """What the child found. `adapter`: {"adapter": summary, "features", "info"} or
    {"adapter": None, "reason"}; `bandwidth`: the wgpu calibration figures (or {"reason"})
    when they were asked for, else None."""

    adapter: dict
    bandwidth: dict | None = None

    @property
    def available(self) -> tuple[bool, str]:
        """(True, "") where wgpu has an adapter, else (False, why not)."""
        if self.adapter.get("adapter") is None:
            return False, str(self.adapter.get("reason") or "wgpu has no adapter")
        return True, ""

    def refuses(self, backend: type) -> str:
        """Why `backend` (a Backend class) is unavailable here without asking wgpu itself: this
        probe's reason where it found no adapter and the backend asks for one, else ""."""
        return self.available[1] if backend.uses_wgpu_adapter else ""

    @property
    def backend_type(self) -> str | None:
        """The adapter's backend API (Vulkan, Metal, D3D12, OpenGL), None without one."""
        return (self.adapter.get("info") or {}).get("backend_type")

    @property
    def warning(self) -> str:
        """Why the wgpu backends run short here ("" where the backend API is native)."""
        kind = self.backend_type
        if kind is None or kind in NATIVE_BACKEND_TYPES:
            return ""
        return (f"wgpu's adapter runs on {kind}, not Vulkan/Metal/D3D12: no 'shader-f16' "
                "(float16 caches) or subgroups; install a Vulkan driver (Debian: apt-get "
                "install mesa-vulkan-drivers, or ./statebench.sh as root)")


def probe_wgpu(bandwidth_size: int | None = None,
               timeout_s: float = PROBE_TIMEOUT_S) -> WgpuProbe:
    """The adapter record and, with `bandwidth_size`, the wgpu calibration at that size
    (`bandwidth.wgpu_bandwidth`), from a child process; never raises for the child's sake."""
    want = bandwidth_size is not None
    try:
        proc = child.run_module("harness.wgpu_probe", {"bandwidth_size": bandwidth_size},
                                timeout_s)
    except subprocess.TimeoutExpired:
        why = f"wgpu adapter probe timed out after {timeout_s:.0f} s"
        return WgpuProbe({"adapter": None, "reason": why}, {"reason": why} if want else None)
    found: dict = {}
    for line in proc.stdout.splitlines():
        try:
            found.update(json.loads(line))
        except (ValueError, TypeError):
            continue  # a driver's own chatter on stdout
    crash = "" if proc.returncode == 0 else child.exit_reason("wgpu adapter probe", proc)
    adapter = found.get("adapter")
    if not isinstance(adapter, dict):
        adapter = {"adapter": None, "reason": crash or "wgpu adapter probe sent no adapter record"}
    bandwidth = found.get("bandwidth")
    if want and not isinstance(bandwidth, dict):
        bandwidth = {"reason": f"calibration failed: {crash or 'wgpu adapter probe sent no figures'}"}
    return WgpuProbe(adapter, bandwidth if want else None)


def adapter_record() -> dict:
    """This process's adapter, as the environment records it."""
    from backends.webnn.adapter import wgpu_adapter

    adapter, why = wgpu_adapter()
    if adapter is None:
        return {"adapter": None, "reason": why}
    info = dict(adapter.info) if hasattr(adapter, "info") else {}
    return {"adapter": adapter.summary, "features": sorted(adapter.features),
            "info": {k: str(v) for k, v in info.items()}}


def main() -> int:
    req = json.loads(sys.stdin.read() or "{}")
    record = adapter_record()
    print(json.dumps({"adapter": record}), flush=True)
    size = req.get("bandwidth_size")
    if size is not None:
        from harness.bandwidth import wgpu_bandwidth

        if record["adapter"] is None:
            figures = {"reason": record["reason"]}
        else:
            try:
                figures = wgpu_bandwidth(int(size))
            except Exception as exc:  # noqa: BLE001 - a broken device loses its own figures only
                figures = {"reason": f"calibration failed: {' '.join(str(exc).split())[:200]}"}
        print(json.dumps({"bandwidth": figures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
