"""Growing caches made fixed-capacity, at ONNX level, before conversion: what real exports
need before the stateful transform (same-shape pairs) can hold.

Real exporters grow the cache: present = past + one row on the sequence axis, written as
``Concat(past, new)`` (optimum, transformers) or inside com.microsoft
``GroupQueryAttention`` (onnxruntime-genai). A WebNN graph has static shapes, so the
pages pin the past at ``capacity`` rows and the total at ``capacity + 1``
(``dims.default_dims``); this module then makes each growing pair same-shaped:

* ``Concat(past, new)`` on the pair's axis: the present becomes
  ``ScatterND(past, [.., position, ..], new)`` (the new row written at the position, in
  place under the stateful transform, ``stateful.analyse``), and the Concat, which the
  model's attention reads, takes that written cache instead of the past. Attention then
  sees ``capacity + 1`` rows: the cache (rows up to and including the position valid,
  the new one among them) and the new row again at the end. The page feeds
  ``attention_mask`` with ones up to and including the position and zeros beyond (the
  last, duplicate row among them), and the model's own mask logic drops the rest.
  The position is read from that mask (its sum less one), so the row written and the
  rows masked cannot disagree. Safe only where the model has an ``attention_mask`` as long
  as the grown axis: without one, the zero rows beyond the position would be attended.
* ai.onnx ``Attention`` with a past: first written as the Concat it computes (one query
  row: ``_split_attention``), then as above.
* ``GroupQueryAttention``: its shared-buffer form (past and present one capacity-sized
  buffer, the new row written at ``seqlens_k``): the present is declared with the past's
  shape and the converter's handler (``convert_attention``) writes it so.

Every other producer of a growing present is left alone and reported: the model is then
unavailable on the WebNN pages with that one-line reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: the input whose length covers the cache and whose ones say which rows are valid
MASK_INPUT = "attention_mask"


@dataclass(frozen=True)
class Rewrite:
    """What was done to one growing pair: ``how`` says it in words; ``ok`` False: it could
    not be, and ``how`` is the reason."""

    input: str
    output: str
    ok: bool
    how: str


class FixedCapacityError(ValueError):
    """A growing pair the rewrite cannot prove safe; the message names it and why."""


def fixed_model(model: onnx.ModelProto, capacity: int,
                pairs: Mapping[str, str] | None = None,
                new_tokens: int = 1) -> tuple[dict[str, int], list[Rewrite]]:
    """``model`` (the caller's: changed in place) pinned for a step of ``new_tokens`` (K)
    tokens at ``capacity`` (``dims.default_dims``, a growing cache's own axis included) and
    its growing pairs made fixed-capacity: the dims pinned and what was done per pair.
    ConversionError for bad pairs, FixedCapacityError where a pair cannot be rewritten."""
    from .dims import default_dims, pin
    from .onnx_converter import list_kv_pairs

    found = list_kv_pairs(model, pairs)
    dims = {k: d.value for k, d in default_dims(model, capacity, found,
                                                new_tokens=new_tokens).items()}
    pin(model, dims, copy=False)
    return dims, make_fixed_capacity(model, found, dims, new_tokens)


def make_fixed_capacity(model: onnx.ModelProto, pairs,
                        dims: Mapping[str, int] | None = None,
                        new_tokens: int = 1) -> list[Rewrite]:
    """Rewrite ``model`` (pinned with ``dims``, in place) so every ``append`` pair of
    ``pairs`` has the past's shape; one ``Rewrite`` per growing pair, its ``how`` led by the
    pair's own rule. Each pair must gain ``new_tokens`` (K) rows a step with these dims: a
    pair that gains another count is refused, never taken for a K-row one. K > 1 (a
    K-token verify graph): GroupQueryAttention's shared buffer (the converter writes the K
    rows at their positions), or a Concat's K rows scattered at positions P .. P+K-1 with
    each query row masked past its own position; an ai.onnx Attention that appends its past
    is rewritten for one query row only. Raises FixedCapacityError naming the first pair
    that cannot be rewritten (nothing is changed then)."""
    from .dims import rows_per_step

    g = model.graph
    for p in pairs:
        rows = rows_per_step(p, dims or {})
        if p.kind == "append" and rows != new_tokens:
            raise FixedCapacityError(
                f"{p.input!r} -> {p.output!r} gains {rows if rows is not None else 'unknown'} rows "
                f"a step ({p.how or 'past+new'}): the fixed-capacity rewrite of a step of "
                f"{new_tokens} token{'s' * (new_tokens != 1)} writes {new_tokens}")
    _split_attention(model, [p for p in pairs if p.kind == "append"])
    producer = {o: (n, k) for n in g.node for k, o in enumerate(n.output)}
    inputs = {i.name: i for i in g.input}
    outputs = {o.name: o for o in g.output}
    plans: list[tuple[object, str, onnx.NodeProto]] = []
    done: list[Rewrite] = []
    for p in pairs:
        if p.kind != "append":
            continue
        node, k = producer.get(p.output, (None, 0))
        if node is None:
            raise FixedCapacityError(f"{p.output!r} is not computed by a node")
        if node.domain == "com.microsoft" and node.op_type == "GroupQueryAttention" \
                and k in (1, 2) and len(node.input) > k + 2 and node.input[k + 2] == p.input:
            plans.append((p, "gqa", node))
            continue
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            raise FixedCapacityError(
                f"{p.input!r} -> {p.output!r} grows through {node.op_type}, not Concat(past, "
                "new) or GroupQueryAttention: no fixed-capacity rewrite for it")
        rank = len(inputs[p.input].type.tensor_type.shape.dim)
        ins = [n for n in node.input if n]
        axis = next(a.i for a in node.attribute if a.name == "axis") % rank
        if len(ins) != 2 or ins[0] != p.input or axis != p.axis:
            raise FixedCapacityError(
                f"{p.output!r} is Concat({', '.join(ins)}) on axis {axis}, not Concat({p.input}, "
                f"new) on axis {p.axis}: no fixed-capacity rewrite for it")
        plans.append((p, "concat", node))
    concats = [(p, node) for p, kind, node in plans if kind == "concat"]
    lengths = {_dims(outputs[p.output])[p.axis] for p, _ in concats}
    mask = inputs.get(MASK_INPUT)
    by_mask = mask is not None and lengths == {_dims(mask)[-1]}
    # the model's own mask (by_mask) hides the rows past the last new token, but it takes
    # the K queries for the cache's last K positions: K > 1 masks each query row itself too
    softmaxes = ([] if (by_mask and new_tokens == 1) or not concats
                 else _softmaxes_over(model, concats, lengths, by_mask))
    position = None
    for p, kind, node in plans:
        _set_dims(outputs[p.output], _dims(inputs[p.input]))
        if kind == "gqa":
            done.append(Rewrite(p.input, p.output, True, _led(p, (
                "GroupQueryAttention's shared buffer: new row written at seqlens_k"
                if new_tokens == 1 else f"GroupQueryAttention's shared buffer: {new_tokens} "
                "new rows written ending at seqlens_k"))))
            continue
        if position is None:
            position = (_position_from_mask(g, new_tokens) if by_mask
                        else _position_from_ids(g, new_tokens))
        _write_at_position(g, p, node, _dims(inputs[p.input]), position, new_tokens)
        rows = "" if new_tokens == 1 else f" ({new_tokens} rows)"
        done.append(Rewrite(p.input, p.output, True, _led(p, (
            f"Concat on axis {p.axis} -> ScatterND at the position (sum({MASK_INPUT}) - 1)"
            f"{rows}; attention reads the written cache, the model's mask drops the rest")
            if by_mask else
            (f"Concat on axis {p.axis} -> ScatterND at position_ids{rows}; attention reads "
             f"the written cache, rows beyond the position masked before {len(softmaxes)} "
             "softmax(es)"))))
    if softmaxes:
        _mask_softmaxes(g, softmaxes, position, lengths.pop(), new_tokens)
    return done


def _led(pair, how: str) -> str:
    """What was done, after the rule that paired it (``CachePair.how``)."""
    return f"{pair.how}: {how}" if getattr(pair, "how", "") else how


def _split_attention(model: onnx.ModelProto, growing) -> None:
    """Each ai.onnx ``Attention`` that appends a growing pair's past, written as the Concat
    it computes: ``present = Concat(past, new rows as [B, H, S, D])`` and the Attention
    reading present with no past. Exact for one query row, where the bottom-right causal
    mask (offset = past rows) allows every row, so ``is_causal`` is dropped with it."""
    g = model.graph
    pasts = {p.input for p in growing}
    nodes = [n for n in g.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")
             and len(n.input) > 5 and n.input[4] in pasts]
    if not nodes:
        return
    shapes, _ = _inferred(model)
    h = helper.make_node
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        q = shapes.get(node.input[0])
        rows = q[-2] if q and len(q) == 4 else (q[1] if q and len(q) == 3 else None)
        if rows != 1:
            raise FixedCapacityError(
                f"Attention {node.name or node.output[0]!r} appends {node.input[4]!r} for "
                f"{rows or 'unknown'} query rows; the fixed-capacity rewrite takes one")
        at = list(g.node).index(node)
        new: list[onnx.NodeProto] = []
        for k, (x, past, out) in enumerate(((node.input[1], node.input[4], node.output[1]),
                                            (node.input[2], node.input[5], node.output[2]))):
            base = f"fixed_capacity.{node.name or node.output[0]}.{'kv'[k]}"
            rank = len(shapes.get(x) or [])
            if rank == 3:
                g.initializer.append(numpy_helper.from_array(
                    np.array([0, 0, int(attrs["kv_num_heads"]), -1], np.int64), f"{base}.shape"))
                new += [h("Reshape", [x, f"{base}.shape"], [f"{base}.bshd"]),
                        h("Transpose", [f"{base}.bshd"], [f"{base}.heads"], perm=[0, 2, 1, 3])]
                x = f"{base}.heads"
            elif rank != 4:
                raise FixedCapacityError(f"Attention {node.name!r}: the rank of {x!r} is not known")
            grown = out or f"{base}.grown"
            new.append(h("Concat", [past, x], [grown], axis=2))
            node.input[1 + k] = grown
            node.input[4 + k] = ""
            if out:
                node.output[1 + k] = ""
        for a in node.attribute:
            if a.name == "is_causal":
                a.i = 0
        for k, n in enumerate(new):
            g.node.insert(at + k, n)


def _softmaxes_over(model: onnx.ModelProto, concats, lengths: set,
                    by_mask: bool = False) -> list[onnx.NodeProto]:
    """The Softmax nodes whose last axis runs over the grown cache's rows (they read a grown
    present, and their last axis has its length), where a mask of the rows beyond each
    query's position is added: without an ``attention_mask`` (positions from
    ``position_ids``), or with one (``by_mask``) for K query rows. FixedCapacityError where
    that cannot be shown."""
    first = concats[0][0]
    g = model.graph
    if not by_mask and "position_ids" not in {i.name for i in g.input}:
        raise FixedCapacityError(
            f"{first.input!r} -> {first.output!r} grows by Concat and the graph has neither an "
            f"{MASK_INPUT!r} input nor position_ids to mask the rows beyond the position: a "
            "fixed-capacity cache would attend its empty rows")
    if len(lengths) != 1:
        raise FixedCapacityError(f"the grown caches have different lengths {sorted(lengths)}")
    length = next(iter(lengths))
    producer = {o: n for n in g.node for o in n.output}
    grown = {p.output for p, _ in concats}
    shapes, types = _inferred(model)

    def reads_grown(name: str) -> bool:
        todo, seen = [name], set()
        while todo:
            x = todo.pop()
            if x in grown:
                return True
            if x in seen or x not in producer:
                continue
            seen.add(x)
            todo.extend(i for i in producer[x].input if i)
        return False

    found = []
    for n in g.node:
        if n.op_type != "Softmax" or not reads_grown(n.input[0]):
            continue
        shape = shapes.get(n.input[0])
        axis = next((a.i for a in n.attribute if a.name == "axis"), -1)
        if not shape or shape[-1] != length or axis not in (-1, len(shape) - 1):
            raise FixedCapacityError(
                f"softmax {n.name or n.output[0]!r} reads a grown cache but its last axis is not "
                f"shown to run over the {length} cache rows ({shape}): rows beyond the position "
                "cannot be masked")
        if types.get(n.input[0], TensorProto.FLOAT) != TensorProto.FLOAT:
            raise FixedCapacityError(
                f"softmax {n.name or n.output[0]!r} over the grown cache is not float32: its "
                "rows beyond the position are masked in float32 only")
        found.append(n)
    if not found:
        raise FixedCapacityError(
            f"{first.input!r} -> {first.output!r} grows by Concat and no softmax over its rows "
            f"was found to mask, nor an {MASK_INPUT!r} input")
    return found


def _inferred(model: onnx.ModelProto) -> tuple[dict[str, list[int | None]], dict[str, int]]:
    """Every value's static shape and element type by ONNX shape inference on the pinned
    graph, weights left out."""
    from .dims import without_weights

    try:
        inferred = onnx.shape_inference.infer_shapes(without_weights(model))
    except Exception:  # noqa: BLE001 - a graph shape inference cannot take: nothing learned
        return {}, {}
    values = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None
                       for d in v.type.tensor_type.shape.dim] for v in values}
    return shapes, {v.name: v.type.tensor_type.elem_type for v in values}


def _mask_softmaxes(g: onnx.GraphProto, softmaxes, position: str, length: int,
                    k: int = 1) -> None:
    """Before each softmax: + (0 where row <= position, float32 min beyond); with K query
    rows (``position`` [K]) each row's own: a [K, length] mask over the softmax's last two
    axes (causal inside the K)."""
    n = helper.make_node
    name = "fixed_capacity.rows_mask"
    g.initializer.extend([
        numpy_helper.from_array(np.arange(length, dtype=np.int64), f"{name}.rows"),
        numpy_helper.from_array(np.array(0.0, np.float32), f"{name}.zero"),
        numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), f"{name}.low")])
    at_rows = position
    nodes = []
    if k > 1:
        g.initializer.append(numpy_helper.from_array(np.array([k, 1], np.int64),
                                                     f"{name}.column"))
        at_rows = f"{name}.positions"
        nodes.append(n("Reshape", [position, f"{name}.column"], [at_rows]))
    nodes += [n("LessOrEqual", [f"{name}.rows", at_rows], [f"{name}.valid"]),
             n("Where", [f"{name}.valid", f"{name}.zero", f"{name}.low"], [name])]
    for k, sm in enumerate(softmaxes):
        masked = f"{name}.{k}"
        nodes_at = list(g.node).index(sm)
        g.node.insert(nodes_at, n("Add", [sm.input[0], name], [masked]))
        sm.input[0] = masked
    at = max(i for i, x in enumerate(g.node) if position in x.output) + 1
    for k, node in enumerate(nodes):
        g.node.insert(at + k, node)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in vi.type.tensor_type.shape.dim]


def _set_dims(vi: onnx.ValueInfoProto, dims: list[int | str]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        new = shape.dim.add()
        if isinstance(d, int):
            new.dim_value = d
        else:
            new.dim_param = d


def _position_from_ids(g: onnx.GraphProto, k: int = 1) -> str:
    """Nodes computing the K new tokens' positions, int64 [K], from position_ids (its first
    K elements: Qwen's [3, B, S] text positions are alike in every row)."""
    n = helper.make_node
    name = "fixed_capacity.position"
    g.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), f"{name}.flat"),
                          numpy_helper.from_array(np.array([0], np.int64), f"{name}.start"),
                          numpy_helper.from_array(np.array([k], np.int64), f"{name}.end")])
    g.node.insert(0, n("Reshape", ["position_ids", f"{name}.flat"], [f"{name}.all"]))
    g.node.insert(1, n("Slice", [f"{name}.all", f"{name}.start", f"{name}.end"], [f"{name}.ids"]))
    g.node.insert(2, n("Cast", [f"{name}.ids"], [name], to=TensorProto.INT64))
    return name


