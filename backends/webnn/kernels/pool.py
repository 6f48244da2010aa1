"""Pooling: averagePool2d, l2Pool2d and maxPool2d, one invocation an output element looping
its window (webnn ``index.bs``, "Pooling operations")."""

from __future__ import annotations

from collections.abc import Sequence

from .. import shapes as S
from .common import Kernel, decl, esize, grid, main_1d

POOL_OPS = ("average_pool2d", "l2_pool2d", "max_pool2d")


def pool2d(op: str, t: str, in_shape: Sequence[int], out_shape: Sequence[int], layout: str,
           window: Sequence[int], padding: Sequence[int], strides: Sequence[int],
           dilations: Sequence[int]) -> Kernel:
    """``op`` over each output element's window of the 4-D input (``layout`` "nchw" or
    "nhwc"). Window taps in the padding or past the input (a "ceil" rounding's last
    window) are skipped, not read as zeros: an average divides by the taps inside the
    input (what WPT's expected values, from webnn-baseline, hold), an L2 norm sums their
    squares, a maximum is taken over them and is NaN where one is (``Math.max``). A window
    wholly outside the input gives 0. Average and L2 accumulate in f32 whatever ``t`` is
    (f32, f16; max also takes i32 and u32); the result is rounded once."""
    if layout == "nchw":
        nb, c, h, w = in_shape
        oh_n, ow_n = out_shape[2], out_shape[3]
        idx = (f"  let ow = i % {ow_n}u;\n  var r = i / {ow_n}u;\n"
               f"  let oh = r % {oh_n}u;\n  r = r / {oh_n}u;\n"
               f"  let base = r * {h * w}u;\n")  # r = batch * channels + channel
        step = 1
    else:
        nb, h, w, c = in_shape
        oh_n, ow_n = out_shape[1], out_shape[2]
        idx = (f"  let ch = i % {c}u;\n  var r = i / {c}u;\n"
               f"  let ow = r % {ow_n}u;\n  r = r / {ow_n}u;\n"
               f"  let oh = r % {oh_n}u;\n  r = r / {oh_n}u;\n"
               f"  let base = r * {h * w * c}u + ch;\n")
        step = c
    n = S.size(out_shape)
    wh, ww = window
    top, _, left, _ = padding
    sh, sw = strides
    dh, dw = dilations
    gx, gy, gz = grid(n)
    src = decl(0, "x", t, "read") + decl(1, "out", t, "rw")
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n" + idx
    src += (f"  let h0 = i32(oh * {sh}u) - {top};\n  let w0 = i32(ow * {sw}u) - {left};\n")
    if op == "max_pool2d":
        src += f"  var m = {t}(0);\n  var found = false;\n"
    else:
        src += "  var acc = 0.0;\n  var cnt = 0u;\n"
    src += (f"  for (var kh = 0u; kh < {wh}u; kh = kh + 1u) {{\n"
            f"    let ih = h0 + i32(kh * {dh}u);\n"
            f"    if (ih < 0 || ih >= {h}) {{ continue; }}\n"
            f"    for (var kw = 0u; kw < {ww}u; kw = kw + 1u) {{\n"
            f"      let iw = w0 + i32(kw * {dw}u);\n"
            f"      if (iw < 0 || iw >= {w}) {{ continue; }}\n"
            f"      let v = x[base + (u32(ih) * {w}u + u32(iw)) * {step}u];\n")
    if op == "max_pool2d":
        # NaN read from the bits (a compiler may fold v != v to false); it stays, as
        # nothing compares greater than it
        nan = ("(bitcast<u32>(f32(v)) & 0x7fffffffu) > 0x7f800000u"
               if t in ("f32", "f16") else "false")
        src += f"      if (!found || v > m || {nan}) {{ m = v; }}\n      found = true;\n"
    elif op == "l2_pool2d":
        src += "      let f = f32(v);\n      acc = acc + f * f;\n"
    else:
        src += "      acc = acc + f32(v);\n      cnt = cnt + 1u;\n"
    src += "    }\n  }\n"
    if op == "max_pool2d":
        src += "  out[i] = m;\n}\n"
    elif op == "l2_pool2d":
        src += f"  out[i] = {t}(sqrt(acc));\n}}\n"
    else:
        src += f"  out[i] = {t}(acc / f32(max(cnt, 1u)));\n}}\n"
    traffic = esize(t) * (S.size(in_shape) + n)
    return Kernel(op, src, ["read", "rw"], (gx, gy, gz), traffic)
