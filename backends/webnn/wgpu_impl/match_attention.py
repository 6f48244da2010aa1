"""Finding decode attention in a graph, for the two-launch flash-decoding kernels
(``kernels/attention.py``).

The pattern, as the ONNX converter (and any page spelling attention with WebNN ops)
builds it, with ``P`` the softmax::

    QK = matmul(q, transpose(K))            q (..., G, D), K (..., C, D), G <= 64
    W  = element-wise chain over QK          (scale, mask: a fusion group or one op)
    P  = softmax(W, axis=-1)
    O  = matmul(P, V)                        V (..., C, D)

QK, W and P must have no reader outside the pattern and not be graph outputs; every op
of W's chain that depends on QK must be element-wise on QK's shape (so each score is
read at the index it is computed at). Anything else stays on the generic kernels.

``K`` or ``V`` may be ``cast(cache, "float32")`` of a float16 cache (a model whose KV
cache is float16, computing in float32): the kernels then read the float16 cache and
widen each element as they load it (exact; 8 halves per 16-byte load where the head
dimension allows, ``KernelOptions.f16_loads``), and the cast's launch, with nobody left to
read its float32 copy of the cache, is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import shapes as S
from ..ir import Node
from ..kernels import attention as AT
from ..kernels import attention_lanes as AL
from ..kernels import attention_tile as ATT
from ..stateful import root
from . import fusion
from .launches import KernelLaunch, Slot
from .lowerings import Site, claims
from .row_stat import RowStat

#: q rows a KV head at most (a K = 8 verify of 8 q heads a KV head): the flash kernel scores
#: them in groups (``kernels/attention.q_row_groups``), so more only lengthen the grid
MAX_Q_ROWS = 64


@dataclass
class Attention:
    """One matched decode attention, lowered at ``out`` (the probs·V matmul)."""

    out: Node
    q: Node
    k: Node  # the cache the transpose was taken of (..., C, D)
    v: Node
    qk: Node
    score: fusion.Group | None  # the chain between QK and the softmax
    q_chain: fusion.Group | None = None  # q's element-wise group (RoPE), computed inside
    #: an element-wise group reading the output, written by the combine instead of it
    #: (``attention_epilogue``)
    epilogue: fusion.Group | None = None
    #: the per-row reduction q_chain reads (a per-head norm of q), computed by the kernel
    #: reading q (``row_stat``)
    q_norm: RowStat | None = None
    #: the same of the folded K and V row writes' updates (a per-head norm of k)
    write_norms: tuple[RowStat | None, RowStat | None] = (None, None)

    @property
    def q_rows(self) -> int:
        """q rows a KV head scores (a one-token step: the head's GQA group; K times as
        many in a K-token verify)."""
        return int(self.out.shape[-2])

    @property
    def capacity(self) -> int:
        """Cache rows the head attends over (the scores' last dimension)."""
        return int(self.qk.shape[-1])

    @property
    def absorbed(self) -> list[Node]:
        """Ops computed inside the two kernels (no launch of their own)."""
        softmax = root(self.out.inputs[0])
        chain = self.score.ops if self.score is not None else []
        q_ops = self.q_chain.ops if self.q_chain is not None else []
        norm = [self.q_norm.reduce] if self.q_norm is not None else []
        return [self.qk, softmax, *chain, *q_ops, *norm]

    @property
    def leaves(self) -> list[Node]:
        """What the kernels read, in binding order."""
        extra = [x for x in self.score.leaves if x is not self.qk] if self.score else []
        q = list(self.q_chain.leaves) if self.q_chain is not None else [self.q]
        if self.q_norm is not None:
            q = [x for x in q if x is not self.q_norm.reduce] + self.q_norm.leaves
        return [*q, self.k, self.v, *extra]

    def _dims(self) -> tuple[int, int, int, int, tuple | None, tuple | None]:
        """(heads, q rows, capacity, head dim, score chain, q chain) as the kernels take them."""
        G, D = self.out.shape[-2], self.out.shape[-1]  # roots may be flat: use the views
        C = self.qk.shape[-1]
        heads = S.size(self.out.shape[:-2])
        score = self.score.fused_ops(param=self.qk) if self.score is not None else None
        named = {self.q_norm.reduce.id: AT.Q_STAT} if self.q_norm is not None else None
        q_chain = self.q_chain.fused_ops(named=named) if self.q_chain is not None else None
        return heads, G, C, D, score, q_chain

    def q_red(self) -> AT.RowReduce | None:
        """q's row statistic as the kernels take it, its leaves bound after the chain's."""
        if self.q_norm is None:
            return None
        bound = [x for x in self.q_chain.leaves if x is not self.q_norm.reduce]
        return self.q_norm.source(len(bound), "qr_")

    @property
    def epilogue_leaves(self) -> list[Node]:
        """What the combine reads for its epilogue, in binding order (after its output)."""
        return [x for x in self.epilogue.leaves if x is not self.out] if self.epilogue else []

    def epilogue_kernel(self) -> AT.Epilogue | None:
        """The epilogue as the combine generators take it (the output: param ``ao``)."""
        if self.epilogue is None:
            return None
        return AT.Epilogue(*self.epilogue.fused_ops(named={self.out.id: "ao"}))

    def kernels(self, shared_bytes: int, splits: int | None = None,
                f16_loads: str | None = None,
                writes: AT.RowWrites | None = None,
                group_rows: int | None = None,
                subgroup: int | None = None,
                loads_first: bool = False,
                last: Callable[[int, int], bool] | None = None,
                max_storage: int = 8) -> tuple[AT.Kernel, AT.Kernel | None, int]:
        """(pass 1, pass 2, partial 4-byte words); ``splits``: per head (None: the default);
        ``f16_loads``: how a float16 cache is loaded (``flash_decode``; None: "wide");
        ``writes``: the layer's row write folded into pass 1; ``group_rows``: q rows a
        workgroup (``flash_decode``; None: the default); ``subgroup``: the width its
        statistics meet at (``flash_decode``); ``loads_first``: K's and V's words loaded
        at its start (``flash_decode``); ``last``: whether, at its split count and the
        head's q rows, the splits are combined by each head's last workgroup (no combine
        launch: None in its place) where the workgroup memory it keeps for that and
        ``max_storage`` bindings allow."""
        heads, G, C, D, score, q_chain = self._dims()

        def build(floats: int, fold: bool) -> tuple[AT.Kernel, AT.Kernel | None, int]:
            return AT.flash_decode(heads, G, C, D, score, floats, q_chain,
                                   splits or AT.SPLITS, kv=self.k.dtype.wgsl,
                                   f16_loads=f16_loads or "wide", writes=writes,
                                   group_rows=group_rows, subgroup=subgroup,
                                   epilogue=self.epilogue_kernel(), q_red=self.q_red(),
                                   loads_first=loads_first, last=fold)

        got = build(shared_bytes // 4, False)
        k2 = got[1]
        if last is None or not (isinstance(k2, AT.Combine) and k2.vec and last(k2.splits, G)):
            return got
        # room for the combine's memory, at twice the splits (less memory, shorter splits)
        floats = shared_bytes // 4 - AT.last_floats(G, 2 * k2.splits, AT.WG)
        folded = build(floats, True) if floats > 0 else got
        if folded[1] is not None or len(folded[0].bindings) > max_storage:
            return got
        return folded

    def one_launch(self, shared_bytes: int, splits: int | None = None,
                   max_storage: int = 8) -> tuple[AT.Kernel, int, int] | None:
        """(kernel, partial 4-byte words, counter words) of the one-launch variant
        (``flash_decode_one``), or None where it does not apply or binds more storage
        buffers than ``max_storage`` (the caller then lowers ``kernels``); None with a
        q row statistic (``q_norm``: the two-launch kernels compute it)."""
        if self.q_norm is not None:
            return None
        heads, G, C, D, score, q_chain = self._dims()
        got = AT.flash_decode_one(heads, G, C, D, score, shared_bytes // 4, q_chain,
                                  splits or AT.SPLITS1, kv=self.k.dtype.wgsl,
                                  epilogue=self.epilogue_kernel())
        if got is None or len(got[0].bindings) > max_storage:
            return None
        return got

    def lanes(self, shared_bytes: int, splits: int | None, subgroup: int | None, fold: bool,
              unroll: int | None = None,
              max_storage: int = 8) -> tuple[list[AT.Kernel], int, int] | None:
        """(kernels, partial 4-byte words, counter words) of the lane-group variants
        (``attention_lanes.flash_lanes``; ``fold``: one launch; ``unroll``: rows a lane-group
        loads at once, None: the default), or None where they do not apply or bind more
        storage buffers than ``max_storage`` (the caller then lowers ``kernels``), or with
        a q row statistic (``q_norm``)."""
        if self.q_norm is not None:
            return None
        heads, G, C, D, score, q_chain = self._dims()
        got = AL.flash_lanes(heads, G, C, D, score, shared_bytes // 4, q_chain,
                             splits or AL.SPLITS_L, kv=self.k.dtype.wgsl, subgroup=subgroup,
                             fold=fold, unroll=unroll or AL.UNROLL,
                             epilogue=self.epilogue_kernel())
        if got is None or len(got[0][0].bindings) > max_storage:
            return None
        return got

    def tile(self, shared_bytes: int, rows: int | None, max_storage: int = 8,
             writes: AT.RowWrites | None = None, subgroup: int | None = None,
             sync: int | None = None, loads_first: bool = False,
             last: Callable[[int, int], bool] | None = None, v_with_k: bool = False
             ) -> tuple[AT.Kernel, AT.Kernel | None, int] | None:
        """(pass 1, the combine, partial 4-byte words) of the many-rows variant
        (``attention_tile.flash_tile``; ``rows``: cache rows a split, None: the default;
        ``writes``: the layer's row write folded in; ``subgroup``: the adapter's fixed
        subgroup width; ``sync``: the width its statistics meet at; ``loads_first``: the
        K and V words loaded at the kernel's start; ``v_with_k``: the V words a lane holds
        issued with the K words (``flash_tile``'s); ``last``: whether, at its split count
        and q rows a workgroup, the splits are combined by each head's last workgroup, no
        combine launch (None in its place) where its workgroup memory and bindings fit),
        or None where it does not apply or
        binds more than ``max_storage`` storage buffers (the caller then lowers
        ``kernels``)."""
        heads, G, C, D, score, q_chain = self._dims()
        plan = ATT.tile_plan(G, C, D, self.k.dtype.wgsl, shared_bytes // 4, rows)
        if plan is None:
            return None
        ns = -(-C // plan.rows)
        fold = (last is not None and last(ns, plan.group) and plan.shared_floats(D)
                + AT.last_floats(plan.group, ns, ATT.WGT) <= shared_bytes // 4)
        got = ATT.flash_tile(heads, G, C, D, score, plan, q_chain, kv=self.k.dtype.wgsl,
                             writes=writes, subgroup=subgroup, sync=sync,
                             epilogue=self.epilogue_kernel(), q_red=self.q_red(),
                             loads_first=loads_first, last=fold, v_with_k=v_with_k)
        if fold and len(got[0].bindings) > max_storage:  # the combine keeps its launch
            return self.tile(shared_bytes, rows, max_storage, writes, subgroup, sync,
                             loads_first, v_with_k=v_with_k)
        return got if len(got[0].bindings) <= max_storage else None


def last2_transpose_input(o: Node) -> Node | None:
    """The input of ``o`` when ``o`` swaps its last two axes, else None."""
    if o.kind != "op" or o.op != "transpose":
        return None
    p = tuple(o.attrs["permutation"])
    r = len(p)
    if r >= 2 and p == tuple(range(r - 2)) + (r - 1, r - 2):
        return root(o.inputs[0])
    return None


def widened_f16(o: Node) -> Node:
    """The float16 operand ``o`` is an exact float32 copy of (``cast(x, "float32")`` of a
    float16 ``x``), else ``o`` itself."""
    if (o.kind == "op" and o.op == "cast" and o.dtype.wgsl == "f32"
            and o.inputs[0].dtype.wgsl == "f16"):
        return root(o.inputs[0])
    return o


def match_attention(nodes: list[Node], inlined: set[int], groups: dict[int, fusion.Group],
          pinned: set[int], shared_bytes: int) -> dict[int, Attention]:
    """{probs·V matmul id: Attention} for every decode attention in ``nodes``."""
    consumers = fusion.consumers_of(nodes)
    only = lambda x, c: fusion.sole_reader(consumers, x, c)  # noqa: E731
    found: dict[int, Attention] = {}
    for o in nodes:
        if o.kind != "op" or o.op != "matmul":
            continue
        p = root(o.inputs[0])
        v_view = o.inputs[1]
        v = root(v_view)
        if (p.kind != "op" or p.op != "softmax" or p.id in pinned or not only(p, o)
                or p.attrs["axis"] % len(p.shape) != len(p.shape) - 1
                or last2_transpose_input(v) is not None or v.kind == "op" and v.op == "transpose"):
            continue
        G, D = o.shape[-2], o.shape[-1]
        batch = o.shape[:-2]
        C = p.shape[-1]
        if G > MAX_Q_ROWS or tuple(v_view.shape) != (*batch, C, D):
            continue
        w = root(p.inputs[0])
        if w.id in pinned or not only(w, p):
            continue
        score = None
        if w.kind == "op" and w.op == "matmul":
            qk = w
        elif fusion.is_fusible(w) and w.id not in inlined:
            score = groups.get(w.id) or fusion.collect(w, inlined)[0]
            qks = [x for x in score.leaves if x.kind == "op" and x.op == "matmul"]
            if len(qks) != 1:
                continue
            qk = qks[0]
            if not fusion.reads_at_own_index(score, qk):
                continue
            if not all(c in score.ops for c in consumers.get(qk.id, [])):
                continue
        else:
            continue
        if qk.id in pinned or tuple(qk.shape) != (*batch, G, C):
            continue
        k = last2_transpose_input(root(qk.inputs[1]))
        q_view = qk.inputs[0]
        if k is None or tuple(q_view.shape) != (*batch, G, D):
            continue
        k, v = widened_f16(k), widened_f16(v)
        if k.dtype.wgsl != v.dtype.wgsl:
            continue
        if tuple(qk.inputs[1].shape) != (*batch, D, C):
            continue
        # one q row a workgroup at the least: a head's G rows are scored in groups that fit
        if not AT.fits(1, D, shared_bytes // 4):
            continue
        q = root(q_view)
        q_chain = None
        if (fusion.is_fusible(q) and q.id not in inlined and q.id not in pinned
                and only(q, qk) and q.dtype.wgsl == "f32"):
            q_chain = groups.get(q.id) or fusion.collect(q, inlined)[0]
        found[o.id] = Attention(o, q, k, v, qk, score, q_chain)
    return found


def attention_epilogue(m: Attention, consumers: dict[int, list[Node]],
                       group_of: dict[int, fusion.Group], taken: set[int],
                       max_storage: int) -> fusion.Group | None:
    """The fused group the combine of attention ``m`` may write instead of its output (an
    output gate, ``o · sigmoid(gate)``, or any element-wise function of the output and
    other values), or None: every reader of the output is one of the group's ops, element
    i of its root is a function of the output's element i alone (the other leaves read as
    the group reads them), its root is no host and not ``taken`` (another pattern's, a
    state writer), and the combine's bindings (partials, root, the other leaves) fit."""
    readers = consumers.get(m.out.id, [])
    g = group_of.get(readers[0].id) if readers else None
    if g is None or m.out.dtype.wgsl != "f32":
        return None
    r = g.ops[-1]
    ops = {x.id for x in g.ops}
    if (fusion.is_host(r) or r.id in taken or not all(c.id in ops for c in readers)
            or 2 + len(g.leaves) - 1 > max_storage):
        return None
    return g if fusion.reads_at_own_index(g, m.out, flat=True) else None


class NotInPlace(Exception):
    """A row write folded into attention whose pair the planner left two buffers (it must
    be written in place: the kernel writes the state it reads): compile again without."""


def fold_row_writes(attention: dict[int, Attention], nodes: list[Node], writers: set[int],
                    row_writes: dict[int, list[Node]], groups: dict[int, fusion.Group],
                    max_storage: int, one_row: bool = False) -> dict[int, tuple[Node, Node]]:
    """probs·V id -> (K row write, V row write), for each decode attention whose K and V
    are in-place pair writers (``writers``: the stateful graph's) of one index tensor of
    tuples (batch, head, row) into (B, H, C, D) caches, read by nothing but this
    attention: pass 1 writes the new rows (``kernels/attention.RowWrites``), so the row
    write has no launch of its own. A row-write launch shared with scatters not folded
    here (``row_writes``) is left as it is, as is a launch beyond ``max_storage``;
    ``one_row``: only where each head writes one row (a one-token step), since a K-row
    verify's attention was slower with its rows folded in (PERFORMANCE.md, "Knobs")."""
    consumers = fusion.consumers_of(nodes)
    out: dict[int, tuple[Node, Node]] = {}
    for oid, m in attention.items():
        k, v = m.k, m.v
        if not all(x.kind == "op" and x.op == "scatter_nd" and x.id in writers
                   for x in (k, v)):
            continue
        idx = root(k.inputs[1])
        shape = tuple(k.shape)
        if (root(v.inputs[1]) is not idx or tuple(v.shape) != shape or len(shape) != 4
                or tuple(idx.shape)[-1] != 3 or S.size(m.out.shape[:-2]) != shape[0] * shape[1]
                or m.qk.shape[-1] != shape[2]):
            continue
        if one_row and S.size(tuple(idx.shape)[:-1]) != shape[0] * shape[1]:
            continue
        readers = [_only_attention(k, m, consumers), _only_attention(v, m, consumers)]
        if not all(readers):
            continue
        upd = sum(len(groups[x.id].inner.leaves) if x.id in groups else 1 for x in (k, v))
        if len(m.leaves) + 1 + 1 + upd + 1 > max_storage:  # + partials, index, status
            continue
        out[oid] = (k, v)
    folded = {x.id for ks in out.values() for x in ks}
    for ms in row_writes.values():  # a shared launch is folded whole or not at all
        if any(x.id in folded for x in ms) and not all(x.id in folded for x in ms):
            out = {o: ks for o, ks in out.items() if not any(x in ms for x in ks)}
    return out


def _only_attention(x: Node, m: Attention, consumers: dict[int, list[Node]]) -> bool:
    """Whether the cache ``x`` is read only by attention ``m``: through K's transpose (a
    float16 cache: its widening cast first) or as V."""
    ends = {m.out.id, root(m.qk.inputs[1]).id}
    for c in consumers.get(x.id, []):
        if c.id in ends:
            continue
        if not (c.op == "cast" and all(r.id in ends for r in consumers.get(c.id, []))):
            return False
    return True


# -- lowering ------------------------------------------------------------------------------
def _attention_one(plan: Any, o: Node) -> tuple[Any, int, int] | None:
    """The one-launch decode attention where ``KernelOptions.attention`` asks for it
    ("flash1", "lanes1[_uN]") and it applies, else None."""
    if plan.options.attention_for(plan.attention[o.id].q_rows) == "flash1":
        return plan.attention[o.id].one_launch(plan.target.shared_bytes,
                                                plan.options.attention_splits,
                                                plan.target.max_storage)
    if (got := _attention_lanes(plan, o, True)) is not None:
        return got[0][0], got[1], got[2]
    return None


def _attention_lanes(plan: Any, o: Node, fold: bool) -> tuple[list, int, int] | None:
    """The lane-group decode attention (``attention_lanes``) where ``KernelOptions.attention``
    asks for it with (``fold``) or without the combine folded in and it applies, else None."""
    how = plan.options.attention_lanes(plan.attention[o.id].q_rows)
    if how is None or how[0] != fold:
        return None
    return plan.attention[o.id].lanes(plan.target.shared_bytes, plan.options.attention_splits,
                                       plan.target.subgroup, fold, how[1],
                                       plan.target.max_storage)


def _attention_tile(plan: Any, o: Node, writes: AT.RowWrites | None = None
                    ) -> tuple[AT.Kernel, AT.Kernel, int] | None:
    """The many-rows decode attention (``attention_tile``) where ``KernelOptions`` asks for
    it ("tile[_tROWS]") and it applies, else None; ``writes``: its row write folded in."""
    m = plan.attention[o.id]
    how = plan.options.attention_tile(m.q_rows, m.capacity, plan.target)
    if how is None:
        return None
    lanes = plan.options.tile_pv != "walk"
    return m.tile(plan.target.shared_bytes, how[0], plan.target.max_storage, writes,
                  plan.target.subgroup if lanes else None,
                  plan.options.attention_subgroup(plan.target),
                  plan.options.attention_loads == "first",
                  lambda splits, rows: plan.options.attention_combine_last(plan.target, splits,
                                                                           rows),
                  plan.options.attention_loads == "kv")


def partials_slot(o: Node) -> Slot:
    """The slot of attention ``o``'s partials (pass 1 writes them, the combine reads them)."""
    return ("temp", ("flash", o.id))


def _two_launches(plan: Any, o: Node, writes: AT.RowWrites | None = None
                  ) -> tuple[AT.Kernel, AT.Kernel | None, int]:
    """(pass 1, the combine, partial 4-byte words) of the two-launch decode attention the
    options pick (lanes, tile, else flash); ``writes``: the row write folded into pass 1;
    the combine None where pass 1's last workgroups compute it (``last``)."""
    m = plan.attention[o.id]
    if (two := _attention_lanes(plan, o, False)) is not None:
        assert writes is None, "the row writes fold into the flash and tile kernels only"
        (k1, k2), parts, _ = two
        return k1, k2, parts
    if (tiled := _attention_tile(plan, o, writes)) is not None:
        return tiled
    return m.kernels(plan.target.shared_bytes, plan.options.attention_splits,
                     plan.options.f16_loads, writes,
                     plan.options.attention_group_rows(m.q_rows, plan.target),
                     plan.options.attention_subgroup(plan.target),
                     plan.options.attention_loads == "first",
                     lambda splits, rows: plan.options.attention_combine_last(
                         plan.target, splits, rows, tile=False),
                     plan.target.max_storage)


def combine_of(plan: Any, o: Node) -> AT.Combine | None:
    """The combine launch attention ``o`` is lowered with, where a reader may compute it
    instead (``gemv.CombinePrologue``): two launches, 16-byte partials; else None."""
    if _attention_one(plan, o) is not None:
        return None
    k2 = _two_launches(plan, o)[1]
    return k2 if isinstance(k2, AT.Combine) and k2.vec else None


@claims(30, lambda plan, o: o.id in plan.attention)
def _lower_attention(n: Site) -> None:
    """Decode attention in one launch (the combine folded in) where the options ask for it
    and it applies, else in two: the partials, then their combine (none where the product
    reading the output computes it: ``plan.combined``)."""
    plan, o = n.plan, n.node
    part = partials_slot(o)
    if (one := _attention_one(plan, o)) is not None:
        k1, parts, counters = one  # one launch: the combine folded in (``flash_decode_one``)
        cnt = ("const", ("flash_count", o.id))
        plan.temps[part] = parts
        plan.consts.setdefault(cnt, np.zeros(counters, np.uint32))  # zero; left zero
        out, ep = _combine_out(n, plan.attention[o.id])
        n.add(KernelLaunch(k1, n.ins[:len(plan.attention[o.id].leaves)] + [part, out, cnt, *ep]))
        return
    m = plan.attention[o.id]
    ins = n.ins[:len(m.leaves)]  # the step's reads go on with a folded row write's
    writes, w_slots = _row_writes(n, m, plan.attention_writes.get(o.id))
    k1, k2, parts = _two_launches(plan, o, writes)
    plan.temps[part] = parts
    if k2 is None:  # each head's last workgroup combines: counters, the output after
        cnt = ("const", ("flash_count", o.id))
        plan.consts.setdefault(cnt, np.zeros(k1.groups[1] * k1.groups[2], np.uint32))
        out, ep = _combine_out(n, m)
        n.add(KernelLaunch(k1, ins + [part] + w_slots + [out, cnt, *ep]))
        return
    n.add(KernelLaunch(k1, ins + [part] + w_slots))
    if o.id in plan.combined:
        assert k2 == plan.prologue[plan.combined[o.id]].combine, "planned on other partials"
        return
    out, ep = _combine_out(n, m)
    n.add(KernelLaunch(k2, [part, out, *ep]))


def _combine_out(n: Site, m: Attention) -> tuple[Slot, list[Slot]]:
    """(what attention ``m``'s combine writes: its output or its epilogue's root, the
    epilogue's leaves)."""
    if m.epilogue is None:
        return n.out, []
    return n.slot_of(m.epilogue.ops[-1]), [n.slot_of(x) for x in m.epilogue_leaves]


def _row_writes(n: Site, m: Attention, ws: tuple[Node, Node] | None
                ) -> tuple[AT.RowWrites | None, list]:
    """The folded K and V row writes of attention ``m`` (``fold_row_writes``) as pass 1
    takes them, and the slots they bind after its partials (the index tuples, each
    cache's updates or the leaves it computes them from, the status)."""
    if ws is None:
        return None, []
    plan = n.plan
    if any(w.id not in plan.in_place for w in ws):
        raise NotInPlace
    first = len(m.leaves) + 2  # after the leaves, the partials and the index tuples
    idx = root(ws[0].inputs[1])
    updates, stats, slots = [], [], [n.slot_of(idx)]
    for j, (w, norm) in enumerate(zip(ws, m.write_norms, strict=True)):
        group = plan.groups.get(w.id)  # updates computed by the write (RoPE of k)
        stats.append(None)
        if group is None:
            updates.append(None)
            slots.append(n.slot_of(root(w.inputs[2])))
            continue
        named = {norm.reduce.id: f"wn{j}"} if norm is not None else None
        updates.append(group.input_source(first=first + len(slots) - 1, prefix=f"w{j}_",
                                          named=named))
        slots += [n.slot_of(leaf) for leaf in group.inner.leaves
                  if norm is None or leaf is not norm.reduce]
        if norm is not None:  # its leaves after the update's
            stats[-1] = norm.source(first + len(slots) - 1, f"w{j}r_")
            slots += [n.slot_of(leaf) for leaf in norm.leaves]
    guarded = n.has_check
    rw = AT.RowWrites(idx.dtype.wgsl, S.size(idx.shape[:-1]), tuple(ws[0].shape),
                      (updates[0], updates[1]), guarded, (stats[0], stats[1]))
    return rw, slots + n.status(guarded)
