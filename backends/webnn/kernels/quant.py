"""Quantised weights: dequantizeLinear with block scales, and a 4-bit matrix-vector product
that dequantises in registers (the decode step's projections on ``+q4`` models).

Packed ``int4``/``uint4`` operands are ``u32`` words, element i in nibble i % 8 of word
i / 8 (dtypes.py); ``uint8`` and ``int32`` are one element a word.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import shapes as S
from .common import Kernel, decl, esize, grid, main_1d

#: WGSL type of each quantised input's storage words
STORAGE = {"int4": "u32", "uint4": "u32", "uint8": "u32", "int32": "i32"}


def load_fn(name: str, array: str, kind: str) -> str:
    """WGSL ``fn name(j: u32) -> f32``: element j of a quantised array, as a float."""
    if kind == "int4":  # sign-extend the nibble: move it to the top, shift back arithmetically
        body = (f"  let w = {array}[j / 8u];\n"
                "  return f32(bitcast<i32>(w << (28u - (j % 8u) * 4u)) >> 28u);\n")
    elif kind == "uint4":
        body = f"  return f32(({array}[j / 8u] >> ((j % 8u) * 4u)) & 15u);\n"
    else:
        body = f"  return f32({array}[j]);\n"
    return f"fn {name}(j: u32) -> f32 {{\n{body}}}\n"


def _stored_bytes(kind: str, count: int) -> int:
    return -(-count // 2) if kind in ("int4", "uint4") else 4 * count


def dequantize_linear(kind: str, shape: Sequence[int], block: Sequence[int], out_t: str) -> Kernel:
    """out[c] = (x[c] - zp[c / block]) * scale[c / block] for every coordinate c of
    ``shape`` (row-major), ``block`` the block size per axis (``_classes.blocks``)."""
    n = S.size(shape)
    sshape = [d // b for d, b in zip(shape, block, strict=True)]
    sst = S.strides(sshape)
    gx, gy, gz = grid(n)
    src = (decl(0, "x", STORAGE[kind], "read") + decl(1, "scale", out_t, "read")
           + decl(2, "zp", STORAGE[kind], "read") + decl(3, "out", out_t, "rw")
           + load_fn("xq", "x", kind) + load_fn("zq", "zp", kind))
    lines = ["fn scale_index(i: u32) -> u32 {", "  var r = i;", "  var o = 0u;"]
    for ax in range(len(shape) - 1, -1, -1):
        d, b, st = shape[ax], block[ax], sst[ax]
        coord = "r" if ax == 0 else f"(r % {d}u)"
        if st and sshape[ax] > 1:
            lines.append(f"  o = o + ({coord} / {b}u) * {st}u;")
        if ax:
            lines.append(f"  r = r / {d}u;")
    lines += ["  return o;", "}"]
    src += "\n".join(lines) + "\n"
    src += (main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n  let s = scale_index(i);\n"
            f"  out[i] = {out_t}((xq(i) - zq(s)) * f32(scale[s]));\n}}\n")
    ns = S.size(sshape)
    traffic = _stored_bytes(kind, n) + ns * (esize(out_t) + 4) + n * esize(out_t)
    return Kernel("dequantize_linear", src, ["read", "read", "read", "rw"], (gx, gy, gz), traffic)
