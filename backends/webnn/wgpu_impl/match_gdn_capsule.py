"""Finding what ``convert_gdn`` builds for ORT's speculative-decoding GDN ops, for the
one-launch kernels of ``kernels/gdn_capsule.py``: a verify pass with capture (GatedDeltaNet
with ``state_update_capacity``) and a replay (GatedDeltaNetStateReplay).

The capture, over the V-major state ``P`` viewed (Hk, rep, Dv, Dk), token by token::

    a = exp(g)                                   g [T, Hv]: the kernel reads g
    s_j = mul(S_j, a[j])        S_0 = P, S_j+1 = n_j
    r_j = matmul(s_j, k[j])     k: the L2-normalised keys (the norm folded in) or raw
    d_j = mul(sub(v[j], r_j), beta[j])
    n_j = add(s_j, mul(d_j, k[j]))
    y_j = mul(matmul(n_j, q[j]), scale)
    y = concat(y_j) (T > 1), the new state n_T-1,
    capsule = concat(sections of a[:rows], k[:rows], concat(d_j)) masked by ``where`` from
              greater(count [· (active != 0)], arange(rows)) and padded with zeros to C rows,
              or (a full capture, C = T: the standard-op form ``model.export_deferred``
              writes) the sections a, k and concat(d_j) as they are, the count then C

each x[j] a one-token slice (views in between). The replay: from a slice of the source,
``s = add(mul(s, decay_t), mul(delta_t, gather(key_t, heads)))`` for t < kept over slices
of the capsule at constant offsets, written alone or concatenated between the slices of
the destination it keeps.

Every op in between must be read only inside the pattern (y, the new state and the capsule
may be read outside), so a graph that only looks similar keeps its generic launches. The
pass runs before loop fusion, pinning what the kernel reads and writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import shapes as S
from ..ir import Node
from ..kernels import gdn_capsule as GC
from ..stateful import root
from . import fusion
from .launches import CopyLaunch, KernelLaunch, Slot
from .lowerings import Site, claims
from .match_gdn import _l2_norm


@dataclass
class Capture:
    """A verify pass with capture: the kernel writes ``out`` (y), ``state_out``, ``capsule``."""

    out: Node
    state_out: Node
    capsule: Node | None
    state_in: Node
    q: Node
    k: Node
    v: Node
    g: Node
    beta: Node
    count: Node | None
    active: Node | None
    dims: tuple[int, int, int, int, int, int]  # T, Hk, Hv, Dk, Dv, C
    scale: float
    l2_eps: float | None
    ops: list[Node] = field(default_factory=list)  # every op the kernel computes
    #: the replay that makes ``state_in``, computed by this launch (``fuse_replays``)
    replay: Replay | None = None
    #: q, k, v read where they lie (``_token_views``): None, or the kernel's ``TokenViews``
    views: GC.TokenViews | None = None
    #: g and beta computed by the kernel from the chains making them (``_own_chains``)
    g_chain: fusion.Group | None = None
    beta_chain: fusion.Group | None = None

    @property
    def inputs(self) -> list[Node]:
        """What the kernel reads before the old state, in binding order: q, k, v, then g
        and beta (or the leaves of the chains making them)."""
        g = self.g_chain.leaves if self.g_chain is not None else [self.g]
        beta = self.beta_chain.leaves if self.beta_chain is not None else [self.beta]
        return [self.q, self.k, self.v, *g, *beta]

    @property
    def leaves(self) -> list[Node]:
        """What the kernel reads, in binding order (the old state after beta; with a
        replay, its source and capsule instead)."""
        ctl = [x for x in (self.count, self.active) if x is not None]
        old = [self.state_in] if self.replay is None else [self.replay.src, self.replay.capsule]
        return [*self.inputs, *old, *ctl]

    @property
    def written(self) -> list[Node]:
        """Written besides ``out`` (with a replay, its result last)."""
        return ([self.state_out] + ([self.capsule] if self.capsule is not None else [])
                + ([self.replay.out] if self.replay is not None else []))


@dataclass
class Replay:
    """GatedDeltaNetStateReplay: the kernel writes ``out`` (the destination, or the state)."""

    out: Node
    src: Node
    capsule: Node
    dst: Node | None  # the destination read for the elements kept (None: all replaced)
    meta: tuple[int, ...]  # GC.META_FIELDS
    ops: list[Node] = field(default_factory=list)

    @property
    def leaves(self) -> list[Node]:
        return [self.src, self.capsule] + ([self.dst] if self.dst is not None else [])

    @property
    def written(self) -> list[Node]:
        return []


def _op(x: Node, name: str) -> bool:
    return x.kind == "op" and x.op == name


def _f32(*xs: Node) -> bool:
    return all(x.dtype.wgsl == "f32" for x in xs)


class _Walk:
    """The graph's readers (through views) and the ops a match has visited."""

    def __init__(self, nodes: list[Node]) -> None:
        self.cons = fusion.consumers_of(nodes)
        self.ops: dict[int, Node] = {}

    def readers(self, x: Node) -> list[Node]:
        return self.cons.get(x.id, [])

    def take(self, *xs: Node) -> None:
        self.ops.update((x.id, x) for x in xs)

    def other(self, o: Node, x: Node) -> Node | None:
        """The operand of binary ``o`` that is not (a view of) ``x``."""
        a, b = o.inputs
        return b if root(a) is x else a if root(b) is x else None


