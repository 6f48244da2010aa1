"""The 4-bit matrix-vector products the GPU runs: several rows an invocation (``multi``), every
code load in flight at once (``wide``), and four rows' codes a 16-byte load (``quad``, the
default), each dequantising in registers the format ``quant.gemv_q4`` documents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .common import Kernel, esize, grid
from .matmul import (
    GatedOutput,
    StatsOutput,
    VectorSource,
    element_vec4,
    gated_write,
    gemv_write,
    prologue_reduction,
    stats_write,
)
from .quant import half_pair_fn, q4_bindings


def _unpack_biased_fns(signed: bool) -> str:
    """WGSL ``lo(w)``/``hi(w)`` of ``gemv_q4_multi``: nibbles 0-3 and 4-7 of a u32 word as
    floats without an integer-to-float conversion (a quarter-rate instruction on NVIDIA
    GPUs): each nibble is or-ed into the mantissa of 2^23, whose float is then 2^23 + the
    nibble exactly, and 2^23 is subtracted. Signed codes arrive xor-ed with 0x88888888 (each
    nibble's sign bit flipped: the nibble + 8, unsigned), so 2^23 + 8 is subtracted."""
    bias = "8388616.0" if signed else "8388608.0"
    out = ""
    for name, shifts in (("lo", "0u, 4u, 8u, 12u"), ("hi", "16u, 20u, 24u, 28u")):
        out += (f"fn {name}(w: u32) -> vec4<f32> {{\n  return bitcast<vec4<f32>>(((vec4<u32>(w)"
                f" >> vec4<u32>({shifts})) & vec4<u32>(15u)) | vec4<u32>(0x4b000000u))"
                f" - vec4<f32>({bias});\n}}\n")
    return out


def multi_groups(N: int, rows: int, lanes: int, target_groups: int = 256) -> int:
    """Row groups (``lanes`` invocations each) a workgroup of ``gemv_q4_multi`` holds: a
    power of two, at most 256 invocations and at least 32, as large as still leaves about
    ``target_groups`` workgroups over ``N`` rows (every multiprocessor of a large GPU busy on
    a 2048-row projection, without workgroups of a few invocations on the LM head)."""
    g = 1
    while 2 * g * lanes <= 256 and N // (2 * g * rows) >= target_groups:
        g *= 2
    while g * lanes < 32:
        g *= 2
    return g


def gemv_q4_multi(K: int, N: int, block: int, *, signed: bool, zero_points: bool,
                  rows: int = 4, lanes: int = 32, groups: int | None = None, unroll: int = 1,
                  subgroup: int | None = None, residual: bool = False, n_off: int = 0,
                  splits: Sequence[int] | None = None, half_out: bool = False,
                  half_scales: bool = False, half: bool = False) -> Kernel:
    """The product ``gemv_q4`` computes (same bindings and layouts), each invocation
    computing ``rows`` output rows: the 32 inputs a 16-byte code load multiplies are
    loaded once (8 vec4) and used for ``rows`` code loads, one a row, so the input row
    passes through the cache ``rows`` times less, and each invocation has ``rows`` code
    loads in flight an iteration. ``lanes`` invocations share ``rows`` rows, striding
    along K a load at a time (each row's loads of an iteration are ``16 · lanes``
    contiguous bytes); a workgroup holds ``groups`` such groups (default
    ``multi_groups``); ``unroll`` such loads an iteration, each with its own input values
    (more loads in flight where K is short). ``half_scales``: ``sc`` is float16, two to a
    u32 word in row-major (N, K/block) order (half the scale traffic; exact where the
    model's scales are float16).
    Codes become floats without a conversion instruction (``_unpack_biased_fns``).
    Sums: ``subgroupAdd`` where the subgroup is exactly ``lanes`` wide, else workgroup
    memory; lane j of a group writes its j-th row. Needs the block a multiple of 32 and
    ``rows <= lanes``. ``half``: the products in float16 pairs (``_unpack_half_fns``; the
    codes repacked in pair order, ``match_q4.repack_codes``; needs 'shader-f16')."""
    assert K % 32 == 0 and block % 32 == 0 and K % block == 0 and 1 <= rows <= lanes
    units, nblocks, per = K // 32, K // block, block // 32
    G = groups or multi_groups(N, rows, lanes)
    wg, R = G * lanes, rows
    per_wg = G * R
    gx, gy, _ = grid(N, per_wg)  # folded into y beyond the per-dimension limit
    use_sub = subgroup == lanes
    src, binds = _rows_head(N, K, block, R, lanes, wg, gx, 0 if use_sub else wg * R,
                            signed=signed, zero_points=zero_points, residual=residual,
                            n_off=n_off, splits=splits, half_out=half_out,
                            half_scales=half_scales, half=half)
    src += "".join(f"  var acc{j} = 0.0;\n" for j in range(R))
    if unroll > 1:  # ``unroll`` steps an iteration, each its own loads, then the rest
        src += (f"  var k = t;\n  for (; k + {(unroll - 1) * lanes}u < {units}u; "
                f"k = k + {unroll * lanes}u) {{\n")
        src += "".join(_multi_step(f"k + {u * lanes}u", f"_{u}", R, per, zero_points, signed,
                                   half) for u in range(unroll))
        src += f"  }}\n  for (; k < {units}u; k = k + {lanes}u) {{\n"
    else:
        src += f"  for (var k = t; k < {units}u; k = k + {lanes}u) {{\n"
    src += _multi_step("k", "", R, per, zero_points, signed, half) + "  }\n"
    if use_sub:
        src += "".join(f"  let s{j} = subgroupAdd(acc{j});\n" for j in range(R))
        src += "  var s = s0;\n" + "".join(
            f"  if (t == {j}u) {{ s = s{j}; }}\n" for j in range(1, R))
    else:
        src += "".join(f"  sh[{j * wg}u + lid] = acc{j};\n" for j in range(R))
        src += ("  workgroupBarrier();\n  var s = 0.0;\n"
                f"  if (t < {R}u) {{\n"
                f"    let base = t * {wg}u + g * {lanes}u;\n"
                f"    for (var i = 0u; i < {lanes}u; i = i + 1u) {{ s = s + sh[base + i]; }}\n"
                "  }\n")
    src += "  let n = n0 + t;\n"
    src += gemv_write(f"t < {R}u", f"{n_off}u + n", N, residual, splits, half_out)
    return Kernel("gemv_q4_multi", src, binds, (gx, gy, 1),
                  _q4_traffic(K, N, nblocks, zero_points, residual, half_out, half_scales))


def _rows_head(N: int, K: int, block: int, R: int, lanes: int, wg: int, gx: int, shared: int,
               *, signed: bool, zero_points: bool, residual: bool, n_off: int,
               splits: Sequence[int] | None, half_out: bool, half_scales: bool,
               half: bool, row_offsets: bool = True,
               prologue: VectorSource | None = None,
               gated: GatedOutput | None = None,
               stats: StatsOutput | None = None,
               mapped: GatedOutput | None = None) -> tuple[str, list[str]]:
    """The start of ``gemv_q4_multi`` and ``gemv_q4_wide`` (bindings, unpack and scale
    functions, ``shared`` floats of workgroup memory where non-zero, the entry point up to
    each of the group's ``R`` rows' code and scale offsets ``wb{j}``, ``sb{j}``: groups of
    ``lanes`` invocations, ``wg`` a workgroup, ``gx`` workgroups along x; without
    ``row_offsets``, up to the group's first row ``n0``) and the bindings' access
    (``prologue``: ``q4_bindings``; ``gated``: its functions and workgroup memory, and
    ``out`` of its type, half as long; ``stats``: its function, the partial sums ``pt``
    bound last and workgroup memory for the rows' values)."""
    if gated is not None:
        assert not (residual or splits or n_off or half_out)
        half_out = gated.out_type == "f16"
    if mapped is not None:
        assert gated is None and stats is None and not (residual or splits or half_out)
        half_out = mapped.out_type == "f16"
    src, binds = q4_bindings("vec4<u32>", "u32" if half_scales else "f32", N, zero_points,
                              residual, n_off, splits, half_out, prologue, stats is not None)
    if gated is not None:
        src += gated.src + f"var<workgroup> pair_sh: array<f32, {(wg // lanes) * R}>;\n"
    if stats is not None:
        assert gated is None and not splits
        src += stats.src + f"var<workgroup> nrm_sh: array<f32, {(wg // lanes) * R}>;\n"
    if mapped is not None:
        src += mapped.src
    src += _unpack_half_fns(signed) if half else _unpack_biased_fns(signed)
    src += _scale_fn(half_scales) + group_entry(R, lanes, wg, gx, shared)
    for j in range(R if row_offsets else 0):
        src += (f"  let r{j} = min(n0 + {j}u, {N - 1}u);\n  let wb{j} = r{j} * {K // 32}u;\n"
                f"  let sb{j} = r{j} * {K // block}u;\n")
    return src, binds


def group_entry(R: int, lanes: int, wg: int, gx: int, shared: int) -> str:
    """WGSL: ``shared`` floats of workgroup memory ``sh`` (none where 0) and the entry
    point of a kernel of groups of ``lanes`` invocations sharing ``R`` rows (``wg`` a
    workgroup, ``gx`` workgroups along x), up to its group ``g``, lane ``t`` and the
    group's first row ``n0``."""
    src = f"var<workgroup> sh: array<f32, {shared}>;\n" if shared else ""
    return src + (f"@compute @workgroup_size({wg})\n"
                  "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
                  "@builtin(local_invocation_index) lid: u32) {\n"
                  f"  let g = lid / {lanes}u;\n  let t = lid % {lanes}u;\n"
                  f"  let n0 = (wid.y * {gx}u + wid.x) * {(wg // lanes) * R}u + g * {R}u;\n")


def _q4_traffic(K: int, N: int, nblocks: int, zero_points: bool, residual: bool,
                half_out: bool, half_scales: bool) -> int:
    """Bytes a 16-byte-load 4-bit product moves: the row, codes, scales (and zero-point
    terms), the residual and the result."""
    return 4 * K + N * K // 2 + N * nblocks * ((2 if half_scales else 4)
                                               + (4 if zero_points else 0)) \
        + (2 if half_out else 4) * N * (2 if residual else 1)


