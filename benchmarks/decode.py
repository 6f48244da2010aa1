"""asv suites: a decode step per backend × context (DESIGN §7, §9).

`asv run --quick -E existing` runs these on the `tiny` preset at small depths; set
STATEBENCH_ASV_PRESET / STATEBENCH_ASV_CONTEXTS (e.g. `small`, `64,256,1024`) for bigger runs.
An unavailable backend raises NotImplementedError in setup, which asv records as skipped.
Byte counts are deterministic (counted, not timed), so `track_bytes_*` are exact series.
"""

from __future__ import annotations

import os

import numpy as np

from backends.base import DepthState, registry
from harness import calibrate, metrics
from harness.sources import NumpyReferenceWalk
from model.workload import Workload, make_weights, preset

PRESET = os.environ.get("STATEBENCH_ASV_PRESET", "tiny")
CONTEXTS = [int(c) for c in os.environ.get("STATEBENCH_ASV_CONTEXTS", "16,64").split(",")]
BACKENDS = sorted(registry())
WARMUP = 2
SPARE = 64  # steps a prepared backend can take before it must go back to depth


class DecodeSuite:
    """One decode step at depth `context` with `backend`; `tg 1 @ dL` in llama-bench's terms."""

    params = (BACKENDS, CONTEXTS)
    param_names = ["backend", "context"]
    timeout = 300
    # one step per sample, with depth reached in setup: asv's own warm-up loop would run the
    # cache past its capacity
    number = 1
    repeat = (5, 20, 10.0)
    warmup_time = 0

    def setup_cache(self):
        cfg = preset(PRESET)
        ahead = WARMUP + SPARE
        contexts = sorted(CONTEXTS)
        walk = NumpyReferenceWalk(cfg, make_weights(cfg), 0, contexts[-1] + ahead,
                                  contexts[-1] + ahead)
        depth = {c: walk.arrays_at(c, c + ahead, ahead) for c in contexts}
        need_gpu = any(not metrics.is_cpu(b) for b in BACKENDS)
        # the sweep's calibration size: the host link's figures are wall-clock slopes, and at
        # 16 MiB a loaded machine's timer noise hid them, so wgpu:stateless had no floor
        return {"depth": depth, "calibration": calibrate.calibrate(need_gpu)}

    def setup(self, cache, backend, context):
        cls = registry()[backend]
        ok, why = cls.available()
        if not ok:
            raise NotImplementedError(why)
        arrays = cache["depth"][context]
        self.cfg = preset(PRESET)
        self.workload = Workload.build(self.cfg)
        self.tokens = arrays["tokens"]
        self.depth = DepthState(tokens=self.tokens[:context].copy(), cache={
            k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("cache:")})
        self.context, self.capacity = context, context + WARMUP + SPARE
        self.calibration = cache["calibration"]
        self.backend = cls()
        self.backend.prepare(self.workload, self.capacity)
        self._to_depth()

    def _to_depth(self):
        self.backend.reach_depth(self.depth)
        for i in range(WARMUP):
            self.backend.step(int(self.tokens[self.context + i]))
        self.taken = 0

    def _step(self):
        if self.taken == SPARE:
            self._to_depth()
        token = int(self.tokens[self.context + WARMUP + self.taken])
        self.taken += 1
        return self.backend.step(token)

    def teardown(self, cache, backend, context):
        if getattr(self, "backend", None) is not None:
            self.backend.close()

    def time_decode_step(self, cache, backend, context):
        self._step()

    def _bytes(self, category):
        self.backend.counters.reset()
        self._step()
        return getattr(self.backend.counters, category)

    def track_bytes_h2d(self, cache, backend, context):
        return self._bytes("h2d")

    def track_bytes_d2h(self, cache, backend, context):
        return self._bytes("d2h")

    def track_bytes_d2d(self, cache, backend, context):
        return self._bytes("d2d")

    def track_bytes_kernel(self, cache, backend, context):
        return self._bytes("kernel")

    track_bytes_h2d.unit = track_bytes_d2h.unit = "bytes"
    track_bytes_d2d.unit = track_bytes_kernel.unit = "bytes"

    def track_mbu(self, cache, backend, context):
        """Floor time over median step time (DESIGN §7). NaN (asv's n/a) where a bandwidth the
        floor needs was not calibrated: the device's streaming rate, and for host-cache
        backends (wgpu:stateless, ort-*:copy) the link's h2d and d2h too; the reason is
        written to stderr (`asv run --show-stderr`)."""
        import sys
        import time

        samples = []
        for _ in range(7):
            t0 = time.perf_counter_ns()
            self._step()
            samples.append((time.perf_counter_ns() - t0) / 1e6)
        floor, why = metrics.floor_ms(backend, self.cfg, self.workload.weights_bytes, context,
                                      self.capacity, self.calibration, self.backend.details)
        if floor is None:
            print(f"track_mbu {backend} @ {context}: no floor: {why}", file=sys.stderr)
            return float("nan")
        return floor / float(np.median(samples))

    track_mbu.unit = "fraction of floor"

    def peakmem_step(self, cache, backend, context):
        self._step()
