"""The bytes a step of a model statebench did not write must move (DESIGN §7), from the model
file itself, so a `--model` point has a floor and cache cells as a preset's do.

- **State** (`state_bytes`): each cache pair (``list_kv_pairs``) at its past's declared shape,
  its symbols pinned as the backends pin them (``dims.default_dims``; a GroupQueryAttention
  past's head size from its projection, ``dims.past_head_sizes``), in its declared type: an
  append pair's bytes per row on its growing axis, an overwrite pair's whole bytes; the
  logits' bytes from the output that is no pair's present. The result is a
  ``metrics.StateBytes``, the figure a preset's cache specs give.
- **Weights** (`weights_bytes`): every initializer and Constant tensor as stored (its dims by
  its element size: a 4-bit ``MatMulNBits`` or ``GatherBlockQuantized`` weight is the uint8
  blocks, scales and zero points the file holds; external data is sized from the graph, not
  read). A table a step only gathers rows of (an embedding under ``Gather``, a
  ``GatherBlockQuantized`` table, a rotary cos/sin cache) counts one row, as a preset's
  untied embedding does; one any other node reads (a tied head) counts whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from backends.webnn.dims import default_dims, past_head_sizes, rows_per_step
from harness.metrics import StateBytes

#: (op, input index) whose input is a table the step reads one row of per new token
ROW_READS = {("Gather", 0), ("GatherBlockQuantized", 0), ("GatherBlockQuantized", 2),
             ("GatherBlockQuantized", 3), ("GroupQueryAttention", 7), ("GroupQueryAttention", 8),
             ("RotaryEmbedding", 2), ("RotaryEmbedding", 3), ("MRotaryEmbedding", 2),
             ("MRotaryEmbedding", 3)}
#: element types stored two to a byte
_NIBBLES = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
#: the capacity the pairs' shapes are pinned at to read their per-row bytes (any > 1 will do:
#: the growing axis is divided out)
PIN_CAPACITY = 64


class StateUnknown(ValueError):
    """A pair or the logits whose shape or type the graph does not pin: no state figure."""


def tensor_bytes(t: onnx.TensorProto) -> int:
    """Bytes of tensor ``t`` as stored: its elements by their size (4-bit types two a
    byte), from its dims and type alone, so external data is not read."""
    n = int(np.prod(list(t.dims), dtype=np.int64))
    if t.data_type in _NIBBLES:
        return -(-n // 2)
    if t.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def _gather_axis(node: onnx.NodeProto) -> int:
    key = "gather_axis" if node.op_type == "GatherBlockQuantized" else "axis"
    return next((int(a.i) for a in node.attribute if a.name == key), 0)


@dataclass(frozen=True)
class WeightsBytes:
    """A model's weights as a step reads them: ``total`` (``stored`` with gathered tables at
    one row), ``stored`` (every tensor whole) and the tables counted at one row."""

    total: int
    stored: int
    gathered: tuple[str, ...]


def weights_bytes(model: onnx.ModelProto) -> WeightsBytes:
    """The weights' bytes a step reads (module docstring): initializers and Constant tensors
    as stored, a table only gathered from at one row."""
    g = model.graph
    tensors = {t.name: t for t in g.initializer}
    tensors.update({n.output[0]: a.t for n in g.node if n.op_type == "Constant"
                    for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR})
    readers: dict[str, list[tuple[str, int, int]]] = {}
    for n in g.node:
        for j, name in enumerate(n.input):
            if name in tensors:
                axis = _gather_axis(n) if n.op_type in ("Gather", "GatherBlockQuantized") else 0
                readers.setdefault(name, []).append((n.op_type, j, axis))
    outputs = {o.name for o in g.output}
    total = stored = 0
    gathered = []
    for name, t in tensors.items():
        size = tensor_bytes(t)
        stored += size
        reads = readers.get(name, [])
        rows = int(t.dims[0]) if t.dims else 0
        if (reads and rows > 1 and name not in outputs
                and all((op, j) in ROW_READS and axis == 0 for op, j, axis in reads)):
            gathered.append(name)
            size = -(-size // rows)
        total += size
    return WeightsBytes(total, stored, tuple(gathered))


def _declared(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param.strip()
            for d in vi.type.tensor_type.shape.dim]


def _number(d: int | str, dims: dict[str, int]) -> int | None:
    if isinstance(d, int):
        return d
    if d.isdigit():
        return int(d)
    return dims.get(d)


def _itemsize(elem: int) -> int:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).itemsize


def state_bytes(model: onnx.ModelProto, pairs: Sequence) -> StateBytes:
    """The state a step carries, per pair, and its logits' bytes (module docstring);
    `StateUnknown` naming the tensor and the dim no rule pins."""
    dims = {k: d.value for k, d in default_dims(model, PIN_CAPACITY, pairs).items()}
    heads = past_head_sizes(model)
    inputs = {i.name: i for i in model.graph.input}
    rows, whole, new_rows = [], [], set()
    for p in pairs:
        shape = _declared(inputs[p.input])
        n = _itemsize(inputs[p.input].type.tensor_type.elem_type)
        for i, d in enumerate(shape):
            if p.kind == "append" and i == p.axis:
                continue
            v = heads[p.input] if i == len(shape) - 1 and p.input in heads else _number(d, dims)
            if v is None:
                raise StateUnknown(f"{p.input} has a dim {d or '(unnamed)'!r} no rule pins")
            n *= v
        if p.kind == "append":
            rows.append(n)
            k = rows_per_step(p, dims)
            if k is None:
                raise StateUnknown(f"{p.input}: its new rows per step ({p.new!r}) are not pinned")
            new_rows.add(k)
        else:
            whole.append(n)
    if len(new_rows) > 1:
        raise StateUnknown(f"the pairs gain different rows a step ({sorted(new_rows)})")
    at = feeds_bytes(model, pairs, dims)
    per_row = feeds_bytes(model, pairs, {k: d.value for k, d in default_dims(
        model, PIN_CAPACITY + 1, pairs).items()}) - at
    return StateBytes(tuple(rows), tuple(whole), logits_bytes(model, pairs, dims),
                      new_rows.pop() if new_rows else 1, at - per_row * PIN_CAPACITY, per_row)


def feeds_bytes(model: onnx.ModelProto, pairs: Sequence, dims: dict[str, int]) -> int:
    """Bytes of the inputs that are neither a pair's past nor an initializer (ids, positions,
    the mask) at ``dims``, as a page feeds them; one with a dim not pinned counts 0."""
    skip = {p.input for p in pairs} | {t.name for t in model.graph.initializer}
    total = 0
    for vi in model.graph.input:
        if vi.name in skip:
            continue
        n = _itemsize(vi.type.tensor_type.elem_type)
        for d in _declared(vi):
            v = _number(d, dims)
            n = 0 if v is None else n * v
        total += n
    return total


def logits_output(model: onnx.ModelProto, pairs: Sequence) -> onnx.ValueInfoProto:
    """The output named ``logits``, else the one output that is no pair's present."""
    presents = {p.output for p in pairs}
    outs = [o for o in model.graph.output if o.name not in presents]
    out = next((o for o in outs if o.name == "logits"), outs[0] if len(outs) == 1 else None)
    if out is None:
        raise StateUnknown(f"no logits output among {', '.join(o.name for o in outs) or 'none'}")
    return out


def logits_dtype(model: onnx.ModelProto, pairs: Sequence) -> str:
    """The logits' data type (the results' workload dtype: a q4f16 export's is float16)."""
    try:
        elem = logits_output(model, pairs).type.tensor_type.elem_type
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name
    except (StateUnknown, KeyError, TypeError, ValueError):
        return "float32"


def logits_bytes(model: onnx.ModelProto, pairs: Sequence, dims: dict[str, int]) -> int:
    """Bytes of one step's logits (``logits_output``) at its pinned shape."""
    out = logits_output(model, pairs)
    n = _itemsize(out.type.tensor_type.elem_type)
    for d in _declared(out):
        v = _number(d, dims)
        if v is None:
            raise StateUnknown(f"the logits {out.name} have a dim {d or '(unnamed)'!r} no rule pins")
        n *= v
    return n
