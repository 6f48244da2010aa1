"""Data movement: strided copies (transpose, slice, concat, expand-free copies), gather
(and gatherElements, gatherND), reverse, scatter_nd and the stateful capacity check."""

from __future__ import annotations

from collections.abc import Sequence

from .. import shapes as S
from .common import Kernel, decl, esize, grid, main_1d, offset_fn


def strided_copy(t: str, region: Sequence[int], src_base: int, src_strides: Sequence[int],
                 dst_base: int, dst_strides: Sequence[int], name: str = "copy", *,
                 guarded: bool = False) -> Kernel:
    """dst[dst_base + c·dst_strides] = src[src_base + c·src_strides] for c in region.
    ``guarded``: write nothing if the stateful capacity check failed (a state written in
    place by a slice, as a conv window's next window; bound third)."""
    n = S.size(region)
    gx, gy, gz = grid(n)
    src = decl(0, "x", t, "read") + decl(1, "out", t, "rw")
    bindings = ["read", "rw"]
    if guarded:
        src += decl(2, "status", "u32", "read")
        bindings.append("read")
    src += offset_fn("soff", region, src_strides, src_base)
    src += offset_fn("doff", region, dst_strides, dst_base)
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n"
    if guarded:
        src += "  if (status[0] != 0u) { return; }\n"
    src += "  out[doff(i)] = x[soff(i)];\n}\n"
    return Kernel(name, src, bindings, (gx, gy, gz), 2 * esize(t) * n)


