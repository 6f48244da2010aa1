"""The lowering registry: which function appends the launches of an op node.

``lowering.lower_node`` tries, for each live op node:

1. the *claims*, in rank order: a matcher's lowering for the nodes its pass recorded in the
   plan (stacked gemvs, a gated delta step, decode attention, a fused group, 4-bit
   products...), each registered beside its matcher with ``@claims(rank, applies)``;
2. the node's op: ``@lowers("op", ...)``, one function per op or op family.

A node neither claims nor an op lowers raises NotImplementedError at build.

To add an op: in the module that owns its kernels (plain ops: ``lowering.py``), write::

    @lowers("my_op")
    def _my_op(n: Site) -> None:
        \"\"\"Why it is launched this way.\"\"\"
        k = MY.my_op(n.wgsl, n.node.inputs[0].shape, n.shape, n.node.attrs["axis"])
        n.add(KernelLaunch(k, n.ins + [n.out]))

``Site`` carries the node, its slots and the plan. A module that registers must be imported
by ``lowering.py`` (its ``# registers`` imports), or its lowerings are never seen.
Element-wise ops (``fusion.ELEMENTWISE``) are registered from that set: a new one needs no
lowering of its own, only its WGSL expression (``kernels/elementwise``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .launches import Slot

if TYPE_CHECKING:
    from ..stateful import PairPlan
    from .plan import Plan


@dataclass
class Site:
    """One op node being lowered: the node, the slots of its reads and of its result, the
    pair it writes in place (if any) and the plan the launches are appended to."""

    plan: Plan
    node: Any
    reads: list[Any]  # the node's inputs as stored (reshapes resolved to their roots)
    slot_of: Callable[[Any], Slot]
    pair: PairPlan | None  # the pair this node writes in place
    has_check: bool  # the graph checks the pairs' capacity (a status word)
    out: Slot = ()
    ins: list[Slot] | None = None

    def __post_init__(self) -> None:
        # the result's slot first, then the reads': slots are made on first use
        self.out = self.slot_of(self.node)
        self.ins = [self.slot_of(r) for r in self.reads]

    @property
    def wgsl(self) -> str:
        """The result's WGSL element type."""
        return self.node.dtype.wgsl

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def guarded(self) -> bool:
        """Whether the launch writes a pair in place behind the capacity check."""
        return self.pair is not None and self.has_check

    def status(self, guarded: bool | None = None) -> list[Slot]:
        """The status slot a guarded launch binds last (none when not ``guarded``)."""
        return [("status",)] if (self.guarded if guarded is None else guarded) else []

    def add(self, launch: Any) -> None:
        self.plan.launches.append(launch)


Lowering = Callable[[Site], None]

#: op name -> its lowering
LOWERINGS: dict[str, Lowering] = {}
#: (rank, name, applies(plan, node), lowering), in rank order
CLAIMS: list[tuple[int, str, Callable[[Any, Any], bool], Lowering]] = []


def lowers(*ops: str) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of every node of ``ops``."""

    def register(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"op {op!r} already lowered by {LOWERINGS[op].__qualname__}")
            LOWERINGS[op] = fn
        return fn

    return register


def claims(rank: int, applies: Callable[[Any, Any], bool]) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of the nodes ``applies(plan, node)``
    holds for, tried before the op's own and before the claims of a higher ``rank``."""

    def register(fn: Lowering) -> Lowering:
        if any(r == rank for r, *_ in CLAIMS):
            raise ValueError(f"claim rank {rank} taken")
        CLAIMS.append((rank, fn.__qualname__, applies, fn))
        CLAIMS.sort(key=lambda c: c[0])
        return fn

    return register


def lowering_of(plan: Plan, node: Any) -> Lowering:
    """The function that lowers ``node``: the first claim that applies, else its op's."""
    for _, _, applies, fn in CLAIMS:
        if applies(plan, node):
            return fn
    fn = LOWERINGS.get(node.op)
    if fn is None:
        raise NotImplementedError(f"op {node.op!r}")
    return fn