def _position_from_mask(g: onnx.GraphProto, k: int = 1) -> str:
    """Nodes computing the K new tokens' positions, int64 [K], from the mask: its ones less
    K .. less one."""
    n = helper.make_node
    name = "fixed_capacity.position"
    g.initializer.append(numpy_helper.from_array(
        np.arange(k, 0, -1, dtype=np.float32), f"{name}.one"))
    g.node.insert(0, n("Cast", [MASK_INPUT], [f"{name}.f"], to=TensorProto.FLOAT))
    g.node.insert(1, n("ReduceSum", [f"{name}.f"], [f"{name}.sum"], keepdims=0))
    g.node.insert(2, n("Reshape", [f"{name}.sum", f"{name}.shape1"], [f"{name}.sum1"]))
    g.node.insert(3, n("Sub", [f"{name}.sum1", f"{name}.one"], [f"{name}.fpos"]))
    g.node.insert(4, n("Cast", [f"{name}.fpos"], [name], to=TensorProto.INT64))
    g.initializer.append(numpy_helper.from_array(np.array([1], np.int64), f"{name}.shape1"))
    return name


def _write_at_position(g: onnx.GraphProto, p, concat: onnx.NodeProto, past: list,
                       position: str, k: int = 1) -> None:
    """present = ScatterND(past, indices, new), the K new rows at ``position`` [K]; the
    Concat reads present, its own output renamed for the readers inside the graph."""
    if not all(isinstance(d, int) for d in past):
        raise FixedCapacityError(f"{p.input!r} has unpinned dims {past}")
    lead = past[:p.axis]
    base = f"fixed_capacity.{p.output}"
    n = helper.make_node
    new = concat.input[1]
    nodes = []
    if lead:  # one index tuple (leading coordinates..., position) per leading cell and row
        grid = np.stack(np.meshgrid(*[np.arange(d) for d in lead], indexing="ij"), -1)
        grid = np.repeat(grid.reshape([*lead, 1, len(lead)]), k, axis=-2).astype(np.int64)
        g.initializer.extend([
            numpy_helper.from_array(grid, f"{base}.grid"),
            numpy_helper.from_array(np.array([*lead, k, 1], np.int64), f"{base}.pshape")])
        at = position
        if k > 1:  # [K] -> [K, 1], then expanded over the leading cells
            g.initializer.append(numpy_helper.from_array(np.array([k, 1], np.int64),
                                                         f"{base}.column"))
            nodes.append(n("Reshape", [position, f"{base}.column"], [f"{base}.rows"]))
            at = f"{base}.rows"
        nodes += [n("Expand", [at, f"{base}.pshape"], [f"{base}.pos"]),
                  n("Concat", [f"{base}.grid", f"{base}.pos"], [f"{base}.idx"], axis=-1)]
    else:
        g.initializer.append(numpy_helper.from_array(np.array([k, 1], np.int64), f"{base}.pshape"))
        nodes.append(n("Reshape", [position, f"{base}.pshape"], [f"{base}.idx"]))
    nodes.append(n("ScatterND", [p.input, f"{base}.idx", new], [p.output]))
    attend = f"{base}.attend"
    for other in g.node:
        for i, x in enumerate(other.input):
            if x == p.output:
                other.input[i] = attend
    concat.input[0] = p.output
    concat.output[0] = attend
    at = list(g.node).index(concat)
    for k, node in enumerate(nodes):
        g.node.insert(at + k, node)
