"""Operand data types: the spec's names, the host NumPy type, and the device storage type.

Every device element is 4 bytes (WGSL ``f32``/``i32``/``u32``) except ``float16``, stored as
WGSL ``f16`` (2 bytes): a context offers it only where the adapter has 'shader-f16'
(``MLContext._unsupported``). Kernels index elements, not bytes, so one indexing scheme
still serves all; byte counts use ``DType.itemsize``.

DEVIATION: ``int64`` is stored as ``i32`` on the device (WGSL has no 64-bit integers);
``write_tensor`` and ``constant`` range-check values and raise ``DataError`` outside int32.
DEVIATION: ``uint8`` (the output of comparison ops, the condition of ``where``) is stored as
``u32`` on the device; the host sees ``uint8``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import DataError


@dataclass(frozen=True)
class DType:
    """One WebNN data type and how it lives on the host and on the device."""

    name: str
    host: type  # numpy scalar type the page sees
    wgsl: str  # device element type
    device_np: type  # numpy type of the device representation

    @property
    def is_float(self) -> bool:
        return self.wgsl in ("f32", "f16")

    @property
    def itemsize(self) -> int:
        """Device bytes per element."""
        return np.dtype(self.device_np).itemsize


DTYPES: dict[str, DType] = {
    "float32": DType("float32", np.float32, "f32", np.float32),
    "float16": DType("float16", np.float16, "f16", np.float16),
    "int32": DType("int32", np.int32, "i32", np.int32),
    "int64": DType("int64", np.int64, "i32", np.int32),
    "uint32": DType("uint32", np.uint32, "u32", np.uint32),
    "uint8": DType("uint8", np.uint8, "u32", np.uint32),
}


def dtype(name: str) -> DType:
    """Look up a data type by its spec name; TypeError for unknown or unsupported ones."""
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise TypeError(
            f"unsupported data type {name!r}; supported: {', '.join(DTYPES)}"
        ) from None


def to_device(value, dt: DType, count: int) -> np.ndarray:
    """Convert host data to the device representation, checking size and int64 range."""
    arr = np.asarray(value)
    if arr.size != count:
        raise TypeError(f"data has {arr.size} elements, the tensor has {count}")
    if dt.name == "int64" or (dt.name == "uint8" and arr.dtype.kind in "iu"):
        if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
            raise DataError("int64 value outside the int32 range stored on the device")
    host = arr.astype(dt.host, copy=False)
    return np.ascontiguousarray(host.astype(dt.device_np, copy=False)).reshape(-1)


def from_device(raw: np.ndarray, dt: DType, shape: tuple[int, ...]) -> np.ndarray:
    """Device representation back to the page's NumPy type and shape."""
    return raw.astype(dt.host, copy=False).reshape(shape)
