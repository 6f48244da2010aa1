"""A product with constant weights whose columns are read apart (by last-axis slices and
reshapes) becomes one product per part, each with its own columns of the weights.

Why: an export may pack projections into one product and split its output: genai's
attention computes q, its output gate, k and v in one MatMulNBits, then splits q from k
and v and, head by head, q from the gate (``Split`` of a ``[.., heads, 2 · D]`` view). Each
slice read by more than one kernel is a launch of its own (three an attention layer),
where separate products on one input run as one stacked launch writing each part where it
is read (``gemv.stacked_gemvs``), as the preset's separate q, k and v do. The weights'
columns are picked once, at compile time: the parts compute exactly the columns they
computed before, in the order the slices read them.

A part is the end of a run of reshapes and slices from the product: an op some other op
reads. It is split off where the whole product is read only through such runs, every
part reads each of its rows' columns at a fixed set of columns (its element ``j`` of row
``r`` is column ``cols[j]`` of row ``r``), no two parts read one column, and no two meet
in one element-wise expression (RoPE's halves: one kernel reads both either way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .. import shapes as S
from ..dtypes import pack_nibbles, packed_words, unpack_nibbles
from ..ir import _NO_ATTRS, Graph, Node, reachable
from . import fusion

#: ops that move a product's elements without computing (a part's run is made of them)
VIEW_OPS = ("reshape", "slice")

#: makes a part's new node with a fresh id: (kind, dtype, shape, op, inputs, attrs, value)
_Make = Callable[..., Node]


def _readers(nodes: tuple[Node, ...]) -> dict[int, list[Node]]:
    """Node id -> the ops reading it directly (each once)."""
    out: dict[int, list[Node]] = {}
    for o in nodes:
        for x in dict.fromkeys(o.inputs):
            out.setdefault(x.id, []).append(o)
    return out


def _parts(m: Node, readers: dict[int, list[Node]], outputs: set[int]
           ) -> list[tuple[Node, list[Node]]] | None:
    """(part, the run of views from ``m`` to it) for every part of ``m``'s output, or None
    where something reads the product, or a view in a run, other than through a run ending
    in a part (a view read by both views and other ops)."""
    out: list[tuple[Node, list[Node]]] = []
    todo: list[list[Node]] = [[c] for c in readers.get(m.id, [])]
    if m.id in outputs or not todo:
        return None
    while todo:
        run = todo.pop()
        v = run[-1]
        if v.op not in VIEW_OPS or len(v.inputs) != 1:
            return None
        rs = readers.get(v.id, [])
        views = [c for c in rs if c.op in VIEW_OPS]
        if views and (len(views) != len(rs) or v.id in outputs):
            return None
        if views:
            todo.extend(run + [c] for c in views)
        else:
            out.append((v, run))
    return out


def _columns(m: Node, run: list[Node]) -> np.ndarray | None:
    """The columns of ``m`` the run's last view holds, in its order (each row the same
    columns), or None where its rows are not ``m``'s rows."""
    idx = np.arange(S.size(m.shape)).reshape(m.shape)
    for v in run:
        if v.op == "reshape":
            idx = idx.reshape(v.shape)
        else:
            starts, strides = v.attrs["starts"], v.attrs["strides"]
            idx = idx[tuple(slice(s, s + n * t, t)
                            for s, n, t in zip(starts, v.shape, strides, strict=True))]
    n, rows = m.shape[-1], S.size(m.shape[:-1])
    flat = idx.reshape(rows, -1)
    cols = flat[0] % n
    if not np.array_equal(flat, np.arange(rows)[:, None] * n + cols[None, :]):
        return None
    return cols


def _nibble_columns(c: Node, cols: np.ndarray) -> np.ndarray:
    """A packed 4-bit constant (rows, N)'s columns ``cols``, packed the same way."""
    raw = np.ascontiguousarray(c.value).view(np.uint8).reshape(-1)
    vals = unpack_nibbles(raw)[:S.size(c.shape)].reshape(c.shape)[:, cols].reshape(-1)
    count = vals.size
    if count % 2:
        vals = np.append(vals, np.uint8(0))
    return packed_words(pack_nibbles(vals), c.dtype, count)


def _constant_columns(c: Node, cols: np.ndarray, n: int, make: _Make) -> Node | None:
    """Constant ``c`` (its last axis ``n`` wide: a weight, a block's scales or zero points)
    with its columns ``cols``; ``c`` itself where it is one value for every column; None
    where it is neither."""
    if c.kind != "constant" or c.value is None:
        return None
    if S.size(c.shape) == 1:
        return c
    if len(c.shape) != 2 or c.shape[-1] != n:
        return None
    shape = (c.shape[0], len(cols))
    value = (_nibble_columns(c, cols) if c.dtype.packed
             else np.ascontiguousarray(c.value.reshape(c.shape)[:, cols]))
    return make(kind="constant", dtype=c.dtype, shape=shape, value=value)


