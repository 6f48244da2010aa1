"""ORT's ``com.microsoft::MatMulNBits`` (onnxruntime-genai's int4 exports) as WebNN ops:
``matmul(A, dequantizeLinear(uint4 W (K, N), scales (K/block, N), zero points))``, the
blockwise form the standard flavour builds for ``+q4``, so ``wgpu_impl/match_q4`` runs it
as the 4-bit gemv where it matches. Packing from ORT's ContribOperators.md: B is uint8
``[N, ceil(K/block), block/2]``, element k of a block in byte k/2, the even one in the low
nibble; scales ``[N * blocks]`` (or ``[N, blocks]``); zero points uint8, each row's
``blocks`` nibbles packed the same way (a row padded to a whole byte), 8 where absent.
The codes are transposed on the host once, at conversion. Registered into
``onnx_converter``'s handler table on import."""

from __future__ import annotations

import numpy as np

from .onnx_converter import ConversionError, Packed4, _Converter, _op


def _nibbles(packed: np.ndarray, rows: int, count: int) -> np.ndarray:
    """(rows, count) uint8 values from ``rows`` runs of low-nibble-first packed bytes."""
    raw = np.ascontiguousarray(packed, dtype=np.uint8).reshape(rows, -1)
    both = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(rows, -1)
    if both.shape[1] < count:
        raise ConversionError(f"{rows} rows of {raw.shape[1]} bytes hold fewer than {count} "
                              "4-bit values a row")
    return both[:, :count]


def _packed(values: np.ndarray) -> Packed4:
    """A uint4 constant of ``values``' shape, low nibble first (WebNN's layout)."""
    flat = values.reshape(-1).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return Packed4("uint4", tuple(values.shape), (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8))


@_op("MatMulNBits")
def _matmul_nbits(c: _Converter, node, attrs):
    """Y = A @ dequantize(B)ᵀ (+ bias); 4 bits, uint8 zero points or none (8); no g_idx."""
    where = f"MatMulNBits node {node.name or node.output[0]!r}"
    k, n = int(attrs["K"]), int(attrs["N"])
    bits, block = int(attrs.get("bits", 4)), int(attrs["block_size"])
    given = [i < len(node.input) and bool(node.input[i]) for i in range(6)]
    if bits != 4:
        raise ConversionError(f"{where}: bits {bits} is not supported (4 only)")
    if given[4]:
        raise ConversionError(f"{where}: g_idx (act-order) is not supported")
    blocks = -(-k // block)
    codes = _nibbles(c.const_input(node, 1, "B"), n, blocks * block)  # (N, K padded)
    scale = np.asarray(c.const_input(node, 2, "scales")).reshape(n, blocks)
    if given[3]:
        zp = np.asarray(c.const_input(node, 3, "zero_points"))
        if zp.dtype != np.uint8:
            raise ConversionError(f"{where}: {zp.dtype} zero points are not supported "
                                  "(uint8 packed 4-bit only)")
        zp = _nibbles(zp, n, blocks)
    else:
        zp = np.full((n, blocks), 8, np.uint8)
    b = c.builder
    w = b.dequantize_linear(c._constant(_packed(np.ascontiguousarray(codes.T))),
                            c._constant(np.ascontiguousarray(scale.T)),
                            c._constant(_packed(np.ascontiguousarray(zp.T))))
    a = c.operand(node.input[0])
    shape = list(c._shape(a))
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
