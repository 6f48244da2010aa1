"""ORT's ``com.microsoft::MatMulNBits`` and ``GatherBlockQuantized`` (onnxruntime-genai's int4
exports; the second is its tied int4 embedding) as WebNN ops. MatMulNBits is
``matmul(A, dequantizeLinear(uint4 W (K, N), scales (K/block, N), zero points))``, the
blockwise form the standard flavour builds for ``+q4``, so ``wgpu_impl/match_q4`` runs it
as the 4-bit gemv where it matches. Packing from ORT's ContribOperators.md: B is uint8
``[N, ceil(K/block), block/2]``, element k of a block in byte k/2, the even one in the low
nibble; scales ``[N * blocks]`` (or ``[N, blocks]``); zero points uint8, each row's
``blocks`` nibbles packed the same way (a row padded to a whole byte), 8 where absent.
``bits`` 8 is the same a byte a value (zero point 128 where absent): uint8 dequantizeLinear,
which the 4-bit gemv does not take.
The codes are transposed on the host once, at conversion. Registered into
``convert_core``'s handler table on import (``onnx_converter`` imports this module)."""

from __future__ import annotations

import numpy as np

from .convert_core import ConversionError, Converter, Packed4, handles
from .dtypes import pack_nibbles, unpack_nibbles


def _values(packed: np.ndarray, rows: int, count: int, bits: int) -> np.ndarray:
    """(rows, count) uint8 values from ``rows`` runs of packed bytes: two 4-bit values a
    byte, low nibble first, or one 8-bit value a byte."""
    raw = np.ascontiguousarray(packed, dtype=np.uint8).reshape(rows, -1)
    both = raw if bits == 8 else unpack_nibbles(raw)
    if both.shape[1] < count:
        raise ConversionError(f"{rows} rows of {raw.shape[1]} bytes hold fewer than {count} "
                              f"{bits}-bit values a row")
    return both[:, :count]


def _weights(values: np.ndarray, bits: int) -> np.ndarray | Packed4:
    """A uint4 constant of ``values``' shape, low nibble first (WebNN's layout), or uint8."""
    if bits == 8:
        return np.ascontiguousarray(values, dtype=np.uint8)
    flat = values.reshape(-1).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return Packed4("uint4", tuple(values.shape), pack_nibbles(flat))


@handles("MatMulNBits")
def _matmul_nbits(c: Converter, node, attrs):
    """Y = A @ dequantize(B)ᵀ (+ bias); 4 or 8 bits, uint8 zero points or none (the middle
    code); no g_idx."""
    where = f"MatMulNBits node {node.name or node.output[0]!r}"
    k, n = int(attrs["K"]), int(attrs["N"])
    bits, block = int(attrs.get("bits", 4)), int(attrs["block_size"])
    given = [i < len(node.input) and bool(node.input[i]) for i in range(6)]
    if bits not in (4, 8):
        raise ConversionError(f"{where}: bits {bits} is not supported (4 or 8)")
    if given[4]:
        raise ConversionError(f"{where}: g_idx (act-order) is not supported")
    blocks = -(-k // block)
    codes = _values(c.const_input(node, 1, "B"), n, blocks * block, bits)  # (N, K padded)
    scale = np.asarray(c.const_input(node, 2, "scales")).reshape(n, blocks)
    if given[3]:
        zp = np.asarray(c.const_input(node, 3, "zero_points"))
        if zp.dtype != np.uint8:
            raise ConversionError(f"{where}: {zp.dtype} zero points are not supported "
                                  "(packed uint8 only)")
        zp = _values(zp, n, blocks, bits)
    else:
        zp = np.full((n, blocks), 1 << (bits - 1), np.uint8)
    b = c.builder
    w = b.dequantize_linear(c.constant(_weights(codes.T, bits)),
                            c.constant(np.ascontiguousarray(scale.T)),
                            c.constant(_weights(zp.T, bits)))
    a = c.operand(node.input[0])
    shape = list(c.shape(a))
    if shape[-1] != k:
        raise ConversionError(f"{where}: A's last axis is {shape[-1]}, K is {k}")
    if blocks * block != k:  # the last block's codes beyond K meet zeros
        a = b.pad(a, [0] * len(shape), [0] * (len(shape) - 1) + [blocks * block - k])
    if len(shape) == 1:
        a = b.reshape(a, [1, blocks * block])
    y = b.matmul(a, w)
    if len(shape) == 1:
        y = b.reshape(y, [n])
    if given[5]:
        y = b.add(y, c.operand(node.input[5]))
    return y


@handles("GatherBlockQuantized")
def _gather_block_quantized(c: Converter, node, attrs):
    """Rows of a 4-bit table (the genai builder's tied int4 embedding), dequantised after
    the gather: the codes kept a byte a value, each block's scale and zero point · scale
    gathered beside them, so only the gathered rows are dequantised."""
    where = f"GatherBlockQuantized node {node.name or node.output[0]!r}"
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
    gather_axis, quantize_axis = int(attrs.get("gather_axis", 0)), int(attrs.get("quantize_axis", 1))
    data = c.const_input(node, 0, "data")
    if isinstance(data, Packed4):
        rows, cols = data.shape[0], int(np.prod(data.shape[1:], dtype=np.int64))
        codes = _values(data.data, 1, rows * cols, 4).reshape(rows, cols)
        signed = data.data_type == "int4"
        rank = len(data.shape)
    else:
        data = np.asarray(data)
        if data.dtype != np.uint8:
            raise ConversionError(f"{where}: {data.dtype} data is not supported (uint8, int4, uint4)")
        rows, rank, signed = data.shape[0], data.ndim, False
        codes = _values(data.reshape(rows, -1), rows, data[0].size * 8 // bits, bits)
        cols = codes.shape[1]
    if bits != 4 or rank != 2 or gather_axis != 0 or quantize_axis % rank != rank - 1:
        raise ConversionError(f"{where}: bits {bits}, gather_axis {gather_axis}, quantize_axis "
                              f"{quantize_axis} on rank {rank} is not supported (4 bits, a 2-D "
                              "table gathered on axis 0, quantised along axis 1)")
    if cols % block:
        raise ConversionError(f"{where}: block_size {block} does not divide the row ({cols})")
    blocks = cols // block
    scale = np.asarray(c.const_input(node, 2, "scales")).reshape(rows, blocks)
    if len(node.input) > 3 and node.input[3]:
        zp = c.const_input(node, 3, "zero_points")
        zp = _values(zp.data if isinstance(zp, Packed4) else zp, rows, blocks, 4).astype(np.int64)
        if signed:
            zp = (zp ^ 8) - 8
    else:
        # uint8 data follows MatMulNBits (8); int4 and uint4 data have zero points of 0
        zp = np.full((rows, blocks), 0 if isinstance(data, Packed4) else 8, np.int64)
    if signed:  # a byte a code, offset by 8 (v + 8 = raw ^ 8), the zero point with it
        codes, zp = codes ^ 8, zp + 8
    b = c.builder
    ind = c.operand(node.input[1])
    lead = list(c.shape(ind))
    q = b.gather(c.constant(codes), ind, axis=0)
    q = b.reshape(b.cast(q, scale.dtype.name), lead + [blocks, block])
    s = b.reshape(b.gather(c.constant(scale), ind, axis=0), lead + [blocks, 1])
    z = b.reshape(b.gather(c.constant((zp * scale).astype(scale.dtype)), ind, axis=0),
                  lead + [blocks, 1])
    return b.reshape(b.sub(b.mul(q, s), z), lead + [cols])