def _token(view: Node, j: int, base_shape: tuple[int, ...]) -> Node | None:
    """The base tensor of which ``view`` is the one-token slice ``j`` (all of the other
    axes), its logical shape ``base_shape``; else None."""
    s = root(view)
    if not _op(s, "slice") or tuple(s.inputs[0].shape) != base_shape:
        return None
    want = (j,) + (0,) * (len(base_shape) - 1)
    if (tuple(s.attrs["starts"]) != want or any(x != 1 for x in s.attrs["strides"])
            or tuple(s.shape) != (1, *base_shape[1:])):
        return None
    return root(s.inputs[0])


def _prefix(x: Node, rows: int, base_shape: tuple[int, ...]) -> Node | None:
    """The base of a slice of its first ``rows`` tokens."""
    if not _op(x, "slice") or tuple(x.inputs[0].shape) != base_shape:
        return None
    if (any(v != 0 for v in x.attrs["starts"]) or any(v != 1 for v in x.attrs["strides"])
            or tuple(x.shape) != (rows, *base_shape[1:])):
        return None
    return root(x.inputs[0])


def _const(x: Node, want: np.ndarray) -> bool:
    x = root(x)
    return (x.kind == "constant" and x.value.size == want.size
            and np.array_equal(np.asarray(x.value).reshape(-1), want.reshape(-1)))


def _scalar(x: Node) -> float | None:
    x = root(x)
    if x.kind == "constant" and S.size(x.shape) == 1:
        return float(np.asarray(x.value).reshape(-1)[0])
    return None


