"""The verify pass of speculative decoding over a gated delta net, and the rollback's replay,
each in one launch, with ONNX Runtime's contract (com.microsoft GatedDeltaNet with
``state_update_capacity``, and GatedDeltaNetStateReplay).

``capture``: T tokens of the recurrence over a V-major state (Hv, Dv, Dk), in order, in one
launch. One group of ``lanes`` invocations owns a state row (head h, value row v) and keeps
it in registers for all T tokens (rows are independent: only the row's own values and the
token's k, q are read), so the state is read once and written once whatever T is. Per token::

    s = exp(g) s;  r = s · k;  delta = beta (v - r);  s += delta k;  o = scale s · q

with k and q L2-normalised in the kernel (their squares summed with the retrieval's dot).
While it runs, the first ``n = min(capture_count, C, T)`` transitions go into the compact
capsule (ORT's ``state_update`` row, struct-of-arrays): decay factors exp(g) [C, Hv], then
the normalised keys [C, Hk, Dk] (written by the first value head of each key head), then
the deltas [C, Hv, Dv]. Entries at t >= n are written as zeros (ORT leaves them unspecified;
zeros make the buffer deterministic), and ``active == 0`` makes n = 0: a zero-filled capsule.
``capture_count`` and ``active`` are read from a small buffer, so one compiled graph serves
every acceptance.

``replay``: ``S = decay S + outer(key, delta)`` for t < kept from the pre-verify state into
a destination range; one invocation per state element, offsets and ``kept`` read at run
time from ORT's metadata layout (FP32-element offsets; the unused capsule tail is never read,
other destination elements are kept: the destination is bound read-write).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import WG, Kernel, decl, grid, main_1d
from .fused import FusedOp, Leaf, functions, leaf_decls

#: an element-wise chain the kernel evaluates (``kernels/fused``'s ops and leaves)
Chain = tuple[list[FusedOp], list[Leaf]]

#: ORT GatedDeltaNet's bound on ``state_update_capacity``
MAX_CAPACITY = 8
#: GatedDeltaNetStateReplay's metadata fields, in order
META_FIELDS = ("source_offset", "destination_offset", "decay_offset", "key_offset",
               "delta_offset", "hv", "dv", "dk", "hk", "capacity", "kept_count")


def capsule_floats(hv: int, hk: int, dk: int, dv: int, capacity: int) -> int:
    """Floats of one capsule row: C * (Hv + Hk Dk + Hv Dv) (scalar decay)."""
    return capacity * (hv + hk * dk + hv * dv)


def _lit(x: float) -> str:
    """An f32 literal with the exact bits of ``x`` (as kernels/gdn.py writes constants)."""
    return f"bitcast<f32>({int(np.float32(x).view(np.uint32))}u)"


@dataclass(frozen=True)
class ReplayPrologue:
    """A replay fused into the capture after it (``capture``'s ``replay``): ``kept``
    transitions of the (masked) capsule, ``S = decay S + outer(key, delta)`` as
    ``replay`` computes it, from the source at element ``src_off`` into the destination
    at 0; the capsule's decay, key and delta sections at ``decay_off``, ``key_off``,
    ``delta_off`` (GatedDeltaNetStateReplay's metadata, known when the graph is built);
    ``in_place``: the source is the destination."""

    kept: int
    src_off: int
    decay_off: int
    key_off: int
    delta_off: int
    in_place: bool


def _initial(replay: ReplayPrologue | None, old: str, hv: int, hk: int, dk: int,
             dv: int) -> str:
    """WGSL: the statement setting ``sv[j]``, element ``i`` of the row the tokens start
    from: read from ``old``, or replayed (the same ``fma`` as ``replay``'s) and written to
    the replay's destination."""
    if replay is None:
        return f"{old}[row * {dk}u + i];"
    r = replay
    out = f"{old}[{r.src_off}u + row * {dk}u + i];\n"
    for t in range(r.kept):
        out += (f"      sv[j] = fma(rcap[{r.key_off + t * hk * dk}u + hq * {dk}u + i], "
                f"rcap[{r.delta_off + t * hv * dv}u + h * {dv}u + vr], "
                f"sv[j] * rcap[{r.decay_off + t * hv}u + h]);\n")
    return out + f"      if (ok) {{ rdst[row * {dk}u + i] = sv[j]; }}"


@dataclass(frozen=True)
class TokenViews:
    """Where token t's q, k and v rows start in the buffers ``capture`` binds: element
    ``t * stride + offset`` of each, one (stride, offset) pair per tensor (a slice of a
    [T, W] tensor along W: stride W, offset the slice's start)."""

    q: tuple[int, int]
    k: tuple[int, int]
    v: tuple[int, int]


def _token_at(views: TokenViews | None, which: int, row: int, head: str, width: int) -> str:
    """WGSL: the first element of head ``head``'s ``width`` values of token ``t`` in q (0),
    k (1) or v (2), whose token rows are ``row`` elements apart unless ``views`` says
    otherwise."""
    if views is None:
        return f"(t * {row // width}u + {head}) * {width}u"
    stride, off = (views.q, views.k, views.v)[which]
    return f"t * {stride}u + {off}u + {head} * {width}u"


def capture(tokens: int, hk: int, hv: int, dk: int, dv: int, capacity: int, *,
            scale: float, l2_eps: float | None, in_place: bool = False,
            lanes: int = 32, wg: int = 256, split_control: bool = False,
            guarded: bool = False, replay: ReplayPrologue | None = None,
            views: TokenViews | None = None, g_chain: Chain | None = None,
            beta_chain: Chain | None = None) -> Kernel:
    """The verify kernel for ``tokens`` tokens (T >= 1), ``hv`` value heads sharing ``hk``
    key/query heads (value head h reads key head h * Hk // Hv), capsule ``capacity`` C
    (0: no capsule, no control buffer). ``l2_eps``: q and k normalised as
    ``x / sqrt(sum(x²) + eps)`` (None: read as given).

    Bindings, in order: q [T, Hk, Dk], k [T, Hk, Dk], v [T, Hv, Dv], g [T, Hv] (log-space
    decay), beta [T, Hv], the old state [Hv, Dv, Dk] (absent when ``in_place``), the control
    words [capture_count, active] (i32, when C > 0), the new state (rw), the output
    [T, Hv, Dv] (rw), the capsule [C * row] (rw, when C > 0). ``split_control``: the count
    and the active flag are two one-word bindings (graph inputs of their own, as the
    compiler binds them); ``guarded``: the capacity status word last, nothing written when
    it is set (an in-place state behind a stateful graph's capacity check).

    ``replay``: the state the tokens start from is not read but made, by the replay the
    graph spells just before this pass (``ReplayPrologue``): each invocation replays its
    own elements of the row from the replay's source over the previous capsule, writes
    them to the replay's destination (the committed state) and keeps them in registers
    for its tokens. So the state is read once for both, in one launch. The old-state
    binding is then the replay's source (absent where it is the destination: a state
    replayed where it lies), the masked capsule follows it, and the destination is bound
    after the capsule (before the status word).

    ``views``: q, k and v read where they lie in wider rows (``TokenViews``: a token's
    elements at a stride and offset, as slices of one [T, W] tensor along W), so the
    slices need no launch of their own.

    ``g_chain``/``beta_chain``: g and beta computed here from the element-wise chains that
    make them (``kernels/fused``'s ops and leaves, evaluated at element t·Hv + h), their
    leaves bound in g's and beta's places: a softplus of the decay's projection and a
    sigmoid of beta's need no launches of their own.
    """
    if tokens < 1 or hv % hk or not 0 <= capacity <= MAX_CAPACITY:
        raise ValueError(f"capture: {tokens} tokens, {hk} key heads, {hv} value heads, "
                         f"capacity {capacity}")
    rep = hv // hk
    rows = hv * dv
    lanes = min(lanes, 1 << (dk.bit_length() - 1))  # a power of two, at most the row
    per_lane = -(-dk // lanes)
    rpw = wg // lanes
    n_groups = -(-rows // rpw)
    gx = min(n_groups, 65535)
    gy = -(-n_groups // gx)
    if replay is not None and in_place:
        raise ValueError("capture: a replay prologue with the state written in place")
    src = "".join(decl(i, n, "f32", "read") for i, n in enumerate(("q", "k", "v")))
    bindings = ["read"] * 3
    fns, at = "", {}
    for name, chain in (("g", g_chain), ("beta", beta_chain)):
        if chain is None:
            src += decl(len(bindings), name, "f32", "read")
            bindings.append("read")
            at[name] = f"{name}[{{}}]"
            continue
        ops, leaves = chain
        lsrc, lb = leaf_decls(leaves, len(bindings), f"{name}_")
        src += lsrc
        bindings += lb
        fns += functions(ops, leaves, f"{name}_")[0]
        at[name] = f"{name}_v{len(ops) - 1}({{}})"
    names = ([] if in_place or (replay and replay.in_place) else ["p"]) + (
        ["rcap"] if replay else [])
    src += "".join(decl(len(bindings) + i, n, "f32", "read") for i, n in enumerate(names))
    bindings += ["read"] * len(names)
    if capacity:
        for name in ("cnt", "act") if split_control else ("ctrl",):
            src += decl(len(bindings), name, "i32", "read")
            bindings.append("read")
    outs = ["st", "y"] + (["cap"] if capacity else [])
    if replay is not None:
        outs.append("rdst")
    src += "".join(decl(len(bindings) + i, n, "f32", "rw") for i, n in enumerate(outs))
    bindings += ["rw"] * len(outs)
    if guarded:
        src += decl(len(bindings), "status", "u32", "read")
        bindings.append("read")
    src += f"var<workgroup> sh: array<vec3<f32>, {wg}>;\n" + fns
    old = "st" if in_place else "rdst" if replay and replay.in_place else "p"
    key0, delta0 = capacity * hv, capacity * (hv + hk * dk)
    full = per_lane * lanes == dk
    test = "" if full else f"if (i < {dk}u) "
    ik = f"1.0 / sqrt(ks.y + {_lit(l2_eps)})" if l2_eps is not None else "1.0"
    iq = f"1.0 / sqrt(ks.z + {_lit(l2_eps)})" if l2_eps is not None else "1.0"
    if capacity:
        cnt, act = ("cnt[0]", "act[0]") if split_control else ("ctrl[0]", "ctrl[1]")
        count = (f"  var n = 0u;\n  if ({act} != 0) {{ n = u32(clamp({cnt}, 0, "
                 f"{min(capacity, tokens)})); }}\n")
        # zeros at t >= n (n <= min(C, T): every entry past the captured prefix)
        tail = f"""
  if (ok) {{
    for (var t = 0u; t < {capacity}u; t = t + 1u) {{
      if (t >= n) {{
        if (vr == 0u && t_lane == 0u) {{ cap[t * {hv}u + h] = 0.0; }}
        if (t_lane == 0u) {{ cap[{delta0}u + (t * {hv}u + h) * {dv}u + vr] = 0.0; }}
        if (first && vr == 0u) {{
          for (var j = 0u; j < {per_lane}u; j = j + 1u) {{
            let i = t_lane + j * {lanes}u;
            {test}{{ cap[{key0}u + (t * {hk}u + hq) * {dk}u + i] = 0.0; }}
          }}
        }}
      }}
    }}
  }}
"""
    else:
        count, tail = "", ""
    store = ""
    if capacity:
        store = f"""
    if (ok && t < n) {{
      if (vr == 0u && t_lane == 0u) {{ cap[t * {hv}u + h] = a; }}
      if (t_lane == 0u) {{ cap[{delta0}u + (t * {hv}u + h) * {dv}u + vr] = dl; }}
      if (first && vr == 0u) {{
        for (var j = 0u; j < {per_lane}u; j = j + 1u) {{
          let i = t_lane + j * {lanes}u;
          {test}{{ cap[{key0}u + (t * {hk}u + hq) * {dk}u + i] = k[kw + i] * ikv; }}
        }}
      }}
    }}"""

    th = f"t * {hv}u + h"  # g's and beta's element of token t, value head h

    def total(acc: str, out: str) -> str:
        # every lane sums its row's partials in the same order: the same value in each
        return (f"    sh[lid] = {acc};\n    workgroupBarrier();\n    var {out} = vec3<f32>(0.0);\n"
                f"    for (var j = 0u; j < {lanes}u; j = j + 1u) {{\n"
                f"      {out} = {out} + sh[r * {lanes}u + j];\n    }}\n    workgroupBarrier();\n")

    src += f"""
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let r = lid / {lanes}u;
  let t_lane = lid % {lanes}u;
  let row0 = (wid.y * {gx}u + wid.x) * {rpw}u + r;
  let row = min(row0, {rows - 1}u);
  let ok = row0 < {rows}u{" && status[0] == 0u" if guarded else ""};
  let h = row / {dv}u;
  let vr = row % {dv}u;
  let hq = h / {rep}u;
  let first = h % {rep}u == 0u;  // the first value head of its key head writes the key
{count}  var sv: array<f32, {per_lane}>;
  for (var j = 0u; j < {per_lane}u; j = j + 1u) {{
    let i = t_lane + j * {lanes}u;
    sv[j] = 0.0;
    {test}{{ sv[j] = {_initial(replay, old, hv, hk, dk, dv)} }}
  }}
  for (var t = 0u; t < {tokens}u; t = t + 1u) {{
    let kw = {_token_at(views, 1, hk * dk, "hq", dk)};
    let qw = {_token_at(views, 0, hk * dk, "hq", dk)};
    var acc = vec3<f32>(0.0);
    for (var j = 0u; j < {per_lane}u; j = j + 1u) {{
      let i = t_lane + j * {lanes}u;
      {test}{{
        let kv = k[kw + i];
        let qv = q[qw + i];
        acc = acc + vec3<f32>(sv[j] * kv, kv * kv, qv * qv);
      }}
    }}
{total("acc", "ks")}    let ikv = {ik};
    let iqv = {iq};
    let a = exp({at["g"].format(th)});
    let dl = {at["beta"].format(th)} * (v[{_token_at(views, 2, hv * dv, "h", dv)} + vr] - a * ks.x * ikv);
    let dk_ = dl * ikv;
    var acc2 = vec3<f32>(0.0);
    for (var j = 0u; j < {per_lane}u; j = j + 1u) {{
      let i = t_lane + j * {lanes}u;
      {test}{{
        sv[j] = a * sv[j] + dk_ * k[kw + i];
        acc2.x = acc2.x + sv[j] * q[qw + i];
      }}
    }}
{total("acc2", "os")}    if (ok && t_lane == 0u) {{
      y[(t * {hv}u + h) * {dv}u + vr] = os.x * iqv * {_lit(scale)};
    }}{store}
  }}
  if (ok) {{
    for (var j = 0u; j < {per_lane}u; j = j + 1u) {{
      let i = t_lane + j * {lanes}u;
      {test}{{ st[row * {dk}u + i] = sv[j]; }}
    }}
  }}{tail}}}
"""
    n_in = 2 * tokens * hk * dk + tokens * hv * dv + 2 * tokens * hv
    traffic = 4 * (2 * rows * dk + n_in + tokens * rows + capsule_floats(hv, hk, dk, dv, capacity)
                   + (2 if capacity else 0) + guarded)
    if replay is not None:  # the masked capsule read, the committed state written
        traffic += 4 * (capsule_floats(hv, hk, dk, dv, replay.kept) + rows * dk)
    return Kernel("gdn_capture", src, bindings, (gx, gy, 1), traffic)


def replay(hv: int, hk: int, dk: int, dv: int, capacity: int, wg: int = WG,
           guarded: bool = False, in_place: bool = False) -> Kernel:
    """GatedDeltaNetStateReplay for one geometry: each state element (h, v, i) replayed
    over the first ``kept`` capsule transitions (per-head decay, key head h * Hk // Hv).

    Bindings: the source backing, the capsule backing (read), the metadata as 11 u32 words
    (ORT's int64 fields, each < 2³²; ``META_FIELDS``), the destination backing (rw). The
    geometry is compiled in; the offsets and ``kept_count`` are read at run time (the
    caller checks ``1 <= kept <= capacity`` as ORT does: the kernel clamps to capacity).
    ``guarded``: the capacity status word last, nothing written when it is set;
    ``in_place``: the source is the destination backing (no source binding; each element
    read and written by one invocation, as a stateful graph's state replayed where it lies)."""
    if min(hv, hk, dk, dv, capacity) < 1 or capacity > MAX_CAPACITY:
        raise ValueError(f"replay: Hv {hv}, Hk {hk}, Dk {dk}, Dv {dv}, capacity {capacity}")
    n = hv * dv * dk
    gx, gy, _ = grid(n, wg)
    names = ([] if in_place else ["src"]) + ["cap", "md", "dst"]
    types = {"src": "f32", "cap": "f32", "md": "u32", "dst": "f32"}
    src = "".join(decl(j, x, types[x], "rw" if x == "dst" else "read") for j, x in enumerate(names))
    if guarded:
        src += decl(len(names), "status", "u32", "read")
    src += main_1d(gx, wg)
    stop = " || status[0] != 0u" if guarded else ""
    src += f"""  if (i >= {n}u{stop}) {{ return; }}
  let h = i / {dv * dk}u;
  let vr = (i / {dk}u) % {dv}u;
  let e = i % {dk}u;
  let hq = h * {hk}u / {hv}u;
  let kept = min(md[10], {capacity}u);
  var s = {"dst" if in_place else "src"}[md[0] + i];
  for (var t = 0u; t < kept; t = t + 1u) {{
    let a = cap[md[2] + t * {hv}u + h];
    let kk = cap[md[3] + (t * {hk}u + hq) * {dk}u + e];
    let dl = cap[md[4] + (t * {hv}u + h) * {dv}u + vr];
    s = fma(kk, dl, s * a);
  }}
  dst[md[1] + i] = s;
}}
"""
    traffic = 4 * (2 * n + capacity * (hv + hk * dk + hv * dv) + 11 + guarded)
    return Kernel("gdn_replay", src, ["read"] * (3 - in_place) + ["rw"] + ["read"] * guarded,
                  (gx, gy, 1), traffic)
