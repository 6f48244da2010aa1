"""Batched uploads for ``write_tensor`` (what a browser's ``writeBuffer`` staging ring does)
and batched read-backs for ``readTensor``.

A page that keeps its caches on the host writes every one of them before each dispatch (32
tensors for llama-1b). Giving each write its own mapped staging buffer costs a device round
trip per write (``map_sync`` waits for the buffer's last copy): 32 round trips a step, which
at small depths is most of the step. Here writes are copied into one mapped staging arena and
become a single submit of copies when the queue next has to run something (a dispatch, a
read, a small ``write_buffer``, a reset): one map per arena per step. Two arenas alternate,
so the host fills one while the device copies out of the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import wgpu

#: the largest arena (a page writing more than this between dispatches flushes every arena's
#: worth, and a write larger than this goes through in arena-sized pieces)
ARENA_MAX = 256 << 20
_ALIGN = 256  # offsets of pieces in an arena


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class StagedWrites:
    """Pending writes of one device queue, copied on ``flush``."""

    def __init__(self, device: Any, limit: int = ARENA_MAX) -> None:
        self._device = device
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
        self._pending.clear()
        self._used = 0
        self._cur ^= 1

    def drop(self, dst: Any) -> None:
        """Forget pending writes to ``dst`` (being destroyed: a copy into it may not run)."""
        self._pending = [p for p in self._pending if p[0] is not dst]


class StagedReads:
    """Read-backs of one device: every source copied into persistent mapped-read staging
    buffers (at most ``max_buffer`` bytes each) in one submit, one map per staging buffer,
    and each source's bytes handed to ``consume`` while mapped: one device round trip for
    the lot, and no fresh host memory per read (the context's ``read_tensors`` and the d2h
    calibration both read this way, so the floor is timed on the page's path)."""

    def __init__(self, device: Any, max_buffer: int) -> None:
        self._device = device
        self.max_buffer = max_buffer
        self.buffers: list[Any] = []  # persistent; grown, never shrunk

    def read(self, sources: Sequence[tuple[Any, int]],
             consume: Callable[[int, np.ndarray], None]) -> None:
        """Copy each ``(buffer, nbytes)`` back; ``consume(i, bytes_i)`` gets a uint8 view of
        source i's first nbytes that is valid only during the call (copy out of it)."""
        bins: list[list[tuple[int, int]]] = [[]]  # per staging buffer: (source, offset)
        used = [0]
        for i, (buf, _n) in enumerate(sources):
            if used[-1] and used[-1] + buf.size > self.max_buffer:
                bins.append([])
                used.append(0)
            bins[-1].append((i, used[-1]))
            used[-1] += buf.size  # whole buffers: sizes are multiples of 4 as copies need
        self.buffers += [None] * (len(bins) - len(self.buffers))
        enc = self._device.create_command_encoder()
        for b, members in enumerate(bins):
            st = self.buffers[b]
            if st is None or st.size < used[b]:
                if st is not None:
                    st.destroy()
                st = self.buffers[b] = self._device.create_buffer(
                    size=max(used[b], 1 << 16),
                    usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            for i, off in members:
                enc.copy_buffer_to_buffer(sources[i][0], 0, st, off, sources[i][0].size)
        self._device.queue.submit([enc.finish()])
        for b, members in enumerate(bins):
            st = self.buffers[b]
            st.map_sync(wgpu.MapMode.READ, 0, used[b])
            view = st.read_mapped(0, used[b], copy=False)
            raw = np.frombuffer(view, np.uint8)
            for i, off in members:
                consume(i, raw[off:off + sources[i][1]])
            del raw, view  # no export of the mapped range may outlive unmap
            st.unmap()

    def destroy(self) -> None:
        for st in self.buffers:
            if st is not None:
                st.destroy()
        self.buffers.clear()
