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
from .quant import _rows_write, _unpack_fns
from .quant_rows import QUAD, GatedOutput, _group_sums, _scale_fn, group_entry, quad_lanes, wide_shared


def _input(m: int, x: str, K4: int, M: int, head_d: int | None) -> str:
    """WGSL: vec4 ``x`` (in units of 4 inputs along K) of input row ``m``: in its row, or
    within attention's (heads, M, head_d) output, in the head ``x`` falls in."""
    if head_d is None:
        return f"a[{m * K4}u + {x}]"
    d4 = head_d // 4
    return f"a[(({x}) / {d4}u) * {M * d4}u + {m * d4}u + ({x}) % {d4}u]"


def quad_group(K: int, M: int, loads: int = 1) -> int:
    """Invocations sharing 4 columns: ``quad_lanes``' (each ``loads`` code loads along K),
    and at least the 4·M whose lanes hold the group's sums (a short K leaves some idle)."""
    return max(quad_lanes(K, loads), 1 << (4 * M - 1).bit_length())


def shared_bytes(K: int, M: int, subgroup: int | None, loads: int = 1) -> int:
    """Workgroup memory ``gemm_q4_quad`` declares for its sums (the lowering checks it
    against the adapter's limit)."""
    lanes = quad_group(K, M, loads)
    wg = max(1, 256 // lanes) * lanes
    sub = subgroup if subgroup is not None and lanes % subgroup == 0 else None
    return 4 * wide_shared(QUAD * M, lanes, wg, sub)


def gemm_q4_quad(K: int, N: int, block: int, M: int, *, signed: bool,
                 subgroup: int | None = None, loads: int = 1, residual: bool = False,
                 n_off: int = 0, width: int | None = None,
                 splits: Sequence[int] | None = None, half_out: bool = False,
                 half_scales: bool = False, head_d: int | None = None,
                 gated: GatedOutput | None = None) -> Kernel:
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
    columns are a stacked pair's in ``match_q4.paired_rows`` order, and the kernel writes
    ``gated``'s element of each pair (M rows of N / 2) instead of the sums."""
    assert K % 32 == 0 and block % 32 == 0 and K % block == 0 and 1 <= M <= 64
    assert gated is None or (N % QUAD == 0 and not (residual or splits or n_off))
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
    src = (decl(0, "a", "vec4<f32>", "read") + decl(1, "b", "vec4<u32>", "read")
           + decl(2, "sc", "u32" if half_scales else "f32", "read"))
    binds = ["read"] * 3
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
    src += _unpack_fns(signed) + _scale_fn(half_scales)
    src += group_entry(R, lanes, wg, gx, wide_shared(RM, lanes, wg, sub))
    src += f"  let q = min(n0 / {R}u, {-(-N // R) - 1}u);\n"
    for i in range(iters):  # every code load first
        j = (f"min(t + {i * lanes}u, {words - 1}u)" if words % lanes and i == iters - 1
             else f"t + {i * lanes}u")
        src += f"  let j_{i} = {j};\n  let w_{i} = b[q * {words}u + j_{i}];\n"
    src += "".join(f"  var acc{k} = 0.0;\n" for k in range(RM))
    for i in range(iters):
        guard = words % lanes and i == iters - 1
        ind = "    " if guard else "  "
        body = f"{ind}let sb_{i} = (q * {nblocks}u + j_{i} / {per}u) * {R}u;\n"
        body += "".join(f"{ind}let s{r}_{i} = scale(sb_{i} + {r}u);\n" for r in range(R))
        for m in range(M):
            body += (f"{ind}let lo{m}_{i} = {_input(m, f'2u * j_{i}', K4, M, head_d)};\n"
                     f"{ind}let hi{m}_{i} = {_input(m, f'2u * j_{i} + 1u', K4, M, head_d)};\n")
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
    src += f"  let n = n0 + t % {R}u;\n  let m0 = t / {R}u;\n"  # row m0 + 0 of _rows_write
    src += _rows_write("s", f"t < {RM}u", 0, N, M, width, n_off, residual, half_out, splits)
    return Kernel("gemm_q4_quad", src + "}\n", binds, (gx, gy, 1), traffic)
