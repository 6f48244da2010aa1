"""Decode attention with lane-groups and an online softmax (``KernelOptions.attention``
"lanes", two launches, and "lanes1", the combine folded in): the same result and the
same partials as ``attention.flash_decode``, with fewer fixed costs per workgroup.

Where ``flash_decode``'s pass 1 gives each invocation whole K rows (a warp's loads 128
bytes apart), keeps the split's scores in workgroup memory and reduces their maximum and
sum with two workgroup trees, here:

* a lane-group of ``LW`` adjacent invocations reads one cache row (``LW`` 16-byte words:
  8 halves of a float16 cache, 4 floats of a float32 one), so a warp's K and V loads are
  whole contiguous rows; each invocation issues the K and the V words of ``U`` rows
  before using any (``2U`` 16-byte loads in flight);
* the head's q rows (q, or q's RoPE chain, each element computed once a workgroup) pass
  through workgroup memory once (one barrier); each invocation then holds its columns in
  registers, and the partial dots are summed across the lane-group with
  ``subgroupShuffleXor`` (where the subgroup is a fixed power of two at least ``LW``
  wide; else through workgroup memory, two barriers a round);
* the softmax is online (FlashAttention's running maximum ``m``, sum ``l`` and ``acc``
  rescaled per round of ``U`` rows) in registers: no score buffer, no trees per chunk;
* the row-groups of a workgroup are merged once at the end (within a subgroup by
  shuffles, across subgroups through workgroup memory) into the split's partial
  ``(m, l, acc[d])`` per q row, in ``flash_decode``'s layout.

"lanes": ``combine_rows`` merges the splits in a second launch, one workgroup per q row.
"lanes1": each workgroup then bumps its head's counter (``storageBarrier()``,
``atomicAdd``) and the head's last workgroup merges the head's splits itself, as
``flash_decode_one`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .attention import (
    Epilogue,
    _kv_and_score,
    _q_source,
    _split_entry,
    epilogue_bytes,
    last_of_head,
    out_decl,
    store,
)
from .common import Kernel, decl, neg_inf
from .fused import FusedOp, Leaf

WGL = 128  # workgroup
SPLITS_L = 64  # splits per head a long cache aims at
UNROLL = 4  # cache rows a lane-group loads before using any


@dataclass(frozen=True)
class LanesPlan:
    """``lw``: invocations (16-byte words) a cache row; ``unroll``: rows a lane-group loads
    at once; ``rows``: cache rows a split; ``splits``: splits per head; ``sub``: the
    subgroup width the shuffles use, None where partial dots go through workgroup memory;
    ``rb``: q rows merged per round at the end (workgroup memory)."""

    lw: int
    unroll: int
    rows: int
    splits: int
    sub: int | None
    rb: int


def lanes_plan(q_rows: int, capacity: int, d: int, kv: str, shared_floats: int,
               splits: int = SPLITS_L, subgroup: int | None = None,
               unroll: int = UNROLL, fold: bool = False) -> LanesPlan | None:
    """How ``flash_lanes`` lays out, or None where it does not apply (the head dimension is
    not a power-of-two count of 16-byte words at most 32, or workgroup memory is short):
    the caller keeps ``flash_decode``. ``unroll``: the rows a lane-group loads at once it
    aims at (fewer where the partial dots' workgroup memory is short); ``fold``: room for
    the folded combine's split weights too."""
    per = 8 if kv == "f16" else 4
    if kv not in ("f16", "f32") or d % per:
        return None
    lw = d // per
    if lw > 32 or lw & (lw - 1):
        return None
    sub = subgroup if (subgroup and subgroup & (subgroup - 1) == 0 and lw <= subgroup
                       and WGL % subgroup == 0) else None
    rg = WGL // lw
    writers = WGL // sub if sub else rg  # who holds a share of the workgroup's sums
    d4 = d // 4
    for unroll in (u for u in (8, 4, 2, 1) if u <= unroll):
        dots = 0 if sub else WGL * unroll  # partial dots of a round
        fixed = dots + 2 * writers * q_rows + q_rows * d
        rb = next((b for b in range(q_rows, 0, -1)
                   if fixed + writers * b * d4 * 4 <= shared_floats), 0)
        if rb:
            break
    else:
        return None
    step = rg * unroll  # rows a workgroup reads a round
    per_split = -(-capacity // max(1, splits))
    rows = -(-per_split // step) * step
    ns = -(-capacity // rows)
    folded = 2 * ns * q_rows + WGL + q_rows + 4 * max(q_rows * d4, WGL)  # _merge_splits
    if fold and fixed + writers * rb * d4 * 4 + folded > shared_floats:
        return None
    return LanesPlan(lw, unroll, rows, ns, sub, rb)


def flash_lanes(heads: int, q_rows: int, capacity: int, d: int,
                score: tuple[Sequence[FusedOp], Sequence[Leaf]] | None,
                shared_floats: int,
                q_chain: tuple[Sequence[FusedOp], Sequence[Leaf]] | None = None,
                splits: int = SPLITS_L, kv: str = "f32", subgroup: int | None = None,
                fold: bool = False, unroll: int = UNROLL,
                epilogue: Epilogue | None = None) -> tuple[list[Kernel], int, int] | None:
    """(kernels, partial-buffer 4-byte words, counter words) for q (heads, q_rows, d), K
    and V (heads, capacity, d), output (heads, q_rows, d); None where ``lanes_plan``
    says it does not apply. ``score``, ``q_chain``, ``kv``: as ``flash_decode``'s;
    ``subgroup``: the adapter's fixed subgroup width (None: no shuffles); ``unroll``: cache
    rows a lane-group loads before using any.

    Bindings of the first kernel: as ``flash_decode``'s pass 1 (q or its chain's leaves,
    K, V, the score chain's leaves, the partials); ``fold``: then the output (or the
    ``epilogue``'s root) and ``heads`` u32 counters, zero before the first launch and left
    zero (one kernel), then the epilogue's leaves.
    Else the second kernel is ``combine_rows`` (partials, output, ``epilogue``'s leaves:
    it writes the epilogue instead of the output); no counters.
    """
    plan = lanes_plan(q_rows, capacity, d, kv, shared_floats, splits, subgroup, unroll, fold)
    if plan is None:
        return None
    G, D, C = q_rows, d, capacity
    LW, U, T, ns, sub, RB = plan.lw, plan.unroll, plan.rows, plan.splits, plan.sub, plan.rb
    RG = WGL // LW
    D4 = D // 4
    PW = D4 + 1  # partial words per (q row, split): (m, l, 0, 0), acc
    wide = kv == "f16"
    NW = WGL // sub if sub else RG
    src, bindings, q_load = _q_source(q_chain, G * D4, True)
    src, bindings, fn_call = _kv_and_score(src, bindings, "vec4<u32>" if wide else "vec4<f32>",
                                           wide, score)
    nb = len(bindings)
    src += decl(nb, "part", "vec4<f32>", "rw")
    bindings.append("rw")
    if fold:
        out_src, out_bindings = out_decl(epilogue, True, nb + 1, counters=True)
        src += out_src
        bindings += out_bindings
    low = neg_inf()
    halves = ("a", "b") if wide else ("a",)  # the invocation's q/acc words: 2e, 2e + 1 or e
    word = {"a": "2u * e", "b": "2u * e + 1u"} if wide else {"a": "e"}
    us = range(U)
    nl = "\n"
    lanes = [LW * 2 ** i for i in range(6) if LW * 2 ** i < (sub or 0)]  # row-groups a subgroup
    regs = "".join(f"  var q{x}: array<vec4<f32>, {G}>;\n  var {x}: array<vec4<f32>, {G}>;\n"
                   for x in halves)
    body = regs + f"""  var m: array<f32, {G}>;
  var l: array<f32, {G}>;
  for (var j = lid; j < {G * D4}u; j = j + {WGL}u) {{ qs[j] = q_word(h, j); }}
  workgroupBarrier();
  for (var r = 0u; r < {G}u; r = r + 1u) {{
{"".join(f"    q{x}[r] = qs[r * {D4}u + {word[x]}];{nl}    {x}[r] = vec4<f32>(0.0);{nl}"
         for x in halves)}    m[r] = {low};
    l[r] = 0.0;
  }}
  for (var it = 0u; it < (n + {RG * U - 1}u) / {RG * U}u; it = it + 1u) {{
    let cb = it * {RG * U}u + rg;
"""
    it = "".join(f"    let cr{u} = min(cb + {u * RG}u, n - 1u);\n" for u in us)
    it += "".join(f"    let kw{u} = k[(h * {C}u + c0 + cr{u}) * {LW}u + e];\n" for u in us)
    it += "".join(f"    let vw{u} = v[(h * {C}u + c0 + cr{u}) * {LW}u + e];\n" for u in us)
    if wide:
        it += "".join(f"    let k{u}a = unpack_lo(kw{u});\n    let k{u}b = unpack_hi(kw{u});\n"
                      for u in us)
        it += "".join(f"    let v{u}a = unpack_lo(vw{u});\n    let v{u}b = unpack_hi(vw{u});\n"
                      for u in us)
    else:
        it += "".join(f"    let k{u}a = kw{u};\n    let v{u}a = vw{u};\n" for u in us)
    it += f"    for (var r = 0u; r < {G}u; r = r + 1u) {{\n"
    it += "".join(f"      let q{x}r = q{x}[r];\n" for x in halves)
    for u in us:
        it += f"      var d{u} = {' + '.join(f'dot(q{x}r, k{u}{x})' for x in halves)};\n"
    if sub:
        st = LW // 2
        while st >= 1:
            it += "".join(f"      d{u} = d{u} + subgroupShuffleXor(d{u}, {st}u);\n" for u in us)
            st //= 2
    else:
        it += "".join(f"      pd[{u * WGL}u + lid] = d{u};\n" for u in us)
        it += "      workgroupBarrier();\n"
        it += "".join(f"      d{u} = 0.0;\n      for (var x = 0u; x < {LW}u; x = x + 1u) {{ "
                      f"d{u} = d{u} + pd[{u * WGL}u + rg * {LW}u + x]; }}\n" for u in us)
        it += "      workgroupBarrier();\n"
    for u in us:
        it += (f"      var s{u} = {low};\n      {{\n        let raw = d{u};\n"
               f"        let si = (h * {G}u + r) * {C}u + c0 + cr{u};\n"
               f"        s{u} = select({low}, {fn_call}, cb + {u * RG}u < n);\n      }}\n")
    smax = "s0"
    for u in us[1:]:
        smax = f"max({smax}, s{u})"
    it += f"      let mx = max(m[r], {smax});\n"
    it += "      let al = select(exp(m[r] - mx), 1.0, m[r] == mx);\n"
    it += "".join(f"      let p{u} = select(0.0, exp(s{u} - mx), s{u} > {low});\n" for u in us)
    it += f"      l[r] = l[r] * al + {' + '.join(f'p{u}' for u in us)};\n"
    for x in halves:
        it += f"      {x}[r] = {x}[r] * al + {' + '.join(f'p{u} * v{u}{x}' for u in us)};\n"
    it += "      m[r] = mx;\n    }\n"
    body += it + "  }\n"
    # merge the row-groups: the workgroup's maximum per q row, then everyone's share scaled
    # and summed (within a subgroup by shuffles, across writers through workgroup memory)
    wi, writer = (f"lid / {sub}u", f"lid % {sub}u == 0u") if sub else ("rg", "e == 0u")
    holder = f"lid % {sub}u < {LW}u" if sub else "true"  # lanes holding the sums
    def shuf(x: str, how: str = "add") -> str:
        """``x`` combined over the row-groups of a subgroup (sum or maximum), by shuffles."""
        f = "max({x}, {y})" if how == "max" else "{x} + {y}"
        return "".join(f"    {x} = {f.format(x=x, y=f'subgroupShuffleXor({x}, {st}u)')};\n"
                       for st in lanes)


    merge = f"""  let wi = {wi};
  for (var r = 0u; r < {G}u; r = r + 1u) {{
    var mw = m[r];
{shuf("mw", "max")}    if ({writer}) {{ ms[wi * {G}u + r] = mw; }}
  }}
  workgroupBarrier();
  for (var r = 0u; r < {G}u; r = r + 1u) {{
    var mx = {low};
    for (var w = 0u; w < {NW}u; w = w + 1u) {{ mx = max(mx, ms[w * {G}u + r]); }}
    let wt = select(exp(m[r] - mx), 1.0, m[r] == mx);
    var lr = l[r] * wt;
{shuf("lr")}    if ({writer}) {{ ls[wi * {G}u + r] = lr; }}
{"".join(f"    var {x}r = {x}[r] * wt;{nl}{shuf(f'{x}r')}    {x}[r] = {x}r;{nl}" for x in halves)}  }}
"""
    for r0 in range(0, G, RB):
        r1 = min(G, r0 + RB)
        merge += f"""  if ({holder}) {{
    for (var r = {r0}u; r < {r1}u; r = r + 1u) {{
{"".join(f"      pvs[(wi * {RB}u + r - {r0}u) * {D4}u + {word[x]}] = {x}[r];{nl}" for x in halves)}    }}
  }}
  workgroupBarrier();
"""
        if r0 == 0:
            merge += f"""  if (lid < {G}u) {{
    var mx = {low};
    var lt = 0.0;
    for (var w = 0u; w < {NW}u; w = w + 1u) {{
      mx = max(mx, ms[w * {G}u + lid]);
      lt = lt + ls[w * {G}u + lid];
    }}
    part[((h * {G}u + lid) * {ns}u + sp) * {PW}u] = vec4<f32>(mx, lt, 0.0, 0.0);
  }}
"""
        merge += f"""  for (var j = lid; j < {(r1 - r0) * D4}u; j = j + {WGL}u) {{
    var t = vec4<f32>(0.0);
    for (var w = 0u; w < {NW}u; w = w + 1u) {{ t = t + pvs[w * {RB * D4}u + j]; }}
    part[((h * {G}u + {r0}u + j / {D4}u) * {ns}u + sp) * {PW}u + 1u + j % {D4}u] = t;
  }}
  workgroupBarrier();
"""
    pd_decl = "" if sub else f"var<workgroup> pd: array<f32, {U * WGL}>;\n"
    nout = G * D4
    pv_len = max(NW * RB * D4, nout * max(1, WGL // nout) if fold else 0)
    src += f"""
fn q_word(h: u32, j: u32) -> vec4<f32> {{
  return {q_load};
}}

{pd_decl}var<workgroup> qs: array<vec4<f32>, {G * D4}>;
var<workgroup> ms: array<f32, {NW * G}>;
var<workgroup> ls: array<f32, {NW * G}>;
var<workgroup> pvs: array<vec4<f32>, {pv_len}>;
"""
    src += _folded_decls(G, ns) if fold else ""
    src += _split_entry(WGL, T, C) + f"  let e = lid % {LW}u;\n  let rg = lid / {LW}u;\n"
    src += body + merge
    src += _folded_combine(G, D4, ns, PW, epilogue) if fold else ""
    src += "}\n"
    parts = 4 * heads * G * ns * PW  # 4-byte words
    extra = 0 if score is None else sum(4 * min(leaf.size, heads * G * C)
                                        for leaf in score[1] if not leaf.param)
    kv_bytes = 2 * heads * C * D * (2 if wide else 4)
    name = "attention_lanes1" if fold else "attention_lanes"
    k1 = Kernel(name, src, bindings, (ns, heads, 1),
                4 * (heads * G * D + parts) + kv_bytes + extra
                + (4 * (heads * G * D + parts) + epilogue_bytes(epilogue, heads * G * D)
                   if fold else 0))
    if fold:
        return [k1], parts, heads
    return [k1, combine_rows(heads * G, D, ns, epilogue)], parts, 0


def _folded_decls(g: int, ns: int, flag: bool = True) -> str:
    """Workgroup memory of ``_merge_splits``: each split's maximum (then weight) and sum
    per q row, partial maxima and sums, each row's total; and the folded combine's flag."""
    return (f"var<workgroup> cw: array<f32, {ns * g}>;\nvar<workgroup> cl: array<f32, {ns * g}>;\n"
            f"var<workgroup> cr: array<f32, {WGL}>;\nvar<workgroup> cs: array<f32, {g}>;\n"
            + ("var<workgroup> flag: u32;\n\n" if flag else "\n"))


def _folded_combine(g: int, d4: int, ns: int, pw: int, epilogue: Epilogue | None) -> str:
    """The tail of "lanes1": the head's last workgroup to finish merges its ``ns`` splits
    into the output, or its ``epilogue`` (``attention.last_of_head``)."""
    return (last_of_head(ns) + f"  let row0 = h * {g}u;\n"
            + _merge_splits(g, d4, ns, pw, epilogue))


def combine_rows(rows: int, d: int, ns: int, epilogue: Epilogue | None = None) -> Kernel:
    """"lanes"' second launch: one workgroup per q row merges the row's ``ns`` splits
    (``_merge_splits``) from the partials into the output, or its ``epilogue``
    (``attention.Epilogue``)."""
    d4 = d // 4
    out_src, out_bindings = out_decl(epilogue, True, 1)
    src = decl(0, "part", "vec4<f32>", "read") + out_src
    src += _folded_decls(1, ns, flag=False)
    src += f"var<workgroup> pvs: array<vec4<f32>, {d4 * max(1, WGL // d4)}>;\n"
    gx = min(rows, 65535)
    src += f"""
@compute @workgroup_size({WGL})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let row0 = wid.y * {gx}u + wid.x;
  if (row0 >= {rows}u) {{ return; }}
{_merge_splits(1, d4, ns, d4 + 1, epilogue)}}}
"""
    return Kernel("attention_combine_rows", src, ["read", *out_bindings], (gx, -(-rows // gx), 1),
                  4 * rows * (ns * (d + 4) + d) + epilogue_bytes(epilogue, rows * d))


def _merge_splits(g: int, d4: int, ns: int, pw: int, epilogue: Epilogue | None = None) -> str:
    """The splits of q rows ``row0 .. row0 + g`` (flat over heads) merged into their
    output rows: ``Σ_s acc_s e^{m_s - M} / Σ_s l_s
    e^{m_s - M}``. The splits' maxima and sums are read at once (one load each, spread
    over the workgroup) and reduced by ``WGL / g`` invocations a q row; each output word is
    summed by ``WGL / (g · d4)`` invocations, each with 8 partial loads in flight;
    ``epilogue``: written instead of the output (``attention.Epilogue``)."""
    nout = g * d4
    sgs = max(1, WGL // nout)  # split-groups summing one output word
    tp = WGL // g  # invocations a q row
    low = neg_inf()
    uc = 8
    xs = range(uc)
    loads = "".join(f"      let x{i} = part[(base + s + {i * sgs}u) * {pw}u + w];\n" for i in xs)
    fma = " + ".join(f"x{i} * cw[r * {ns}u + s + {i * sgs}u]" for i in xs)
    return f"""  for (var j = lid; j < {ns * g}u; j = j + {WGL}u) {{
    let st = part[(row0 * {ns}u + j) * {pw}u];
    cw[j] = st.x;
    cl[j] = st.y;
  }}
  workgroupBarrier();
  let cr_r = lid / {tp}u;
  let cr_t = lid % {tp}u;
  var cmx = {low};
  if (cr_r < {g}u) {{
    for (var s = cr_t; s < {ns}u; s = s + {tp}u) {{ cmx = max(cmx, cw[cr_r * {ns}u + s]); }}
  }}
  cr[lid] = cmx;
  workgroupBarrier();
  var ctot = 0.0;
  if (cr_r < {g}u) {{
    for (var t = 0u; t < {tp}u; t = t + 1u) {{ cmx = max(cmx, cr[cr_r * {tp}u + t]); }}
    for (var s = cr_t; s < {ns}u; s = s + {tp}u) {{
      let mv = cw[cr_r * {ns}u + s];
      let w = select(exp(mv - cmx), 1.0, mv == cmx);
      cw[cr_r * {ns}u + s] = w;
      ctot = ctot + cl[cr_r * {ns}u + s] * w;
    }}
  }}
  workgroupBarrier();
  cr[lid] = ctot;
  workgroupBarrier();
  if (cr_r < {g}u && cr_t == 0u) {{
    var t = 0.0;
    for (var x = 0u; x < {tp}u; x = x + 1u) {{ t = t + cr[lid + x]; }}
    cs[cr_r] = t;
  }}
  for (var j = lid; j < {nout * sgs}u; j = j + {WGL}u) {{
    let o = j % {nout}u;
    let r = o / {d4}u;
    let base = (row0 + r) * {ns}u;
    let w = 1u + o % {d4}u;
    var t = vec4<f32>(0.0);
    var s = j / {nout}u;
    while (s + {(uc - 1) * sgs}u < {ns}u) {{
{loads}      t = t + {fma};
      s = s + {uc * sgs}u;
    }}
    while (s < {ns}u) {{
      t = t + part[(base + s) * {pw}u + w] * cw[r * {ns}u + s];
      s = s + {sgs}u;
    }}
    pvs[j] = t;
  }}
  workgroupBarrier();
  for (var o = lid; o < {nout}u; o = o + {WGL}u) {{
    var t = vec4<f32>(0.0);
    for (var x = 0u; x < {sgs}u; x = x + 1u) {{ t = t + pvs[x * {nout}u + o]; }}
{store(epilogue, True, f'row0 * {d4}u + o', f't / cs[o / {d4}u]')}  }}
"""
