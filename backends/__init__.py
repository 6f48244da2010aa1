"""Backends: the WebNN API on wgpu (`backends.webnn`), the wgpu page modes and ONNX Runtime."""

import importlib

#: modules that register backends; a missing optional dependency only marks its backends
#: unavailable (each backend's `available()` says why), so importing here must not fail.
BACKEND_MODULES = ("backends.ort", "backends.pages", "backends.genai")


def load_all() -> None:
    for mod in BACKEND_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
