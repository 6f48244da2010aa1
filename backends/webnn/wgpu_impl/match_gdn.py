"""Finding one decode step of a gated delta net in a graph, for the one-launch kernel
(``kernels/gdn.py``).

The pattern, as the ONNX converter builds it from the standard flavour
(``model/export.py``), with the state ``P`` viewed as (*B, Dv, Dk)::

    s = mul(P, g)               g: (*B, 1, 1) after broadcasting (the decay per head)
    R = matmul(s, kc)           kc: (*Bk, Dk, 1), Bk broadcasting to B
    d = element-wise chain      over R's shape (*B, Dv, 1), R read at its own index
    U = mul(d, kr)              kr: (*Bk, 1, Dk), a view of the same k as kc
    N = add(s, U)               the new state (a graph output or the paired state)
    O = matmul(N, qc)           qc: (*Bq, Dk, 1)
    Y = element-wise chain      over O's shape, O read at its own index (the scale;
                                optional: without it O is written)

Where k (or q) is ``x / sqrt(reduce_sum(x * x, last axis) + eps)`` read by nothing else
(the exporter's per-head L2 norm; ``eps`` may be absent, as in ONNX LpNormalization), the
kernel reads x and folds the norm in too. A float16 model's norm (onnxruntime-genai's
q4f16 export: LpNormalization in float16, its sum of squares widened to float32) is the
same pattern with float casts between its ops and a widening cast after it (before the
scale, for q): the kernel reads the float16 x and computes the norm in float32.

The same step over a K-major state (*B, Dk, Dv) (ORT LinearAttention's layout, as
``convert_linear`` decomposes it) is the pattern transposed: R = matmul(kr, s),
U = mul(kc, d), O = matmul(qr, N), with R, d, O of shape (*B, 1, Dv); the kernel then
reads each state row Dv apart. transformers' torch recurrence writes the products as
sums over Dk: R = reduce_sum(mul(s, kc), Dk axis), O = reduce_sum(mul(N, qc), Dk axis)
(R, d, O of shape (*B, Dv) or (*B, 1, Dv); d read as (*B, 1, Dv) by U). In either
orientation q may be scaled by a one-value constant first (``mul`` or ``div``, read by
nothing else): the kernel applies the factor to the output.

Operands may appear in either order in ``mul`` and ``add``. s, R, d, U and O must have
no reader outside the pattern and not be graph outputs; every op the fusion planner
inlined into a group the kernel replaces must be computed by the kernel; the chains
must not read the state, k or q at other positions. Anything else keeps the generic
kernels, so a graph that only looks similar is never miscompiled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from .. import shapes as S
from ..ir import Node
from ..kernels import fused as FU
from ..kernels import gdn as GD
from ..stateful import root
from . import fusion
from .launches import KernelLaunch
from .lowerings import Site, claims

#: element types a float cast converts between (a float16 model's round trips)
FLOATS = ("f32", "f16")


@dataclass
class L2Norm:
    """``out = x / sqrt(reduce_sum(x * x, last axis) + eps)``, computed by the kernel."""

    out: Node
    x: Node  # the raw vector's storage
    eps: float
    ops: list[Node]  # mul, reduce_sum, add, sqrt, div


@dataclass
class GatedDelta:
    """One matched decode step, lowered at ``out`` (Y, or O without an output chain)."""

    out: Node
    state_in: Node  # the old state's storage (P's root)
    state_out: Node  # N
    k: Node  # storage of kc and kr
    q: Node  # storage of qc
    batch: tuple[int, ...]
    dv: int
    dk: int
    k_strides: tuple[int, ...]
    q_strides: tuple[int, ...]
    decay: fusion.Group | Node  # a chain computed inside, or a buffer read per head
    decay_strides: tuple[int, ...]
    retrieval: Node  # R, the delta chain's param
    delta: fusion.Group
    output: Node  # O, the output chain's param
    out_chain: fusion.Group | None
    core: list[Node]  # s, R, U, N, O
    k_norm: L2Norm | None = None
    q_norm: L2Norm | None = None
    k_major: bool = False  # the state stored (*B, Dk, Dv)
    q_scale: float = 1.0  # q's constant factor, applied to the output
    state: str = "f32"  # the state buffers' element type (f16: widened and narrowed here)
    #: the ops scaling q by q_scale (and a cast widening it after), computed here
    q_scaled: list[Node] = field(default_factory=list)
    #: k's and q's storage read where it lies in a wider row (``_row_views``): (the
    #: row's tensor, the element offset, the slice op) or None
    k_view: tuple[Node, int, Node] | None = None
    q_view: tuple[Node, int, Node] | None = None

    @property
    def norms(self) -> list[L2Norm]:
        return [x for x in (self.k_norm, self.q_norm) if x is not None]

    @property
    def k_storage(self) -> Node:
        if self.k_view is not None:
            return self.k_view[0]
        return self.k_norm.x if self.k_norm is not None else self.k

    @property
    def q_storage(self) -> Node:
        if self.q_view is not None:
            return self.q_view[0]
        return self.q_norm.x if self.q_norm is not None else self.q

    @property
    def ops(self) -> list[Node]:
        """Every op the kernel computes (``out`` included)."""
        chains = [c for c in (self.decay, self.delta, self.out_chain)
                  if isinstance(c, fusion.Group)]
        seen: dict[int, Node] = {x.id: x for x in self.core}
        for c in chains:
            seen.update((x.id, x) for x in c.ops)
        for nrm in self.norms:
            seen.update((x.id, x) for x in nrm.ops)
        for v in (self.k_view, self.q_view):
            if v is not None:
                seen[v[2].id] = v[2]
        return list(seen.values())

    @property
    def absorbed(self) -> list[Node]:
        """Ops computed inside the kernel other than ``out`` (no launch of their own)."""
        return [x for x in self.ops if x is not self.out]

    def _chain_leaves(self) -> list[Node]:
        out = list(self.decay.leaves) if isinstance(self.decay, fusion.Group) else [self.decay]
        out += [x for x in self.delta.leaves if x is not self.retrieval]
        if self.out_chain is not None:
            out += [x for x in self.out_chain.leaves if x is not self.output]
        return out

    @property
    def leaves(self) -> list[Node]:
        """What the kernel reads, in binding order (the old state first)."""
        return [self.state_in, self.k_storage, self.q_storage, *self._chain_leaves()]

    def kernel(self, in_place: bool, guarded: bool, lanes: int, subgroup: int | None,
               cols: int = 0) -> GD.Kernel:
        """``cols``: a K-major state read a column a lane, rows a workgroup
        (``gated_delta``'s; 0: off)."""
        if isinstance(self.decay, fusion.Group):
            decay = self.decay.fused_ops()
        else:  # a materialised decay: read through an identity op
            shp = tuple(self.decay.shape)
            decay = ([FU.FusedOp("identity", {}, "f32", shp, [("leaf", 0)], ["f32"], [shp])],
                     [FU.Leaf("f32", S.size(shp))])
        return GD.gated_delta(
            self.batch, self.dv, self.dk, k_strides=self.k_strides, q_strides=self.q_strides,
            k_size=S.size(self.k.shape), q_size=S.size(self.q.shape), decay=decay,
            k_eps=self.k_norm.eps if self.k_norm is not None else None,
            q_eps=self.q_norm.eps if self.q_norm is not None else None,
            decay_strides=self.decay_strides, delta=self.delta.fused_ops(param=self.retrieval),
            out_chain=(self.out_chain.fused_ops(param=self.output)
                       if self.out_chain is not None else None),
            in_place=in_place, guarded=guarded, lanes=lanes, wg=max(256, lanes),
            subgroup=subgroup, k_major=self.k_major, q_scale=self.q_scale, state=self.state,
            k_offset=self.k_view[1] if self.k_view is not None else 0,
            q_offset=self.q_view[1] if self.q_view is not None else 0,
            k_type=self.k_storage.dtype.wgsl, q_type=self.q_storage.dtype.wgsl, cols=cols)


def match_gated_delta(nodes: list[Node], inlined: set[int],
                      groups: dict[int, fusion.Group], pinned: set[int], taken: set[int],
                      max_storage: int, vectors: set[int] = frozenset(),
                      fold_norms: bool = True) -> dict[int, GatedDelta]:
    """{anchor id: GatedDelta} for every decode step of the gated delta rule in ``nodes``.

    ``pinned``: ops that must be materialised (outputs, state writers); ``taken``: ops
    another fusion already computes; ``vectors``: ops of norms planned as a launch of their
    own (``gemv.row_reductions``), which only a folded q/k norm may take over;
    ``max_storage``: storage bindings a kernel may use; ``fold_norms``: fold q's and k's L2
    norms in where they match."""
    consumers = fusion.consumers_of(nodes)
    owner = {x.id: r for r, g in groups.items() for x in g.ops}
    found: dict[int, GatedDelta] = {}
    for o in nodes:
        m = _match(o, consumers, inlined, groups, pinned, fold_norms)
        if m is None or not _covered(m, inlined, groups, owner, taken, vectors):
            continue
        if len(m.leaves) + 3 > max_storage:  # + new state, output, status
            continue
        found[m.out.id] = m
    return found


def _op(x: Node, name: str) -> bool:
    return x.kind == "op" and x.op == name


def _batch_of(shape: tuple[int, ...], batch: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides of a (*b, ...) operand's batch axes when its batch broadcasts to ``batch``
    (None otherwise), in units of one batch entry."""
    b = tuple(shape)
    if len(b) > len(batch) or any(x not in (1, y) for x, y in zip(b[::-1], batch[::-1], strict=False)):
        return None
    return S.broadcast_strides(b, batch) if batch else ()


def _match(o: Node, consumers: dict[int, list[Node]], inlined: set[int],
           groups: dict[int, fusion.Group], pinned: set[int],
           fold_norms: bool) -> GatedDelta | None:
    """The pattern ending at ``o`` (O = matmul(N, qc), or matmul(qr, N) over a K-major
    state), trying every operand order of the commutative ``add`` and ``mul`` ops (s and U
    are both muls of the state's shape)."""
    if o.dtype.wgsl != "f32":
        return None
    if _op(o, "matmul"):
        forms = [(False, root(o.inputs[0]), None), (True, root(o.inputs[1]), None)]
    elif _op(o, "reduce_sum") and _op(root(o.inputs[0]), "mul"):
        x = root(o.inputs[0])
        forms = [(True, root(v), x) for v in x.inputs]
    else:
        return None
    for k_major, n, x in forms:
        if not _op(n, "add") or len(n.shape) < 3:
            continue
        for s_view, u_view in (n.inputs, n.inputs[::-1]):
            s, u = root(s_view), root(u_view)
            if not (_op(s, "mul") and _op(u, "mul")):
                continue
            for (d_view, k_u), (p_view, g_view) in product((u.inputs, u.inputs[::-1]),
                                                           (s.inputs, s.inputs[::-1])):
                m = _assemble(o, n, s_view, u_view, d_view, k_u, p_view, g_view, consumers,
                              inlined, groups, pinned, fold_norms, k_major, x)
                if m is not None:
                    return m
    return None


def _assemble(o: Node, n: Node, s_view: Node, u_view: Node,
              d_view: Node, k_u: Node, p_view: Node, g_view: Node,
              consumers: dict[int, list[Node]], inlined: set[int],
              groups: dict[int, fusion.Group], pinned: set[int],
              fold_norms: bool, k_major: bool = False,
              x: Node | None = None) -> GatedDelta | None:
    """The match for one assignment of the operands, or None if any condition fails.
    ``k_u``: U's k operand; ``k_major``: the transposed pattern; ``x``: O's mul(N, qc)
    in the sum form (module docstring)."""
    only = lambda a, c: fusion.sole_reader(consumers, a, c)  # noqa: E731
    s, u = root(s_view), root(u_view)
    *batch_l, rows_, cols_ = n.shape
    batch = tuple(batch_l)
    dv, dk = (cols_, rows_) if k_major else (rows_, cols_)
    full, col = tuple(n.shape), ((*batch, 1, dv) if k_major else (*batch, dv, 1))
    cols = {col, (*batch, dv)} if x is not None else {col}  # R's, d's and O's shapes
    k_row = (dk, 1) if k_major else (1, dk)  # U's k operand
    k_col = (dk, 1) if x is not None else (1, dk) if k_major else (dk, 1)  # R's (O's q)
    si = 1 if k_major else 0  # where the state sits in the matmuls
    if x is None:
        n_view, qc = o.inputs[si], o.inputs[1 - si]
        reader = o
    else:
        n_view, qc = x.inputs if root(x.inputs[0]) is n else x.inputs[::-1]
        reader = x
        if (x.id in pinned or not only(x, o) or tuple(x.shape) != full
                or tuple(o.attrs["axes"]) != (len(full) - 2,)):
            return None
    narrow = _narrowed(n, reader, consumers, pinned)
    if (tuple(n_view.shape) != full or tuple(o.shape) not in cols
            or not (only(n, reader) or narrow is not None)
            or any(tuple(v.shape) != full for v in (s_view, u_view, s, u, p_view))):
        return None
    if s.id in pinned or u.id in pinned or not only(u, n):
        return None
    got = _retrieval(s, n, x, consumers, pinned, full, col, cols, si)
    if got is None:
        return None
    r, extra, kc = got
    # U = mul(d, k_u), k_u and the retrieval's k views of one k
    k = root(kc)
    if (tuple(d_view.shape) != col or tuple(k_u.shape)[-2:] != k_row or root(k_u) is not k
            or tuple(kc.shape)[-2:] != k_col or tuple(kc.shape)[:-2] != tuple(k_u.shape)[:-2]):
        return None
    q, q_scale, scaled, q_norm = _q_operand(qc, k, reader, consumers, inlined, pinned,
                                            fold_norms, dk)
    k_st = _batch_of(tuple(kc.shape)[:-2], batch)
    q_st = _batch_of(tuple(qc.shape)[:-2], batch) if tuple(qc.shape)[-2:] == k_col else None
    if k_st is None or q_st is None:
        return None
    # d: the delta chain, R its param read at its own index, d read by U only
    d = root(d_view)
    if (not fusion.is_fusible(d) or d.id in pinned or tuple(d.shape) not in cols
            or tuple(d.shape) != tuple(r.shape) or not only(d, u)):
        return None
    delta = groups.get(d.id) or fusion.collect(d, inlined)[0]
    if (r not in delta.leaves or not fusion.reads_at_own_index(delta, r)
            or not all(c in delta.ops for c in consumers.get(r.id, []))):
        return None
    got_decay = _decay(p_view, g_view, full, batch, inlined, pinned, consumers, s)
    if got_decay is None:
        return None
    p, g, g_st, decay, widen = got_decay
    # a float16 state: widened when read (P = cast(past)) and narrowed when written (the
    # paired output is cast(N)), both or neither (the kernel has one state type)
    state = "f16" if narrow is not None else "f32"
    if (widen is not None) != (narrow is not None) or p.dtype.wgsl != state:
        return None
    out_chain, anchor = _out_chain(o, consumers, inlined, groups, pinned, cols)
    if (any(x.dtype.wgsl != "f32" for x in (k, g, d, anchor))
            or q.dtype.wgsl not in FLOATS):
        return None
    casts = [x for x in (widen, narrow) if x is not None]
    m = GatedDelta(anchor, p, narrow or n, k, q, batch, dv, dk, tuple(x * dk for x in k_st),
                   tuple(x * dk for x in q_st), decay, tuple(g_st), r, delta, o, out_chain,
                   [s, *extra, r, u, n, *([x] if x is not None else []), *scaled, *casts, o],
                   k_major=k_major, q_scale=q_scale, state=state, q_scaled=scaled)
    if fold_norms:
        m.k_norm = _l2_norm(k, consumers, inlined, pinned, {(extra or [r])[0].id, u.id}, dk)
        m.q_norm = q_norm
    _row_views(m, consumers, inlined, pinned)
    # the chains read no value the kernel computes or rewrites (beyond their params)
    inside = {x.id for x in m.ops} | {p.id}
    if any(x.id in inside for x in m._chain_leaves() + [m.k_storage, m.q_storage]):
        return None
    return m


def _row_view(x: Node, ops: set[int], consumers: dict[int, list[Node]], inlined: set[int],
              pinned: set[int]) -> tuple[Node, int, Node] | None:
    """(the row, the offset, the slice) where ``x`` is one token's slice of a wider row
    along its last axis alone (stride 1, an offset of whole 4-element words), read only
    by the kernel's own ops, the row itself in memory: the kernel reads it there."""
    s = root(x)
    got = fusion.last_axis_slice(s)
    if got is None or s.id in pinned or s.id in inlined:
        return None
    src, start = root(s.inputs[0]), got[1]
    if (S.size(s.shape[:-1]) != 1 or start % 4 or src.id in inlined
            or src.dtype.wgsl not in FLOATS
            or any(c.id not in ops for c in consumers.get(s.id, []))):
        return None
    return src, start, s


def _row_views(m: GatedDelta, consumers: dict[int, list[Node]], inlined: set[int],
               pinned: set[int]) -> None:
    """k and q read where they lie when each is such a slice (``_row_view``): a hybrid
    step's q and k, sliced from the convolution's output, need no launches of their own."""
    k_st, q_st = m.k_storage, m.q_storage
    ops = {x.id for x in m.ops}
    k = _row_view(k_st, ops, consumers, inlined, pinned)
    q = k if q_st is k_st else _row_view(q_st, ops, consumers, inlined, pinned)
    m.k_view, m.q_view = k, q


def _retrieval(s: Node, n: Node, x: Node | None, consumers: dict[int, list[Node]],
               pinned: set[int], full: tuple, col: tuple, cols: set[tuple],
               si: int) -> tuple[Node, list[Node], Node] | None:
    """R, the other reader of s: matmul(s, kc) (matmul(kr, s) K-major; or the sum form's
    reduce_sum(mul(s, kc))), as (R, [the sum form's mul(s, kc)], kc), or None."""
    rs = consumers.get(s.id, [])
    others = [c for c in rs if c is not n]
    if len(others) != 1 or len(rs) != 2:
        return None
    r = others[0]
    if x is None:
        if (not _op(r, "matmul") or root(r.inputs[si]) is not s
                or tuple(r.inputs[si].shape) != full or tuple(r.shape) != col
                or r.id in pinned):
            return None
        return r, [], r.inputs[1 - si]
    sk, sums = r, consumers.get(r.id, [])
    if (not _op(sk, "mul") or sk.id in pinned or tuple(sk.shape) != full or len(sums) != 1
            or not _op(sums[0], "reduce_sum")
            or tuple(sums[0].attrs["axes"]) != (len(full) - 2,)):
        return None
    r = sums[0]
    kc = next((v for v in sk.inputs if root(v) is not s), None)
    if kc is None or r.id in pinned or tuple(r.shape) not in cols:
        return None
    return r, [sk], kc


def _q_operand(qc: Node, k: Node, reader: Node, consumers: dict[int, list[Node]],
               inlined: set[int], pinned: set[int], fold_norms: bool, dk: int
               ) -> tuple[Node, float, list[Node], L2Norm | None]:
    """(q as the kernel reads it, its constant factor, the scaling ops, its folded norm):
    a float16 q is read below its widening cast only where its norm folds in (the norm is
    then computed in float32 here); otherwise q is the value the graph widened."""
    q, f, scaled = _scaled_q(qc, pinned, consumers, reader)
    norm = None
    if fold_norms and q is not k:
        norm = _l2_norm(q, consumers, inlined, pinned, {(scaled or [reader])[0].id}, dk)
    if norm is None and q.dtype.wgsl != "f32":
        q, f, scaled = _scaled_q(qc, pinned, consumers, reader, widened=False)
    return q, f, scaled, norm


def _scaled_q(qc: Node, pinned: set[int], consumers: dict[int, list[Node]],
              reader: Node, widened: bool = True) -> tuple[Node, float, list[Node]]:
    """(q, its constant factor, [the scaling op, the cast widening it]): q scaled by a
    one-value constant read by nothing else is read unscaled, the kernel applying the
    factor as a literal; ``widened``: also below a float cast of the scaled q (a float16
    model scales q in float16 and widens it for the step)."""
    q = root(qc)
    casts: list[Node] = []
    inner, cast = _uncast(q)
    if (widened and cast and q.id not in pinned and fusion.sole_reader(consumers, q, reader)
            and (_op(inner, "mul") or _op(inner, "div"))):
        q, reader, casts = inner, q, cast
    if (_op(q, "mul") or _op(q, "div")) and q.id not in pinned and fusion.sole_reader(
            consumers, q, reader):
        c = root(q.inputs[1])
        if c.kind == "constant" and S.size(c.shape) == 1 and q.inputs[0].shape == q.shape:
            f = float(c.value.reshape(-1)[0])
            return root(q.inputs[0]), (f if _op(q, "mul") else 1.0 / f), [q, *casts]
    q = root(qc)
    return q, 1.0, []


def _uncast(x: Node) -> tuple[Node, list[Node]]:
    """(x's source, [x]) where x is a cast between float types of the same element count
    (a float16 model's round trips around float32 ops); (x, []) otherwise."""
    if _op(x, "cast") and x.dtype.wgsl in FLOATS:
        src = root(x.inputs[0])
        if src.dtype.wgsl in FLOATS and S.size(src.shape) == S.size(x.shape):
            return src, [x]
    return x, []


def _narrowed(n: Node, reader: Node, consumers: dict[int, list[Node]],
              pinned: set[int]) -> Node | None:
    """The float16 state N is written as: N's one reader besides the output product
    ``reader``, a cast of all of N to float16 that must be materialised (the paired state's
    writer, or a graph output); None otherwise."""
    cs = consumers.get(n.id, [])
    if len(cs) != 2 or not any(c is reader for c in cs):
        return None
    c = cs[0] if cs[1] is reader else cs[1]
    if (_op(c, "cast") and c.dtype.wgsl == "f16" and root(c.inputs[0]) is n
            and S.size(c.shape) == S.size(n.shape) and c.id in pinned):
        return c
    return None


def _decay(p_view: Node, g_view: Node, full: tuple, batch: tuple, inlined: set[int],
           pinned: set[int], consumers: dict[int, list[Node]], s: Node
           ) -> tuple[Node, Node, tuple, fusion.Group | Node, Node | None] | None:
    """s = mul(P, g): (P the state's storage, g one value per head, g's strides over the
    batch, the decay as the kernel reads it: g or its inlined chain, the cast widening a
    float16 state P to float32 where the graph reads it so, else None), or None."""
    gs = (1,) * (len(full) - len(g_view.shape)) + tuple(g_view.shape)
    if len(gs) != len(full) or gs[-2:] != (1, 1):
        return None
    p, g = root(p_view), root(g_view)
    widen = None
    if _op(p, "cast") and p.dtype.wgsl == "f32" and p.id not in pinned:
        src = root(p.inputs[0])
        if (src.dtype.wgsl == "f16" and S.size(src.shape) == S.size(p.shape)
                and fusion.sole_reader(consumers, p, s)
                and not (src.kind == "op" and src.id in inlined)):
            widen, p = p, src
    if p.kind == "op" and p.id in inlined:
        return None  # the state computed inline: not a buffer the kernel can stream
    g_st = S.broadcast_strides(tuple(g_view.shape), full)[:len(batch)]
    decay: fusion.Group | Node = g
    if g.kind == "op" and g.id in inlined:
        if g.id in pinned or not fusion.is_fusible(g):
            return None
        decay = fusion.collect(g, inlined)[0]
    return p, g, g_st, decay, widen


def _out_chain(o: Node, consumers: dict[int, list[Node]], inlined: set[int],
               groups: dict[int, fusion.Group], pinned: set[int],
               cols: set[tuple]) -> tuple[fusion.Group | None, Node]:
    """Y, the output chain, when O's one reader is the root of an element-wise group that
    reads O at its own index, or is inlined into such a group whose every op depending on
    O is element-wise over O's element count, read through flat views (a float16 model's
    round trip ``cast32(cast16(O))`` before its gated norm): (the chain, its root); else
    (None, O)."""
    cs = consumers.get(o.id, [])
    if (len(cs) == 1 and fusion.is_fusible(cs[0]) and not fusion.is_host(cs[0])
            and o.id not in pinned):
        c = cs[0]
        if c.id not in inlined:
            gc = groups.get(c.id) or fusion.collect(c, inlined)[0]
            if tuple(c.shape) in cols and o in gc.leaves and fusion.reads_at_own_index(gc, o):
                return gc, c
            return None, o
        owner = next((g for g in groups.values() if any(x is c for x in g.ops)), None)
        if owner is not None and o in owner.leaves and fusion.reads_at_own_index(owner, o, flat=True):
            return owner, owner.ops[-1]
    return None, o


def _l2_norm(v: Node, consumers: dict[int, list[Node]], inlined: set[int],
             pinned: set[int], readers: set[int], dk: int) -> L2Norm | None:
    """``v = x / sqrt(reduce_sum(x * x, last axis of dk, kept) + eps)`` (either operand
    order of the add, ``eps`` a one-value constant, or no add: eps 0), float casts allowed
    between the ops and after the division (a float16 norm summing in float32, widened
    for the step), each op read only by the next and ``v`` only by ``readers``; None
    otherwise."""
    if (v.id in pinned or not consumers.get(v.id)
            or any(c.id not in readers for c in consumers[v.id])):
        return None
    div, widen = _uncast(v)
    if not _op(div, "div") or div.shape[-1] != dk:
        return None
    x_view, den = div.inputs
    x = root(x_view)
    shape = tuple(div.shape)
    row = (*shape[:-1], 1)
    if tuple(x_view.shape) != shape or tuple(den.shape) != row:
        return None
    got = _sum_of_squares(root(den), x, shape, row)
    if got is None:
        return None
    ops, eps = got
    if any(tuple(y.shape) not in (shape, row) for y in ops):
        return None
    ops = [*ops, div, *widen]  # the widening cast: any view of the norm's elements
    chain = zip(ops, ops[1:], strict=False)
    if (any(y.id in pinned for y in ops)
            or not all(fusion.sole_reader(consumers, a, b) for a, b in chain)
            or (x.kind == "op" and x.id in inlined) or x.dtype.wgsl not in FLOATS):
        return None
    return L2Norm(v, x, eps, ops)


def _sum_of_squares(top: Node, x: Node, shape: tuple, row: tuple
                    ) -> tuple[list[Node], float] | None:
    """(the ops from x * x up to ``top`` in order, eps) where ``top`` is
    ``sqrt(reduce_sum(x * x, last axis, kept) [+ eps])`` through float casts; else None."""
    sq, c1 = _uncast(top)
    if not _op(sq, "sqrt"):
        return None
    add, c2 = _uncast(root(sq.inputs[0]))
    adds: list[Node] = []
    eps_value = 0.0  # no add: no epsilon (ONNX LpNormalization)
    if _op(add, "add"):
        for ss_view, eps in (add.inputs, add.inputs[::-1]):
            ss, c3 = _uncast(root(ss_view))
            if _op(ss, "reduce_sum") and eps.kind == "constant" and S.size(eps.shape) == 1:
                break
        else:
            return None
        eps_value, adds = float(eps.value.reshape(-1)[0]), [*c3, add]
    elif _op(add, "reduce_sum"):
        ss = add
    else:
        return None
    sqr, c4 = _uncast(root(ss.inputs[0]))
    if (tuple(ss.attrs["axes"]) != (len(shape) - 1,) or tuple(ss.shape) != row
            or tuple(ss.inputs[0].shape) != shape or not _op(sqr, "mul")
            or any(root(y) is not x or tuple(y.shape) != shape for y in sqr.inputs)):
        return None
    return [sqr, *c4, ss, *adds, *c2, sq, *c1], eps_value


def _covered(m: GatedDelta, inlined: set[int], groups: dict[int, fusion.Group],
             owner: dict[int, int], taken: set[int], vectors: set[int]) -> bool:
    """Whether replacing the pattern's launches loses nothing: every op inlined into a
    group the kernel replaces is computed by the kernel, and no other fusion claimed
    one of its ops (a norm planned as a launch of its own only if the kernel folds it)."""
    ids = {x.id for x in m.ops}
    folded = {x.id for nrm in m.norms for x in nrm.ops}
    if m.q_norm is not None:  # q's norm and its scaling, one vector launch elsewhere
        folded |= {x.id for x in m.q_scaled}
    if ids & taken or (ids - folded) & vectors:
        return False
    for x in m.ops:
        if x.id in inlined and owner.get(x.id) not in ids:
            return False
        if x.id in groups and not {y.id for y in groups[x.id].ops} <= ids:
            return False
    return True


@claims(20, lambda plan, o: o.id in plan.gdn)
def _lower_gated_delta(n: Site) -> None:
    """A gated delta net's decode step: one launch, the paired state updated where it lies
    when the graph keeps it in place (each row by its lanes)."""
    plan, m = n.plan, n.plan.gdn[n.node.id]
    lanes, shared, _, cols = plan.options.gdn_variant(plan.target) or (32, False, True, 0)
    old, new = n.slot_of(m.state_in), n.slot_of(m.state_out)
    in_place = old == new
    guarded = n.has_check and m.state_out.id in plan.in_place
    k = m.kernel(in_place, guarded, lanes, None if shared else plan.target.subgroup, cols)
    n.add(KernelLaunch(k, n.ins[in_place:] + [new, n.out] + n.status(guarded)))
