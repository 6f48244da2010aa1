"""Batched uploads for ``write_tensor``: what a browser's ``writeBuffer`` staging ring does.

A page that keeps its caches on the host writes every one of them before each dispatch (32
tensors for llama-1b). Giving each write its own mapped staging buffer costs a device round
trip per write (``map_sync`` waits for the buffer's last copy): 32 round trips a step, which
at small depths is most of the step. Here writes are copied into one mapped staging arena and
become a single submit of copies when the queue next has to run something (a dispatch, a
read, a small ``write_buffer``, a reset): one map per arena per step. Two arenas alternate,
so the host fills one while the device copies out of the other.
"""

from __future__ import annotations

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
