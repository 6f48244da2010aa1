"""WGSL source generators, one module per op family. Shapes are baked into the source at
build time (each kernel is specialised to its shapes; pipelines are cached by source)."""

from .common import Kernel

__all__ = ["Kernel"]
