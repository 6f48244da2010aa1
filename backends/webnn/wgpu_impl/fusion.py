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
from ..ir import Node
from ..kernels import fused as FU
from ..kernels import reduce as RD
from ..stateful import SAME_INDEX_OPS, root
from .launches import KernelLaunch
from .lowerings import Site, claims

#: ops lowered by the element-wise kernel (broadcasting included)
ELEMENTWISE = SAME_INDEX_OPS | {"expand"}
FUSIBLE = ELEMENTWISE | {"slice", "transpose", "concat"}
#: the fusible ops that read their inputs at other indices than their own (a short
#: reduction too: ``short_reduction``)
INDEX_OPS = (FUSIBLE - SAME_INDEX_OPS) | set(RD.COMBINE)
MAX_CALLS = 48  # inlined op evaluations per output element, at most


@dataclass
class Group:
    """A fused launch: ``ops`` in topological order (the root last) and its ``leaves``."""

    ops: list[Node]
    leaves: list[Node]

    def fused_ops(self, param: Node | None = None, named: dict[int, str] | None = None
                  ) -> tuple[list[FU.FusedOp], list[FU.Leaf]]:
        """The group for the kernel generators; ``param``: the leaf whose element the
        kernel computes itself and passes in as ``s`` (``kernels/attention.py``); ``named``:
        leaf id -> argument name, several such leaves (a gated activation's two products)."""
        pos = {o.id: j for j, o in enumerate(self.ops)}
        lpos = {o.id: j for j, o in enumerate(self.leaves)}
        fops = []
        for o in self.ops:
            refs = [("op", pos[root(x).id]) if root(x).id in pos else ("leaf", lpos[root(x).id])
                    for x in o.inputs]
            fops.append(FU.FusedOp(o.op, o.attrs, o.dtype.wgsl, o.shape, refs,
                                   [x.dtype.wgsl for x in o.inputs],
                                   [x.shape for x in o.inputs]))
        names = dict(named or {}) | ({param.id: "s"} if param is not None else {})
        leaves = [FU.Leaf(x.dtype.wgsl, S.size(x.shape), x.id in names,
                          names.get(x.id, "s")) for x in self.leaves]
        return fops, leaves

    def kernel(self, guarded: bool = False) -> FU.Kernel:
        return FU.fused(*self.fused_ops(), guarded=guarded)

    @property
    def inner(self) -> Group:
        """For a host: the inlined ops and the leaves they read (not the host's other
        inputs, e.g. the cache a row write writes: it must not be bound read-only too)."""
        ops = self.ops[:-1]
        used = {root(x).id for o in ops for x in o.inputs}
        return Group(ops, [x for x in self.leaves if x.id in used])

    def input_source(self, first: int = 0, prefix: str = "",
                     named: dict[int, str] | None = None) -> tuple[str, list[str], str]:
        """For a host (``is_host``): the inner leaves' declarations and the inlined ops'
        functions, those leaves' bindings, and the WGSL function giving the host's input
        element ``i`` (the input is always inlined: a host group exists only then).
        ``first``: the binding number of the first leaf; ``prefix``: of every name;
        ``named``: leaves passed as arguments (``fused_ops``), not bound."""
        inner = self.inner
        fops, leaves = inner.fused_ops(named=named)
        decls, bindings = FU.leaf_decls(leaves, first, prefix)
        x = root(self.ops[-1].inputs[host_input(self.ops[-1])])
        pos = [o.id for o in inner.ops]
        return (decls + FU.functions(fops, leaves, prefix)[0], bindings,
                f"{prefix}v{pos.index(x.id)}")


def reduction_inner(red: Node, group: Group | None) -> Group:
    """The input chain of reduction ``red``: its fused ``group``'s inlined ops and their
    leaves, or the reduction's input alone where nothing is inlined into it."""
    if group is not None and len(group.ops) > 1:
        return group.inner
    return Group([], [root(red.inputs[0])])


def reduction_source(red: Node, group: Group | None, first: int,
                     prefix: str) -> tuple[str, list[str], str]:
    """For a kernel computing reduction ``red`` (of fused ``group``) itself: the input
    chain's leaf declarations (bound from ``first`` on) and functions, their bindings, and
    element ``{}`` of the reduction's input (a format string); every name ``prefix``ed."""
    inner = reduction_inner(red, group)
    ops, leaves = inner.fused_ops()
    decls, bindings = FU.leaf_decls(leaves, first, prefix)
    x = root(red.inputs[0])
    pos = [o.id for o in inner.ops]
    load = f"{prefix}v{pos.index(x.id)}({{}})" if x.id in pos else f"{prefix}in0[{{}}]"
    fsrc = FU.functions(ops, leaves, prefix)[0] if ops else ""
    return decls + fsrc, bindings, load


