"""Decode attention in two launches (flash-decoding): scores, their element-wise transform
(scale, mask), softmax and probs·V fused over splits of the cache.

The graph spells decode attention as ``matmul(q, transpose(K))`` → element-wise chain
(``* scale``, ``where(mask, s, lowest)``) → ``softmax(axis=-1)`` → ``matmul(p, V)``.
One by one that is five launches per layer and a score buffer of heads × capacity written
and read three times; at long contexts it dominated the step (PERFORMANCE.md). Here:

* pass 1, one workgroup per (batch·kv-head, split of ``T`` cache rows): the q rows of the
  head into workgroup memory, one score per (q row, cache row) through the graph's own
  element-wise chain (``kernels/fused.py``, the score as its *param* leaf), the split's
  row maximum ``m``, ``p = exp(s - m)``, ``l = Σ p`` and ``acc = Σ p · V``: partials
  ``(m, l, acc[D])`` per (row, split).
* pass 2, one invocation per output element: ``Σ_s acc_s e^{m_s - M} / Σ_s l_s e^{m_s - M}``.

Every K and V byte of the capacity is read once (as the unfused kernels did: the mask,
not the kernel, decides which rows count). Masked rows carry the chain's value (the
exporter's float32 ``lowest``, or -inf), which weighs 0 as in softmax; a split whose rows
are all masked contributes nothing to the combine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .common import Kernel, decl, neg_inf
from .fused import FusedOp, Leaf, functions, leaf_decls
from .matmul import VectorSource
from .reduce import tree

WG = 128  # pass 1 workgroup
WG2 = 256  # combine workgroup
SPLITS = 32  # splits per head a long cache aims at
GROUP_ROWS = 2  # q rows a flash_decode workgroup scores at most, by default (PERFORMANCE.md)
F16_LOADS = ("wide", "vec4")  # how flash_decode loads a float16 cache (its f16_loads)
#: splits a row's combine computed by a product (``combine_vector``) loads straight-line;
#: beyond, loops
COMBINE_UNROLL = 16


#: a 16-byte word of 8 halves, widened (exact): halves 0-3 and 4-7
UNPACK = ("\nfn unpack_lo(w: vec4<u32>) -> vec4<f32> {\n"
          "  return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));\n}\n"
          "fn unpack_hi(w: vec4<u32>) -> vec4<f32> {\n"
          "  return vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));\n}\n")


def _trees(g: int, wg: int) -> str:
    """WGSL ``tree_max`` and ``tree_sum``: ``red[r * wg]`` becomes the maximum (sum) of
    ``red[r * wg .. r * wg + wg)`` for each of the ``g`` rows; every invocation calls them."""
    out = ""
    for name, comb in (("tree_max", "max({a}, {b})"), ("tree_sum", "{a} + {b}")):
        a, b = f"red[r * {wg}u + lid]", f"red[r * {wg}u + lid + st]"
        out += f"""fn {name}(lid: u32) {{
  for (var st = {wg // 2}u; st > 0u; st = st >> 1u) {{
    if (lid < st) {{
      for (var r = 0u; r < {g}u; r = r + 1u) {{
        {a} = {comb.format(a=a, b=b)};
      }}
    }}
    workgroupBarrier();
  }}
}}

"""
    return out


@dataclass
class RowReduce:
    """A sum (``op`` "reduce_sum") or mean ("reduce_mean") over each row of ``count``
    elements that a chain reads as its *param* leaf (a per-head RMS norm's mean of
    squares: ``wgpu_impl/row_stat``), computed by the kernel evaluating the chain row by
    row instead of by a launch of its own: ``src`` declares the reduction's leaves (its
    ``bindings``) and functions; ``load``: element ``{}`` (flat) of its input; ``row_of``:
    the reduction's row the chain's row ``{}`` reads (a table in ``src`` where the rows
    are permuted)."""

    op: str
    count: int
    src: str
    bindings: list[str]
    load: str
    row_of: str = "{}"


#: the param name a q chain's row statistic is passed as (``RowReduce``)
Q_STAT = "qn"


def row_stat(red: RowReduce, row: str, name: str, wg: int, scratch: str,
             sub: int | None) -> str:
    """WGSL every invocation of a ``wg``-wide workgroup runs in uniform control flow:
    ``let {name}``, ``red`` over row ``row`` (an expression), with workgroup memory
    ``scratch`` (f32, at least ``wg`` floats, ``wg / sub`` where a ``sub``-wide subgroup
    divides ``wg``) free to use; it ends in a barrier, so ``scratch`` is free again."""
    load = red.load.format(f"({red.row_of.format(row)}) * {red.count}u + {name}_e")
    out = (f"  var {name}_a = 0.0;\n"
           f"  for (var {name}_e = lid; {name}_e < {red.count}u; {name}_e = {name}_e + {wg}u) "
           f"{{ {name}_a = {name}_a + f32({load}); }}\n")
    if sub and wg % sub == 0 and wg >= sub:
        out += (f"  let {name}_g = subgroupAdd({name}_a);\n"
                f"  if (lid % {sub}u == 0u) {{ {scratch}[lid / {sub}u] = {name}_g; }}\n"
                f"  workgroupBarrier();\n  var {name}_t = {scratch}[0];\n"
                f"  for (var i = 1u; i < {wg // sub}u; i = i + 1u) "
                f"{{ {name}_t = {name}_t + {scratch}[i]; }}\n")
    else:
        out += (f"  {scratch}[lid] = {name}_a;\n" + tree("{a} + {b}", scratch, wg)
                + f"  let {name}_t = {scratch}[0];\n")
    scale = f" / {float(red.count)!r}" if red.op == "reduce_mean" else ""
    return out + f"  let {name} = {name}_t{scale};\n  workgroupBarrier();\n"


def q_stats(red: RowReduce | None, rows: int, first_row: str, wg: int, scratch: str,
            sub: int | None) -> str:
    """WGSL (uniform control flow) computing ``qn_r[r]``, the q chain's row statistic of
    each of a workgroup's ``rows`` q rows (global q row ``first_row + r``), before its q
    rows are loaded (``_q_source`` with ``red``); empty without."""
    if red is None:
        return ""
    return (f"  var qn_r: array<f32, {rows}>;\n"
            f"  for (var r = 0u; r < {rows}u; r = r + 1u) {{\n"
            + row_stat(red, f"{first_row} + r", "qs_t", wg, scratch, sub)
            + "  qn_r[r] = qs_t;\n  }\n")


def _q_source(q_chain: tuple[Sequence[FusedOp], Sequence[Leaf]] | None, head_words: int,
              vec: bool, red: RowReduce | None = None,
              row_words: int = 1) -> tuple[str, list[str], str]:
    """(declarations, bindings, the expression of q word ``j`` of head ``h``): q bound as a
    buffer, or computed from its element-wise chain's leaves (``flash_decode``'s q_chain);
    ``red``: the chain's row statistic (``RowReduce``), its leaves bound after the
    chain's, each row's value read from ``qn_r`` (``q_stats``) at the workgroup's row of
    word ``jj`` (``row_words`` words a row)."""
    if q_chain is None:
        return (decl(0, "q", "vec4<f32>" if vec else "f32", "read"), ["read"],
                f"q[h * {head_words}u + j]")
    qops, qleaves = q_chain
    src, bindings = leaf_decls(qleaves, 0, "q_")
    fsrc, args = functions(qops, qleaves, "q_")
    src += fsrc
    if red is not None:
        src += red.src
        bindings += red.bindings
    assert args == ([Q_STAT] if red is not None else []), "q's chain reads its row statistic"
    stat = f", qn_r[jj / {row_words}u]" if red is not None else ""
    qf = f"q_v{len(qops) - 1}"
    base = f"(h * {head_words}u + j)"
    q_load = (f"vec4<f32>({qf}(4u * {base}{stat}), {qf}(4u * {base} + 1u{stat}), "
              f"{qf}(4u * {base} + 2u{stat}), {qf}(4u * {base} + 3u{stat}))" if vec
              else f"{qf}({base}{stat})")
    return src, bindings, q_load


def _kv_and_score(src: str, bindings: list[str], kvt: str, wide: bool,
                  score: tuple[Sequence[FusedOp], Sequence[Leaf]] | None,
                  written: bool = False) -> tuple[str, list[str], str]:
    """``src`` and ``bindings`` (q's) followed by K and V as ``kvt`` arrays (with the
    unpacking functions of 8-half words where ``wide``; read-write where ``written``: the
    row write folded in) and the score chain's leaves; and the score expression
    (``_score_source``)."""
    acc = "rw" if written else "read"
    src += decl(len(bindings), "k", kvt, acc) + decl(len(bindings) + 1, "v", kvt, acc)
    bindings = [*bindings, acc, acc]
    if wide:
        src += UNPACK
    ssrc, sb, fn_call = _score_source(score, len(bindings))
    return src + ssrc, bindings + sb, fn_call


def _score_source(score: tuple[Sequence[FusedOp], Sequence[Leaf]] | None,
                  first: int) -> tuple[str, list[str], str]:
    """(declarations, bindings from ``first`` on, the expression of a score from ``raw`` at
    score index ``si``): the graph's element-wise chain between q·Kᵀ and the softmax."""
    if score is None:
        return "", [], "raw"
    ops, leaves = score
    lsrc, lb = leaf_decls(leaves, first)
    fsrc, takes_s = functions(ops, leaves)
    last = len(ops) - 1
    return lsrc + fsrc, lb, f"v{last}(si, raw)" if takes_s else f"v{last}(si)"


