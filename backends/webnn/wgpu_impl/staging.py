"""Batched uploads for ``write_tensor`` (what a browser's ``writeBuffer`` staging ring does)
and batched read-backs for ``readTensor``.

A page that keeps its caches on the host writes every one of them before each dispatch (32
tensors for llama-1b). Giving each write its own mapped staging buffer costs a device round
trip per write (``map_sync`` waits for the buffer's last copy): 32 round trips a step, which
at small depths is most of the step. Here writes are copied into one mapped staging arena and
become a single submit of copies when the queue next has to run something (a dispatch, a
read, a small ``write_buffer``, a reset): one map per arena per step. Two arenas alternate,
so the host fills one while the device copies out of the other.

Reads go the other way: ``StagedReads`` copies what a read asks for into mapped-read staging
and submits that; ``ReadStaging`` is staging for a fixed list of sources whose copies the
context records at the end of a dispatch (``readback._read_copy_for``), so a read right after
the dispatch only maps. ``QueueCounts`` counts the submits and maps of one context.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import wgpu

#: the largest arena (a page writing more than this between dispatches flushes every arena's
#: worth, and a write larger than this goes through in arena-sized pieces)
ARENA_MAX = 256 << 20
_ALIGN = 256  # offsets of pieces in an arena


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass
class QueueCounts:
    """Queue submits and buffer maps of one context (statebench extension): each is a trip
    through wgpu-core and, for a map, a wait for the device, so they are what a decode
    step's host time is made of besides encoding. Tests count them per step.

    The ``*_ns`` fields are the host time spent in each part of the context's calls
    (``time.perf_counter_ns`` at a few boundaries, cheap enough to leave on): the page's
    host-time breakdown per step (``backends/pages.py``, docs/measuring.md) is made of them."""

    submits: int = 0
    maps: int = 0
    write_ns: int = 0  # write_tensor's device calls (queue.write_buffer, staging)
    encode_ns: int = 0  # encoding a dispatch's command buffers on its path (before submit)
    submit_ns: int = 0  # queue.submit
    record_ns: int = 0  # encoding the next dispatch ahead, after this one's submit
    wait_ns: int = 0  # map_async and the wait for the device to finish what it maps
    copy_ns: int = 0  # copying out of mapped staging, and unmapping

    def times_ns(self) -> dict[str, int]:
        """The host-time fields, by name without ``_ns``."""
        return {"write": self.write_ns, "encode": self.encode_ns, "submit": self.submit_ns,
                "record": self.record_ns, "wait": self.wait_ns, "copy": self.copy_ns}


@dataclass(frozen=True)
class MapHow:
    """How a read map waits for the device.

    ``sync``: wgpu-py's ``map_sync``, which submits an empty command buffer before every
    read map: a workaround for data written through a mapping, which the queue may not have
    seen (wgpu-native#305). Buffers written only by copies on the queue do not need it, and
    wgpu-py's own ``queue.read_buffer`` maps its staging with "READ_NOSYNC" for that reason;
    ours are such buffers, so by default they skip that submit.

    ``poll``: block in the calling thread until the device has finished (wgpu-native's
    ``wgpuDevicePoll`` with wait), so the map's callback runs here. Without it wgpu-py's
    poll thread waits and then wakes the caller: one more thread hand-off (and GIL
    hand-off) between the GPU finishing and the page having its logits. Dawn's wait
    already blocks in the caller (``wgpuInstanceWaitAny``).

    ``spin``: poll without blocking until the map is done (a core busy for the wait, as a
    CUDA stream's spin-wait): no sleep and wake-up between the device's fence and the
    caller. On both engines (Dawn's poll is ``wgpuInstanceProcessEvents``, which runs the
    map's callback once it is done). For GPU adapters, where the host has cores to spare;
    on a CPU adapter the spinning core is one the "GPU" needs."""

    sync: bool = False
    poll: Callable[[bool], None] | None = None  # the device's poll(block)
    spin: bool = False
    #: how the mapped bytes are read: (buffer, offset, size) -> a buffer over them
    #: (``engines.QueueCalls.mapped``); None: wgpu-py's ``read_mapped``
    mapped: Callable[[Any, int, int], Any] | None = None
    #: a spinning read map through the engine's C functions, and its unmap
    #: (``engines.QueueCalls.map_spin``; KernelOptions.queue_calls "direct_maps")
    map_spin: Callable[[Any, int, int, Callable[[bool], None]], None] | None = None
    unmap: Callable[[Any], None] | None = None

    def release(self, buf: Any) -> None:
        """Unmap ``buf`` as it was mapped."""
        if self.unmap is None:
            buf.unmap()
        else:
            self.unmap(buf)


def map_read(buf: Any, offset: int, size: int, counts: QueueCounts, how: MapHow) -> None:
    """Map ``buf`` for reading and wait, as ``how`` says."""
    t0 = time.perf_counter_ns()
    if how.map_spin is not None and how.poll is not None:
        how.map_spin(buf, offset, size, how.poll)
    elif how.sync:
        buf.map_sync(wgpu.MapMode.READ, offset, size)
        counts.submits += 1  # wgpu-py's own, counted so the counts match the queue's
    else:
        promise = buf.map_async("READ_NOSYNC", offset, size)
        if how.poll is not None:
            if how.spin:
                while promise._state == "pending":  # wgpu-py's GPUPromise, not yet resolved
                    how.poll(False)
            else:
                how.poll(True)
        promise.sync_wait()
    counts.maps += 1
    counts.wait_ns += time.perf_counter_ns() - t0


def read_small(buf: Any, nbytes: int, counts: QueueCounts, how: MapHow) -> bytes:
    """The first ``nbytes`` of ``buf`` (a status word, two timestamps), mapped, copied out
    and unmapped as ``how`` says."""
    map_read(buf, 0, 16, counts, how)
    try:
        view = buf.read_mapped(0, nbytes, copy=False) if how.mapped is None else how.mapped(
            buf, 0, nbytes)
        data = bytes(view)
        del view  # no export of the mapped range may outlive unmap
    finally:
        how.release(buf)
    return data


def _pack(sizes: Sequence[int], max_buffer: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Whole buffers of ``sizes`` bytes (multiples of 4, as copies need) packed in order into
    staging buffers of at most ``max_buffer`` bytes: each one's (staging buffer, offset), and
    each staging buffer's bytes used."""
    slots: list[tuple[int, int]] = []
    used = [0]
    for n in sizes:
        if used[-1] and used[-1] + n > max_buffer:
            used.append(0)
        slots.append((len(used) - 1, used[-1]))
        used[-1] += n
    return slots, used


def _consume(buffers: Sequence[Any], slots: Sequence[tuple[int, int]], want: dict[int, int],
             consume: Callable[[int, np.ndarray], None], counts: QueueCounts,
             how: MapHow) -> None:
    """Map each staging buffer that holds a wanted source once (up to its last wanted byte)
    and hand ``consume(i, bytes)`` source i's first ``want[i]`` bytes while mapped."""
    by_buffer: dict[int, list[tuple[int, int, int]]] = {}
    for i, n in want.items():
        b, off = slots[i]
        by_buffer.setdefault(b, []).append((i, off, n))
    for b, members in by_buffer.items():
        st = buffers[b]
        end = max(off + n for _, off, n in members)
        map_read(st, 0, end, counts, how)
        t0 = time.perf_counter_ns()
        try:
            view = (st.read_mapped(0, end, copy=False) if how.mapped is None
                    else how.mapped(st, 0, end))
            raw = np.frombuffer(view, np.uint8)
            for i, off, n in members:
                consume(i, raw[off:off + n])
            del raw, view  # no export of the mapped range may outlive unmap
        finally:
            how.release(st)
            counts.copy_ns += time.perf_counter_ns() - t0


class StagedWrites:
    """Pending writes of one device queue, copied on ``flush``."""

    def __init__(self, device: Any, limit: int = ARENA_MAX,
                 counts: QueueCounts | None = None) -> None:
        self._device = device
        self._counts = counts if counts is not None else QueueCounts()
        self._limit = max(_ALIGN, limit - limit % _ALIGN)
        self._arenas: list[Any] = [None, None]
        self._cur = 0
        self._used = 0
        self._want = 0  # most bytes staged between two flushes the caller asked for: the size to grow to
        self._since = 0  # bytes staged since the caller's last flush (arenas may have filled between)
        self._pending: list[tuple[Any, int, int, int]] = []  # (dst, arena offset, dst offset, n)
        self.submits = 0  # command buffers of copies submitted (what one batch should cost: one)

    def write(self, dst: Any, data: np.ndarray) -> None:
        """Stage ``data`` for ``dst`` at offset 0, in pieces of at most one arena."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        done = 0
        while done < raw.size:
            n = min(raw.size - done, self._limit)
            self._since += _aligned(n)
            if self._used + _aligned(n) > self._room():
                # out of room: grow to everything staged so far in this batch, so the next
                # batch of the same writes fits one arena (one map, one submit)
                self._want = max(self._want, self._since)
                self._submit()
            arena = self._arena(n)
            arena.write_mapped(raw[done:done + n], self._used)
            self._pending.append((dst, self._used, done, n))
            self._used += _aligned(n)
            done += n

    def _room(self) -> int:
        a = self._arenas[self._cur]
        return a.size if a is not None else 0

    def _arena(self, n: int) -> Any:
        """The current arena, mapped for writing; made (or remade larger) while it is empty."""
        a = self._arenas[self._cur]
        if not self._pending:
            need = min(self._limit, max(_aligned(n), self._want))
            if a is None or a.size < need:
                if a is not None:
                    a.destroy()
                a = self._arenas[self._cur] = self._device.create_buffer(
                    size=need, usage=wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC,
                    mapped_at_creation=True)
        if a.map_state != "mapped":
            a.map_sync(wgpu.MapMode.WRITE, 0, a.size)  # free once its last copies have run
            self._counts.maps += 1
        return a

    def flush(self) -> None:
        """End a batch (the queue must run what was written): submit its pending copies."""
        self._want = max(self._want, self._since)
        self._since = 0
        self._submit()

    def _submit(self) -> None:
        """Submit the pending copies (one command buffer) and switch arenas."""
        if not self._pending:
            self._used = 0  # what was staged was dropped: the (mapped) arena is free again
            return
        arena = self._arenas[self._cur]
        arena.unmap()
        enc = self._device.create_command_encoder()
        for dst, off, dst_off, n in self._pending:
            enc.copy_buffer_to_buffer(arena, off, dst, dst_off, n)
        self._device.queue.submit([enc.finish()])
        self.submits += 1
        self._counts.submits += 1
        self._pending.clear()
        self._used = 0
        self._cur ^= 1

    def drop(self, dst: Any) -> None:
        """Forget pending writes to ``dst`` (being destroyed: a copy into it may not run)."""
        self._pending = [p for p in self._pending if p[0] is not dst]

    def destroy(self) -> None:
        """Let go of both arenas, which wgpu releases once nothing holds them (pending writes
        are dropped: flush first to keep them). Not ``buffer.destroy()``: on wgpu's OpenGL
        backend that made a later submit in the process abort."""
        self._pending.clear()
        self._arenas = [None, None]
        self._used = 0


class StagedReads:
    """Read-backs of one device: every source copied into persistent mapped-read staging
    buffers (at most ``max_buffer`` bytes each) in one submit, one map per staging buffer,
    and each source's bytes handed to ``consume`` while mapped: one device round trip for
    the lot, and no fresh host memory per read (the context's ``read_tensors`` and the d2h
    calibration both read this way, so the floor is timed on the page's path). ``how``:
    how each map waits (``MapHow``)."""

    def __init__(self, device: Any, max_buffer: int, counts: QueueCounts | None = None,
                 how: MapHow | None = None) -> None:
        self._device = device
        self.max_buffer = max_buffer
        self.buffers: list[Any] = []  # persistent; grown, never shrunk
        self.counts = counts if counts is not None else QueueCounts()
        self.how = how or MapHow()

    def read(self, sources: Sequence[tuple[Any, int]],
             consume: Callable[[int, np.ndarray], None]) -> None:
        """Copy each ``(buffer, nbytes)`` back; ``consume(i, bytes_i)`` gets a uint8 view of
        source i's first nbytes that is valid only during the call (copy out of it)."""
        slots, used = _pack([buf.size for buf, _n in sources], self.max_buffer)
        self.buffers += [None] * (len(used) - len(self.buffers))
        enc = self._device.create_command_encoder()
        for b, n in enumerate(used):
            st = self.buffers[b]
            if st is None or st.size < n:
                if st is not None:
                    st.destroy()
                self.buffers[b] = self._device.create_buffer(
                    size=max(n, 1 << 16),
                    usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        for (buf, _n), (b, off) in zip(sources, slots, strict=True):
            enc.copy_buffer_to_buffer(buf, 0, self.buffers[b], off, buf.size)
        self._device.queue.submit([enc.finish()])
        self.counts.submits += 1
        _consume(self.buffers, slots, {i: n for i, (_b, n) in enumerate(sources)}, consume,
                 self.counts, self.how)

    def destroy(self) -> None:
        for st in self.buffers:
            if st is not None:
                st.destroy()
        self.buffers.clear()


class ReadStaging:
    """Mapped-read staging for a fixed list of source buffers, packed as ``StagedReads``
    packs them. The copies are encoded by the caller into a command buffer of its own (the
    context: at the end of a dispatch's last one), so a later read maps and does not
    submit. The buffers persist: a command buffer recorded ahead may still copy into them."""

    def __init__(self, device: Any, sources: Sequence[Any], max_buffer: int) -> None:
        self.sources = list(sources)
        self.slots, used = _pack([b.size for b in self.sources], max_buffer)
        self.buffers = [device.create_buffer(
            size=max(n, 16), usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            for n in used]

    def encode(self, enc: Any) -> None:
        """Copy every source, whole, into its place."""
        for src, (b, off) in zip(self.sources, self.slots, strict=True):
            enc.copy_buffer_to_buffer(src, 0, self.buffers[b], off, src.size)

    def read(self, want: dict[int, int], consume: Callable[[int, np.ndarray], None],
             counts: QueueCounts, how: MapHow) -> None:
        """``consume(i, bytes)`` for each wanted source i (its first ``want[i]`` bytes as of
        the last copy that ran), one map per staging buffer that holds one."""
        _consume(self.buffers, self.slots, want, consume, counts, how)

    def destroy(self) -> None:
        for st in self.buffers:
            st.destroy()
        self.buffers.clear()
