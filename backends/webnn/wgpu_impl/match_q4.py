"""4-bit matrix-vector products: ``matmul(one row, dequantizeLinear(4-bit constant W, scale,
zeroPoint))`` run by ``kernels/quant.gemv_q4``, which reads the codes and dequantises in
registers. The dequantizeLinear then has no launch (nothing else reads it), so no float
weights are written: a q4 decode step streams half a byte a weight plus its block's scale.

Matched where W is a 2-D int4/uint4 constant (K, N) with K a multiple of 8, its scale and
zero point are constants of shape (K / block, N) with the block a multiple of 8 (a code word
never straddles two blocks), and the product's input is a single row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import shapes as S
from .._classes import MLOperand, blocks
from ..dtypes import pack_nibbles, unpack_nibbles
from ..stateful import root


@dataclass
class Q4Weight:
    """A matched product's weights: the dequantizeLinear and its constant operands."""

    dq: MLOperand
    K: int
    N: int
    block: int
    zero_points: bool  # any zero point non-zero (else the kernel leaves its term out)

    @property
    def format(self) -> tuple[int, bool, bool]:
        """What one kernel needs alike across stacked products."""
        return (self.block, self.signed, self.zero_points)

    @property
    def f16_weights(self) -> bool:
        """The dequantised weights are float16 (float16 scales): a float16 graph's product,
        which may multiply in float16 (``_h`` kernels); a float32 one keeps float32's
        precision."""
        return self.dq._inputs[1]._value.dtype == np.float16

    @property
    def f16_scales(self) -> bool:
        """Every scale is a float16 value (a float16 model's, or float32 ones that are):
        the several-rows kernel may read them as float16 pairs, losing nothing."""
        s = self.dq._inputs[1]._value
        return s.dtype == np.float16 or bool(np.array_equal(
            s.astype(np.float16).astype(s.dtype), s))

    @property
    def quad_fits(self) -> bool:
        """The four-rows-a-load kernel (``quant_rows.gemv_q4_quad``) takes these weights: a
        16-byte load of 32 codes never straddles a block or the row's end."""
        return self.block % 32 == 0 and self.K % 32 == 0

    @property
    def codes(self) -> MLOperand:
        return self.dq._inputs[0]

    @property
    def signed(self) -> bool:
        return self.codes._dtype.name == "int4"


def match_q4(nodes: list[MLOperand]) -> dict[int, Q4Weight]:
    """matmul id -> its 4-bit weights, for every product the kernel can run."""
    out: dict[int, Q4Weight] = {}
    for o in nodes:
        if o._kind != "op" or o._op != "matmul" or o._dtype.name != "float32":
            continue
        a, b = o._inputs
        dq = widened(root(b))
        if (dq._kind != "op" or dq._op != "dequantize_linear" or len(dq._shape) != 2
                or tuple(b._shape) != tuple(dq._shape) or S.size(a._shape[:-1]) != 1):
            continue
        codes, scale, zp = dq._inputs
        if (codes._dtype.name not in ("int4", "uint4")
                or any(x._kind != "constant" for x in (codes, scale, zp))):
            continue
        K, N = dq._shape
        bk, bn = blocks(dq._shape, scale._shape)
        if bn != 1 or K % 8 or bk % 8:
            continue
        zero = bool(np.any(_nibbles(zp, zp._dtype.name == "int4")))
        out[o._id] = Q4Weight(dq, K, N, bk, zero)
    return out


def widened(o: MLOperand) -> MLOperand:
    """The float16 dequantizeLinear a float32 ``cast`` of it reads (a float16 model's
    product, widened by the builder: ``MLGraphBuilder._widened``), else ``o``: the kernel
    reads the codes and scales alike, the float16 scales widened exactly at upload."""
    if o._kind == "op" and o._op == "cast" and o._inputs[0]._dtype.name == "float16":
        src = root(o._inputs[0])
        if src._kind == "op" and src._op == "dequantize_linear":
            return src
    return o


def _nibbles(o: MLOperand, signed: bool) -> np.ndarray:
    """A packed constant's elements (int8), in its shape."""
    raw = np.ascontiguousarray(o._value).view(np.uint8).reshape(-1)
    nib = unpack_nibbles(raw)[:S.size(o._shape)]
    vals = (nib.astype(np.int8) ^ 8) - 8 if signed else nib.astype(np.int8)
    return vals.reshape(o._shape)


#: ``repack_codes(pairs=True)``: the element of its word each nibble holds (elements 2m and
#: 2m + 1 in nibbles m and m + 4: one shift and mask yields the pair, ``quant_rows._unpack_half_fns``)
PAIR_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])


def repack_codes(w: Q4Weight, n0: int, nc: int, pairs: bool = False) -> np.ndarray:
    """Codes of columns [n0, n0 + nc) as (nc, K), eight a u32 word (made at upload): element
    k in nibble k % 8 of word k / 8, or with ``pairs`` in ``PAIR_ORDER`` within the word."""
    codes = _nibbles(w.codes, False)[:, n0:n0 + nc]  # raw nibbles, (K, nc)
    rows = np.ascontiguousarray(codes.T)  # (nc, K)
    if pairs:
        rows = np.ascontiguousarray(rows.reshape(nc, -1, 8)[:, :, PAIR_ORDER].reshape(nc, -1))
    packed = pack_nibbles(rows)  # (nc, K/2)
    return np.ascontiguousarray(packed).reshape(-1).view(np.uint32)


def repack_scales(w: Q4Weight, n0: int, nc: int, zero_terms: bool) -> np.ndarray:
    """Columns [n0, n0 + nc) as (nc, K/block) float32: the scales, or -zeroPoint · scale."""
    s = w.dq._inputs[1]._value.astype(np.float32).reshape(-1, w.N)[:, n0:n0 + nc]
    if zero_terms:
        zp = _nibbles(w.dq._inputs[2], w.signed).reshape(-1, w.N)[:, n0:n0 + nc]
        s = -zp.astype(np.float32) * s
    return np.ascontiguousarray(s.T).reshape(-1)


def interleave_rows(values: Any, rows: int, width: int = 4) -> np.ndarray:
    """The (rows, per-row) 32-bit values made by ``values()`` (codes, scales) with ``width``
    rows interleaved element by element, rows padded with zeros to a multiple of ``width``
    (``quant_rows.gemv_q4_quad``: one 16-byte load is a code word of each of 4 rows)."""
    v = values().reshape(rows, -1)
    pad = -rows % width
    if pad:
        v = np.concatenate([v, np.zeros((pad, v.shape[1]), v.dtype)])
    return np.ascontiguousarray(v.reshape(-1, width, v.shape[1]).transpose(0, 2, 1)).reshape(-1)


def paired_rows(values: Any, half: int) -> np.ndarray:
    """The (2 · half, per-row) 32-bit values made by ``values()`` for two stacked
    products of ``half`` rows each (``half`` even), reordered two rows of each at a time:
    rows 2m and 2m + 1 of the first, then of the second (``quant_rows.gemv_q4_quad`` with
    ``gated``: one group of 4 rows holds both products' values at two indices)."""
    v = values().reshape(2, half // 2, 2, -1)
    return np.ascontiguousarray(v.transpose(1, 0, 2, 3)).reshape(-1)


def packed_half(values: Any) -> np.ndarray:
    """Float32 values made by ``values()`` (float16 ones) as float16, two to a u32 word, the
    count padded to even (``gemv_q4_multi`` half_scales)."""
    v = values().astype(np.float16)
    if v.size % 2:
        v = np.append(v, np.float16(0))
    return v.view(np.uint32)