@dataclass
class Epilogue:
    """An element-wise function of the attention's output the combine writes instead of
    the output (Qwen3.5's output gate, ``o · sigmoid(gate)``), so it costs no launch of its
    own: ``ops`` and ``leaves`` as ``kernels/fused`` takes them, the output the *param*
    leaf named ``ao`` (read at the index the root is evaluated at); the other leaves bind
    after the combine's output."""

    ops: Sequence[FusedOp]
    leaves: Sequence[Leaf]

    @property
    def out_type(self) -> str:
        """The WGSL type of what the combine writes (the root's)."""
        return self.ops[-1].out_type

    def source(self, first: int) -> tuple[str, list[str]]:
        """(the leaves' declarations, from binding ``first`` on, and the functions; their
        bindings), every name prefixed ``ep_``."""
        decls, bindings = leaf_decls(self.leaves, first, "ep_")
        fsrc, args = functions(self.ops, self.leaves, "ep_")
        assert args == ["ao"], "the root reads the attention's output"
        return decls + fsrc, bindings

    def call(self, index: str) -> str:
        """The root's element at flat ``index``, given the output's there as ``ao``."""
        return f"ep_v{len(self.ops) - 1}({index}, ao)"


def out_decl(ep: Epilogue | None, vec: bool, binding: int,
             counters: bool = False) -> tuple[str, list[str]]:
    """(declarations, bindings from ``binding`` on) of what a combine writes: the output
    (16-byte words where ``vec``), or the epilogue's root (elements of its type); then,
    where ``counters`` (a one-launch attention's), its heads' counters; then the
    epilogue's leaves."""
    src = decl(binding, "out", ep.out_type if ep else "vec4<f32>" if vec else "f32", "rw")
    bindings = ["rw"]
    if counters:
        src += decl(binding + 1, "cnt", "atomic<u32>", "rw")
        bindings.append("rw")
    if ep is None:
        return src, bindings
    ep_src, ep_bindings = ep.source(binding + len(bindings))
    return src + ep_src, bindings + ep_bindings


def store(ep: Epilogue | None, vec: bool, word: str, value: str, pad: str = "    ") -> str:
    """WGSL storing the combined output word ``value`` (a vec4 where ``vec``) at output word
    ``word``: as it is, or each element through the epilogue at its flat index."""
    if ep is None:
        return f"{pad}out[{word}] = {value};\n"
    if not vec:
        return (f"{pad}{{\n{pad}  let ao = {value};\n{pad}  let ei = {word};\n"
                f"{pad}  out[ei] = {ep.call('ei')};\n{pad}}}\n")
    out = f"{pad}{{\n{pad}  let ov = {value};\n{pad}  let e4 = 4u * ({word});\n"
    for c, x in enumerate("xyzw"):
        out += f"{pad}  {{ let ao = ov.{x}; out[e4 + {c}u] = {ep.call(f'e4 + {c}u')}; }}\n"
    return out + f"{pad}}}\n"


@dataclass
class RowWrites:
    """The new K and V rows a pass-1 workgroup writes before it reads its split (the row
    write folded into attention: ``match_attention.fold_row_writes``): scatter_nd's index
    tuples (``tuples`` of ``rank`` int32 into the caches' (B, H, C, D) ``shape``, negative
    ones from the end, out-of-range ones skipped) and each cache's update source: None
    (a bound buffer of the updates) or (declarations from its first binding, bindings, the
    function giving update element ``i``: ``fusion.Group.input_source``); ``guarded``:
    nothing is written where the capacity check failed (the status bound last)."""

    idx_type: str
    tuples: int
    shape: tuple[int, ...]
    updates: tuple[tuple[str, list[str], str] | None, tuple[str, list[str], str] | None]
    guarded: bool
    #: each update's row statistic (a per-head norm of the new key: ``RowReduce``), its
    #: leaves bound after the update's, the row's value the update function's last argument
    stats: tuple[RowReduce | None, RowReduce | None] = (None, None)


def _row_writes(w: RowWrites, first: int, kvt: str, words: int, per: int, kv: str,
                wg: int, scratch: str = "red", sub: int | None = None,
                flag: str | None = None) -> tuple[str, list[str], str]:
    """(declarations from binding ``first``, their access, the body at the kernel's start):
    every tuple that addresses head ``h`` at a row of this split has its K and V rows
    written (``words`` words of ``per`` elements a row, as ``kvt``, the caches' type ``kv``),
    then a ``storageBarrier()``, so the split's loads read the new rows; every invocation
    reaches it. Only this workgroup reads those rows: a row lies in one split of one head.
    An update's row statistic (``RowWrites.stats``) is computed for every tuple by every
    workgroup (uniform control flow: the tuple's target is known only from the index
    tensor), with workgroup memory ``scratch`` and subgroup width ``sub`` (``row_stat``).
    ``flag``: a variable of that name set where this workgroup wrote a row (its loads of
    the split made before the write are stale)."""
    src = decl(first, "widx", w.idx_type, "read")
    binds = ["read"]
    loads = []
    stats = ""
    for j, (u, red) in enumerate(zip(w.updates, w.stats, strict=True)):
        if u is None:
            src += decl(first + len(binds), f"wupd{j}", kv, "read")
            binds.append("read")
            loads.append(f"wupd{j}[{{}}]")
        else:
            usrc, ub, fn = u
            src += usrc
            binds += list(ub)
            arg = ""
            if red is not None:
                src += red.src
                binds += red.bindings
                stats += row_stat(red, "tu", f"wn{j}", wg, scratch, sub)
                arg = f", wn{j}"
            loads.append(f"{fn}({{}}{arg})")
    if w.guarded:
        src += decl(first + len(binds), "wstatus", "u32", "read")
        binds.append("read")
    B, H, C, D = w.shape
    rank = len(w.shape) - 1
    body = f"  var {flag} = false;\n" if flag else ""
    body += f"  for (var tu = 0u; tu < {w.tuples}u; tu = tu + 1u) {{\n{stats}    var ok = true;\n"
    for j, dim in enumerate(w.shape[:rank]):
        body += (f"    var t{j} = i32(widx[tu * {rank}u + {j}u]);\n"
                 f"    if (t{j} < 0) {{ t{j} = t{j} + {dim}; }}\n"
                 f"    ok = ok && t{j} >= 0 && t{j} < {dim};\n")
    guard = " && wstatus[0] == 0u" if w.guarded else ""
    body += (f"    let row = u32(max(t2, 0));\n"
             f"    if (ok && u32(t0) * {H}u + u32(t1) == h && row >= c0 && row < c0 + n{guard}) {{\n"
             + (f"      {flag} = true;\n" if flag else "") +
             f"      for (var e = lid; e < {words}u; e = e + {wg}u) {{\n"
             f"        let ub = tu * {D}u + e * {per}u;\n")
    for buf, load in zip(("k", "v"), loads, strict=True):
        el = [load.format(f"ub + {i}u") for i in range(per)]
        if kvt == "vec4<u32>":  # 8 halves a word, packed as the loads unpack them
            val = "vec4<u32>(" + ", ".join(
                f"pack2x16float(vec2<f32>(f32({el[2 * i]}), f32({el[2 * i + 1]})))"
                for i in range(4)) + ")"
        elif per == 4:
            val = f"{kvt}({', '.join(el)})"
        else:
            val = el[0]
        body += f"        {buf}[(h * {C}u + row) * {words}u + e] = {val};\n"
    body += "      }\n    }\n  }\n  storageBarrier();\n"
    return src, binds, body


def _split_entry(wg: int, rows: int, capacity: int) -> str:
    """The entry point's head: head ``h`` and split ``sp`` from the workgroup, the split's
    first cache row ``c0`` and its row count ``n`` (the last split may be short)."""
    return f"""@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let h = wid.y;
  let sp = wid.x;
  let c0 = sp * {rows}u;
  let n = min({rows}u, {capacity}u - c0);
"""


#: score rows a split must keep room for when probs·V reduces in workgroup memory
PV_MIN_ROWS = 128


def _fixed_floats(q_rows: int, d: int) -> int:
    """Workgroup memory (floats) pass 1 always needs: the q rows and reduction scratch."""
    return q_rows * d + q_rows * WG + 16


def _layout(q_rows: int, d: int, shared_floats: int,
            wide: bool = False) -> tuple[bool, int, int, bool]:
    """(vec4, load words per row, row-groups for probs·V, whether probs·V reduces in
    workgroup memory) for one head's q rows. ``wide``: K and V load as ``vec4<u32>`` words
    of 8 halves (a float16 cache, d % 8 == 0); the probs·V sums still pass through
    workgroup memory 4 floats an invocation (two rounds), so it needs the same memory."""
    vec = d % 4 == 0
    words = d // 8 if wide and d % 8 == 0 else d // 4 if vec else d
    groups = WG // words if words <= WG and WG % words == 0 else 1
    lanes = 4 if vec else 1
    # (the reduction's scratch only where it leaves room for PV_MIN_ROWS score rows a split:
    # else it would cut the splits to a few dozen rows, 172 splits a head for 16 q rows
    # over 8227 rows on the H200's 48 KB, where the plain sum's G · d/4 invocations are
    # enough work)
    shared_pv = groups > 1 and (_fixed_floats(q_rows, d) + q_rows * WG * lanes
                                + q_rows * PV_MIN_ROWS <= shared_floats)
    return vec, words, groups if shared_pv else 1, shared_pv


