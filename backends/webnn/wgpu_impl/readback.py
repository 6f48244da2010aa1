"""Reading results back: tensors, the capacity status and the GPU time of a dispatch.

A dispatch's readable outputs (and its capacity status) are copied into staging at the end
of its own last command buffer (``_read_copy_for``), so the page's read of its logits right
after only maps. The last few dispatches' copies are kept (``Dispatched``): a read of an
older dispatch's output that nothing has written since maps that dispatch's staging, which
waits for that dispatch only, not for the ones queued after it (a chained decode reads
step N's ids while step N + 1 runs). Anything else makes the read copy the tensors itself
(``staging.StagedReads``). The capacity status of a checked dispatch rides in the round trip
of a read of its copy or is read where the context waits anyway (``_settle_through``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import shapes as S
from .._classes import MLGraph, MLTensor
from ..dtypes import from_device
from ..errors import OperationError
from .staging import ReadStaging, read_small

if TYPE_CHECKING:
    from .context import WgpuGraph

#: read copies kept per graph, one per set of readable output tensors
READ_COPIES_MAX = 16
#: dispatches whose copies a read may still use (``Readback._holding``)
RECENT_MAX = 4
#: checked dispatches of in-place graphs whose status may wait unread; one more and the
#: oldest is waited for at the next dispatch (``Dispatch._settle_before``)
PENDING_MAX = 3
#: status staging buffers per checked graph, used in turn: more than ``PENDING_MAX``, so a
#: dispatch never copies its status over one not yet read
STATUS_RING = PENDING_MAX + 1


def _span_ns(raw: np.ndarray) -> int | None:
    """A dispatch's GPU time from its two resolved timestamps (bytes as mapped), or None
    where the end reads before the beginning (a driver that does not order them)."""
    t = raw.view(np.uint64)
    return int(t[1] - t[0]) if t[1] >= t[0] else None


@dataclass
class ReadCopy:
    """A dispatch's readable outputs (and its capacity status and timestamps) as copied into
    ``staging`` by the end of the dispatch's last command buffer."""

    graph: WgpuGraph
    staging: ReadStaging
    index: dict[int, int]  # tensor serial -> source index in staging
    status: int | None  # source index of the capacity status word
    time: int | None  # source index of the resolved timestamps


@dataclass(eq=False, slots=True)
class Dispatched:
    """One dispatch as later reads see it: its read copy, the copied tensors nothing has
    written since (``valid``: serial -> source index in the copy; emptied where a later
    dispatch copies into the same staging), and where its capacity status word was copied
    (one of its graph's ``_status_ring``; None: the graph has no check)."""

    graph: WgpuGraph
    number: int  # the context's dispatch count: orders the pending statuses
    copy: ReadCopy | None
    valid: dict[int, int]
    status: Any | None


