"""Dispatching a built graph: bind groups, command buffers, submits, and recording ahead.

On GPU adapters each dispatch records its successor's command buffer while the device runs
it (``_record_ahead``; one command buffer, its passes not cut, unless recorded "pieces"), so
a step in a decode loop only submits; a dispatch that finds
nothing recorded for its tensors encodes in command buffers of ``submit_every`` launches,
submitted as they are finished, so the GPU starts while the rest is encoded. CPU adapters
(lavapipe) neither record ahead nor cut: there the encoder and the "GPU" share the same
cores, and recording during the run made the run itself slower for no wall-time gain
(backends/webnn/PERFORMANCE.md, "Knobs": ``KernelOptions.record_ahead``).
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any

from .._classes import MLGraph, MLTensor
from .plan import CopyLaunch
from .readback import PENDING_MAX, Dispatched, ReadCopy

if TYPE_CHECKING:
    from .context import WgpuGraph

BIND_CACHE_MAX = 16  # per launch; bounds memory for pages that bind fresh tensors


def _cached(cache: dict, key: tuple, make: Any) -> Any:
    """``cache[key]``, made by ``make()`` where absent; the oldest entry dropped first
    beyond ``BIND_CACHE_MAX`` (what a page binding fresh tensors each step would grow)."""
    got = cache.get(key)
    if got is None:
        if len(cache) >= BIND_CACHE_MAX:
            cache.pop(next(iter(cache)))
        got = cache[key] = make()
    return got


def _bound_key(bound: dict[str, dict[str, MLTensor]]) -> tuple:
    """Which tensors a dispatch binds, by serial (a destroyed tensor's never returns)."""
    return tuple(tuple(sorted((n, t._serial) for n, t in bound[k].items()))
                 for k in ("input", "output"))


class Dispatch:
    """WgpuContext's dispatch path (a mixin: the device, queue and graph are the context's)."""

    def _static(self, g: WgpuGraph, slot: tuple) -> bool:
        if slot[0] == "range":  # part of a buffer (``lowering._split_elementwise``)
            return self._static(g, slot[1])
        if slot[0] in ("input", "output"):
            return False
        if slot[0] == "state":
            return len(g._state[slot[1]]) == 1
        return True

    def _resolve(self, g: WgpuGraph, slot: tuple, bound: dict[str, dict[str, MLTensor]],
                 parity: int) -> Any:
        kind = slot[0]
        if kind == "range":
            return self._resolve(g, slot[1], bound, parity)
        if kind in ("input", "output"):
            return bound[kind][slot[1]]._buffer
        if kind == "state":
            bufs = g._state[slot[1]]
            if len(bufs) == 1:
                return bufs[0]
            return bufs[(parity + (slot[2] == "next")) % 2]
        return g._buffers[slot]

    def _bind_group(self, g: WgpuGraph, layout: Any, slots: list[tuple],
                    bound: dict[str, dict[str, MLTensor]], parity: int) -> Any:
        entries = []
        for i, s in enumerate(slots):
            buf = self._resolve(g, s, bound, parity)
            offset, size = (s[2], s[3]) if s[0] == "range" else (0, buf.size)
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": offset,
                                                       "size": size}})
        return self._device.create_bind_group(layout=layout, entries=entries)

    def _dispatch(self, graph: MLGraph, inputs: dict[str, MLTensor],
                  outputs: dict[str, MLTensor]) -> None:
        """Submit the graph's command buffers: the ones recorded ahead at the previous
        dispatch when they were recorded for these tensors and this parity, else encoded
        now (submitted in pieces as they are encoded). Then, unless that recording missed,
        record the next dispatch's while the GPU runs this one (``_record_ahead``).
        Earlier dispatches' capacity statuses are waited for only as ``_settle_before``
        says: a double-buffered graph's, or the oldest beyond ``PENDING_MAX``."""
        g: WgpuGraph = graph  # type: ignore[assignment]
        bound = {"input": inputs, "output": outputs}
        self._settle_before(g)  # may raise: this dispatch then does not run
        key = (_bound_key(bound), g._parity)
        ready = g._recorded
        hit = ready is not None and ready[0] == key
        slot = ready[3] if hit else g._status_next  # type: ignore[index]
        self._free_status(g, slot)
        g._recorded = None
        self._staged.flush()
        if hit:
            # recorded for these very tensors: its read copy is this dispatch's
            copy = ready[2]  # type: ignore[index]
            if self._piecewise:
                for cb in ready[1]:  # type: ignore[index]
                    self._submit([cb])
            else:  # one submit, not one by one (PERFORMANCE.md, "Knobs")
                self._submit(ready[1])  # type: ignore[index]
        else:
            copy = self._read_copy_for(g, bound)
            qc = self.queue_counts
            t0, sub0 = time.perf_counter_ns(), qc.submit_ns
            self._encode(g, bound, key, lambda cb: self._submit([cb]), copy, slot=slot)
            qc.encode_ns += time.perf_counter_ns() - t0 - (qc.submit_ns - sub0)
        missed = ready is not None and not hit
        self._noted(g, copy, slot, outputs)
        self.counters.kernel += g._kernel_bytes
        self.counters.d2d += g._copy_bytes
        self._time_pending = self._timing and len(g._passes) > 0
        if g._double:
            g._parity ^= 1  # undone by _settle_through if the capacity check failed
        earlier, g._last_bound = g._last_bound, bound
        if self.record_ahead and not missed:
            self._record_ahead(g, earlier or bound)

    def _settle_before(self, g: WgpuGraph) -> None:
        """Before a dispatch: read the statuses that must be read now. A double-buffered
        graph's last dispatch (its parity swap-back must precede any later dispatch, as it
        always has), and the oldest unread ones beyond ``PENDING_MAX`` (these waits are
        where a loop that never reads is held back). An in-place graph's status otherwise
        stays unread: its writes are gated on the device, so a later dispatch is correct
        either way, and a dispatch must not wait for the device in an asynchronous API."""
        pending = self._pending
        if not pending:
            return
        last = pending[-1]  # a double-buffered graph's can only be the last one
        if last.graph._double:
            self._settle_through(last.number, {})
        while len(pending) >= PENDING_MAX:
            self._settle_through(pending[0].number, {})

    def _free_status(self, g: WgpuGraph, slot: int) -> None:
        """Read the unread status held in ``g``'s status staging ``slot`` before this
        dispatch copies over it (never, while the graph uses its slots in turn)."""
        if not g._status_ring or not self._pending:
            return
        buf = g._status_ring[slot]
        for rec in self._pending:
            if rec.status is buf:
                self._settle_through(rec.number, {})
                return

    def _noted(self, g: WgpuGraph, copy: ReadCopy | None, slot: int,
               outputs: dict[str, MLTensor]) -> None:
        """Record the dispatch just submitted: its copy for later reads, its status as
        unread where the graph has a check."""
        ring = g._status_ring
        rec = Dispatched(g, self._dispatches, copy,
                         dict(copy.index) if copy is not None else {},
                         ring[slot] if ring else None)
        self._dispatches += 1
        self._note_dispatched(rec, outputs.values())
        if ring:
            g._status_next = (slot + 1) % len(ring)
            self._pending.append(rec)

    def _record_ahead(self, g: WgpuGraph, bound: dict[str, dict[str, MLTensor]]) -> None:
        """Encode the next dispatch now, while the device runs this one, so that dispatch
        only submits (wgpu-py encodes ~5-10 µs a launch: with ~200 launches that is most
        of a step's host time). The next dispatch's tensors are guessed as the previous
        dispatch's: right for a page that binds the same tensors every step and for one
        that ping-pongs two sets. A command buffer holds no data (inputs are read when it
        runs), so it is valid for any contents of the tensors it binds. Its status goes to
        the graph's next status staging slot."""
        t0 = time.perf_counter_ns()
        key = (_bound_key(bound), g._parity)
        cbs: list[Any] = []
        copy = self._read_copy_for(g, bound)
        slot = g._status_next
        # submitted at once ("on"): one command buffer, its passes uncut
        self._encode(g, bound, key, cbs.append, copy, whole=not self._piecewise, slot=slot)
        g._recorded = (key, cbs, copy, slot)
        self.queue_counts.record_ns += time.perf_counter_ns() - t0

    def _submit(self, cbs: list[Any]) -> None:
        t0 = time.perf_counter_ns()
        self._queue_calls.submit(self._queue, cbs)
        self.queue_counts.submits += 1
        self.queue_counts.submit_ns += time.perf_counter_ns() - t0

    def _encode(self, g: WgpuGraph, bound: dict[str, dict[str, MLTensor]], key: tuple,
                emit: Any, copy: ReadCopy | None = None, whole: bool = False,
                slot: int = 0) -> None:
        """Encode one dispatch for ``bound`` and parity ``key[1]``, handing each finished
        command buffer to ``emit`` (a cut every ``submit_every`` launches; ``whole``: no
        cuts, one command buffer); the last one ends with the status word's copy into the
        graph's status staging ``slot`` and ``copy``'s copies into its staging."""
        parity = key[1]
        plan = g._plan
        passes = g._whole_passes if whole else g._passes
        cuts = () if whole else g._submit_after
        # the engine's C functions on handles, or wgpu-py's methods (``engines.PassCalls``)
        set_pipeline, set_bind_group, dispatch, null, handle = self._pass_calls
        enc = self._device.create_command_encoder()
        launches = plan.launches
        npasses = len(passes)
        for pi, (a, b) in enumerate(passes):
            # copies before this pass
            prev_end = passes[pi - 1][1] if pi else 0
            self._copies(enc, g, launches[prev_end:a], bound, parity)
            tw = None
            if self._timing and (pi == 0 or pi == npasses - 1):
                tw = {"query_set": self._query_set}
                if pi == 0:
                    tw["beginning_of_pass_write_index"] = 0
                if pi == npasses - 1:
                    tw["end_of_pass_write_index"] = 1
            cp = enc.begin_compute_pass(timestamp_writes=tw)
            h = handle(cp)
            for ph, bh, x, y, z, _ in self._pass_commands(g, bound, key, a, b):
                if ph is not None:
                    set_pipeline(h, ph)
                set_bind_group(h, 0, bh, 0, null)
                dispatch(h, x, y, z)
            cp.end()  # through wgpu-py: a command's error surfaces here
            if pi in cuts:
                emit(enc.finish())
                enc = self._device.create_command_encoder()
        self._copies(enc, g, launches[passes[-1][1] if passes else 0:], bound, parity)
        if plan.has_check:
            enc.copy_buffer_to_buffer(g._buffers[("status",)], 0, g._status_ring[slot], 0, 4)
        if self._timing and npasses:
            enc.resolve_query_set(self._query_set, 0, 2, self._query_buf, 0)
            enc.copy_buffer_to_buffer(self._query_buf, 0, self._time_staging, 0, 16)
        if copy is not None:
            copy.staging.encode(enc)
        emit(enc.finish())

    def _pass_commands(self, g: WgpuGraph, bound: dict[str, dict[str, MLTensor]], key: tuple,
                       a: int, b: int) -> list[tuple]:
        """Launches ``a:b`` of one pass as its encoding loop calls them: (the pipeline's
        handle, or None where the previous launch's stays; the bind group's handle; the
        grid; the bind group, held so its handle stays valid), made once per key and pass,
        so a step's ~170 launches cost three C calls each and no Python lookups (the
        recorded-ahead encode is on a fast step's critical path: docs/measuring.md)."""
        per_key = _cached(g._commands, key, dict)
        cmds = per_key.get((a, b))
        if cmds is not None:
            return cmds
        handle, parity, launches = self._pass_calls[4], key[1], g._plan.launches
        cmds, last = [], None
        for i in range(a, b):
            pipe, layout, bg = g._items[i]
            if bg is None:
                bg = _cached(g._bind_cache[i], key, partial(
                    self._bind_group, g, layout, launches[i].slots, bound, parity))
            # a pass keeps its pipeline from launch to launch
            cmds.append((handle(pipe) if pipe is not last else None, handle(bg),
                         *launches[i].kernel.groups, bg))
            last = pipe
        per_key[(a, b)] = cmds
        return cmds

    def _copies(self, enc: Any, g: WgpuGraph, items: list[Any],
                bound: dict[str, dict[str, MLTensor]], parity: int) -> None:
        for la in items:
            if isinstance(la, CopyLaunch):
                # whole 4-byte words (an odd count of float16 is 2n bytes); buffers are
                # sized in 16-byte units, so the word's padding is in bounds
                enc.copy_buffer_to_buffer(self._resolve(g, la.src, bound, parity), 0,
                                          self._resolve(g, la.dst, bound, parity), 0,
                                          -(-la.nbytes // 4) * 4)

    def _reset(self, graph: MLGraph) -> None:
        g: WgpuGraph = graph  # type: ignore[assignment]
        self._drop_pending(g)  # the cache is emptied: its overflows are moot
        self._staged.flush()
        enc = self._device.create_command_encoder()
        for bufs in g._state:
            for b in bufs:
                enc.clear_buffer(b)
        self._submit([enc.finish()])
        g._parity = 0