def _step(w: _Walk, j: int, state: Node, a: Node, dims: tuple, bases: dict) -> tuple | None:
    """Token j's ops from the state S_j (an op, or P's view): (n_j, d_j, y_j, scale), the
    bases of the token slices recorded in ``bases`` (k, q, v, beta must agree over j)."""
    t, hk, rep, dv, dk = dims
    hv = hk * rep
    ss = [o for o in w.readers(root(state)) if _op(o, "mul") and o.shape == (hk, rep, dv, dk)]
    for s in ss:
        av = w.other(s, root(state))
        if av is None or tuple(av.shape) != (hk, rep, 1, 1) or _token(av, j, (t, hv)) is not a:
            continue
        rs = w.readers(s)
        if len(rs) != 2:
            return None
        r = next((o for o in rs if _op(o, "matmul") and root(o.inputs[0]) is s), None)
        n = next((o for o in rs if _op(o, "add") and o is not r), None)
        if r is None or n is None or tuple(r.inputs[1].shape) != (hk, 1, dk, 1):
            return None
        kb = _token(r.inputs[1], j, (t, hk, dk))
        sub = w.readers(r)
        if kb is None or len(sub) != 1 or not _op(sub[0], "sub") or root(sub[0].inputs[1]) is not r:
            return None
        sub = sub[0]
        vb = _token(sub.inputs[0], j, (t, hv, dv))
        ds = w.readers(sub)
        if vb is None or tuple(sub.inputs[0].shape) != (hk, rep, dv, 1) or len(ds) != 1 \
                or not _op(ds[0], "mul"):
            return None
        d = ds[0]
        bv = w.other(d, sub)
        bb = _token(bv, j, (t, hv)) if bv is not None and tuple(bv.shape) == (hk, rep, 1, 1) else None
        u = next((o for o in w.readers(d) if _op(o, "mul")), None)
        if bb is None or u is None or w.readers(u) != [n] or w.other(n, s) is None \
                or root(w.other(n, s)) is not u:
            return None
        kr = w.other(u, d)
        if kr is None or tuple(kr.shape) != (hk, 1, 1, dk) or root(kr) is not root(r.inputs[1]):
            return None
        o = next((x for x in w.readers(n) if _op(x, "matmul") and root(x.inputs[0]) is n), None)
        if o is None or tuple(o.inputs[1].shape) != (hk, 1, dk, 1):
            return None
        qb = _token(o.inputs[1], j, (t, hk, dk))
        ys = w.readers(o)
        if qb is None or len(ys) != 1 or not _op(ys[0], "mul"):
            return None
        y = ys[0]
        scale = _scalar(w.other(y, o)) if w.other(y, o) is not None else None
        got = {"k": kb, "q": qb, "v": vb, "beta": bb}
        if scale is None or any(bases.setdefault(n_, b) is not b for n_, b in got.items()):
            return None
        w.take(s, r, sub, d, u, n, o, y, root(r.inputs[1]), root(o.inputs[1]), root(sub.inputs[0]),
               root(bv), root(av))
        return n, d, y, scale
    return None


def _count(w: _Walk, mask: Node, rows: int) -> tuple[Node, Node | None] | None:
    """(count, active or None) from ``greater(view(count_f), arange(rows))``."""
    if not _op(mask, "greater") or not _const(mask.inputs[1], np.arange(rows, dtype=np.float32)):
        return None
    cf = root(mask.inputs[0])
    w.take(mask, cf)
    if _op(cf, "cast"):
        c = root(cf.inputs[0])
        return (c, None) if c.dtype.wgsl == "i32" and S.size(c.shape) == 1 else None
    if not _op(cf, "mul"):
        return None
    for x, y in (cf.inputs, cf.inputs[::-1]):
        x, y = root(x), root(y)
        if _op(x, "cast") and _op(y, "cast") and _op(root(y.inputs[0]), "not_equal"):
            ne = root(y.inputs[0])
            c, act = root(x.inputs[0]), root(ne.inputs[0])
            if (_const(ne.inputs[1], np.zeros(1)) and c.dtype.wgsl == act.dtype.wgsl == "i32"
                    and S.size(c.shape) == S.size(act.shape) == 1):
                w.take(x, y, ne)
                return c, act
    return None


def _section(w: _Walk, x: Node, width: int, rows: int, cap: int
             ) -> tuple[Node, Node | None] | None:
    """(the masked data's view, the mask) of one capsule section [1, C * width]; the mask
    None where the section is the data itself (a full capture: rows = C)."""
    if rows == cap and not _op(root(x), "where"):
        return x, None
    x = root(x)
    if rows < cap:
        if not (_op(x, "concat") and len(x.inputs) == 2 and x.attrs["axis"] == 0
                and _const(x.inputs[1], np.zeros((cap - rows) * width))):
            return None
        w.take(x)
        x = root(x.inputs[0])
    if not _op(x, "where") or tuple(x.shape) != (rows, width) or not _const(x.inputs[2], np.zeros(1)):
        return None
    w.take(x)
    return x.inputs[1], root(x.inputs[0])


