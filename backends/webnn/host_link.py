"""The context's host link for a caller's own device and buffers (statebench extension).

An MLContext writes a large tensor by staging it in a mapped arena and copying it over in one
submit, and reads tensors back by copying them into persistent mapped-read staging, mapping
once and copying into the page's arrays. `HostLink` is those two paths on buffers the caller
made, so a measurement of the host link (the calibration's h2d and d2h) times what a page's
`write_tensor` and `read_tensor` do, through a public API.

    with HostLink(device, max_bytes=n) as link:
        link.write(buffer, host_array)       # submitted now; wait on the queue to time it
        link.read_into(buffer, host_array)   # returns when the bytes are in host_array
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .wgpu_impl.staging import StagedReads, StagedWrites


class HostLink:
    """Staged writes and reads of one wgpu device, as the WebNN context makes them.
    `max_bytes`: the largest write or read the caller makes (the staging grows to it once).
    `close()` (or leaving a `with` block) frees the staging."""

    def __init__(self, device: Any, max_bytes: int) -> None:
        self._writes = StagedWrites(device, limit=max_bytes)
        self._reads = StagedReads(device, max_buffer=max_bytes)

    def write(self, dst: Any, data: np.ndarray) -> None:
        """Copy `data` into `dst` from offset 0 through the mapped arena and submit the copy
        (the submit returns before the device has run it)."""
        self._writes.write(dst, data)
        self._writes.flush()

    def read_into(self, src: Any, out: np.ndarray) -> None:
        """Fill the C-contiguous array `out` with the first `out.nbytes` bytes of `src`
        (the whole of `src` goes through staging, as the context reads a tensor's buffer)."""
        if not out.flags.c_contiguous:
            raise ValueError("read_into needs a C-contiguous array")
        raw = out.reshape(-1).view(np.uint8)

        def fill(_i: int, data: np.ndarray) -> None:
            raw[...] = data

        self._reads.read([(src, out.nbytes)], fill)

    def close(self) -> None:
        self._writes.destroy()
        self._reads.destroy()

    def __enter__(self) -> HostLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
