"""The collector around the timed steps (``harness/gc_window.py``): setup's objects frozen
out of later scans, and the collections inside a window counted by generation with their
time, as a point's ``gc_timed`` records them."""

from __future__ import annotations

import gc

from harness.gc_window import GcWindow, freeze_setup


def test_setup_frozen_and_collections_counted():
    keep = [[i] for i in range(5000)]  # setup's objects: tracked, long-lived
    freeze_setup()
    try:
        frozen = gc.get_freeze_count()
        assert frozen >= len(keep)
        w = GcWindow.start()
        gc.collect(0)
        gc.collect(2)
        w_seen = w.stop()
        assert w_seen["collections"][0] >= 1 and w_seen["collections"][2] >= 1
        assert w_seen["ms"] >= w_seen["max_ms"] > 0 and w_seen["frozen"] == frozen
        gc.collect(2)  # after stop: not counted, and stop again changes nothing
        assert w.stop() == w_seen
    finally:
        gc.unfreeze()


def test_a_window_with_no_collection_says_so():
    gc.collect()  # the allocation counts at zero: nothing below triggers a collection
    w = GcWindow.start()
    assert w.stop() == {"collections": [0, 0, 0], "ms": 0.0, "max_ms": 0.0, "frozen": 0}