def _capsule(w: _Walk, cap_node: Node, a: Node, k: Node, deltas: list[Node], dims: tuple,
             ) -> tuple[int, Node, Node | None] | None:
    """(C, count, active) when ``cap_node`` is the capsule of this verify pass."""
    t, hk, hv, dk, dv = dims
    row = hv + hk * dk + hv * dv
    if not (_op(cap_node, "concat") and cap_node.attrs["axis"] == 1 and len(cap_node.inputs) == 3
            and len(cap_node.shape) == 2 and cap_node.shape[1] % row == 0):
        return None
    cap = cap_node.shape[1] // row
    rows = min(cap, t)
    if not 1 <= cap <= GC.MAX_CAPACITY:
        return None
    w.take(cap_node)
    secs = [_section(w, x, wd, rows, cap) for x, wd in zip(cap_node.inputs, (hv, hk * dk, hv * dv),
                                                            strict=True)]
    if any(s is None for s in secs) or len({None if m is None else m.id for _, m in secs}) != 1:
        return None
    (dec, mask), (key, _), (dl, _) = secs
    if mask is None:  # the whole decays and keys, read where they lie
        if root(dec) is not a or root(key) is not k:
            return None
    elif _prefix(root(dec), rows, (t, hv)) is not a or _prefix(root(key), rows, (t, hk, dk)) is not k:
        return None
    else:
        w.take(root(dec), root(key))
    dl = root(dl)
    parts = [root(x) for x in dl.inputs] if _op(dl, "concat") and dl.attrs["axis"] == 0 else [dl]
    if [p.id for p in parts] != [d.id for d in deltas[:rows]]:
        return None
    if len(parts) > 1:
        w.take(dl)
    if mask is None:
        return cap, None, None
    got = _count(w, mask, rows)
    return None if got is None else (cap, *got)


def _capture(o: Node, w: _Walk, pinned: set[int]) -> Capture | None:
    """The verify pass whose decays are ``o = exp(g)``, or None."""
    if not (_op(o, "exp") and len(o.shape) == 2 and _f32(o)):
        return None
    t, hv = o.shape
    g = root(o.inputs[0])
    starts = [x for x in w.readers(o) if _token(x, 0, (t, hv)) is o]
    for a0 in starts:
        s0 = [x for x in w.readers(a0) if _op(x, "mul") and len(x.shape) == 4]
        if len(s0) != 1 or w.other(s0[0], a0) is None:
            continue
        pv = w.other(s0[0], a0)
        hk, rep, dv, dk = pv.shape
        p = root(pv)
        if hk * rep != hv or S.size(p.shape) != hv * dv * dk or not _f32(p, g):
            continue
        w.ops = {o.id: o}
        bases: dict[str, Node] = {}
        state, deltas, ys, scales = pv, [], [], set()
        for j in range(t):
            got = _step(w, j, state, o, (t, hk, rep, dv, dk), bases)
            if got is None:
                break
            state, d, y, sc = got
            deltas.append(d)
            ys.append(y)
            scales.add(sc)
        if len(ys) != t or len(scales) != 1:
            continue
        m = _finish(o, w, pinned, p, g, state, deltas, ys, bases, (t, hk, hv, dk, dv), scales.pop())
        if m is not None:
            return m
    return None


