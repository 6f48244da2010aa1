"""The ONNX converter's core: the walk over an ONNX graph (``Converter``), the handler
registry (``@handles``) and what the handler modules share (data types, initializers,
``ConversionError``).

Imports go one way: the handler modules (``onnx_converter``'s own handlers, ``convert_ops``,
``convert_linear``, ``convert_attention``, ``convert_quant``) import this module, and
``onnx_converter`` imports them. To convert a new ONNX op: in the handler module of its
family, write ``@handles("OpType")`` above a function ``(c: Converter, node, attrs)`` that
returns the MLOperand (or a NumPy array known at conversion time, or a list of them, one an
output), and see that ``onnx_converter`` imports that module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ._classes import MLGraphBuilder
from .dtypes import dtype, packed_bytes

# ONNX TensorProto element type -> WebNN data type (and the NumPy type of host data)
ONNX_TO_WEBNN: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "uint8",
}
_NUMPY_TO_WEBNN: dict[str, str] = {
    "float32": "float32", "float16": "float16", "int32": "int32", "int64": "int64",
    "uint32": "uint32", "uint8": "uint8", "int8": "int8", "uint64": "uint64", "bool": "uint8",
}
HOST_DTYPES: dict[str, type] = {
    "float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64,
    "uint32": np.uint32, "uint8": np.uint8, "int8": np.int8, "uint64": np.uint64,
}


class ConversionError(ValueError):
    """The ONNX file cannot become a WebNN graph (unsupported op, dynamic shape, bad pair).
    The converter's own type, so the WebNN library depends on nothing above it; a page
    turns it into the harness's one-line user error."""


@dataclass(frozen=True)
class OperandDesc:
    """An MLOperandDescriptor: what a bound MLTensor must match exactly."""

    data_type: str
    shape: tuple[int, ...]

    @property
    def host_dtype(self) -> type:
        return HOST_DTYPES[self.data_type]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.host_dtype).itemsize


#: ONNX's 4-bit element types -> WebNN's (packed two a byte in both, low nibble first)
_PACKED4 = {onnx.TensorProto.INT4: "int4", onnx.TensorProto.UINT4: "uint4"}


@dataclass(frozen=True)
class Packed4:
    """A 4-bit initializer as its packed bytes: what ``constant(int4|uint4)`` takes."""

    data_type: str
    shape: tuple[int, ...]
    data: np.ndarray  # uint8, ceil(size / 2) bytes


def _packed4(t: onnx.TensorProto, base: str | None) -> Packed4:
    """A 4-bit initializer's bytes, unpacked nowhere (external data memory-mapped)."""
    kind = _PACKED4[t.data_type]
    shape = tuple(int(d) for d in t.dims)
    nbytes = packed_bytes(dtype(kind), int(np.prod(shape, dtype=np.int64)))
    if t.data_location == onnx.TensorProto.EXTERNAL and base is not None:
        data = _external(t, base, np.dtype(np.uint8), (nbytes,))
    elif t.raw_data:
        data = np.frombuffer(t.raw_data, np.uint8)
    else:  # int32_data holds the packed bytes, one a value
        data = np.asarray(t.int32_data, np.int64).astype(np.uint8)
    if data.size != nbytes:
        raise ValueError(f"{data.size} bytes for {nbytes} packed ones")
    return Packed4(kind, shape, data)


def _external(t: onnx.TensorProto, base: str, dt: np.dtype,
              shape: tuple[int, ...]) -> np.ndarray:
    """An initializer's external data memory-mapped read-only as ``dt`` in ``shape``:
    ValueError where its file lies outside the model's folder or its recorded length is
    not the bytes ``shape`` needs."""
    info = {e.key: e.value for e in t.external_data}
    path = os.path.normpath(os.path.join(base, info["location"]))
    if not path.startswith(os.path.normpath(base) + os.sep):
        raise ValueError(f"external data {info['location']!r} lies outside the model's folder")
    count = int(np.prod(shape, dtype=np.int64))
    if "length" in info and int(info["length"]) != count * dt.itemsize:
        raise ValueError(f"external data length {info['length']} != {count} x {dt.itemsize}")
    if count == 0:
        return np.zeros(shape, dt)
    return np.memmap(path, dtype=dt, mode="r", offset=int(info.get("offset", 0)), shape=shape)


def _initializer(t: onnx.TensorProto, base: str | None) -> np.ndarray | Packed4:
    """An initializer's value. External data is memory-mapped read-only, not loaded: a
    5 GB model's weights then pass through the builder and the compiler without host
    copies until the compiler repacks them (MLGraphBuilder.constant keeps read-only
    arrays by reference: nobody can change them after the call)."""
    if t.data_type in _PACKED4:
        return _packed4(t, base)
    if t.data_location != onnx.TensorProto.EXTERNAL or base is None:
        return numpy_helper.to_array(t)
    dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
    return _external(t, base, dt, tuple(int(d) for d in t.dims))