class Readback:
    """WgpuContext's reads (a mixin: the device, staging and counters are the context's)."""

    @property
    def gpu_time_ns(self) -> int | None:
        """GPU time of the last dispatch (first pass begin to last pass end), or None
        (``gpu_time_reason`` says why). Resolved timestamps are taken as nanoseconds:
        the WebGPU spec defines them so and wgpu-native exposes no period to apply."""
        if self._time_pending:
            raw = read_small(self._time_staging, 16, self.queue_counts, self._map_how)
            self._gpu_time_ns = _span_ns(np.frombuffer(raw, dtype=np.uint8))
            self._time_pending = False
        return self._gpu_time_ns

    def _read_tensors(self, tensors: list[MLTensor],
                      outputs: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Every tensor read back in one device round trip and copied out once (into
        ``outputs`` where given). Where a recent dispatch copied every one of them into
        staging and nothing has written them since (``_holding``), the round trip is a map
        of that staging (which waits for that dispatch, not later ones) and brings its
        capacity status along; otherwise the copies are submitted now, after everything
        queued (``staging.StagedReads``), and every unread status is read with them."""
        sizes = [S.size(t._shape) * t._dtype.itemsize for t in tensors]
        out: list[np.ndarray | None] = [None] * len(tensors)

        def take(i: int, raw: np.ndarray) -> None:
            dt = tensors[i]._dtype
            values = raw[:sizes[i]].view(dt.device_np)
            if outputs is None:
                out[i] = from_device(values.copy(), dt, tensors[i]._shape)
            elif dt.packed:  # the page's array holds the spec's packed buffer
                outputs[i].reshape(-1)[...] = from_device(values, dt, tensors[i]._shape)
                out[i] = outputs[i]
            else:
                outputs[i].reshape(-1)[...] = values  # the page's array, no allocation
                out[i] = outputs[i]

        rec = self._holding(tensors)
        if rec is None:
            known = self._read_separately(tensors, sizes, take)
            self.counters.d2h += sum(sizes)
            self._settle_through(None, known)  # it waited for everything queued
        else:
            slots = [rec.valid[t._serial] for t in tensors]
            status = self._read_copied(rec, slots, sizes, take)
            self.counters.d2h += sum(sizes)
            self._settle_through(rec.number, {} if status is None else {rec.number: status})
        return out  # type: ignore[return-value]

    def _holding(self, tensors: list[MLTensor]) -> Dispatched | None:
        """The latest recent dispatch whose copy holds every one of ``tensors`` as they are
        now (none written since it ran), or None."""
        if len(tensors) == 1:  # a page's read of its logits or ids: no generator
            serial = tensors[0]._serial
            for rec in reversed(self._recent):
                if serial in rec.valid:
                    return rec
            return None
        serials = [t._serial for t in tensors]
        for rec in reversed(self._recent):
            valid = rec.valid
            if valid and all(s in valid for s in serials):
                return rec
        return None

    def _note_dispatched(self, rec: Dispatched, outputs: Any) -> None:
        """Keep ``rec`` among the recent dispatches; what it writes (its output tensors)
        and what it copies over (its staging) is no longer readable from earlier copies."""
        staging = rec.copy.staging if rec.copy is not None else None
        written = None
        for old in self._recent:
            if not old.valid:
                continue
            if old.copy is not None and old.copy.staging is staging:
                old.valid = {}
                continue
            if written is None:
                written = [t._serial for t in outputs]
            for s in written:
                old.valid.pop(s, None)
        self._recent.append(rec)  # (a deque of RECENT_MAX: the oldest drops out)

    def _forget_written(self, serial: int) -> None:
        """A host write to tensor ``serial``: no copy holds what a read must return."""
        for rec in self._recent:
            rec.valid.pop(serial, None)

    def _forget_copies(self, graph: WgpuGraph | None = None) -> None:
        """Copies no read may use any more: ``graph``'s (being destroyed: its staging goes,
        and its unread statuses are moot), or every dispatch's (None: something outside
        the dispatches wrote bound tensors)."""
        if graph is None:
            for rec in self._recent:
                rec.valid = {}
            return
        self._recent = type(self._recent)((r for r in self._recent if r.graph is not graph),
                                          maxlen=self._recent.maxlen)
        self._drop_pending(graph)

    def _drop_pending(self, graph: WgpuGraph) -> None:
        """Forget ``graph``'s unread statuses (reset or destroyed: its overflow is moot)."""
        self._pending = type(self._pending)(r for r in self._pending if r.graph is not graph)

    def _read_separately(self, tensors: list[MLTensor], sizes: list[int],
                         take: Any) -> dict[int, int]:
        """Copy the tensors into staging in a submit of their own, map once: the read path
        of any read no recent dispatch copied for. Each graph with unread statuses has its
        status word copied too: it holds the graph's last dispatch's, the newest of them.
        Returns the statuses read, by dispatch number."""
        self._staged.flush()
        # copies move whole 4-byte words (an odd number of float16 values: one pad value)
        sources = [(t._buffer, -(-n // 4) * 4) for t, n in zip(tensors, sizes, strict=True)]
        last: dict[int, Dispatched] = {id(r.graph): r for r in self._pending}
        numbers = [r.number for r in last.values()]
        sources += [(r.graph._buffers[("status",)], 4) for r in last.values()]
        known: dict[int, int] = {}

        def consume(i: int, raw: np.ndarray) -> None:
            if i >= len(tensors):
                known[numbers[i - len(tensors)]] = int(raw.view(np.uint32)[0])
            else:
                take(i, raw)

        self._reads.read(sources, consume)
        return known

    def _read_copied(self, rec: Dispatched, slots: list[int], sizes: list[int],
                     take: Any) -> int | None:
        """Map what dispatch ``rec`` copied: the tensors, its status if still unread, its
        timestamps if it is the last dispatch and they are not yet read (so
        ``gpu_time_ns`` needs no map of its own)."""
        copied = rec.copy
        assert copied is not None
        want: dict[int, int] = {}
        readers: dict[int, list[int]] = {}  # source -> positions (a tensor may be read twice)
        for i, (src, n) in enumerate(zip(slots, sizes, strict=True)):
            want[src] = -(-n // 4) * 4
            readers.setdefault(src, []).append(i)
        if copied.status is not None and any(r is rec for r in self._pending):
            want[copied.status] = 4
        if self._time_pending and copied.time is not None and self._recent[-1] is rec:
            want[copied.time] = 16
        status: list[int] = []

        def consume(src: int, raw: np.ndarray) -> None:
            if src == copied.status:
                status.append(int(raw.view(np.uint32)[0]))
            elif src == copied.time:
                self._gpu_time_ns = _span_ns(raw)
                self._time_pending = False
            else:
                for i in readers[src]:
                    take(i, raw)

        copied.staging.read(want, consume, self.queue_counts, self._map_how)
        return status[0] if status else None

    def _read_copy_for(self, g: WgpuGraph,
                       bound: dict[str, dict[str, MLTensor]]) -> ReadCopy | None:
        """Staging for the readable outputs of a dispatch binding ``bound`` (with the
        status and timestamps), made once per set of output tensors; None when
        ``read_copy`` is off or nothing bound is readable. Which tensors the page will read
        is not known at dispatch; a page reads the outputs it made readable, and an unread
        copy costs the device a copy of those bytes (the logits: 0.5 MB for llama-1b).
        A recorded-ahead dispatch ends with the same copy, into the same staging: it is
        recorded only for the very tensors it binds (``dispatch._bound_key``)."""
        if not self.read_copy:
            return None
        readable = [t for _, t in sorted(bound["output"].items()) if t._readable]
        if not readable:
            return None
        key = tuple(t._serial for t in readable)
        rc = g._read_copies.get(key)
        if rc is None:
            if len(g._read_copies) >= READ_COPIES_MAX:
                # dropped, not destroyed: a command buffer recorded ahead may copy into it
                g._read_copies.pop(next(iter(g._read_copies)))
            sources = [t._buffer for t in readable]
            status = time = None
            if g._plan.has_check:
                status = len(sources)
                sources.append(g._buffers[("status",)])
            if self._timing and g._passes:
                time = len(sources)
                sources.append(self._query_buf)
            rc = g._read_copies[key] = ReadCopy(
                g, ReadStaging(self._device, sources, self._max_buffer),
                {t._serial: i for i, t in enumerate(readable)}, status, time)
        return rc

    def _settle_through(self, number: int | None, known: dict[int, int],
                        report: bool = True) -> None:
        """PROPOSAL behaviour 4, without a sync of its own: read the capacity status of
        every unread checked dispatch up to dispatch ``number`` (None: all), oldest first,
        each from ``known`` (read in the caller's round trip) or else from its status
        staging (a map; those dispatches have finished, or the caller means to wait for
        them). 4 bytes each, counted d2h. On overflow a double-buffered graph's buffers are
        swapped back (its in-place writes were gated on the device) and, once all are read,
        ``OperationError`` is raised for the oldest overflow (``report``)."""
        first: OperationError | None = None
        while self._pending and (number is None or self._pending[0].number <= number):
            rec = self._pending.popleft()
            status = known.get(rec.number)
            if status is None:
                raw = read_small(rec.status, 4, self.queue_counts, self._map_how)
                status = int(np.frombuffer(raw, dtype=np.uint32)[0])
            self.counters.d2h += 4
            err = self._overflow(rec.graph, status)
            first = first or err
        if first is not None and report:
            raise first

    def _overflow(self, g: WgpuGraph, status: int) -> OperationError | None:
        """The error of a dispatch of ``g`` whose status word is ``status`` (None: it fit),
        its double buffers swapped back."""
        if not status:
            return None
        if g._double:
            g._parity ^= 1
        p = [pp for pp in g._plan.pairs if pp.append][status - 1]
        return OperationError(
            f"KV-cache capacity exceeded for pair {p.pair.input!r} -> "
            f"{p.pair.output!r} (capacity shape {list(p.past.shape)}); "
            "the cache is unchanged")

    def _peek_state(self, graph: MLGraph, input_name: str) -> np.ndarray:
        """Tests only (PROPOSAL behaviour 5: no public API reads the cache): the current
        contents of a pair's hidden state, without touching the byte counters."""
        g: WgpuGraph = graph  # type: ignore[assignment]
        pp = next(p for p in g._plan.pairs if p.pair.input == input_name)
        buf = self._resolve(g, ("state", pp.index, "cur"), {}, g._parity)
        saved = self.counters.snapshot()
        fake = MLTensor(self, pp.past.dtype, pp.past.shape, True, False)
        fake._buffer = buf  # type: ignore[attr-defined]
        out = self._read_tensors([fake])[0]
        self.counters.d2h = saved.d2h
        return out