def split_rows(capacity: int, q_rows: int, d: int, shared_floats: int,
               splits: int = SPLITS, wide: bool = False) -> int:
    """Cache rows per split: about ``splits`` splits per head on long caches (enough
    workgroups in flight, a short combine), 128 to 512 rows (whole workgroup passes), within
    workgroup memory (q rows, scores, reduction scratch)."""
    vec, _, _, shared_pv = _layout(q_rows, d, shared_floats, wide)
    t = min(512, max(WG, -(-capacity // splits // WG) * WG))
    used = _fixed_floats(q_rows, d) + (q_rows * WG * (4 if vec else 1) if shared_pv else 0)
    room = (shared_floats - used) // max(1, q_rows)
    while t > 32 and t > room:
        t //= 2
    return max(1, min(t, capacity))


def q_row_groups(q_rows: int, group_rows: int | None = None, d: int | None = None,
                 shared_floats: int | None = None) -> int:
    """q rows a ``flash_decode`` workgroup scores: the largest divisor of ``q_rows`` no
    larger than ``group_rows`` (None: ``GROUP_ROWS``), so every group is as wide (a K-token
    verify's head: 2K groups where a token has 4 GQA rows); given ``d`` and
    ``shared_floats``, also one whose rows ``fits`` workgroup memory (1 at the least), so
    a head's row count only sets the grid, never the memory."""
    cap = max(1, min(q_rows, group_rows or GROUP_ROWS))
    return next(g for g in range(cap, 0, -1) if q_rows % g == 0
                and (g == 1 or d is None or shared_floats is None or fits(g, d, shared_floats)))


def fits(q_rows: int, d: int, shared_floats: int) -> bool:
    """Whether a workgroup's q rows, the reduction scratch and 32 score rows fit in
    workgroup memory (the compiler keeps the generic kernels where one row does not)."""
    return _fixed_floats(q_rows, d) + q_rows * 32 <= shared_floats


def flash_decode(heads: int, q_rows: int, capacity: int, d: int,
                 score: tuple[Sequence[FusedOp], Sequence[Leaf]] | None,
                 shared_floats: int,
                 q_chain: tuple[Sequence[FusedOp], Sequence[Leaf]] | None = None,
                 splits: int = SPLITS, kv: str = "f32",
                 f16_loads: str = "wide",
                 writes: RowWrites | None = None,
                 group_rows: int | None = None,
                 subgroup: int | None = None,
                 epilogue: Epilogue | None = None,
                 q_red: RowReduce | None = None,
                 loads_first: bool = False,
                 last: bool = False) -> tuple[Kernel, Kernel | None, int]:
    """(pass 1, pass 2, partial-buffer elements) for q (heads, q_rows, d), K and V
    (heads, capacity, d), output (heads, q_rows, d).

    ``loads_first`` (``KernelOptions.attention_loads``): where each invocation scores at
    most one cache row in one batch of loads (a split of at most ``WG`` rows, its K row's
    words all loaded at once) its K words, and the V words loaded before the scores
    (``HOIST_V``), are loaded at the kernel's start, before a folded row write and q's
    chain, so their latency passes under that chain; the workgroup that wrote a row of
    its split loads them again after the write's barrier.

    ``last`` (``KernelOptions.attention_combine`` "last"; 16-byte partials only): no
    combine launch (None in its place): the last workgroup of each (KV head, q-row group)
    to write its partials combines its rows' splits (``last_combine``), the output (or the
    ``epilogue``'s root), ``heads · GS`` zeroed counters and the epilogue's leaves bound
    after the row write's bindings.

    ``q_red``: the row statistic ``q_chain`` reads (``RowReduce``: a per-head norm of q),
    each workgroup reducing its q rows before it loads them (``q_stats``).

    ``subgroup``: the adapter's fixed subgroup width (``KernelOptions.attention_sync``
    "subgroups"), where it divides the workgroup: the split's maximum and sum are each a
    ``subgroupMax``/``subgroupAdd`` and one barrier instead of a tree of seven; where the V
    words of an invocation's rows are few (``HOIST_V``; the wide float16 loads) they are
    loaded before the scores, so their latency passes under the scores and the statistics;
    probs·V's row-groups are summed by ``subgroupShuffleXor`` within a subgroup and the
    subgroups through workgroup memory (one barrier, not four); the combine's split
    weights by all its invocations (``_combine``).

    ``writes``: the row write folded in (``RowWrites``): K and V are bound read-write and
    each workgroup first writes the new rows of its head that fall in its split, its
    bindings after the partials'.

    ``epilogue``: an element-wise function of the output the combine writes instead
    (``Epilogue``).

    ``score``: the element-wise chain applied to each raw score, as fused ops over the
    (heads, q_rows, capacity) score layout whose one *param* leaf is the raw score;
    its other leaves bind after q, K, V (then the partials). None: scores used raw.
    ``q_chain``: q is not a buffer but an element-wise group (RoPE of the query) whose
    leaves take q's place in the bindings; each workgroup computes its head's q rows.
    ``splits``: the splits per head a long cache aims at (``split_rows``).
    ``kv``: the K and V buffers' element type: "f16" (a float16 cache) is widened to
    float32 as each element is loaded; everything else stays float32.
    ``f16_loads``: how a float16 cache is loaded. "wide" (when d % 8 == 0): K and V bound
    as ``array<vec4<u32>>``, 16-byte loads of 8 halves each, widened with
    ``unpack2x16float`` (core WGSL, exact), so a row of d halves takes d/8 loads; the q·K
    pass issues up to 16 of them before use, and probs·V gives each invocation 8 columns.
    "vec4" (and "wide" when d % 8 != 0): ``vec4<f16>`` loads (8 bytes, d/4 a row), or
    ``f16`` ones when d % 4 != 0. Either way the split, the partials and the byte count
    (2 bytes an element) are the same.

    Pass 1 gives each invocation whole cache rows: it loads its K row once (vec4 loads
    when d % 4 == 0; 8-half words of a float16 cache, above) and scores every q row
    against it; maxima and sums are tree reductions in workgroup memory. probs·V splits
    the rows among row-groups of invocations, each invocation 4 columns of V (8 with the
    wide float16 loads) for all q rows (V read once, coalesced),
    the row-groups summed in workgroup memory: short loops, no long serial chains.
    Partials per (q row, split): ``m, l, 0, 0, acc[d]`` (acc 16-byte aligned).

    ``group_rows``: q rows a workgroup scores (``q_row_groups``; None: ``GROUP_ROWS``). A
    K-token verify's head has K times a step's q rows; in one workgroup they outgrow the
    workgroup memory the probs·V row-groups need and multiply each invocation's serial work
    (16 rows over 8227 took 0.42 ms a layer on the H200: PERFORMANCE.md "A speculative
    verify"), so the rows are split into groups along the grid's z, each workgroup scoring
    ``GL`` rows as a one-token step's does, every group reading the split's K and V (from L2
    after the first: the byte count says so).
    """
    if f16_loads not in F16_LOADS:
        raise ValueError(f"f16_loads = {f16_loads!r}; accepted: {', '.join(F16_LOADS)}")
    wide = kv == "f16" and f16_loads == "wide" and d % 8 == 0
    GL = q_row_groups(q_rows, group_rows, d, shared_floats)  # q rows a workgroup
    GS = q_rows // GL  # workgroups a split (grid z)
    T = split_rows(capacity, GL, d, shared_floats, splits, wide)
    ns = -(-capacity // T)
    G, D, C = q_rows, d, capacity
    # LW: K/V load words per cache row (d/8 wide, d/4 vec4, d scalar); D4: q words per row
    vec, LW, R, shared_pv = _layout(GL, D, shared_floats, wide)
    # (at least 4 lanes: the maxima's and the sums' slots a subgroup share a row's WG of red)
    sub = subgroup if subgroup and subgroup >= 4 and WG % subgroup == 0 else None
    NSG = WG // sub if sub else 0  # subgroups a workgroup
    D4 = D // 4 if vec else D
    P = D + 4
    vt = "vec4<f32>" if vec else "f32"
    src, bindings, q_load = _q_source(q_chain, G * D4, vec, q_red, D4)
    kvt = "vec4<u32>" if wide else vt.replace("f32", kv)  # K and V as loaded
    # a load of K or V as float32 (exact for float16)
    ld = (lambda x: x) if kv == "f32" else (lambda x: f"{vt}({x})")
    src, bindings, fn_call = _kv_and_score(src, bindings, kvt, wide, score,
                                           writes is not None)
    src += decl(len(bindings), "part", vt, "rw")
    bindings.append("rw")
    # K row loads issued U at a time before use: enough bytes in flight per invocation
    U = next(u for u in (16, 8, 4, 2, 1) if LW % u == 0)
    first = loads_first and T <= WG and U == LW  # one row an invocation, one batch
    wrote = "wrote" if first and writes is not None else None
    write_body = ""
    if writes is not None:
        wsrc, wb, write_body = _row_writes(writes, len(bindings), kvt, LW,
                                           8 if wide else 4 if vec else 1, kv, WG, "red", sub,
                                           wrote)
        src += wsrc
        bindings += wb
    last = last and vec
    if last:
        osrc, ob = out_decl(epilogue, True, len(bindings), counters=True)
        src += osrc
        bindings += ob
    low = neg_inf()
    pw = P // 4 if vec else P  # partial words per (row, split)
    k_at = "k[kb + e0 + {}u]"
    k_first = k_again = ""
    if first:  # the invocation's row's words into variables at the start
        k_first, k_again = first_k_words(f"(h * {C}u + c0 + min(lid, n - 1u)) * {LW}u", U,
                                         wrote is not None)
        k_at = "kw{}"
    if wide:  # word w of the row holds q words 2w and 2w + 1
        k_loads = "".join(f"      let k{j} = {k_at.format(j)};\n" for j in range(U))
        k_loads += "".join(f"      let k{j}l = unpack_lo(k{j});\n      let k{j}h = unpack_hi(k{j});\n"
                           for j in range(U))
        dot = lambda j: (f"dot(qs[qb + {2 * j}u], k{j}l) + "  # noqa: E731
                         f"dot(qs[qb + {2 * j + 1}u], k{j}h)")
        q_at = f"        let qb = r * {D4}u + 2u * e0;\n"
    else:
        k_loads = "".join(f"      let k{j} = {ld(k_at.format(j))};\n" for j in range(U))
        dot = (lambda j: f"dot(qs[r * {D4}u + e0 + {j}u], k{j})") if vec else (  # noqa: E731
            lambda j: f"qs[r * {D4}u + e0 + {j}u] * k{j}")
        q_at = ""
    k_dots = " + ".join(dot(j) for j in range(U))
    head_words = 1 if vec else 4  # m, l, 0, 0 in words
    l_of = "l_total(r)" if sub else f"red[r * {WG}u]"  # the split's sum of row r
    if vec:
        stats = f"  part[pb] = vec4<f32>(m[r], {l_of}, 0.0, 0.0);\n"
    else:
        stats = (f"  part[pb] = m[r];\n  part[pb + 1u] = {l_of};\n"
                 "  part[pb + 2u] = 0.0;\n  part[pb + 3u] = 0.0;\n")
    hr = f"h * {G}u + q0 + r"  # the workgroup's q row r among the head's
    v_at = ld(f"v[(h * {C}u + c0 + c) * {D4}u + e]")  # V row c, column (word) e
    part_at = f"part[(({hr}) * {ns}u + sp) * {pw}u + {head_words}u"  # + word, ]
    v_early = v_again = ""  # V loads issued before the scores (``HOIST_V``)
    if wide and shared_pv and sub and sub % LW == 0:
        v_early, pv, pv_decl, v_again = _pv_by_subgroups(GL, T, R, LW, C, sub, part_at,
                                                         wrote is not None)
    elif wide and shared_pv:
        # the row-groups' sums pass through pvs in two rounds (columns 0-3 of each word, then
        # 4-7)
        rounds = ""
        for x, arr in (("0u", "a"), ("1u", "ah")):
            rounds += f"""  for (var r = 0u; r < {GL}u; r = r + 1u) {{ pvs[r * {WG}u + lid] = {arr}[r]; }}
  workgroupBarrier();
  for (var j = lid; j < {GL * LW}u; j = j + {WG}u) {{
    let r = j / {LW}u;
    let e2 = j % {LW}u;
    var t = vec4<f32>(0.0);
    for (var g = 0u; g < {R}u; g = g + 1u) {{ t = t + pvs[r * {WG}u + g * {LW}u + e2]; }}
    {part_at} + 2u * e2 + {x}] = t;
  }}
  workgroupBarrier();
"""
        pv = _pv_walk_wide(GL, T, R, LW, C) + rounds
        pv_decl = f"var<workgroup> pvs: array<vec4<f32>, {GL * WG}>;\n"
    elif wide:
        pv = f"""  for (var j = lid; j < {GL * LW}u; j = j + {WG}u) {{
    let r = j / {LW}u;
    let e = j % {LW}u;
    var tl = vec4<f32>(0.0);
    var th = vec4<f32>(0.0);
    for (var c = 0u; c < n; c = c + 1u) {{
      let p = sc[r * {T}u + c];
      let vw = v[(h * {C}u + c0 + c) * {LW}u + e];
      tl = tl + p * unpack_lo(vw);
      th = th + p * unpack_hi(vw);
    }}
    {part_at} + 2u * e] = tl;
    {part_at} + 2u * e + 1u] = th;
  }}
"""
        pv_decl = ""
    elif shared_pv:
        pv = f"""  let rg = lid / {D4}u;
  let e = lid % {D4}u;
  var a: array<{vt}, {GL}>;
  for (var r = 0u; r < {GL}u; r = r + 1u) {{ a[r] = {vt}(0.0); }}
  var c = rg;
  while (c + {3 * R}u < n) {{
    let vb = (h * {C}u + c0 + c) * {D4}u + e;
    let v0 = {ld("v[vb]")};
    let v1 = {ld(f"v[vb + {R * D4}u]")};
    let v2 = {ld(f"v[vb + {2 * R * D4}u]")};
    let v3 = {ld(f"v[vb + {3 * R * D4}u]")};
    for (var r = 0u; r < {GL}u; r = r + 1u) {{
      let sb = r * {T}u + c;
      a[r] = a[r] + sc[sb] * v0 + sc[sb + {R}u] * v1 + sc[sb + {2 * R}u] * v2 + sc[sb + {3 * R}u] * v3;
    }}
    c = c + {4 * R}u;
  }}
  while (c < n) {{
    let vv = {v_at};
    for (var r = 0u; r < {GL}u; r = r + 1u) {{ a[r] = a[r] + sc[r * {T}u + c] * vv; }}
    c = c + {R}u;
  }}
  for (var r = 0u; r < {GL}u; r = r + 1u) {{ pvs[r * {WG}u + lid] = a[r]; }}
  workgroupBarrier();
  for (var j = lid; j < {GL * D4}u; j = j + {WG}u) {{
    let r = j / {D4}u;
    let e2 = j % {D4}u;
    var t = {vt}(0.0);
    for (var g = 0u; g < {R}u; g = g + 1u) {{ t = t + pvs[r * {WG}u + g * {D4}u + e2]; }}
    part[(({hr}) * {ns}u + sp) * {pw}u + {head_words}u + e2] = t;
  }}
"""
        pv_decl = f"var<workgroup> pvs: array<{vt}, {GL * WG}>;\n"
    else:
        pv = f"""  for (var j = lid; j < {GL * D4}u; j = j + {WG}u) {{
    let r = j / {D4}u;
    let e = j % {D4}u;
    var t = {vt}(0.0);
    for (var c = 0u; c < n; c = c + 1u) {{ t = t + sc[r * {T}u + c] * {v_at}; }}
    part[(({hr}) * {ns}u + sp) * {pw}u + {head_words}u + e] = t;
  }}
"""
        pv_decl = ""
    q_pre = q_stats(q_red, GL, f"h * {G}u + q0", WG, "red", sub)  # q rows' statistic
    combine = ""
    if last:
        combine, cdecl = last_combine(GL, G, GS, ns, D4, sub, epilogue, WG)
        pv_decl += cdecl
    if first:  # K's and V's words before the write and q; after a write here, again
        k_first, v_early = k_first + v_early, ""
        if wrote is not None:
            write_body += f"  if ({wrote}) {{\n{k_again}{v_again}  }}\n"
    src += f"""
var<workgroup> qs: array<{vt}, {GL * D4}>;
var<workgroup> sc: array<f32, {GL * T}>;
var<workgroup> red: array<f32, {GL * WG}>;
{pv_decl}
{_stat_fns(NSG) if sub else _trees(GL, WG)}
{_split_entry(WG, T, C)}  let q0 = wid.z * {GL}u;
{k_first}{write_body}{q_pre}{v_early}  for (var jj = lid; jj < {GL * D4}u; jj = jj + {WG}u) {{
    let j = q0 * {D4}u + jj;
    qs[jj] = {q_load};
  }}
  workgroupBarrier();
  var mloc: array<f32, {GL}>;
  var acc: array<f32, {GL}>;
  for (var r = 0u; r < {GL}u; r = r + 1u) {{ mloc[r] = {low}; }}
  for (var c = lid; c < n; c = c + {WG}u) {{
    for (var r = 0u; r < {GL}u; r = r + 1u) {{ acc[r] = 0.0; }}
    let kb = (h * {C}u + c0 + c) * {LW}u;
    for (var e0 = 0u; e0 < {LW}u; e0 = e0 + {U}u) {{
{k_loads}      for (var r = 0u; r < {GL}u; r = r + 1u) {{
{q_at}        acc[r] = acc[r] + {k_dots};
      }}
    }}
    for (var r = 0u; r < {GL}u; r = r + 1u) {{
      let raw = acc[r];
      let si = ({hr}) * {C}u + c0 + c;
      let val = {fn_call};
      sc[r * {T}u + c] = val;
      mloc[r] = max(mloc[r], val);
    }}
  }}
{_split_max(GL, sub)}  for (var c = lid; c < n; c = c + {WG}u) {{
    for (var r = 0u; r < {GL}u; r = r + 1u) {{
      let sv = sc[r * {T}u + c];
      // a row masked with -inf weighs 0 (even in a split where every row is masked)
      let pv = select(0.0, exp(sv - m[r]), sv > {low});
      sc[r * {T}u + c] = pv;
      mloc[r] = mloc[r] + pv;
    }}
  }}
{_split_sum(GL, sub)}{pv}  if (lid < {GL}u) {{
    let r = lid;
    let pb = (({hr}) * {ns}u + sp) * {pw}u;
{stats}  }}
{combine}}}
"""
    parts = heads * G * ns * P
    extra = 0 if score is None else sum(4 * min(leaf.size, heads * G * C)
                                        for leaf in score[1] if not leaf.param)
    if writes is not None:  # the tuples, the updates read and the rows written
        extra += 4 * writes.tuples * 3 + 2 * 2 * writes.tuples * D * (2 if kv == "f16" else 4)
    traffic = (4 * (heads * G * D + parts) + GS * 2 * heads * C * D * (2 if kv == "f16" else 4)
               + extra)
    if last:  # the last workgroups read the partials and write the output
        k1 = Kernel("attention_flash", src, bindings, (ns, heads, GS),
                    traffic + 4 * (parts + heads * G * D))
        return k1, None, parts
    k1 = Kernel("attention_flash", src, bindings, (ns, heads, GS), traffic)
    k2 = _combine(heads * G, ns, D, vec, sub, epilogue)
    return k1, k2, parts


#: V words an invocation may load before the scores (``flash_decode`` with subgroups): its
#: rows of the split, at most this many (128 rows a split over 16 row-groups: 8)
HOIST_V = 8


def _stat_fns(nsg: int) -> str:
    """WGSL ``l_total(r)``: the split's sum of q row ``r`` from its subgroups' shares
    (``_split_sum``)."""
    return f"""fn l_total(r: u32) -> f32 {{
  var t = 0.0;
  for (var w = 0u; w < {nsg}u; w = w + 1u) {{ t = t + red[r * {WG}u + {nsg}u + w]; }}
  return t;
}}

"""


def _split_max(g: int, sub: int | None) -> str:
    """WGSL: ``m[r]``, the split's maximum score of each of the ``g`` q rows, from each
    invocation's ``mloc[r]`` (then reset to 0 for the sum): by a workgroup tree, or with a
    ``sub``-wide subgroup by ``subgroupMax``, a value a subgroup in ``red`` and one barrier
    (the sums go to other slots of ``red``, so nothing waits before they are written)."""
    if sub is None:
        return f"""  for (var r = 0u; r < {g}u; r = r + 1u) {{ red[r * {WG}u + lid] = mloc[r]; }}
  workgroupBarrier();
  tree_max(lid);
  var m: array<f32, {g}>;
  for (var r = 0u; r < {g}u; r = r + 1u) {{ m[r] = red[r * {WG}u]; mloc[r] = 0.0; }}
  workgroupBarrier();
"""
    return f"""  for (var r = 0u; r < {g}u; r = r + 1u) {{
    let sm = subgroupMax(mloc[r]);
    if (lid % {sub}u == 0u) {{ red[r * {WG}u + lid / {sub}u] = sm; }}
  }}
  workgroupBarrier();
  var m: array<f32, {g}>;
  for (var r = 0u; r < {g}u; r = r + 1u) {{
    var x = red[r * {WG}u];
    for (var w = 1u; w < {WG // sub}u; w = w + 1u) {{ x = max(x, red[r * {WG}u + w]); }}
    m[r] = x;
    mloc[r] = 0.0;
  }}
"""


def _split_sum(g: int, sub: int | None) -> str:
    """WGSL: the split's sum of each q row's ``mloc[r]``: into ``red[r * WG]`` by a tree,
    or with subgroups a ``subgroupAdd`` a subgroup into ``red`` after the maxima's slots,
    summed where it is written (``l_total``), behind the barrier probs·V passes anyway."""
    if sub is None:
        return f"""  for (var r = 0u; r < {g}u; r = r + 1u) {{ red[r * {WG}u + lid] = mloc[r]; }}
  workgroupBarrier();
  tree_sum(lid);
"""
    nsg = WG // sub
    return f"""  for (var r = 0u; r < {g}u; r = r + 1u) {{
    let ss = subgroupAdd(mloc[r]);
    if (lid % {sub}u == 0u) {{ red[r * {WG}u + {nsg}u + lid / {sub}u] = ss; }}
  }}
  workgroupBarrier();
"""


def first_k_words(base: str, words: int, again: bool) -> tuple[str, str]:
    """(WGSL loading the ``words`` 16-byte K words from word ``base`` into ``kw0``, .. at a
    pass 1's start, WGSL loading them again): ``attention_loads`` "first" in flash and
    tile; the words are variables where ``again`` (a folded row write may land in them)."""
    at = [f"k[kf + {j}u]" for j in range(words)]
    kw = "var" if again else "let"
    first = f"  let kf = {base};\n" + "".join(f"  {kw} kw{j} = {a};\n" for j, a in enumerate(at))
    return first, "".join(f"    kw{j} = {a};\n" for j, a in enumerate(at)) if again else ""


def _pv_walk_wide(g: int, t: int, rgs: int, lw: int, cap: int) -> str:
    """WGSL: ``flash_decode``'s wide float16 probs·V walked after the statistics: each
    invocation 8 columns (word ``e`` of V) of rows ``rg``, ``rg + rgs``, ... of the split's
    ``t``, four V words at a time, each loaded once for the ``g`` q rows' sums ``a[r]``
    (columns 0-3) and ``ah[r]`` (4-7)."""
    loads = "".join(f"    let v{j} = v[vb + {j * rgs * lw}u];\n"
                    f"    let v{j}l = unpack_lo(v{j});\n    let v{j}h = unpack_hi(v{j});\n"
                    for j in range(4))
    probs = "".join(f"      let p{j} = sc[sb + {j * rgs}u];\n" for j in range(4))
    sums = {x: " + ".join(f"p{j} * v{j}{x}" for j in range(4)) for x in "lh"}
    return f"""  let rg = lid / {lw}u;
  let e = lid % {lw}u;
  var a: array<vec4<f32>, {g}>;
  var ah: array<vec4<f32>, {g}>;
  for (var r = 0u; r < {g}u; r = r + 1u) {{ a[r] = vec4<f32>(0.0); ah[r] = vec4<f32>(0.0); }}
  var c = rg;
  while (c + {3 * rgs}u < n) {{
    let vb = (h * {cap}u + c0 + c) * {lw}u + e;
{loads}    for (var r = 0u; r < {g}u; r = r + 1u) {{
      let sb = r * {t}u + c;
{probs}      a[r] = a[r] + {sums["l"]};
      ah[r] = ah[r] + {sums["h"]};
    }}
    c = c + {4 * rgs}u;
  }}
  while (c < n) {{
    let vw = v[(h * {cap}u + c0 + c) * {lw}u + e];
    let vl = unpack_lo(vw);
    let vh = unpack_hi(vw);
    for (var r = 0u; r < {g}u; r = r + 1u) {{
      let p = sc[r * {t}u + c];
      a[r] = a[r] + p * vl;
      ah[r] = ah[r] + p * vh;
    }}
    c = c + {rgs}u;
  }}
"""


def _pv_by_subgroups(g: int, t: int, rgs: int, lw: int, cap: int, sub: int,
                     part_at: str, again: bool = False) -> tuple[str, str, str, str]:
    """(V loads before the scores, probs·V, workgroup memory) of ``flash_decode``'s wide
    float16 probs·V at a ``sub``-wide subgroup (a multiple of the ``lw`` words a row): each
    invocation word ``e`` of rows ``rg``, ``rg + rgs``, ... of the split's ``t``; where they
    are at most ``HOIST_V``, every V word is loaded first (rows past the split's end read
    its last row and weigh 0), else walked after the statistics (``_pv_walk_wide``). The
    row-groups of a subgroup are summed by ``subgroupShuffleXor``, the subgroups' sums
    through workgroup memory and one barrier; ``part_at``: the partial's address up to the
    word. ``again``: the early words are variables and the fourth string loads them
    again (``flash_decode``'s ``loads_first``, after a folded row write)."""
    per = t // rgs if t % rgs == 0 else 0
    early = reload = ""
    if 0 < per <= HOIST_V:
        at = [f"v[(h * {cap}u + c0 + min(rg + {i * rgs}u, n - 1u)) * {lw}u + e]"
              for i in range(per)]
        early = f"  let rg = lid / {lw}u;\n  let e = lid % {lw}u;\n" + "".join(
            f"  {'var' if again else 'let'} hv{i} = {a};\n" for i, a in enumerate(at))
        reload = "".join(f"    hv{i} = {a};\n" for i, a in enumerate(at)) if again else ""
        pv = (f"  var a: array<vec4<f32>, {g}>;\n  var ah: array<vec4<f32>, {g}>;\n"
              f"  for (var r = 0u; r < {g}u; r = r + 1u) {{\n"
              "    var x = vec4<f32>(0.0);\n    var y = vec4<f32>(0.0);\n")
        for i in range(per):
            pv += (f"    let p{i} = select(0.0, sc[r * {t}u + rg + {i * rgs}u], "
                   f"rg + {i * rgs}u < n);\n"
                   f"    x = x + p{i} * unpack_lo(hv{i});\n    y = y + p{i} * unpack_hi(hv{i});\n")
        pv += "    a[r] = x;\n    ah[r] = y;\n  }\n"
    else:
        pv = _pv_walk_wide(g, t, rgs, lw, cap)
    nsg = WG // sub
    shuffles = ""
    st = lw
    while st < sub:
        shuffles += (f"    x = x + subgroupShuffleXor(x, {st}u);\n"
                     f"    y = y + subgroupShuffleXor(y, {st}u);\n")
        st *= 2
    pv += f"""  for (var r = 0u; r < {g}u; r = r + 1u) {{
    var x = a[r];
    var y = ah[r];
{shuffles}    if (lid % {sub}u < {lw}u) {{
      pvs[((r * {nsg}u + lid / {sub}u) * {lw}u + e) * 2u] = x;
      pvs[((r * {nsg}u + lid / {sub}u) * {lw}u + e) * 2u + 1u] = y;
    }}
  }}
  workgroupBarrier();
  for (var j = lid; j < {g * lw * 2}u; j = j + {WG}u) {{
    let r = j / {2 * lw}u;
    let wk = j % {2 * lw}u;
    var tt = vec4<f32>(0.0);
    for (var w = 0u; w < {nsg}u; w = w + 1u) {{ tt = tt + pvs[(r * {nsg}u + w) * {2 * lw}u + wk]; }}
    {part_at} + wk] = tt;
  }}
"""
    return early, pv, f"var<workgroup> pvs: array<vec4<f32>, {g * nsg * lw * 2}>;\n", reload


def _combine(rows: int, ns: int, d: int, vec: bool, subgroup: int | None = None,
             epilogue: Epilogue | None = None) -> Kernel:
    """out[row] = Σ_s acc_s e^{m_s - M} / Σ_s l_s e^{m_s - M}: one workgroup per q row;
    the split weights once in workgroup memory, then (split-group, 4 columns) pairs
    summed by a tree: no invocation walks all splits alone. The weights: one invocation
    walks the splits twice (their maximum, then the weights and their sum), or with a
    ``subgroup`` width dividing the workgroup every invocation its splits, the maximum and
    the sum each by subgroup builtins and one barrier. ``epilogue``: written instead of
    the output (``Epilogue``), its leaves bound after it."""
    words = d // 4 if vec else d
    vt = "vec4<f32>" if vec else "f32"
    pw = (d + 4) // 4 if vec else d + 4
    head_words = 1 if vec else 4
    lanes = max(1, WG2 // words) if words <= WG2 else 1
    m_of = "part[b + s * {pw}u].x" if vec else "part[b + s * {pw}u]"  # read once each
    l_of = "part[b + s * {pw}u].y" if vec else "part[b + s * {pw}u + 1u]"
    m_of, l_of = m_of.format(pw=pw), l_of.format(pw=pw)
    sub = subgroup if subgroup and WG2 % subgroup == 0 else None
    ls_decl, weights_decl, total = (f"var<workgroup> ls: array<f32, {ns}>;\n",
                                    "var<workgroup> tot: f32;\n", "tot")
    if sub is None:
        weights = f"""  for (var s = lid; s < {ns}u; s = s + {WG2}u) {{ w[s] = {m_of}; ls[s] = {l_of}; }}
  workgroupBarrier();
  if (lid == 0u) {{
    var mx = {neg_inf()};
    for (var s = 0u; s < {ns}u; s = s + 1u) {{ mx = max(mx, w[s]); }}
    var l = 0.0;
    for (var s = 0u; s < {ns}u; s = s + 1u) {{
      let ws = exp(w[s] - mx);
      w[s] = ws;
      l = l + ls[s] * ws;
    }}
    tot = l;
  }}
  workgroupBarrier();"""
    else:
        nsg, total, ls_decl = WG2 // sub, "total", ""
        weights_decl = f"var<workgroup> wred: array<f32, {2 * nsg}>;\n"
        weights = f"""  var mx = {neg_inf()};
  for (var s = lid; s < {ns}u; s = s + {WG2}u) {{ mx = max(mx, {m_of}); }}
  let sm = subgroupMax(mx);
  if (lid % {sub}u == 0u) {{ wred[lid / {sub}u] = sm; }}
  workgroupBarrier();
  var big = wred[0];
  for (var j = 1u; j < {nsg}u; j = j + 1u) {{ big = max(big, wred[j]); }}
  var l = 0.0;
  for (var s = lid; s < {ns}u; s = s + {WG2}u) {{
    let ws = exp({m_of} - big);
    w[s] = ws;
    l = l + {l_of} * ws;
  }}
  let sl = subgroupAdd(l);
  if (lid % {sub}u == 0u) {{ wred[{nsg}u + lid / {sub}u] = sl; }}
  workgroupBarrier();
  var total = 0.0;
  for (var j = 0u; j < {nsg}u; j = j + 1u) {{ total = total + wred[{nsg}u + j]; }}"""
    out_src, out_bindings = out_decl(epilogue, vec, 1)
    src = decl(0, "part", vt, "read") + out_src + f"""
var<workgroup> w: array<f32, {ns}>;
{ls_decl}var<workgroup> acc: array<{vt}, {WG2}>;
{weights_decl}
@compute @workgroup_size({WG2})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let row = wid.y * 65535u + wid.x;
  if (row >= {rows}u) {{ return; }}
  let b = row * {ns * pw}u;
{weights}
  for (var e0 = 0u; e0 < {words}u; e0 = e0 + {min(words, WG2)}u) {{
    let g = lid / {min(words, WG2)}u;
    let e = e0 + lid % {min(words, WG2)}u;
    var a = {vt}(0.0);
    if (e < {words}u && g < {lanes}u) {{
      for (var s = g; s < {ns}u; s = s + {lanes}u) {{
        a = a + part[b + s * {pw}u + {head_words}u + e] * w[s];
      }}
    }}
    acc[lid] = a;
    workgroupBarrier();
    if (lid < {min(words, WG2)}u && e < {words}u) {{
      var t = {vt}(0.0);
      for (var j = 0u; j < {lanes}u; j = j + 1u) {{ t = t + acc[j * {min(words, WG2)}u + lid]; }}
{store(epilogue, vec, f'row * {words}u + e', f't / {total}', '      ')}    }}
    workgroupBarrier();
  }}
}}
"""
    gx = min(rows, 65535)
    return Combine("attention_combine", src, ["read", *out_bindings], (gx, -(-rows // gx), 1),
                   4 * (rows * ns * (d + 4) + rows * d) + epilogue_bytes(epilogue, rows * d),
                   rows, ns, d, vec)


def epilogue_bytes(ep: Epilogue | None, n: int) -> int:
    """What an epilogue over ``n`` outputs reads from its bound leaves (at most ``n``
    elements each)."""
    if ep is None:
        return 0
    return sum(4 * min(leaf.size, n) for leaf in ep.leaves if not leaf.param)


@dataclass
class Combine(Kernel):
    """``_combine``'s kernel and the partials it reads: ``rows`` q rows of ``splits``
    splits, each ``(m, l, 0, 0, acc[d])`` (``vec``: 16-byte words, ``acc`` from the second);
    a reader may compute the vector instead (``combine_vector``)."""

    rows: int = 0
    splits: int = 0
    d: int = 0
    vec: bool = True


def combine_vector(rows: int, ns: int, d: int, epilogue: Epilogue | None = None) -> VectorSource:
    """The ``rows`` × ``d`` output ``_combine`` writes (``vec`` partials, row-major), as a
    product's input vector computed by each of its workgroups (``VectorSource.setup``): an
    invocation a row weighs its ``ns`` splits (their maximum, ``e^{m_s - M}``, the total;
    the loads straight-line up to ``COMBINE_UNROLL`` splits), then after a barrier an
    invocation a 16-byte word sums its splits' accumulators into workgroup memory, which
    the product reads (``element``). So the combine has no launch of its own: the
    product's code loads are in flight meanwhile, and a layer is a launch shorter.
    ``epilogue``: the vector is that element-wise function of the combined output
    (``Epilogue``; an output gate), its leaves bound after the partials and read where
    each element is stored."""
    assert d % 4 == 0
    pw, dq = d // 4 + 1, d // 4
    words = rows * dq
    unrolled = ns <= COMBINE_UNROLL
    ep_src, ep_bindings = epilogue.source(1) if epilogue is not None else ("", [])
    src = decl(0, "part", "vec4<f32>", "read") + ep_src + (
        f"var<workgroup> cb_w: array<f32, {rows * ns}>;\n"
        f"var<workgroup> cb_t: array<f32, {rows}>;\n"
        f"var<workgroup> cb_v: array<f32, {rows * d}>;\n")

    def weights() -> str:
        if unrolled:
            out = "".join(f"    let ch{s} = part[cb + {s * pw}u];\n" for s in range(ns))
            out += "    var mx = ch0.x;\n" + "".join(
                f"    mx = max(mx, ch{s}.x);\n" for s in range(1, ns))
            out += "    var l = 0.0;\n" + "".join(
                f"    let w{s} = exp(ch{s}.x - mx);\n    cb_w[r * {ns}u + {s}u] = w{s};\n"
                f"    l = l + ch{s}.y * w{s};\n" for s in range(ns))
            return out
        return (f"    var mx = {neg_inf()};\n"
                f"    for (var s = 0u; s < {ns}u; s = s + 1u) {{ mx = max(mx, part[cb + s * {pw}u].x); }}\n"
                "    var l = 0.0;\n"
                f"    for (var s = 0u; s < {ns}u; s = s + 1u) {{\n"
                f"      let ch = part[cb + s * {pw}u];\n"
                "      let ws = exp(ch.x - mx);\n"
                f"      cb_w[r * {ns}u + s] = ws;\n"
                "      l = l + ch.y * ws;\n    }\n")

    def sums() -> str:
        if unrolled:
            return "".join(f"    a = a + part[cb + {s * pw}u] * cb_w[r * {ns}u + {s}u];\n"
                           for s in range(ns))
        return (f"    for (var s = 0u; s < {ns}u; s = s + 1u) {{\n"
                f"      a = a + part[cb + s * {pw}u] * cb_w[r * {ns}u + s];\n    }}\n")

    def setup(wg: int) -> str:
        return (f"  for (var r = lid; r < {rows}u; r = r + {wg}u) {{\n"
                f"    let cb = r * {ns * pw}u;\n" + weights()
                + "    cb_t[r] = 1.0 / l;\n  }\n  workgroupBarrier();\n"
                f"  for (var j = lid; j < {words}u; j = j + {wg}u) {{\n"
                f"    let r = j / {dq}u;\n"
                f"    let cb = r * {ns * pw}u + 1u + j % {dq}u;\n"
                "    var a = vec4<f32>(0.0);\n" + sums()
                + "    let o = a * cb_t[r];\n"
                + "".join(_vector_store(epilogue, c, x) for c, x in enumerate("xyzw"))
                + "  }\n  workgroupBarrier();\n")

    return VectorSource(src, ["read", *ep_bindings], "cb_v[{}]", setup=setup)


def _vector_store(ep: Epilogue | None, c: int, x: str) -> str:
    """WGSL storing component ``x`` (the ``c``-th) of combined word ``o`` (word ``j``) into
    ``combine_vector``'s workgroup vector: as it is, or through the epilogue at its flat
    index (as float32, the vector's type)."""
    if ep is None:
        return f"    cb_v[4u * j + {c}u] = o.{x};\n"
    return (f"    {{ let ao = o.{x}; cb_v[4u * j + {c}u] = f32({ep.call(f'4u * j + {c}u')}); }}\n")


def last_of_head(ns: int, slot: str = "h") -> str:
    """WGSL that returns from every workgroup but the last of head ``h``'s ``ns`` to bump
    the head's counter ``cnt[slot]`` after writing its partials, and resets the counter;
    the partials are read after it (a device-scope barrier before the count and after
    it)."""
    return f"""  storageBarrier();
  if (lid == 0u) {{
    let done = atomicAdd(&cnt[{slot}], 1u);
    flag = select(0u, 1u, done == {ns - 1}u);
  }}
  if (workgroupUniformLoad(&flag) == 0u) {{ return; }}
  storageBarrier();
  if (lid == 0u) {{ atomicStore(&cnt[{slot}], 0u); }}
"""


#: partial words an invocation of ``last_combine`` loads before summing them
LAST_BATCH = 16


def last_floats(group: int, splits: int, wg: int) -> int:
    """Workgroup memory (4-byte words) ``last_combine`` adds to a pass 1 of ``wg``."""
    return group * splits + group + 6 * wg + 1


def last_combine(GL: int, G: int, GS: int, ns: int, D4: int, sync: int | None,
                 epilogue: Epilogue | None, wg: int) -> tuple[str, str]:
    """(WGSL closing a two-launch attention's pass 1 of ``wg`` invocations, its workgroup
    memory): every workgroup but the last of its (KV head, q-row group) returns once its
    partials are out (``last_of_head``, the counter ``h · GS + z``); the last weighs each
    of its ``GL`` q rows' ``ns`` splits (``wg / GL`` invocations a row, their maxima and
    sums met by ``sync``-wide subgroups where the width divides a row's share, as the
    split statistics are: ``met``), then sums each output word's splits: every invocation
    its share of an (q row, word) pair's splits, their loads issued at once (in batches of
    ``LAST_BATCH``), the
    shares summed through workgroup memory, the word stored as the combine launch stores
    it (``attention.store``, the epilogue's root where there is one)."""
    low = neg_inf()
    pw = D4 + 1
    P = wg // GL  # invocations a q row's weights
    sync = sync if sync and P % sync == 0 and sync & (sync - 1) == 0 else None
    PS = P // sync if sync else P  # values a row's statistics meet in workgroup memory
    pairs = GL * D4
    ch = min(pairs, wg)
    lanes = max(1, wg // ch)
    per = -(-ns // lanes)  # splits a lane of a pair sums
    at = f"((h * {G}u + q0 + lr) * {ns}u + s) * {pw}u"
    src = last_of_head(ns, f"h * {GS}u + wid.z") + f"""  let lr = lid / {P}u;
  let lj = lid % {P}u;
  var cm = {low};
  if (lr < {GL}u) {{
    for (var s = lj; s < {ns}u; s = s + {P}u) {{ cm = max(cm, part[{at}].x); }}
  }}
{met("lred", "cm", "subgroupMax", sync)}  workgroupBarrier();
  var cmax = {low};
  var cl = 0.0;
  if (lr < {GL}u) {{
    for (var i = 0u; i < {PS}u; i = i + 1u) {{ cmax = max(cmax, lred[lr * {PS}u + i]); }}
    for (var s = lj; s < {ns}u; s = s + {P}u) {{
      let ml = part[{at}];
      let ws = exp(ml.x - cmax);
      cw[lr * {ns}u + s] = ws;
      cl = cl + ml.y * ws;
    }}
  }}
{met("lred2", "cl", "subgroupAdd", sync)}  workgroupBarrier();
  if (lr < {GL}u && lj == 0u) {{
    var lt = 0.0;
    for (var i = 0u; i < {PS}u; i = i + 1u) {{ lt = lt + lred2[lr * {PS}u + i]; }}
    ct[lr] = lt;
  }}
  workgroupBarrier();
  for (var p0 = 0u; p0 < {pairs}u; p0 = p0 + {ch}u) {{
    let cg = lid / {ch}u;
    let pi = p0 + lid % {ch}u;
    let cr = pi / {D4}u;
    let ce = pi % {D4}u;
    var ca = vec4<f32>(0.0);
    if (pi < {pairs}u && cg < {lanes}u) {{
      let cb = (h * {G}u + q0 + cr) * {ns}u;
"""
    batch = min(per, LAST_BATCH)
    loop = per > batch  # batches of loads in a loop: a verify's many rows a lane
    ind = "        " if loop else "      "
    first = "cg + sb" if loop else "cg"
    body = ""
    for i in range(batch):  # every load of a batch first
        body += (f"{ind}let cs{i} = min({first} + {i * lanes}u, {ns - 1}u);\n"
                 f"{ind}let cv{i} = part[(cb + cs{i}) * {pw}u + 1u + ce];\n")
    body += "".join(f"{ind}ca = ca + select(0.0, cw[cr * {ns}u + cs{i}], "
                    f"{first} + {i * lanes}u < {ns}u) * cv{i};\n" for i in range(batch))
    if loop:
        body = (f"      for (var sb = 0u; sb < {ns}u; sb = sb + {batch * lanes}u) {{\n"
                f"{body}      }}\n")
    src += body + f"""    }}
    cacc[lid] = ca;
    workgroupBarrier();
    if (lid < {ch}u && pi < {pairs}u) {{
      var t = vec4<f32>(0.0);
      for (var j = 0u; j < {lanes}u; j = j + 1u) {{ t = t + cacc[j * {ch}u + lid]; }}
{store(epilogue, True, f"(h * {G}u + q0 + cr) * {D4}u + ce", "t / ct[cr]", "      ")}    }}
    workgroupBarrier();
  }}
"""
    decls = (f"var<workgroup> cw: array<f32, {GL * ns}>;\nvar<workgroup> ct: array<f32, {GL}>;\n"
             f"var<workgroup> cacc: array<vec4<f32>, {wg}>;\nvar<workgroup> flag: u32;\n"
             f"var<workgroup> lred: array<f32, {wg}>;\nvar<workgroup> lred2: array<f32, {wg}>;\n")
    return src, decls


def met(arr: str, value: str, builtin: str, sync: int | None) -> str:
    """WGSL: each invocation's ``value`` into workgroup memory ``arr`` for its q row's
    statistics: every one's at ``lid``, or with a ``sync``-wide subgroup its subgroup's
    (``builtin``: ``subgroupMax``, ``subgroupAdd``) at ``lid / sync``."""
    if sync is None:
        return f"  {arr}[lid] = {value};\n"
    return (f"  let {value}_s = {builtin}({value});\n"
            f"  if (lid % {sync}u == 0u) {{ {arr}[lid / {sync}u] = {value}_s; }}\n")


WG1 = 128  # one-launch kernel's workgroup
SPLITS1 = 64  # splits per head the one-launch kernel aims at (its combine reads them all)
ROWS1 = 8  # most cache rows (of K and of V) an invocation holds in registers


def one_launch_plan(q_rows: int, capacity: int, d: int, kv: str, shared_floats: int,
                    splits: int = SPLITS1) -> tuple[int, int, int, int] | None:
    """(lanes a cache row, rows an invocation holds, rows a partial-dot round, splits) of
    ``flash_decode_one``, or None where it does not apply (the head dimension is not a
    power-of-two count of 16-byte words, at most 32, or workgroup memory is too small).

    ``splits``: the splits per head to aim at; each invocation holds 1 to ROWS1 rows, so
    short caches get more splits of fewer rows (workgroups to fill the device), long ones
    at most ROWS1 * (WG1 / lanes) rows a split; the partial dots go through workgroup
    memory in 1 to ``rows`` rounds, and where even one round does not fit, fewer rows an
    invocation (more splits)."""
    per = 8 if kv == "f16" else 4
    if d % per or kv not in ("f16", "f32"):
        return None
    lw = d // per
    if lw > 32 or lw & (lw - 1):
        return None
    rg = WG1 // lw
    want = -(-capacity // (max(1, splits) * rg))
    top = next(i for i in (1, 2, 4, ROWS1) if i >= want or i == ROWS1)
    for rows in (r for r in (ROWS1, 4, 2, 1) if r <= top):  # fewer rows where memory is short
        ns = -(-capacity // (rows * rg))
        for b in (rows, rows // 2, rows // 4, rows // 8):
            if b >= 1 and _one_floats(q_rows, d, lw, rows, b, ns) <= shared_floats:
                return lw, rows, b, ns
    return None


def _one_floats(g: int, d: int, lw: int, rows: int, b: int, ns: int) -> int:
    """Workgroup memory (floats) of ``flash_decode_one``: q, scores, reduction scratch,
    partial dots of a round, the probs·V tree (or the combine's split sums), the combine's
    per-split maxima and sums."""
    rg = WG1 // lw
    pv = max((rg // 2) * g * d, 4 * WG1)
    return g * d + g * rg * rows + g * WG1 + g * b * WG1 + pv + (rg // 2) * g + 2 * ns * g + g + 1


def flash_decode_one(heads: int, q_rows: int, capacity: int, d: int,
                     score: tuple[Sequence[FusedOp], Sequence[Leaf]] | None,
                     shared_floats: int,
                     q_chain: tuple[Sequence[FusedOp], Sequence[Leaf]] | None = None,
                     splits: int = SPLITS1, kv: str = "f32",
                     epilogue: Epilogue | None = None) -> tuple[Kernel, int, int] | None:
    """(kernel, partial-buffer 4-byte words, counter words) of decode attention in ONE
    launch, or None where ``one_launch_plan`` says it does not apply. Bindings: as
    ``flash_decode``'s pass 1 (q or its chain's leaves, K, V, the score chain's leaves,
    the partials), then the output (heads, q_rows, d) and ``heads`` u32 counters that
    must be zero before the first launch (the kernel leaves them zero); ``epilogue``: the
    combine writes it instead of the output (``Epilogue``), its leaves bound last.

    One workgroup per (batch·kv-head, split); all q rows of the head in one workgroup, so
    each cache row is read once per kv head. Each invocation owns one 16-byte word (8
    halves of a float16 cache, 4 floats of a float32 one) of ``rows`` cache rows, and
    issues all its K and V loads before anything else (``2 * rows`` loads in flight); a
    row's ``d / 8`` (or ``d / 4``) words are read by adjacent invocations, so a warp reads
    whole rows (coalesced). q·K: per-word partial dots through workgroup memory, summed
    per (q row, cache row), through the graph's score chain; the split's maximum by a
    tree; probs·V in registers from the V words already loaded, summed over row-groups by
    a tree. Everything is float32 (float16 is widened exactly as loaded).

    The combine is folded in: each workgroup writes its partial ``(m, l, acc[d])`` per q
    row, then ``storageBarrier()`` (naga: a device-scope release/acquire barrier on
    Vulkan) and one ``atomicAdd`` on its head's counter; the workgroup that sees the
    count reach ``splits - 1`` is the last of its head: it resets the counter and
    combines the head's partials (``Σ_s acc_s e^{m_s - M} / Σ_s l_s e^{m_s - M}``) into
    the output. No second launch.
    """
    plan = one_launch_plan(q_rows, capacity, d, kv, shared_floats, splits)
    if plan is None:
        return None
    LW, NR, B, ns = plan
    G, D, C = q_rows, d, capacity
    RG = WG1 // LW
    T = RG * NR
    D4 = D // 4
    PW = D4 + 1  # partial words per (split, q row): (m, l, 0, 0), acc
    wide = kv == "f16"
    src, bindings, q_load = _q_source(q_chain, G * D4, True)
    kvt = "vec4<u32>" if wide else "vec4<f32>"
    src, bindings, fn_call = _kv_and_score(src, bindings, kvt, wide, score)
    nb = len(bindings)
    out_src, out_bindings = out_decl(epilogue, True, nb + 1, counters=True)
    src += decl(nb, "part", "vec4<f32>", "rw") + out_src
    bindings += ["rw", *out_bindings]
    low = neg_inf()
    # the invocation's cache rows rg + RG*i, clamped into the split (extra rows score -inf)
    loads = "".join(f"  let kw{i} = k[(h * {C}u + c0 + min({i * RG}u + rg, n - 1u)) * {LW}u + e];\n"
                    for i in range(NR))
    loads += "".join(f"  let vw{i} = v[(h * {C}u + c0 + min({i * RG}u + rg, n - 1u)) * {LW}u + e];\n"
                     for i in range(NR))
    if wide:
        loads += "".join(f"  let kw{i}l = unpack_lo(kw{i});\n  let kw{i}h = unpack_hi(kw{i});\n"
                         for i in range(NR))
        q_regs = (f"    let qa = qs[r * {D4}u + 2u * e];\n"
                  f"    let qb = qs[r * {D4}u + 2u * e + 1u];\n")
        pdot = lambda i: f"dot(qa, kw{i}l) + dot(qb, kw{i}h)"  # noqa: E731
    else:
        q_regs = f"    let qa = qs[r * {D4}u + e];\n"
        pdot = lambda i: f"dot(qa, kw{i})"  # noqa: E731
    rounds = ""
    for i0 in range(0, NR, B):
        writes = "".join(f"    pd[((r * {B}u + {i - i0}u) * {RG}u + rg) * {LW}u + e] = {pdot(i)};\n"
                         for i in range(i0, i0 + B))
        rounds += f"""  for (var r = 0u; r < {G}u; r = r + 1u) {{
{q_regs}{writes}  }}
  workgroupBarrier();
  for (var j = lid; j < {G * B * RG}u; j = j + {WG1}u) {{
    let r = j / {B * RG}u;
    let c = {i0 * RG}u + j % {B * RG}u;
    var raw = 0.0;
    for (var x = 0u; x < {LW}u; x = x + 1u) {{ raw = raw + pd[j * {LW}u + x]; }}
    let si = (h * {G}u + r) * {C}u + c0 + min(c, n - 1u);
    let val = {fn_call};
    sc[r * {T}u + c] = select({low}, val, c < n);
  }}
  workgroupBarrier();
"""
    if wide:
        pv_acc = "".join(f"""    {{
      let s = sc[r * {T}u + {i * RG}u + rg];
      let p = select(0.0, exp(s - mr), s > {low});
      a[r] = a[r] + p * unpack_lo(vw{i});
      b[r] = b[r] + p * unpack_hi(vw{i});
      l[r] = l[r] + p;
    }}
""" for i in range(NR))
        acc_decl = (f"  var a: array<vec4<f32>, {G}>;\n  var b: array<vec4<f32>, {G}>;\n"
                    f"  for (var r = 0u; r < {G}u; r = r + 1u) {{ a[r] = vec4<f32>(0.0); "
                    f"b[r] = vec4<f32>(0.0); }}\n")
        words = [("a", "2u * e"), ("b", "2u * e + 1u")]
    else:
        pv_acc = "".join(f"""    {{
      let s = sc[r * {T}u + {i * RG}u + rg];
      let p = select(0.0, exp(s - mr), s > {low});
      a[r] = a[r] + p * vw{i};
      l[r] = l[r] + p;
    }}
""" for i in range(NR))
        acc_decl = (f"  var a: array<vec4<f32>, {G}>;\n"
                    f"  for (var r = 0u; r < {G}u; r = r + 1u) {{ a[r] = vec4<f32>(0.0); }}\n")
        words = [("a", "e")]
    tree = ""
    st = RG // 2
    while st >= 1:
        put = "".join(f"      pv[((rg - {st}u) * {G}u + r) * {D4}u + {w}] = {x}[r];\n"
                      for x, w in words)
        add = "".join(f"      {x}[r] = {x}[r] + pv[(rg * {G}u + r) * {D4}u + {w}];\n"
                      for x, w in words)
        tree += f"""  if (rg >= {st}u && rg < {2 * st}u) {{
    for (var r = 0u; r < {G}u; r = r + 1u) {{
{put}      if (e == 0u) {{ lw[(rg - {st}u) * {G}u + r] = l[r]; }}
    }}
  }}
  workgroupBarrier();
  if (rg < {st}u) {{
    for (var r = 0u; r < {G}u; r = r + 1u) {{
{add}      l[r] = l[r] + lw[rg * {G}u + r];
    }}
  }}
  workgroupBarrier();
"""
        st //= 2
    stores = "".join(f"      part[pb + 1u + {w}] = {x}[r];\n" for x, w in words)
    nout = G * D4
    sgs = max(1, WG1 // nout)  # split-groups summing one output word in the combine
    if sgs > 1:
        out_write = "    pv[j] = t;\n"
        out_sum = f"""  workgroupBarrier();
  for (var o = lid; o < {nout}u; o = o + {WG1}u) {{
    var t = vec4<f32>(0.0);
    for (var g = 0u; g < {sgs}u; g = g + 1u) {{ t = t + pv[g * {nout}u + o]; }}
{store(epilogue, True, f"h * {nout}u + o", f"t / red[(o / {D4}u) * {WG1}u]")}  }}
"""
    else:
        out_write = store(epilogue, True, f"h * {nout}u + o", f"t / red[(o / {D4}u) * {WG1}u]")
        out_sum = ""
    pv_len = max((RG // 2) * G * D4, WG1)
    src += f"""
var<workgroup> qs: array<vec4<f32>, {G * D4}>;
var<workgroup> sc: array<f32, {G * T}>;
var<workgroup> red: array<f32, {G * WG1}>;
var<workgroup> pd: array<f32, {G * B * WG1}>;
var<workgroup> pv: array<vec4<f32>, {pv_len}>;
var<workgroup> lw: array<f32, {max(1, (RG // 2) * G)}>;
var<workgroup> cm: array<f32, {ns * G}>;
var<workgroup> cl: array<f32, {ns * G}>;
var<workgroup> flag: u32;

{_trees(G, WG1)}
{_split_entry(WG1, T, C)}  let e = lid % {LW}u;
  let rg = lid / {LW}u;
{loads}  for (var j = lid; j < {G * D4}u; j = j + {WG1}u) {{ qs[j] = {q_load}; }}
  workgroupBarrier();
{rounds}  for (var r = 0u; r < {G}u; r = r + 1u) {{
    var mx = {low};
    for (var c = lid; c < {T}u; c = c + {WG1}u) {{ mx = max(mx, sc[r * {T}u + c]); }}
    red[r * {WG1}u + lid] = mx;
  }}
  workgroupBarrier();
  tree_max(lid);
{acc_decl}  var l: array<f32, {G}>;
  var m: array<f32, {G}>;
  for (var r = 0u; r < {G}u; r = r + 1u) {{
    let mr = red[r * {WG1}u];
    m[r] = mr;
    l[r] = 0.0;
{pv_acc}  }}
  workgroupBarrier();
{tree}  if (rg == 0u) {{
    for (var r = 0u; r < {G}u; r = r + 1u) {{
      let pb = ((h * {ns}u + sp) * {G}u + r) * {PW}u;
{stores}      if (e == 0u) {{ part[pb] = vec4<f32>(m[r], l[r], 0.0, 0.0); }}
    }}
  }}
{last_of_head(ns)}  for (var j = lid; j < {ns * G}u; j = j + {WG1}u) {{
    let w = part[(h * {ns * G}u + j) * {PW}u];
    cm[j] = w.x;
    cl[j] = w.y;
  }}
  workgroupBarrier();
  for (var r = 0u; r < {G}u; r = r + 1u) {{
    var mx = {low};
    for (var s = lid; s < {ns}u; s = s + {WG1}u) {{ mx = max(mx, cm[s * {G}u + r]); }}
    red[r * {WG1}u + lid] = mx;
  }}
  workgroupBarrier();
  tree_max(lid);
  for (var j = lid; j < {ns * G}u; j = j + {WG1}u) {{
    cm[j] = exp(cm[j] - red[(j % {G}u) * {WG1}u]);
  }}
  workgroupBarrier();
  for (var r = 0u; r < {G}u; r = r + 1u) {{
    var t = 0.0;
    for (var s = lid; s < {ns}u; s = s + {WG1}u) {{ t = t + cl[s * {G}u + r] * cm[s * {G}u + r]; }}
    red[r * {WG1}u + lid] = t;
  }}
  workgroupBarrier();
  tree_sum(lid);
  for (var j = lid; j < {nout * sgs}u; j = j + {WG1}u) {{
    let o = j % {nout}u;
    let r = o / {D4}u;
    let base = h * {ns * G}u + r;
    let w = 1u + o % {D4}u;
    var t = vec4<f32>(0.0);
    var s = j / {nout}u;
    while (s + {3 * sgs}u < {ns}u) {{
      let x0 = part[(base + s * {G}u) * {PW}u + w];
      let x1 = part[(base + (s + {sgs}u) * {G}u) * {PW}u + w];
      let x2 = part[(base + (s + {2 * sgs}u) * {G}u) * {PW}u + w];
      let x3 = part[(base + (s + {3 * sgs}u) * {G}u) * {PW}u + w];
      t = t + x0 * cm[s * {G}u + r] + x1 * cm[(s + {sgs}u) * {G}u + r]
            + x2 * cm[(s + {2 * sgs}u) * {G}u + r] + x3 * cm[(s + {3 * sgs}u) * {G}u + r];
      s = s + {4 * sgs}u;
    }}
    while (s < {ns}u) {{
      t = t + part[(base + s * {G}u) * {PW}u + w] * cm[s * {G}u + r];
      s = s + {sgs}u;
    }}
{out_write}  }}
{out_sum}}}
"""
    parts = 4 * heads * ns * G * PW
    extra = 0 if score is None else sum(4 * min(leaf.size, heads * G * C)
                                        for leaf in score[1] if not leaf.param)
    k = Kernel("attention_flash1", src, bindings, (ns, heads, 1),
               4 * (2 * heads * G * D + 2 * parts) + 2 * heads * C * D * (2 if wide else 4)
               + extra + epilogue_bytes(epilogue, heads * G * D))
    return k, parts, heads
