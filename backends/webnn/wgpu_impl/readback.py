"""Reading results back: tensors, the capacity status and the GPU time of a dispatch.

A dispatch's readable outputs (and its capacity status) are copied into staging at the end
of its own last command buffer (``_read_copy_for``), so the page's read of its logits right
after only maps; anything that may change them first makes the read copy them itself
(``staging.StagedReads``). The capacity status of a checked dispatch rides in the next read's
round trip, or is read before the next dispatch encodes (``_settle``).
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
        ``outputs`` where given); the last checked dispatch's capacity status rides in the
        same round trip (``_settle``). Where the last dispatch already copied every one of
        them into staging and nothing has changed them since (``_copied``), the round trip
        is a map; otherwise the copies are submitted now (``staging.StagedReads``)."""
        sizes = [S.size(t._shape) * t._dtype.itemsize for t in tensors]
        out: list[np.ndarray | None] = [None] * len(tensors)

        def take(i: int, raw: np.ndarray) -> None:
            dt = tensors[i]._dtype
            values = raw[:sizes[i]].view(dt.device_np)
            if outputs is None:
                out[i] = from_device(values.copy(), dt, tensors[i]._shape)
            else:
                outputs[i].reshape(-1)[...] = values  # the page's array, no allocation
                out[i] = outputs[i]

        copied = self._copied
        slots = [None] * len(tensors) if copied is None else [
            copied.index.get(t._serial) for t in tensors]
        if None in slots:
            status = self._read_separately(tensors, sizes, take)
        else:
            status = self._read_copied(copied, slots, sizes, take)  # type: ignore[arg-type]
        self.counters.d2h += sum(sizes)
        self._settle(status=status)
        return out  # type: ignore[return-value]

    def _read_separately(self, tensors: list[MLTensor], sizes: list[int],
                         take: Any) -> int | None:
        """Copy the tensors (and the unsettled status) into staging in a submit of their
        own, map once: the read path of any read the last dispatch did not copy for."""
        self._staged.flush()
        # copies move whole 4-byte words (an odd number of float16 values: one pad value)
        sources = [(t._buffer, -(-n // 4) * 4) for t, n in zip(tensors, sizes, strict=True)]
        if self._unsettled is not None:
            sources.append((self._unsettled._buffers[("status",)], 4))
        status: list[int] = []

        def consume(i: int, raw: np.ndarray) -> None:
            if i == len(tensors):
                status.append(int(raw.view(np.uint32)[0]))
            else:
                take(i, raw)

        self._reads.read(sources, consume)
        return status[0] if status else None

    def _read_copied(self, copied: ReadCopy, slots: list[int], sizes: list[int],
                     take: Any) -> int | None:
        """Map what the last dispatch copied: the tensors, its status if still unsettled,
        its timestamps if not yet read (so ``gpu_time_ns`` needs no map of its own)."""
        want: dict[int, int] = {}
        readers: dict[int, list[int]] = {}  # source -> positions (a tensor may be read twice)
        for i, (src, n) in enumerate(zip(slots, sizes, strict=True)):
            want[src] = -(-n // 4) * 4
            readers.setdefault(src, []).append(i)
        if self._unsettled is copied.graph and copied.status is not None:
            want[copied.status] = 4
        if self._time_pending and copied.time is not None:
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

    def _settle(self, report: bool = True, status: int | None = None) -> None:
        """PROPOSAL behaviour 4, without a sync of its own: the last checked dispatch's
        capacity status (4 bytes, counted d2h) is read where the context waits for the
        device anyway (the next read_tensor, in the same round trip as its read: ``status``;
        the next dispatch, before it encodes, from the copy the dispatch made). On overflow
        the graph's double buffers are swapped back (its in-place writes were gated on the
        device) and ``OperationError`` is raised (``report``)."""
        g, self._unsettled = self._unsettled, None
        if g is None:
            return
        if status is None:
            raw = read_small(self._status_staging, 4, self.queue_counts, self._map_how)
            status = int(np.frombuffer(raw, dtype=np.uint32)[0])
        self.counters.d2h += 4
        if not status:
            return
        if g._double:
            g._parity ^= 1
        if report:
            p = [pp for pp in g._plan.pairs if pp.append][status - 1]
            raise OperationError(
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
