"""Which element-wise and data-movement ops are computed inside their consumers' kernels.

An op is *inlined* (never materialised) when all its consumers are fusible ops of one
and the same group, and it is not a graph output, a state buffer, or an input of an
in-place state write. Each remaining fusible op is the root of a group: it and its
transitively inlined producers become one kernel (``kernels/fused.py``) reading the
group's leaves. An op read by two groups is materialised once rather than recomputed in
each (a residual stream read by the next layer's norm and by the next residual add would
otherwise be recomputed by every later layer). Inside a group an op read twice (RoPE's
``x`` read by both halves' slices and by ``x * cos``) is evaluated once per read. A group
that would need more storage bindings than the device has, or too many op evaluations
per element, gives its costliest inlined subtree back to its own launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import shapes as S
from .._classes import COMPARISON, ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, MLOperand
from ..kernels import fused as FU
from ..stateful import root

FUSIBLE = set(ELEMENTWISE_BINARY) | set(ELEMENTWISE_UNARY) | set(COMPARISON) | {
    "where", "cast", "logical_not", "expand", "slice", "transpose", "concat"}
MAX_CALLS = 48  # inlined op evaluations per output element, at most


@dataclass
class Group:
    """A fused launch: ``ops`` in topological order (the root last) and its ``leaves``."""

    ops: list[MLOperand]
    leaves: list[MLOperand]

    def fused_ops(self, param: MLOperand | None = None) -> tuple[list[FU.FusedOp], list[FU.Leaf]]:
        """The group for the kernel generators; ``param``: the leaf whose element the
        kernel computes itself and passes in (``kernels/attention.py``)."""
        pos = {o._id: j for j, o in enumerate(self.ops)}
        lpos = {o._id: j for j, o in enumerate(self.leaves)}
        fops = []
        for o in self.ops:
            refs = [("op", pos[root(x)._id]) if root(x)._id in pos else ("leaf", lpos[root(x)._id])
                    for x in o._inputs]
            fops.append(FU.FusedOp(o._op, o._attrs, o._dtype.wgsl, o._shape, refs,
                                   [x._dtype.wgsl for x in o._inputs],
                                   [x._shape for x in o._inputs]))
        leaves = [FU.Leaf(x._dtype.wgsl, S.size(x._shape), param is not None and x is param)
                  for x in self.leaves]
        return fops, leaves

    def kernel(self, guarded: bool = False) -> FU.Kernel:
        return FU.fused(*self.fused_ops(), guarded=guarded)

    def input_source(self) -> tuple[str, list[str], str]:
        """For a host (``is_host``): the leaves' declarations and the inlined ops'
        functions, the leaves' bindings, and the name of the WGSL function or array
        giving the host's input element (called or indexed as ``name(i)``/``name[i]``)."""
        host = self.ops[-1]
        inner = Group(self.ops[:-1], self.leaves)
        fops, leaves = inner.fused_ops()
        decls, bindings = FU.leaf_decls(leaves, 0)
        src = decls + FU.functions(fops, leaves)[0] if fops else decls
        x = root(host._inputs[0])
        pos = [o._id for o in inner.ops]
        if x._id in pos:
            return src, bindings, f"v{pos.index(x._id)}"
        k = [leaf._id for leaf in self.leaves].index(x._id)
        return src, bindings, f"in{k}"


def consumers_of(nodes: list[MLOperand]) -> dict[int, list[MLOperand]]:
    """Op id -> the ops reading it (through reshape views)."""
    out: dict[int, list[MLOperand]] = {}
    for o in nodes:
        if o._kind == "op" and o._op != "reshape":
            for x in o._inputs:
                out.setdefault(root(x)._id, []).append(o)
    return out


def is_fusible(o: MLOperand) -> bool:
    return o._kind == "op" and o._op in FUSIBLE


def is_host(o: MLOperand) -> bool:
    """Ops that compute their input chain inline but are not element-wise themselves
    (a reduction reads ``x * x`` without ``x * x`` being written first)."""
    return o._kind == "op" and o._op.startswith("reduce_")


def plan(nodes: list[MLOperand], pinned: set[int], no_fuse_into: set[int],
         max_leaves: int) -> tuple[set[int], dict[int, Group]]:
    """``(inlined ids, {root id: Group})`` for the op ``nodes`` (creation order).

    ``pinned``: ops that must be materialised (graph outputs, state writers);
    ``no_fuse_into``: ops whose inputs stay materialised (in-place state writers);
    ``max_leaves``: storage buffers a kernel may read (the device limit less the output
    and the capacity status)."""
    consumers = consumers_of(nodes)
    inlined: set[int] = set()
    group_of: dict[int, int | None] = {}  # op id -> root id of the group computing it
    for o in reversed(nodes):  # consumers before producers
        if is_host(o):
            group_of[o._id] = o._id
            continue
        if not is_fusible(o):
            continue
        cs = consumers.get(o._id, [])
        homes = {group_of.get(c._id) for c in cs}
        if (o._id not in pinned and cs and len(homes) == 1 and None not in homes
                and not any(c._id in no_fuse_into for c in cs)):
            inlined.add(o._id)
            group_of[o._id] = homes.pop()
        else:
            group_of[o._id] = o._id
    groups: dict[int, Group] = {}
    for o in reversed(nodes):  # consumers first: un-inlining only adds roots not yet seen
        if not (is_fusible(o) or is_host(o)) or o._id in inlined:
            continue
        while True:
            g, calls = collect(o, inlined)
            if len(g.ops) == 1 or (len(g.leaves) <= max_leaves and calls[o._id] <= MAX_CALLS):
                break
            # give back the inlined op with the most evaluations (its own launch)
            worst = max((x for x in g.ops[:-1]), key=lambda x: calls[x._id])
            inlined.discard(worst._id)
        if len(g.ops) > 1:
            groups[o._id] = g
    return inlined, groups


def collect(r: MLOperand, inlined: set[int]) -> tuple[Group, dict[int, int]]:
    """The group rooted at ``r`` and, per op, what evaluating it once costs in op
    evaluations (its inlined subtree, counted once per path: ``x * x`` evaluates ``x``
    twice). The root's figure is the cost of one output element."""
    order: list[MLOperand] = []
    leaves: dict[int, MLOperand] = {}
    seen: set[int] = set()

    def visit(o: MLOperand) -> None:
        if o._id in seen:
            return
        seen.add(o._id)
        for x in o._inputs:
            x = root(x)
            if x._id in inlined:
                visit(x)
            else:
                leaves.setdefault(x._id, x)
        order.append(o)

    visit(r)
    calls: dict[int, int] = {}
    for o in order:  # producers before consumers
        calls[o._id] = 1 + sum(calls[root(x)._id] for x in o._inputs if root(x)._id in calls)
    return Group(order, list(leaves.values())), calls
