"""The spatial upsampling ops: resample2d and convTranspose2d, one invocation per output
element each (the builder widens float16 to float32: ``t`` is f32 here)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import shapes as S
from .common import Kernel, decl, esize, grid, main_1d

#: |values| the exact integer coordinate arithmetic may reach before i32 overflows
_I32_SAFE = 2**31 - 1


def _coords(shape: Sequence[int]) -> str:
    """WGSL declaring ``c0 .. c{r-1}``, the coordinates of output element ``i`` (row-major)."""
    src = "  var r = i;\n"
    for ax in range(len(shape) - 1, -1, -1):
        src += f"  let c{ax} = r % {shape[ax]}u;\n  r = r / {shape[ax]}u;\n"
    return src


def _source_coord(ax: int, size_in: int, size_out: int, mode: str) -> str:
    """WGSL for axis ``ax``'s input coordinate: the spec's half-pixel
    ``(c + 0.5) * in / out - 0.5`` clamped to [0, in - 1]. Nearest takes
    ``ceil(coordinate - 0.5)`` (ties to the smaller index), computed as the integer
    ``ceil(((2c + 1) * in - 2 * out) / (2 * out))``: exact, where float arithmetic would
    round a tie (in / out = 2/3) either way. Linear keeps ``lo{ax}``, ``hi{ax}`` and the
    weight ``t{ax}`` of ``hi``; its coordinate is one division of exact integers."""
    i, o, last = size_in, size_out, size_in - 1
    exact = (2 * o + 1) * i + 2 * o <= _I32_SAFE
    if mode == "nearest-neighbor":
        if exact:
            return (f"  let q{ax} = (2 * i32(c{ax}) + 1) * {i} - {2 * o};\n"
                    f"  let s{ax} = u32(min(select(0, (q{ax} + {2 * o - 1}) / {2 * o}, "
                    f"q{ax} > 0), {last}));\n")
        return (f"  let s{ax} = u32(ceil(clamp((f32(c{ax}) + 0.5) * {i / o!r} - 0.5, 0.0, "
                f"{float(last)!r}) - 0.5));\n")
    u = (f"f32((2 * i32(c{ax}) + 1) * {i} - {o}) / {float(2 * o)!r}" if exact
         else f"(f32(c{ax}) + 0.5) * {i / o!r} - 0.5")
    return (f"  let u{ax} = clamp({u}, 0.0, {float(last)!r});\n"
            f"  let lo{ax} = u32(floor(u{ax}));\n  let hi{ax} = u32(ceil(u{ax}));\n"
            f"  let t{ax} = u{ax} - floor(u{ax});\n")


def resample2d(t: str, in_shape: Sequence[int], out_shape: Sequence[int],
               axes: Sequence[int], mode: str) -> Kernel:
    """resample2d over ``axes`` (two distinct axes, any order) of a 4-D tensor: nearest reads
    one input element, linear four, blended along the first axis, then the second (the
    spec's ``vy0``, ``vy1``, output)."""
    n = S.size(out_shape)
    gx, gy, gz = grid(n)
    ist = S.strides(in_shape)
    a, b = axes
    src = decl(0, "x", t, "read") + decl(1, "out", t, "rw") + main_1d(gx)
    src += f"  if (i >= {n}u) {{ return; }}\n" + _coords(out_shape)
    base = " + ".join([f"c{k} * {ist[k]}u" for k in range(4) if k not in axes] or ["0u"])
    src += f"  let base = {base};\n"
    for ax in axes:
        src += _source_coord(ax, in_shape[ax], out_shape[ax], mode)
    if mode == "nearest-neighbor":
        src += f"  out[i] = x[base + s{a} * {ist[a]}u + s{b} * {ist[b]}u];\n}}\n"
        reads = n
    else:
        def at(pa: str, pb: str) -> str:
            return f"x[base + {pa}{a} * {ist[a]}u + {pb}{b} * {ist[b]}u]"

        src += (f"  let v0 = {at('lo', 'lo')} * (1.0 - t{a}) + {at('hi', 'lo')} * t{a};\n"
                f"  let v1 = {at('lo', 'hi')} * (1.0 - t{a}) + {at('hi', 'hi')} * t{a};\n"
                f"  out[i] = v0 * (1.0 - t{b}) + v1 * t{b};\n}}\n")
        reads = 4 * n
    return Kernel(f"resample2d_{mode.split('-')[0]}", src, ["read", "rw"], (gx, gy, gz),
                  esize(t) * (reads + n))


#: Ogita, Rump and Oishi's Dot2: each product's rounding error by Dekker's split (12-bit
#: halves multiply exactly; WGSL's ``fma`` may round twice, as lavapipe's does), each
#: addition's by TwoSum, gathered in ``lo`` and added once. Operands beyond 1e30 (where the
#: split overflows) and an infinite or NaN sum skip the compensation.
_DOT2 = """
fn prod_err(a: f32, b: f32, p: f32) -> f32 {
  if (max(abs(a), abs(b)) > 1e30) { return 0.0; }
  let ca = 4097.0 * a;
  let ah = ca - (ca - a);
  let al = a - ah;
  let cb = 4097.0 * b;
  let bh = cb - (cb - b);
  let bl = b - bh;
  return ((ah * bh - p) + ah * bl + al * bh) + al * bl;
}
"""

#: where each logical axis sits in a layout: (n, c, h, w) of the input and output,
#: (i, o, h, w) of the filter
_INPUT_AXES = {"nchw": (0, 1, 2, 3), "nhwc": (0, 3, 1, 2)}
_FILTER_AXES = {"iohw": (0, 1, 2, 3), "hwoi": (3, 2, 0, 1), "ohwi": (3, 0, 1, 2)}


def conv_transpose2d(t: str, in_shape: Sequence[int], w_shape: Sequence[int],
                     out_shape: Sequence[int], padding: Sequence[int], strides: Sequence[int],
                     dilations: Sequence[int], groups: int, input_layout: str,
                     filter_layout: str, bias: bool) -> Kernel:
    """convTranspose2d: output (n, oc, oy, ox) sums, over its group's input channels and the
    filter taps (ky, kx), input (n, ic, iy, ix) times filter (ic, oc mod o/groups, ky, kx)
    where ``oy = iy * stride + ky * dilation - padding_top`` (likewise x): each output
    element finds the taps whose input row is whole and in range, so no element is written
    twice and nothing is atomic. Layouts are read in place; the bias (bound third) starts the
    sum.

    The sum is compensated (``_DOT2``): WPT's expectations are the exact sums of the float32
    inputs rounded once, and where two products of thousands cancel to tens (its dilations
    case) any plain float32 evaluation, fused or not, ends 9 ULP off against its 8."""
    n = S.size(out_shape)
    gx, gy, gz = grid(n)
    ia, fa = _INPUT_AXES[input_layout], _FILTER_AXES[filter_layout]
    ist, wst = S.strides(in_shape), S.strides(w_shape)
    sn, sc, sh, sw = (ist[k] for k in ia)
    wi, wo, wh, ww = (wst[k] for k in fa)
    _, c_in, h_in, w_in = (in_shape[k] for k in ia)
    _, oc, _, _ = (out_shape[k] for k in ia)
    _, og, kh, kw = (w_shape[k] for k in fa)
    cg = c_in // groups
    src = decl(0, "x", t, "read") + decl(1, "w", t, "read")
    bindings = ["read", "read"]
    if bias:
        src += decl(2, "bias", t, "read")
        bindings.append("read")
    src += decl(len(bindings), "out", t, "rw") + _DOT2 + main_1d(gx)
    bindings.append("rw")
    src += f"  if (i >= {n}u) {{ return; }}\n" + _coords(out_shape)
    nb, o_c, o_y, o_x = (f"c{k}" for k in ia)
    src += (f"  let g = {o_c} / {og}u;\n  let wbase = ({o_c} % {og}u) * {wo}u;\n"
            f"  let xbase = {nb} * {sn}u;\n"
            f"  var hi = {f'bias[{o_c}]' if bias else '0.0'};\n  var lo = 0.0;\n"
            f"  for (var ci = 0u; ci < {cg}u; ci = ci + 1u) {{\n"
            f"    let ic = g * {cg}u + ci;\n"
            f"    for (var ky = 0u; ky < {kh}u; ky = ky + 1u) {{\n"
            f"      let ty = i32({o_y}) + {padding[0]} - i32(ky * {dilations[0]}u);\n"
            f"      if (ty < 0 || ty % {strides[0]} != 0 || ty / {strides[0]} >= {h_in}) "
            "{ continue; }\n"
            f"      for (var kx = 0u; kx < {kw}u; kx = kx + 1u) {{\n"
            f"        let tx = i32({o_x}) + {padding[2]} - i32(kx * {dilations[1]}u);\n"
            f"        if (tx < 0 || tx % {strides[1]} != 0 || tx / {strides[1]} >= {w_in}) "
            "{ continue; }\n"
            f"        let a = x[xbase + ic * {sc}u + u32(ty / {strides[0]}) * {sh}u"
            f" + u32(tx / {strides[1]}) * {sw}u];\n"
            f"        let b = w[wbase + ic * {wi}u + ky * {wh}u + kx * {ww}u];\n"
            "        let p = a * b;\n        let s = hi + p;\n        let z = s - hi;\n"
            "        lo = lo + ((hi - (s - z)) + (p - z)) + prod_err(a, b, p);\n"
            "        hi = s;\n      }\n    }\n  }\n")
    src += "  out[i] = select(hi, hi + lo, abs(hi) <= 3.4028234e38);\n}\n"
    traffic = esize(t) * (n * (1 + 2 * cg * kh * kw // max(1, strides[0] * strides[1]))
                          + (oc if bias else 0))
    return Kernel("conv_transpose2d", src, bindings, (gx, gy, gz), traffic)
