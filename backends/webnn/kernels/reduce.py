"""Reductions and softmax: one workgroup per output row, workgroup-shared tree reduction
(long rows such as an attention row over the cache stay parallel)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import shapes as S
from .common import WG, Kernel, decl, esize, grid, main_1d, offset_fn, zero

#: max and min start from the row's first element (every lane: both are idempotent), so no
#: lane needs an infinity, which WGSL cannot write as a constant (docs/dawn.md)
_FROM_FIRST = ("reduce_max", "reduce_min")

COMBINE = {
    "reduce_sum": "{a} + {b}", "reduce_mean": "{a} + {b}",
    "reduce_max": "max({a}, {b})", "reduce_min": "min({a}, {b})",
    "reduce_product": "{a} * {b}",
}


def _start(op: str, t: str) -> str:
    """The accumulator's start of a reduction that does not start from the first element:
    the combine's identity (1 for a product, else 0)."""
    return {"f32": "1.0", "f16": "f16(1.0)", "i32": "1", "u32": "1u"}[t] \
        if op == "reduce_product" else zero(t)


def tree(combine: str, var: str = "sh", wg: int = WG) -> str:
    """WGSL combining ``var[0..wg)`` (written by every invocation just before) into
    ``var[0]`` by a tree of barriers; ``combine``: a format string of ``{a}`` and ``{b}``."""
    src = "  workgroupBarrier();\n"
    s = wg // 2
    while s >= 1:
        c = combine.format(a=f"{var}[lid]", b=f"{var}[lid + {s}u]")
        src += f"  if (lid < {s}u) {{ {var}[lid] = {c}; }}\n  workgroupBarrier();\n"
        s //= 2
    return src


def inline_reduction(op: str, count: int, load: str, wg: int, var: str = "red") -> tuple[str, str]:
    """(module declarations, body) reducing ``count`` elements given by ``load`` (a format
    string of the index) across one workgroup into ``let {var}`` (f32): for kernels that
    need a whole-vector statistic before their own work (RMSNorm inside a gemv)."""
    comb = COMBINE[op]
    init = load.format("0u") if op in _FROM_FIRST else _start(op, "f32")
    decls = f"var<workgroup> {var}_sh: array<f32, {wg}>;\n"
    body = (f"  var {var}_acc: f32 = {init};\n"
            f"  for (var j = lid; j < {count}u; j = j + {wg}u) {{\n"
            f"    {var}_acc = {comb.format(a=f'{var}_acc', b=load.format('j'))};\n  }}\n"
            f"  {var}_sh[lid] = {var}_acc;\n" + tree(comb, f"{var}_sh", wg))
    scale = f" / f32({count})" if op == "reduce_mean" else ""
    body += f"  let {var} = {var}_sh[0]{scale};\n"
    return decls, body


#: the subgroup builtin of each combine, for reductions across a subgroup
_SUBGROUP = {"reduce_sum": "subgroupAdd", "reduce_mean": "subgroupAdd",
             "reduce_max": "subgroupMax", "reduce_min": "subgroupMin"}

#: the most elements an invocation of ``unrolled_reduction`` loads as straight-line code
UNROLL_MAX = 16


