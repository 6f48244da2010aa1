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
from collections.abc import Callable
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


ENGINES: dict[str, Engine] = {
    "wgpu": Engine("wgpu", "wgpu-native", "wgpu", "wgpu_native", "naga", "subgroup",
                   "timestamp-query-inside-passes", enable_subgroups=False,
                   submits_before_map=True, poll_thread=True),
    "dawn": Engine("dawn", "Dawn", "wgpudawn", "dawn", "Tint", "subgroups",
                   "chromium-experimental-timestamp-query-inside-passes", enable_subgroups=True,
                   disable_toggles=("timestamp_quantization",)),
}


def engine(name: str) -> Engine:
    """The engine called ``name``; ValueError naming the accepted ones otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown WebGPU engine {name!r}; accepted: {', '.join(ENGINES)}") from None
