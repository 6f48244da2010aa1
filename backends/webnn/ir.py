"""The graph as ``MLGraphBuilder.build`` hands it to a context: public, frozen, made once.

The builder's operands keep their fields private (they are the API's, free to change); a
backend compiles this record instead, as wgpu-py hands its backends a public surface. It is
made in one walk over the operands the outputs reach (``MLGraphBuilder.build``); a
constant's array and an op's attributes are referenced, not copied, so the hand-off costs
one small object a node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from .dtypes import DType

if TYPE_CHECKING:
    from ._classes import MLKVCachePair

_NO_ATTRS: Mapping[str, Any] = MappingProxyType({})


# eq=False: nodes are compared (``is``) and hashed by identity, as the operands are
@dataclass(frozen=True, eq=False)
class Node:
    """One operand of a built graph."""

    id: int  # creation serial: a node's inputs have smaller ids (a topological order)
    kind: str  # "input" | "constant" | "op"
    dtype: DType
    shape: tuple[int, ...]
    op: str = ""  # the op's name ("" for inputs and constants)
    inputs: tuple[Node, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=lambda: _NO_ATTRS)  # read-only view
    name: str = ""  # an input's name
    value: np.ndarray | None = field(default=None, repr=False)  # a constant's data (not copied)

    def __repr__(self) -> str:
        return f"<Node {self.id} {self.name or self.op or self.kind} {self.dtype.name}{list(self.shape)}>"


@dataclass(frozen=True)
class Graph:
    """A built graph: its named outputs and inputs, its KV pairs, and every node the outputs
    reach (in id order)."""

    outputs: Mapping[str, Node]
    inputs: Mapping[str, Node]
    pairs: tuple[MLKVCachePair, ...]  # PROPOSAL: the build's KV pairs, in order
    nodes: tuple[Node, ...]

    @property
    def constants(self) -> tuple[Node, ...]:
        return tuple(x for x in self.nodes if x.kind == "constant")


def node(id: int, kind: str, dtype: DType, shape: Any, op: str, inputs: tuple[Node, ...],
         attrs: Mapping[str, Any], name: str, value: np.ndarray | None) -> Node:
    """A node from an operand's fields (shape as a tuple, attributes read-only)."""
    return Node(id, kind, dtype, tuple(shape), op, inputs,
                MappingProxyType(attrs) if attrs else _NO_ATTRS, name, value)


def reachable(outs: list[Node]) -> list[Node]:
    """Every operand the outputs depend on, in creation (a topological) order."""
    seen: dict[int, Node] = {}
    stack = list(outs)
    while stack:
        o = stack.pop()
        if o.id not in seen:
            seen[o.id] = o
            stack.extend(o.inputs)
    return [seen[k] for k in sorted(seen)]  # creation order is a topological order
