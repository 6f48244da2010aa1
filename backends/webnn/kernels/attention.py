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

from .common import Kernel, decl, grid, lowest, main_1d
from .fused import FusedOp, Leaf, functions, leaf_decls

WG = 256


def split_rows(capacity: int, q_rows: int, d: int, shared_floats: int) -> int:
    """Cache rows per split: ~64 splits per head (enough workgroups in flight, a short
    combine), at least 32 rows, within workgroup memory (q rows + scores)."""
    t = max(32, -(-capacity // 64))
    t = -(-t // 32) * 32
    room = (shared_floats - q_rows * d - q_rows - 16) // max(1, q_rows)
    return max(1, min(t, room, capacity))


def flash_decode(heads: int, q_rows: int, capacity: int, d: int,
                 score: tuple[Sequence[FusedOp], Sequence[Leaf]] | None,
                 shared_floats: int) -> tuple[Kernel, Kernel, int]:
    """(pass 1, pass 2, partial-buffer elements) for q (heads, q_rows, d), K and V
    (heads, capacity, d), output (heads, q_rows, d).

    ``score``: the element-wise chain applied to each raw score, as fused ops over the
    (heads, q_rows, capacity) score layout whose one *param* leaf is the raw score;
    its other leaves bind after q, K, V (then the partials). None: scores used raw.
    """
    T = split_rows(capacity, q_rows, d, shared_floats)
    ns = -(-capacity // T)
    G, D, C = q_rows, d, capacity
    P = D + 2  # per (row, split): m, l, acc[D]
    src = decl(0, "q", "f32", "read") + decl(1, "k", "f32", "read") + decl(2, "v", "f32", "read")
    bindings = ["read", "read", "read"]
    fn_call = "raw"
    if score is not None:
        ops, leaves = score
        lsrc, lb = leaf_decls(leaves, 3)
        fsrc, takes_s = functions(ops, leaves)
        src += lsrc + fsrc
        bindings += lb
        last = len(ops) - 1
        fn_call = f"v{last}(si, raw)" if takes_s else f"v{last}(si)"
    src += decl(len(bindings), "part", "f32", "rw")
    bindings.append("rw")
    src += f"""
var<workgroup> qs: array<f32, {G * D}>;
var<workgroup> sc: array<f32, {G * T}>;
var<workgroup> mrow: array<f32, {G}>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let h = wid.y;
  let sp = wid.x;
  let c0 = sp * {T}u;
  let n = min({T}u, {C}u - c0);
  for (var j = lid; j < {G * D}u; j = j + {WG}u) {{ qs[j] = q[h * {G * D}u + j]; }}
  workgroupBarrier();
  for (var j = lid; j < {G * T}u; j = j + {WG}u) {{
    let r = j / {T}u;
    let c = j % {T}u;
    var val = {lowest("f32")};
    if (c < n) {{
      let kb = (h * {C}u + c0 + c) * {D}u;
      var raw = 0.0;
      for (var e = 0u; e < {D}u; e = e + 1u) {{ raw = raw + qs[r * {D}u + e] * k[kb + e]; }}
      let si = (h * {G}u + r) * {C}u + c0 + c;
      val = {fn_call};
    }}
    sc[j] = val;
  }}
  workgroupBarrier();
  if (lid < {G}u) {{
    var m = {lowest("f32")};
    for (var c = 0u; c < n; c = c + 1u) {{ m = max(m, sc[lid * {T}u + c]); }}
    mrow[lid] = m;
  }}
  workgroupBarrier();
  for (var j = lid; j < {G * T}u; j = j + {WG}u) {{
    let c = j % {T}u;
    // a row masked with -inf weighs 0 (even in a split where every row is masked)
    sc[j] = select(0.0, exp(sc[j] - mrow[j / {T}u]), c < n && sc[j] > {lowest("f32")});
  }}
  workgroupBarrier();
  for (var j = lid; j < {G * D}u; j = j + {WG}u) {{
    let r = j / {D}u;
    let e = j % {D}u;
    var a = 0.0;
    for (var c = 0u; c < n; c = c + 1u) {{ a = a + sc[r * {T}u + c] * v[(h * {C}u + c0 + c) * {D}u + e]; }}
    part[((h * {G}u + r) * {ns}u + sp) * {P}u + 2u + e] = a;
  }}
  if (lid < {G}u) {{
    var l = 0.0;
    for (var c = 0u; c < n; c = c + 1u) {{ l = l + sc[lid * {T}u + c]; }}
    let b = ((h * {G}u + lid) * {ns}u + sp) * {P}u;
    part[b] = mrow[lid];
    part[b + 1u] = l;
  }}
}}
"""
    parts = heads * G * ns * P
    extra = 0 if score is None else sum(4 * min(leaf.size, heads * G * C)
                                        for leaf in score[1] if not leaf.param)
    k1 = Kernel("attention_flash", src, bindings, (ns, heads, 1),
                4 * (heads * G * D + 2 * heads * C * D + parts) + extra)
    nout = heads * G * D
    gx, gy, gz = grid(nout)
    src2 = decl(0, "part", "f32", "read") + decl(1, "out", "f32", "rw") + main_1d(gx) + f"""
  if (i >= {nout}u) {{ return; }}
  let hr = i / {D}u;
  let e = i % {D}u;
  let b = hr * {ns * P}u;
  var mx = {lowest("f32")};
  for (var s = 0u; s < {ns}u; s = s + 1u) {{ mx = max(mx, part[b + s * {P}u]); }}
  var l = 0.0;
  var a = 0.0;
  for (var s = 0u; s < {ns}u; s = s + 1u) {{
    let w = exp(part[b + s * {P}u] - mx);
    l = l + part[b + s * {P}u + 1u] * w;
    a = a + part[b + s * {P}u + 2u + e] * w;
  }}
  out[i] = a / l;
}}
"""
    k2 = Kernel("attention_combine", src2, ["read", "rw"], (gx, gy, gz),
                4 * (parts + nout))
    return k1, k2, parts
