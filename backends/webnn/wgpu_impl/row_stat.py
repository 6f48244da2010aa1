"""A per-row statistic an element-wise chain reads, computed by the kernel that evaluates the
chain row by row instead of by a reduction launch of its own.

Qwen3.5's attention normalises q and k per head (``SimplifiedLayerNormalization`` over the
head dimension) before the rotary embedding: each norm's mean of squares is a
``reduce_mean`` over the last axis whose value the chain reads broadcast over the head's
row. The attention kernel reading a head's q rows, and the pass-1 launch writing a new K
row (``match_attention.fold_row_writes``), have the whole row at hand: they reduce it
themselves (``kernels/attention.RowReduce``) and hand the chain the row's value as an
argument (a *param* leaf, ``kernels/fused.functions``), so the reduction needs no launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import shapes as S
from ..ir import Node
from ..kernels import attention as AT
from ..stateful import SAME_INDEX_OPS, root
from . import fusion

#: the reductions a kernel computes row by row (``attention.row_stat``)
ROW_OPS = ("reduce_sum", "reduce_mean")


@dataclass
class RowStat:
    """``reduce`` (over the last axis, ``count`` elements a row) read by a chain as a leaf;
    ``group``: the reduction's own fused group (its input chain, ``x · x``), if any;
    ``rows``: the reduction's row each row of the chain's root reads (None: its own; a
    K-token verify's q rows are the norm's transposed)."""

    reduce: Node
    group: fusion.Group | None
    rows: tuple[int, ...] | None = None

    @property
    def count(self) -> int:
        return int(self.reduce.inputs[0].shape[-1])

    @property
    def leaves(self) -> list[Node]:
        """What the kernel reads for the reduction, in binding order."""
        return list(fusion.reduction_inner(self.reduce, self.group).leaves)

    def source(self, first: int, prefix: str) -> AT.RowReduce:
        """The reduction as the kernels take it: its leaves bound from ``first`` on, every
        name prefixed ``prefix``."""
        src, bindings, load = fusion.reduction_source(self.reduce, self.group, first, prefix)
        if self.rows is None:
            return AT.RowReduce(self.reduce.op, self.count, src, bindings, load)
        n = len(self.rows)
        table = (f"var<private> {prefix}rows: array<u32, {n}> = array<u32, {n}>("
                 + ", ".join(f"{r}u" for r in self.rows) + ");\n")
        return AT.RowReduce(self.reduce.op, self.count, src + table, bindings, load,
                            f"{prefix}rows[{{}}]")


def find_row_stat(g: fusion.Group, d: int, consumers: dict[int, list[Node]],
                  groups: dict[int, fusion.Group], taken: set[int]) -> RowStat | None:
    """The one reduction leaf of ``g`` a kernel evaluating ``g``'s root row by row (rows of
    ``d`` elements) may compute itself, or None: a sum or mean over the last axis of ``d``
    elements, read by nothing outside ``g``, not ``taken`` (pinned, absorbed), of one
    value a row of the root: the elements of each row of ``d`` of the root read it
    (through any path) at one row of the reduction (``RowStat.rows``); reading one buffer,
    so the kernel binds no more than before (the reduction's input in the reduction's
    place)."""
    ops = {o.id for o in g.ops}
    found = [x for x in g.leaves if _row_reduction(x, d) and x.id not in taken
             and all(c.id in ops for c in consumers.get(x.id, []))]
    if len(found) != 1 or S.size(g.ops[-1].shape) != S.size(found[0].shape) * d:
        return None
    r = found[0]
    stat = RowStat(r, groups.get(r.id))
    if len(stat.leaves) > 1:
        return None
    tags = _row_tags(g, r)
    if tags is None:
        return None
    rows = _rows_read(tags.reshape(-1, d))
    if rows is None:
        return None
    stat.rows = None if rows == tuple(range(len(rows))) else rows
    return stat


def _rows_read(tags: np.ndarray) -> tuple[int, ...] | None:
    """The one row of the reduction each row of ``tags`` reads (its own index where it
    reads none), or None where a row reads two."""
    out = []
    for i, row in enumerate(tags):
        seen = np.unique(row[row >= 0])
        if len(seen) > 1:
            return None
        out.append(int(seen[0]) if len(seen) else i)
    return tuple(out)


def _row_reduction(x: Node, d: int) -> bool:
    """Whether ``x`` sums (or averages) the last axis, of ``d`` elements, alone."""
    if x.kind != "op" or x.op not in ROW_OPS or x.dtype.wgsl != "f32":
        return False
    shp = tuple(x.inputs[0].shape)
    axes = [a % len(shp) for a in x.attrs["axes"]] if shp else []
    return bool(shp) and axes == [len(shp) - 1] and shp[-1] == d


def _row_tags(g: fusion.Group, r: Node) -> np.ndarray | None:
    """For each element of ``g``'s root, the row of ``r`` it reads (-1: none), by
    following the index maps of ``g``'s ops; None where an op reads ``r``'s values at two
    rows in one element or is not one whose index map is followed here."""
    tags: dict[int, np.ndarray] = {r.id: np.arange(S.size(r.shape)).reshape(r.shape)}
    for o in g.ops:
        ins = [_view(tags, x) for x in o.inputs]
        if all(t is None for t in ins):
            continue
        got = _op_tags(o, ins)
        if got is None:
            return None
        tags[o.id] = got
    return tags.get(g.ops[-1].id, np.full(g.ops[-1].shape, -1))


def _view(tags: dict[int, np.ndarray], x: Node) -> np.ndarray | None:
    t = tags.get(root(x).id)
    return None if t is None else t.reshape(x.shape)


def _op_tags(o: Node, ins: list[np.ndarray | None]) -> np.ndarray | None:
    """The rows ``o``'s elements read, given its inputs' (None: an input reading none)."""
    shape = tuple(o.shape)
    full = [np.full(x.shape, -1) if t is None else t for x, t in zip(o.inputs, ins, strict=True)]
    if o.op in SAME_INDEX_OPS or o.op == "expand":
        out = np.full(shape, -1)
        for t in full:
            b = np.broadcast_to(t, shape)
            if np.any((out >= 0) & (b >= 0) & (out != b)):
                return None
            out = np.where(b >= 0, b, out)
        return out
    if o.op == "slice":
        idx = tuple(slice(s, s + (n - 1) * st + 1, st) for s, n, st in
                    zip(o.attrs["starts"], shape, o.attrs["strides"], strict=True))
        return full[0][idx]
    if o.op == "transpose":
        return np.transpose(full[0], o.attrs["permutation"])
    if o.op == "concat":
        return np.concatenate(full, axis=o.attrs["axis"])
    return None
