"""The one probe for a WebGPU adapter: backends' `available()` and the calibration ask here."""

from __future__ import annotations

from typing import Any


def wgpu_adapter(engine: str = "wgpu") -> tuple[object | None, str]:
    """(adapter, "") or (None, why there is none): the engine's module missing, a driver
    error, no adapter. ``engine``: "wgpu" (wgpu-native) or "dawn" (``engines.py``; another
    name: ValueError, as create_context says)."""
    from .engines import engine as engine_named

    eng = engine_named(engine)
    try:
        eng.api()
    except Exception as exc:  # noqa: BLE001 - any import failure means "not installed"
        return None, f"{eng.module} is not installed ({exc})"
    try:
        adapter = eng.request_adapter()
    except Exception as exc:  # noqa: BLE001 - any driver failure means "no adapter"
        return None, f"{eng.module} has no adapter ({' '.join(str(exc).split())})"
    if adapter is None:
        return None, f"{eng.module} has no adapter"
    return adapter, ""


def is_cpu_adapter(adapter: Any) -> bool:
    """A software adapter (lavapipe, SwiftShader): the device is the host's cores, so there is
    no GPU clock to raise and no encoder/device overlap to win."""
    info = dict(adapter.info) if hasattr(adapter, "info") else {}
    return str(info.get("adapter_type", "")).lower() == "cpu"
