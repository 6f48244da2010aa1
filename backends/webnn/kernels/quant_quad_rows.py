"""A 4-bit product of several input rows (a K-token verify's) on the one-token quad layout.

``quant.gemm_q4_cols`` reads a 16-byte code load (32 codes of one column) against 8 input
``vec4`` a row, so a K = 4 verify issues 32 input loads for each code load, and its products
ran at 0.40 TB/s on an H100 where the one-token step's quad kernel ran the same weights at
0.58 (PERFORMANCE.md, "A speculative verify"). Here one 16-byte load is a code word of each
of 4 output rows (``match_q4.interleave_rows``, the one-token layout), its 8 codes a row
multiplied against 2 input ``vec4`` of each input row: 2·M input loads a code load, each
code dequantised once for all M rows."""

from __future__ import annotations

from collections.abc import Sequence

from .common import Kernel, decl, esize, grid
from .matmul import VectorSource
from .quant import _row_input, _rows_write, _unpack_fns
from .quant_rows import (
    QUAD,
    GatedOutput,
    StatsOutput,
    _group_sums,
    _scale_fn,
    group_entry,
    quad_lanes,
    wide_shared,
)


def _input(m: int, x: str, K4: int, M: int, head_d: int | None, computed: bool) -> str:
    """WGSL: vec4 ``x`` (in units of 4 inputs along K) of input row ``m``: in its row, or
    within attention's (heads, M, head_d) output, in the head ``x`` falls in, or
    (``computed``) the prologue's 4 elements at flat index m · K + 4x.., each with row
    m's reduced value ``red{m}`` (``_row_input``)."""
    if computed:
        return "vec4<f32>(" + ", ".join(f"row_in({4 * m * K4}u + 4u * ({x}) + {c}u, red{m})"
                                        for c in range(4)) + ")"
    if head_d is None:
        return f"a[{m * K4}u + {x}]"
    d4 = head_d // 4
    return f"a[(({x}) / {d4}u) * {M * d4}u + {m * d4}u + ({x}) % {d4}u]"


def quad_group(K: int, M: int, loads: int = 1) -> int:
    """Invocations sharing 4 columns: ``quad_lanes``' (each ``loads`` code loads along K),
    and at least the 4·M whose lanes hold the group's sums (a short K leaves some idle)."""
    return max(quad_lanes(K, loads), 1 << (4 * M - 1).bit_length())