def _multi_step(k: str, tag: str, rows: int, per: int, zero_points: bool,
                signed: bool, half: bool = False) -> str:
    """One step of ``gemv_q4_multi``'s loop at code load ``k`` of each row: the 8 vec4 of
    the input its 32 codes multiply, loaded once, against each of ``rows`` rows' codes
    (``tag`` names its values apart from another step's in the same iteration)."""
    src = f"    let x{tag} = 8u * ({k});\n"
    src += "".join(f"    let a{i}{tag} = a[x{tag} + {i}u];\n" for i in range(8))
    src += f"    let blk{tag} = ({k}) / {per}u;\n" if per > 1 else f"    let blk{tag} = {k};\n"
    if zero_points:
        src += (f"    let sa{tag} = dot(" + " + ".join(f"a{i}{tag}" for i in range(8))
                + ", vec4<f32>(1.0));\n")
    if half:
        src += "".join(f"    let h{i}{tag} = vec4<f16>(a{i}{tag});\n" for i in range(8))
    for j in range(rows):
        dots = _load_dot(f"w{j}{tag}", "h" if half else "a", tag, half)
        flip = " ^ vec4<u32>(0x88888888u)" if signed else ""  # _unpack_biased_fns
        src += (f"    let w{j}{tag} = b[wb{j} + {k}]{flip};\n"
                f"    acc{j} = acc{j} + scale(sb{j} + blk{tag}) * ({dots})")
        src += f" + zc[sb{j} + blk{tag}] * sa{tag};\n" if zero_points else ";\n"
    return src


