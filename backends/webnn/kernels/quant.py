"""Quantised weights: dequantizeLinear with block scales, and the one-row-a-group 4-bit
matrix-vector product that dequantises in registers (the decode step's projections on ``+q4``
models; the several-rows variants the GPU runs are in ``quant_rows``).

Packed ``int4``/``uint4`` constants are ``u32`` words, element i in nibble i % 8 of word
i / 8 (dtypes.py); other int4/uint4 operands (graph inputs, ``quantizeLinear`` results) are
one element a word, its nibble in bits 0-3, as ``uint8`` is one element a word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import shapes as S
from ..dtypes import dtype, packed_bytes
from .common import Kernel, decl, esize, grid, main_1d
from .matmul import VectorSource, gemv_tail
from .reduce import inline_reduction, unrolled_reduction

if TYPE_CHECKING:
    from .quant_rows import GatedOutput, StatsOutput


def load_fn(name: str, array: str, kind: str, packed: bool = True) -> str:
    """WGSL ``fn name(j: u32) -> f32``: element j of a quantised array, as a float; an
    int4/uint4 array eight elements a word where ``packed`` (a constant), else one a word."""
    if kind == "int4" and not packed:  # sign-extend bit 3 of the word's nibble
        body = f"  return f32(bitcast<i32>({array}[j] << 28u) >> 28u);\n"
    elif kind == "int4":  # sign-extend the nibble: move it to the top, shift back arithmetically
        body = (f"  let w = {array}[j / 8u];\n"
                "  return f32(bitcast<i32>(w << (28u - (j % 8u) * 4u)) >> 28u);\n")
    elif kind == "uint4" and packed:
        body = f"  return f32(({array}[j / 8u] >> ((j % 8u) * 4u)) & 15u);\n"
    else:
        body = f"  return f32({array}[j]);\n"
    return f"fn {name}(j: u32) -> f32 {{\n{body}}}\n"


def dequantize_linear(kind: str, shape: Sequence[int], block: Sequence[int], out_t: str,
                      x_packed: bool = True, zp_packed: bool = True) -> Kernel:
    """out[c] = (x[c] - zp[c / block]) * scale[c / block] for every coordinate c of
    ``shape`` (row-major), ``block`` the block size per axis (``_classes.blocks``);
    ``x_packed`` / ``zp_packed``: an int4/uint4 operand is a packed constant (``load_fn``)."""
    n = S.size(shape)
    sshape = [d // b for d, b in zip(shape, block, strict=True)]
    gx, gy, gz = grid(n)
    dt = dtype(kind)  # its device words: u32 (packed nibbles, or one uint8 a word)
    src = (decl(0, "x", dt.wgsl, "read") + decl(1, "scale", out_t, "read")
           + decl(2, "zp", dt.wgsl, "read") + decl(3, "out", out_t, "rw")
           + load_fn("xq", "x", kind, x_packed) + load_fn("zq", "zp", kind, zp_packed)
           + scale_index_fn(shape, block))
    src += (main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n  let s = scale_index(i);\n"
            f"  out[i] = {out_t}((xq(i) - zq(s)) * f32(scale[s]));\n}}\n")
    ns = S.size(sshape)
    stored = packed_bytes(dt, n) if dt.packed and x_packed else n * dt.itemsize
    traffic = stored + ns * (esize(out_t) + 4) + n * esize(out_t)
    return Kernel("dequantize_linear", src, ["read", "read", "read", "rw"], (gx, gy, gz), traffic)


def scale_index_fn(shape: Sequence[int], block: Sequence[int]) -> str:
    """WGSL ``fn scale_index(i: u32) -> u32``: element i's (row-major over ``shape``) index
    into the scale and zero point, ``block`` elements a scale per axis."""
    sshape = [d // b for d, b in zip(shape, block, strict=True)]
    sst = S.strides(sshape)
    lines = ["fn scale_index(i: u32) -> u32 {", "  var r = i;", "  var o = 0u;"]
    for ax in range(len(shape) - 1, -1, -1):
        d, b, st = shape[ax], block[ax], sst[ax]
        coord = "r" if ax == 0 else f"(r % {d}u)"
        if st and sshape[ax] > 1:
            lines.append(f"  o = o + ({coord} / {b}u) * {st}u;")
        if ax:
            lines.append(f"  r = r / {d}u;")
    lines += ["  return o;", "}"]
    return "\n".join(lines) + "\n"


#: quantizeLinear's saturation bounds per output type, as float32 literals (int32's top is
#: the largest float32 below 2^31, so the conversion stays in range)
_SATURATE = {"int8": ("-128.0", "127.0"), "uint8": ("0.0", "255.0"),
             "int32": ("-2147483648.0", "2147483520.0"), "int4": ("-8.0", "7.0"),
             "uint4": ("0.0", "15.0")}


def _quantized_word(kind: str, wt: str, value: str) -> str:
    """WGSL: the device word of ``kind`` holding float ``value`` (integral, in range): an
    int4's nibble (two's complement, the word's other bits zero), else the value."""
    if kind == "int4":
        return f"bitcast<u32>(i32({value})) & 15u"
    return f"{wt}({value})"


