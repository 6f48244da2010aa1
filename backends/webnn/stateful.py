"""PROPOSAL (DESIGN §3): the stateful build as a graph transformation.

For each KV pair the paired input becomes a hidden device buffer owned by the graph. The
output gets the input's storage when that is safe:

* append pair: the output is ``scatter_nd(past, indices, updates)`` (possibly behind
  reshapes). The scatter then writes only the new rows into the state buffer; the copy of
  the unchanged rows is dropped. Every other reader of ``past`` must run before the
  scatter.
* overwrite pair (e.g. a recurrent ``S' = f(S)``): the op ``W`` producing the output
  writes the state buffer directly when every other reader of ``S`` can be scheduled
  before ``W``; ``W`` itself may read ``S`` only if it is element-wise on the same shape
  (each thread reads and writes its own element).

Where no schedule satisfies these constraints (see ``planning.schedule``) the pair keeps
two hidden buffers, swapped after each successful dispatch (no host traffic).

Capacity (behaviour 4): before any in-place state write, one check kernel validates the
scatter indices of every append pair on the device and writes a status word; every
kernel that writes state in place is gated on it (writes nothing on overflow); the
status (4 bytes) is read where the context next waits for the device anyway (the next
``read_tensor``, after its read, or the next dispatch, before it runs: no sync of its own,
as a browser's asynchronous dispatch would report it) and raises ``OperationError``
there; double-buffered pairs are swapped back. The cache is therefore left as it was.
We chose the device-side check over computing the row on the host from the bound
position input because the indices are an arbitrary function of graph inputs that may
themselves live only on the device (an MLTensor written by an earlier dispatch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._classes import (
    COMPARISON,
    ELEMENTWISE_BINARY,
    ELEMENTWISE_UNARY,
    LOGICAL,
    MLKVCachePair,
)
from .ir import Node

SAME_INDEX_OPS = set(ELEMENTWISE_BINARY) | set(ELEMENTWISE_UNARY) | set(COMPARISON) | {
    "where", "cast"} | set(LOGICAL)


def root(o: Node) -> Node:
    """The operand whose storage ``o`` shares (reshape is a no-op view)."""
    while o.kind == "op" and o.op == "reshape":
        o = o.inputs[0]
    return o


@dataclass
class PairPlan:
    """How one pair is realised."""

    index: int
    pair: MLKVCachePair
    past: Node  # the paired input operand
    writer: Node | None  # the op whose output becomes the state (root of output)
    append: bool  # writer is scatter_nd(past, ...)
    alias_input: int | None  # for an element-wise writer reading past in place
    in_place: bool = False

    @property
    def indices(self) -> Node | None:
        return self.writer.inputs[1] if self.append and self.writer is not None else None


def analyse(index: int, pair: MLKVCachePair, past: Node, present: Node) -> PairPlan:
    """Classify a pair (append / overwrite) and say which read of ``past`` by the writer
    is allowed in place."""
    w = root(present)
    if w.kind != "op" or w is past:
        # present is a view of an input or constant: materialised by a copy, two buffers
        return PairPlan(index, pair, past, None, False, None)
    if w.op == "scatter_nd" and root(w.inputs[0]) is past:
        return PairPlan(index, pair, past, w, True, None)
    alias = None
    if w.op in SAME_INDEX_OPS:
        for k, x in enumerate(w.inputs):
            if root(x) is past and x.shape == w.shape and alias is None:
                alias = k
    return PairPlan(index, pair, past, w, False, alias)
