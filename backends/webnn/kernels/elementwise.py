"""Element-wise ops (unary, binary, comparison, where, cast, expand) with broadcasting."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .. import shapes as S
from .common import Kernel, decl, esize, grid, main_1d, offset_fn

_BINARY = {
    "add": "a0 + a1", "sub": "a0 - a1", "mul": "a0 * a1", "div": "a0 / a1",
    "max": "max(a0, a1)", "min": "min(a0, a1)",
}
_COMPARE = {
    "equal": "==", "not_equal": "!=", "greater": ">", "lesser": "<", "lesser_or_equal": "<=",
    "greater_or_equal": ">=",
}
_UNARY_F = {
    "sqrt": "sqrt(a0)", "exp": "exp(a0)", "log": "log(a0)",
    "sigmoid": "1.0 / (1.0 + exp(-a0))",
    "softplus": "max(a0, 0.0) + log(1.0 + exp(-abs(a0)))",
    "tanh": "tanh(clamp(a0, -15.0, 15.0))",
    "reciprocal": "1.0 / a0", "cos": "cos(a0)", "sin": "sin(a0)", "floor": "floor(a0)",
    "ceil": "ceil(a0)", "erf": "werf(a0)", "gelu": "0.5 * a0 * (1.0 + werf(a0 * 0.70710678))",
    "tan": "tan(a0)", "round_even": "round(a0)",  # WGSL's round: halves to even
}


def expression(op: str, in_types: Sequence[str], out_type: str,
               attrs: Mapping[str, Any] | None = None) -> str:
    """WGSL expression of one element, inputs named a0, a1, a2. ``attrs``: the node's
    (a cast's ``wrap``: the 8-bit type it narrows to, ``dtypes``)."""
    if out_type == "f16" and (op in _BINARY or op in _UNARY_F or op == "pow"):
        # float16 arithmetic is computed in float32 and rounded once (WGSL's f16 builtins
        # may be several ulp off, and the float32 helpers have no f16 overloads)
        e = expression(op, ["f32" if t == "f16" else t for t in in_types], "f32")
        return "f16(" + re.sub(r"\ba(\d)\b", r"f32(a\1)", e) + ")"
    if op in _BINARY:
        return _BINARY[op]
    if op == "pow":
        if out_type == "f32":
            return "wpow(a0, a1)"
        return f"{out_type}(round(wpow(f32(a0), f32(a1))))"
    if op in _COMPARE:
        return f"select(0u, 1u, a0 {_COMPARE[op]} a1)"
    if op in _UNARY_F:
        return _UNARY_F[op]
    if op == "neg":
        return "-a0"
    if op == "abs":
        return "a0" if out_type == "u32" else "abs(a0)"
    if op == "sign":  # a NaN compares false both ways: 0
        t = out_type
        return f"select(select({t}(0), {t}(-1), a0 < {t}(0)), {t}(1), a0 > {t}(0))"
    if op == "relu":
        return f"max(a0, {out_type}(0))"
    if op in ("identity", "expand"):
        return "a0"
    if op == "logical_not":
        return "select(0u, 1u, a0 == 0u)"
    if op == "logical_and":
        return "select(0u, 1u, a0 != 0u && a1 != 0u)"
    if op == "logical_or":
        return "select(0u, 1u, a0 != 0u || a1 != 0u)"
    if op == "logical_xor":
        return "select(0u, 1u, (a0 != 0u) != (a1 != 0u))"
    if op == "is_infinite":  # on the bits, as is_nan
        x = "a0" if in_types[0] == "f32" else "f32(a0)"
        return f"select(0u, 1u, (bitcast<u32>({x}) & 0x7fffffffu) == 0x7f800000u)"
    if op == "is_nan":  # on the bits: a compiler may fold a0 != a0 to false
        x = "a0" if in_types[0] == "f32" else "f32(a0)"
        return f"select(0u, 1u, (bitcast<u32>({x}) & 0x7fffffffu) > 0x7f800000u)"
    if op == "where":
        return "select(a2, a1, a0 != 0u)"
    if op == "cast":
        src = in_types[0]
        wrap = (attrs or {}).get("wrap")
        if wrap:
            return _narrowed(wrap, src)
        if src == out_type:
            return "a0"
        if out_type == "u32" and src in ("f32", "f16"):
            return "u32(max(a0, 0.0))"
        return f"{out_type}(a0)"
    raise NotImplementedError(op)


def _narrowed(wrap: str, src: str) -> str:
    """A cast to int8 or uint8, held in a 32-bit word: the value's lowest 8 bits, read as
    the target type (the spec's rule between integer types; a float is truncated toward
    zero first, and one out of range, which the spec leaves implementation-defined, is
    saturated to 32 bits by WGSL's conversion first)."""
    if wrap == "int8":
        x = "a0" if src == "i32" else "i32(a0)"
        return f"(({x} << 24u) >> 24u)"
    x = "a0" if src == "u32" else ("u32(max(a0, 0.0))" if src in ("f32", "f16") else "u32(a0)")
    return f"({x} & 0xffu)"


def elementwise(op: str, in_types: Sequence[str], in_shapes: Sequence[Sequence[int]],
                out_type: str, out_shape: Sequence[int], *, alias: int | None = None,
                guarded: bool = False, out_dtype_name: str = "",
                attrs: Mapping[str, Any] | None = None,
                bases: Sequence[int] | None = None) -> Kernel:
    """One thread per output element; broadcast inputs read with 0 strides.

    ``alias``: index of an input that is the output buffer itself (an in-place state
    update); it is read through the output binding, since WebGPU forbids one buffer bound
    read-only and writable in the same dispatch. ``guarded``: the kernel writes nothing
    when the stateful capacity check failed (status binding last). ``bases``: per input and
    then the output, the element its binding's index 0 is at (a split launch's ranges start
    at aligned offsets: ``row_chunks``).
    """
    bases = list(bases) if bases is not None else [0] * (len(in_types) + 1)
    n = S.size(out_shape)
    gx, gy, gz = grid(n)
    src = ""
    bindings: list[str] = []
    names = []
    for k, (t, shp) in enumerate(zip(in_types, in_shapes, strict=False)):
        src += offset_fn(f"off{k}", out_shape,
                         S.broadcast_strides(shp, out_shape), bases[k])
        if k == alias:
            names.append("out")
            continue
        src += decl(len(bindings), f"in{k}", t, "read")
        names.append(f"in{k}")
        bindings.append("read")
    src += decl(len(bindings), "out", out_type, "rw")
    bindings.append("rw")
    if guarded:
        src += decl(len(bindings), "status", "u32", "read")
        bindings.append("read")
    src += main_1d(gx)
    src += f"  if (i >= {n}u) {{ return; }}\n"
    if guarded:
        src += "  if (status[0] != 0u) { return; }\n"
    for k, nm in enumerate(names):
        src += f"  let a{k} = {nm}[off{k}(i)];\n"
    at = f"i + {bases[-1]}u" if bases[-1] else "i"
    src += f"  out[{at}] = {expression(op, in_types, out_type, attrs)};\n}}\n"
    traffic = (sum(esize(t) * S.size(s) for k, (t, s) in enumerate(zip(in_types, in_shapes,
                                                                        strict=True))
                   if k != alias) + esize(out_type) * n)
    if alias is not None:
        traffic += esize(out_type) * n  # the aliased state is still read
    return Kernel(op, src, bindings, (gx, gy, gz), traffic)


#: storage-binding offsets are multiples of this (WebGPU's largest
#: minStorageBufferOffsetAlignment, so it holds on every adapter)
OFFSET_ALIGN = 256


def row_chunks(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]],
               itemsizes: Sequence[int], limit: int) -> tuple[list[tuple[int, int]], list[bool]]:
    """How an element-wise op too large for one storage binding is split: ranges of rows of
    the output's first axis, each operand's bytes of a range within ``limit`` less
    ``OFFSET_ALIGN`` (a range is bound from the aligned offset below it, the rest reached by
    the kernel's ``bases``); and per input whether it is read by rows (its first axis is the
    output's) or whole (broadcast along it: bound whole in every launch). ``itemsizes``: the
    inputs' and then the output's. ValueError where no split fits (a row, or a broadcast
    input, beyond the limit)."""
    rows = out_shape[0]
    by_rows = [len(s) == len(out_shape) and s[0] == rows and rows > 1 for s in in_shapes]
    ranged = [(S.size(s[1:]) * e) for s, e, r in zip(in_shapes, itemsizes, by_rows, strict=False)
              if r] + [S.size(out_shape[1:]) * itemsizes[-1]]
    for s, e, r in zip(in_shapes, itemsizes, by_rows, strict=False):
        if not r and S.size(s) * e > limit:
            raise ValueError(f"a broadcast input of {S.size(s) * e} bytes exceeds the "
                             f"{limit}-byte storage binding limit")
    per = (limit - OFFSET_ALIGN) // max(ranged)
    if per < 1:
        raise ValueError(f"rows of {max(ranged)} bytes cannot be split within the {limit}-byte "
                         "storage binding limit")
    return [(r0, min(r0 + per, rows)) for r0 in range(0, rows, per)], by_rows


def flat_view(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]
              ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The shapes an element-wise op is split on: all 1-D where each input is the output's
    shape or a single element (every row then as short as can be), else as given."""
    n = S.size(out_shape)
    if all(tuple(s) == tuple(out_shape) or S.size(s) == 1 for s in in_shapes):
        return (n,), [(n,) if S.size(s) == n else (1,) for s in in_shapes]
    return tuple(out_shape), [tuple(s) for s in in_shapes]
