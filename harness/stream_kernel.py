"""The streaming kernel (read one buffer, write another): the calibration's device-bandwidth
probe and the heater's load, one pipeline for both."""

from __future__ import annotations

from typing import Any

STREAM_WGSL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = gid.x + gid.y * n.x * 256u;
    if (i < arrayLength(&dst)) { dst[i] = src[i] * 1.0001; }
}
"""


class StreamKernel:
    """`dst = src * 1.0001` over `nbytes` (a multiple of 16): each dispatch reads and writes
    every byte once, in a 2-D grid when one dimension's 65535 workgroups are too few."""

    def __init__(self, device: Any, src: Any, dst: Any, nbytes: int) -> None:
        shader = device.create_shader_module(code=STREAM_WGSL)
        self.pipeline = device.create_compute_pipeline(
            layout="auto", compute={"module": shader, "entry_point": "main"})
        self.group = device.create_bind_group(
            layout=self.pipeline.get_bind_group_layout(0), entries=[
                {"binding": 0, "resource": {"buffer": src, "offset": 0, "size": nbytes}},
                {"binding": 1, "resource": {"buffer": dst, "offset": 0, "size": nbytes}},
            ])
        groups = -(-(nbytes // 16) // 256)
        self.gx = min(groups, 65535)
        self.gy = -(-groups // self.gx)

    def encode(self, enc: Any, times: int, timestamp_writes: dict | None = None) -> None:
        """`times` dispatches in one compute pass."""
        cp = enc.begin_compute_pass(timestamp_writes=timestamp_writes)
        cp.set_pipeline(self.pipeline)
        cp.set_bind_group(0, self.group)
        for _ in range(times):
            cp.dispatch_workgroups(self.gx, self.gy, 1)
        cp.end()
