"""Matrix products: a matrix-vector kernel for decode (M = 1) and a general batched one.

B may be given transposed (``b_t``: stored (..., N, K), the K dimension contiguous): that
is how constant weights are repacked at build time and how ``matmul(q, transpose(Kc))``
reads the key cache without materialising the transpose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import shapes as S
from .common import WG, Kernel, contiguous, decl, esize, grid, main_1d, offset_fn
from .reduce import UNROLL_MAX, grouped_reduction, inline_reduction, unrolled_reduction


def _batch_fn(fname: str, batch: Sequence[int], src_batch: Sequence[int], unit: int) -> str:
    st = S.broadcast_strides(src_batch, batch)
    return offset_fn(fname, batch or (1,), tuple(s * unit for s in st) or (0,))


def gemv(a_shape: Sequence[int], b_shape: Sequence[int], out_shape: Sequence[int],
         *, b_t: bool, n_off: int = 0, n_chunk: int | None = None) -> Kernel:
    """out[r, n] = sum_k A[r, k] * Bt[n, k] for M == 1 (decode).

    Requires ``b_t`` (weights (N, K) with K contiguous). A workgroup computes ``cols``
    output columns of one row: its 64 threads stride over K with vec4 loads (when K % 4 ==
    0) — adjacent threads read adjacent 16-byte words of one weight row, so loads
    coalesce — and reduce their partial sums in workgroup memory. Each weight byte is
    read exactly once per row.

    ``n_off``/``n_chunk``: this launch computes output columns [n_off, n_off + n_chunk)
    from a weight buffer holding just those rows (weights larger than the device's
    storage-binding limit, e.g. a 128k-vocabulary LM head, are split into chunks).
    """
    assert b_t
    K, N = a_shape[-1], out_shape[-1]
    nc = N if n_chunk is None else n_chunk
    batch = tuple(out_shape[:-2])
    rows = S.size(batch) * out_shape[-2]
    vw = 4 if K % 4 == 0 else 1
    vt = "vec4<f32>" if vw == 4 else "f32"
    kv = K // vw
    cols = 4 if -(-nc // 4) <= 65535 else 8
    gx = -(-nc // cols)
    src = decl(0, "a", vt, "read") + decl(1, "b", vt, "read") + decl(2, "out", "f32", "rw")
    src += _batch_fn("aoff", batch, a_shape[:-2], a_shape[-2] * K)
    src += _batch_fn("boff", batch, b_shape[:-2], nc * K)
    src += f"var<workgroup> sh: array<f32, {cols * WG}>;\n"
    src += (f"@compute @workgroup_size({WG})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n")
    M = out_shape[-2]
    src += f"  let row = wid.y;\n  let bi = row / {M}u;\n  let m = row % {M}u;\n"
    src += f"  let n0 = wid.x * {cols}u;\n"
    src += f"  let ab = (aoff(bi) + m * {K}u) / {vw}u;\n"
    src += f"  let bb = boff(bi) / {vw}u;\n"
    for c in range(cols):
        src += f"  var acc{c} = 0.0;\n"
        src += f"  let w{c} = bb + min(n0 + {c}u, {nc - 1}u) * {kv}u;\n"
    src += f"  for (var k = lid; k < {kv}u; k = k + {WG}u) {{\n    let x = a[ab + k];\n"
    dot = "dot(x, b[w{c} + k])" if vw == 4 else "x * b[w{c} + k]"
    for c in range(cols):
        src += f"    acc{c} = acc{c} + {dot.format(c=c)};\n"
    src += "  }\n"
    for c in range(cols):
        src += f"  sh[{c * WG}u + lid] = acc{c};\n"
    src += "  workgroupBarrier();\n"
    s = WG // 2
    while s >= 1:
        src += f"  if (lid < {s}u) {{\n"
        for c in range(cols):
            src += f"    sh[{c * WG}u + lid] = sh[{c * WG}u + lid] + sh[{c * WG}u + lid + {s}u];\n"
        src += "  }\n  workgroupBarrier();\n"
        s //= 2
    src += (f"  if (lid < {cols}u && n0 + lid < {nc}u) {{\n"
            f"    out[row * {N}u + {n_off}u + n0 + lid] = sh[lid * {WG}u];\n  }}\n}}\n")
    traffic = 4 * (S.size(a_shape) + S.size(b_shape) * nc // N + rows * nc)
    return Kernel("matmul_gemv", src, ["read", "read", "rw"], (gx, rows, 1), traffic)


def _gemv_head(a_shape: Sequence[int], out_shape: Sequence[int], nc: int, K: int,
               wg: int, extra: str = "") -> tuple[str, int, int]:
    batch = tuple(out_shape[:-2])
    rows = S.size(batch) * out_shape[-2]
    src = _batch_fn("aoff", batch, a_shape[:-2], a_shape[-2] * K)
    src += extra
    src += (f"@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n")
    M = out_shape[-2]
    src += f"  let row = wid.y;\n  let bi = row / {M}u;\n  let m = row % {M}u;\n"
    return src, rows, M


def gemv_cols(a_shape: Sequence[int], K: int, out_shape: Sequence[int], *, n_off: int = 0,
              n_chunk: int | None = None, wg: int = 64, cols: int = 2,
              groups: int = 0) -> Kernel:
    """out[r, n] = sum_k A[r, k] * W[n, k] for M == 1 on a CPU adapter (llvmpipe).

    Each invocation owns whole output columns (``cols`` at a time, ``wg`` apart) and loops
    over K with no barrier and no workgroup memory: llvmpipe runs a workgroup's invocations
    as SIMD lanes of one CPU thread, where barriers are coroutine switches and every
    workgroup has a fixed cost, so a few fat workgroups (``groups``, 0: one per
    ``wg * cols`` columns) each loop over their share of columns. Weights are packed
    k-major, interleaved by column: ``Wp[k4 * nc + n] = vec4(W[n, 4k4 .. 4k4 + 3])``
    (``vw`` = 4 when K % 4 == 0, else scalar: plain (K, nc)), so adjacent lanes read
    adjacent words and one activation load serves ``cols`` weight loads.
    """
    N = out_shape[-1]
    nc = N if n_chunk is None else n_chunk
    vw = 4 if K % 4 == 0 else 1
    vt = "vec4<f32>" if vw == 4 else "f32"
    kv = K // vw
    per = wg * cols
    blocks = -(-nc // per)  # column blocks of wg * cols
    gx = blocks if groups <= 0 else min(blocks, groups)
    loops = -(-blocks // gx)
    src = decl(0, "a", vt, "read") + decl(1, "b", vt, "read") + decl(2, "out", "f32", "rw")
    head, rows, M = _gemv_head(a_shape, out_shape, nc, K, wg)
    src += head
    src += f"  let ab = (aoff(bi) + m * {K}u) / {vw}u;\n"
    src += f"  for (var j = 0u; j < {loops}u; j = j + 1u) {{\n"
    src += f"  let base = (wid.x * {loops}u + j) * {per}u + lid;\n"
    src += f"  if (base >= {nc}u) {{ break; }}\n"
    for c in range(cols):
        src += (f"  let n{c} = min(base + {c * wg}u, {nc - 1}u);\n"
                f"  var acc{c} = 0.0;\n")
    src += f"  for (var k = 0u; k < {kv}u; k = k + 1u) {{\n    let x = a[ab + k];\n"
    for c in range(cols):
        w = f"b[k * {nc}u + n{c}]"
        src += f"    acc{c} = acc{c} + {f'dot(x, {w})' if vw == 4 else f'x * {w}'};\n"
    src += "  }\n"
    for c in range(cols):
        src += (f"  if (base + {c * wg}u < {nc}u) {{ "
                f"out[row * {N}u + {n_off}u + n{c}] = acc{c}; }}\n")
    src += "  }\n}\n"
    traffic = 4 * (S.size(a_shape) + K * nc + rows * nc)
    return Kernel("matmul_gemv", src, ["read", "read", "rw"], (gx, rows, 1), traffic)


@dataclass
class VectorSource:
    """A gemv input vector computed inside the gemv (``gemv_rows(prologue=...)``)."""

    src: str  # declarations (bindings from 0) and functions
    bindings: list[str]
    element: str  # format string: WGSL expression of element {} (may use ``red``)
    reduction: tuple[str, str, int] | None = None  # (reduce op, element {} of its input, count)
    #: the reduction as partial sums another launch wrote (``quant_rows.gemv_q4_quad``'s
    #: ``stats``): (element {} of the partials, their count, the divisor: a mean's element
    #: count, 1 for a sum), summed by each workgroup instead of ``reduction``; where the
    #: reader has several rows (``quant_quad_rows.gemm_q4_quad``), each row its own: the
    #: count a row's, row m's partials from m · count, the divisor a row's length
    partials: tuple[str, int, int] | None = None
    #: WGSL every invocation of a ``wg``-wide workgroup runs once, in uniform control flow,
    #: before the vector is read (``quant_rows.gemv_q4_quad``: after its code loads are
    #: issued), writing what ``element`` reads into workgroup memory and ending in a barrier
    #: (an attention's combine: ``attention.combine_vector``); None: nothing
    setup: Callable[[int], str] | None = None
    #: where non-zero, ``reduction`` is one value per run of ``group`` contiguous elements
    #: of its input (a per-head norm's mean), in workgroup memory ``red_g`` that
    #: ``element`` reads (``reduce.grouped_reduction``), not one ``red`` for the vector
    group: int = 0

    @property
    def group_bytes(self) -> int:
        """Workgroup memory the grouped reduction's values take (0: none), beside the
        reduction's scratch."""
        return 4 * (self.reduction[2] // self.group) if self.group else 0


@dataclass
class GatedOutput:
    """What a stacked pair of products writes instead of their two outputs: an element-wise
    function of both at each index (SwiGLU's ``silu(gate) · up``), from ``src`` (WGSL
    functions) and ``call`` (the element at index ``{}``, given the pair's values as
    ``g0`` and ``g1``), of WGSL type ``out_type``."""

    src: str
    call: str
    out_type: str


@dataclass
class StatsOutput:
    """What a residual product writes besides its rows: each workgroup's sum, over the rows
    it wrote, of an element-wise function of each written value (RMSNorm's ``x · x``), into
    ``pt`` at the workgroup's index: the partial sums a norm of the written row reads
    instead of a reduction launch (``VectorSource.partials``). ``src``: WGSL declaring
    ``norm_el(i: u32, xs: T) -> f32``, the function at element ``i`` of written value
    ``xs`` (T: the row's type)."""

    src: str


def prologue_reduction(prologue: VectorSource | None, wg: int,
                       subgroup: int | None) -> tuple[str, str] | None:
    """(module declarations, body) of the whole-vector reduction a ``prologue`` reads
    (RMSNorm's mean of squares, into ``red``), each workgroup computing it, or summing the
    partial sums another launch wrote (``VectorSource.partials``); None without."""
    if prologue is not None and prologue.partials is not None:
        load, count, div = prologue.partials
        decls, body = (unrolled_reduction("reduce_sum", count, load, wg, subgroup, "red_p")
                       or inline_reduction("reduce_sum", count, load, wg, "red_p"))
        scale = f" / {float(div)!r}" if div != 1 else ""
        return decls, body + f"  let red = red_p{scale};\n"
    if prologue is None or prologue.reduction is None:
        return None
    op, load, count = prologue.reduction
    if prologue.group:
        return grouped_reduction(op, count, prologue.group, load, wg)
    return (unrolled_reduction(op, count, load, wg, subgroup)
            or inline_reduction(op, count, load, wg))


def computed_vector(vec: VectorSource, count: int, traffic: int, rows: int = 1,
                    wg: int = 256, subgroup: int | None = None, unrolled: bool = True) -> Kernel:
    """A workgroup per row writes the row's elements of ``vec`` (``count`` in all), after the
    row's reduction if it reads one (RMSNorm: the mean of squares, then ``x / rms * w``; an
    L2 norm per head): two ops that are two launches elsewhere, in one. A decode step's
    rows are a few thousand elements, so one workgroup each is enough.

    ``unrolled`` (``KernelOptions.row_vector``): the workgroup is no wider than the row
    (a power of two, at least ``subgroup`` or 32), and each invocation's elements, when
    at most ``reduce.UNROLL_MAX``, are loaded and written as straight-line code with
    constant offsets, the reduction's partial results combined by subgroup builtins
    where the subgroup is ``subgroup`` wide (``reduce.unrolled_reduction``): a
    one-workgroup launch costs the latency of its chains of loads and barriers, which
    these shorten. Else (or beyond the unrolled size) loops strided by ``wg`` and a tree of
    barriers."""
    n = count // rows
    if unrolled:
        floor = subgroup or 32
        wg = max(floor, min(wg, 1 << max(0, n - 1).bit_length()))
    per = -(-n // wg)
    src = vec.src
    body = f"  let base = wid.x * {n}u;\n"
    red_src = None
    if vec.reduction is not None:
        op, load, _ = vec.reduction
        at = load.format("base + {}")
        if unrolled:
            red_src = unrolled_reduction(op, n, at, wg, subgroup)
        if red_src is None:
            red_src = inline_reduction(op, n, at, wg=wg)
        src += red_src[0]
        body += red_src[1]
    out = len(vec.bindings)
    src += decl(out, "out", "f32", "rw")
    if unrolled and per <= UNROLL_MAX:
        # every value computed before any store: a load after a store to another binding
        # may not pass it (the buffers could alias), which would chain the loads again
        tail = ""
        for k in range(per):
            whole = (k + 1) * wg <= n
            at = f"lid + {k * wg}u" if whole else f"min(lid + {k * wg}u, {n - 1}u)"
            tail += f"  let y{k} = {vec.element.format(f'base + {at}')};\n"
        for k in range(per):
            w = f"out[base + lid + {k * wg}u] = y{k};"
            tail += (f"  {w}\n" if (k + 1) * wg <= n
                     else f"  if (lid + {k * wg}u < {n}u) {{ {w} }}\n")
    else:
        tail = (f"  for (var j = lid; j < {n}u; j = j + {wg}u) {{ out[base + j] = "
                + vec.element.format("base + j") + "; }\n")
    src += (f"@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n" + body + tail + "}\n")
    return Kernel("fused_vector", src, list(vec.bindings) + ["rw"], (rows, 1, 1), traffic)


def gemv_rows(a_shape: Sequence[int], b_shape: Sequence[int], out_shape: Sequence[int], *,
              n_off: int = 0, n_chunk: int | None = None, lanes: int = 32, wg: int = 256,
              subgroup: int | None = None, splits: Sequence[int] | None = None,
              residual: bool = False,
              prologue: VectorSource | None = None, depth: int = 4,
              f16_weights: bool = False, f16_wide: bool = False,
              gated: GatedOutput | None = None, stats: StatsOutput | None = None) -> Kernel:
    """out[r, n] = sum_k A[r, k] * Bt[n, k] for M == 1 on a GPU: B stored (N, K).

    ``f16_weights``: B holds float16 values, two to a u32 (K a multiple of 4): each vec4 of
    weights is one ``vec2<u32>`` load unpacked with ``unpack2x16float`` (core WGSL, no
    'shader-f16' needed), half the bytes streamed; products and sums stay float32.
    ``f16_wide`` (with ``f16_weights``, K a multiple of 8; else ignored): each load is a
    ``vec4<u32>`` of 8 weights against two vec4 of the input, so an invocation has as many
    bytes in flight as with float32 weights (a 8-byte load carries half of them).

    ``lanes`` invocations share one output column (a weight row): they stride along K with
    vec4 loads, so a row is read as ``lanes`` x 16 contiguous bytes per step (coalesced),
    with ``depth`` loads issued before their products (independent accumulators: that many
    loads in flight per invocation); the workgroup holds ``wg / lanes`` rows.
    The partial sums are combined with ``subgroupAdd`` when the subgroup is exactly
    ``lanes`` wide (``subgroup``), else through workgroup memory (one barrier).

    ``splits``: the weight rows are several matrices stacked (q, k and v projections of
    one input: one launch instead of three), row counts in order; output ``j`` is
    binding ``2 + j``. Only for a single input row (decode).

    ``residual``: binding 2 is a tensor of the output's shape added to the product (a
    residual connection ``x + W·y``: the add needs no launch of its own); outputs follow.

    ``prologue``: the input vector is not a buffer but an element-wise group (RMSNorm's
    ``x / rms * w``, SwiGLU's ``silu(g) * u``; its ``setup`` first: an attention's combine),
    its bindings first. Each workgroup computes
    the vector into workgroup memory once (after the whole-vector reduction it reads, if
    any: RMSNorm's mean of squares), then streams its weight rows against it. Single input
    row only. Where the reduction is partial sums another launch wrote
    (``VectorSource.partials``: ``stats`` below), each workgroup sums those instead of
    reducing the row (``prologue_reduction``).

    ``gated``: the rows are a stacked pair's, laid out by ``gemv.paired_rows`` (rows 2m,
    2m + 1 of the first, then of the second: groups of 4 rows, whole ones a workgroup), and
    the kernel writes ``gated``'s element of the two at each of the N / 2 indices (SwiGLU's
    ``silu(gate) · up``) instead of both products: the group's sums meet in workgroup
    memory (``gated_write``), so the activation needs no launch of its own.

    ``stats`` (one launch, no ``splits``): each workgroup also writes the sum of
    ``norm_el`` over the rows it wrote (RMSNorm's squares of the residual stream), one
    float a workgroup into the last binding (``stats_write``): the partial sums the next
    norm's readers take as their reduction, so the norm needs no launch of its own.
    """
    K, N = a_shape[-1], out_shape[-1]
    nc = N if n_chunk is None else n_chunk
    vw = 4 if K % 4 == 0 else 1
    vt = "vec4<f32>" if vw == 4 else "f32"
    kv = K // vw
    R = wg // lanes
    gx = -(-nc // R)
    use_sub = subgroup == lanes
    outs = list(splits) if splits else [N]
    assert gated is None or (not (splits or residual or n_chunk) and R % 4 == 0
                             and N % 4 == 0), "a gated pair: whole groups of 4 rows"
    assert stats is None or not (splits or gated), "partial sums of one product's rows"
    red = None
    if prologue is None:
        src, a_bindings = decl(0, "a", vt, "read"), ["read"]
    else:
        src, a_bindings = prologue.src, list(prologue.bindings)
        src += f"var<workgroup> xa: array<{vt}, {kv}>;\n"
        if prologue.partials is not None or prologue.group:
            red = prologue_reduction(prologue, wg, subgroup)
        elif prologue.reduction is not None:
            op, load, count = prologue.reduction
            red = inline_reduction(op, count, load, wg=wg)
        if red is not None:
            src += red[0]
    nb = len(a_bindings)
    assert not f16_weights or vw == 4, "float16 weights need K % 4 == 0"
    wide = f16_weights and f16_wide and K % 8 == 0
    if wide:
        src += decl(nb, "b", "vec4<u32>", "read")
        src += ("fn wlo(p: vec4<u32>) -> vec4<f32> {\n"
                "  return vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y));\n}\n"
                "fn whi(p: vec4<u32>) -> vec4<f32> {\n"
                "  return vec4<f32>(unpack2x16float(p.z), unpack2x16float(p.w));\n}\n")
    elif f16_weights:
        src += decl(nb, "b", "vec2<u32>", "read")
        src += ("fn wv(p: vec2<u32>) -> vec4<f32> {\n"
                "  return vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y));\n}\n")
    else:
        src += decl(nb, "b", vt, "read")
    first_out = nb + 2 if residual else nb + 1
    if residual:
        assert not splits
        src += decl(nb + 1, "res", "f32", "read")
    for j in range(len(outs)):
        src += decl(first_out + j, "out" if not splits else f"out{j}",
                    gated.out_type if gated is not None else "f32", "rw")
    if stats is not None:
        src += (decl(first_out + len(outs), "pt", "f32", "rw") + stats.src
                + f"var<workgroup> nrm_sh: array<f32, {R}>;\n")
    if gated is not None:
        src += gated.src + f"var<workgroup> pair_sh: array<f32, {R}>;\n"
    src += _batch_fn("boff", tuple(out_shape[:-2]), b_shape[:-2], nc * K)
    extra = "" if use_sub else f"var<workgroup> sh: array<f32, {wg}>;\n"
    head, rows, M = _gemv_head(a_shape, out_shape, nc, K, wg, extra)
    assert not (splits or prologue) or rows == 1, "stacked/prologue gemv: a single input row"
    src += head
    if prologue is not None:
        if red is not None:
            src += red[1]
        if prologue.setup is not None:  # (an attention's combine: copied into xa below)
            src += prologue.setup(wg)
        el = prologue.element
        if vw == 4:
            item = element_vec4(el, "4u * j")
        else:
            item = el.format("j")
        src += (f"  for (var j = lid; j < {kv}u; j = j + {wg}u) {{ xa[j] = {item}; }}\n"
                "  workgroupBarrier();\n")
    per = 2 if wide else 1  # input vec4 words a weight load covers
    kl = kv // per  # weight loads a row
    src += (f"  let r = lid / {lanes}u;\n  let t = lid % {lanes}u;\n"
            f"  let n = wid.x * {R}u + r;\n  let nn = min(n, {nc - 1}u);\n"
            f"  let ab = (aoff(bi) + m * {K}u) / {vw}u;\n"
            f"  let wb = boff(bi) / {vw * per}u + nn * {kl}u;\n"
            + "".join(f"  var acc{j} = 0.0;\n" for j in range(depth)))

    def x_at(i: str) -> str:
        return f"xa[{i}]" if prologue is not None else f"a[ab + {i}]"

    def product(i: str, w: str) -> str:
        """The products of weight load ``w`` (load index ``i`` along the row)."""
        if wide:
            return (f"dot({x_at(f'2u * ({i})')}, wlo({w})) + "
                    f"dot({x_at(f'2u * ({i}) + 1u')}, whi({w}))")
        return f"dot({x_at(i)}, {w})" if vw == 4 else f"{x_at(i)} * {w}"
    src += f"  var k = t;\n  for (; k + {(depth - 1) * lanes}u < {kl}u; k = k + {depth * lanes}u) {{\n"
    offs = [f" + {j * lanes}u" if j else "" for j in range(depth)]
    load = "wv(b[{i}])" if f16_weights and not wide else "b[{i}]"
    for j in range(depth):  # every load issued before the first product
        src += f"    let w{j} = {load.format(i=f'wb + k{offs[j]}')};\n"
    for j in range(depth):
        src += f"    acc{j} = acc{j} + {product(f'k{offs[j]}', f'w{j}')};\n"
    total = " + ".join(f"acc{j}" for j in range(depth))
    src += ("  }\n"
            f"  for (; k < {kl}u; k = k + {lanes}u) {{ "
            f"acc0 = acc0 + {product('k', load.format(i='wb + k'))}; }}\n"
            f"  let acc = {total};\n")
    index = f"row * {N}u + {n_off}u + n"
    close = None
    if gated is not None:  # a group's first row n (r % 4 == 0): lanes 0, 1 write its pair
        close = gated_write(gated, 4, "t == 0u", "r", "r % 4u == 0u && t < 2u", "r", "n", "t",
                            N // 2)
    elif stats is not None:
        close = stats_write("t == 0u", "r", R, "wid.x", index, nc, residual)
    src += gemv_tail(use_sub, lanes, index, nc, residual, outs if splits else None,
                     close=close)
    traffic = (4 * (S.size(a_shape) + rows * nc * (2 if residual else 1))
               + (2 if f16_weights else 4) * S.size(b_shape) * nc // N)
    if gated is not None:
        traffic += esize(gated.out_type) * (N // 2) - 4 * N
    if stats is not None:
        traffic += 4 * gx
    return Kernel("matmul_gemv", src, a_bindings + ["read"] + ["read"] * residual
                  + ["rw"] * (len(outs) + (stats is not None)), (gx, rows, 1), traffic)


def gemv_tail(use_sub: bool, lanes: int, index: str, count: int, residual: bool,
              splits: Sequence[int] | None, half: bool = False, close: str | None = None) -> str:
    """The end of a rows gemv kernel: the ``lanes`` partial sums ``acc`` of row ``n``
    combined (``subgroupAdd``, else workgroup memory ``sh``) into ``s`` on lane 0 and
    written (``gemv_write``), or ``close`` (the kernel's own closing: a gated pair's or a
    norm's partial sums' write)."""
    if use_sub:
        src = "  let s = subgroupAdd(acc);\n"
    else:
        src = ("  sh[lid] = acc;\n  workgroupBarrier();\n  var s = 0.0;\n"
               f"  if (t == 0u) {{\n    for (var j = 0u; j < {lanes}u; j = j + 1u) "
               "{ s = s + sh[lid + j]; }\n  }\n")
    return src + (close if close is not None
                  else gemv_write("t == 0u", index, count, residual, splits, half))


def stats_write(writer: str, slot: str, slots: int, group: str, index: str, count: int,
                residual: bool, half: bool = False) -> str:
    """WGSL closing a kernel where invocation ``writer`` holds row ``n``'s sum ``s``: it
    writes the row as ``gemv_write`` does (plus ``res`` when ``residual``; ``half``:
    float16, rounded once), and ``norm_el`` of the value written goes into workgroup memory
    ``nrm_sh[slot]`` (``slots`` a workgroup, a row's writer each); after one barrier,
    invocation 0 writes the workgroup's sum of them to ``pt[group]`` (``StatsOutput``).
    Every invocation reaches the barrier."""
    total = " + ".join(f"nrm_sh[{k}u]" for k in range(slots))
    return (f"  var nf = 0.0;\n"
            f"  if ({writer} && n < {count}u) {{\n"
            f"    let xs = {written_value(index, residual, half)};\n"
            f"    out[{index}] = xs;\n    nf = norm_el({index}, xs);\n  }}\n"
            f"  if ({writer}) {{ nrm_sh[{slot}] = nf; }}\n  workgroupBarrier();\n"
            f"  if (lid == 0u) {{ pt[{group}] = {total}; }}\n}}\n")


def gated_write(gated: GatedOutput, R: int, store: str, slot: str, writer: str, base: str,
                first: str, lane: str, count: int) -> str:
    """WGSL closing a kernel whose rows are a stacked pair's in groups of ``R``, ``R / 2`` of
    each (``gemv.paired_rows``: rows 2m, 2m + 1 of the first, then of the second): where
    ``store`` holds, row sum ``s`` goes into workgroup memory ``pair_sh[slot]`` (a group's
    ``R`` from ``base``); after one barrier, where ``writer`` holds, lane ``lane`` (below
    ``R / 2``) of the group whose first row is ``first`` writes the pair's element
    ``first / 2 + lane`` of ``count``. Every invocation reaches the barrier."""
    half = R // 2
    return (f"  if ({store}) {{ pair_sh[{slot}] = s; }}\n  workgroupBarrier();\n"
            f"  let gi = {first} / 2u + {lane};\n  if ({writer} && gi < {count}u) {{\n"
            f"    let g0 = pair_sh[{base} + {lane}];\n"
            f"    let g1 = pair_sh[{base} + {lane} + {half}u];\n"
            f"    out[gi] = {gated.call.format('gi')};\n  }}\n}}\n")


def written_value(index: str, residual: bool, half: bool) -> str:
    """WGSL: the value a row's sum ``s`` is written as at ``index``: plus ``res[index]``
    where ``residual``; with ``half``, ``res`` and the output float16, the sum float32,
    rounded once."""
    val = (f"s + {f'f32(res[{index}])' if half else f'res[{index}]'}" if residual else "s")
    return f"f16({val})" if half else val


def element_vec4(element: str, base: str, offset: int = 0) -> str:
    """WGSL: a ``vec4<f32>`` of a computed vector's elements ``base + offset`` to ``base +
    offset + 3`` (``element``: the element at index ``{}``, ``VectorSource.element``)."""
    return "vec4<f32>(" + ", ".join(element.format(f"{base} + {offset + c}u")
                                    for c in range(4)) + ")"


def gemv_write(writer: str, index: str, count: int, residual: bool,
               splits: Sequence[int] | None, half: bool = False) -> str:
    """Where ``writer`` holds, row ``n``'s sum ``s`` written: to ``out[index]`` (plus
    ``res[index]`` when ``residual``) for n < ``count``, or with ``splits`` to
    ``out{j}[n - start]`` of the stacked matrix n falls in; closes the kernel. ``half``:
    ``res`` and ``out`` are float16, the sum float32, rounded once as it is written."""
    if not splits:
        return (f"  if ({writer} && n < {count}u) {{ out[{index}] = "
                f"{written_value(index, residual, half)}; }}\n}}\n")
    src = f"  if ({writer}) {{\n"
    start = 0
    for j, nj in enumerate(splits):
        kw = "if" if j == 0 else "} else if"
        src += f"    {kw} (n < {start + nj}u) {{ out{j}[n - {start}u] = s;\n"
        start += nj
    return src + "    }\n  }\n}\n"


def matmul_bt_small_m(a_shape: Sequence[int], b_shape: Sequence[int],
                      out_shape: Sequence[int]) -> Kernel:
    """out[b, m, n] = sum_k A[b, m, k] * Bt[b, n, k] for a few rows M (decode attention
    scores q·Kᵀ with grouped heads: M = q heads per kv head). One invocation per (b, n)
    reads key row n once (vec4 when K % 4 == 0) for all M rows, instead of M times."""
    K = a_shape[-1]
    M, N = out_shape[-2], out_shape[-1]
    batch = tuple(out_shape[:-2])
    n = S.size(batch) * N
    gx, gy, gz = grid(n)
    vw = 4 if K % 4 == 0 else 1
    vt = "vec4<f32>" if vw == 4 else "f32"
    src = decl(0, "a", vt, "read") + decl(1, "b", vt, "read") + decl(2, "out", "f32", "rw")
    src += _batch_fn("aoff", batch, a_shape[:-2], M * K)
    src += _batch_fn("boff", batch, b_shape[:-2], N * K)
    src += main_1d(gx)
    src += f"  if (i >= {n}u) {{ return; }}\n  let nn = i % {N}u;\n  let bi = i / {N}u;\n"
    src += f"  let ab = aoff(bi) / {vw}u;\n  let bb = (boff(bi) + nn * {K}u) / {vw}u;\n"
    for m in range(M):
        src += f"  var acc{m} = 0.0;\n"
    src += f"  for (var k = 0u; k < {K // vw}u; k = k + 1u) {{\n    let w = b[bb + k];\n"
    for m in range(M):
        x = f"a[ab + {m * K // vw}u + k]"
        src += f"    acc{m} = acc{m} + {f'dot({x}, w)' if vw == 4 else f'{x} * w'};\n"
    src += "  }\n"
    for m in range(M):
        src += f"  out[(bi * {M}u + {m}u) * {N}u + nn] = acc{m};\n"
    src += "}\n"
    traffic = 4 * (S.size(a_shape) + S.size(b_shape) + S.size(out_shape))
    return Kernel("matmul_qk", src, ["read", "read", "rw"], (gx, gy, gz), traffic)


def matmul_splitk(a_shape: Sequence[int], b_shape: Sequence[int], out_shape: Sequence[int],
                  chunk: int) -> tuple[Kernel, Kernel, int]:
    """out = A @ B for a few rows M and a long K (decode attention probs·V over the cache):
    K is split into chunks of ``chunk``; pass 1 has one invocation per (chunk, b, n)
    accumulating all M rows (B rows read once, coalesced along n) into partial sums, pass
    2 adds the chunks. Returns (pass 1, pass 2, partial-buffer elements)."""
    K = a_shape[-1]
    M, N = out_shape[-2], out_shape[-1]
    batch = tuple(out_shape[:-2])
    nb = S.size(batch)
    splits = -(-K // chunk)
    n1 = splits * nb * N
    gx, gy, gz = grid(n1)
    src = decl(0, "a", "f32", "read") + decl(1, "b", "f32", "read") + decl(2, "part", "f32", "rw")
    src += _batch_fn("aoff", batch, a_shape[:-2], M * K)
    src += _batch_fn("boff", batch, b_shape[:-2], K * N)
    src += main_1d(gx)
    src += (f"  if (i >= {n1}u) {{ return; }}\n  let nn = i % {N}u;\n"
            f"  let bi = (i / {N}u) % {nb}u;\n  let sp = i / {N * nb}u;\n"
            f"  let ab = aoff(bi);\n  let bb = boff(bi) + nn;\n"
            f"  let k0 = sp * {chunk}u;\n  let k1 = min(k0 + {chunk}u, {K}u);\n")
    for m in range(M):
        src += f"  var acc{m} = 0.0;\n"
    src += f"  for (var k = k0; k < k1; k = k + 1u) {{\n    let w = b[bb + k * {N}u];\n"
    for m in range(M):
        src += f"    acc{m} = acc{m} + a[ab + {m * K}u + k] * w;\n"
    src += "  }\n"
    for m in range(M):
        src += f"  part[((sp * {nb}u + bi) * {M}u + {m}u) * {N}u + nn] = acc{m};\n"
    src += "}\n"
    parts = splits * nb * M * N
    k1 = Kernel("matmul_splitk", src, ["read", "read", "rw"], (gx, gy, gz),
                4 * (S.size(a_shape) + S.size(b_shape) + parts))
    n2 = nb * M * N
    gx, gy, gz = grid(n2)
    src = decl(0, "part", "f32", "read") + decl(1, "out", "f32", "rw") + main_1d(gx)
    src += (f"  if (i >= {n2}u) {{ return; }}\n  var acc = 0.0;\n"
            f"  for (var sp = 0u; sp < {splits}u; sp = sp + 1u) {{ acc = acc + part[sp * {n2}u + i]; }}\n"
            "  out[i] = acc;\n}\n")
    k2 = Kernel("matmul_splitk_sum", src, ["read", "rw"], (gx, gy, gz), 4 * (parts + n2))
    return k1, k2, parts


def matmul(a_shape: Sequence[int], b_shape: Sequence[int], out_shape: Sequence[int],
           *, b_t: bool) -> Kernel:
    """General batched matmul, one thread per output element (adjacent threads take
    adjacent columns, so B (K, N) loads coalesce)."""
    K = a_shape[-1]
    M, N = out_shape[-2], out_shape[-1]
    batch = tuple(out_shape[:-2])
    n = S.size(out_shape)
    gx, gy, gz = grid(n)
    src = decl(0, "a", "f32", "read") + decl(1, "b", "f32", "read") + decl(2, "out", "f32", "rw")
    src += _batch_fn("aoff", batch, a_shape[:-2], M * K)
    src += _batch_fn("boff", batch, b_shape[:-2], N * K)
    src += main_1d(gx)
    src += f"  if (i >= {n}u) {{ return; }}\n"
    src += f"  let nn = i % {N}u;\n  let m = (i / {N}u) % {M}u;\n  let bi = i / {M * N}u;\n"
    src += f"  let ab = aoff(bi) + m * {K}u;\n"
    if b_t:
        src += f"  let bb = boff(bi) + nn * {K}u;\n  let bs = 1u;\n"
    else:
        src += f"  let bb = boff(bi) + nn;\n  let bs = {N}u;\n"
    src += (f"  var acc = 0.0;\n  for (var k = 0u; k < {K}u; k = k + 1u) {{\n"
            "    acc = acc + a[ab + k] * b[bb + k * bs];\n  }\n  out[i] = acc;\n}\n")
    traffic = 4 * (S.size(a_shape) + S.size(b_shape) + n)
    return Kernel("matmul", src, ["read", "read", "rw"], (gx, gy, gz), traffic)


__all__ = ["gemv", "matmul", "contiguous", "main_1d"]
