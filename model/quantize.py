"""4-bit block quantisation of matrix weights (the ``+q4`` presets), and its two packings.

Symmetric, 32 weights a block along the input dimension K of a (K, N) matrix, one scale a
block: w ≈ q · s with q an integer in [-7, 7] and s = max|w| / 7 rounded to a float16 value.
Rounding the scale to float16 makes every dequantised weight q · s exact in float32 (4 bits
times 11), so the float64 reference, ORT and the WebNN pages all see the same weights and
quantisation is no error of any of them; it also makes the quantisation idempotent
(``quantise(dequantise(q, s)) == (q, s)``), so an exporter recovers (q, s) from a
workload's dequantised weights and checks them.

Packings (one source of (q, s), two layouts):
- ORT ``MatMulNBits`` (com.microsoft, bits 4): B uint8 (N, K/32, 16), column n's block b
  holding q + 8 (the op's default zero point, 2^(bits-1), when none is given) two to a byte,
  the lower K index in the low nibble; scales (N, K/32), stored flat as ORT's quantizer
  writes them.
- ONNX ``int4`` / WebNN ``int4``: the (K, N) tensor row-major, two elements a byte, the
  lower flat index in the low nibble; scales (K/32, N) (DequantizeLinear ``block_size`` 32
  on axis 0; WebNN ``dequantizeLinear`` with a (K/32, N) scale: a block of (32, 1)).
"""

from __future__ import annotations

import numpy as np

#: weights a block along the input dimension
Q4_BLOCK = 32
#: the largest magnitude of a quantised weight (symmetric: -8 is never used)
Q4_MAX = 7


def quantise(w: np.ndarray, block: int = Q4_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 (K, N) in [-7, 7], scales float32 (K/block, N) holding float16 values)."""
    k, n = w.shape
    if k % block:
        raise ValueError(f"input dimension {k} is not a multiple of the block size {block}")
    blocks = np.asarray(w, np.float64).reshape(k // block, block, n)
    amax = np.max(np.abs(blocks), axis=1)
    scales = (amax / Q4_MAX).astype(np.float16).astype(np.float64)
    safe = np.where(scales > 0, scales, 1.0)
    q = np.clip(np.rint(blocks / safe[:, None, :]), -Q4_MAX, Q4_MAX).astype(np.int8)
    return q.reshape(k, n), scales.astype(np.float32)


def dequantise(q: np.ndarray, scales: np.ndarray, block: int = Q4_BLOCK) -> np.ndarray:
    """The float32 (K, N) weights q · s (exact: ``quantise``'s scales are float16 values)."""
    k, n = q.shape
    s = np.repeat(np.asarray(scales, np.float32), block, axis=0)
    return (q.astype(np.float32) * s).reshape(k, n)


#: columns quantised at a time by ``round_trip``: a 128k-vocab head keeps its float64
#: temporaries to a few hundred MB
ROUND_TRIP_COLUMNS = 8192


def round_trip(w: np.ndarray) -> np.ndarray:
    """``w`` as its 4-bit model stores it: dequantise(quantise(w)), a slab of columns at a
    time."""
    out = np.empty(w.shape, np.float32)
    for c in range(0, w.shape[1], ROUND_TRIP_COLUMNS):
        out[:, c:c + ROUND_TRIP_COLUMNS] = dequantise(*quantise(w[:, c:c + ROUND_TRIP_COLUMNS]))
    return out


def recover(w: np.ndarray, name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """(q, scales) of weights that are already 4-bit values; ValueError when they are not
    (a workload built without ``+q4``, or stale weights)."""
    q, s = quantise(w)
    if not np.array_equal(dequantise(q, s), np.asarray(w, np.float32)):
        raise ValueError(f"{name} is not a 4-bit block-quantised matrix")
    return q, s


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Signed 4-bit values, flat in row-major order, two a byte (low nibble first): uint8."""
    flat = np.asarray(q, np.int8).reshape(-1)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    nib = (flat.astype(np.uint8) & 0xF).reshape(-1, 2)
    return (nib[:, 0] | (nib[:, 1] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, count: int, signed: bool = True) -> np.ndarray:
    """``pack_int4``'s inverse: ``count`` values, int8 (signed) or uint8."""
    b = np.asarray(packed, np.uint8).reshape(-1)
    nib = np.stack([b & 0xF, b >> 4], axis=1).reshape(-1)[:count]
    if not signed:
        return nib.astype(np.uint8)
    return (nib.astype(np.int8) ^ 8) - 8


def pack_matmulnbits(q: np.ndarray, scales: np.ndarray,
                     block: int = Q4_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(B uint8 (N, K/block, block/2), scales float32 (N, K/block)) in MatMulNBits' layout."""
    k, n = q.shape
    codes = (q.astype(np.int16) + 8).astype(np.uint8).T.reshape(n, k // block, block // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return np.ascontiguousarray(packed, np.uint8), np.ascontiguousarray(scales.T, np.float32)
