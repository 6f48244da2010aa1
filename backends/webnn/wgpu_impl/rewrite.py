"""The graph as the compiler plans it: common subexpressions merged, and transposes that move
no element turned into views.

Why: a converted export spells per layer what is the same value for every layer.
GroupQueryAttention, as ``convert_attention`` decomposes each node, casts ``seqlens_k``,
gathers its rows of the rotary caches and builds the row-write index itself: four launches a
layer where one set serves them all (onnxruntime-genai's q4f16 Llama: 14 launches a layer
against the preset's 9). And ``[B, S, heads, D] -> [B, heads, S, D]`` at S = 1 keeps every
element where it was, yet ran as a copy launch after each attention. Both are rewrites of
the graph, not of any kernel: the merged op is computed once, and the transpose becomes a
reshape (a view: ``stateful.root`` reads through it).

An op is merged with an earlier one of the same op, attributes, inputs, type and shape;
constants are one where they are the same array, or small and equal. A graph output is
never merged away (each output keeps its own node). The rewritten nodes keep their ids, so
id order stays a topological order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..ir import _NO_ATTRS, Graph, Node

#: constants compared by value up to this many bytes (larger ones: by identity only)
SMALL_CONSTANT = 1 << 16


def _frozen(v: Any) -> Any:
    """A hashable stand-in for an attribute value."""
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    if isinstance(v, float) and v != v:
        return ("nan",)
    return v


def moves_nothing(o: Node) -> bool:
    """Whether transpose ``o`` keeps every element at its linear index: the axes longer
    than 1 stay in their order."""
    perm = o.attrs["permutation"]
    shape = o.inputs[0].shape
    kept = [p for p in perm if shape[p] != 1]
    return kept == sorted(kept)


def simplified(graph: Graph) -> Graph:
    """``graph`` with its duplicate ops and constants merged and its element-preserving
    transposes made views (the same graph object where nothing changes)."""
    keep = {o.id for o in graph.outputs.values()}
    mapped: dict[int, Node] = {}
    seen: dict[tuple, Node] = {}
    by_value: dict[int, Node] = {}  # id(array) -> its first constant node
    changed = False
    nodes: list[Node] = []
    for n in graph.nodes:
        ins = tuple(mapped.get(x.id, x) for x in n.inputs)
        new = n if all(a is b for a, b in zip(ins, n.inputs, strict=True)) else \
            dataclasses.replace(n, inputs=ins)
        if new.kind == "op" and new.op == "transpose" and moves_nothing(new):
            new = dataclasses.replace(new, op="reshape", attrs=_NO_ATTRS)
        key = None
        if new.kind == "constant" and new.value is not None:
            first = by_value.get(id(new.value))
            if first is not None and first.dtype == new.dtype and first.shape == new.shape:
                key = ("same", id(first))
                seen.setdefault(key, first)
            elif new.value.nbytes <= SMALL_CONSTANT:
                key = ("const", new.dtype.name, new.shape, new.value.dtype.str,
                       np.ascontiguousarray(new.value).tobytes())
            by_value.setdefault(id(new.value), new)
        elif new.kind == "op":
            key = ("op", new.op, _frozen(dict(new.attrs)), tuple(x.id for x in ins),
                   new.dtype.name, new.shape)
        if key is not None and n.id not in keep:
            first = seen.get(key)
            if first is not None:
                mapped[n.id] = first
                changed = True
                continue
            seen[key] = new
        if new is not n:
            mapped[n.id] = new
            changed = True
        nodes.append(new)
    if not changed:
        return graph
    return Graph(outputs={k: mapped.get(o.id, o) for k, o in graph.outputs.items()},
                 inputs={k: mapped.get(o.id, o) for k, o in graph.inputs.items()},
                 pairs=graph.pairs, nodes=tuple(nodes))
