"""Decode attention for many q rows a KV head (``KernelOptions.attention_rows`` "tile"): a
K-token verify's rows (16 a KV head on llama-1b at K = 4) or a prefill chunk's, every row
of a split of the cache scored by one workgroup, so each K and V row is read once a split
for all of them (from L1 by the workgroup's other warps).

``flash_decode`` scores a head's rows in groups of two along the grid's z, each group
reading the split's K and V again (from L2 after the first: 8 reads of the cache for 16
rows), and each group's workgroup walks the same serial chain (K rows, two workgroup trees,
V rows). On an H100 a K = 4 verify's 16 attention launches took 1.30 ms in-pass at 8200
rows against the one-token step's 0.60 (PERFORMANCE.md, "A speculative verify"). Here one
workgroup of 256 invocations takes ``T`` cache rows and up to ``GROUP_ROWS_T`` q rows:

* the q rows into workgroup memory (q's RoPE chain computed there, as ``flash_decode``);
* scores: an invocation a cache row (``256 / T`` of them a row, each a share of the q rows)
  loads its K row's 16-byte words all at once, widens them (8 halves a word, exact) and
  scores its q rows through the graph's element-wise chain into workgroup memory;
* the softmax's statistics: ``256 / G`` invocations a q row, each a strided share of the
  split's scores, their maxima and sums met through workgroup memory (two barriers, no
  trees); the scores become ``p = exp(s - m)`` in place;
* probs·V: an invocation an output word (8 columns of a float16 cache, 4 of a float32 one)
  of a q row and a share of the split's rows, four V words in flight, the shares summed
  through workgroup memory;
* partials ``(m, l, acc[d])`` per (q row, split) in ``flash_decode``'s layout, so its
  combine (``attention._combine``) merges the splits.

Every row of the capacity is read and masked, as in ``flash_decode``: rows past the last
split's end score the running maximum's start (-inf) and weigh 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .attention import (
    Epilogue,
    RowReduce,
    RowWrites,
    _combine,
    _kv_and_score,
    _q_source,
    _row_writes,
    _split_entry,
    first_k_words,
    last_combine,
    met,
    out_decl,
    q_stats,
)
from .common import Kernel, decl, neg_inf
from .fused import FusedOp, Leaf

WGT = 256  # the workgroup
TILE_ROWS = 128  # cache rows a split by default
ROW_CHOICES = (256, 128, 64, 32)  # cache rows a split may take (T divides the workgroup)
GROUP_ROWS_T = 16  # q rows a workgroup scores at most (more go along the grid's z)
MAX_WORDS = 16  # 16-byte words of a K row an invocation holds (d 128 halves, 64 floats)
LANE_PV_ROWS = 4  # q rows a workgroup's probs·V holds in registers (``_lane_pv``)


@dataclass(frozen=True)
class TilePlan:
    """``rows``: cache rows a split; ``group``: q rows a workgroup; ``words``: 16-byte
    words a K or V row; ``per``: elements a word; ``row_splits``: invocations sharing an
    output word's rows in probs·V."""

    rows: int
    group: int
    words: int
    per: int
    row_splits: int

    def shared_floats(self, d: int) -> int:
        """Workgroup memory the kernel declares, in 4-byte words."""
        outs = self.group * self.words
        pv = self.row_splits * outs * self.per if self.row_splits > 1 else 0
        return self.group * d + self.group * self.rows + 2 * WGT + pv


def tile_plan(q_rows: int, capacity: int, d: int, kv: str, shared_floats: int,
              rows: int | None = None) -> TilePlan | None:
    """How ``flash_tile`` lays out, or None where it does not apply (a cache that is not
    float16 with d % 8 == 0 or float32 with d % 4 == 0, a K row of more than
    ``MAX_WORDS`` words, or workgroup memory too small for 32 rows a split): the caller
    keeps ``flash_decode``. ``rows``: the cache rows a split to aim at (None:
    ``TILE_ROWS``), fewer where workgroup memory is short or the cache is shorter."""
    per = {"f16": 8, "f32": 4}.get(kv)
    if per is None or d % per or d // per > MAX_WORDS:
        return None
    words = d // per
    group = next(g for g in range(min(q_rows, GROUP_ROWS_T), 0, -1) if q_rows % g == 0)
    outs = group * words
    row_splits = 1
    while outs * row_splits * 2 <= WGT:
        row_splits *= 2
    want, short = rows or TILE_ROWS, 32
    while short < min(capacity, want):
        short *= 2
    aim = min(want, short)
    for t in ROW_CHOICES:
        plan = TilePlan(t, group, words, per, row_splits)
        if t <= aim and plan.shared_floats(d) <= shared_floats:
            return plan
    return None