def _finish(a: Node, w: _Walk, pinned: set[int], p: Node, g: Node, state: Node,
            deltas: list[Node], ys: list[Node], bases: dict, dims: tuple, scale: float
            ) -> Capture | None:
    """The output's concat, the capsule, the folded norms, and the closure check."""
    t, hk, hv, dk, dv = dims
    if t == 1:
        out = ys[0]
    else:
        cats = w.readers(ys[0])
        out = cats[0] if len(cats) == 1 and _op(cats[0], "concat") else None
        if out is None or out.attrs["axis"] != 0 or [root(x).id for x in out.inputs] != [y.id for y in ys]:
            return None
        w.take(out)
    k, q = bases["k"], bases["q"]
    # the capsule: the decays' one reader besides the token slices
    extra = [x for x in w.readers(a) if x.id not in w.ops]
    capsule = count = active = None
    cap = 0
    if extra:  # slice -> where -> (the zero rows' concat) -> the sections' concat, or that
        x = extra[0] if len(extra) == 1 else None
        direct = x is not None and _op(x, "concat") and x.attrs["axis"] == 1
        for _ in range(0 if direct else 3):
            rs = w.readers(x) if x is not None else []
            x = rs[0] if len(rs) == 1 else None
            if x is not None and _op(x, "concat") and x.attrs["axis"] == 1:
                break
        got = _capsule(w, x, a, k, deltas, (t, hk, hv, dk, dv)) if x is not None else None
        if got is None:
            return None
        (cap, count, active), capsule = got, x
    # q's and k's norms folded in when both fold over float32 vectors, else read as given
    kn = _l2_norm(k, w.cons, set(), pinned, {x.id for x in w.readers(k)} & set(w.ops), dk)
    qn = _l2_norm(q, w.cons, set(), pinned, {x.id for x in w.readers(q)} & set(w.ops), dk)
    eps = None
    if kn is not None and qn is not None and kn.eps == qn.eps and _f32(kn.x, qn.x):
        eps, k, q = kn.eps, kn.x, qn.x
        w.take(*kn.ops, *qn.ops)
    m = Capture(out, state, capsule, p, q, k, bases["v"], g, bases["beta"], count, active,
                (t, hk, hv, dk, dv, cap), scale, eps)
    _token_views(m, w, pinned)
    _own_chains(m, w, pinned)
    m.ops = list(w.ops.values())
    outs = {x.id for x in (out, state, capsule) if x is not None}
    leaves = {x.id for x in m.leaves}
    if leaves & set(w.ops) or not _f32(m.q, m.k, m.v, m.beta):
        return None
    for x in m.ops:  # nothing computed inside is read, or needed, outside
        if x.id not in outs and (x.id in pinned or any(c.id not in w.ops for c in w.readers(x))):
            return None
    return m


def _slice_view(x: Node, tokens: int, w: _Walk, pinned: set[int]) -> tuple[int, int] | None:
    """(token stride, offset) where ``x`` is a slice of a [.., T, W] tensor along W alone
    (stride 1) that only this match reads: the kernel can read it where it lies."""
    s = root(x)
    got = fusion.last_axis_slice(s)
    if (got is None or s.id in pinned or len(s.shape) < 2
            or S.size(s.shape[:-1]) != tokens
            or any(c.id not in w.ops for c in w.readers(s))):
        return None
    return got


def _token_views(m: Capture, w: _Walk, pinned: set[int]) -> None:
    """q, k and v read where they lie when each is such a slice (``_slice_view``): the
    three slices of one projection's output a hybrid's verify makes need no launches."""
    t = m.dims[0]
    got = [_slice_view(x, t, w, pinned) for x in (m.q, m.k, m.v)]
    if None in got or not _f32(*(root(x).inputs[0] for x in (m.q, m.k, m.v))):
        return
    slices = [root(x) for x in (m.q, m.k, m.v)]
    m.q, m.k, m.v = (root(x.inputs[0]) for x in slices)
    m.views = GC.TokenViews(*got)
    w.take(*slices)


def _own_chain(x: Node, w: _Walk, pinned: set[int]) -> fusion.Group | None:
    """The element-wise ops making ``x`` that nothing but the match and each other reads
    (``x`` itself one of them), as a group the kernel evaluates: None where ``x`` is not
    such an op."""
    inside: dict[int, Node] = {}

    def own(o: Node) -> bool:
        return (fusion.is_fusible(o) and o.id not in pinned and o.id not in w.ops
                and bool(w.readers(o))
                and all(c.id in w.ops or c.id in inside for c in w.readers(o)))

    x = root(x)
    if not own(x):
        return None
    inside[x.id], grew = x, True
    while grew:  # each op once all its readers are inside
        grew = False
        for o in list(inside.values()):
            for y in (root(i) for i in o.inputs):
                if y.id not in inside and own(y):
                    inside[y.id] = y
                    grew = True
    return fusion.collect(x, set(inside) - {x.id})[0]