def unrolled_reduction(op: str, count: int, load: str, wg: int, subgroup: int | None = None,
                       var: str = "red") -> tuple[str, str] | None:
    """``inline_reduction`` for a row of at most ``UNROLL_MAX * wg`` elements (None beyond):
    each invocation's elements loaded as straight-line code with constant offsets, not a
    loop whose trip count depends on the invocation, so its loads are in flight together
    rather than one after another (a one-workgroup launch is the latency of its chain of
    loads); and where the subgroup is ``subgroup`` wide (dividing ``wg``), the workgroup's
    partial results combined by a subgroup builtin and one barrier instead of a tree of
    ``log2(wg)`` barriers."""
    per = -(-count // wg)
    if per > UNROLL_MAX:
        return None
    comb = COMBINE[op]
    init = load.format("0u") if op in _FROM_FIRST else _start(op, "f32")
    body = f"  var {var}_acc: f32 = {init};\n"
    for k in range(per):
        idx = f"lid + {k * wg}u"
        step = f"  {var}_acc = {comb.format(a=f'{var}_acc', b=load.format(idx))};"
        body += (step + "\n" if (k + 1) * wg <= count
                 else f"  if ({idx} < {count}u) {{\n  {step}\n  }}\n")
    sub = _SUBGROUP.get(op)
    if subgroup and sub and wg % subgroup == 0 and wg > subgroup:
        parts = wg // subgroup
        decls = f"var<workgroup> {var}_sh: array<f32, {parts}>;\n"
        body += (f"  let {var}_sg = {sub}({var}_acc);\n"
                 f"  if (lid % {subgroup}u == 0u) {{ {var}_sh[lid / {subgroup}u] = {var}_sg; }}\n"
                 "  workgroupBarrier();\n"
                 f"  var {var}_all = {var}_sh[0];\n")
        body += "".join(f"  {var}_all = {comb.format(a=f'{var}_all', b=f'{var}_sh[{i}]')};\n"
                        for i in range(1, parts))
        total = f"{var}_all"
    elif subgroup and sub and wg == subgroup:
        decls = ""
        body += f"  let {var}_all = {sub}({var}_acc);\n"
        total = f"{var}_all"
    else:
        decls = f"var<workgroup> {var}_sh: array<f32, {wg}>;\n"
        body += f"  {var}_sh[lid] = {var}_acc;\n" + tree(comb, f"{var}_sh", wg)
        total = f"{var}_sh[0]"
    scale = f" / f32({count})" if op == "reduce_mean" else ""
    body += f"  let {var} = {total}{scale};\n"
    return decls, body


def _header(gx: int, wg: int = WG) -> str:
    return (f"@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n"
            f"  let row = wid.y * {gx}u + wid.x;\n")


def reduce(op: str, t: str, in_shape: Sequence[int], axes: Sequence[int],
           source: tuple[str, list[str], str] | None = None, wg: int = WG) -> Kernel:
    """``op`` over ``axes``; output is the kept dimensions in order (keep_dimensions only
    changes the shape, not the layout).

    ``source``: the input computed inline (``fusion.Group.input_source``: declarations
    and functions, their bindings, the name giving element ``i``), e.g. RMSNorm's
    ``x * x``; None: the input is binding 0. ``wg``: a power of two (GPUs take 256: a
    decode step's rows are single, and 256 invocations keep more loads in flight)."""
    st = S.strides(in_shape)
    kept = [i for i in range(len(in_shape)) if i not in axes]
    red = [i for i in range(len(in_shape)) if i in axes]
    rows = S.size([in_shape[i] for i in kept])
    rn = S.size([in_shape[i] for i in red])
    comb = COMBINE[op]
    if source is None:
        src, bindings, load = decl(0, "x", t, "read"), ["read"], "x[{}]"
    else:
        src, bindings, name = source
        bindings = list(bindings)
        load = name + ("({})" if name.startswith("v") else "[{}]")
    init = load.format("base") if op in _FROM_FIRST else _start(op, t)  # element 0 is at base
    src += decl(len(bindings), "out", t, "rw")
    bindings.append("rw")
    src += offset_fn("rowoff", [in_shape[i] for i in kept] or [1], [st[i] for i in kept] or [0])
    src += offset_fn("redoff", [in_shape[i] for i in red] or [1], [st[i] for i in red] or [0])
    traffic = 4 * (S.size(in_shape) + rows)
    if rn <= SHORT_ROW:
        return Kernel(op, src + _short_rows(op, t, rows, rn, load, wg), bindings,
                      grid(rows, wg), traffic)
    gx, gy, gz = grid(rows, 1)
    src += f"var<workgroup> sh: array<{t}, {wg}>;\n" + _header(gx, wg)
    src += f"  if (row >= {rows}u) {{ return; }}\n  let base = rowoff(row);\n"
    src += f"  var acc: {t} = {init};\n"
    src += (f"  for (var j = lid; j < {rn}u; j = j + {wg}u) {{\n"
            f"    let v = {load.format('base + redoff(j)')};\n"
            f"    acc = {comb.format(a='acc', b='v')};\n  }}\n")
    src += "  sh[lid] = acc;\n" + tree(comb, wg=wg)
    res = f"sh[0] / {t}({rn})" if op == "reduce_mean" else "sh[0]"
    src += f"  if (lid == 0u) {{ out[row] = {res}; }}\n}}\n"
    return Kernel(op, src, bindings, (gx, gy, gz), traffic)


#: the longest reduction ``reduce`` gives one invocation a row (its elements loaded as
#: straight-line code) instead of a workgroup: a short convolution's window of 4 had kept
#: 252 of 256 invocations idle and a tree of 8 barriers, a workgroup for each of 8192 rows
SHORT_ROW = 16


def reduced(in_shape: Sequence[int], axes: Sequence[int]) -> int:
    """Elements a reduction over ``axes`` of ``in_shape`` combines into each output."""
    return S.size([d for k, d in enumerate(in_shape) if k in axes])


def combined(op: str, t: str, values: Sequence[str]) -> str:
    """WGSL: ``op``'s combine of ``values`` (expressions of type ``t``) from the first on, a
    mean divided by their count: a short row's reduction written out."""
    acc = values[0]
    for v in values[1:]:
        acc = COMBINE[op].format(a=acc, b=v)
    return f"({acc}) / {t}({len(values)})" if op == "reduce_mean" else acc


def _short_rows(op: str, t: str, rows: int, rn: int, load: str, wg: int) -> str:
    """WGSL body of ``reduce`` for rows of at most ``SHORT_ROW`` elements: an invocation
    a row, every load issued before the combines."""
    gx = grid(rows, wg)[0]
    src = main_1d(gx, wg) + f"  if (i >= {rows}u) {{ return; }}\n  let base = rowoff(i);\n"
    src += "".join(f"  let rv_{j} = {load.format(f'base + redoff({j}u)')};\n" for j in range(rn))
    return src + f"  out[i] = {combined(op, t, [f'rv_{j}' for j in range(rn)])};\n}}\n"


def softmax(shape: Sequence[int], axis: int, wg: int = WG) -> Kernel:
    """Numerically stable softmax along ``axis``: max, sum of exp, scale (three sweeps
    of the row, each a workgroup reduction). ``wg``: a power of two; GPUs take 256 for
    long rows (attention over the cache: few rows, each thousands long)."""
    st = S.strides(shape)
    kept = [i for i in range(len(shape)) if i != axis]
    rows = S.size([shape[i] for i in kept])
    rn, sa = shape[axis], st[axis]
    gx, gy, gz = grid(rows, 1)
    src = decl(0, "x", "f32", "read") + decl(1, "out", "f32", "rw")
    src += offset_fn("rowoff", [shape[i] for i in kept] or [1], [st[i] for i in kept] or [0])
    src += f"var<workgroup> sh: array<f32, {wg}>;\n" + _header(gx, wg)
    src += f"  if (row >= {rows}u) {{ return; }}\n  let base = rowoff(row);\n"
    src += ("  var m = x[base];\n"  # the row's first element: no infinity needed
            f"  for (var j = lid; j < {rn}u; j = j + {wg}u) {{ m = max(m, x[base + j * {sa}u]); }}\n"
            "  sh[lid] = m;\n" + tree("max({a}, {b})", wg=wg) + "  let mx = sh[0];\n"
            "  workgroupBarrier();\n"
            "  var s = 0.0;\n"
            f"  for (var j = lid; j < {rn}u; j = j + {wg}u) {{ s = s + exp(x[base + j * {sa}u] - mx); }}\n"
            "  sh[lid] = s;\n" + tree("{a} + {b}", wg=wg) + "  let inv = 1.0 / sh[0];\n"
            f"  for (var j = lid; j < {rn}u; j = j + {wg}u) {{\n"
            f"    let o = base + j * {sa}u;\n    out[o] = exp(x[o] - mx) * inv;\n  }}\n}}\n")
    n = S.size(shape)
    return Kernel("softmax", src, ["read", "rw"], (gx, gy, gz), 8 * n)


def cumulative_sum(t: str, shape: Sequence[int], axis: int, exclusive: bool,
                   reverse: bool) -> Kernel:
    """out[.., j, ..] = the sum of x along ``axis`` over m <= j (m >= j when ``reverse``;
    m = j left out when ``exclusive``), one invocation per output summing its own run:
    the axes real graphs scan (a mask's positions, a chunk's decays) are short."""
    n = S.size(shape)
    dim = shape[axis]
    inner = S.size(shape[axis + 1:])
    gx, gy, gz = grid(n)
    lo = ("j + 1u" if exclusive else "j") if reverse else "0u"
    hi = f"{dim}u" if reverse else ("j" if exclusive else "j + 1u")
    src = decl(0, "x", t, "read") + decl(1, "out", t, "rw")
    src += main_1d(gx) + (
            f"  if (i >= {n}u) {{ return; }}\n"
            f"  let j = (i / {inner}u) % {dim}u;\n"
            f"  let base = i - j * {inner}u;\n"
            f"  var acc = {zero(t)};\n"
            f"  for (var m = {lo}; m < {hi}; m = m + 1u) {{ acc = acc + x[base + m * {inner}u]; }}\n"
            "  out[i] = acc;\n}\n")
    traffic = esize(t) * (n * (dim + 1) // 2 + n)  # each output reads half its run on average
    return Kernel("cumulative_sum", src, ["read", "rw"], (gx, gy, gz), traffic)


def _arg_better(op: str, t: str) -> str:
    """WGSL ``better(v, i, w, j)``: whether element ``v`` at index ``i`` wins over ``w`` at
    ``j`` in an argMax (argMin) — the larger (smaller) value; a tie goes to the smaller
    index and a NaN wins over any number (NumPy's argmax and argmin, so the result does
    not depend on the order the workgroup combines in). NaN is read from the bits: a
    compiler may fold ``v != v`` to false."""
    cmp = ">" if op == "arg_max" else "<"
    src = f"fn better(v: {t}, i: u32, w: {t}, j: u32) -> bool {{\n"
    if t == "f32":
        src += ("  let nv = (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;\n"
                "  let nw = (bitcast<u32>(w) & 0x7fffffffu) > 0x7f800000u;\n"
                "  if (nv || nw) { return nv && (!nw || i < j); }\n")
    return src + f"  return v {cmp} w || (v == w && i < j);\n}}\n"


#: rows longer than this (a vocabulary's logits) are split over workgroups by ``arg_split``
ARG_SPLIT_ROW = 4096
#: elements an invocation of ``arg_split``'s first pass takes
ARG_PER = 8


def _arg_rows(in_shape: Sequence[int], axis: int) -> tuple[int, int, int, str]:
    """(rows, elements a row, the stride between them, WGSL ``rowoff``: a row's first
    element) of an argMax / argMin along ``axis``."""
    st = S.strides(in_shape)
    kept = [i for i in range(len(in_shape)) if i != axis]
    rowoff = offset_fn("rowoff", [in_shape[i] for i in kept] or [1],
                       [st[i] for i in kept] or [0])
    return S.size([in_shape[i] for i in kept]), in_shape[axis], st[axis], rowoff


def _arg_walk(first: str, start: str, end: str, step: str, sa: int) -> str:
    """WGSL: ``bv``, ``bi`` the winner (``better``) of the row at ``base``'s element
    ``first`` and its elements ``start``, ``start + step``, .. below ``end``."""
    return (f"  var bv = x[base + {first} * {sa}u];\n  var bi = {first};\n"
            f"  for (var j = {start}; j < {end}; j = j + {step}) {{\n"
            f"    let v = x[base + j * {sa}u];\n"
            "    if (better(v, j, bv, bi)) { bv = v; bi = j; }\n  }\n")


def _arg_batch(first: str, start: str, end: str, step: int, count: int, n: int,
               sa: int) -> str:
    """WGSL: ``_arg_walk``'s winner over ``count`` elements ``start + k · step`` below
    ``end``, every load issued before the first comparison (an index past the row reads
    its last element, and loses), so an invocation waits one round trip, not ``count``."""
    src = f"  var bv = x[base + {first} * {sa}u];\n  var bi = {first};\n"
    src += "".join(f"  let ja{k} = {start} + {k * step}u;\n"
                   f"  let va{k} = x[base + min(ja{k}, {n - 1}u) * {sa}u];\n" for k in range(count))
    return src + "".join(f"  if (ja{k} < {end} && better(va{k}, ja{k}, bv, bi)) "
                         f"{{ bv = va{k}; bi = ja{k}; }}\n" for k in range(count))


def _arg_shared(t: str, wg: int) -> str:
    """The workgroup's (value, index) pairs ``_arg_tree`` combines."""
    return f"var<workgroup> shv: array<{t}, {wg}>;\nvar<workgroup> shi: array<u32, {wg}>;\n"


def _argtree(wg: int) -> str:
    """The workgroup's (``shv``, ``shi``) pairs combined into slot 0 by ``better``."""
    src, s = "  shv[lid] = bv;\n  shi[lid] = bi;\n  workgroupBarrier();\n", wg // 2
    while s >= 1:
        src += (f"  if (lid < {s}u && better(shv[lid + {s}u], shi[lid + {s}u], shv[lid], "
                f"shi[lid])) {{\n    shv[lid] = shv[lid + {s}u];\n    shi[lid] = shi[lid + {s}u];\n"
                "  }\n  workgroupBarrier();\n")
        s //= 2
    return src


def arg_split(op: str, t: str, in_shape: Sequence[int], axis: int,
              wg: int = WG) -> tuple[Kernel, Kernel, int]:
    """(pass 1, pass 2, partial words) of argMax / argMin over long rows: one workgroup
    can keep only a few loads in flight, so a 128256-wide row on one workgroup is a long
    serial walk. Pass 1: ``S`` workgroups a row, each the winner of ``wg · ARG_PER``
    consecutive elements (each invocation's ``ARG_PER`` loads issued together:
    ``_arg_batch``), written as (value bits, index) words; pass 2: one workgroup a
    row combines its ``S`` partials. ``better`` decides everywhere (ties to the smaller
    index, NaN first), so the result is ``arg_reduce``'s."""
    if esize(t) != 4:
        raise ValueError(f"arg_split takes 4-byte elements (the partials hold their bits), not {t}")
    rows, rn, sa, rowoff = _arg_rows(in_shape, axis)
    chunk = wg * ARG_PER
    ns = -(-rn // chunk)
    head = (_arg_shared(t, wg) + f"@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n")
    src1 = (decl(0, "x", t, "read") + decl(1, "part", "u32", "rw") + _arg_better(op, t)
            + rowoff + head)
    src1 += (f"  let row = wid.y;\n  let s = wid.x;\n  let base = rowoff(row);\n"
             f"  let j0 = s * {chunk}u;\n  let end = min(j0 + {chunk}u, {rn}u);\n")
    src1 += _arg_batch("j0", "j0 + lid", "end", wg, ARG_PER, rn, sa) + _argtree(wg)
    src1 += (f"  if (lid == 0u) {{\n    let p = (row * {ns}u + s) * 2u;\n"
             "    part[p] = bitcast<u32>(shv[0]);\n    part[p + 1u] = shi[0];\n  }\n}\n")
    k1 = Kernel(op, src1, ["read", "rw"], (ns, rows, 1),
                esize(t) * S.size(in_shape) + 8 * rows * ns)
    src2 = (decl(0, "part", "u32", "read") + decl(1, "out", "i32", "rw")
            + _arg_better(op, t) + head)
    src2 += (f"  let row = wid.x;\n  let pb = row * {ns}u;\n"
             f"  var bv = bitcast<{t}>(part[pb * 2u]);\n  var bi = part[pb * 2u + 1u];\n"
             f"  for (var s = lid; s < {ns}u; s = s + {wg}u) {{\n"
             f"    let v = bitcast<{t}>(part[(pb + s) * 2u]);\n"
             "    let j = part[(pb + s) * 2u + 1u];\n"
             "    if (better(v, j, bv, bi)) { bv = v; bi = j; }\n  }\n")
    src2 += _argtree(wg) + "  if (lid == 0u) { out[row] = i32(shi[0]); }\n}\n"
    k2 = Kernel(op, src2, ["read", "rw"], (rows, 1, 1), 8 * rows * ns + 4 * rows)
    return k1, k2, 2 * rows * ns


def arg_reduce(op: str, t: str, in_shape: Sequence[int], axis: int, wg: int = WG) -> Kernel:
    """argMax / argMin along ``axis``: per output element the index of the row's winner
    (``_arg_better``), written as i32 (int32 and int64 both are 32-bit words on the
    device). A row of at most ``SHORT_ROW`` elements is one invocation's; a longer one (up
    to ``ARG_SPLIT_ROW``, the lowering's bound; ``arg_split`` beyond) a workgroup's, each
    invocation keeping the winner of its strided share and a tree combining (value,
    index) pairs. ``t``: the input's WGSL type (f32, i32 or u32; float16 is widened by
    the builder)."""
    rows, rn, sa, rowoff = _arg_rows(in_shape, axis)
    src = decl(0, "x", t, "read") + decl(1, "out", "i32", "rw") + _arg_better(op, t) + rowoff
    traffic = esize(t) * S.size(in_shape) + 4 * rows
    if rn <= SHORT_ROW:
        gx = grid(rows, wg)[0]
        src += main_1d(gx, wg) + f"  if (i >= {rows}u) {{ return; }}\n  let base = rowoff(i);\n"
        src += _arg_walk("0u", "1u", f"{rn}u", "1u", sa) + "  out[i] = i32(bi);\n}\n"
        return Kernel(op, src, ["read", "rw"], grid(rows, wg), traffic)
    gx, gy, gz = grid(rows, 1)
    src += _arg_shared(t, wg) + _header(gx, wg)
    src += f"  if (row >= {rows}u) {{ return; }}\n  let base = rowoff(row);\n"
    src += _arg_walk("0u", "lid", f"{rn}u", f"{wg}u", sa)
    src += _argtree(wg) + "  if (lid == 0u) { out[row] = i32(shi[0]); }\n}\n"
    return Kernel(op, src, ["read", "rw"], (gx, gy, gz), traffic)


def grouped_reduction(op: str, count: int, group: int, load: str, wg: int,
                      var: str = "red") -> tuple[str, str]:
    """(module declarations, body) reducing each run of ``group`` contiguous elements of
    ``count`` (``load``: a format string of the index) across one workgroup into workgroup
    memory ``{var}_g[g]`` (f32, ``count / group`` of them), the body ending in a barrier:
    a per-head norm's means computed by every workgroup of the product reading it, so the
    norm needs no launch. ``lanes`` invocations a run, as many runs at a time as the
    workgroup holds; every invocation runs every step (uniform control flow)."""
    assert op in ("reduce_sum", "reduce_mean") and count % group == 0
    n = count // group
    lanes = 1
    while lanes * 2 <= min(wg // n if n <= wg else 1, group):
        lanes *= 2
    per = wg // lanes  # runs reduced at a time
    rounds = -(-n // per)
    decls = (f"var<workgroup> {var}_g: array<f32, {n}>;\n"
             f"var<workgroup> {var}_gs: array<f32, {wg}>;\n")
    scale = f" / {float(group)!r}" if op == "reduce_mean" else ""
    body = f"  let {var}_t = lid % {lanes}u;\n"
    for r in range(rounds):
        g = f"{var}_q{r}"
        body += (f"  let {g} = {r * per}u + lid / {lanes}u;\n"
                 f"  var {var}_a{r} = 0.0;\n"
                 f"  if ({g} < {n}u) {{\n"
                 f"    for (var j = {var}_t; j < {group}u; j = j + {lanes}u) {{\n"
                 f"      {var}_a{r} = {var}_a{r} + {load.format(f'{g} * {group}u + j')};\n"
                 "    }\n  }\n")
        if lanes == 1:
            body += f"  if ({g} < {n}u) {{ {var}_g[{g}] = {var}_a{r}{scale}; }}\n"
            continue
        body += f"  {var}_gs[lid] = {var}_a{r};\n  workgroupBarrier();\n"
        s = lanes // 2
        while s >= 1:
            body += (f"  if ({var}_t < {s}u) {{ {var}_gs[lid] = {var}_gs[lid] + "
                     f"{var}_gs[lid + {s}u]; }}\n  workgroupBarrier();\n")
            s //= 2
        body += (f"  if ({var}_t == 0u && {g} < {n}u) {{ {var}_g[{g}] = "
                 f"{var}_gs[lid]{scale}; }}\n")
        if r + 1 < rounds:
            body += "  workgroupBarrier();\n"  # the scratch is written again
    return decls, body + "  workgroupBarrier();\n"