def _value_desc(vi: onnx.ValueInfoProto) -> OperandDesc:
    tt = vi.type.tensor_type
    if tt.elem_type not in ONNX_TO_WEBNN:
        raise ConversionError(
            f"{vi.name!r}: element type {onnx.TensorProto.DataType.Name(tt.elem_type)} "
            "has no WebNN data type")
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value <= 0:
            what = d.dim_param or "unknown"
            raise ConversionError(
                f"{vi.name!r} has a dynamic or empty dimension ({what}); WebNN needs static "
                "shapes: export with fixed batch, sequence length and cache capacity")
        dims.append(int(d.dim_value))
    return OperandDesc(ONNX_TO_WEBNN[tt.elem_type], tuple(dims))


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class Converter:
    """Walks the (topologically sorted) ONNX graph once, emitting builder calls."""

    def __init__(self, model: onnx.ModelProto, context, base: str | None = None) -> None:
        self.model = model
        self.base = base  # directory of the .onnx file: where external data lives
        self.builder = MLGraphBuilder(context)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
        self.consts: dict[str, np.ndarray] = {}  # values known at conversion time
        self.operands: dict[str, object] = {}  # MLOperands
        self.input_descs: dict[str, OperandDesc] = {}
        self.output_descs: dict[str, OperandDesc] = {}

    # values ---------------------------------------------------------------------------------

    def run(self) -> dict[str, object]:
        g = self.model.graph
        for t in g.initializer:
            try:
                self.consts[t.name] = _initializer(t, self.base)
            except (OSError, ValueError, onnx.checker.ValidationError) as exc:  # external data not loaded
                raise ConversionError(
                    f"initializer {t.name!r} cannot be read ({exc}); pass the .onnx path so its "
                    "external data is found beside it") from None
        for vi in g.input:
            if vi.name in self.consts:  # IR < 4 lists initializers among inputs
                continue
            desc = _value_desc(vi)
            self.input_descs[vi.name] = desc
            self.operands[vi.name] = self.builder.input(vi.name, data_type=desc.data_type,
                                                         shape=list(desc.shape))
        for node in g.node:
            self._node(node)
        outs: dict[str, object] = {}
        for vo in g.output:
            self.output_descs[vo.name] = _value_desc(vo)
            if vo.name in self.input_descs or vo.name in self.consts:
                raise ConversionError(f"output {vo.name!r} is a graph input or a constant; "
                                      "WebNN outputs must be computed")
            op = self.operand(vo.name)
            if op._kind != "op":  # the same value as an input (a Concat with an empty one)
                op = self.builder.identity(op)
            got = OperandDesc(self.dtype(op), self.shape(op))
            if got != self.output_descs[vo.name]:
                raise ConversionError(f"output {vo.name!r} is declared {self.output_descs[vo.name]} "
                                      f"but computes {got}")
            outs[vo.name] = op
        return outs

    def operand(self, name: str):
        op = self.operands.get(name)
        if op is not None:
            return op
        if name in self.consts:
            op = self.constant(self.consts[name])
            self.operands[name] = op
            return op
        raise ConversionError(f"value {name!r} is used before it is produced (graph not sorted?)")

    def constant(self, arr: np.ndarray | Packed4):
        if isinstance(arr, Packed4):
            return self.builder.constant(data_type=arr.data_type, shape=list(arr.shape),
                                         value=arr.data)
        arr = np.asarray(arr)
        kind = _NUMPY_TO_WEBNN.get(arr.dtype.name)
        if kind is None:
            raise ConversionError(f"constant of NumPy type {arr.dtype} has no WebNN data type")
        if arr.dtype == np.bool_:
            arr = arr.astype(np.uint8)
        return self.builder.constant(data_type=kind, shape=list(arr.shape),
                                     value=np.ascontiguousarray(arr))

    def scalar_like(self, value: float, ref):
        return self.constant(np.array(value, dtype=HOST_DTYPES[self.dtype(ref)]))

    def const_input(self, node: onnx.NodeProto, i: int, what: str) -> np.ndarray:
        name = node.input[i]
        if name not in self.consts:
            raise ConversionError(
                f"{node.op_type} node {node.name or node.output[0]!r}: {what} (input {i}, {name!r}) "
                "must be an initializer or computable at conversion time; WebNN takes it as an "
                "argument, not a tensor")
        return self.consts[name]

    @staticmethod
    def shape(op) -> tuple[int, ...]:
        return tuple(int(d) for d in op.shape)

    @staticmethod
    def dtype(op) -> str:
        return str(op.data_type)

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        return self.shape(self.operand(name))

    # nodes ----------------------------------------------------------------------------------

    def _node(self, node: onnx.NodeProto) -> None:
        if node.domain not in ("", "ai.onnx") and not (
                node.domain == "com.microsoft" and node.op_type in HANDLERS):
            raise ConversionError(
                f"unsupported op {node.domain}::{node.op_type} (node {node.name or node.output[0]!r}); "
                "the WebNN converter takes standard ONNX ops only: export the standard flavour")
        present = [n for n in node.input if n]
        if node.op_type in FOLDABLE and all(n in self.consts for n in present):
            self._fold(node)
            return
        if node.op_type not in TAKES_EMPTY and any(self.is_empty(n) for n in present):
            self._fold_empty(node)
            return
        handler = HANDLERS.get(node.op_type)
        if handler is None and node.op_type in FOLDABLE:
            raise ConversionError(
                f"{node.op_type} node {node.name or node.output[0]!r} is supported only on values "
                "known at conversion time (initializers, shapes); here an input is a runtime value")
        if handler is None:
            raise ConversionError(
                f"unsupported op {node.op_type!r} (node {node.name or node.output[0]!r}); "
                f"supported: {', '.join(sorted(supported_ops()))}")
        result = handler(self, node, _attrs(node))
        if not isinstance(result, (list, tuple)):
            result = [result]
        for name, value in zip(node.output, result, strict=False):
            if isinstance(value, np.ndarray):
                self.consts[name] = value
            else:
                self.operands[name] = value

    def is_empty(self, name: str) -> bool:
        """Whether ``name`` is a 0-sized tensor. WebNN has none (webmachinelearning/webnn
        #391: a dimension must be positive), so every empty value is kept on the host as
        an array: its value is its shape and type alone, known at conversion time."""
        value = self.consts.get(name)
        return isinstance(value, np.ndarray) and value.size == 0

    def empty_like(self, op, shape: Sequence[int]) -> np.ndarray:
        """The empty value of ``shape`` (a 0 in it) in ``op``'s data type, kept on the host."""
        return np.zeros(tuple(int(d) for d in shape), HOST_DTYPES[self.dtype(op)])

    def _fold_empty(self, node: onnx.NodeProto) -> None:
        """A node reading an empty value that is not one of ``TAKES_EMPTY``: its outputs are
        computed on the host with zeros standing in for its runtime inputs, and taken only
        where every one is empty too (then its value is its shape and type, whatever the
        runtime inputs hold: exact). An output with elements would depend on what the zeros
        stand in for, so that is refused."""
        stand_in = {}
        for n in (n for n in node.input if n and n not in self.consts):
            op = self.operand(n)
            stand_in[n] = np.zeros(self.shape(op), HOST_DTYPES[self.dtype(op)])
        saved = dict(self.consts)
        self.consts.update(stand_in)
        try:
            self._fold(node)
        except Exception as exc:  # onnx.reference lacks the op (a contrib op), or it fails
            self.consts = saved
            raise ConversionError(
                f"{node.op_type} node {node.name or node.output[0]!r} reads an empty tensor "
                f"and cannot be evaluated on the host ({exc}); WebNN has no 0-sized "
                "tensors") from None
        outs = {o: self.consts[o] for o in node.output if o}
        self.consts = saved
        full = [o for o, v in outs.items() if v.size]
        if full:
            raise ConversionError(
                f"{node.op_type} node {node.name or node.output[0]!r} reads an empty tensor but "
                f"its output {full[0]!r} has {outs[full[0]].size} elements; WebNN has no "
                "0-sized tensors, and only an empty result can be folded exactly")
        self.consts.update(outs)

    def _fold(self, node: onnx.NodeProto) -> None:
        """Evaluate a node whose inputs are all known, on the host (onnx.reference)."""
        from onnx.reference import ReferenceEvaluator

        ins = [n for n in node.input if n]
        feeds = {n: self.consts[n] for n in ins}
        graph = onnx.helper.make_graph(
            [node], "fold",
            [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in feeds.items()],
            [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
             for o in node.output if o])
        m = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", self.opset)])
        results = ReferenceEvaluator(m).run(None, feeds)
        for name, value in zip([o for o in node.output if o], results, strict=True):
            self.consts[name] = np.asarray(value)


