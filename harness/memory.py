"""Sizes no machine here can hold are refused before anything is allocated or written.

A context or capacity typed with a few zeros too many (`--contexts 99999999`) would
otherwise allocate until the kernel kills the run, or swap for hours. The estimates are
lower bounds from the preset's shapes (Python integers: no overflow at 10**12), compared
with the machine's physical memory: a refusal means the run cannot fit, never that it
might not.
"""

from __future__ import annotations

import math
import os

from model.errors import UserError
from model.workload import ModelConfig, cache_specs


def host_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return pages * size if pages > 0 and size > 0 else None


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


def gib(n: int) -> str:
    """A byte count for a message: GiB up to a thousand, then TiB, PiB, ..."""
    value, unit = n / 2**30, "GiB"
    for bigger in ("TiB", "PiB", "EiB"):
        if value < 1000:
            break
        value, unit = value / 1024, bigger
    return f"{value:,.1f} {unit}"


def require(need: int, what: str, hint: str = "use a smaller size",
            have: int | None = None) -> None:
    """UserError when `need` bytes exceed the machine's memory (`have`: physical memory)."""
    have = host_memory_bytes() if have is None else have
    if have is not None and need > have:
        raise UserError(f"{what} needs at least {gib(need)} of memory and this machine has "
                        f"{gib(have)}; {hint}")
