"""Sizes no machine here can hold are refused before anything is allocated or written.

A context or capacity typed with a few zeros too many (`--contexts 99999999`) would
otherwise allocate until the kernel kills the run, or swap for hours. The estimates are
lower bounds from the preset's shapes (Python integers: no overflow at 10**12), compared
with the memory available here: a refusal means the run cannot fit now, never that it
might not.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from harness.metrics import human_bytes
from model.errors import UserError
from model.workload import ModelConfig, cache_specs


def available_memory_bytes() -> int | None:
    """Memory a new allocation can have without swapping (Linux MemAvailable), else the
    machine's physical memory, else None (unknown: nothing is refused)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def state_bytes(cfg: ModelConfig, capacity: int, itemsize: int | None = None) -> int:
    """Bytes of the decode state (KV caches at `capacity` rows, recurrent states): in the
    graphs' data types, or all `itemsize` bytes an element (a float64 reference)."""
    total = 0
    for spec in cache_specs(cfg, 1):
        shape = list(spec.shape)
        if spec.kind == "append":
            shape[2] = capacity
        element = itemsize or (cfg.kv_bytes_per_element if spec.kind == "append" else 4)
        total += math.prod(shape) * element
    return total


def require(need: int, what: str, hint: str = "use a smaller size",
            have: int | None = None) -> None:
    """UserError when `need` bytes exceed the memory available (`have`, default
    `available_memory_bytes`)."""
    have = available_memory_bytes() if have is None else have
    if have is not None and need > have:
        raise UserError(f"{what} needs at least {human_bytes(need)} of memory, more than the "
                        f"{human_bytes(have)} available here; {hint}")
