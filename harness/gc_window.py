"""CPython's garbage collector around a point's timed steps (``details.gc_timed``).

A page in a browser runs no CPython collector, but the worker measuring it does: a full
collection scans every tracked object the process holds (the converted graph, its plan, the
ONNX wrappers), and it fires after a count of allocations, so at the same step of every
process: a candidate cause (docs/measuring.md) of the one 35–39 ms step at timed step 11 or
12 of the H200's stateful llama-1b points of 2026-12-01 (issue 32). So before the warm-up
steps the worker collects once and freezes what setup made (``gc.freeze``: a later
collection skips it), and counts the collections inside the timed steps and their time, so
a stall the collector makes is named in the point, not guessed.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_setup() -> None:
    """Collect what setup left and freeze the survivors (a later collection skips them)."""
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Undo ``freeze_setup`` after a point (``--inprocess`` measures many in one process: a
    closed backend's cycles must be collectable again)."""
    gc.unfreeze()


@contextmanager
def setup_frozen() -> Iterator[None]:
    """``freeze_setup`` for a block, ``thaw`` after it (the speculative worker's timed
    decodes)."""
    freeze_setup()
    try:
        yield
    finally:
        thaw()


class GcWindow:
    """Collections (per generation) and their wall time from ``start`` to ``stop``."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.ms = 0.0
        self.max_ms = 0.0
        self.frozen = gc.get_freeze_count()  # what ``freeze_setup`` froze, if it ran
        self._t0 = 0.0

    @classmethod
    def start(cls) -> GcWindow:
        """Count from now."""
        w = cls()
        gc.callbacks.append(w._on_gc)
        return w

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        ms = (time.perf_counter() - self._t0) * 1e3
        self.counts[min(int(info.get("generation", 0)), 2)] += 1
        self.ms += ms
        self.max_ms = max(self.max_ms, ms)

    def stop(self) -> dict:
        """Stop counting (idempotent) and give {collections: [gen0, gen1, gen2], ms, max_ms,
        frozen}."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        return {"collections": list(self.counts), "ms": round(self.ms, 3),
                "max_ms": round(self.max_ms, 3), "frozen": self.frozen}