def quantize_linear(kind: str, in_t: str, shape: Sequence[int], block: Sequence[int],
                    zp_packed: bool = False) -> Kernel:
    """out[c] = clamp(roundEven(x[c] / scale[s]) + zp[s], lo, hi) in float32, ``s`` the
    coordinate's block (``scale_index_fn``), [lo, hi] the range of ``kind`` (int8, uint8,
    int32, int4, uint4): WGSL's ``round`` takes halves to even, as the spec's roundEven.
    An int4/uint4 result is one element a word; its zero point a packed constant where
    ``zp_packed`` (``load_fn``)."""
    n = S.size(shape)
    ns = S.size([d // b for d, b in zip(shape, block, strict=True)])
    gx, gy, gz = grid(n)
    wt = dtype(kind).wgsl  # int8 and int32 in i32 words, uint8, int4 and uint4 in u32
    lo, hi = _SATURATE[kind]
    src = (decl(0, "x", in_t, "read") + decl(1, "scale", in_t, "read")
           + decl(2, "zp", wt, "read") + decl(3, "out", wt, "rw") + scale_index_fn(shape, block)
           + load_fn("zq", "zp", kind, zp_packed))
    src += (main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n  let s = scale_index(i);\n"
            "  let q = round(f32(x[i]) / f32(scale[s])) + zq(s);\n"
            f"  out[i] = {_quantized_word(kind, wt, f'clamp(q, {lo}, {hi})')};\n}}\n")
    traffic = n * (esize(in_t) + 4) + ns * (esize(in_t) + 4)
    return Kernel("quantize_linear", src, ["read", "read", "read", "rw"], (gx, gy, gz), traffic)


def q4_bindings(b_t: str, sc_t: str, N: int, zero_points: bool, residual: bool, n_off: int,
                 splits: Sequence[int] | None, half_out: bool,
                 prologue: VectorSource | None = None,
                 stats: bool = False) -> tuple[str, list[str]]:
    """The 4-bit products' bindings (``gemv_q4`` documents them; ``b_t``: the codes' load
    type, ``sc_t``: the scales') and each one's access; with a ``prologue``, its bindings
    (and its module-scope source) instead of ``a``, the others after them; ``stats``: the
    partial sums ``pt`` (rw) last (``quant_rows.gemv_q4_quad``)."""
    if prologue is None:
        src, first = decl(0, "a", "vec4<f32>", "read"), ["read"]
    else:
        src, first = prologue.src, list(prologue.bindings)
    nb = len(first)
    src += decl(nb, "b", b_t, "read") + decl(nb + 1, "sc", sc_t, "read")
    nxt = nb + 2
    if zero_points:
        src += decl(nxt, "zc", "f32", "read")
        nxt += 1
    io = "f16" if half_out else "f32"
    if residual:
        src += decl(nxt, "res", io, "read")
        nxt += 1
    outs = list(splits) if splits else [N]
    assert not (splits and (residual or n_off or half_out)) and sum(outs) == N
    for j in range(len(outs)):
        src += decl(nxt + j, f"out{j}" if splits else "out", io, "rw")
    if stats:
        src += decl(nxt + len(outs), "pt", "f32", "rw")
    return src, first + ["read"] * (nxt - nb) + ["rw"] * (len(outs) + stats)


def gemv_q4(K: int, N: int, block: int, *, signed: bool, zero_points: bool, lanes: int = 32,
            wg: int = 256, subgroup: int | None = None, residual: bool = False,
            n_off: int = 0, splits: Sequence[int] | None = None,
            half_out: bool = False) -> Kernel:
    """out[n] = sum_k a[k] · W[k, n] for one input row, W a 4-bit matrix dequantised in
    registers (no float weights are ever written). ``N`` columns from ``n_off`` of the
    output (a chunk of a matrix beyond the binding limit). ``splits``: the rows are several
    matrices' stacked (a layer's q, k and v projections of one input), row counts in order;
    their outputs are the last bindings.

    Bindings: ``a`` (K floats, as vec4), ``b`` (the codes repacked (N, K): row n is K/8 u32
    words, element k in nibble k % 8 of word k / 8; read as vec4<u32>, 32 codes a load,
    where the block is a multiple of 32), ``sc`` (the scales (N, K/block)),
    ``zc`` when ``zero_points`` (-zero point · scale per block, same layout), ``res`` when
    ``residual`` (added to the product), ``out``; ``half_out``: ``res`` and ``out`` are
    float16 (a float16 model's residual add, summed in float32 and rounded once).
    ``block`` is a multiple of 8: a word never straddles two blocks. Per load: s · (a·q)
    over its codes, plus zc · sum(a).

    ``lanes`` invocations share a row and stride along it a load at a time (coalesced; two
    loads in flight an invocation), the
    workgroup holds ``wg / lanes`` rows; their sums are combined by ``subgroupAdd`` where
    the subgroup is exactly ``lanes`` wide, else through workgroup memory."""
    assert K % 8 == 0 and block % 8 == 0 and K % block == 0
    wide = block % 32 == 0  # a 16-byte load (32 codes) never straddles two blocks
    unit = 4 if wide else 1  # u32 words a load
    units, nblocks, per = K // (8 * unit), K // block, block // (8 * unit)
    R = wg // lanes
    gx = -(-N // R)
    use_sub = subgroup == lanes
    src, binds = q4_bindings("vec4<u32>" if wide else "u32", "f32", N, zero_points, residual,
                              n_off, splits, half_out)
    src += _unpack_fns(signed)
    # one load's contribution: its codes against 2 * unit vec4s of a, times its block's scale
    words = [f"{{w}}.{c}" for c in "xyzw"] if wide else ["{w}"]
    dots = " + ".join(f"dot(a[{{x}} + {2 * i}u], lo({w})) + dot(a[{{x}} + {2 * i + 1}u], hi({w}))"
                      for i, w in enumerate(words))
    sums = " + ".join(f"a[{{x}} + {i}u]" for i in range(2 * unit))
    src += (f"fn part(w: {'vec4<u32>' if wide else 'u32'}, x: u32, blk: u32) -> f32 {{\n"
            f"  var p = sc[blk] * ({dots.format(w='w', x='x')});\n")
    if zero_points:
        src += f"  p = p + zc[blk] * dot({sums.format(x='x')}, vec4<f32>(1.0));\n"
    src += "  return p;\n}\n"
    if not use_sub:
        src += f"var<workgroup> sh: array<f32, {wg}>;\n"
    step = f"part(b[wb + {{k}}], {2 * unit}u * ({{k}}), sb + ({{k}}) / {per}u)"
    src += (f"@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n"
            f"  let r = lid / {lanes}u;\n  let t = lid % {lanes}u;\n"
            f"  let n = wid.x * {R}u + r;\n  let nn = min(n, {N - 1}u);\n"
            f"  let wb = nn * {units}u;\n  let sb = nn * {nblocks}u;\n"
            "  var acc0 = 0.0;\n  var acc1 = 0.0;\n  var k = t;\n"
            # two loads in flight a lane, then the remainder
            f"  for (; k + {lanes}u < {units}u; k = k + {2 * lanes}u) {{\n"
            f"    acc0 = acc0 + {step.format(k='k')};\n"
            f"    acc1 = acc1 + {step.format(k=f'k + {lanes}u')};\n  }}\n"
            f"  for (; k < {units}u; k = k + {lanes}u) {{ acc0 = acc0 + {step.format(k='k')}; }}\n"
            "  let acc = acc0 + acc1;\n")
    src += gemv_tail(use_sub, lanes, f"{n_off}u + n", N, residual, splits, half_out)
    traffic = 4 * K + N * K // 2 + 4 * N * nblocks * (2 if zero_points else 1) \
        + (2 if half_out else 4) * N * (2 if residual else 1)
    return Kernel("gemv_q4", src, binds, (gx, 1, 1), traffic)


def half_pair_fn(signed: bool) -> str:
    """WGSL ``hq(w, s) -> vec2<f16>``: the code pair in nibbles s / 4 and s / 4 + 4 of a
    u32 word (``match_q4.repack_codes``' pair order: a word's elements 2m and 2m + 1 in
    nibbles m and m + 4), exact: ``(w >> s) & 0x000F000F | 0x64006400`` read as two float16
    is (1024 + c, 1024 + c'), minus 1024 (signed codes, xor-ed with 0x88888888 where
    loaded: each nibble + 8, so minus 1032). Spelled ``vec2<f16>(unpack2x16float(bits))``:
    naga has no ``bitcast<vec2<f16>>(u32)`` (gfx-rs/wgpu#8896); the value is exact either
    way (``quant_rows._unpack_half_fns``)."""
    bias = "1032.0h" if signed else "1024.0h"
    return ("fn hq(w: u32, s: u32) -> vec2<f16> {\n"
            "  return vec2<f16>(unpack2x16float(((w >> s) & 0x000F000Fu) | 0x64006400u))"
            f" - vec2<f16>({bias});\n}}\n")


def _rows_bindings(wide: bool, signed: bool, zero_points: bool, residual: bool,
                   half_out: bool, N: int, splits: Sequence[int] | None,
                   prologue: VectorSource | None = None,
                   stats: bool = False, half: bool = False) -> tuple[str, list[str]]:
    """The several-row products' bindings (``gemm_q4_rows`` documents them) and unpacking
    functions (``half``: ``half_pair_fn``'s, else ``_unpack_fns``'), and each binding's
    access; with a ``prologue``, its bindings (and its module-scope source) instead of
    ``a``; ``stats``: the partial sums ``pt`` (rw) last (``gemm_q4_cols``)."""
    if prologue is None:
        src, binds = decl(0, "a", "vec4<f32>", "read"), ["read"]
    else:
        src, binds = prologue.src, list(prologue.bindings)
    src += (decl(len(binds), "b", "vec4<u32>" if wide else "u32", "read")
            + decl(len(binds) + 1, "sc", "f32", "read"))
    binds += ["read"] * 2
    if zero_points:
        src += decl(len(binds), "zc", "f32", "read")
        binds.append("read")
    io = "f16" if half_out else "f32"
    if residual:
        src += decl(len(binds), "res", io, "read")
        binds.append("read")
    outs = list(splits) if splits else [N]
    for j in range(len(outs)):
        src += decl(len(binds), f"out{j}" if splits else "out", io, "rw")
        binds.append("rw")
    if stats:
        src += decl(len(binds), "pt", "f32", "rw")
        binds.append("rw")
    return src + (half_pair_fn(signed) if half else _unpack_fns(signed)), binds


def _row_input(prologue: VectorSource, M: int, wg: int, subgroup: int | None,
               rows: Sequence[str] | None = None) -> tuple[str, str]:
    """(module declarations, body) of a prologue read by M rows: ``row_in(i, red)``, its
    element at flat index i given the row's reduced value, and each row m's ``red{m}``,
    the sum of that row's partial sums (``VectorSource.partials``: row r's from r · count;
    ``rows``: each row's index r as WGSL, else m), divided by the divisor. Every
    invocation runs the body (its barriers)."""
    load, count, div = prologue.partials
    decls = (f"fn row_in(i: u32, red: f32) -> f32 {{\n"
             f"  return {prologue.element.format('i')};\n}}\n")
    scale = f" / {float(div)!r}" if div != 1 else ""
    body = ""
    for m in range(M):
        first = f"{m * count}u" if rows is None else f"{rows[m]} * {count}u"
        at = load.format(f"{first} + {{}}")
        d, b = (unrolled_reduction("reduce_sum", count, at, wg, subgroup, f"red_p{m}")
                or inline_reduction("reduce_sum", count, at, wg, f"red_p{m}"))
        decls += d
        body += b + f"  let red{m} = red_p{m}{scale};\n"
    return decls, body


def _rows_write(value: str, writer: str, j: int, N: int, M: int, width: int, n_off: int,
                residual: bool, half_out: bool, splits: Sequence[int] | None) -> str:
    """WGSL: where ``writer`` holds, row m0 + j's sum ``value`` of column n written (plus
    its residual; rounded to float16 once), or with ``splits`` to the output its column
    falls in (rounded so too)."""
    src = f"  if ({writer} && n < {N}u && m0 + {j}u < {M}u) {{\n"
    io = "f16" if half_out else ""
    if not splits:
        idx = f"(m0 + {j}u) * {width}u + {n_off}u + n"
        val = f"{value} + f32(res[{idx}])" if residual else value
        return src + f"    out[{idx}] = {io}({val});\n  }}\n"
    start = 0
    for i, ni in enumerate(splits):
        kw = "if" if i == 0 else "} else if"
        src += (f"    {kw} (n < {start + ni}u) "
                f"{{ out{i}[(m0 + {j}u) * {ni}u + n - {start}u] = {io}({value});\n")
        start += ni
    return src + "    }\n  }\n"


def _rows_traffic(K: int, N: int, M: int, block: int, tiles: int, zero_points: bool,
                  residual: bool, half_out: bool) -> int:
    """Bytes a several-row product moves: the rows, the codes and scales once a row tile,
    the outputs (and residuals)."""
    return (4 * K * M + tiles * (N * K // 2 + 4 * N * (K // block) * (2 if zero_points else 1))
            + (2 if half_out else 4) * M * N * (2 if residual else 1))


def _row_base(j: int, head_d: int | None, M: int) -> str:
    """WGSL: where row ``r{j}``'s vec4s from ``x`` start in ``a``: its row (``x{j} + x``),
    or within attention's (heads, M, head_d) output, the head ``x`` falls in."""
    if head_d is None:
        return f"x{j} + x"
    d4 = head_d // 4
    return f"(x / {d4}u) * {M * d4}u + r{j} * {d4}u + x % {d4}u"


def _row_vec(j: int, i: int, head_d: int | None, M: int, unit: int) -> str:
    """WGSL: row ``r{j}``'s vec4 ``x + i`` of input: in its row, or in attention's (heads,
    M, head_d) output, from the load's base where a load's 2 · ``unit`` vec4s lie in one
    head, else each from its own head."""
    if head_d is None or (head_d // 4) % (2 * unit) == 0:
        return f"a[{_row_base(j, head_d, M)} + {i}u]"
    d4 = head_d // 4
    return f"a[((x + {i}u) / {d4}u) * {M * d4}u + r{j} * {d4}u + (x + {i}u) % {d4}u]"


def _unpack_fns(signed: bool) -> str:
    """WGSL ``lo(w)``/``hi(w)``: a u32 word's nibbles 0-3 and 4-7 as floats (sign-extended
    where ``signed``: each nibble moved to the top of an i32, shifted back arithmetically)."""
    if signed:
        return ("fn lo(w: u32) -> vec4<f32> {\n"
                "  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w << 28u, w << 24u, "
                "w << 20u, w << 16u)) >> vec4<u32>(28u));\n}\n"
                "fn hi(w: u32) -> vec4<f32> {\n"
                "  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w << 12u, w << 8u, "
                "w << 4u, w)) >> vec4<u32>(28u));\n}\n")
    return ("fn lo(w: u32) -> vec4<f32> {\n  return vec4<f32>((vec4<u32>(w) >> "
            "vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));\n}\n"
            "fn hi(w: u32) -> vec4<f32> {\n  return vec4<f32>((vec4<u32>(w) >> "
            "vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));\n}\n")


def gemm_q4_rows(K: int, N: int, block: int, M: int, *, signed: bool, zero_points: bool,
                 lanes: int = 32, wg: int = 256, subgroup: int | None = None, n_off: int = 0,
                 width: int | None = None, tile: int = 8,
                 splits: Sequence[int] | None = None, residual: bool = False,
                 half_out: bool = False, head_d: int | None = None) -> Kernel:
    """out[m, n_off + n] = sum_k a[m, k] · W[k, n] for M input rows (a K-token verify's or
    a prefill chunk's projections): ``gemv_q4``'s layout and loads, each code word
    dequantised once in registers and multiplied into ``tile`` rows at a time (the grid's
    y: ceil(M / tile) row tiles), so the weights stream once a tile, not once a row, and
    no float weights are ever written. ``width``: the output's row length (the whole
    matrix's N where this launch is a chunk of its columns from ``n_off``). ``splits``:
    the columns are several matrices' stacked (a layer's q, k and v projections of one
    input), column counts in order, each written to its own output (``out0``, ``out1``,
    ..., M rows of its count). ``residual``: ``res`` (the output's shape) added;
    ``half_out``: ``res`` and ``out`` float16, summed in float32 and rounded once.
    ``head_d``: ``a`` is attention's output as it lies, (heads, M, head_d), read as the rows
    (M, heads · head_d) its transpose would make (no transpose launched).

    Bindings: ``a`` (M·K floats, as vec4), ``b``, ``sc`` (and ``zc`` with
    ``zero_points``) as ``gemv_q4``'s, ``out`` (M rows of ``width``) or the splits'."""
    assert K % 8 == 0 and block % 8 == 0 and K % block == 0 and M >= 1
    assert not splits or (sum(splits) == N and not n_off and not residual and not half_out)
    assert head_d is None or (head_d % 4 == 0 and K % head_d == 0)
    wide = block % 32 == 0
    unit = 4 if wide else 1
    units, nblocks, per = K // (8 * unit), K // block, block // (8 * unit)
    R, MT, K4, width = wg // lanes, min(M, tile), K // 4, width or N
    use_sub = subgroup == lanes
    src, binds = _rows_bindings(wide, signed, zero_points, residual, half_out, N, splits)
    if not use_sub:
        src += f"var<workgroup> sh: array<f32, {wg}>;\n"
    words = [f"w.{c}" for c in "xyzw"] if wide else ["w"]
    qs = "".join(f"    let q{2 * i} = lo({w});\n    let q{2 * i + 1} = hi({w});\n"
                 for i, w in enumerate(words))
    body = ""
    for j in range(MT):
        at = [_row_vec(j, i, head_d, M, unit) for i in range(2 * unit)]
        dots = " + ".join(f"dot({at[i]}, q{i})" for i in range(2 * unit))
        term = f"s * ({dots})"
        if zero_points:
            sums = " + ".join(at)
            term += f" + z * dot({sums}, vec4<f32>(1.0))"
        body += f"    acc{j} = acc{j} + {term};\n"
    src += (f"@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n"
            f"  let r = lid / {lanes}u;\n  let t = lid % {lanes}u;\n"
            f"  let n = wid.x * {R}u + r;\n  let nn = min(n, {N - 1}u);\n"
            f"  let m0 = wid.y * {MT}u;\n"
            f"  let wb = nn * {units}u;\n  let sb = nn * {nblocks}u;\n"
            # a tile's rows past M read row M - 1 and are never written
            + "".join(f"  let r{j} = min(m0 + {j}u, {M - 1}u);\n  let x{j} = r{j} * {K4}u;\n"
                      f"  var acc{j} = 0.0;\n" for j in range(MT))
            + f"  for (var k = t; k < {units}u; k = k + {lanes}u) {{\n"
            "    let w = b[wb + k];\n"
            f"    let s = sc[sb + k / {per}u];\n"
            + (f"    let z = zc[sb + k / {per}u];\n" if zero_points else "")
            + f"    let x = {2 * unit}u * k;\n" + qs + body + "  }\n")
    for j in range(MT):
        if use_sub:
            src += f"  let s{j} = subgroupAdd(acc{j});\n"
        else:
            src += (f"  sh[lid] = acc{j};\n  workgroupBarrier();\n  var s{j} = 0.0;\n"
                    f"  if (t == 0u) {{\n    for (var j = 0u; j < {lanes}u; j = j + 1u) "
                    f"{{ s{j} = s{j} + sh[lid + j]; }}\n  }}\n  workgroupBarrier();\n")
        src += _rows_write(f"s{j}", "t == 0u", j, N, M, width, n_off, residual, half_out,
                           splits)
    src += "}\n"
    tiles = -(-M // MT)
    return Kernel("gemm_q4_rows", src, binds, (-(-N // R), tiles, 1),
                  _rows_traffic(K, N, M, block, tiles, zero_points, residual, half_out))


#: workgroups a several-row product by column aims at at least (two a multiprocessor of the
#: H200's 132): fewer left most of it idle (PERFORMANCE.md, "A speculative verify")
COLS_TARGET_GROUPS = 264


def cols_shape(K: int, N: int, block: int, per_thread: int = 1,
               cols: int | None = None) -> dict[str, int]:
    """``gemm_q4_cols``' ``cols`` and ``slices`` for a K×N product: 256 invocations a
    workgroup, 32 columns of 8 slices of K where that gives ``COLS_TARGET_GROUPS``
    workgroups, else narrower column groups of more slices (16 × 16, 8 × 32) while each
    slice keeps a load, so a 2048-column product runs 256 workgroups, not 64; ``cols``
    fixes the width (a ``q4_rows`` "_cCOLS" variant)."""
    units = K // (32 if block % 32 == 0 else 8)
    c = cols or 32
    while (cols is None and c > 8 and -(-N // (c * per_thread)) < COLS_TARGET_GROUPS
           and 256 // (c // 2) <= units):
        c //= 2
    return {"cols": c, "slices": 256 // c}


def cols_workgroups(K: int, N: int, block: int, per_thread: int = 1,
                    cols: int | None = None) -> int:
    """The column workgroups of ``gemm_q4_cols`` over ``N`` columns (``cols_shape``'s, as
    the lowering asks for them): how many partial sums a row its ``stats`` writes."""
    return -(-N // (cols_shape(K, N, block, per_thread, cols)["cols"] * per_thread))


def cols_shared_bytes(M: int, tile: int = 8, per_thread: int = 1,
                      norms: bool = False) -> int:
    """Workgroup memory ``gemm_q4_cols`` declares at most (256 invocations, any
    ``cols``): its slices' sums, a gated pair's sums, and with ``norms`` a ``prologue``'s
    reductions (a workgroup's floats a row of the tile) and ``stats``' sums (up to 32
    columns a row; never with the pair's); the planner checks it against the adapter's
    limit (``match_q4.rows_norms``)."""
    MT, wg = min(M, tile), 256
    extra = MT * wg if norms else 0
    return 4 * (wg * MT * per_thread + MT * 32 * per_thread + extra)


def gemm_q4_cols(K: int, N: int, block: int, M: int, *, signed: bool, zero_points: bool,
                 cols: int = 32, slices: int = 8, tile: int = 8, per_thread: int = 1,
                 n_off: int = 0, width: int | None = None,
                 splits: Sequence[int] | None = None, residual: bool = False,
                 half_out: bool = False, head_d: int | None = None,
                 gated: GatedOutput | None = None, subgroup: int | None = None,
                 prologue: VectorSource | None = None,
                 stats: StatsOutput | None = None, half: bool = False) -> Kernel:
    """``gemm_q4_rows``' product with the codes laid out by load, then column (made at
    upload: ``match_q4.by_load``): an invocation per column and slice of K, so a warp's
    code loads are consecutive columns' (coalesced), its input loads the same row vector
    for every lane (one broadcast), and each invocation keeps its loads in flight along K
    with no cross-lane sum; the ``slices`` of a column's K are summed in workgroup memory.
    Where ``gemm_q4_rows``' lanes share a column, their input loads stride a load apart
    (32 lines an instruction), which bounded the H200's 128256-column head at 24 GB/s.
    ``per_thread``: columns an invocation (``cols`` apart, so a warp's code loads stay
    coalesced), each input vec4 loaded once for all of them: ``per_thread`` times fewer
    input loads a code byte (the M-row products' bound on the H200 at ``per_thread`` 1).

    ``gated``: the N columns are a stacked pair's (a K-token SwiGLU's gate and up),
    interleaved column by column at upload (``match_q4.paired_columns``); the two sums of a
    pair meet in workgroup memory and the even column's invocation writes the element-wise
    function of both (``out``: M rows of N / 2, its type), so neither product is written
    and the activation has no launch.

    The norm between two products without a launch (``quant_quad_rows.gemm_q4_quad``'s
    contracts): ``stats``: each workgroup also writes, for each row of its tile, the sum of
    ``norm_el`` over the values it wrote, to ``pt[m · W + workgroup]`` (W:
    ``cols_workgroups``; ``_cols_stats_write``); ``prologue`` (``partials`` only): the
    input is computed where it is read (``row_in``), each workgroup first summing each
    tile row's partials into that row's reduced value (``_row_input``; through
    ``subgroupAdd`` where the subgroup is ``subgroup`` wide).

    ``half`` (``q4_rows`` "_h"; needs 'shader-f16'): the products in float16 pairs, the
    codes repacked in pair order (``match_q4.repack_codes(pairs=True)``) and unpacked two
    at a time without a conversion (``half_pair_fn``: a shift, an and-or and a pair
    subtract; signed codes xor-ed with 0x88888888 as loaded); each input vec4 converted to
    ``vec4<f16>`` once as loaded, for every column; a column's 32 (8 where the block is not
    a multiple of 32) products of a load and a row summed in a ``vec2<f16>`` by pair FMAs
    (16 a row a load), widened to float32 once, then scaled and added to the float32 sum
    (the zero points' term stays float32: the inputs' float32 sum). Its float16 error is a
    load's, within one block: each input rounded (2^-11 relative) and each lane's 16 FMAs
    rounding once, at most 17 · 2^-11 of the load's sum of |code · input| (first order;
    random signs give far less); a lane's sum of 16 products overflows float16 beyond
    |input| ~ 65504 / (16 · 15) ~ 270 (unsigned codes; 510 signed), so it is for
    normalised rows, as the one-token ``_h`` kernels (``quant_rows._unpack_half_fns``).

    Bindings as ``gemm_q4_rows``'; ``b`` (units, N) of vec4<u32> (u32 where the block is
    not a multiple of 32), ``sc`` (and ``zc``) (K / block, N)."""
    assert K % 8 == 0 and block % 8 == 0 and K % block == 0 and M >= 1 and per_thread >= 1
    assert not splits or (sum(splits) == N and not n_off and not residual and not half_out)
    assert gated is None or (N % 2 == 0 and cols % 2 == 0 and not (splits or n_off or residual))
    assert prologue is None or (prologue.partials is not None and head_d is None)
    assert stats is None or (gated is None and not splits)
    if gated is not None:
        half_out = gated.out_type == "f16"
    assert head_d is None or (head_d % 4 == 0 and K % head_d == 0)
    wide = block % 32 == 0
    unit = 4 if wide else 1
    units, per = K // (8 * unit), block // (8 * unit)
    MT, CT, K4, width, wg = min(M, tile), per_thread, K // 4, width or N, cols * slices
    span = cols * CT  # columns a workgroup
    src, binds = _rows_bindings(wide, signed, zero_points, residual, half_out, N, splits,
                                prologue, stats is not None, half)
    rows_in = (_row_input(prologue, MT, wg, subgroup, [f"r{j}" for j in range(MT)])
               if prologue is not None else None)
    if rows_in is not None:
        src += rows_in[0]
    if stats is not None:
        src += stats.src + f"var<workgroup> nrm_sh: array<f32, {MT * cols}>;\n"
    if slices > 1:
        src += f"var<workgroup> sh: array<f32, {wg * MT * CT}>;\n"
    comps = [".x", ".y", ".z", ".w"] if wide else [""]
    # half: signed codes' nibbles + 8 (``half_pair_fn``), as ``quant_rows`` flips them
    flip = (f" ^ {'vec4<u32>(0x88888888u)' if wide else '0x88888888u'}"
            if half and signed else "")
    body = ""
    for i in range(2 * unit):  # the load's vec4s of input, each once for every column
        for j in range(MT):
            vec = (_row_vec(j, i, head_d, M, unit) if rows_in is None
                   else _row_computed(j, i))
            body += f"    let v{i}_{j} = {vec};\n"
            if zero_points:
                body += f"    t{j} = t{j} + v{i}_{j};\n"
            if half:
                body += f"    let h{i}_{j} = vec4<f16>(v{i}_{j});\n"
        if half:  # a word's 8 inputs converted: its 4 code pairs against each row's
            body += _half_word(i, comps, CT, MT) if i % 2 else ""
            continue
        for c in range(CT):
            half_fn = "lo" if i % 2 == 0 else "hi"
            body += f"    let q{i}_{c} = {half_fn}(w{c}{comps[i // 2]});\n"
            body += "".join(f"    p{c}_{j} = p{c}_{j} + dot(v{i}_{j}, q{i}_{c});\n"
                            for j in range(MT))
    tail = ""
    for c in range(CT):
        for j in range(MT):
            if half:  # the load's float16 pair sum widened once
                tail += f"    let f{c}_{j} = vec2<f32>(p{c}_{j});\n"
            prod = f"(f{c}_{j}.x + f{c}_{j}.y)" if half else f"p{c}_{j}"
            tail += f"    acc{c}_{j} = acc{c}_{j} + s{c} * {prod}"
            tail += f" + z{c} * dot(t{j}, vec4<f32>(1.0));\n" if zero_points else ";\n"
    src += (f"@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n"
            f"  let c = lid % {cols}u;\n  let sl = lid / {cols}u;\n"
            f"  let m0 = wid.y * {MT}u;\n"
            + "".join(f"  let n{c} = wid.x * {span}u + {c * cols}u + c;\n"
                      f"  let nn{c} = min(n{c}, {N - 1}u);\n" for c in range(CT))
            + "".join(f"  let r{j} = min(m0 + {j}u, {M - 1}u);\n  let x{j} = r{j} * {K4}u;\n"
                      for j in range(MT))
            + (rows_in[1] if rows_in is not None else "")  # every invocation: no return
            + "".join(f"  var acc{c}_{j} = 0.0;\n" for c in range(CT) for j in range(MT))
            + f"  for (var k = sl; k < {units}u; k = k + {slices}u) {{\n"
            + "".join(f"    let w{c} = b[k * {N}u + nn{c}]{flip};\n"
                      f"    let s{c} = sc[(k / {per}u) * {N}u + nn{c}];\n"
                      + (f"    let z{c} = zc[(k / {per}u) * {N}u + nn{c}];\n"
                         if zero_points else "") for c in range(CT))
            + f"    let x = {2 * unit}u * k;\n"
            + "".join(f"    var p{c}_{j} = {'vec2<f16>(0.0h)' if half else '0.0'};\n"
                      for c in range(CT) for j in range(MT))
            + ("".join(f"    var t{j} = vec4<f32>(0.0);\n" for j in range(MT))
               if zero_points else "")
            + body + tail + "  }\n")
    accs = [(c, j) for c in range(CT) for j in range(MT)]
    if slices > 1:
        src += "".join(f"  sh[{q}u * {wg}u + lid] = acc{c}_{j};\n"
                       for q, (c, j) in enumerate(accs))
        src += "  workgroupBarrier();\n"
        src += ("  if (sl == 0u) {\n" + "".join(
            f"    for (var q = 1u; q < {slices}u; q = q + 1u) "
            f"{{ acc{c}_{j} = acc{c}_{j} + sh[{i}u * {wg}u + q * {cols}u + c]; }}\n"
            for i, (c, j) in enumerate(accs)) + "  }\n")
    tiles = -(-M // MT)
    traffic = _rows_traffic(K, N, M, block, tiles, zero_points, residual, half_out)
    if gated is not None:
        src = src.replace("@compute", f"{gated.src}var<workgroup> pair_sh: array<f32, "
                          f"{CT * MT * cols}>;\n@compute", 1)
        src += _paired_write(gated, accs, MT, cols, M, N // 2)
        traffic -= (2 if half_out else 4) * M * N // 2  # half the columns written
    elif stats is not None:
        gx = -(-N // span)
        src += _cols_stats_write(CT, MT, cols, gx, N, M, width, n_off, residual, half_out)
        traffic += 4 * M * gx
    else:
        for c in range(CT):
            src += f"  {{\n  let n = n{c};\n"
            for j in range(MT):
                src += _rows_write(f"acc{c}_{j}", "sl == 0u", j, N, M, width, n_off,
                                   residual, half_out, splits)
            src += "  }\n"
    src += "}\n"
    return Kernel("gemm_q4_cols", src, binds, (-(-N // span), tiles, 1), traffic)


def _half_word(i: int, comps: Sequence[str], CT: int, MT: int) -> str:
    """WGSL of ``gemm_q4_cols`` with ``half``, after input vec4s ``i - 1`` and ``i`` (a code
    word's 8 inputs, as float16 ``h{i}_{j}`` for each row j): each column's word
    ``w{c}{comps[i // 2]}`` unpacked to 4 float16 code pairs (``hq``), once for every row,
    and each row's pair sum ``p{c}_{j}`` advanced by 4 pair FMAs."""
    src = ""
    lo, hi, wd = i - 1, i, i // 2
    for c in range(CT):
        src += "".join(f"    let e{wd}_{c}_{m} = hq(w{c}{comps[wd]}, {4 * m}u);\n"
                       for m in range(4))
        for j in range(MT):
            e = [f"e{wd}_{c}_{m}" for m in range(4)]
            src += (f"    p{c}_{j} = fma({e[0]}, h{lo}_{j}.xy, fma({e[1]}, h{lo}_{j}.zw, "
                    f"fma({e[2]}, h{hi}_{j}.xy, fma({e[3]}, h{hi}_{j}.zw, p{c}_{j}))));\n")
    return src


def _row_computed(j: int, i: int) -> str:
    """WGSL: ``_row_vec``'s vec4 ``x + i`` of row ``r{j}`` computed by the prologue
    (``row_in``) at its 4 flat indices, with the row's reduced value ``red{j}``."""
    return "vec4<f32>(" + ", ".join(f"row_in(4u * (x{j} + x + {i}u) + {e}u, red{j})"
                                    for e in range(4)) + ")"


def _cols_stats_write(CT: int, MT: int, cols: int, W: int, N: int, M: int, width: int,
                      n_off: int, residual: bool, half_out: bool) -> str:
    """WGSL closing ``gemm_q4_cols`` with ``stats``: each column's sums (``acc{c}_{j}``, held
    by its slice-0 invocation) written as ``_rows_write`` writes them (plus ``res``;
    float16, rounded once), and ``norm_el`` of each written value summed a row into
    workgroup memory; after one barrier invocation j < MT writes row m0 + j's sum over
    the workgroup to ``pt[(m0 + j) · W + wid.x]`` (``StatsOutput``, a row's ``W``
    partials together). Every invocation reaches the barrier."""
    io = "f16" if half_out else "f32"
    src = "".join(f"  var nf{j} = 0.0;\n" for j in range(MT))
    for c in range(CT):
        for j in range(MT):
            idx = f"(m0 + {j}u) * {width}u + {n_off}u + n{c}"
            val = f"acc{c}_{j} + f32(res[{idx}])" if residual else f"acc{c}_{j}"
            src += (f"  if (sl == 0u && n{c} < {N}u && m0 + {j}u < {M}u) {{\n"
                    f"    let xs = {io}({val});\n    out[{idx}] = xs;\n"
                    f"    nf{j} = nf{j} + norm_el({idx}, xs);\n  }}\n")
    src += "".join(f"  if (sl == 0u) {{ nrm_sh[{j * cols}u + c] = nf{j}; }}\n"
                   for j in range(MT))
    return src + (f"  workgroupBarrier();\n  if (lid < {MT}u && m0 + lid < {M}u) {{\n"
                  f"    var tot = 0.0;\n"
                  f"    for (var q = 0u; q < {cols}u; q = q + 1u) "
                  f"{{ tot = tot + nrm_sh[lid * {cols}u + q]; }}\n"
                  f"    pt[(m0 + lid) * {W}u + wid.x] = tot;\n  }}\n")


def _paired_write(gated: GatedOutput, accs: list[tuple[int, int]], MT: int, cols: int,
                  M: int, half: int) -> str:
    """WGSL closing ``gemm_q4_cols`` with ``gated``: each column's sums (``acc{c}_{j}``, held
    by its slice-0 invocation) into workgroup memory; after one barrier the even column of
    each pair writes ``gated``'s function of its sum (``g0``) and its neighbour's (``g1``)
    at element (row, column / 2) of ``half`` a row. Every invocation reaches the barrier."""
    src = "".join(f"  if (sl == 0u) {{ pair_sh[{(c * MT + j) * cols}u + c] = acc{c}_{j}; }}\n"
                  for c, j in accs)
    src += "  workgroupBarrier();\n  if (sl == 0u && (c & 1u) == 0u) {\n"
    for c, j in accs:
        base = (c * MT + j) * cols
        src += (f"    {{\n      let np = n{c} / 2u;\n"
                f"      if (np < {half}u && m0 + {j}u < {M}u) {{\n"
                f"        let g0 = pair_sh[{base}u + c];\n"
                f"        let g1 = pair_sh[{base}u + c + 1u];\n"
                f"        let gi = (m0 + {j}u) * {half}u + np;\n"
                f"        out[gi] = {gated.call.format('gi')};\n      }}\n    }}\n")
    return src + "  }\n"