# --------------------------------------------------------------------------------------------
# handlers: (converter, node, attributes) -> MLOperand | np.ndarray | list of them

Handler = Callable[[Converter, onnx.NodeProto, dict], object]
HANDLERS: dict[str, Handler] = {}
#: ops folded on the host when all their inputs are known at conversion time
FOLDABLE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sqrt", "Exp", "Log", "Neg", "Abs",
    "Reshape", "Transpose", "Concat", "Slice", "Expand", "Gather", "Cast", "Unsqueeze", "Squeeze",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Where", "Range",
    "ConstantOfShape", "ReduceSum", "ReduceMean", "ReduceMax", "Identity", "Flatten", "Sigmoid",
    "Tanh", "Reciprocal", "Softmax", "Not", "And", "Or", "Floor", "Ceil", "Mod",
}


#: ops whose handlers take an empty input themselves (the value its shape alone: Shape,
#: Size; the identity of its other inputs: Concat, the scatters with no updates); every
#: other op reading one is folded on the host (``Converter._fold_empty``)
TAKES_EMPTY = {"Shape", "Size", "Concat", "ScatterND", "ScatterElements"}


def handles(*names: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of the ONNX ops ``names``."""

    def deco(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = fn
        return fn
    return deco


def supported_ops() -> frozenset[str]:
    """The ONNX ops a graph may hold: those with a handler, and two folded on the host only."""
    return frozenset(HANDLERS) | frozenset({"Range", "ConstantOfShape"})