def consumers_of(nodes: list[Node]) -> dict[int, list[Node]]:
    """Op id -> the ops reading it (through reshape views)."""
    out: dict[int, list[Node]] = {}
    for o in nodes:
        if o.kind == "op" and o.op != "reshape":
            for x in o.inputs:
                out.setdefault(root(x).id, []).append(o)
    return out


def sole_reader(consumers: dict[int, list[Node]], x: Node, c: Node) -> bool:
    """Whether ``c`` is the one op reading ``x`` (``consumers`` from ``consumers_of``): what
    a pattern needs before it computes ``x`` inside ``c``'s kernel and never stores it."""
    return [y.id for y in consumers.get(x.id, [])] == [c.id]


def reads_at_own_index(g: Group, x: Node, flat: bool = False) -> bool:
    """Whether element i of ``g``'s root is a function of ``x``'s element i: every op of
    ``g`` depending on ``x`` (the root among them) is element-wise on x's shape and reads
    its dependent inputs without broadcasting; ``flat``: on x's element count, its inputs
    read through flat views (a float16 round trip ``cast32(cast16(x))`` reshaped)."""
    def same(shape: tuple) -> bool:
        return S.size(shape) == S.size(x.shape) if flat else tuple(shape) == tuple(x.shape)

    dep: set[int] = {x.id}
    for op in g.ops:
        ins = [y for y in op.inputs if root(y).id in dep]
        if not ins:
            continue
        if op.op in INDEX_OPS or not same(op.shape) or not all(same(y.shape) for y in ins):
            return False
        dep.add(op.id)
    return g.ops[-1].id in dep


def last_axis_slice(s: Node) -> tuple[int, int] | None:
    """(the input's last-axis width, the start) where ``s`` is a slice cutting its input's
    last axis alone (stride 1, every other axis whole): element j of a slice row is
    element start + j of the input's row, so a kernel can read the input where it lies."""
    if s.kind != "op" or s.op != "slice":
        return None
    src, lead = tuple(s.inputs[0].shape), len(s.shape) - 1
    if (tuple(s.shape[:lead]) != src[:lead] or any(s.attrs["starts"][:lead])
            or any(v != 1 for v in s.attrs["strides"])):
        return None
    return int(src[-1]), int(s.attrs["starts"][-1])


def short_reduction(o: Node) -> bool:
    """A reduction of at most ``kernels/reduce.SHORT_ROW`` elements an output (a short
    convolution's window), which ``kernels/fused`` can compute where it is read."""
    return (o.kind == "op" and o.op in RD.COMBINE
            and RD.reduced(o.inputs[0].shape, o.attrs["axes"]) <= RD.SHORT_ROW)


def _inlinable_reductions(nodes: list[Node], consumers: dict[int, list[Node]]) -> set[int]:
    """Short reductions read only by element-wise ops of their own shape, and so on down
    every element-wise reader (never broadcast back): a short convolution's sum and the
    activation after it. Those may be inlined into their reader's group like an
    element-wise op, so the activation needs no launch of its own. A reduction whose
    values are read broadcast back over its rows (a norm's statistic, through its epsilon
    and square root) stays a host, as the norm patterns (``gemv.vector_sources``) expect."""
    def per_row(o: Node) -> bool:
        todo, seen = [o], {o.id}
        while todo:
            for c in consumers.get(todo.pop().id, []):
                if c.op not in SAME_INDEX_OPS:
                    continue  # a kernel of its own reads the value as written
                if tuple(c.shape) != tuple(o.shape):
                    return False
                if c.id not in seen:
                    seen.add(c.id)
                    todo.append(c)
        return True

    return {o.id for o in nodes if short_reduction(o) and consumers.get(o.id) and all(
        c.op in SAME_INDEX_OPS and tuple(c.shape) == tuple(o.shape)
        for c in consumers[o.id]) and per_row(o)}


def is_fusible(o: Node) -> bool:
    return o.kind == "op" and o.op in FUSIBLE


def host_input(o: Node) -> int | None:
    """The input an op computes inline although it is not element-wise itself (a host):
    a reduction reads ``x * x`` without it being written first; a row write (scatter_nd)
    computes its updates (RoPE of the new key) as it writes them. None: not a host."""
    if o.kind != "op":
        return None
    if o.op.startswith("reduce_"):
        return 0
    return 2 if o.op == "scatter_nd" else None


def is_host(o: Node) -> bool:
    return host_input(o) is not None


