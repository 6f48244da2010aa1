"""What a run records about where it ran: the bandwidth calibration and the environment.

The calibration (DESIGN §7) is measured once at the start of a run by `harness.bandwidth`:
the host's figures here, the wgpu adapter's in a child process (`harness.wgpu_probe`), since
a driver can abort the process that asks it for an adapter. The environment record (DESIGN
§9) names the interpreter, CPU, packages, adapter, ORT devices and the code that ran.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path

from harness.bandwidth import SIZE, host_bandwidth, host_gemv_bandwidth
from harness.versions import package_version
from harness.wgpu_probe import WgpuProbe, probe_wgpu


def calibrate(need_gpu: bool = True, size: int = SIZE, working_set: int | None = None,
              probe: WgpuProbe | None = None) -> dict:
    """Bandwidths for the floors; a failing device only loses its own figures, with the reason.
    `working_set`: the weights' bytes, for the host matrix-vector figure CPU floors use.
    `probe`: a `probe_wgpu(bandwidth_size=...)` already made (the runner's, which also records
    the adapter); without one, a child measures the wgpu figures at `size` here."""
    cal: dict = {"host": host_bandwidth(size)}
    if working_set:
        cal["host"].update(host_gemv_bandwidth(working_set))
    if need_gpu:
        if probe is None or probe.bandwidth is None:
            probe = probe_wgpu(bandwidth_size=size)
        cal["wgpu"] = probe.bandwidth
    return cal


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_digest() -> str:
    """A hash of the project's Python sources and kernels: names the code that ran even
    where git metadata is stale or absent (a checkout copied to a GPU machine)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for folder in ("harness", "backends", "benchmarks", "scripts"):
        for path in sorted((root / folder).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


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


def provenance() -> dict:
    """The code a measurement ran: the git commit (may read stale on a copied checkout) and
    the source digest (always the code that ran). For scripts whose output is not a
    results file."""
    return {"git_commit": _git_commit(), "source_digest": source_digest()}


def _ort_devices() -> list[str] | str:
    try:
        import onnxruntime as ort

        if hasattr(ort, "get_ep_devices"):
            return [f"{d.ep_name}: {getattr(d.device, 'type', '')} "
                    f"{getattr(d.device, 'vendor', '')}".strip() for d in ort.get_ep_devices()]
        return list(ort.get_available_providers())
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc}"


def environment(calibration: dict | None = None, wgpu: dict | None = None) -> dict:
    """Where the run happened (DESIGN §9): interpreter, CPU, packages, adapter, ORT, commit.
    `wgpu`: the adapter record of a `probe_wgpu()` (None: the adapter was not queried)."""
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu(),
        "cpu_count": os.cpu_count(),
        "packages": {p: package_version(p) for p in ("numpy", "onnx", "onnxruntime", "wgpu",
                                                     "rich", "onnxruntime-ep-webgpu")},
        "ort_ep_devices": _ort_devices(),
        **provenance(),
        "calibration": calibration or {},
    }
    env["wgpu"] = wgpu if wgpu is not None else {"adapter": None, "reason": "not queried"}
    return env