def lane_pv_applies(plan: TilePlan, subgroup: int | None) -> bool:
    """Whether ``_lane_pv`` takes probs·V: a one-token head (at most ``LANE_PV_ROWS`` q
    rows), a fixed subgroup width dividing the row shares (``WGT / words``), whose rows a
    split they divide."""
    shares = WGT // plan.words
    return (subgroup is not None and plan.group <= LANE_PV_ROWS and WGT % plan.words == 0
            and shares % subgroup == 0 and plan.rows % shares == 0)


def _lane_pv(plan: TilePlan, C: int, G: int, ns: int, pw: int, words: int,
             subgroup: int, again: bool = False) -> tuple[str, str, str, str]:
    """(V loads, probs·V, workgroup memory) with every V word an invocation needs in flight
    at once, issued before the softmax's statistics so their latency passes under them:
    ``WGT / words`` invocations (the row shares) an output word, each holding its word of
    ``rows / shares`` cache rows and all q rows' sums of them; the shares' sums met by
    ``subgroupAdd`` (a subgroup holds consecutive shares of one word), then the word's
    subgroups' sums through workgroup memory and one barrier. The other path walks its
    rows four V words at a time, a chain of ``rows / shares / 4`` round trips after the
    statistics. ``again``: the words are variables and the fourth string loads them again
    (``flash_tile``'s ``loads_first``: after a folded row write into this split)."""
    T, GL, LW = plan.rows, plan.group, plan.words
    RS = WGT // LW  # row shares of an output word
    per = T // RS  # cache rows an invocation
    wide = plan.per == 8
    at = [f"v[vb + min(vr + {i * RS}u, n - 1u) * {LW}u]" for i in range(per)]
    kw = "var" if again else "let"
    loads = "".join(f"  {kw} vw{i} = {a};\n" for i, a in enumerate(at))
    reload = "".join(f"    vw{i} = {a};\n" for i, a in enumerate(at)) if again else ""
    v_loads = (f"  let ve = lid / {RS}u;\n  let vr = lid % {RS}u;\n"
               f"  let vb = (h * {C}u + c0) * {LW}u + ve;\n{loads}")
    acc = [f"a{r}_{i}" for r in range(GL) for i in range(words)]
    pv = "  {\n" + "".join(f"    var {a} = vec4<f32>(0.0);\n" for a in acc)
    for i in range(per):
        vals = ([f"unpack_lo(vw{i})", f"unpack_hi(vw{i})"] if wide else [f"vw{i}"])
        for r in range(GL):
            pv += f"    let p{r}_{i} = sc[{r * T}u + vr + {i * RS}u];\n"
            pv += "".join(f"    a{r}_{w} = a{r}_{w} + p{r}_{i} * {vals[w]};\n"
                          for w in range(words))
    pv += "".join(f"    let s{a} = subgroupAdd({a});\n" for a in acc)
    NS = RS // subgroup  # subgroups a word

    def part(r: str, e: str, w: str) -> str:
        return (f"part[((h * {G}u + q0 + ({r})) * {ns}u + sp) * {pw}u + 1u + {words}u * ({e})"
                f" + {w}]")

    slots = GL * words * LW  # (q row, word of columns, output word) sums
    pv += f"    if (vr % {subgroup}u == 0u) {{\n" + "".join(
        f"      lps[(({r * words + w}u * {LW}u + ve) * {NS}u) + vr / {subgroup}u] = sa{r}_{w};\n"
        for r in range(GL) for w in range(words)) + "    }\n  }\n"
    pv += (f"  workgroupBarrier();\n  if (lid < {slots}u) {{\n"
           f"    var t = vec4<f32>(0.0);\n"
           f"    for (var j = 0u; j < {NS}u; j = j + 1u) {{ t = t + lps[lid * {NS}u + j]; }}\n"
           f"    let rw = lid / {LW}u;\n"
           f"    {part(f'rw / {words}u', f'lid % {LW}u', f'rw % {words}u')} = t;\n  }}\n")
    return v_loads, pv, f"var<workgroup> lps: array<vec4<f32>, {slots * NS}>;\n", reload


