"""One decode step (M = 1) of the gated delta rule in one launch.

The graph spells a gated delta net step over a V-major state ``P`` (heads, Dv, Dk) (ORT
GatedDeltaNet's layout) as separate ops, each a launch that streams the state again::

    s = P * g                      g: per-head decay (exp of the gate chain)
    r = s · k                      retrieval, one value per state row
    d = f(r, v, beta, ...)         element-wise per row (beta * (v - r))
    N = s + d ⊗ k                  rank-1 update: the new state
    o = e(N · q, ...)              output matvec and its element-wise tail (the scale)

Every state row (head b, value row i) is independent of the others: one group of
``lanes`` invocations reads the row once, dots it with k, computes the row's delta from
the graph's own element-wise chain (``kernels/fused.py``, the retrieval as its *param*
leaf), writes the updated row, dots it with q and writes the row's output through the
output chain. Each element is read and written by the same invocation, so the new state
may be the old state's own buffer (the stateful in-place update) or another buffer (the
non-stateful page's output, a double buffer).

Where the graph L2-normalises q and k per head just before (``x / sqrt(sum(x²) + eps)``),
the kernel reads them raw and sums their squares with the retrieval's partial dots: each
row group sees the whole head vector, so the norm costs no launch and no pass of its own.

Partial dots are summed with ``subgroupAdd`` when the subgroup is exactly ``lanes`` wide,
else through workgroup memory (two barriers per sum). Every invocation evaluates the
row's decay and delta (a few scalar ops) instead of broadcasting them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import shapes as S
from .common import Kernel, decl, esize, offset_fn
from .fused import FusedOp, Leaf, functions, leaf_decls

#: a value source: an element-wise group (ops, leaves), its root evaluated per head/row
Chain = tuple[Sequence[FusedOp], Sequence[Leaf]]


def gated_delta(batch: Sequence[int], dv: int, dk: int, *, k_strides: Sequence[int],
                q_strides: Sequence[int], k_size: int, q_size: int, decay: Chain,
                decay_strides: Sequence[int], delta: Chain, out_chain: Chain | None,
                in_place: bool, guarded: bool = False, lanes: int = 32, wg: int = 256,
                subgroup: int | None = None, k_eps: float | None = None,
                q_eps: float | None = None, k_major: bool = False,
                q_scale: float = 1.0, state: str = "f32", k_offset: int = 0,
                q_offset: int = 0, k_type: str = "f32", q_type: str = "f32",
                cols: int = 0) -> Kernel:
    """The kernel for a state of ``batch`` heads × (dv, dk), rows of dk contiguous values;
    ``k_major``: each head's state stored (dk, dv) instead (ORT LinearAttention's layout):
    a row's values dv apart, read as scalars.

    ``k_strides``/``q_strides``/``decay_strides``: per batch axis, the element offset of a
    head's k and q vectors (dk long) and of its decay in the decay chain's root (0 on
    broadcast axes: grouped q/k heads). ``delta``: evaluated at the row index of the
    (batch, dv, 1) retrieval with the retrieval as its param; ``out_chain`` likewise with
    the row's output (None: the output written as is).

    Bindings: the old state (read; absent when ``in_place``), k, q, the decay's, the
    delta's and the output chain's leaves, the new state (rw), the output (batch, dv, 1)
    (rw), the capacity status when ``guarded`` (nothing is written when it is set).
    ``k_eps``/``q_eps``: k / q are read raw and L2-normalised here with that epsilon.
    ``q_scale``: q's constant factor (a graph that scales q before the output product).
    ``state``: the state buffers' element type: "f16" (a float16 model's recurrent state,
    as onnxruntime-genai's q4f16 Qwen3.5 export carries it) is read widened to f32 and the
    new state rounded to f16 when written; the arithmetic is f32 either way.
    ``k_offset``/``q_offset``: where k's and q's elements start in their buffers (a slice
    of a wider row read where it lies; multiples of 4).
    ``k_type``/``q_type``: k's and q's buffers' element types: "f16" (a float16 model's
    vectors, the norms folded in) is read widened to f32, the arithmetic f32 as the graph
    computes the step.
    ``cols`` (with ``k_major``; ``KernelOptions.gdn`` "…_cols[ROWS]"; 0: off): rows a
    workgroup, its adjacent invocations taking consecutive rows (a K-major head's adjacent
    values), each a share of the dk positions (``lid / cols + j · shares``), so every load
    of the state is a contiguous run of ``cols`` values, the shares summed through workgroup
    memory; else a row's ``lanes`` invocations read its values dv apart.
    """
    if k_offset % 4 or q_offset % 4:
        raise ValueError(f"gated_delta: k and q offsets {k_offset}, {q_offset}: multiples of 4")
    for what, t in (("state", state), ("k_type", k_type), ("q_type", q_type)):
        if t not in ("f32", "f16"):
            raise ValueError(f"{what} = {t!r}; accepted: f32, f16")
    heads = S.size(batch)
    rows = heads * dv
    vw = 4 if dk % 4 == 0 and not k_major else 1
    vt = "vec4<f32>" if vw == 4 else "f32"
    svt = vt.replace("f32", state)  # the state buffers' element type
    words = dk // vw
    lanes = min(lanes, 1 << (words.bit_length() - 1))  # a power of two, at most the row
    cols = cols if k_major else 0
    if cols and (wg % cols or cols & (cols - 1)):
        raise ValueError(f"gated_delta: {cols} rows a workgroup must be a power of two "
                         f"dividing its {wg} invocations")
    if cols:  # ``cols`` rows a workgroup, its shares of dk summed in workgroup memory
        lanes = wg // cols
    per_lane = -(-words // lanes)
    rpw = cols or wg // lanes  # rows a workgroup
    n_groups = -(-rows // rpw)
    gx = min(n_groups, 65535)
    gy = -(-n_groups // gx)
    use_sub = subgroup == lanes and not cols

    src, bindings = "", []
    if not in_place:
        src += decl(0, "p", svt, "read")
        bindings.append("read")
    src += (decl(len(bindings), "k", vt.replace("f32", k_type), "read")
            + decl(len(bindings) + 1, "q", vt.replace("f32", q_type), "read"))
    bindings += ["read", "read"]
    fns = ""
    calls = {}
    for prefix, chain in (("g_", decay), ("d_", delta), ("e_", out_chain)):
        if chain is None:
            continue
        ops, leaves = chain
        lsrc, lb = leaf_decls(leaves, len(bindings), prefix)
        fsrc, takes_s = functions(ops, leaves, prefix)
        src += lsrc
        fns += fsrc
        bindings += lb
        calls[prefix] = (f"{prefix}v{len(ops) - 1}", takes_s)
    src += decl(len(bindings), "st", svt, "rw") + decl(len(bindings) + 1, "y", "f32", "rw")
    bindings += ["rw", "rw"]
    if guarded:
        src += decl(len(bindings), "status", "u32", "read")
        bindings.append("read")
    src += fns
    src += offset_fn("kb", batch or (1,), tuple(k_strides) or (0,), k_offset)
    src += offset_fn("qb", batch or (1,), tuple(q_strides) or (0,), q_offset)
    src += offset_fn("gb", batch or (1,), tuple(decay_strides) or (0,))
    norms = k_eps is not None or q_eps is not None
    # the first sums: the retrieval's dot and, when folded, |k|² and |q|² (one reduction)
    st1 = "vec4<f32>" if norms else "f32"
    if not use_sub:
        src += f"var<workgroup> sh: array<{st1}, {wg}>;\n"

    def call(prefix: str, index: str, param: str) -> str:
        name, takes_s = calls[prefix]
        return f"{name}({index}, {param})" if takes_s else f"{name}({index})"

    # where the row's j-th partial lies in ``sh``: a row's lanes adjacent, or (``cols``) its
    # shares ``cols`` apart
    share = f"j * {cols}u + r" if cols else f"r * {lanes}u + j"
    rt = (f"  let r = lid % {cols}u;\n  let t = lid / {cols}u;\n" if cols
          else f"  let r = lid / {lanes}u;\n  let t = lid % {lanes}u;\n")

    def total(acc: str, out: str, last: bool, vt_: str = "f32") -> str:
        if use_sub:
            return f"  let {out} = subgroupAdd({acc});\n"
        # every lane sums its row's partials in the same order: the same value in each
        init = "0.0" if vt_ == "f32" else f"{vt_}(0.0)"
        store, part = (acc, "") if vt_ == st1 else (f"{st1}({acc})", ".x")
        return (f"  sh[lid] = {store};\n  workgroupBarrier();\n  var {out} = {init};\n"
                f"  for (var j = 0u; j < {lanes}u; j = j + 1u) {{\n"
                f"    {out} = {out} + sh[{share}]{part};\n  }}\n"
                + ("" if last else "  workgroupBarrier();\n"))

    old = "st" if in_place else "p"
    dot = "dot({}, {})" if vw == 4 else "{} * {}"
    full = per_lane * lanes == words  # no lane runs past the row
    test = "" if full else f"if (w < {words}u) "
    ok = f"row0 < {rows}u" + (" && status[0] == 0u" if guarded else "")
    out_val = call("e_", "row", "os") if out_chain is not None else "os"
    kx = "k[kw + w]" if k_type == "f32" else f"{vt}(k[kw + w])"  # k's element, f32
    qx = "q[qw + w]" if q_type == "f32" else f"{vt}(q[qw + w])"
    q_load = f"      let qv = {qx};\n" if q_eps is not None else ""
    if norms:
        first = f"      acc = acc + vec4<f32>({dot.format('sv[j]', 'kv')}, "
        first += dot.format("kv", "kv") if k_eps is not None else "0.0"
        first += ", " + (dot.format("qv", "qv") if q_eps is not None else "0.0") + ", 0.0);\n"
    else:
        first = f"      acc = acc + {dot.format('sv[j]', 'kv')};\n"
    lit = lambda e: f"bitcast<f32>({int(np.float32(e).view(np.uint32))}u)"  # noqa: E731 - exact
    kk = f"1.0 / sqrt(ks.y + {lit(k_eps)})" if k_eps is not None else "1.0"
    qq = f"1.0 / sqrt(ks.z + {lit(q_eps)})" if q_eps is not None else "1.0"
    dot_k = "ks.x" if norms else "ks"
    sidx = f"sw + w * {dv}u" if k_major else "sw + w"
    scale = f" * {lit(q_scale)}" if q_scale != 1.0 else ""
    src += f"""
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
{rt}  let row0 = (wid.y * {gx}u + wid.x) * {rpw}u + r;
  let row = min(row0, {rows - 1}u);
  let ok = {ok};
  let b = row / {dv}u;
  let kw = kb(b) / {vw}u;
  let qw = qb(b) / {vw}u;
  let sw = {f"b * {dk * dv}u + row % {dv}u" if k_major else f"row * {words}u"};
  let g = {call("g_", "gb(b)", "")};
  var sv: array<{vt}, {per_lane}>;
  var acc = {st1}(0.0);
  for (var j = 0u; j < {per_lane}u; j = j + 1u) {{
    let w = t + j * {lanes}u;
    {test}{{
      sv[j] = {vt}({old}[{sidx}]);
      let kv = {kx};
{q_load}{first}    }}
  }}
{total("acc", "ks", False, st1)}  let ik = {kk};
  let iq = {qq};
  let dl = {call("d_", "row", f"g * {dot_k} * ik")};
  let dk_ = dl * ik;
  var acc2 = 0.0;
  for (var j = 0u; j < {per_lane}u; j = j + 1u) {{
    let w = t + j * {lanes}u;
    {test}{{
      let nw = g * sv[j] + dk_ * {kx};
      if (ok) {{ st[{sidx}] = {svt}(nw); }}
      acc2 = acc2 + {dot.format("nw", qx)};
    }}
  }}
{total("acc2", "o2", True)}  let os = o2 * iq{scale};
  if (ok && t == 0u) {{ y[row] = {out_val}; }}
}}
"""
    traffic = (esize(k_type) * k_size + esize(q_type) * q_size + 4 * rows
               + 2 * rows * dk * esize(state))
    for chain, n in ((decay, heads), (delta, rows), (out_chain, rows)):
        if chain is not None:
            traffic += sum(4 * min(leaf.size, n) for leaf in chain[1] if not leaf.param)
    return Kernel("gated_delta", src, bindings, (gx, gy, 1), traffic)