def _weight_columns(b: Node, cols: np.ndarray, make: _Make) -> Node | None:
    """The product's weights ``b`` (K, N) with its columns ``cols``: a constant, a
    dequantizeLinear of constants (blockwise along K), or a cast of one (a float16 model's
    widened weights); None for any other."""
    if len(b.shape) != 2:
        return None
    n = b.shape[-1]
    if b.kind == "constant":
        return _constant_columns(b, cols, n, make)
    if b.kind != "op" or b.op not in ("dequantize_linear", "cast"):
        return None
    ins = ([_constant_columns(x, cols, n, make) for x in b.inputs] if b.op != "cast"
           else [_weight_columns(b.inputs[0], cols, make)])
    if any(x is None for x in ins):
        return None
    return make(kind="op", op=b.op, dtype=b.dtype, shape=(b.shape[0], len(cols)),
                inputs=tuple(ins), attrs=b.attrs)


def _reach(p: Node, readers: dict[int, list[Node]]) -> set[int]:
    """Ids of the element-wise and data-movement ops reading ``p``, and so on down: what
    fusion may compute in one kernel with ``p`` (``fusion.FUSIBLE``)."""
    seen: set[int] = set()
    todo = [p]
    while todo:
        for c in readers.get(todo.pop().id, []):
            if c.id not in seen and (c.op == "reshape" or c.op in fusion.FUSIBLE):
                seen.add(c.id)
                todo.append(c)
    return seen


def _meet(parts: list[tuple[Node, list[Node]]], readers: dict[int, list[Node]]) -> bool:
    """Whether two parts meet in one element-wise expression (RoPE's halves of one
    product): fusion reads them in one kernel either way, and the patterns reading the
    product whole (attention's q, a row write's RoPE of k) keep matching it."""
    seen: set[int] = set()
    for p, _ in parts:
        reach = _reach(p, readers)
        if reach & seen:
            return True
        seen |= reach
    return False


def _plan(graph: Graph) -> dict[int, tuple[Node, np.ndarray]]:
    """Part id -> (its product, its columns), for every product split."""
    readers = _readers(graph.nodes)
    outputs = {o.id for o in graph.outputs.values()}
    out: dict[int, tuple[Node, np.ndarray]] = {}
    for m in graph.nodes:
        if m.kind != "op" or m.op != "matmul" or len(m.inputs[1].shape) != 2:
            continue
        parts = _parts(m, readers, outputs)
        if parts is None or len(parts) < 2:
            continue
        if _meet(parts, readers):
            continue
        cols = [_columns(m, run) for _, run in parts]
        if any(c is None for c in cols):
            continue
        every = np.concatenate(cols)
        if np.unique(every).size != every.size:
            continue  # two parts read one column: each would compute it
        out.update({p.id: (m, c) for (p, _), c in zip(parts, cols, strict=True)})
    return out


def split_products(graph: Graph) -> Graph:
    """``graph`` with each product read apart split into its parts (the same graph object
    where none is). The nodes are numbered anew, in a topological order."""
    plan = _plan(graph)
    if not plan:
        return graph
    nodes: list[Node] = []
    mapped: dict[int, Node] = {}

    def make(kind: str, dtype, shape, op: str = "", inputs: tuple[Node, ...] = (),
             attrs=_NO_ATTRS, value=None, name: str = "") -> Node:
        o = Node(len(nodes), kind, dtype, tuple(shape), op, inputs, attrs, name, value)
        nodes.append(o)
        return o

    for o in graph.nodes:
        if o.id in plan:
            m, cols = plan[o.id]
            x, b = (mapped[i.id] for i in m.inputs)
            w = _weight_columns(b, cols, make)
            if w is not None:
                y = make("op", m.dtype, m.shape[:-1] + (len(cols),), "matmul", (x, w),
                         m.attrs)
                mapped[o.id] = y if y.shape == o.shape else make(
                    "op", o.dtype, o.shape, "reshape", (y,))
                continue
        new = dataclasses.replace(o, id=len(nodes),
                                  inputs=tuple(mapped[i.id] for i in o.inputs))
        nodes.append(new)
        mapped[o.id] = new
    for o in graph.inputs.values():  # an input nothing reads: numbered apart
        if o.id not in mapped:
            mapped[o.id] = make(o.kind, o.dtype, o.shape, name=o.name)
    outputs = {k: mapped[o.id] for k, o in graph.outputs.items()}
    inputs = {k: mapped[o.id] for k, o in graph.inputs.items()}
    live = {o.id for o in reachable(list(outputs.values()))}
    return Graph(outputs=outputs, inputs=inputs, pairs=graph.pairs,
                 nodes=tuple(o for o in nodes if o.id in live))