def flash_tile(heads: int, q_rows: int, capacity: int, d: int,
               score: tuple[Sequence[FusedOp], Sequence[Leaf]] | None, plan: TilePlan,
               q_chain: tuple[Sequence[FusedOp], Sequence[Leaf]] | None = None,
               kv: str = "f16", writes: RowWrites | None = None,
               subgroup: int | None = None,
               sync: int | None = None,
               epilogue: Epilogue | None = None,
               q_red: RowReduce | None = None,
               loads_first: bool = False,
               last: bool = False,
               v_with_k: bool = False) -> tuple[Kernel, Kernel | None, int]:
    """(pass 1, the combine, partial-buffer elements) for q (heads, q_rows, d), K and V
    (heads, capacity, d) of element type ``kv``, output (heads, q_rows, d); ``score``,
    ``q_chain`` and ``writes`` (the layer's row write folded in, its bindings after the
    partials') as ``attention.flash_decode`` takes them; ``plan``: ``tile_plan``'s;
    ``subgroup``: the adapter's fixed subgroup width, for ``_lane_pv`` where it applies;
    ``sync``: that width for the softmax's statistics and the combine
    (``KernelOptions.attention_sync``): where it divides a q row's share of the workgroup,
    each row's maximum and sum are met by ``subgroupMax``/``subgroupAdd`` and a value a
    subgroup, not each of the row's invocations' values walked in series; ``epilogue``:
    written by the combine instead of the output (``attention.Epilogue``); ``q_red``: the
    row statistic ``q_chain`` reads (``attention.RowReduce``); ``loads_first``
    (``KernelOptions.attention_loads``): each invocation's K words (and its V words where
    ``_lane_pv`` holds them) loaded at the kernel's start, before the row write and q,
    so their latency passes under that chain; the workgroup that wrote a row of its split
    loads them again after the write's barrier; ``last``
    (``KernelOptions.attention_combine`` "last"): no combine launch (None in its place):
    the last workgroup of each (KV head, q-row group) to write its partials combines its
    rows' splits (``attention.last_combine``), the output (or the ``epilogue``'s root), then
    ``heads · GS`` zeroed counters and the epilogue's leaves bound after the row write's
    bindings; ``v_with_k`` (``KernelOptions.attention_loads`` "kv"): where ``_lane_pv``
    holds the V words, they are issued after q's barrier, before the K words, so both
    reads are in flight together (else V's after the scores)."""
    T, GL, LW, PER, RS = plan.rows, plan.group, plan.words, plan.per, plan.row_splits
    G, D, C = q_rows, d, capacity
    D4 = D // 4
    GS = G // GL  # workgroups a split (grid z)
    ns = -(-C // T)
    wide = kv == "f16"
    src, bindings, q_load = _q_source(q_chain, G * D4, True, q_red, D4)
    red_sub = subgroup or sync  # the adapter's subgroup width, where the kernel may use it
    kvt = "vec4<u32>" if wide else "vec4<f32>"
    src, bindings, fn_call = _kv_and_score(src, bindings, kvt, wide, score, writes is not None)
    src += decl(len(bindings), "part", "vec4<f32>", "rw")
    bindings.append("rw")
    write_body = ""
    wrote = "wrote" if loads_first and writes is not None else None
    if writes is not None:
        wsrc, wb, write_body = _row_writes(writes, len(bindings), kvt, LW, PER, kv, WGT,
                                           "red", red_sub, wrote)
        src += wsrc
        bindings += wb
    if last:
        osrc, ob = out_decl(epilogue, True, len(bindings), counters=True)
        src += osrc
        bindings += ob
    low = neg_inf()
    pw = D4 + 1  # partial words a (q row, split): (m, l, 0, 0), then acc
    P = WGT // GL  # invocations a q row's statistics
    sync = sync if sync and P % sync == 0 and sync & (sync - 1) == 0 else None
    PS = P // sync if sync else P  # values a q row's statistics meet in workgroup memory
    NO = GL * LW  # output words of probs·V (a q row's word of columns each)
    hr = f"h * {G}u + q0 + r"

    k_at = "k[kb + {}u]"
    k_first = k_again = ""
    if loads_first:  # the words into variables at the start; the block reads them
        k_first, k_again = first_k_words(f"(h * {C}u + c0 + min(lid % {T}u, n - 1u)) * {LW}u",
                                         LW, wrote is not None)
        k_at = "kw{}"
    if wide:
        k_loads = "".join(f"    let w{j} = {k_at.format(j)};\n"
                          f"    let k{2 * j} = unpack_lo(w{j});\n"
                          f"    let k{2 * j + 1} = unpack_hi(w{j});\n" for j in range(LW))
    else:
        k_loads = "".join(f"    let k{j} = {k_at.format(j)};\n" for j in range(LW))
    k_row = "" if loads_first else (f"    let kb = (h * {C}u + c0 + min(c, n - 1u)) * "
                                    f"{LW}u;\n")
    raw = " + ".join(f"dot(qs[qb + {j}u], k{j})" for j in range(D4))

    def v_sum(c: str, i: int) -> str:
        """The V word of row ``c`` times its probability, into the word's accumulators."""
        load = f"v[(h * {C}u + c0 + {c}) * {LW}u + e]"
        if wide:
            return (f"      let vw{i} = {load};\n      let p{i} = sc[r * {T}u + {c}];\n"
                    f"      al = al + p{i} * unpack_lo(vw{i});\n"
                    f"      ah = ah + p{i} * unpack_hi(vw{i});\n")
        return f"      al = al + sc[r * {T}u + {c}] * {load};\n"

    acc_words = ("al", "ah") if wide else ("al",)  # 8 columns a float16 word, 4 a float32 one
    words = len(acc_words)
    unrolled = "".join(v_sum(f"c + {i * RS}u", i) for i in range(4))
    accs = "".join(f"  var {a} = vec4<f32>(0.0);\n" for a in acc_words)
    pv = f"""  {{
{accs}  let o = lid % {NO}u;
  let rs = lid / {NO}u;
  let r = o / {LW}u;
  let e = o % {LW}u;
  if (lid < {NO * RS}u) {{
    var c = rs;
    while (c + {3 * RS}u < n) {{
{unrolled}      c = c + {4 * RS}u;
    }}
    while (c < n) {{
{v_sum("c", 9)}      c = c + {RS}u;
    }}
  }}
"""

    def part_at(word: str) -> str:
        return f"part[(({hr}) * {ns}u + sp) * {pw}u + 1u + {words}u * e + {word}]"

    if RS > 1:
        pv += (f"  if (lid < {NO * RS}u) {{\n" + "".join(
            f"    pvs[({i}u * {RS}u + rs) * {NO}u + o] = {a};\n" for i, a in enumerate(acc_words))
               + "  }\n  workgroupBarrier();\n"
               + f"  if (lid < {NO}u) {{\n")
        for i in range(words):
            pv += (f"    var t{i} = vec4<f32>(0.0);\n"
                   f"    for (var s = 0u; s < {RS}u; s = s + 1u) "
                   f"{{ t{i} = t{i} + pvs[({i}u * {RS}u + s) * {NO}u + o]; }}\n"
                   f"    {part_at(f'{i}u')} = t{i};\n")
        pv += "  }\n"
        pv_decl = f"var<workgroup> pvs: array<vec4<f32>, {words * RS * NO}>;\n"
    else:
        pv += (f"  if (lid < {NO}u) {{\n"
               + "".join(f"    {part_at(f'{i}u')} = {a};\n" for i, a in enumerate(acc_words))
               + "  }\n")
        pv_decl = ""
    pv += "  }\n"  # the block holding the accumulators
    lane = lane_pv_applies(plan, subgroup)
    v_loads = v_again = ""
    if lane:
        v_loads, pv, pv_decl, v_again = _lane_pv(plan, C, G, ns, pw, words, subgroup,
                                                 loads_first and writes is not None)
    first = k_first
    v_early = ""
    if v_with_k and not loads_first:  # V's words issued with K's, after q's barrier
        v_early, v_loads = v_loads, ""
    if loads_first:  # V's words too where they are held; after a write here, again
        first, v_loads = first + v_loads, ""
        if wrote is not None:
            write_body += f"  if ({wrote}) {{\n{k_again}{v_again}  }}\n"
    q_pre = q_stats(q_red, GL, f"h * {G}u + q0", WGT, "red", red_sub)  # q rows' statistic
    combine = ""
    if last:
        combine, cdecl = last_combine(GL, G, GS, ns, D4, sync, epilogue, WGT)
        pv_decl += cdecl
    src += f"""
var<workgroup> qs: array<vec4<f32>, {GL * D4}>;
var<workgroup> sc: array<f32, {GL * T}>;
var<workgroup> red: array<f32, {WGT}>;
var<workgroup> red2: array<f32, {WGT}>;
{pv_decl}
{_split_entry(WGT, T, C)}  let q0 = wid.z * {GL}u;
{first}{write_body}{q_pre}  for (var jj = lid; jj < {GL * D4}u; jj = jj + {WGT}u) {{
    let j = q0 * {D4}u + jj;
    qs[jj] = {q_load};
  }}
  workgroupBarrier();
{v_early}  {{
    let c = lid % {T}u;
{k_row}{k_loads}    for (var r = lid / {T}u; r < {GL}u; r = r + {WGT // T}u) {{
      let qb = r * {D4}u;
      let raw = {raw};
      var val = {low};
      if (c < n) {{
        let si = ({hr}) * {C}u + c0 + c;
        val = {fn_call};
      }}
      sc[r * {T}u + c] = val;
    }}
  }}
{v_loads}  workgroupBarrier();
  let sr = lid / {P}u;
  let sj = lid % {P}u;
  var mx = {low};
  if (sr < {GL}u) {{
    for (var c = sj; c < {T}u; c = c + {P}u) {{ mx = max(mx, sc[sr * {T}u + c]); }}
  }}
{met("red", "mx", "subgroupMax", sync)}  workgroupBarrier();
  var m = {low};
  var ls = 0.0;
  if (sr < {GL}u) {{
    for (var i = 0u; i < {PS}u; i = i + 1u) {{ m = max(m, red[sr * {PS}u + i]); }}
    for (var c = sj; c < {T}u; c = c + {P}u) {{
      let sv = sc[sr * {T}u + c];
      // a row masked with -inf weighs 0 (even in a split where every row is masked)
      let pv = select(0.0, exp(sv - m), sv > {low});
      sc[sr * {T}u + c] = pv;
      ls = ls + pv;
    }}
  }}
{met("red2", "ls", "subgroupAdd", sync)}  workgroupBarrier();
{pv}  if (sr < {GL}u && sj == 0u) {{  // the row's maximum m is this invocation's already
    var lr = 0.0;
    for (var i = 0u; i < {PS}u; i = i + 1u) {{ lr = lr + red2[sr * {PS}u + i]; }}
    part[((h * {G}u + q0 + sr) * {ns}u + sp) * {pw}u] = vec4<f32>(m, lr, 0.0, 0.0);
  }}
{combine}}}
"""
    parts = heads * G * ns * (D + 4)
    esize = 2 if wide else 4
    extra = 0 if score is None else sum(4 * min(leaf.size, heads * G * C)
                                        for leaf in score[1] if not leaf.param)
    if writes is not None:  # the tuples, the updates read and the rows written
        extra += 4 * writes.tuples * 3 + 2 * 2 * writes.tuples * D * esize
    traffic = 4 * (heads * G * D + parts) + GS * 2 * heads * C * D * esize + extra
    if last:  # the last workgroups read the partials and write the output
        traffic += 4 * (parts + heads * G * D)
        return Kernel("attention_tile", src, bindings, (ns, heads, GS), traffic), None, parts
    k1 = Kernel("attention_tile", src, bindings, (ns, heads, GS), traffic)
    return k1, _combine(heads * G, ns, D, True, sync, epilogue), parts
