"""Operand data types: the spec's names, the host NumPy type, and the device storage type.

Every device element is 4 bytes (WGSL ``f32``/``i32``/``u32``) except ``float16``, stored as
WGSL ``f16`` (2 bytes): a context offers it only where the adapter has 'shader-f16'
(``MLContext._unsupported``). Kernels index elements, not bytes, so one indexing scheme
still serves all; byte counts use ``DType.itemsize``.

DEVIATION: ``int64`` is stored as ``i32`` on the device (WGSL has no 64-bit integers);
``write_tensor`` and ``constant`` range-check values and raise ``DataError`` outside int32.
``int4`` / ``uint4`` have two device layouts. A constant is packed as the spec's buffer is
(two elements a byte, the lower index in the low nibble) and uploaded as those bytes, read
as ``u32`` words (eight elements a word, element i in nibble i % 8): a 4-bit model's weights
take half a byte an element. Any other int4/uint4 operand (a graph input, a
``quantizeLinear`` result: what an MLTensor holds) is one element a ``u32`` word, the
element's nibble in bits 0-3 and the rest zero, so kernels stay element-indexed as for
int8/uint8; only the host boundary packs: ``write_tensor`` takes the spec's packed buffer
and unpacks it (``to_device``), ``read_tensor`` returns it packed again (``from_device``:
an odd element count leaves the last byte's high nibble zero). Which layout a node has
follows from its kind (constant or not: ``kernels/quant``). DEVIATION: only
``quantizeLinear`` (its zeroPoint and output) and ``dequantizeLinear`` (its input and
zeroPoint) take int4/uint4 operands (``MLGraphBuilder``), besides graph inputs and outputs.
DEVIATION: ``uint8`` (the output of comparison ops, the condition of ``where``) is stored as
``u32`` on the device, ``int8`` as ``i32``; the host sees ``uint8`` / ``int8``. A cast to
either keeps the value's lowest 8 bits (``kernels/elementwise``), so the word always holds
the 8-bit value; ``op_limits`` lists where int8 is taken (casts and data movement, not
arithmetic, whose results would not wrap at 8 bits).
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
    bits: int = 0  # sub-byte types: bits an element, packed (int4, uint4); 0 otherwise

    @property
    def packed(self) -> bool:
        return self.bits != 0

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
    "int8": DType("int8", np.int8, "i32", np.int32),
    "uint8": DType("uint8", np.uint8, "u32", np.uint32),
    "int4": DType("int4", np.uint8, "u32", np.uint32, bits=4),
    "uint4": DType("uint4", np.uint8, "u32", np.uint32, bits=4),
}


def packed_bytes(dt: DType, count: int) -> int:
    """Bytes of a packed constant of ``count`` elements (the spec's buffer length)."""
    return -(-count * dt.bits // 8)


def unpack_nibbles(raw: np.ndarray) -> np.ndarray:
    """The 4-bit values of packed bytes (two a byte, the low nibble first: WebNN's and
    ONNX's int4/uint4 layout), as uint8 along the last axis, twice as long."""
    raw = np.asarray(raw, np.uint8)
    return np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(*raw.shape[:-1], -1)


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """``unpack_nibbles`` undone: 4-bit values (an even count along the last axis) as
    bytes, two a byte, the low nibble first."""
    v = np.asarray(values).astype(np.uint8) & 0xF
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


def _packed_buffer(value, dt: DType, count: int) -> np.ndarray:
    """The page's buffer of a packed type as flat bytes; TypeError when it is not the
    ``packed_bytes`` of uint8 the descriptor says."""
    raw = np.asarray(value)
    if raw.dtype != np.uint8 or raw.size != packed_bytes(dt, count):
        raise TypeError(f"{dt.name} data of {count} elements needs a uint8 buffer of "
                        f"{packed_bytes(dt, count)} bytes (two elements a byte), got "
                        f"{raw.dtype} x {raw.size}")
    return raw.reshape(-1)


def unpacked_words(value, dt: DType, count: int) -> np.ndarray:
    """The spec's packed buffer of ``count`` 4-bit elements as device words, one element a
    ``u32`` (its nibble; the layout of non-constant int4/uint4 operands)."""
    nibbles = unpack_nibbles(_packed_buffer(value, dt, count))[:count]
    return nibbles.astype(np.uint32)


def packed_buffer(words: np.ndarray, count: int) -> np.ndarray:
    """``unpacked_words`` undone: ``count`` one-a-word 4-bit elements as the spec's buffer
    (an odd count leaves the last byte's high nibble zero)."""
    v = np.asarray(words).reshape(-1)[:count].astype(np.uint8) & 0xF
    if count % 2:
        v = np.concatenate([v, np.zeros(1, np.uint8)])
    return pack_nibbles(v)


def packed_words(value, dt: DType, count: int) -> np.ndarray:
    """A packed constant's bytes as the device's u32 words (zero-padded); TypeError when the
    buffer is not the ``packed_bytes`` the descriptor says."""
    flat = _packed_buffer(value, dt, count)
    pad = -flat.size % 4
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, np.uint8)])
    return np.ascontiguousarray(flat).view(np.uint32)


def dtype(name: str) -> DType:
    """Look up a data type by its spec name; TypeError for unknown or unsupported ones."""
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise TypeError(
            f"unsupported data type {name!r}; supported: {', '.join(DTYPES)}"
        ) from None


_INT32 = np.iinfo(np.int32)


def to_device(value, dt: DType, count: int) -> np.ndarray:
    """Convert host data to the device representation, checking size and int64 range; a
    packed type's data is the spec's buffer (``unpacked_words``)."""
    if dt.packed:
        return unpacked_words(value, dt, count)
    arr = np.asarray(value)
    if arr.size != count:
        raise TypeError(f"data has {arr.size} elements, the tensor has {count}")
    if dt.name == "int64" or (dt.name == "uint8" and arr.dtype.kind in "iu"):
        lo, hi = (arr.item(),) * 2 if arr.size == 1 else (
            (arr.min(), arr.max()) if arr.size else (0, 0))  # a token, a position: no reductions
        if lo < _INT32.min or hi > _INT32.max:
            raise DataError("int64 value outside the int32 range stored on the device")
    host = arr.astype(dt.host, copy=False)
    return np.ascontiguousarray(host.astype(dt.device_np, copy=False)).reshape(-1)


def from_device(raw: np.ndarray, dt: DType, shape: tuple[int, ...]) -> np.ndarray:
    """Device representation back to the page's NumPy type and shape; a packed type's is
    the spec's buffer, flat (``packed_buffer``: it has no element shape)."""
    if dt.packed:
        return packed_buffer(raw, int(np.prod(shape, dtype=np.int64)))
    return raw.astype(dt.host, copy=False).reshape(shape)