def _load_dot(w: str, x: str, tag: str, half: bool) -> str:
    """WGSL: the dot product of one 16-byte code load ``w`` (32 codes, flipped where signed)
    with its 32 inputs ``{x}0{tag}`` .. ``{x}7{tag}`` (8 vec4: float32, or float16 where
    ``half``), unscaled, as an f32."""
    if half:
        return " + ".join(f"hword({w}.{c}, {x}{2 * i}{tag}, {x}{2 * i + 1}{tag})"
                          for i, c in enumerate("xyzw"))
    return " + ".join(f"dot({x}{2 * i}{tag}, lo({w}.{c})) + dot({x}{2 * i + 1}{tag}, hi({w}.{c}))"
                      for i, c in enumerate("xyzw"))


def _scale_fn(half_scales: bool) -> str:
    """WGSL ``scale(i)``: block scale i, from float32 scales or float16 pairs."""
    if half_scales:
        return ("fn scale(i: u32) -> f32 {\n  let p = unpack2x16float(sc[i / 2u]);\n"
                "  return select(p.y, p.x, (i & 1u) == 0u);\n}\n")
    return "fn scale(i: u32) -> f32 {\n  return sc[i];\n}\n"


def _unpack_half_fns(signed: bool) -> str:
    """WGSL ``hword(w, lo, hi)``: one u32 word of 8 codes against its 8 inputs (``lo``,
    ``hi``: float16 vec4s), in float16 pairs. The codes are repacked in pair order
    (``match_q4.repack_codes``: inputs 2m and 2m+1 in nibbles m and m+4), so
    ``(w >> 4m) & 0x000F000F | 0x64006400`` is the float16 pair (1024 + c, 1024 + c'),
    exact; minus 1024 (signed codes, xor-ed with 0x88888888 as for
    ``_unpack_biased_fns``: 1032) it is the code pair, exact, multiplied by the input pair
    and summed with three more pairs in float16: 8 products, then widened to float32.
    (The pair is spelled ``vec2<f16>(unpack2x16float(bits))``: naga has no
    ``bitcast<vec2<f16>>(u32)``, gfx-rs/wgpu#8896; the value is exact either way, and a
    compiler may fold the round trip into a reinterpretation.)

    Worst case against exact arithmetic on the float32 inputs x: each input rounded to
    float16 (relative u = 2^-11), each product and each of the three float16 additions per
    half rounded once more: |error of a word| <= 5u · sum |c · x| (first order) over its 8
    products, i.e. 2.5e-3 of the sum of the magnitudes, and the float32 sums after that
    add ~2^-24 each. Random-signed errors over K inputs grow as sqrt(K), not K: typically
    ~1e-3 of the result. Inputs below 2^-14 in magnitude are float16 subnormals (absolute
    error 2^-25); a product pair's half sum overflows float16 beyond |x| = 65504 / 32 ~
    2047 (four products of codes up to 8), so the variant is for normalised rows (the
    RMSNorm's output the projections read)."""
    return (half_pair_fn(signed)
            + "fn hword(w: u32, lo: vec4<f16>, hi: vec4<f16>) -> f32 {\n"
            "  let p = vec2<f32>(fma(hq(w, 0u), lo.xy, fma(hq(w, 4u), lo.zw, "
            "fma(hq(w, 8u), hi.xy, hq(w, 12u) * hi.zw))));\n"
            "  return p.x + p.y;\n}\n")


