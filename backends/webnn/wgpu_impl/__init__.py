"""The WebNN API implemented on wgpu-py."""

from .context import WgpuContext, WgpuGraph, WgpuTensor

__all__ = ["WgpuContext", "WgpuGraph", "WgpuTensor"]