def _home(producer: Node, consumer: Node, group_of: dict) -> int | None:
    """The group that would compute ``producer`` for ``consumer`` (None: it must be
    written to memory for this reader)."""
    k = host_input(consumer)
    if k is None:
        return group_of.get(consumer.id)
    reads = [j for j, x in enumerate(consumer.inputs) if root(x) is producer]
    return consumer.id if reads == [k] else None


def plan(nodes: list[Node], pinned: set[int], no_fuse_into: set[int],
         max_leaves: int, no_read: set[int] = frozenset()) -> tuple[set[int], dict[int, Group]]:
    """``(inlined ids, {root id: Group})`` for the op ``nodes`` (creation order).

    ``pinned``: ops that must be materialised (graph outputs, state writers);
    ``no_fuse_into``: state writers, which compute no chain reading a ``no_read``
    operand (the paired inputs: a writer may write the state where it lies); a chain of
    other values they compute inside (a float16 conv window's new state: the slice of
    the window, narrowed, in one launch), as a row write computes its updates;
    ``max_leaves``: storage buffers a kernel may read (the device limit less the output
    and the capacity status)."""
    consumers = consumers_of(nodes)
    short = _inlinable_reductions(nodes, consumers)
    inlined: set[int] = set()
    group_of: dict[int, int | None] = {}  # op id -> root id of the group computing it
    for o in reversed(nodes):  # consumers before producers
        if is_host(o) and o.id not in short:
            group_of[o.id] = o.id
            continue
        if not (is_fusible(o) or o.id in short):
            continue
        cs = consumers.get(o.id, [])
        homes = {_home(o, c, group_of) for c in cs}
        if o.id not in pinned and cs and len(homes) == 1 and None not in homes:
            inlined.add(o.id)
            group_of[o.id] = homes.pop()
        else:
            group_of[o.id] = o.id
    groups: dict[int, Group] = {}
    for o in reversed(nodes):  # consumers first: un-inlining only adds roots not yet seen
        if not (is_fusible(o) or is_host(o)) or o.id in inlined:
            continue
        while True:
            g, calls = collect(o, inlined)
            if is_host(o) and len(g.ops) > 1 and any(x.id in no_read for x in g.inner.leaves):
                # a row write computing its updates from the cache it writes: keep them apart
                inlined.discard(root(o.inputs[host_input(o)]).id)
                continue
            if (o.id in no_fuse_into and not is_host(o) and len(g.ops) > 1
                    and any(x.id in no_read for x in g.leaves)):
                # a state writer's chain reading a paired input: its inputs materialised
                inlined.difference_update(root(x).id for x in o.inputs)
                continue
            if len(g.ops) == 1 or (len(g.leaves) <= max_leaves and calls[o.id] <= MAX_CALLS):
                break
            # give back the inlined op with the most evaluations (its own launch)
            worst = max((x for x in g.ops[:-1]), key=lambda x: calls[x.id])
            inlined.discard(worst.id)
        if len(g.ops) > 1:
            groups[o.id] = g
    return inlined, groups


def collect(r: Node, inlined: set[int]) -> tuple[Group, dict[int, int]]:
    """The group rooted at ``r`` and, per op, what evaluating it once costs in op
    evaluations (its inlined subtree, counted once per path: ``x * x`` evaluates ``x``
    twice). The root's figure is the cost of one output element."""
    order: list[Node] = []
    leaves: dict[int, Node] = {}
    seen: set[int] = set()

    def visit(o: Node) -> None:
        if o.id in seen:
            return
        seen.add(o.id)
        for x in o.inputs:
            x = root(x)
            if x.id in inlined:
                visit(x)
            else:
                leaves.setdefault(x.id, x)
        order.append(o)

    visit(r)
    calls: dict[int, int] = {}
    for o in order:  # producers before consumers
        inner = [calls[root(x).id] for x in o.inputs if root(x).id in calls]
        # a concat's element reads one of its inputs (kernels/fused returns from the branch
        # it falls in): the dearest input, not their sum; a short reduction reads each of
        # its elements
        calls[o.id] = 1 + (max(inner, default=0) if o.op == "concat" else
                           RD.reduced(o.inputs[0].shape, o.attrs["axes"]) * sum(inner)
                           if short_reduction(o) else sum(inner))
    return Group(order, list(leaves.values())), calls


@claims(50, lambda plan, o: o.id in plan.groups and not is_host(o))  # hosts: per op
def _lower_group(n: Site) -> None:
    """A fused group: one launch reading its leaves."""
    group = n.plan.groups[n.node.id]
    n.add(KernelLaunch(group.kernel(n.guarded),
                       [n.slot_of(x) for x in group.leaves] + [n.out] + n.status()))