def _own_chains(m: Capture, w: _Walk, pinned: set[int]) -> None:
    """g and beta computed by the kernel where each is made by element-wise ops only the
    match reads (``_own_chain``): their launches (the decay's softplus, beta's sigmoid)
    are gone; their leaves are read instead, all float32."""
    for name in ("g", "beta"):
        chain = _own_chain(getattr(m, name), w, pinned)
        if chain is None or not _f32(*chain.leaves):
            continue
        setattr(m, f"{name}_chain", chain)
        w.take(*chain.ops)


def _replay(o: Node, w: _Walk, pinned: set[int]) -> Replay | None:
    """The replay whose first decayed state is ``o = mul(view(slice(src)), decay_0)``."""
    if not (_op(o, "mul") and len(o.shape) == 3 and _f32(o)):
        return None
    hv, dv, dk = o.shape
    n = hv * dv * dk
    for sv, dv0 in (o.inputs, o.inputs[::-1]):
        src_s, dec = root(sv), root(dv0)
        if not (_op(src_s, "slice") and len(src_s.inputs[0].shape) == 1 and S.size(src_s.shape) == n
                and tuple(dv0.shape) == (hv, 1, 1) and _op(dec, "slice")
                and len(dec.inputs[0].shape) == 1):
            continue
        capsule = root(dec.inputs[0])
        w.ops = {src_s.id: src_s}
        got = _replay_chain(o, w, capsule, (hv, dv, dk))
        if got is None:
            continue
        last, offs, hk = got
        m = _replay_out(w, last, root(src_s.inputs[0]), capsule, src_s.attrs["starts"][0], offs,
                        (hv, dv, dk, hk), pinned)
        if m is not None:
            return m
    return None


def _slice1(x: Node, base: Node, size: int) -> int | None:
    """The offset of a 1-D slice of ``base`` of ``size`` elements, viewed as ``x``."""
    s = root(x)
    if (_op(s, "slice") and root(s.inputs[0]) is base and len(s.inputs[0].shape) == 1
            and S.size(s.shape) == size and s.attrs["strides"][0] == 1):
        return int(s.attrs["starts"][0])
    return None


