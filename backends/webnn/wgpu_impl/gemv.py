"""Planning the matrix-vector products of a decode step (constant weights, one input row):
weight repacking, stacked projections, residual epilogues and input prologues; and the
norms feeding them, each computed in one launch (``row_reductions``).

These are what make the wgpu lowering launch-light on GPUs (PERFORMANCE.md): a layer's q/k/v
projections become one launch reading the stacked weights; the residual add is written by
the projection feeding it; the element-wise vector a projection reads (RMSNorm's tail,
SwiGLU; an attention's combine) is computed by the projection's workgroups. Each decision
is pure planning over the graph; the lowerings at the end (registered in ``lowerings``)
emit the kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .. import shapes as S
from ..ir import Node
from ..kernels import Kernel
from ..kernels import attention as AT
from ..kernels import fused as FU
from ..kernels import matmul as MM
from ..kernels import quant_rows as QR
from ..kernels.common import decl
from ..stateful import SAME_INDEX_OPS, root
from . import fusion
from .launches import Deferred, KernelLaunch, Slot
from .lowerings import Site, claims
from .options import COLS, ROWS_VARIANT
from .target import Target


def const_weight(o: Node, fold: dict[int, Node]) -> tuple[Node, bool, Any] | None:
    """(constant, stored transposed, logical (K, N) or (N, K) shape) of a matmul's B when
    it is a 2-D constant (possibly behind a folded transpose), else None."""
    b = o.inputs[1]
    src = fold.get(o.id, root(b))
    b_t = o.id in fold
    b_shape = root(b).inputs[0].shape if b_t else b.shape
    if src.kind != "constant" or len(b_shape) != 2:
        return None
    return src, b_t, b_shape


def stacked_gemvs(nodes: list[Node], fold: dict[int, Node],
                   max_binding: int, q4: dict[int, Any] | None = None) -> dict[int, list[Node]]:
    """Single-row matmuls of one input against constant weights (a layer's q, k and v
    projections; its gate and up projections), grouped: first matmul id -> the group.
    Each group runs as one launch over the weight rows stacked (within the binding
    limit): fewer launches, and small projections no longer run alone. 4-bit products
    (``q4``: matmul id -> match_q4.Q4Weight) stack with those of the same format only."""
    q4 = q4 or {}
    by_input: dict[tuple, list[Node]] = {}
    for o in nodes:
        if o.kind != "op" or o.op != "matmul" or S.size(o.shape[:-1]) != 1:
            continue
        a = o.inputs[0]
        w = q4.get(o.id)
        if (w is None and const_weight(o, fold) is None) or S.size(a.shape[:-1]) != 1:
            continue
        fmt = None if w is None else w.format
        by_input.setdefault((root(a).id, a.shape[-1], fmt), []).append(o)
    out: dict[int, list[Node]] = {}
    for (_, K, _), ms in by_input.items():
        group: list[Node] = []
        for o in ms:
            if 4 * K * (sum(m.shape[-1] for m in group) + o.shape[-1]) > max_binding:
                break
            group.append(o)
        if len(group) > 1:
            out[group[0].id] = group
    return out


def residual_epilogues(nodes: list[Node], fold: dict[int, Node], inlined: set[int],
                        groups: dict[int, Any], taken: set[int],
                        stacked: set[int],
                        q4: set[int] = frozenset(), rows: set[int] = frozenset(),
                        one_row: bool = True) -> dict[int, tuple[Node, Node]]:
    """Single-row matmuls with constant weights (or 4-bit ones: ``q4``) whose only reader
    is an ``add`` of a same-shaped tensor (a residual connection): gemv id -> (the add, the
    other operand). The gemv then writes the sum; the add has no launch. A float16 add of
    a 4-bit product's float16 rounding (``narrowed``: the cast fused into the add alone)
    is one too: the kernel sums in float32 and rounds once (``gemv_q4`` half_out).
    ``rows``: 4-bit products of several rows (``match_q4`` rows) that take an add alike
    (``gemm_q4_rows``); ``one_row`` False: only those."""
    consumers = fusion.consumers_of(nodes)
    out: dict[int, tuple[Node, Node]] = {}
    for a in nodes:
        half = _narrowed_add(a, groups, consumers, q4 | rows)
        if (a.kind != "op" or a.op != "add" or a.id in inlined
                or (a.id in groups and half is None) or a.id in taken
                or a.dtype.wgsl != "f32" and half is None):
            continue
        for j in (0, 1):
            g, res = root(a.inputs[j]), root(a.inputs[1 - j])
            if half is not None:
                if a.inputs[j] is not half:
                    continue
                g = half.inputs[0]
            if (g.kind == "op" and g.op == "matmul" and g.id not in taken
                    and g.id not in stacked and g.id not in out and g is not res
                    and [c.id for c in consumers.get(g.id, [])] == [(half or a).id]
                    and (g.id in rows or one_row and (const_weight(g, fold) is not None
                                                      or g.id in q4)
                         and S.size(g.shape[:-1]) == 1 and S.size(g.inputs[0].shape[:-1]) == 1)
                    and tuple(a.inputs[j].shape) == tuple(a.inputs[1 - j].shape)
                    == tuple(a.shape)):
                out[g.id] = (a, res)
                break
    return out


def _narrowed_add(a: Node, groups: dict[int, Any], consumers: dict[int, list[Node]],
                  q4: set[int]) -> Node | None:
    """The cast of ``add`` ``a`` (float16) that rounds a 4-bit product's float32 result,
    when the add's launch is that cast and the add only (its fused group), the product
    read by the cast alone and the cast by the add alone; else None."""
    if a.kind != "op" or a.op != "add" or a.dtype.wgsl != "f16":
        return None
    grp = groups.get(a.id)
    if grp is None or len(grp.ops) != 2 or grp.ops[1] is not a:
        return None
    c = grp.ops[0]
    if c.op != "cast" or c not in a.inputs:
        return None
    g = c.inputs[0]
    if (g.kind != "op" or g.id not in q4 or g.dtype.wgsl != "f32"
            or [x.id for x in consumers.get(g.id, [])] != [c.id]
            or [x.id for x in consumers.get(c.id, [])] != [a.id]):
        return None
    return c


@dataclass
class Gated:
    """A stacked pair of products (4-bit, or float weights on the rows kernel) read only by
    one element-wise ``group`` of the products' shape (SwiGLU's ``silu(gate) · up``), or
    one 4-bit product so read (the LM head's float16 rounding of the logits): the launch
    writes the group's root, so the group has no launch and no product is written."""

    pair: tuple[Node, ...]
    group: fusion.Group

    @property
    def root(self) -> Node:
        return self.group.ops[-1]

    def output(self) -> MM.GatedOutput:
        fops, leaves = self.group.fused_ops(named={m.id: f"g{j}"
                                                   for j, m in enumerate(self.pair)})
        fsrc, args = FU.functions(fops, leaves, "gt_")  # apart from a prologue's names
        call = f"gt_v{len(fops) - 1}({', '.join(['{}'] + args)})"
        return MM.GatedOutput(fsrc, call, self.root.dtype.wgsl)


def gated_epilogues(nodes: list[Node], stacked: dict[int, list[Node]],
                    groups: dict[int, fusion.Group], taken: set[int],
                    pinned: set[int]) -> dict[int, Gated]:
    """First product id -> ``Gated``, for each stacked pair of products (the caller passes
    those its kernel takes; one row each, or several: a K-token verify's) of one shape and
    even length read by nothing but one fused group
    whose ops are element-wise at the same index (no broadcast, no data movement) and
    whose leaves are the two products: a gated MLP's activation (SwiGLU, GeGLU), however
    the exporter spelled it. ``taken``: roots that must keep their launch; ``pinned``: roots
    that must be written (a graph output)."""
    consumers = fusion.consumers_of(nodes)
    group_of = {o.id: g for g in groups.values() for o in g.ops}
    out: dict[int, Gated] = {}
    for first, ms in stacked.items():
        if len(ms) != 2:
            continue
        F, n = ms[0].shape[-1], S.size(ms[0].shape)  # (n: all rows of a several-row pair)
        readers = consumers.get(ms[0].id, [])
        grp = group_of.get(readers[0].id) if readers else None  # checked against all below
        if (grp is None or F % 2 or tuple(ms[1].shape) != tuple(ms[0].shape)
                or grp.ops[-1].id in taken or any(m.id in pinned for m in ms)
                or sorted(x.id for x in grp.leaves) != sorted(m.id for m in ms)):
            continue
        ops = {o.id for o in grp.ops}
        if all(c.id in ops for m in ms for c in consumers.get(m.id, [])) and all(
                o.op in SAME_INDEX_OPS and S.size(o.shape) == n
                and all(S.size(x.shape) == n for x in o.inputs) for o in grp.ops):
            out[first] = Gated((ms[0], ms[1]), grp)
    return out


def mapped_epilogues(nodes: list[Node], products: set[int], groups: dict[int, fusion.Group],
                     inlined: set[int], taken: set[int],
                     pinned: set[int]) -> dict[int, Gated]:
    """Product id -> ``Gated`` (one product), for each of ``products`` (the caller passes
    those its kernel takes, each launched alone) read by nothing but one fused group of
    element-wise ops at the same index whose one leaf is the product: the LM head's logits
    rounded to float16 (``cast``), or any such tail. ``taken``: roots that must keep their
    launch; ``pinned``: products that must be written."""
    consumers = fusion.consumers_of(nodes)
    group_of = {o.id: g for g in groups.values() for o in g.ops}
    by_id = {o.id: o for o in nodes}
    out: dict[int, Gated] = {}
    for pid in sorted(products):
        p = by_id.get(pid)
        readers = consumers.get(pid, [])
        grp = group_of.get(readers[0].id) if readers else None
        if grp is None and len(readers) == 1 and fusion.is_fusible(readers[0]) \
                and readers[0].id not in inlined:  # one op: a group of its own
            grp = fusion.collect(readers[0], inlined)[0]
        if p is None or grp is None or pid in pinned or grp.ops[-1].id in taken:
            continue
        n = S.size(p.shape)
        ops = {o.id for o in grp.ops}
        if ([x.id for x in grp.leaves] == [pid] and all(c.id in ops for c in readers)
                and all(o.op in SAME_INDEX_OPS and S.size(o.shape) == n
                        and all(S.size(x.shape) == n for x in o.inputs) for o in grp.ops)):
            out[pid] = Gated((p,), grp)
    return out


@dataclass
class NormStats:
    """What a product with a residual epilogue (4-bit, or float weights on the rows kernel)
    writes besides its rows (``x``, the residual stream): each workgroup's sum of the
    reduction's element function ``chain`` (RMSNorm's ``x · x``; ``x`` its one leaf) over
    the rows it wrote, ``count`` floats into ``slot`` (its launch's workgroups:
    ``quant_rows.quad_workgroups``, ``rows_workgroups``), or where ``x`` is ``rows`` rows (a
    K-token verify's, ``quant_quad_rows.gemm_q4_quad``) ``count`` a row, row by row. The norm
    reading ``x`` then needs no launch: its readers sum those partials (``Prologue.stats``)
    and compute its tail where they read it (``norm_partials``)."""

    chain: fusion.Group
    x: Node
    slot: Slot
    count: int
    rows: int = 1

    @property
    def size(self) -> int:
        """Floats in ``slot``."""
        return self.count * self.rows

    def output(self) -> MM.StatsOutput:
        """The kernel's part: ``norm_el(i, xs)``, the chain at a written value."""
        t = self.x.dtype.wgsl
        if not self.chain.ops:
            return MM.StatsOutput(f"fn norm_el(i: u32, xs: {t}) -> f32 {{\n  return f32(xs);\n}}\n")
        fops, leaves = self.chain.fused_ops(named={self.x.id: "xs"})
        fsrc, args = FU.functions(fops, leaves, "ns_")
        call = f"ns_v{len(fops) - 1}({', '.join(['i'] + args)})"
        return MM.StatsOutput(fsrc + f"fn norm_el(i: u32, xs: {t}) -> f32 {{\n"
                                  f"  return f32({call});\n}}\n")


@dataclass
class Prologue:
    """A vector computed from an element-wise ``group`` and, if it reads one, a
    ``reduction`` (a reduce op and the group of its input chain, e.g. RMSNorm's mean of
    squares), computed first: by each workgroup of the gemv reading it (a prologue, one
    reduced element), or in a launch of its own with a workgroup per reduced row
    (``row_reductions``), or (``stats``) summed by each workgroup of the gemv from the
    partial sums the product writing the reduction's input left (``norm_partials``)."""

    group: fusion.Group
    reduction: fusion.Group | None = None
    stats: NormStats | None = None
    #: the reduction is one value per row of its input's last axis (a per-head norm), each
    #: workgroup of the gemv computing them all (``grouped_reductions``)
    grouped: bool = False

    @property
    def reduce_op(self) -> Node | None:
        return self.reduction.ops[-1] if self.reduction is not None else None

    @property
    def _reduction_inner(self) -> fusion.Group:
        r = self.reduce_op
        assert r is not None
        return fusion.reduction_inner(r, self.reduction)

    @property
    def leaves(self) -> list[Node]:
        """What the gemv reads for its vector, in binding order (with ``stats``, the
        partial sums' slot follows: ``gemv_input``)."""
        out = [x for x in self.group.leaves if x is not self.reduce_op]
        if self.stats is not None:
            return out
        return out + (self._reduction_inner.leaves if self.reduction is not None else [])

    @property
    def absorbed(self) -> list[Node]:
        """Ops with no launch of their own: the group's root and the reduction."""
        return [self.group.ops[-1]] + ([self.reduce_op] if self.reduction is not None else [])

    def source(self) -> MM.VectorSource:
        r = self.reduce_op
        fops, leaves = self.group.fused_ops(param=r)
        decls, bindings = FU.leaf_decls(leaves, 0)
        fsrc, takes_red = FU.functions(fops, leaves)
        red_at = f"red_g[({{0}}) / {r.inputs[0].shape[-1]}u]" if self.grouped else "red"
        element = f"v{len(fops) - 1}({{0}}{', ' + red_at if takes_red else ''})"
        if r is None:
            return MM.VectorSource(decls + fsrc, bindings, element)
        if self.stats is not None:  # the partial sums, bound after the leaves
            div = S.size(r.inputs[0].shape) // S.size(r.shape) if r.op == "reduce_mean" else 1
            return MM.VectorSource(decls + fsrc + decl(len(bindings), "pt_in", "f32", "read"),
                                   bindings + ["read"], element,
                                   partials=("pt_in[{}]", self.stats.count, div))
        rsrc, rbind, load = fusion.reduction_source(r, self.reduction, len(bindings), "r_")
        return MM.VectorSource(decls + fsrc + rsrc, bindings + rbind, element,
                               (r.op, load, S.size(r.inputs[0].shape)),
                               group=r.inputs[0].shape[-1] if self.grouped else 0)


@dataclass
class CombinePrologue:
    """A one-row product's input vector that is a two-launch attention's output, computed
    by the product's workgroups (4-bit "quad" or float rows) from the attention's partials
    (``attention.combine_vector``; ``passes.attention_combines``): the attention's combine
    has no launch of its own."""

    attention: Node  # the probs·V node the partials are of
    combine: AT.Combine  # the combine launch it stands for (the partials' layout)
    part: Slot  # the partials' slot (``match_attention.partials_slot``)
    #: the attention's epilogue (an output gate) the vector is, and the leaves it reads
    epilogue: AT.Epilogue | None = None
    epilogue_leaves: list[Node] = field(default_factory=list)

    @property
    def leaves(self) -> list[Node]:
        """What the product reads, for the order: the attention's output (its partials),
        then the epilogue's leaves."""
        return [self.attention, *self.epilogue_leaves]

    @property
    def absorbed(self) -> list[Node]:
        return []

    def source(self) -> MM.VectorSource:
        c = self.combine
        return AT.combine_vector(c.rows, c.splits, c.d, self.epilogue)


def gemv_prologues(nodes: list[Node], fold: dict[int, Node], inlined: set[int],
                   groups: dict[int, Any], taken: set[int], target: Target,
                   reductions: bool = True,
                   q4: dict[int, int] | None = None,
                   grouped_only: bool = False) -> dict[int, Prologue]:
    """gemv id -> the element-wise group computing its input vector, where every reader of
    that vector is a single-row matmul with constant weights (RMSNorm's tail read by the
    q/k/v projections, SwiGLU's product read by the down projection). Each gemv workgroup
    then computes the vector into workgroup memory; the group needs no launch. A
    one-element reduction the group reads, read by nothing else (RMSNorm's mean of
    squares), is computed by the gemv's workgroups too (``reductions``).

    ``q4``: the 4-bit products (``match_q4``) whose kernel computes such a vector where it
    reads it (``quant_rows.gemv_q4_quad``, no workgroup copy), each with the count of its other
    bindings: every reader must be one of them, within the binding limit,
    and without ``reductions`` a vector reading a reduction is left to its own launch.

    A per-head norm (a reduction per contiguous group of the vector, ``grouped_reduction``)
    is computed by the gemv's workgroups too where its values fit their workgroup memory;
    ``grouped_only``: only those (where norms are computed where read, other vectors not)."""
    consumers = fusion.consumers_of(nodes)
    out: dict[int, Prologue] = {}
    for a in _vector_roots(nodes, inlined, taken):
        K = S.size(a.shape)
        readers = consumers.get(a.id, [])
        if not readers or not all(
                c.op == "matmul" and root(c.inputs[0]) is a and c.inputs[0].shape[-1] == K
                and S.size(c.shape[:-1]) == 1
                and (c.id in q4 if q4 is not None else const_weight(c, fold) is not None)
                for c in readers):
            continue
        if q4 is None and not vector_fits(K, target):
            continue  # the vector must fit in workgroup memory beside the reduction scratch
        group = _group(a, groups, inlined)
        # the reduction is looked for where it would be taken, or where its absence (a 4-bit
        # product without ``reductions``) leaves the vector to its own launch
        found = (_reduction_of(group, consumers, groups, inlined, taken)
                 if reductions or q4 is not None else None)
        grouped = False
        if found is None and reductions:  # a per-head norm, where its values fit
            per_head = grouped_reduction(a, group, consumers, groups, inlined, taken)
            if _grouped_fits(per_head, K, target, q4 is not None):
                found, grouped = per_head, True
        if grouped_only and not grouped:
            continue
        red = found if reductions else None
        if q4 is not None and red is None and found is not None:
            continue  # RMSNorm's tail without its reduction: as many launches, more work
        pro = Prologue(group, red, grouped=grouped)
        if q4 is not None:  # its other bindings: codes, scales, zero points, residual, outputs
            if len(pro.leaves) + max(q4[c.id] for c in readers) > target.max_storage:
                continue
        elif len(pro.leaves) + 5 > target.max_storage:  # + weights, residual, 3 outputs
            pro = Prologue(group)
            if len(pro.leaves) + 5 > target.max_storage:
                continue
        for c in readers:
            out[c.id] = pro
    return out


def grouped_reduction(a: Node, group: fusion.Group, consumers: dict[int, list[Node]],
                      groups: dict[int, Any], inlined: set[int],
                      taken: set[int]) -> fusion.Group | None:
    """The sum or mean over the last axis of a [.., groups, D] view of ``a``'s vector that
    only ``group`` reads, each element of ``a`` reading its own group's (a per-head RMS
    norm, Qwen3.5's gated one): the gemv's workgroups compute every group's value
    (``Prologue.grouped``) where a launch would otherwise compute the norm; else None."""
    red = _reduction_of(group, consumers, groups, inlined, taken, row_shape=tuple(a.shape))
    if red is None or red.ops[-1].op not in ("reduce_sum", "reduce_mean"):
        return None
    return red


def _grouped_fits(red: fusion.Group | None, K: int, target: Target, quad: bool) -> bool:
    """Whether a gemv computing ``red``'s per-group values has the workgroup memory for
    them: beside the "quad" kernel's scratch, or the rows kernel's vector and scratch."""
    if red is None:
        return False
    n = S.size(red.ops[-1].shape)
    if quad:
        return 4 * n + QR.quad_scratch_bytes() <= target.shared_bytes
    return vector_fits(K, target, extra=n)


#: the most workgroups a one-row product computing a norm where it reads it may have: each
#: workgroup computes the norm's elements of its input again (two loads and the tail an
#: element), so a product with many (the LM head's 8016 at llama-1b's shapes) pays more
#: than the norm's own launch (PERFORMANCE.md, "What a launch costs")
PROLOGUE_WORKGROUPS = 2048


def vector_fits(K: int, target: Target, extra: int = 0) -> bool:
    """Whether the rows kernel's input vector of ``K`` floats, computed by each workgroup
    (``gemv_rows`` prologue), fits its workgroup memory beside the reduction's scratch and
    the sums (512 floats) and ``extra`` floats more (a gated pair's or a norm's rows)."""
    return 4 * (K + 512 + extra) <= target.shared_bytes


def norm_partials(nodes: list[Node], inlined: set[int], groups: dict[int, Any],
                  taken: set[int], epilogue: dict[int, tuple[Node, Node]],
                  products: dict[int, int], workgroups: Callable[[Node], int | None],
                  target: Target, reads: Callable[[Node], bool] | None = None,
                  spread: Callable[[Node], int] | None = None,
                  ) -> tuple[dict[int, Prologue], dict[int, NormStats]]:
    """(gemv id -> its input vector's Prologue, producer gemv id -> NormStats): RMSNorm read
    only by ``products`` whose input it is (each with its bindings besides the input
    vector: 4-bit ones the "quad" kernel runs, float ones the rows kernel runs), its mean
    of squares over a residual stream that one of them writes with its residual epilogue
    (``epilogue``) in one launch of ``workgroups(product)`` workgroups (None: not one
    launch, so no partials): the product writes the partial sums of squares, and the
    readers compute the norm where they read it. No work is repeated: each square is
    summed once, by the lane that wrote it, and each reader's workgroup sums one float per
    producer workgroup (128 to 512 on llama-1b) instead of the row. The reduction's
    element must be element-wise in the stream alone (``x · x``, through casts); a norm of
    anything else (the embedding's row) keeps its launch. ``reads``: whether a product may
    compute the norm where it reads it (a float product copies it into workgroup memory,
    which must hold it); None: all. ``spread``: a one-row reader's workgroups over all its
    launches; one of more than ``PROLOGUE_WORKGROUPS`` leaves the norm its launch.

    Products of M rows (those ``quant_quad_rows.gemm_q4_quad`` or ``quant.gemm_q4_cols``
    runs, a K-token verify's) alike, the norm one reduction a row: the producer writes
    each row's partials (``workgroups`` of them: its kernel's, ``match_q4.rows_workgroups``),
    and each reader workgroup sums each row's."""
    consumers = fusion.consumers_of(nodes)
    by_id = {o.id: o for o in nodes}
    writer = {add.id: by_id[g] for g, (add, _) in epilogue.items()}  # stream id -> product
    pros: dict[int, Prologue] = {}
    stats: dict[int, NormStats] = {}
    for a in _vector_roots(nodes, inlined, taken):
        readers = consumers.get(a.id, [])
        M = S.size(readers[0].shape[:-1]) if readers else 1  # the readers' rows
        if not readers or not all(
                c.op == "matmul" and root(c.inputs[0]) is a and c.id in products
                and (reads is None or reads(c))
                and S.size(c.shape[:-1]) == M and c.inputs[0].shape[-1] * M == S.size(a.shape)
                for c in readers):
            continue
        group = _group(a, groups, inlined)
        red = _reduction_of(group, consumers, groups, inlined, taken,
                            row_shape=tuple(a.shape) if M > 1 else None)
        if red is None or red.ops[-1].op not in ("reduce_sum", "reduce_mean"):
            continue
        r = red.ops[-1]
        if M > 1 and r.inputs[0].shape[-1] * M != S.size(a.shape):  # a row a reader row
            continue
        chain = red.inner if len(red.ops) > 1 else fusion.Group([], [root(r.inputs[0])])
        if len(chain.leaves) != 1:
            continue
        x = chain.leaves[0]
        p = writer.get(x.id)
        n = S.size(x.shape)
        if (p is None or p.id in stats or p.id not in products
                or S.size(r.inputs[0].shape) != n
                or S.size(p.shape[:-1]) != M  # its rows the readers' (partials a row)
                or any(o.op not in SAME_INDEX_OPS or S.size(o.shape) != n
                       or any(S.size(i.shape) != n for i in o.inputs) for o in chain.ops)):
            continue
        count = workgroups(p)  # one launch, one set of partials
        if count is None:
            continue
        if M == 1 and spread is not None and any(spread(c) > PROLOGUE_WORKGROUPS
                                                 for c in readers):  # the LM head's norm
            continue
        pro = Prologue(group, red)
        if (products[p.id] + 2 > target.max_storage  # its input and the partials
                or len(pro.leaves) + 1 + max(products[c.id] for c in readers)
                > target.max_storage):
            continue
        st = NormStats(chain, x, ("temp", ("norm", p.id)), count, M)
        stats[p.id] = st
        for c in readers:
            pros[c.id] = Prologue(group, red, st)
    return pros, stats


def row_reductions(nodes: list[Node], inlined: set[int], groups: dict[int, Any],
                   taken: set[int], reduce_taken: set[int],
                   target: Target) -> dict[int, Prologue]:
    """Group root id -> the element-wise group and the reduction it reads, where the
    reduction runs over the last axis of its input (kept as 1), only the group reads it, and
    the group's output has that input's shape: RMSNorm (one row), an L2 norm per head (a row
    per head). Each pair is then one launch with a workgroup per row
    (``kernels/matmul.computed_vector``) instead of a reduction and a tail. ``taken``: roots
    that cannot be such a vector; ``reduce_taken``: reductions that must keep their launch
    (a graph output, say)."""
    consumers = fusion.consumers_of(nodes)
    out: dict[int, Prologue] = {}
    for a in _vector_roots(nodes, inlined, taken):
        group = _group(a, groups, inlined)
        red = _reduction_of(group, consumers, groups, inlined, reduce_taken, row_shape=a.shape)
        if red is None or S.size(a.shape) // a.shape[-1] > 65535:
            continue
        pro = Prologue(group, red)
        if len(pro.leaves) + 1 <= target.max_storage:
            out[a.id] = pro
    return out


def _vector_roots(nodes: list[Node], inlined: set[int],
                  taken: set[int]) -> Iterator[Node]:
    """Ops that may root a computed float32 vector: fusible, launched, not taken."""
    return (a for a in nodes if fusion.is_fusible(a) and a.id not in inlined
            and a.id not in taken and a.dtype.wgsl == "f32")


def _group(o: Node, groups: dict[int, Any], inlined: set[int]) -> fusion.Group:
    """The fused group rooted at ``o`` (a single-op group where fusion made none)."""
    return groups.get(o.id) or fusion.collect(o, inlined)[0]


def _reduction_of(group: fusion.Group, consumers: dict[int, list[Node]],
                  groups: dict[int, Any], inlined: set[int], taken: set[int],
                  row_shape: tuple[int, ...] | None = None) -> fusion.Group | None:
    """The reduction among ``group``'s leaves that only ``group`` reads: one element, or
    with ``row_shape``, one per row of an input of that shape (last axis, kept as 1)."""
    ops = {o.id for o in group.ops}
    for x in group.leaves:
        if (x.kind != "op" or not x.op.startswith("reduce_") or x.dtype.wgsl != "f32"
                or x.id in taken or not all(c.id in ops for c in consumers.get(x.id, []))):
            continue
        v = tuple(x.inputs[0].shape)
        if row_shape is None:
            ok = S.size(x.shape) == 1
        else:
            # rows over the last axis of an input of the root's size: the root's own shape
            # or a view of it (an L2 norm per head read back as one flat row, q scaled
            # after it), each element of the root computed from its own row's reduction
            ok = (S.size(v) == S.size(row_shape) and len(v) >= 1 and v[-1] > 1
                  and tuple(x.shape) == v[:-1] + (1,)
                  and tuple(x.attrs["axes"]) == (len(v) - 1,)
                  and _flat_reads(group, x, S.size(v)))
        if ok:
            return _group(x, groups, inlined)
    return None


def _flat_reads(group: fusion.Group, red: Node, count: int) -> bool:
    """Whether each element of ``group``'s root reads the reduction ``red`` of its own row:
    every op depending on ``red`` is element-wise (no slice, transpose, concat or
    expand) and either computes per row (``red``'s shape, from per-row values), or
    broadcasts per-row values along the rows of the reduction's input shape, or is a flat
    view of ``count`` elements read at its own flat index. Then element i of the root
    belongs to the reduction's row i // (its row length)."""
    rows, full = tuple(red.shape), tuple(red.inputs[0].shape)
    dep = {red.id: rows}  # op id -> the shape its dependent values have
    for op in group.ops:
        ins = [x for x in op.inputs if root(x).id in dep]
        if not ins:
            continue
        if op.op in fusion.INDEX_OPS:
            return False
        shp = tuple(op.shape)
        if shp == rows:
            ok = all(tuple(x.shape) == rows for x in ins)
        elif shp == full:
            ok = all(tuple(x.shape) in (rows, full) for x in ins)
        else:
            ok = S.size(shp) == count and all(
                dep[root(x).id] != rows and S.size(x.shape) == count for x in ins)
        if not ok:
            return False
        dep[op.id] = shp
    return group.ops[-1].id in dep and dep[group.ops[-1].id] != rows


def stacked_rows(parts: list[tuple[Node, bool, Any]]) -> np.ndarray:
    """The stacked (sum N, K) weights of a stacked gemv, flat."""
    rows = [weight_rows(src, shp, b_t, 0, shp[0] if b_t else shp[1]) for src, b_t, shp in parts]
    return np.concatenate(rows)


def weight_rows(src: Node, b_shape: Any, b_t: bool, n0: int, nc: int) -> np.ndarray:
    """Rows [n0, n0 + nc) of a constant matmul operand in (N, K) layout, flat."""
    w = src.value.astype(np.float32, copy=False).reshape(b_shape)
    w = w[n0:n0 + nc] if b_t else w[:, n0:n0 + nc].T
    return np.ascontiguousarray(w).reshape(-1)


def interleave(rows: Any, n: int, k: int) -> np.ndarray:
    """(N, K) rows → k-major, interleaved by column: ``Wp[k4*N + n] = W[n, 4k4:4k4+4]``
    (kernels/matmul.py gemv_cols)."""
    vw = 4 if k % 4 == 0 else 1
    w = rows().reshape(n, k // vw, vw).transpose(1, 0, 2)
    return np.ascontiguousarray(w).reshape(-1)


def f16_exact(values: np.ndarray) -> bool:
    """Whether every value of a float32 constant is a float16 value (storing it as float16
    is then lossless: a choice the implementation may make without the page knowing). A
    sample first, so ordinary float32 weights are turned down without reading them all."""
    v = values.reshape(-1)

    def same(x: np.ndarray) -> bool:
        return bool(np.array_equal(x.astype(np.float16).astype(np.float32), x))

    return same(v[:4096]) and same(v)


def paired_rows(values: Any, half: int) -> np.ndarray:
    """The (2 · half, per-row) 32-bit values made by ``values()`` for two stacked
    products of ``half`` rows each (``half`` even), reordered two rows of each at a time:
    rows 2m and 2m + 1 of the first, then of the second (``quant_rows.gemv_q4_quad`` and
    ``kernels/matmul.gemv_rows`` with ``gated``: one group of 4 rows holds both products'
    values at two indices)."""
    v = values().reshape(2, half // 2, 2, -1)
    return np.ascontiguousarray(v.transpose(1, 0, 2, 3)).reshape(-1)


def packed_f16(rows: Any) -> np.ndarray:
    """(N, K) rows as float16, two to a u32 (kernels/matmul.py gemv_rows f16_weights)."""
    return rows().astype(np.float16).view(np.uint32)


# -- lowering: the launches of the products planned above --------------------------------
def _rows_lanes(t: Target, variant: str) -> int:
    """Invocations a weight row of ``variant``'s rows kernel (``ROWS_VARIANT``)."""
    m = ROWS_VARIANT.fullmatch(variant)
    if t.cpu and variant == "cols":
        return 8
    return int(m.group(1) or 32) if m else 32


def rows_per_workgroup(t: Target, variant: str) -> int:
    """Weight rows a workgroup of ``variant``'s rows kernel holds (``gemv_rows``' ``wg /
    lanes``): a gated pair's write needs whole groups of 4 (``paired_rows``)."""
    lanes = _rows_lanes(t, variant)
    return max(256, lanes) // lanes


def chunk_rows(max_binding: int, K: int) -> int:
    """Weight rows of K floats a launch of a constant-weight gemv takes (the binding
    limit; ``lower_const_gemv``)."""
    return max(8, (max_binding // (4 * K)) // 8 * 8)


def rows_spread(plan: Any, p: Node) -> int:
    """The workgroups of float product ``p`` on the rows kernel over all its launches."""
    return -(-p.shape[-1] // rows_per_workgroup(plan.target,
                                                plan.options.gemv_variant(plan.target)))


def rows_workgroups(plan: Any, p: Node) -> int | None:
    """The workgroups of the one launch of float product ``p`` on the rows kernel (how many
    partial sums its ``stats`` writes), or None where it runs in several chunks."""
    if p.shape[-1] > chunk_rows(plan.max_binding, p.inputs[0].shape[-1]):
        return None
    return rows_spread(plan, p)


def gemv_rows(t: Target, variant: str, a_shape: Any, b_shape: Any, shp: Any, n0: int,
              chunk: int | None, residual: bool = False,
              splits: list[int] | None = None,
              prologue: MM.VectorSource | None = None, f16_weights: bool = False,
              gated: MM.GatedOutput | None = None,
              stats: MM.StatsOutput | None = None) -> Kernel:
    """The matrix-vector kernel of ``variant`` (``KernelOptions.gemv_variant``)."""
    if variant == "legacy":
        return MM.gemv(a_shape, b_shape, shp, b_t=True, n_off=n0, n_chunk=chunk)
    m = ROWS_VARIANT.fullmatch(variant)
    lanes = _rows_lanes(t, variant)
    depth = int(m.group(3) or 4) if m else 4
    sub = None if m and m.group(2) else t.subgroup
    return MM.gemv_rows(a_shape, b_shape, shp, n_off=n0, n_chunk=chunk, lanes=lanes,
                        wg=max(256, lanes), subgroup=sub, residual=residual, splits=splits,
                        prologue=prologue, depth=depth, f16_weights=f16_weights,
                        f16_wide=bool(m and m.group(4)), gated=gated, stats=stats)


def _f16_weights(how: str | None, variant: str, K: int, values: list[np.ndarray]) -> bool:
    """Whether a constant-weight gemv streams float16 weights (``how``: the gemv_weights
    option): the rows kernels only, K a multiple of 4."""
    if how == "f32" or not variant.startswith("rows") or K % 4:
        return False
    return how == "f16" or all(f16_exact(v) for v in values)


def _weights(count: int, rows: Callable[[], np.ndarray], half: bool) -> Deferred:
    """``count`` weights of (N, K) rows as uploaded: float32, or float16 two to a u32."""
    return Deferred(count // 2, partial(packed_f16, rows)) if half else Deferred(count, rows)


def gemv_input(plan: Any, o: Node, ins: list[Slot],
               slot_of: Any) -> tuple[list[Slot], MM.VectorSource | None]:
    """(slots bound for a gemv's input vector, its prologue source or None): the vector's
    own slot, or the leaves the gemv computes it from (an attention's partials: the
    combine it computes, ``CombinePrologue``)."""
    pro = plan.prologue.get(o.id)
    if pro is None:
        return [ins[0]], None
    if isinstance(pro, CombinePrologue):
        return [pro.part] + [slot_of(x) for x in pro.epilogue_leaves], pro.source()
    extra = [pro.stats.slot] if pro.stats is not None else []
    return [slot_of(x) for x in pro.leaves] + extra, pro.source()


@claims(10, lambda plan, o: o.id in plan.stacked and o.id not in plan.q4)
def _lower_stacked(n: Site) -> None:
    """Products of one input against stacked weights (``stacked_gemvs``): one launch
    writing each output, or a gated pair's activation (``plan.gated``: the pair's rows
    laid out by ``paired_rows``; 4-bit ones: ``match_q4``)."""
    plan, o = n.plan, n.node
    group = plan.stacked[o.id]
    parts = [const_weight(m, plan.fold) for m in group]
    sizes = [m.shape[-1] for m in group]
    K = o.inputs[0].shape[-1]
    variant = plan.options.gemv_variant(plan.target)
    half = _f16_weights(plan.options.gemv_weights, variant, K, [src.value for src, _, _ in parts])
    gated = plan.gated.get(o.id)
    rows = partial(stacked_rows, parts)
    if gated is not None:
        rows = partial(paired_rows, rows, sizes[0])
    slot = ("const", ("S", o.id))
    plan.consts.setdefault(slot, _weights(sum(sizes) * K, rows, half))
    a_slots, source = gemv_input(plan, o, n.ins, n.slot_of)
    k = gemv_rows(plan.target, variant, o.inputs[0].shape, (sum(sizes), K), (1, sum(sizes)),
                  0, None, splits=sizes if gated is None else None, prologue=source,
                  f16_weights=half, gated=gated.output() if gated is not None else None)
    outs = [n.slot_of(gated.root)] if gated is not None else [n.slot_of(m) for m in group]
    n.add(KernelLaunch(k, a_slots + [slot] + outs))


@claims(40, lambda plan, o: o.id in plan.vectors)
def _lower_vector(n: Site) -> None:
    """A vector computed in one launch with its reduction (``row_reductions``)."""
    vec, shp = n.plan.vectors[n.node.id], n.shape
    count = S.size(shp)
    traffic = 4 * (sum(S.size(x.shape) for x in vec.leaves) + count)
    # a workgroup per reduced row (the reduction's input's last axis: the root's own, or,
    # where the root is a flat view of that input, one of the rows it holds)
    row = vec.reduce_op.inputs[0].shape[-1] if vec.reduce_op is not None else shp[-1]
    n.add(KernelLaunch(MM.computed_vector(vec.source(), count, traffic, count // row,
                                          subgroup=n.plan.target.subgroup,
                                          unrolled=n.plan.options.row_vector != "loop"),
                       n.ins + [n.out]))


def lower_const_gemv(n: Site, src: Node, b_shape: Any, b_t: bool) -> None:
    """One row times constant weights: the weights repacked (N, K), each chunk within the
    binding limit at upload time (Deferred), so the host never holds a second model."""
    plan, o = n.plan, n.node
    a = o.inputs[0]
    N, K = (b_shape[0], b_shape[1]) if b_t else (b_shape[1], b_shape[0])
    variant = plan.options.gemv_variant(plan.target)
    half = _f16_weights(plan.options.gemv_weights, variant, K, [src.value])
    per = chunk_rows(plan.max_binding, K)
    for c, n0 in enumerate(range(0, N, per)):
        nc = min(per, N - n0)
        chunk = None if nc == N else nc
        rows = partial(weight_rows, src, b_shape, b_t, n0, nc)
        if variant.startswith("cols"):
            # k-major, interleaved by column (kernels/matmul.py gemv_cols)
            slot = ("const", ("C", src.id, c))
            plan.consts.setdefault(slot, Deferred(nc * K, partial(interleave, rows, nc, K)))
            ncols, wg, ng = COLS.get(variant, COLS["cols"])
            k = MM.gemv_cols(a.shape, K, n.shape, n_off=n0, n_chunk=chunk, cols=ncols,
                             wg=wg, groups=ng)
            n.add(KernelLaunch(k, [n.ins[0], slot, n.out]))
            continue
        if b_t and nc == N and not half:
            slot = n.slot_of(src)  # already (N, K) and whole: the constant itself
        else:
            slot = ("const", ("H" if half else "T", src.id, c))
            plan.consts.setdefault(slot, _weights(nc * K, rows, half))
        if variant == "legacy":
            k = MM.gemv(a.shape, (N, K), n.shape, b_t=True, n_off=n0, n_chunk=chunk)
            n.add(KernelLaunch(k, [n.ins[0], slot, n.out]))
            continue
        a_slots, source = gemv_input(plan, o, n.ins, n.slot_of)
        dst, res = plan.epilogue.get(o.id, (o, None))  # (the add, residual)
        stats = plan.norm_stats.get(o.id)  # partial sums for the next norm's readers
        assert stats is None or (chunk is None and res is not None), \
            "norm partials need a residual and one launch"
        if stats is not None:
            plan.temps[stats.slot] = stats.count
        k = gemv_rows(plan.target, variant, a.shape, (N, K), n.shape, n0, chunk,
                      residual=res is not None, prologue=source, f16_weights=half,
                      stats=stats.output() if stats is not None else None)
        n.add(KernelLaunch(k, a_slots + [slot] + ([n.slot_of(res)] if res is not None else [])
                           + [n.slot_of(dst)] + ([stats.slot] if stats is not None else [])))
