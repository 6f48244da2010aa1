"""ONNX -> MLGraphBuilder: run an exported decoder through the WebNN API, as ORT's WebNN EP does.

The standard-flavour export (`model.export`) and any other static-shape ONNX graph made of
the ops in `SUPPORTED_OPS` become one `MLGraph`. Initializers (external data included) become
`constant()` operands; attributes and shape operands (Reshape's shape, Slice's starts/ends,
reduction axes, ...) are read at conversion time, since WebNN takes them as plain arguments.
Nodes whose inputs are all known at conversion time (Shape, Constant, Range, arithmetic on
initializers) are folded on the host with `onnx.reference`, so a graph that computes its shapes
still converts. ONNX `bool` is WebNN `uint8` (what comparisons produce and `where` takes).

`list_kv_pairs` names the KV pairs of a decoder from its input/output names only (DESIGN §2 rule
6), so the stateful build needs no new operator and no hint from the exporter.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ._classes import MLGraphBuilder, MLKVCachePair
from .dims import NEW_TOKENS, pin
from .dtypes import dtype, packed_bytes

# ONNX TensorProto element type -> WebNN data type (and the NumPy type of host data)
_ONNX_TO_WEBNN: dict[int, str] = {
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

#: names of exported caches (DESIGN §2 rule 6), past -> present, one rule per exporter's
#: scheme: (rule name, input pattern, output template)
NAMING_RULES: list[tuple[str, re.Pattern[str], str]] = [
    # statebench, optimum and genai's attention layers
    ("past_key_values", re.compile(r"^past_key_values\.(\d+)\.(key|value)$"), r"present.\1.\2"),
    # statebench's recurrent states
    ("past_state", re.compile(r"^past_(.*state.*)$"), r"present_\1"),
    # transformers' OnnxExporter: attention keys/values, Qwen3.5's conv and recurrent states
    ("input.cache.layers", re.compile(
        r"^input\.cache\.layers\.(\d+)\.(keys|values|conv_states\.\d+|recurrent_states\.\d+)$"),
     r"output.cache.layers.\1.\2"),
    # onnxruntime-genai's hybrid (gated-delta) layers
    ("past.N", re.compile(r"^past\.(\d+)\.(conv|recurrent)$"), r"present.\1.\2"),
]
#: an input that looks like a cache (it must pair with something, or the conversion fails)
_CACHE_LIKE = re.compile(r"^(past|input\.cache\.)", re.IGNORECASE)

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


@dataclass
class ConvertedGraph:
    """The built graph plus the interface a page binds (paired names removed when stateful)."""

    graph: object
    inputs: dict[str, OperandDesc]  # every ONNX graph input, in order
    outputs: dict[str, OperandDesc]  # every ONNX graph output, in order
    kv_cache_pairs: list[MLKVCachePair] = field(default_factory=list)

    @property
    def is_stateful(self) -> bool:
        return bool(getattr(self.graph, "is_stateful", False))

    @property
    def paired_inputs(self) -> set[str]:
        return {p.input for p in self.kv_cache_pairs}

    @property
    def paired_outputs(self) -> set[str]:
        return {p.output for p in self.kv_cache_pairs}

    @property
    def bound_inputs(self) -> dict[str, OperandDesc]:
        """What the page binds as inputs: all of them, less the pairs a stateful graph hides."""
        hidden = self.paired_inputs if self.is_stateful else set()
        return {n: d for n, d in self.inputs.items() if n not in hidden}

    @property
    def bound_outputs(self) -> dict[str, OperandDesc]:
        hidden = self.paired_outputs if self.is_stateful else set()
        return {n: d for n, d in self.outputs.items() if n not in hidden}


# --------------------------------------------------------------------------------------------
# pairs from names


@dataclass(frozen=True)
class CachePair(MLKVCachePair):
    """A pair found by ``list_kv_pairs``, with how the present relates to the past:
    ``kind`` "overwrite" (same shape: the present replaces the past) or "append" (the
    present is one row longer along ``axis``: a growing cache); ``rule``: the naming rule
    that matched (``NAMING_RULES``), or "hand" for a pair named by the caller."""

    kind: str = "overwrite"
    axis: int | None = None
    rule: str = ""


def list_kv_pairs(model: onnx.ModelProto | str | os.PathLike,
                  pairs: Mapping[str, str] | None = None) -> list[CachePair]:
    """The (past -> present) pairs of a decoder, from graph names only, validated to exist,
    in graph input order.

    ``pairs``: input -> output named by hand (taken as given, shapes still checked); every
    other input is matched by ``NAMING_RULES``. A cache-like input (named ``past...`` or
    ``input.cache...``, rank 2 or more) that no rule pairs is an error naming it, never
    skipped. The output must have the input's type and either its shape ("overwrite") or
    its shape one row longer on one axis ("append").
    """
    graph = _load(model, weights=False).graph
    inits = {t.name for t in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in inits}
    outputs = {o.name: o for o in graph.output}
    hand = dict(pairs or {})
    for name, out in hand.items():
        if name not in inputs:
            raise ConversionError(f"--pairs: {name!r} is not an input of the graph")
        if out not in outputs:
            raise ConversionError(f"--pairs: {out!r} is not an output of the graph")
    found: list[CachePair] = []
    taken: dict[str, str] = {}
    for name, vi in inputs.items():
        if name in hand:
            out, rule = hand[name], "hand"
        else:
            match = next(((r, m.expand(t)) for r, pat, t in NAMING_RULES
                          if (m := pat.match(name))), None)
            if match is None:
                if _CACHE_LIKE.match(name) and _rank(vi) != 1 and _rank(vi) != 0:
                    raise ConversionError(
                        f"cache-like input {name!r} matches no naming rule; name its output "
                        f"by hand (--pairs {name}=OUTPUT)")
                continue
            rule, out = match
        if out not in outputs:
            raise ConversionError(f"cache input {name!r} has no output {out!r} to pair with")
        if out in taken:
            raise ConversionError(f"output {out!r} is paired with both {taken[out]!r} and {name!r}")
        taken[out] = name
        kind, axis = _pair_kind(name, vi, out, outputs[out])
        found.append(CachePair(input=name, output=out, kind=kind, axis=axis, rule=rule))
    return found


def _rank(vi: onnx.ValueInfoProto) -> int | None:
    tt = vi.type.tensor_type
    return len(tt.shape.dim) if tt.HasField("shape") else None


def _dim(d) -> int | str | None:
    """A dimension as an int (transformers' exporter writes fixed ones as numeric strings,
    ``"16"``), a symbol (``dim_param``) or None (unknown)."""
    if d.HasField("dim_value"):
        return int(d.dim_value)
    if d.dim_param.strip().isdigit():
        return int(d.dim_param)
    return d.dim_param or None


def _grows_by_one(past: int | str | None, present: int | str | None) -> bool:
    """Whether ``present`` is ``past`` plus one row: numbers, ``X + 1``, ``X + N`` for the
    new tokens' symbol N (optimum's ``past_sequence_length + sequence_length``), a
    ``total...`` symbol, or an unnamed dynamic dimension on either side."""
    if isinstance(past, int) and isinstance(present, int):
        return present == past + 1
    if isinstance(past, int) or isinstance(present, int):
        return False
    if past is None or present is None:
        return True
    head, plus, tail = present.replace(" ", "").partition("+")
    return (bool(plus) and head == past.replace(" ", "")
            and (tail == "1" or bool(NEW_TOKENS.match(tail)))) or "total" in present.lower()


def _pair_kind(name: str, past: onnx.ValueInfoProto, out: str,
               present: onnx.ValueInfoProto) -> tuple[str, int | None]:
    """("overwrite", None) for same shapes, ("append", axis) for a present one row longer."""
    a, b = past.type.tensor_type, present.type.tensor_type

    def show(t) -> str:
        return (f"{onnx.TensorProto.DataType.Name(t.elem_type).lower()}"
                f"{[_dim(d) for d in t.shape.dim]}")

    if a.elem_type != b.elem_type or len(a.shape.dim) != len(b.shape.dim):
        raise ConversionError(f"cache pair {name!r} -> {out!r}: {show(a)} vs {show(b)}")
    differ = [k for k, (x, y) in enumerate(zip(a.shape.dim, b.shape.dim, strict=True))
              if _dim(x) != _dim(y)]
    if not differ:
        return "overwrite", None
    if len(differ) == 1 and _grows_by_one(_dim(a.shape.dim[differ[0]]), _dim(b.shape.dim[differ[0]])):
        return "append", differ[0]
    raise ConversionError(f"cache pair {name!r} -> {out!r}: {show(a)} vs {show(b)} (a pair may "
                          "differ only by one row along one axis)")


# --------------------------------------------------------------------------------------------
# conversion


def convert(model: onnx.ModelProto | str | os.PathLike, context, *, use_stateful: bool = False,
            kv_cache_pairs: Sequence[MLKVCachePair] | None = None,
            dims: Mapping[str, int] | None = None,
            base: str | os.PathLike | None = None) -> ConvertedGraph:
    """Build `model` with an MLGraphBuilder on `context`; pairs default to none. ``dims``:
    symbolic dimensions pinned to numbers first (``dims.default_dims`` for a decode step);
    ``base``: where a model handed in as a proto keeps its external data."""
    given = isinstance(model, onnx.ModelProto)
    if not given:
        base = os.path.dirname(os.fspath(model))
    base = None if base is None else os.fspath(base)
    model = _load(model, weights=False)
    if dims:  # a model loaded here is this call's own: pinned where it lies
        model = pin(model, dims, copy=given)
    conv = _Converter(model, context, base)
    outputs = conv.run()
    pairs = list(kv_cache_pairs or [])
    graph = conv.builder.build(outputs, use_stateful=use_stateful, kv_cache_pairs=pairs)
    return ConvertedGraph(graph=graph, inputs=conv.input_descs, outputs=conv.output_descs,
                          kv_cache_pairs=pairs)


def _load(model: onnx.ModelProto | str | os.PathLike, weights: bool = True) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        # load_external_data resolves initializers stored beside the file (names need none)
        return onnx.load(os.fspath(model), load_external_data=weights)
    except (OSError, onnx.onnx_cpp2py_export.checker.ValidationError) as exc:  # type: ignore[attr-defined]
        raise ConversionError(f"cannot read ONNX file {os.fspath(model)!r}: {exc}") from None
    except Exception as exc:  # protobuf DecodeError and friends: not an ONNX file
        raise ConversionError(f"{os.fspath(model)!r} is not an ONNX model: {exc}") from None


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
    if tt.elem_type not in _ONNX_TO_WEBNN:
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
    return OperandDesc(_ONNX_TO_WEBNN[tt.elem_type], tuple(dims))


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class _Converter:
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
            got = OperandDesc(self._dtype(op), self._shape(op))
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
            op = self._constant(self.consts[name])
            self.operands[name] = op
            return op
        raise ConversionError(f"value {name!r} is used before it is produced (graph not sorted?)")

    def _constant(self, arr: np.ndarray | Packed4):
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
        return self._constant(np.array(value, dtype=HOST_DTYPES[self._dtype(ref)]))

    def const_input(self, node: onnx.NodeProto, i: int, what: str) -> np.ndarray:
        name = node.input[i]
        if name not in self.consts:
            raise ConversionError(
                f"{node.op_type} node {node.name or node.output[0]!r}: {what} (input {i}, {name!r}) "
                "must be an initializer or computable at conversion time; WebNN takes it as an "
                "argument, not a tensor")
        return self.consts[name]

    @staticmethod
    def _shape(op) -> tuple[int, ...]:
        return tuple(int(d) for d in op.shape)

    @staticmethod
    def _dtype(op) -> str:
        return str(op.data_type)

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        return self._shape(self.operand(name))

    # nodes ----------------------------------------------------------------------------------

    def _node(self, node: onnx.NodeProto) -> None:
        if node.domain not in ("", "ai.onnx") and not (
                node.domain == "com.microsoft" and node.op_type in _HANDLERS):
            raise ConversionError(
                f"unsupported op {node.domain}::{node.op_type} (node {node.name or node.output[0]!r}); "
                "the WebNN converter takes standard ONNX ops only: export the standard flavour")
        present = [n for n in node.input if n]
        if node.op_type in _FOLDABLE and all(n in self.consts for n in present):
            self._fold(node)
            return
        handler = _HANDLERS.get(node.op_type)
        if handler is None and node.op_type in _FOLDABLE:
            raise ConversionError(
                f"{node.op_type} node {node.name or node.output[0]!r} is supported only on values "
                "known at conversion time (initializers, shapes); here an input is a runtime value")
        if handler is None:
            raise ConversionError(
                f"unsupported op {node.op_type!r} (node {node.name or node.output[0]!r}); "
                f"supported: {', '.join(sorted(SUPPORTED_OPS))}")
        result = handler(self, node, _attrs(node))
        if not isinstance(result, (list, tuple)):
            result = [result]
        for name, value in zip(node.output, result, strict=False):
            if isinstance(value, np.ndarray):
                self.consts[name] = value
            else:
                self.operands[name] = value

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

Handler = Callable[[_Converter, onnx.NodeProto, dict], object]
_HANDLERS: dict[str, Handler] = {}
#: ops folded on the host when all their inputs are known at conversion time
_FOLDABLE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sqrt", "Exp", "Log", "Neg", "Abs",
    "Reshape", "Transpose", "Concat", "Slice", "Expand", "Gather", "Cast", "Unsqueeze", "Squeeze",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Where", "Range",
    "ConstantOfShape", "ReduceSum", "ReduceMean", "ReduceMax", "Identity", "Flatten", "Sigmoid",
    "Tanh", "Reciprocal", "Softmax", "Not", "And", "Or", "Floor", "Ceil", "Mod",
}


def _op(*names: str):
    def deco(fn: Handler) -> Handler:
        for n in names:
            _HANDLERS[n] = fn
        return fn
    return deco


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
           "Equal": "equal", "Greater": "greater", "Less": "lesser",
           "LessOrEqual": "lesser_or_equal", "GreaterOrEqual": "greater_or_equal"}
_UNARY = {"Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "neg", "Abs": "abs",
          "Sigmoid": "sigmoid", "Softplus": "softplus", "Tanh": "tanh"}


@_op(*_BINARY)
def _binary(c: _Converter, node, attrs):
    return getattr(c.builder, _BINARY[node.op_type])(c.operand(node.input[0]), c.operand(node.input[1]))


@_op("Max", "Min")
def _variadic(c: _Converter, node, attrs):
    fn = getattr(c.builder, node.op_type.lower())
    ops = [c.operand(n) for n in node.input if n]
    out = ops[0]
    for o in ops[1:]:
        out = fn(out, o)
    if len(ops) == 1:
        raise ConversionError(f"{node.op_type} with one input is not supported")
    return out


@_op(*_UNARY)
def _unary(c: _Converter, node, attrs):
    return getattr(c.builder, _UNARY[node.op_type])(c.operand(node.input[0]))


@_op("Reciprocal")
def _reciprocal(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    return c.builder.div(c.scalar_like(1.0, x), x)


@_op("Relu")
def _relu(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    return c.builder.max(x, c.scalar_like(0, x))


@_op("Identity")
def _identity(c: _Converter, node, attrs):
    name = node.input[0]
    return c.consts[name] if name in c.consts else c.operand(name)


@_op("Constant")
def _constant(c: _Converter, node, attrs):
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    for key, dt in (("value_float", np.float32), ("value_int", np.int64),
                    ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dt)
    raise ConversionError(f"Constant node {node.output[0]!r}: unsupported attribute {list(attrs)}")


@_op("Shape")
def _shape_op(c: _Converter, node, attrs):
    shape = np.asarray(c.shape_of(node.input[0]), dtype=np.int64)
    start, end = attrs.get("start", 0), attrs.get("end", None)
    return shape[start:end]


@_op("Size")
def _size_op(c: _Converter, node, attrs):
    return np.asarray(int(np.prod(c.shape_of(node.input[0]))), dtype=np.int64)


@_op("MatMul")
def _matmul(c: _Converter, node, attrs):
    a, b = c.operand(node.input[0]), c.operand(node.input[1])
    sa, sb = c._shape(a), c._shape(b)
    # WebNN matmul needs rank >= 2: ONNX (numpy) promotes a 1-D side and drops the dim after
    if len(sa) == 1:
        a = c.builder.reshape(a, [1, sa[0]])
    if len(sb) == 1:
        b = c.builder.reshape(b, [sb[0], 1])
    out = c.builder.matmul(a, b)
    if len(sa) == 1 or len(sb) == 1:
        so = list(c._shape(out))
        if len(sb) == 1:
            so.pop(-1)
        if len(sa) == 1:
            so.pop(-2 if len(sb) != 1 else -1)
        out = c.builder.reshape(out, so)
    return out


@_op("Gemm")
def _gemm(c: _Converter, node, attrs):
    b = c.builder
    a, w = c.operand(node.input[0]), c.operand(node.input[1])
    if attrs.get("transA", 0):
        a = b.transpose(a, permutation=[1, 0])
    if attrs.get("transB", 0):
        w = b.transpose(w, permutation=[1, 0])
    out = b.matmul(a, w)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        out = b.mul(out, c.scalar_like(alpha, out))
    if len(node.input) > 2 and node.input[2]:
        bias = c.operand(node.input[2])
        if beta != 1.0:
            bias = b.mul(bias, c.scalar_like(beta, bias))
        out = b.add(out, bias)
    return out


@_op("Softmax")
def _softmax(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    rank = len(c._shape(x))
    axis = attrs.get("axis", -1 if c.opset >= 13 else 1) % rank
    if c.opset < 13 and axis != rank - 1:
        raise ConversionError("Softmax before opset 13 (flattening semantics) is supported on the "
                              "last axis only")
    return c.builder.softmax(x, axis)


def _axes_of(c: _Converter, node, attrs, input_index: int, rank: int) -> list[int] | None:
    if len(node.input) > input_index and node.input[input_index]:
        axes = c.const_input(node, input_index, "axes").tolist()
    else:
        axes = attrs.get("axes")
    if axes is None:
        return None
    return sorted(int(a) % rank for a in axes)


@_op("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
def _reduce(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    rank = len(c._shape(x))
    axes = _axes_of(c, node, attrs, 1, rank)
    if axes is None or axes == []:
        if attrs.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(rank))
    fn = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max",
          "ReduceMin": "reduce_min"}[node.op_type]
    return getattr(c.builder, fn)(x, axes=axes, keep_dimensions=bool(attrs.get("keepdims", 1)))


@_op("Reshape")
def _reshape(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    src = c._shape(x)
    spec = [int(d) for d in c.const_input(node, 1, "shape").tolist()]
    allowzero = attrs.get("allowzero", 0)
    out = [src[i] if (d == 0 and not allowzero) else d for i, d in enumerate(spec)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(src)) // max(known, 1)
    return c.builder.reshape(x, out)


@_op("Flatten")
def _flatten(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    s = c._shape(x)
    ax = attrs.get("axis", 1) % (len(s) + 1)
    return c.builder.reshape(x, [int(np.prod(s[:ax])), int(np.prod(s[ax:]))])


@_op("Unsqueeze")
def _unsqueeze(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    s = list(c._shape(x))
    axes = (c.const_input(node, 1, "axes").reshape(-1).tolist() if c.opset >= 13
            else attrs["axes"])  # ORT takes a scalar as one axis
    rank = len(s) + len(axes)
    for a in sorted(int(a) % rank for a in axes):
        s.insert(a, 1)
    return c.builder.reshape(x, s)


@_op("Squeeze")
def _squeeze(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    s = c._shape(x)
    if c.opset >= 13:
        axes = (c.const_input(node, 1, "axes").reshape(-1).tolist()
                if len(node.input) > 1 and node.input[1] else None)
    else:
        axes = attrs.get("axes")
    drop = {int(a) % len(s) for a in axes} if axes is not None else {i for i, d in enumerate(s) if d == 1}
    return c.builder.reshape(x, [d for i, d in enumerate(s) if i not in drop])


@_op("Transpose")
def _transpose(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    perm = attrs.get("perm") or list(range(len(c._shape(x))))[::-1]
    return c.builder.transpose(x, permutation=[int(p) for p in perm])


@_op("Concat")
def _concat(c: _Converter, node, attrs):
    ops = [c.operand(n) for n in node.input if n]
    rank = len(c._shape(ops[0]))
    return c.builder.concat(ops, attrs["axis"] % rank)


@_op("Slice")
def _slice(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    s = c._shape(x)
    if c.opset >= 10:
        starts = c.const_input(node, 1, "starts").tolist()
        ends = c.const_input(node, 2, "ends").tolist()
        axes = (c.const_input(node, 3, "axes").tolist() if len(node.input) > 3 and node.input[3]
                else list(range(len(starts))))
        steps = (c.const_input(node, 4, "steps").tolist() if len(node.input) > 4 and node.input[4]
                 else [1] * len(starts))
    else:
        starts, ends = attrs["starts"], attrs["ends"]
        axes, steps = attrs.get("axes", list(range(len(starts)))), [1] * len(starts)
    begin, sizes, strides = [0] * len(s), list(s), [1] * len(s)
    for st, en, ax, step in zip(starts, ends, axes, steps, strict=True):
        ax = int(ax) % len(s)
        if step < 1:
            raise ConversionError(f"Slice node {node.output[0]!r}: step {step} is not supported "
                                  "(WebNN slice strides are positive)")
        dim = s[ax]
        st = min(max(st + dim if st < 0 else st, 0), dim)
        en = min(max(en + dim if en < 0 else en, 0), dim)
        if en <= st:
            raise ConversionError(f"Slice node {node.output[0]!r} is empty on axis {ax}; WebNN has "
                                  "no 0-sized tensors")
        # WebNN's sizes is the window (its output ceil(window / step) long), as ONNX's end - start
        begin[ax], sizes[ax], strides[ax] = int(st), int(en - st), int(step)
    if any(d != 1 for d in strides):
        return c.builder.slice(x, begin, sizes, strides=strides)
    return c.builder.slice(x, begin, sizes)


@_op("Expand")
def _expand(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    target = [int(d) for d in c.const_input(node, 1, "shape").tolist()]
    src = c._shape(x)
    # ONNX Expand broadcasts both ways; WebNN expand takes the final shape
    rank = max(len(src), len(target))
    a = [1] * (rank - len(src)) + list(src)
    b = [1] * (rank - len(target)) + target
    out = [max(p, q) if 1 in (p, q) else p for p, q in zip(a, b, strict=True)]
    if list(src) == out:
        return x
    return c.builder.expand(x, out)


@_op("Where")
def _where(c: _Converter, node, attrs):
    return c.builder.where(c.operand(node.input[0]), c.operand(node.input[1]), c.operand(node.input[2]))


@_op("ScatterND")
def _scatter_nd(c: _Converter, node, attrs):
    if attrs.get("reduction", b"none") not in (b"none", "none"):
        raise ConversionError(f"ScatterND with reduction {attrs['reduction']!r} is not supported")
    return c.builder.scatter_nd(c.operand(node.input[0]), c.operand(node.input[1]),
                                c.operand(node.input[2]))


@_op("Gather")
def _gather(c: _Converter, node, attrs):
    x = c.operand(node.input[0])
    axis = attrs.get("axis", 0) % len(c._shape(x))
    name = node.input[1]
    if name in c.consts:  # ONNX allows negative indices; WebNN clamps, so normalise them here
        idx = c.consts[name].astype(np.int64)
        idx = np.where(idx < 0, idx + c._shape(x)[axis], idx)
        ind = c._constant(idx)
    else:
        ind = c.operand(name)
    return c.builder.gather(x, ind, axis=axis)


@_op("Cast")
def _cast(c: _Converter, node, attrs):
    to = attrs["to"]
    if to not in _ONNX_TO_WEBNN:
        raise ConversionError(f"Cast to {onnx.TensorProto.DataType.Name(to)} is not supported")
    x = c.operand(node.input[0])
    if to == onnx.TensorProto.BOOL:  # bool is uint8 0 or 1: x != 0
        return c.builder.logical_not(c.builder.equal(x, c.scalar_like(0, x)))
    if c._dtype(x) == _ONNX_TO_WEBNN[to]:
        return x
    return c.builder.cast(x, _ONNX_TO_WEBNN[to])


@_op("DequantizeLinear")
def _dequantize_linear(c: _Converter, node, attrs):
    """ONNX's per-tensor, per-axis (``axis``) and blocked (``block_size`` on ``axis``, opset
    21) forms as WebNN's one: a scale (and zero point) whose shape divides the input's."""
    x = c.operand(node.input[0])
    shape = c._shape(x)
    scale = c.operand(node.input[1])
    sshape = c._shape(scale)
    axis = attrs.get("axis", 1) % max(len(shape), 1)
    block = attrs.get("block_size", 0)
    if len(sshape) == 1 and not block and len(shape) > 1:  # per-axis: a 1-D scale on `axis`
        want = [1] * len(shape)
        want[axis] = sshape[0]
    elif block:
        want = list(shape)
        want[axis] = -(-shape[axis] // block)
        if shape[axis] % block or list(sshape) != want:
            raise ConversionError(
                f"DequantizeLinear node {node.name or node.output[0]!r}: block_size {block} "
                f"must divide axis {axis} of {list(shape)} with a scale of {want}, got "
                f"{list(sshape)}")
    else:
        want = list(sshape)
    if list(sshape) != want:
        scale = c.builder.reshape(scale, want)
    kind = c._dtype(x)
    if len(node.input) > 2 and node.input[2]:
        zp = c.operand(node.input[2])
        if list(c._shape(zp)) != want:
            zp = c.builder.reshape(zp, want)
    elif kind in ("int4", "uint4"):
        count = int(np.prod(want, dtype=np.int64))
        zp = c.builder.constant(data_type=kind, shape=want,
                                value=np.zeros(packed_bytes(dtype(kind), count), np.uint8))
    else:
        zp = c._constant(np.zeros(want, HOST_DTYPES[kind]))
    return c.builder.dequantize_linear(x, scale, zp)


from . import convert_ops  # noqa: E402,F401,I001  (registers its handlers)
from . import convert_linear  # noqa: E402,F401,I001  (registers its handlers)
from . import convert_attention  # noqa: E402,F401,I001  (registers its handlers)
from . import convert_quant  # noqa: E402,F401  (registers its handlers)

SUPPORTED_OPS = frozenset(_HANDLERS) | frozenset({"Range", "ConstantOfShape"})
