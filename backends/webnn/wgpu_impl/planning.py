"""Planning: the steps a graph's launches come from, their order (with the in-place decision
for each pair's state), and which of them anything needs.

A step is one schedulable unit: an op node's launches, an output copy, or the capacity
check. Where no order lets a pair's writer update its state in place, the pair keeps two
buffers (``stateful.PairPlan``, PROPOSAL).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ..ir import Node
from ..stateful import PairPlan, root
from .passes import PassState
from .plan import Plan, Slot


@dataclass
class Step:
    """One schedulable unit: an op node's launches, an output copy, or the check."""

    key: float
    kind: str  # "op" | "copy" | "check"
    node: Node | None = None
    reads: list[Node] = field(default_factory=list)  # roots read
    writes: Node | None = None  # root written
    copy_dst: Slot | None = None
    more: list[Node] = field(default_factory=list)  # also written (stacked gemvs)
    live: bool = True  # something needs what it writes (``live_steps``)

    @property
    def written(self) -> list[Node]:
        return ([self.writes] if self.writes is not None else []) + self.more


def op_steps(plan: Plan, st: PassState) -> tuple[list[Step], Step | None]:
    """The steps of every op node left after the passes, the output copies, and the
    capacity check (the check step, or None where no pair appends)."""
    steps: list[Step] = []

    def reads_of(o: Node) -> list[Node]:
        """The roots one op's launch reads: its fused group's leaves or its inputs."""
        if o.id in plan.capsule:
            return list(plan.capsule[o.id].leaves)
        if o.id in plan.attention:
            return list(plan.attention[o.id].leaves)
        if o.id in plan.gdn:
            return list(plan.gdn[o.id].leaves)
        if o.id in plan.vectors:
            return list(plan.vectors[o.id].leaves)
        if o.id in plan.groups:
            return list(plan.groups[o.id].leaves)
        return [root(x) for x in o.inputs]

    for o in st.nodes:
        if o.kind != "op" or o.op == "reshape" or o.id in st.inlined or o.id in st.absorbed:
            continue
        reads = reads_of(o)
        if o.id in plan.fold:
            reads[1] = plan.fold[o.id]
        if o.id in plan.head_rows:  # attention's output as it lies, not its transpose
            reads[0] = plan.head_rows[o.id][0]
        if o.id in plan.q4 or o.id in plan.q4_rows:  # repacked at upload: not the float weights
            del reads[1]
        if o.id in plan.prologue:
            reads = list(plan.prologue[o.id].leaves) + reads[1:]
        more = (plan.stacked.get(o.id) or plan.stacked_rows.get(o.id) or [o])[1:]
        for m in plan.row_writes.get(o.id, [o])[1:]:
            more.append(m)
            reads += [r for r in reads_of(m) if r not in reads]
        for w in plan.attention_writes.get(o.id, ()):  # the row writes folded in
            more.append(w)
            reads += [r for r in reads_of(w) if r not in reads]
        m = plan.attention.get(o.id)
        if m is not None and m.epilogue is not None and o.id not in plan.combined:
            # its combine writes the epilogue's root instead (a product computing the
            # combine computes the epilogue too: ``gemv.CombinePrologue``)
            reads += [r for r in m.epilogue_leaves if r not in reads]
            more.append(m.epilogue.ops[-1])
        if o.id in plan.gdn:
            more.append(plan.gdn[o.id].state_out)  # the new state, written by the launch
        if o.id in plan.capsule:
            more += plan.capsule[o.id].written  # a capture's new state and capsule
        if o.id in plan.gated:
            more.append(plan.gated[o.id].root)  # written by the pair's launch
        if o.id in plan.epilogue:
            add_node, res = plan.epilogue[o.id]
            reads.append(res)
            more.append(add_node)
        steps.append(Step(o.id, "op", o, reads, o, more=more))
    for r, slot, _name in st.extra_copies:
        steps.append(Step(1e18, "copy", None, [r], None, slot))

    check_step = None
    appends = [pp for pp in plan.pairs if pp.append]
    if appends:
        unique = list({root(pp.indices).id: root(pp.indices) for pp in appends}.values())
        check_step = Step(-1, "check", None, unique)
        steps.append(check_step)
        plan.has_check = True
    return steps, check_step


def place_state(plan: Plan, st: PassState, steps: list[Step], check: Step | None,
                outputs: dict[str, Node]) -> list[Step]:
    """The in-place decision (greedy, pair order: a pair is in place where some order still
    exists with it), each pair's present slot, and that order."""
    chosen: list[PairPlan] = []
    for pp in plan.pairs:
        if pp.writer is None:
            continue
        if schedule(steps, chosen + [pp], check) is not None:
            chosen.append(pp)
    for pp in chosen:
        pp.in_place = True
    for pp in plan.pairs:
        present = root(outputs[pp.pair.output])
        slot = ("state", pp.index, "cur" if pp.in_place else "next")
        if pp.writer is not None:
            st.dest[pp.writer.id] = slot
        else:
            steps.append(Step(1e18, "copy", None, [present], None, slot))
    order = schedule(steps, chosen, check)
    assert order is not None
    plan.in_place = {pp.writer.id: pp for pp in chosen}
    return order


def live_steps(order: list[Step], dest: dict[int, Slot]) -> None:
    """Liveness: mark the steps nobody needs (e.g. a transpose folded into matmul)."""
    needed = {sl for sl in dest.values() if sl[0] in ("output", "state")}
    live_roots: set[int] = set()
    for st in reversed(order):
        if st.kind in ("copy", "check") or any(
                w.id in live_roots or dest.get(w.id) in needed for w in st.written):
            st.live = True
            live_roots.update(r.id for r in st.reads)
        else:
            st.live = False


def schedule(steps: list[Step], in_place: list[PairPlan],
              check: Step | None) -> list[Step] | None:
    """Topological order honouring data dependencies plus, for each in-place pair, 'every
    other reader of the state before its writer' and 'the capacity check before any
    in-place write'. None if those constraints form a cycle."""
    producer = {w.id: st for st in steps for w in st.written}
    edges: dict[int, set[int]] = {id(st): set() for st in steps}  # step -> successors
    indeg = {id(st): 0 for st in steps}
    byid = {id(st): st for st in steps}

    def edge(a: Step, b: Step) -> None:
        if a is not b and id(b) not in edges[id(a)]:
            edges[id(a)].add(id(b))
            indeg[id(b)] += 1

    for st in steps:
        for r in st.reads:
            if r.id in producer:
                edge(producer[r.id], st)
    for pp in in_place:
        w = producer[pp.writer.id]
        for st in steps:
            if st is w or pp.past not in st.reads:
                continue
            edge(st, w)
        if w.node is not None:
            for k, x in enumerate(w.node.inputs):
                allowed = (pp.append and k == 0) or k == pp.alias_input
                if root(x) is pp.past and not allowed:
                    return None  # the writer reads the old state elsewhere
        if check is not None:
            edge(check, w)
    heap = [(st.key, n, id(st)) for n, st in enumerate(steps) if indeg[id(st)] == 0]
    heapq.heapify(heap)
    out: list[Step] = []
    while heap:
        _, n, sid = heapq.heappop(heap)
        out.append(byid[sid])
        for nxt in edges[sid]:
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                heapq.heappush(heap, (byid[nxt].key, n + len(steps), nxt))
    return out if len(out) == len(steps) else None


