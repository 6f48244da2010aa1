"""`backends.webnn.host_link.HostLink`: the context's staged write and read paths on a
caller's own buffers carry the bytes exactly, and free their staging."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def device():
    from backends.webnn.adapter import wgpu_adapter

    adapter, why = wgpu_adapter()
    if adapter is None:
        pytest.skip(f"no WebGPU adapter: {why}")
    return adapter.request_device_sync()


def test_written_bytes_read_back_exactly(device):
    import wgpu

    from backends.webnn.host_link import HostLink

    rng = np.random.default_rng()
    n = 3 * (1 << 16) + 4  # past one 64 KiB staging buffer, not a power of two
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    buf = device.create_buffer(size=4 * n, usage=usage)
    with HostLink(device, max_bytes=4 * n) as link:
        for _ in range(3):  # the arenas alternate, the read staging is reused
            data = rng.standard_normal(n).astype(np.float32)
            link.write(buf, data)
            # an oracle that shares no code with the link: wgpu-py's own read
            np.testing.assert_array_equal(np.frombuffer(device.queue.read_buffer(buf), np.float32),
                                          data)
            out = np.full(n, np.nan, np.float32)
            link.read_into(buf, out)
            np.testing.assert_array_equal(out, data)
        head = np.empty(n // 2, np.float32)  # the first bytes only
        link.read_into(buf, head)
        np.testing.assert_array_equal(head, data[:n // 2])
        with pytest.raises(ValueError, match="C-contiguous"):
            link.read_into(buf, np.empty((n, 2), np.float32)[:, 0])
    buf.destroy()
