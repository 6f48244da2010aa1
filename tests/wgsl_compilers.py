"""naga and Tint as WGSL checkers for the tests: a device of each engine that only compiles.

naga's is a wgpu-native device (any adapter: lavapipe in CI); Tint's is a device of Dawn's Null
backend, which validates WGSL as Chrome does and needs no driver (docs/dawn.md). Each is made
once per test session, with shader-f16 and the engine's subgroup feature where it has them.
"""

from __future__ import annotations

import os
from typing import Any

from backends.webnn.engines import ENGINES
from backends.webnn.kernels.common import module_source

_devices: dict[str, tuple[Any, str]] = {}  # engine -> (device or None, why not)
_verdicts: dict[tuple[str, str], str] = {}  # (engine, kernel source) -> "" or the error


def _make(name: str) -> Any:
    eng = ENGINES[name]
    api = eng.api()
    if name == "dawn":  # the Null backend is given out only when asked for by name
        before = os.environ.get("WGPU_BACKEND_TYPE")
        os.environ["WGPU_BACKEND_TYPE"] = "Null"
        try:
            adapter = api.gpu.request_adapter_sync()
        finally:
            if before is None:
                del os.environ["WGPU_BACKEND_TYPE"]
            else:
                os.environ["WGPU_BACKEND_TYPE"] = before
    else:
        adapter = api.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        raise RuntimeError("no adapter")
    feats = [f for f in ("shader-f16", eng.subgroup_feature) if f in adapter.features]
    return adapter.request_device_sync(required_features=feats)


def compiler_device(name: str) -> tuple[Any, str]:
    """(device, "") for engine ``name``'s compiler, or (None, why there is none here)."""
    if name not in _devices:
        try:
            _devices[name] = (_make(name), "")
        except Exception as exc:  # noqa: BLE001 - not installed, no driver: a reason to skip
            why = " ".join(str(exc).split())[:200]
            _devices[name] = (None, f"{ENGINES[name].compiler} ({ENGINES[name].module}) "
                                    f"cannot compile here: {why}")
    return _devices[name]


def rejection(name: str, wgsl: str) -> str:
    """"" where engine ``name``'s compiler accepts kernel ``wgsl`` (as a context of that
    engine would submit it: ``module_source``), else its error in one line. The engine's
    compiler must exist here (``compiler_device``)."""
    key = (name, wgsl)
    if key not in _verdicts:
        device, why = compiler_device(name)
        assert device is not None, why
        try:
            device.create_shader_module(code=module_source(wgsl, ENGINES[name].enable_subgroups))
            _verdicts[key] = ""
        except Exception as exc:  # noqa: BLE001 - the compiler's error is the verdict
            _verdicts[key] = " ".join(str(exc).split())
    return _verdicts[key]