def shared_bytes(K: int, M: int, subgroup: int | None, loads: int = 1,
                 norms: bool = False) -> int:
    """Workgroup memory ``gemm_q4_quad`` declares for its sums (the lowering checks it
    against the adapter's limit); ``norms``: at most, with a ``prologue``'s M reductions
    (a workgroup's floats each) and ``stats``' sums."""
    lanes = quad_group(K, M, loads)
    wg = max(1, 256 // lanes) * lanes
    sub = subgroup if subgroup is not None and lanes % subgroup == 0 else None
    extra = M * wg + (wg // lanes) * QUAD * M if norms else 0
    return 4 * (wide_shared(QUAD * M, lanes, wg, sub) + extra)


def workgroups(K: int, N: int, M: int, loads: int = 1) -> int:
    """The workgroups of ``gemm_q4_quad`` over ``N`` columns: how many partial sums a row
    its ``stats`` writes."""
    lanes = quad_group(K, M, loads)
    gx, gy, _ = grid(N, max(1, 256 // lanes) * QUAD)
    return gx * gy


def _row_stats_write(M: int, G: int, gx: int, W: int, N: int, width: int, n_off: int,
                 residual: bool, half_out: bool) -> str:
    """WGSL closing a kernel whose lane t < 4·M of each of ``G`` groups holds the sum of
    column n0 + t % 4 of row t / 4: the value written as ``quant._rows_write`` writes it (plus
    ``res``; float16, rounded once), ``norm_el`` of it into workgroup memory; after one
    barrier lane m < M writes its row's sum over the workgroup to ``pt[m · W +
    workgroup]`` (``StatsOutput``, a row's ``W`` partials together). Every invocation
    reaches the barrier."""
    R, RM = QUAD, QUAD * M
    idx = f"m0 * {width}u + {n_off}u + n"
    val = f"s + f32(res[{idx}])" if residual else "s"
    total = " + ".join(f"nrm_sh[{g * RM}u + lid * {R}u + {c}u]"
                       for g in range(G) for c in range(R))
    return (f"  let n = n0 + t % {R}u;\n  let m0 = t / {R}u;\n  var nf = 0.0;\n"
            f"  if (t < {RM}u && n < {N}u) {{\n"
            f"    let xs = {'f16' if half_out else 'f32'}({val});\n"
            f"    out[{idx}] = xs;\n    nf = norm_el({idx}, xs);\n  }}\n"
            f"  if (t < {RM}u) {{ nrm_sh[g * {RM}u + t] = nf; }}\n  workgroupBarrier();\n"
            f"  if (lid < {M}u) {{ pt[lid * {W}u + wid.y * {gx}u + wid.x] = {total}; }}\n}}\n")


def gemm_q4_quad(K: int, N: int, block: int, M: int, *, signed: bool,
                 subgroup: int | None = None, loads: int = 1, residual: bool = False,
                 n_off: int = 0, width: int | None = None,
                 splits: Sequence[int] | None = None, half_out: bool = False,
                 half_scales: bool = False, head_d: int | None = None,
                 gated: GatedOutput | None = None, prologue: VectorSource | None = None,
                 stats: StatsOutput | None = None) -> Kernel:
    """out[m, n] = sum_k a[m, k] · w[n, k] for M rows of K inputs (``head_d``: the rows lie
    in attention's (heads, M, head_d) output, as ``quant.gemm_q4_cols`` reads them) and N
    columns of 4-bit codes (signed, or centred on 8 with no zero points) in the quad layout
    of ``quant_rows.gemv_q4_quad``: ``b`` (N/4, K/8) ``vec4<u32>``, ``sc`` (N/4, K/block, 4)
    float32 (float16 pairs with ``half_scales``).

    A group of ``quad_group(K, M, loads)`` invocations shares 4 columns, each invocation
    ``loads`` code loads along K issued before its sums; the group's 4·M sums meet by
    ``_group_sums`` and lane t writes column n0 + t % 4 of row t / 4 (``width`` a row,
    at ``n_off``; plus ``res`` where ``residual``; float16, rounded once, with
    ``half_out``; ``splits``: the stacked outputs each column falls in). ``gated``: the
    columns are a stacked pair's in ``gemv.paired_rows`` order, and the kernel writes
    ``gated``'s element of each pair (M rows of N / 2) instead of the sums.

    The norm between two products without a launch (``gemv_q4_quad``'s, for M rows):
    ``stats``: each workgroup also writes, for each row, the sum of ``norm_el`` over the
    values it wrote (``_row_stats_write``; M · ``workgroups`` floats, row by row);
    ``prologue`` (``partials`` only): the input is computed where it is read (``row_in``),
    each workgroup first summing each row's partials into that row's reduced value
    (``_row_input``), after every code load is issued."""
    assert K % 32 == 0 and block % 32 == 0 and K % block == 0 and 1 <= M <= 64
    assert gated is None or (N % QUAD == 0 and not (residual or splits or n_off))
    assert prologue is None or (prologue.partials is not None and head_d is None
                                and prologue.setup is None)
    assert stats is None or (gated is None and not splits)
    R, RM, K4 = QUAD, QUAD * M, K // 4
    words, nblocks, per = K // 8, K // block, block // 8
    lanes = quad_group(K, M, loads)
    iters = -(-words // lanes)
    G = max(1, 256 // lanes)
    wg = G * lanes
    gx, gy, _ = grid(N, G * R)
    sub = subgroup if subgroup is not None and lanes % subgroup == 0 else None
    width = width or N
    io = "f16" if half_out else "f32"
    rows_in = _row_input(prologue, M, wg, subgroup) if prologue is not None else None
    src, binds = ((prologue.src + rows_in[0], list(prologue.bindings)) if rows_in
                  else (decl(0, "a", "vec4<f32>", "read"), ["read"]))
    src += (decl(len(binds), "b", "vec4<u32>", "read")
            + decl(len(binds) + 1, "sc", "u32" if half_scales else "f32", "read"))
    binds += ["read"] * 2
    if residual:
        src += decl(len(binds), "res", io, "read")
        binds.append("read")
    if gated is not None:
        io = gated.out_type
        src += gated.src + f"var<workgroup> pair_sh: array<f32, {G * RM}>;\n"
    outs = list(splits) if splits else [N // 2 if gated is not None else N]
    for j in range(len(outs)):
        src += decl(len(binds), f"out{j}" if splits else "out", io, "rw")
        binds.append("rw")
    if stats is not None:
        src += (decl(len(binds), "pt", "f32", "rw") + stats.src
                + f"var<workgroup> nrm_sh: array<f32, {G * RM}>;\n")
        binds.append("rw")
    src += _unpack_fns(signed) + _scale_fn(half_scales)
    src += group_entry(R, lanes, wg, gx, wide_shared(RM, lanes, wg, sub))
    src += f"  let q = min(n0 / {R}u, {-(-N // R) - 1}u);\n"
    for i in range(iters):  # every code load first
        j = (f"min(t + {i * lanes}u, {words - 1}u)" if words % lanes and i == iters - 1
             else f"t + {i * lanes}u")
        src += f"  let j_{i} = {j};\n  let w_{i} = b[q * {words}u + j_{i}];\n"
    if rows_in is not None:  # uniform control flow: every invocation, no return before
        src += rows_in[1]
    src += "".join(f"  var acc{k} = 0.0;\n" for k in range(RM))
    ins = rows_in is not None
    for i in range(iters):
        guard = words % lanes and i == iters - 1
        ind = "    " if guard else "  "
        body = f"{ind}let sb_{i} = (q * {nblocks}u + j_{i} / {per}u) * {R}u;\n"
        body += "".join(f"{ind}let s{r}_{i} = scale(sb_{i} + {r}u);\n" for r in range(R))
        for m in range(M):
            body += (f"{ind}let lo{m}_{i} = {_input(m, f'2u * j_{i}', K4, M, head_d, ins)};\n"
                     f"{ind}let hi{m}_{i} = "
                     f"{_input(m, f'2u * j_{i} + 1u', K4, M, head_d, ins)};\n")
        for r, c in enumerate("xyzw"):
            body += (f"{ind}let ql{r}_{i} = lo(w_{i}.{c});\n"
                     f"{ind}let qh{r}_{i} = hi(w_{i}.{c});\n")
            body += "".join(
                f"{ind}acc{m * R + r} = acc{m * R + r} + s{r}_{i} * (dot(lo{m}_{i}, ql{r}_{i})"
                f" + dot(hi{m}_{i}, qh{r}_{i}));\n" for m in range(M))
        src += f"  if (t + {i * lanes}u < {words}u) {{\n{body}  }}\n" if guard else body
    src += _group_sums(RM, lanes, wg, sub)  # lane t < 4·M: sum t, column t % 4 of row t / 4
    traffic = (4 * K * M + N * K // 2 + N * nblocks * (2 if half_scales else 4)
               + esize(io) * M * (N // 2 if gated is not None else N) * (2 if residual else 1))
    if gated is not None:
        half = R // 2
        src += (f"  if (t < {RM}u) {{ pair_sh[g * {RM}u + t] = s; }}\n  workgroupBarrier();\n"
                f"  let e = t % {half}u;\n  let mp = t / {half}u;\n"
                f"  let np = n0 / 2u + e;\n"
                f"  if (t < {half * M}u && np < {N // 2}u) {{\n"
                f"    let g0 = pair_sh[g * {RM}u + mp * {R}u + e];\n"
                f"    let g1 = pair_sh[g * {RM}u + mp * {R}u + e + {half}u];\n"
                f"    let gi = mp * {N // 2}u + np;\n"
                f"    out[gi] = {gated.call.format('gi')};\n  }}\n}}\n")
        return Kernel("gemm_q4_quad", src, binds, (gx, gy, 1), traffic)
    if stats is not None:
        traffic += 4 * M * gx * gy
        src += _row_stats_write(M, G, gx, gx * gy, N, width, n_off, residual, half_out)
        return Kernel("gemm_q4_quad", src, binds, (gx, gy, 1), traffic)
    src += f"  let n = n0 + t % {R}u;\n  let m0 = t / {R}u;\n"  # row m0 + 0 of _rows_write
    src += _rows_write("s", f"t < {RM}u", 0, N, M, width, n_off, residual, half_out, splits)
    return Kernel("gemm_q4_quad", src + "}\n", binds, (gx, gy, 1), traffic)