def copy_vec4(n: int, wg: int = 256, itemsize: int = 4) -> Kernel:
    """A whole buffer of ``n`` elements of ``itemsize`` bytes copied 16 bytes per invocation
    as bits (``vec4<u32>``: two float16 values a word are copied whole; buffers are sized in
    multiples of 16 bytes, so the last vector stays in bounds; what it copies past the
    elements is padding). Counted as the n elements read and written."""
    n4 = -(-n * itemsize // 16)
    gx, gy, gz = grid(n4, wg)
    src = (decl(0, "x", "vec4<u32>", "read") + decl(1, "out", "vec4<u32>", "rw")
           + main_1d(gx, wg) + f"  if (i >= {n4}u) {{ return; }}\n  out[i] = x[i];\n}}\n")
    return Kernel("copy_vec4", src, ["read", "rw"], (gx, gy, gz), 2 * itemsize * n)


def gather(t: str, it: str, in_shape: Sequence[int], idx_shape: Sequence[int],
           axis: int) -> Kernel:
    """out[o, j, r] = x[o, idx[j], r]; negative indices count from the end and are then
    clamped into range (the spec leaves out-of-range indices implementation-defined). A
    table in chunks: ``gather_chunks``."""
    outer = S.size(in_shape[:axis])
    dim = in_shape[axis]
    inner = S.size(in_shape[axis + 1:])
    ni = S.size(idx_shape)
    n = outer * ni * inner
    gx, gy, gz = grid(n)
    src = decl(0, "x", t, "read") + decl(1, "idx", it, "read") + decl(2, "out", t, "rw")
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n"
    src += (f"  let r = i % {inner}u;\n  let j = (i / {inner}u) % {ni}u;\n"
            f"  let o = i / {inner * ni}u;\n  var k = i32(idx[j]);\n"
            f"  if (k < 0) {{ k = k + {dim}; }}\n  k = clamp(k, 0, {dim - 1});\n"
            )
    src += f"  out[i] = x[(o * {dim}u + u32(k)) * {inner}u + r];\n}}\n"
    return Kernel("gather", src, ["read", "read", "rw"], (gx, gy, gz),
                  2 * esize(t) * n + esize(it) * ni)


def gather_chunks(t: str, it: str, in_shape: Sequence[int], idx_shape: Sequence[int],
                  bounds: Sequence[tuple[int, int]]) -> Kernel:
    """``gather`` along axis 0 of a table held in chunks of rows (a table beyond the
    storage-binding limit), the chunks ``bounds`` (consecutive row ranges) bound as
    ``x0``, ``x1``, .. of one launch: each output whose index falls in them is read from
    its chunk (WGSL cannot index bindings: a chain of ``if``), the others left to the
    launches of the other chunks. Indices as ``gather``'s."""
    dim, inner, ni = in_shape[0], S.size(in_shape[1:]), S.size(idx_shape)
    n = ni * inner
    nc = len(bounds)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    gx, gy, gz = grid(n)
    src = "".join(decl(c, f"x{c}", t, "read") for c in range(nc))
    src += decl(nc, "idx", it, "read") + decl(nc + 1, "out", t, "rw")
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n"
    src += (f"  let r = i % {inner}u;\n  var k = i32(idx[i / {inner}u]);\n"
            f"  if (k < 0) {{ k = k + {dim}; }}\n  k = clamp(k, 0, {dim - 1});\n")
    lo, hi = bounds[0][0], bounds[-1][1]
    if lo > 0 or hi < dim:
        src += f"  if (k < {lo} || k >= {hi}) {{ return; }}\n"
    for c, (r0, r1) in enumerate(bounds):
        read = f"out[i] = x{c}[u32(k - {r0}) * {inner}u + r];"
        cond = f"if (k < {r1}) " if c < nc - 1 else ""
        src += ("  " if c == 0 else " else ") + f"{cond}{{ {read} }}"
    src += "\n}\n"
    first = lo == 0  # the launch holding row 0 counts the outputs' bytes, as ``gather``
    return Kernel("gather", src, ["read"] * (nc + 1) + ["rw"], (gx, gy, gz),
                  esize(it) * ni + (2 * esize(t) * n if first else 0))


def _clamped(var: str, load: str, dim: int) -> str:
    """WGSL: ``var`` the index ``load`` into an axis of ``dim``, a negative one counted from
    the end, then clamped into range (``gather``'s choice: the spec leaves out-of-range
    indices to the implementation, provided nothing is read out of bounds)."""
    return (f"  var {var} = i32({load});\n  if ({var} < 0) {{ {var} = {var} + {dim}; }}\n"
            f"  {var} = clamp({var}, 0, {dim - 1});\n")


def gather_elements(t: str, it: str, in_shape: Sequence[int], idx_shape: Sequence[int],
                    axis: int) -> Kernel:
    """out[c] = x[c with c[axis] = idx[c]], one invocation an element of ``idx`` (the
    output's shape); indices as ``gather``'s (``_clamped``)."""
    n = S.size(idx_shape)
    gx, gy, gz = grid(n)
    ist = S.strides(in_shape)
    src = decl(0, "x", t, "read") + decl(1, "idx", it, "read") + decl(2, "out", t, "rw")
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n  var r = i;\n  var o = 0u;\n"
    src += _clamped("k", "idx[i]", in_shape[axis])
    src += f"  o = u32(k) * {ist[axis]}u;\n"
    for ax in range(len(idx_shape) - 1, -1, -1):
        d = idx_shape[ax]
        if ax != axis:
            src += f"  o = o + (r % {d}u) * {ist[ax]}u;\n"
        src += f"  r = r / {d}u;\n"
    src += "  out[i] = x[o];\n}\n"
    return Kernel("gather_elements", src, ["read", "read", "rw"], (gx, gy, gz),
                  esize(it) * n + 2 * esize(t) * n)


def _nd_geometry(in_shape: Sequence[int],
                 idx_shape: Sequence[int]) -> tuple[int, int, int, tuple[int, ...], int]:
    """(coordinates a tuple, index tuples, elements of the slice after them, the input's
    strides, output elements) of a gatherND or scatterND over ``in_shape``."""
    k = idx_shape[-1]
    tuples = S.size(idx_shape[:-1])
    slice_n = S.size(in_shape[k:])
    return k, tuples, slice_n, S.strides(in_shape), tuples * slice_n


def gather_nd(t: str, it: str, in_shape: Sequence[int], idx_shape: Sequence[int]) -> Kernel:
    """out[tup, s] = x[idx[tup] (k coordinates), s]: one invocation an output element (index
    tuple ``tup``, element ``s`` of the slice after the k leading axes); indices as
    ``gather``'s (``_clamped``)."""
    k, tuples, slice_n, st, n = _nd_geometry(in_shape, idx_shape)
    gx, gy, gz = grid(n)
    src = decl(0, "x", t, "read") + decl(1, "idx", it, "read") + decl(2, "out", t, "rw")
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n"
    src += f"  let tup = i / {slice_n}u;\n  var o = i % {slice_n}u;\n"
    for j in range(k):
        src += _clamped(f"c{j}", f"idx[tup * {k}u + {j}u]", in_shape[j])
        src += f"  o = o + u32(c{j}) * {st[j]}u;\n"
    src += "  out[i] = x[o];\n}\n"
    return Kernel("gather_nd", src, ["read", "read", "rw"], (gx, gy, gz),
                  esize(it) * tuples * k + 2 * esize(t) * n)


def reverse(t: str, shape: Sequence[int], axes: Sequence[int]) -> Kernel:
    """out[c] = x[c with c[a] = shape[a] - 1 - c[a] for a in ``axes``]: one invocation an
    element (no axes: a copy)."""
    n = S.size(shape)
    gx, gy, gz = grid(n)
    st = S.strides(shape)
    src = decl(0, "x", t, "read") + decl(1, "out", t, "rw")
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n  var r = i;\n  var o = 0u;\n"
    for ax in range(len(shape) - 1, -1, -1):
        d = shape[ax]
        c = f"({d - 1}u - r % {d}u)" if ax in axes else f"(r % {d}u)"
        src += f"  o = o + {c} * {st[ax]}u;\n  r = r / {d}u;\n"
    src += "  out[i] = x[o];\n}\n"
    return Kernel("reverse", src, ["read", "rw"], (gx, gy, gz), 2 * esize(t) * n)


def scatter_nd(t: str, it: str, in_shape: Sequence[int], idx_shape: Sequence[int],
               *, guarded: bool,
               updates: Sequence[tuple[str, list[str], str] | None] = (None,)) -> Kernel:
    """Write ``updates`` at the index tuples into ``out`` (which already holds the input:
    copied before, or the state buffer itself when in place).

    Negative indices count from the end; tuples still out of range are skipped (the spec
    leaves them implementation-defined). ``guarded``: write nothing if the stateful
    capacity check failed.

    ``updates``: one entry per output written at the same index tuples (a layer's K and V
    rows: one launch); None reads the updates from a binding, else they are computed
    inline (``fusion.Group.input_source``: declarations and functions with bindings
    numbered from where this output's updates go, their bindings, the function giving
    element ``i``). Bindings: idx, each output's updates, the outputs, the status.
    """
    k, tuples, slice_n, st, n = _nd_geometry(in_shape, idx_shape)
    gx, gy, gz = grid(n)
    src = decl(0, "idx", it, "read")
    b = ["read"]
    loads = []
    for j, u in enumerate(updates):
        if u is None:
            src += decl(len(b), f"upd{j}", t, "read")
            b.append("read")
            loads.append(f"upd{j}[i]")
        else:
            leaf_src, leaf_b, fn = u
            src += leaf_src
            b += list(leaf_b)
            loads.append(f"{fn}(i)")
    for j in range(len(updates)):
        src += decl(len(b), f"out{j}", t, "rw")
        b.append("rw")
    if guarded:
        src += decl(len(b), "status", "u32", "read")
        b.append("read")
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n"
    if guarded:
        src += "  if (status[0] != 0u) { return; }\n"
    src += f"  let tup = i / {slice_n}u;\n  let s = i % {slice_n}u;\n  var o = s;\n"
    for j in range(k):
        src += (f"  var c{j} = i32(idx[tup * {k}u + {j}u]);\n"
                f"  if (c{j} < 0) {{ c{j} = c{j} + {in_shape[j]}; }}\n"
                f"  if (c{j} < 0 || c{j} >= {in_shape[j]}) {{ return; }}\n"
                f"  o = o + u32(c{j}) * {st[j]}u;\n")
    for j, load in enumerate(loads):
        src += f"  out{j}[o] = {load};\n"
    src += "}\n"
    # index tuples, each update read and each row element written (in the cache's type)
    return Kernel("scatter_nd", src, b, (gx, gy, gz),
                  4 * tuples * k + 2 * esize(t) * n * len(updates))


#: invocations of the capacity check (its tuples strided over them)
CHECK_WG = 64


def capacity_check(checks: Sequence[tuple[str, Sequence[int], Sequence[int]]],
                   sources: Sequence[int] | None = None) -> Kernel:
    """PROPOSAL behaviour 4: one workgroup validates every append pair's index tuples before
    any state is written; ``status[0]`` = 0 if all are within capacity, else 1 + the
    index of the first pair that would overflow. Each entry: (index type, index shape,
    cache shape). A tuple is within capacity iff 0 <= i_j < cache_shape[j] for every
    component (negative indices are not wrapped: the "end" of a padded cache is padding).

    ``sources[p]``: which index binding pair ``p`` reads (pairs of one model usually share
    one index tensor: 32 pairs would otherwise need 33 storage bindings); default one each.
    Pairs reading one binding into same-shaped caches pass or fail together, so each such
    group is checked once and reports its first pair; the group's tuples are strided over
    ``CHECK_WG`` invocations and the first failing pair is their ``atomicMin`` (one thread
    walking 32 pairs' tuples took 25 µs of the H200's one-token step, 77 µs of a K = 4
    verify: PERFORMANCE.md).
    """
    sources = list(sources) if sources is not None else list(range(len(checks)))
    nbuf = max(sources) + 1 if sources else 0
    src = decl(0, "status", "u32", "rw")
    for u in range(nbuf):
        it = checks[sources.index(u)][0]
        src += decl(u + 1, f"idx{u}", it, "read")
    groups: dict[tuple, int] = {}  # (binding, index shape, cache shape) -> its first pair
    for p, (_, ishape, cshape) in enumerate(checks):
        groups.setdefault((sources[p], tuple(ishape), tuple(cshape)), p)
    none = 0xFFFFFFFF  # no failing pair
    src += (f"var<workgroup> first: atomic<u32>;\n@compute @workgroup_size({CHECK_WG})\n"
            "fn main(@builtin(local_invocation_index) lid: u32) {\n"
            f"  if (lid == 0u) {{ atomicStore(&first, {none}u); }}\n  workgroupBarrier();\n"
            f"  var bad = {none}u;\n")
    reads = 4
    for (u, ishape, cshape), p in groups.items():
        k = ishape[-1]
        tuples = S.size(ishape[:-1])
        reads += 4 * tuples * k
        src += f"  for (var t = lid; t < {tuples}u; t = t + {CHECK_WG}u) {{\n"
        for j in range(k):
            src += (f"    let c{j} = i32(idx{u}[t * {k}u + {j}u]);\n"
                    f"    if (c{j} < 0 || c{j} >= {cshape[j]}) {{ bad = min(bad, {p + 1}u); }}\n")
        src += "  }\n"
    src += (f"  if (bad != {none}u) {{ atomicMin(&first, bad); }}\n  workgroupBarrier();\n"
            "  if (lid == 0u) {\n    let f = atomicLoad(&first);\n"
            f"    status[0] = select(f, 0u, f == {none}u);\n  }}\n}}\n")
    return Kernel("capacity_check", src, ["rw"] + ["read"] * nbuf, (1, 1, 1), reads)


def scatter_elements(t: str, it: str, in_shape: Sequence[int], idx_shape: Sequence[int],
                     axis: int) -> Kernel:
    """out[.., idx[e], ..] = updates[e] for each element ``e`` of ``indices``, its other
    coordinates its own (``out`` already holds the input, copied before). Negative
    indices count from the end; ones still out of range are skipped (the spec leaves them
    implementation-defined)."""
    n = S.size(idx_shape)
    gx, gy, gz = grid(n)
    ost = S.strides(in_shape)
    src = decl(0, "idx", it, "read") + decl(1, "upd", t, "read") + decl(2, "out", t, "rw")
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n  var r = i;\n  var o = 0u;\n"
    for ax in range(len(idx_shape) - 1, -1, -1):
        d = idx_shape[ax]
        if ax == axis:
            src += (f"  var k = i32(idx[i]);\n  if (k < 0) {{ k = k + {in_shape[ax]}; }}\n"
                    f"  if (k < 0 || k >= {in_shape[ax]}) {{ return; }}\n"
                    f"  o = o + u32(k) * {ost[ax]}u;\n")
        else:
            src += f"  o = o + (r % {d}u) * {ost[ax]}u;\n"
        src += f"  r = r / {d}u;\n"
    src += "  out[o] = upd[i];\n}\n"
    return Kernel("scatter_elements", src, ["read", "read", "rw"], (gx, gy, gz),
                  esize(it) * n + 2 * esize(t) * n)


def pad(t: str, in_shape: Sequence[int], begin: Sequence[int], out_shape: Sequence[int],
        mode: str) -> Kernel:
    """out = x padded by ``begin`` elements before each axis (``out_shape`` fixes the end):
    "edge" repeats the axis' first and last elements, "reflection" mirrors the axis about
    them, leaving them out (x[1], x[0] | x[0] .. x[n-1] | x[n-2]; each padding shorter than
    the axis, as the builder checks). One invocation per output element."""
    n = S.size(out_shape)
    gx, gy, gz = grid(n)
    ist = S.strides(in_shape)
    src = decl(0, "x", t, "read") + decl(1, "out", t, "rw") + main_1d(gx)
    src += f"  if (i >= {n}u) {{ return; }}\n  var r = i;\n  var o = 0u;\n"
    for ax in range(len(out_shape) - 1, -1, -1):
        d, e = in_shape[ax], out_shape[ax]
        src += f"  var c{ax} = i32(r % {e}u) - {begin[ax]};\n  r = r / {e}u;\n"
        if mode == "edge":
            src += f"  c{ax} = clamp(c{ax}, 0, {d - 1});\n"
        else:  # reflection
            src += (f"  if (c{ax} < 0) {{ c{ax} = -c{ax}; }}\n"
                    f"  if (c{ax} > {d - 1}) {{ c{ax} = {2 * (d - 1)} - c{ax}; }}\n")
        src += f"  o = o + u32(c{ax}) * {ist[ax]}u;\n"
    src += "  out[i] = x[o];\n}\n"
    return Kernel(f"pad_{mode}", src, ["read", "rw"], (gx, gy, gz), 2 * esize(t) * n)