def _replay_chain(o: Node, w: _Walk, capsule: Node, dims: tuple) -> tuple | None:
    """(the last add, [decay, key, delta offsets], Hk) of the replay's transitions."""
    hv, dv, dk = dims
    offs: list[tuple[int, int, int]] = []
    hk = None
    mul, state = o, None
    while True:
        dec = w.other(mul, state) if state is not None else next(
            x for x in mul.inputs if tuple(x.shape) == (hv, 1, 1))
        adds = w.readers(mul)
        if dec is None or len(adds) != 1 or not _op(adds[0], "add"):
            break
        add = adds[0]
        u = root(w.other(add, mul)) if w.other(add, mul) is not None else None
        if u is None or not _op(u, "mul") or w.readers(u) != [add]:
            break
        dl, gk = u.inputs if tuple(u.inputs[0].shape) == (hv, dv, 1) else u.inputs[::-1]
        gk = root(gk)
        if tuple(dl.shape) != (hv, dv, 1) or not _op(gk, "gather") or gk.attrs["axis"] != 0 \
                or w.readers(gk) != [u]:
            break
        kv = gk.inputs[0]
        hk = kv.shape[0] if hk is None else hk
        if tuple(kv.shape) != (hk, 1, dk) or not _const(gk.inputs[1], np.arange(hv) * hk // hv):
            break
        got = (_slice1(dec, capsule, hv), _slice1(kv, capsule, hk * dk), _slice1(dl, capsule, hv * dv))
        if None in got:
            break
        offs.append(got)
        w.take(mul, root(dec), add, u, root(dl), gk, root(kv))
        nxt = [x for x in w.readers(add) if _op(x, "mul") and tuple(x.shape) == (hv, dv, dk)]
        if len(w.readers(add)) != 1 or len(nxt) != 1:
            return add, offs, hk
        mul, state = nxt[0], add
    return (state, offs, hk) if offs else None


def _replay_out(w: _Walk, last: Node, src: Node, capsule: Node, src_off: int, offs: list,
                dims: tuple, pinned: set[int]) -> Replay | None:
    """The replay's result (alone or between the destination's kept slices) and checks."""
    hv, dv, dk, hk = dims
    n, kept = hv * dv * dk, len(offs)
    d0, k0, l0 = offs[0]
    if any(o != (d0 + j * hv, k0 + j * hk * dk, l0 + j * hv * dv) for j, o in enumerate(offs)):
        return None
    out, dst, dst_off = last, None, 0
    cats = w.readers(last)
    if len(cats) == 1 and _op(cats[0], "concat") and len(cats[0].shape) == 1:
        c = cats[0]
        ids = [root(x).id for x in c.inputs]
        if ids.count(last.id) != 1:
            return None
        at = ids.index(last.id)
        pieces = [x for j, x in enumerate(c.inputs) if j != at]
        dst = root(root(pieces[0]).inputs[0]) if pieces and _op(root(pieces[0]), "slice") else None
        dst_off = sum(S.size(x.shape) for x in c.inputs[:at])
        if (dst is None or tuple(dst.shape) != tuple(c.shape) or len(pieces) > 2
                or (at == 1 and _slice1(c.inputs[0], dst, dst_off) != 0)
                or (at + 1 < len(c.inputs)
                    and _slice1(c.inputs[at + 1], dst, c.shape[0] - dst_off - n) != dst_off + n)):
            return None
        w.take(c, *(root(x) for x in pieces))
        out = c
    cap = max(kept, (k0 - d0) // hv) if (k0 - d0) % hv == 0 else kept
    meta = (src_off, dst_off, d0, k0, l0, hv, dv, dk, hk, min(cap, GC.MAX_CAPACITY), kept)
    m = Replay(out, src, capsule, dst, meta, list(w.ops.values()))
    if kept > GC.MAX_CAPACITY or src is dst or {x.id for x in m.leaves} & set(w.ops):
        return None
    for x in m.ops:
        if x is not out and (x.id in pinned or any(c.id not in w.ops for c in w.readers(x))):
            return None
    return m


def match_capsules(nodes: list[Node], pinned: set[int], max_storage: int,
                   fuse: bool = True) -> dict[int, Capture | Replay]:
    """{anchor id: match} for every converted capture and replay in ``nodes``; ``fuse``:
    a replay that only makes a capture's old state is computed by the capture
    (``fuse_replays``)."""
    found: dict[int, Capture | Replay] = {}
    taken: set[int] = set()
    w = _Walk(nodes)
    for o in nodes:
        if o.kind != "op" or o.id in taken or o.op not in ("exp", "mul"):
            continue
        m = _capture(o, w, pinned) or _replay(o, w, pinned)
        if m is None or {x.id for x in m.ops} & taken:
            continue
        if _bindings(m) > max_storage:
            continue
        found[m.out.id] = m
        taken |= {x.id for x in m.ops}
    if fuse:
        fuse_replays(found, w, max_storage)
    return found


def _bindings(m: Capture | Replay) -> int:
    """Storage buffers the match's launch binds, at most: + out, control, status."""
    return len(m.leaves) + len(m.written) + 3


def fuse_replays(found: dict[int, Capture | Replay], w: _Walk, max_storage: int) -> None:
    """Each capture whose old state is a replay's whole result, read by nothing but the
    capture, takes that replay as its prologue (``Capture.replay``; the replay then has no
    launch of its own): the deferred commit's replay of the last verify and the next
    verify in one launch, the state read once (``kernels/gdn_capsule.capture``)."""
    for c in [m for m in found.values() if isinstance(m, Capture)]:
        r = found.get(root(c.state_in).id)
        if not isinstance(r, Replay) or r.dst is not None or r.meta[1] != 0:
            continue
        t, hk, hv, dk, dv, _ = c.dims
        if tuple(r.meta[5:9]) != (hv, dv, dk, hk):
            continue
        inside = {x.id for x in c.ops} | {c.state_in.id}
        if any(x.id not in inside for x in w.readers(r.out)):
            continue
        c.replay = r
        if _bindings(c) > max_storage:
            c.replay = None
            continue
        c.ops = c.ops + r.ops
        del found[r.out.id]


@claims(5, lambda plan, o: o.id in plan.capsule)
def _lower_capsule(n: Site) -> None:
    """A verify pass with capture, or a replay: one launch (a copy first where the replay's
    destination keeps elements and is not written in place)."""
    plan, m = n.plan, n.plan.capsule[n.node.id]
    if isinstance(m, Replay):
        _lower_replay(n, m)
        return
    t, hk, hv, dk, dv, cap = m.dims
    old, new = n.slot_of(m.state_in), n.slot_of(m.state_out)
    in_place = old == new
    guarded = n.has_check and any(x.id in plan.in_place for x in m.written)
    pro, ins = None, [n.slot_of(x) for x in m.inputs]
    r = m.replay
    if r is not None:
        src, rcap = n.slot_of(r.src), n.slot_of(r.capsule)
        written = {new, n.out, old} | ({n.slot_of(m.capsule)} if cap else set())
        if in_place or len(written) < 3 + bool(cap) or ({rcap, *ins} & written) or (
                src in written and (src != old or r.meta[0] != 0)):
            # buffers the one launch could not bind apart, or a replay within one buffer
            # from another offset (another invocation's elements)
            _lower_replay(n, r, old)
        else:
            d0, k0, l0 = r.meta[2:5]
            pro = GC.ReplayPrologue(r.meta[10], r.meta[0], d0, k0, l0, src == old)
            ins += ([] if pro.in_place else [src]) + [rcap]
    if pro is None:
        ins += [] if in_place else [old]
    k = GC.capture(t, hk, hv, dk, dv, cap, scale=m.scale, l2_eps=m.l2_eps, in_place=in_place,
                   split_control=True, guarded=guarded, replay=pro, views=m.views,
                   g_chain=m.g_chain.fused_ops() if m.g_chain is not None else None,
                   beta_chain=m.beta_chain.fused_ops() if m.beta_chain is not None else None)
    if cap:
        act = ("const", ("gdn_active", m.out.id))
        if m.active is None:
            plan.consts.setdefault(act, np.ones(1, np.int32))
        cnt = ("const", ("gdn_count", m.out.id))
        if m.count is None:  # a full capture
            plan.consts.setdefault(cnt, np.full(1, cap, np.int32))
        ins += [n.slot_of(m.count) if m.count is not None else cnt,
                n.slot_of(m.active) if m.active is not None else act]
    outs = [new, n.out] + ([n.slot_of(m.capsule)] if cap else []) + ([old] if pro else [])
    n.add(KernelLaunch(k, ins + outs + n.status(guarded)))


def _lower_replay(n: Site, m: Replay, out: Slot | None = None) -> None:
    """The replay's launch, writing ``out`` (default the site's own output)."""
    plan = n.plan
    out = n.out if out is None else out
    hv, dv, dk, hk, cap = m.meta[5:10]
    meta = ("const", ("gdn_replay_meta", m.out.id))
    plan.consts.setdefault(meta, np.array(m.meta, np.uint32))
    guarded = n.has_check and m.out.id in plan.in_place
    if m.dst is not None and n.slot_of(m.dst) != out:
        n.add(CopyLaunch(n.slot_of(m.dst), out, 4 * S.size(m.dst.shape)))
    in_place = n.slot_of(m.src) == out  # a state replayed where it lies
    assert not in_place or m.meta[0] == m.meta[1], "in place at another offset"
    k = GC.replay(hv, hk, dk, dv, cap, guarded=guarded, in_place=in_place)
    n.add(KernelLaunch(k, [n.slot_of(m.src)] * (not in_place) + [n.slot_of(m.capsule), meta, out]
                       + n.status(guarded)))
