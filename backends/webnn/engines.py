"""The WebGPU engines the WebNN implementation runs on, and what differs between them.

wgpu-py (module ``wgpu``: wgpu-native, Firefox's engine, shaders compiled by naga) and
wgpudawn (module ``wgpudawn``: Dawn, Chrome's engine, shaders compiled by Tint) have the same
API, install side by side and load into one process; a context picks its engine
(``ml.create_context(engine="dawn")``). Everything else in ``wgpu_impl`` is the same code on
both. The buffer-usage, map-mode and shader-stage flags are WebGPU's own bit values, the same in
both modules, so the implementation takes them from ``wgpu``. See docs/dawn.md.
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple


class PassCalls(NamedTuple):
    """A compute pass's three hot calls, the NULL for no dynamic offsets, and what they
    take in place of an object (its C handle, or the object itself for wgpu-py's methods)."""

    set_pipeline: Callable[..., Any]  # (pass, pipeline)
    set_bind_group: Callable[..., Any]  # (pass, index, bind group, 0, null)
    dispatch: Callable[..., Any]  # (pass, x, y, z)
    null: Any
    handle: Callable[[Any], Any]


class QueueCalls(NamedTuple):
    """A decode step's queue calls on its critical path (not overlapped with the device):
    the submit, the small writes (a token, a position), the spinning map wait's poll and
    the read of the mapped logits.
    Each goes through the engine's C function or wgpu-py's method (``Engine.queue_calls``)."""

    submit: Callable[[Any, list[Any]], None]  # (queue, command buffers)
    write: Callable[[Any, Any, Any], None]  # (queue, buffer, C-contiguous array): at offset 0
    poll: Callable[[Any], Callable[[bool], None] | None]  # device -> its poll(block), or None
    #: (mapped buffer, offset, size) -> a read-only buffer over those mapped bytes, valid
    #: until the buffer is unmapped (the caller lets go of it first)
    mapped: Callable[[Any, int, int], Any]
    #: (buffer, offset, size, poll) -> None: a read map through the engine's C function,
    #: polled (``poll(False)``) until its callback has run; None: wgpu-py's ``map_async``
    map_spin: Callable[[Any, int, int, Callable[[bool], None]], None] | None = None
    unmap: Callable[[Any], None] = lambda buf: buf.unmap()  # after map_spin's map: C's


@dataclass(frozen=True)
class Engine:
    """One WebGPU engine: where its Python API lives and how it spells what differs."""

    name: str  # the backend family and create_context's engine= ("wgpu", "dawn")
    implementation: str  # "wgpu-native", "Dawn"
    module: str  # the Python module with wgpu-py's API
    native: str  # its backend package, ``<module>.backends.<native>`` (version, extras)
    compiler: str  # its WGSL compiler
    #: the feature that gives subgroup builtins (WebGPU: "subgroups"; wgpu-native: "subgroup")
    subgroup_feature: str
    #: the feature for timestamps at any point of a pass (per-launch profiles)
    inside_passes_feature: str
    #: its compiler wants ``enable subgroups;`` before subgroup builtins (naga rejects it)
    enable_subgroups: bool
    #: its compiler gives ``storageBarrier()`` device scope (naga: the storage writes of one
    #: workgroup visible to another's after an atomic hand-over, as the last-workgroup
    #: combines need); WGSL promises workgroup scope only, and Tint gives that
    device_barrier: bool = False
    #: its ``map_sync`` submits an empty command buffer before a read map (wgpu-py's
    #: workaround for wgpu-native#305; wgpudawn's does not), counted by the context
    submits_before_map: bool = False
    #: its Python package waits for the device in a thread of its own and wakes the caller
    #: (wgpu-py's ``PollThread``), so a read map may block in the caller's poll instead
    #: (``staging.MapHow``); Dawn's waits in the caller already
    poll_thread: bool = False
    #: device toggles turned off (Dawn): timestamp quantization, which Chrome keeps on for
    #: pages and which would round every GPU time to Dawn's quantum
    disable_toggles: tuple[str, ...] = ()
    #: features the engine keeps off its adapters by design on some hardware, whatever
    #: the driver offers: (feature, backend API, PCI vendor id, why), see ``withholds``
    withheld: tuple[tuple[str, str, int, str], ...] = ()
    #: its device poll as a C function of (device, wait, NULL) (wgpu-native's
    #: ``wgpuDevicePoll``); "" where the Python package's poll is something else (Dawn's
    #: ``wgpuInstanceProcessEvents``), which is then called as wgpu-py's
    poll_function: str = ""

    def api(self) -> ModuleType:
        """The engine's module (ImportError where it is not installed)."""
        return importlib.import_module(self.module)

    def version(self) -> str:
        """The Python package's version and the native library's, e.g. 'wgpu 0.32.0 /
        wgpu-native 29.0.1.1'."""
        api = self.api()
        native = importlib.import_module(f"{self.module}.backends.{self.native}")
        return f"{self.module} {api.__version__} / {self.implementation} {native.__version__}"

    def pass_calls(self, direct: bool = True) -> PassCalls:
        """A compute pass's hot path. ``direct``: the engine's own C functions, called on
        the objects' handles. wgpu-py's methods wrap each call in an error scope
        (wgpu-native) and build a dynamic-offsets array per bind group: most of a launch's
        encoding cost, paid ~170 times a decode step. A pass command's error is kept by
        the pass and reported when it ends, which still goes through wgpu-py."""
        if not direct:
            return PassCalls(lambda cp, pipe: cp.set_pipeline(pipe),
                             lambda cp, i, bg, _n, _null: cp.set_bind_group(i, bg),
                             lambda cp, x, y, z: cp.dispatch_workgroups(x, y, z),
                             None, lambda obj: obj)
        ffi = importlib.import_module(f"{self.module}.backends.{self.native}._ffi")
        lib = ffi.lib
        return PassCalls(lib.wgpuComputePassEncoderSetPipeline,
                         lib.wgpuComputePassEncoderSetBindGroup,
                         lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.ffi.NULL,
                         operator.attrgetter("_internal"))

    def withholds(self, feature: str, info: Mapping[str, Any]) -> str:
        """Why this engine keeps ``feature`` off an adapter with this ``info`` by design
        ("" where it does not): a lacking feature the driver has is then no fault of ours."""
        for name, api, vendor, why in self.withheld:
            if (name == feature and str(info.get("backend_type", "")) == api
                    and info.get("vendor_id") == vendor):
                return why
        return ""

    def queue_calls(self, direct: bool = True, maps: bool = False) -> QueueCalls:
        """The step's queue calls. ``direct``: the engine's C functions on the objects'
        handles. wgpu-py's methods check their arguments in Python and wrap each call in an
        error scope (a Python proxy with its own bookkeeping, several µs a call): the
        spinning map wait polls a couple of hundred times a step. Our callers pass what
        wgpu-py would check (whole command buffers, a write that fits its buffer); an
        error of the engine is still reported, as an uncaptured one. ``maps`` (with
        ``direct``): read maps through the C API too (``map_spin``): no ``map_async`` in
        Python (a callback, a promise and a struct made per map) and no wake-up of wgpu-py's
        poll thread, whose blocking poll runs beside the caller's spin; wgpu-py then never
        sees those buffers mapped, so they are read and unmapped through C as well."""
        if not direct:
            return QueueCalls(lambda q, cbs: q.submit(cbs),
                              lambda q, buf, data: q.write_buffer(buf, 0, data),
                              lambda dev: getattr(dev, "_poll", None),
                              lambda buf, off, n: buf.read_mapped(off, n, copy=False))
        mod = importlib.import_module(f"{self.module}.backends.{self.native}._ffi")
        lib, ffi = mod.lib, mod.ffi
        submit_c, write_c, new, from_buffer = (lib.wgpuQueueSubmit, lib.wgpuQueueWriteBuffer,
                                               ffi.new, ffi.from_buffer)
        range_c, as_buffer = lib.wgpuBufferGetConstMappedRange, ffi.buffer

        def submit(q: Any, cbs: list[Any]) -> None:
            submit_c(q._internal, len(cbs), new("WGPUCommandBuffer[]", [c._internal for c in cbs]))

        def write(q: Any, buf: Any, data: Any) -> None:
            write_c(q._internal, buf._internal, 0, from_buffer(data), data.nbytes)

        def poll(dev: Any) -> Callable[[bool], None] | None:
            if not self.poll_function:
                return getattr(dev, "_poll", None)
            poll_c, handle, null = getattr(lib, self.poll_function), dev._internal, ffi.NULL
            return lambda block: poll_c(handle, block, null)

        def mapped(buf: Any, off: int, n: int) -> Any:
            return as_buffer(range_c(buf._internal, off, n), n)

        if not maps:
            return QueueCalls(submit, write, poll, mapped)
        done: list[int | None] = [None]  # the status of the map in flight (one at a time)

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def on_mapped(status: int, _message: Any, _u1: Any, _u2: Any) -> None:
            done[0] = status

        map_c, unmap_c, read_mode = lib.wgpuBufferMapAsync, lib.wgpuBufferUnmap, lib.WGPUMapMode_Read
        info = ffi.new("WGPUBufferMapCallbackInfo *")
        info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        info.callback = on_mapped
        success = lib.WGPUMapAsyncStatus_Success

        keep = (on_mapped, info)  # the C callback lives as long as map_spin does

        def map_spin(buf: Any, off: int, n: int, poll_fn: Callable[[bool], None]) -> None:
            done[0] = None
            map_c(buf._internal, read_mode, off, n, keep[1][0])
            while done[0] is None:
                poll_fn(False)
            if done[0] != success:
                raise RuntimeError(f"could not map a buffer for reading (status {done[0]})")

        def unmap(buf: Any) -> None:
            unmap_c(buf._internal)

        return QueueCalls(submit, write, poll, mapped, map_spin, unmap)

    def request_adapter(self, power_preference: str = "high-performance") -> Any:
        """The engine's adapter; raises where the engine or a driver fails."""
        return self.api().gpu.request_adapter_sync(power_preference=power_preference)

    def request_device(self, adapter: Any, features: list[str], limits: dict[str, int]) -> Any:
        """A device with ``features`` and ``limits``, and this engine's toggles."""
        if self.disable_toggles:
            extras = importlib.import_module(f"{self.module}.backends.{self.native}.extras")
            return extras.request_device_sync(adapter, required_features=features,
                                              required_limits=limits,
                                              disable_toggles=list(self.disable_toggles))
        return adapter.request_device_sync(required_features=features, required_limits=limits)


#: NVIDIA's PCI vendor id, as adapters report it (``info["vendor_id"]``)
NVIDIA = 0x10DE

ENGINES: dict[str, Engine] = {
    "wgpu": Engine("wgpu", "wgpu-native", "wgpu", "wgpu_native", "naga", "subgroup",
                   "timestamp-query-inside-passes", enable_subgroups=False,
                   submits_before_map=True, poll_thread=True, poll_function="wgpuDevicePoll",
                   device_barrier=True),
    "dawn": Engine("dawn", "Dawn", "wgpudawn", "dawn", "Tint", "subgroups",
                   "chromium-experimental-timestamp-query-inside-passes", enable_subgroups=True,
                   disable_toggles=("timestamp_quantization",),
                   withheld=(("shader-f16", "Vulkan", NVIDIA,
                              "Dawn withholds it on NVIDIA under Vulkan by design, unless "
                              "its adapter toggle vulkan_enable_f16_on_nvidia is on (off by "
                              "default; crbug.com/42251215, docs/dawn.md)"),)),
}


def engine(name: str) -> Engine:
    """The engine called ``name``; ValueError naming the accepted ones otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown WebGPU engine {name!r}; accepted: {', '.join(ENGINES)}") from None