def wide_lanes(K: int, loads: int = 1) -> int:
    """Invocations sharing a row group in ``gemv_q4_wide``: enough that each makes
    ``loads`` 16-byte code loads a row (a power of two, at most 256; beyond, each loads
    more)."""
    return _lanes_for(-(-(K // 32) // loads))


def _lanes_for(units: int) -> int:
    """The power of two at least ``units``, at most 256 (a workgroup)."""
    lanes = 1
    while lanes < min(units, 256):
        lanes *= 2
    return lanes


def gemv_q4_wide(K: int, N: int, block: int, *, signed: bool, zero_points: bool,
                 rows: int = 1, loads: int = 1, subgroup: int | None = None,
                 residual: bool = False, n_off: int = 0,
                 splits: Sequence[int] | None = None, half_out: bool = False,
                 half_scales: bool = False, half: bool = False) -> Kernel:
    """The product ``gemv_q4`` computes (same bindings and layouts as ``gemv_q4_multi``),
    shaped for memory-level parallelism: a row group (``rows`` rows) is shared by as many
    invocations as its K/32 code loads need (``wide_lanes``: 64 at K = 2048, 256 at
    8192), so each invocation makes ``loads`` 16-byte code loads a row (more beyond 256
    invocations), all of them issued before any arithmetic: the loop is unrolled at build
    time (K is known), nothing a load waits on but its address. At 1 row and K = 2048 a
    2048-row projection is 131072 invocations (~31 warps a multiprocessor of a 132-SM
    GPU) instead of ``gemv_q4_multi``'s 16384, each with its loads in flight at once.
    The input values a code load multiplies are loaded once for the ``rows`` rows
    (``gemv_q4_multi``'s reuse). The workgroup is 256 invocations (or one group where a
    row group is wider). Sums: ``subgroupAdd`` where the subgroup divides the group
    (then one value a subgroup through workgroup memory), else a tree in workgroup memory;
    lane j writes the group's row j. ``half``: products in float16 pairs
    (``_unpack_half_fns``). Needs the block a multiple of 32 and ``rows`` at most the
    group's invocations."""
    assert K % 32 == 0 and block % 32 == 0 and K % block == 0
    units, nblocks, per = K // 32, K // block, block // 32
    lanes = wide_lanes(K, loads)
    iters = -(-units // lanes)
    R = rows
    assert 1 <= R <= lanes
    G = max(1, 256 // lanes)
    wg, per_wg = G * lanes, G * R
    gx, gy, _ = grid(N, per_wg)
    sub = subgroup if subgroup is not None and lanes % subgroup == 0 else None
    shared = wide_shared(R, lanes, wg, sub)
    src, binds = _rows_head(N, K, block, R, lanes, wg, gx, shared, signed=signed,
                            zero_points=zero_points, residual=residual, n_off=n_off,
                            splits=splits, half_out=half_out, half_scales=half_scales,
                            half=half)
    ragged = units % lanes != 0  # the last iteration's loads run past K on some lanes
    flip = " ^ vec4<u32>(0x88888888u)" if signed else ""  # _unpack_biased_fns
    for i in range(iters):  # every code load first, then scales and inputs
        last = ragged and i == iters - 1
        src += (f"  let k_{i} = min(t + {i * lanes}u, {units - 1}u);\n" if last
                else f"  let k_{i} = t + {i * lanes}u;\n")
        src += "".join(f"  let w{j}_{i} = b[wb{j} + k_{i}]{flip};\n" for j in range(R))
    for i in range(iters):
        blk = f"k_{i} / {per}u" if per > 1 else f"k_{i}"
        src += "".join(f"  let s{j}_{i} = scale(sb{j} + {blk});\n" for j in range(R))
        if zero_points:
            src += "".join(f"  let z{j}_{i} = zc[sb{j} + {blk}];\n" for j in range(R))
    for i in range(iters):
        src += "".join(f"  let a{m}_{i} = a[8u * k_{i} + {m}u];\n" for m in range(8))
        if half:
            src += "".join(f"  let h{m}_{i} = vec4<f16>(a{m}_{i});\n" for m in range(8))

    def step(i: int, ind: str) -> str:
        out = (f"{ind}let sa_{i} = dot(" + " + ".join(f"a{m}_{i}" for m in range(8))
               + ", vec4<f32>(1.0));\n") if zero_points else ""
        return out + "".join(_acc(ind, j, i, _load_dot(f"w{j}_{i}", "h" if half else "a",
                                                       f"_{i}", half), zero_points)
                             for j in range(R))

    src += _accumulate(R, iters, lanes, units, step)
    return _group_kernel("gemv_q4_wide", src, binds, (gx, gy, 1), R, lanes, wg, sub, K, N,
                         nblocks, zero_points=zero_points, residual=residual, n_off=n_off,
                         splits=splits, half_out=half_out, half_scales=half_scales)


def _accumulate(R: int, iters: int, lanes: int, units: int,
                step: Callable[[int, str], str]) -> str:
    """WGSL: ``R`` sums ``acc{j}`` over ``iters`` unrolled steps (``step(i, indent)``), the
    last guarded where ``units`` loads do not fill every lane's (``lanes`` a group)."""
    src = "".join(f"  var acc{j} = 0.0;\n" for j in range(R))
    for i in range(iters):
        if units % lanes and i == iters - 1:
            src += f"  if (t + {i * lanes}u < {units}u) {{\n{step(i, '    ')}  }}\n"
        else:
            src += step(i, "  ")
    return src


def _acc(ind: str, j: int, i: int, dots: str, zero_points: bool) -> str:
    """WGSL: row j's sum plus step i's scaled dot (and zero-point term)."""
    return (f"{ind}acc{j} = acc{j} + s{j}_{i} * ({dots})"
            + (f" + z{j}_{i} * sa_{i};\n" if zero_points else ";\n"))


def _group_kernel(name: str, src: str, binds: list[str], groups: tuple[int, int, int], R: int,
                  lanes: int, wg: int, subgroup: int | None, K: int, N: int, nblocks: int, *,
                  zero_points: bool, residual: bool, n_off: int,
                  splits: Sequence[int] | None, half_out: bool, half_scales: bool,
                  gated: GatedOutput | None = None,
                  stats: StatsOutput | None = None,
                  mapped: GatedOutput | None = None) -> Kernel:
    """``gemv_q4_wide``'s or ``gemv_q4_quad``'s kernel: ``src`` up to the sums, then the
    group's sums (``_group_sums``) and lane j's write of row n0 + j (``gemv_write``), or
    with ``gated`` the pair's element (``matmul.gated_write``), or with ``stats`` the row and
    the workgroup's partial sum (``matmul.stats_write``), or with ``mapped`` its function of each
    row's sum."""
    src += _group_sums(R, lanes, wg, subgroup)
    traffic = _q4_traffic(K, N, nblocks, zero_points, residual, half_out, half_scales)
    if mapped is not None:
        idx = f"{n_off}u + n"
        src += (f"  let n = n0 + t;\n  if (t < {R}u && n < {N}u) {{\n"
                f"    let g0 = s;\n    out[{idx}] = {mapped.call.format(idx)};\n  }}\n}}\n")
        traffic += (esize(mapped.out_type) - (2 if half_out else 4)) * N
    elif stats is not None:
        src += "  let n = n0 + t;\n" + stats_write(
            f"t < {R}u", f"g * {R}u + t", (wg // lanes) * R, f"wid.y * {groups[0]}u + wid.x",
            f"{n_off}u + n", N, residual, half_out)
        traffic += 4 * groups[0] * groups[1]
    elif gated is None:
        src += "  let n = n0 + t;\n" + gemv_write(f"t < {R}u", f"{n_off}u + n", N, residual,
                                                  splits, half_out)
    else:
        src += gated_write(gated, R, f"t < {R}u", f"g * {R}u + t", f"t < {R // 2}u",
                           f"g * {R}u", "n0", "t", N // 2)
        traffic += esize(gated.out_type) * (N // 2) - 4 * N
    return Kernel(name, src, binds, groups, traffic)


def _group_sums(R: int, lanes: int, wg: int, subgroup: int | None) -> str:
    """WGSL: the ``R`` sums ``acc{j}`` of a group of ``lanes`` invocations (``wg`` a
    workgroup) combined into ``s`` on lane j for row j: ``subgroupAdd`` where ``subgroup``
    (dividing ``lanes``; then one value a subgroup through workgroup memory ``sh``, which
    the kernel declares, G · R · lanes / subgroup floats), else a tree in ``sh``
    (``wg · R`` floats)."""
    src = ""
    use_sub = subgroup is not None
    nsub = lanes // subgroup if subgroup else 0
    if use_sub:
        src += "".join(f"  let s{j} = subgroupAdd(acc{j});\n" for j in range(R))
        if nsub == 1:
            src += "  var s = s0;\n" + "".join(
                f"  if (t == {j}u) {{ s = s{j}; }}\n" for j in range(1, R))
        else:  # one value a subgroup a row, summed by lane j of the group for its row j
            src += f"  if (t % {subgroup}u == 0u) {{\n"
            src += "".join(f"    sh[(g * {R}u + {j}u) * {nsub}u + t / {subgroup}u] = s{j};\n"
                           for j in range(R))
            src += ("  }\n  workgroupBarrier();\n  var s = 0.0;\n"
                    f"  if (t < {R}u) {{\n"
                    f"    for (var i = 0u; i < {nsub}u; i = i + 1u) "
                    f"{{ s = s + sh[(g * {R}u + t) * {nsub}u + i]; }}\n  }}\n")
    else:  # a tree in workgroup memory, row j's values at j * wg + lid
        src += "".join(f"  sh[{j * wg}u + lid] = acc{j};\n" for j in range(R))
        src += "  workgroupBarrier();\n"
        h = lanes // 2
        while h >= 1:
            src += f"  if (t < {h}u) {{\n"
            src += "".join(f"    sh[{j * wg}u + lid] = sh[{j * wg}u + lid] + "
                           f"sh[{j * wg}u + lid + {h}u];\n" for j in range(R))
            src += "  }\n  workgroupBarrier();\n"
            h //= 2
        src += (f"  var s = 0.0;\n  if (t < {R}u) {{ s = sh[t * {wg}u + g * {lanes}u]; }}\n")
    return src


def wide_shared(R: int, lanes: int, wg: int, subgroup: int | None) -> int:
    """Floats of workgroup memory ``_group_sums`` needs (0: none)."""
    if subgroup is None:
        return wg * R
    nsub = lanes // subgroup
    return (wg // lanes) * R * nsub if nsub > 1 else 0


#: rows whose code words ``gemv_q4_quad`` reads in one 16-byte load
QUAD = 4


def quad_lanes(K: int, loads: int = 1) -> int:
    """Invocations sharing a group of ``QUAD`` rows in ``gemv_q4_quad``: enough that each
    makes ``loads`` 16-byte loads (a power of two, at most 256; beyond, each loads more),
    and at least ``QUAD``: lane j writes the group's row j."""
    return max(QUAD, _lanes_for(-(-(K // 8) // loads)))


def quad_workgroups(K: int, N: int, loads: int = 1) -> int:
    """The workgroups of ``gemv_q4_quad`` over ``N`` rows: how many partial sums its
    ``stats`` writes."""
    lanes = quad_lanes(K, loads)
    gx, gy, _ = grid(N, max(1, 256 // lanes) * QUAD)
    return gx * gy


def gemv_q4_quad(K: int, N: int, block: int, *, signed: bool, zero_points: bool,
                 loads: int = 1, subgroup: int | None = None, residual: bool = False,
                 n_off: int = 0, splits: Sequence[int] | None = None,
                 half_out: bool = False, half_scales: bool = False,
                 half: bool = False, prologue: VectorSource | None = None,
                 gated: GatedOutput | None = None,
                 stats: StatsOutput | None = None,
                 mapped: GatedOutput | None = None,
                 shared_input: bool = False, ints: bool = False) -> Kernel:
    """The product ``gemv_q4`` computes, the codes of ``QUAD`` rows interleaved by word
    (``match_q4.interleave_rows``): one 16-byte load is 8 codes of each of 4 rows at the
    same 8 inputs, so an invocation's input is 2 ``vec4`` (32 bytes, adjacent
    invocations' adjacent: coalesced), not the 8 scattered ones (128 bytes at a 128-byte
    stride across a warp: a cache line per invocation) that a 32-code load of one row
    needs in ``multi`` and ``wide``. Bindings as ``gemv_q4_multi``'s but ``b`` (N/4, K/8)
    ``vec4<u32>`` (row 4g + r's word j in component r of element g·K/8 + j) and ``sc``
    (and ``zc``) (N/4, K/block, 4) (N padded to a multiple of 4 with zero codes). Each
    invocation scales its 8 codes a row (the block spans 4 invocations). ``loads`` and
    the group's width as ``gemv_q4_wide`` (all loads issued first, loop unrolled at build
    time; ``quad_lanes``: 256 at K = 2048), sums as there (``_group_sums``); ``half``:
    float16 pair products (``_unpack_half_fns``).

    ``prologue``: the input is not a buffer but computed where it is read (``_input_vec4``:
    RMSNorm's tail after its mean of squares, SwiGLU's product), after every code load
    is issued, so the vector's loads and its reduction wait beside the codes' loads.
    ``shared_input`` (with ``prologue``): the vector computed once a workgroup, each
    invocation its share of ``K / 4`` words into workgroup memory and one barrier, where
    otherwise each of the workgroup's groups computes all of it (``256 / lanes`` times).
    A prologue's ``setup`` (an attention's combine) runs there too, after the code loads.

    ``gated``: the rows are a pair of stacked products', two of each a group
    (``gemv.paired_rows``), and the kernel writes ``gated``'s element of the two at
    each of the N / 2 indices (SwiGLU's ``silu(gate) · up``) instead of N sums: the
    activation needs no launch, and neither product's output is written. ``mapped``: the
    same for one product, its element-wise function of each row's sum (the logits'
    float16 rounding) written in place of the sum.

    ``stats``: each workgroup also writes a partial sum of a function of the rows it wrote
    (``matmul.stats_write``: RMSNorm's sum of squares of the residual stream), one float a
    workgroup (``quad_workgroups``), which the next norm's readers sum (``prologue``'s
    ``partials``): the norm needs no launch, and no workgroup repeats the row's reduction.
    A prologue whose reduction is such partials sums them (``matmul.prologue_reduction``).

    ``ints`` (codes in nibble order, not ``half``'s pair order; no zero points): the input
    (the buffer's or the ``prologue``'s) split into two int8 parts once a workgroup
    (``_int8_vector``), and each word's 8 codes times them as exact integer dot products
    (``dot4I8Packed``, four a row): ``_int8_word``."""
    assert K % 32 == 0 and block % 32 == 0 and K % block == 0
    assert gated is None or N % QUAD == 0
    assert not (ints and (half or zero_points))
    words, nblocks, per = K // 8, K // block, block // 8
    lanes = quad_lanes(K, loads)
    iters = -(-words // lanes)
    R, groups = QUAD, -(-N // QUAD)
    G = max(1, 256 // lanes)
    wg = G * lanes
    gx, gy, _ = grid(N, G * R)
    sub = subgroup if subgroup is not None and lanes % subgroup == 0 else None
    red = prologue_reduction(prologue, wg, subgroup)
    if red is not None:
        prologue = VectorSource(prologue.src + red[0], prologue.bindings, prologue.element,
                                prologue.reduction)
    shared_input = (shared_input and prologue is not None and not ints
                    and prologue.setup is None)  # a setup's vector is in workgroup memory
    if shared_input:
        prologue = VectorSource(prologue.src + f"var<workgroup> xs: array<vec4<f32>, {K // 4}>;\n",
                                prologue.bindings, prologue.element, prologue.reduction)
    src, binds = _rows_head(N, K, block, R, lanes, wg, gx, wide_shared(R, lanes, wg, sub),
                            signed=signed, zero_points=zero_points, residual=residual,
                            n_off=n_off, splits=splits, half_out=half_out,
                            half_scales=half_scales, half=half, row_offsets=False,
                            prologue=prologue, gated=gated, stats=stats, mapped=mapped)
    if ints:  # (module scope: before the bindings)
        src = int8_vector_decls(K) + src
    src += f"  let q = min(n0 / {R}u, {groups - 1}u);\n"
    ragged = words % lanes != 0
    flip = " ^ vec4<u32>(0x88888888u)" if signed else ""  # _unpack_biased_fns
    for i in range(iters):  # every code load first, then scales and inputs
        last = ragged and i == iters - 1
        src += (f"  let j_{i} = min(t + {i * lanes}u, {words - 1}u);\n" if last
                else f"  let j_{i} = t + {i * lanes}u;\n")
        src += f"  let w_{i} = b[q * {words}u + j_{i}]{flip};\n"
    if red is not None:  # uniform control flow: every invocation, no return before
        src += red[1]
    if prologue is not None and prologue.setup is not None:  # likewise
        src += prologue.setup(wg)
    if shared_input:
        src += _shared_vector(prologue, K // 4, wg)
    if ints:
        src += _int8_vector(prologue, K, wg, subgroup)
    for i in range(iters):
        src += f"  let sb_{i} = (q * {nblocks}u + j_{i} / {per}u) * {R}u;\n"
        if half_scales:  # the 4 rows' float16 scales: two words
            src += (f"  let p01_{i} = unpack2x16float(sc[sb_{i} / 2u]);\n"
                    f"  let p23_{i} = unpack2x16float(sc[sb_{i} / 2u + 1u]);\n"
                    f"  let s0_{i} = p01_{i}.x;\n  let s1_{i} = p01_{i}.y;\n"
                    f"  let s2_{i} = p23_{i}.x;\n  let s3_{i} = p23_{i}.y;\n")
        else:
            src += "".join(f"  let s{r}_{i} = scale(sb_{i} + {r}u);\n" for r in range(R))
        if zero_points:
            src += "".join(f"  let z{r}_{i} = zc[sb_{i} + {r}u];\n" for r in range(R))
        if ints:
            src += (f"  let xq_{i} = xq[j_{i}];\n  let xn_{i} = xn[j_{i}];\n"
                    f"  let xk_{i} = xk[j_{i} / 4u];\n")
        elif shared_input:
            src += (f"  let lo_{i} = xs[2u * j_{i}];\n"
                    f"  let hi_{i} = xs[2u * j_{i} + 1u];\n")
        else:
            src += (f"  let lo_{i} = {_input_vec4(prologue, f'j_{i}', 0)};\n"
                    f"  let hi_{i} = {_input_vec4(prologue, f'j_{i}', 1)};\n")
        if half:
            src += (f"  let hlo_{i} = vec4<f16>(lo_{i});\n"
                    f"  let hhi_{i} = vec4<f16>(hi_{i});\n")
    def step(i: int, ind: str) -> str:
        if ints:
            return _int8_word(i, ind, R, 8 if signed else 0)
        out = (f"{ind}let sa_{i} = dot(lo_{i} + hi_{i}, vec4<f32>(1.0));\n"
               if zero_points else "")
        return out + "".join(_acc(ind, r, i, f"hword(w_{i}.{c}, hlo_{i}, hhi_{i})" if half else
                                  f"dot(lo_{i}, lo(w_{i}.{c})) + dot(hi_{i}, hi(w_{i}.{c}))",
                                  zero_points) for r, c in enumerate("xyzw"))

    src += _accumulate(R, iters, lanes, words, step)
    return _group_kernel("gemv_q4_quad", src, binds, (gx, gy, 1), R, lanes, wg, sub, K, N,
                         nblocks, zero_points=zero_points, residual=residual, n_off=n_off,
                         splits=splits, half_out=half_out, half_scales=half_scales,
                         gated=gated, stats=stats, mapped=mapped)


#: the int8 parts' scale: an input x of a 32-input block whose largest magnitude is m is
#: (m / 127) · (h + l / INT8_LO), h and l int8 (``_int8_vector``)
INT8_LO = 254


def _int8_arrays(K: int) -> tuple[tuple[str, str, int, int], ...]:
    """(name, element type, elements, bytes an element) of ``_int8_vector``'s workgroup
    memory: per 8-input word the parts packed (``xq``) and their weighted sum (``xn``), per
    32-input block the scale (``xk``)."""
    return (("xq", "vec4<u32>", K // 8, 16), ("xn", "i32", K // 8, 4), ("xk", "f32", K // 32, 4))


def int8_vector_decls(K: int) -> str:
    """Workgroup memory of ``_int8_vector`` (``_int8_arrays``), declared at module scope."""
    return "".join(f"var<workgroup> {name}: array<{t}, {n}>;\n"
                   for name, t, n, _ in _int8_arrays(K))


def quad_scratch_bytes() -> int:
    """The most workgroup memory ``gemv_q4_quad`` takes besides its input's: the sums'
    scratch of a 256-invocation workgroup without subgroups (``wide_shared``: 256 · ``QUAD``
    floats) and 256 floats more (the pair's, the partial sums' or a reduction's)."""
    return 4 * 256 * (QUAD + 1)


def int8_fits(K: int, shared_bytes: int) -> bool:
    """Whether ``gemv_q4_quad(ints=True)``'s workgroup memory fits ``shared_bytes``: the
    parts (``_int8_arrays``) beside ``quad_scratch_bytes``."""
    parts = sum(n * size for _, _, n, size in _int8_arrays(K))
    return parts + quad_scratch_bytes() <= shared_bytes


def _int8_vector(prologue: VectorSource | None, K: int, wg: int,
                 subgroup: int | None = None) -> str:
    """WGSL: the input vector (``prologue``'s elements, or the buffer ``a`` of ``vec4``s)
    split into two int8 parts a workgroup: with m a 32-input block's largest magnitude and
    s = m / 127, h = round(x / s) and l = round((x / s - h) · ``INT8_LO``), so x = s · (h +
    l / 254) within s / 508 = m / 64516 (about 2^-16 of the block's largest input, where a
    float16 input keeps 2^-11 of its own). Per word (8 inputs): ``xq`` the parts packed 4 a
    u32 (h of the even inputs, h of the odd, l of the even, l of the odd: ``_int8_word``'s
    code order), ``xn`` = Σ (254 h + l); per block ``xk`` = s / 254. Then one barrier. At a
    fixed ``subgroup`` width of at least 4, one invocation a word, a block's 4 words in 4
    adjacent lanes whose maximum two ``subgroupShuffleXor`` meet; else one invocation a
    block."""
    words, blocks = K // 8, K // 32
    per_word = subgroup is not None and subgroup >= 4 and subgroup & (subgroup - 1) == 0
    count = words if per_word else blocks
    src = ""
    for e in range(-(-count // wg)):
        full = (e + 1) * wg <= count
        if per_word:  # every lane reaches the shuffles: a ragged round clamps, then skips
            at = f"lid + {e * wg}u" if full else f"min(lid + {e * wg}u, {count - 1}u)"
            body = f"    let wd = {at};\n"
            xs = [(element_vec4(prologue.element, "8u * wd", 4 * i) if prologue is not None
                   else f"a[2u * wd + {i}u]") for i in range(2)]
            body += "".join(f"    let x{i} = {x};\n" for i, x in enumerate(xs))
            body += ("    let mv = max(abs(x0), abs(x1));\n"
                     "    var m = max(max(mv.x, mv.y), max(mv.z, mv.w));\n"
                     "    m = max(m, subgroupShuffleXor(m, 1u));\n"
                     "    m = max(m, subgroupShuffleXor(m, 2u));\n"
                     "    let inv = select(127.0 / m, 0.0, m == 0.0);\n")
            write = "" if full else f"lid + {e * wg}u < {count}u && "
            body += (f"    if ({write}wd % 4u == 0u) {{ xk[wd / 4u] = m / {127 * INT8_LO}.0; }}\n"
                     + (f"    if (lid + {e * wg}u < {count}u) {{\n" if not full else "    {\n")
                     + _int8_parts("x0", "x1", "wd") + "    }\n")
            src += "  {\n" + body + "  }\n"
            continue
        body = f"    let qb = lid + {e * wg}u;\n"
        xs = [(element_vec4(prologue.element, "32u * qb", 4 * i) if prologue is not None
               else f"a[8u * qb + {i}u]") for i in range(8)]
        body += "".join(f"    let x{i} = {x};\n" for i, x in enumerate(xs))
        mx = "abs(x0)"
        for i in range(1, 8):
            mx = f"max({mx}, abs(x{i}))"
        body += (f"    let mv = {mx};\n    let m = max(max(mv.x, mv.y), max(mv.z, mv.w));\n"
                 f"    let inv = select(127.0 / m, 0.0, m == 0.0);\n"
                 f"    xk[qb] = m / {127 * INT8_LO}.0;\n")
        body += "".join("    {\n" + _int8_parts(f"x{2 * w}", f"x{2 * w + 1}", f"4u * qb + {w}u")
                        + "    }\n" for w in range(4))
        src += ("  {\n" + body + "  }\n" if full
                else f"  if (lid + {e * wg}u < {count}u) {{\n" + body + "  }\n")
    return src + "  workgroupBarrier();\n"


def _int8_parts(lo: str, hi: str, word: str) -> str:
    """WGSL: word ``word``'s 8 inputs (``vec4``s ``lo``, ``hi``) times ``inv`` (127 over
    their block's largest magnitude) split into ``xq[word]`` and ``xn[word]``
    (``_int8_vector``)."""
    return (f"      let ev = vec4<f32>({lo}.x, {lo}.z, {hi}.x, {hi}.z) * inv;\n"
            f"      let od = vec4<f32>({lo}.y, {lo}.w, {hi}.y, {hi}.w) * inv;\n"
            f"      let hev = round(ev);\n      let hod = round(od);\n"
            f"      let lev = round((ev - hev) * {INT8_LO}.0);\n"
            f"      let lod = round((od - hod) * {INT8_LO}.0);\n"
            f"      let t = vec4<i32>(hev + hod) * {INT8_LO} + vec4<i32>(lev + lod);\n"
            f"      xq[{word}] = vec4<u32>(pack4xI8(vec4<i32>(hev)), "
            f"pack4xI8(vec4<i32>(hod)), pack4xI8(vec4<i32>(lev)), pack4xI8(vec4<i32>(lod)));\n"
            f"      xn[{word}] = t.x + t.y + t.z + t.w;\n")


def _int8_word(i: int, ind: str, R: int, bias: int) -> str:
    """WGSL: step ``i`` of ``gemv_q4_quad(ints=True)``: each of the ``R`` rows' code word
    (nibbles c + ``bias``) times word ``j_i``'s int8 parts, as exact integer dot products:
    the even nibbles (``w & 0x0F0F0F0F``) against the even inputs' parts, the odd ones
    against the odd; d = 254 · (codes · h) + codes · l - bias · Σ (254 h + l), below 2^22
    in magnitude (8 codes of at most 15 times at most 254 · 127 + 127), so the R sums are
    converted exactly by the mantissa trick (on a ``vec4``: naga's scalar i32-to-f32
    ``bitcast`` is miscompiled) and scaled by the row's and the block's scales."""
    out = ""
    for r, c in enumerate("xyzw"[:R]):
        out += (f"{ind}let ce{r}_{i} = w_{i}.{c} & 0x0F0F0F0Fu;\n"
                f"{ind}let co{r}_{i} = (w_{i}.{c} >> 4u) & 0x0F0F0F0Fu;\n"
                f"{ind}let d{r}_{i} = {INT8_LO} * (dot4I8Packed(ce{r}_{i}, xq_{i}.x) + "
                f"dot4I8Packed(co{r}_{i}, xq_{i}.y)) + dot4I8Packed(ce{r}_{i}, xq_{i}.z) + "
                f"dot4I8Packed(co{r}_{i}, xq_{i}.w){f' - {bias} * xn_{i}' if bias else ''};\n")
    ds = ", ".join(f"d{r}_{i}" for r in range(R))
    out += (f"{ind}let f_{i} = (bitcast<vec4<f32>>(bitcast<vec4<u32>>(vec4<i32>({ds})) + "
            f"vec4<u32>(0x4B400000u)) - vec4<f32>(12582912.0)) * xk_{i};\n")
    return out + "".join(f"{ind}acc{r} = acc{r} + s{r}_{i} * f_{i}.{c};\n"
                         for r, c in enumerate("xyzw"[:R]))


def _shared_vector(prologue: VectorSource, words: int, wg: int) -> str:
    """WGSL: the ``prologue``'s vector, ``words`` ``vec4`` words, into workgroup memory
    ``xs``, each invocation its words at a stride of ``wg`` (straight-line), then one
    barrier."""
    src = ""
    for e in range(-(-words // wg)):
        w = f"lid + {e * wg}u"
        line = f"  xs[{w}] = {element_vec4(prologue.element, f'4u * ({w})')};\n"
        src += line if (e + 1) * wg <= words else f"  if ({w} < {words}u) {{\n  {line}  }}\n"
    return src + "  workgroupBarrier();\n"


def _input_vec4(prologue: VectorSource | None, word: str, half: int) -> str:
    """WGSL: the 4 inputs of code word ``word``'s low (``half`` 0) or high (1) 4 codes:
    one ``vec4`` of the buffer ``a``, or the ``prologue``'s elements computed."""
    if prologue is None:
        return f"a[2u * {word}{' + 1u' if half else ''}]"
    return element_vec4(prologue.element, f"8u * {word}", 4 * half)
