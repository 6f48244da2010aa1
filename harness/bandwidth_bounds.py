"""The physical bounds a bandwidth figure is checked against (``checked_gbps``), apart from
the measurement (``harness.bandwidth``) so that reading and comparing recorded figures (the
gate, the metrics) needs no WebGPU device code."""

from __future__ import annotations

import math

#: physical bounds (GB/s) no real measurement can exceed; above them a figure is a timing
#: artefact. Device memory: the fastest HBM shipping is ~8 TB/s (B200), so 20 TB/s leaves
#: room; a host link: PCIe 6.0 x16 is 128 GB/s a direction, and write_buffer / map-read also
#: pass through a host memcpy.
MEMORY_MAX_GBPS = 20_000.0
LINK_MAX_GBPS = 200.0
#: the bound of each wgpu figure
WGPU_BOUNDS = {"h2d": LINK_MAX_GBPS, "d2h": LINK_MAX_GBPS, "d2d": MEMORY_MAX_GBPS,
               "stream": MEMORY_MAX_GBPS}


def checked_gbps(value, bound: float) -> tuple[float | None, str]:
    """(value, "") when `value` GB/s can be a real bandwidth under `bound` GB/s, else
    (None, why not): not a number, not finite, not positive, or above the bound."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None, f"not a number ({value!r})"
    if not math.isfinite(v):
        return None, f"not finite ({v})"
    if v <= 0:
        return None, f"not positive ({v:g} GB/s)"
    if v > bound:
        return None, (f"{v:.4g} GB/s is above the physical bound of {bound:g} GB/s "
                      "(a timing artefact)")
    return round(v, 3) or v, ""
