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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from . import convert_attention, convert_gdn, convert_linear, convert_ops, convert_quant  # noqa: F401  (register)
from ._classes import MLKVCachePair
from .convert_core import (
    HOST_DTYPES,
    ONNX_TO_WEBNN,
    ConversionError,
    Converter,
    OperandDesc,
    Packed4,
    handles,
    supported_ops,
)
from .dims import linear, new_token_dims, pin
from .dtypes import dtype, packed_bytes

__all__ = ["HOST_DTYPES", "NAMING_RULES", "SUPPORTED_OPS", "CachePair", "ConversionError",
           "ConvertedGraph", "OperandDesc", "Packed4", "convert", "list_kv_pairs"]

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
    present is ``new`` rows longer along ``axis``: a growing cache); ``new``: those rows
    per step, a number or the new-token dim's symbol (``s70``, ``sequence_length``: K,
    pinned to 1 for decode, ``dims.rows_per_step``); ``rule``: the naming rule that matched
    (``NAMING_RULES``), or "hand" for a pair named by the caller; ``how``: the shape rule
    that matched, in words."""

    kind: str = "overwrite"
    axis: int | None = None
    rule: str = ""
    new: int | str | None = None
    how: str = ""


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
    proto = _load(model, weights=False)
    graph = proto.graph
    news = new_token_dims(proto)
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
        kind, axis, new, how = _pair_kind(name, vi, out, outputs[out], news)
        found.append(CachePair(input=name, output=out, kind=kind, axis=axis, rule=rule, new=new,
                               how=how))
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


def _same(x: int | str | None, y: int | str | None) -> bool:
    """Whether two dims are one: equal, or sums that parse to the same form (``s53+s70``
    and ``s53 + s70``)."""
    if x == y:
        return True
    if isinstance(x, str) and isinstance(y, str):
        fx = linear(x)
        return fx is not None and fx == linear(y)
    return False


def _growth(past: int | str | None, present: int | str | None,
            news: Mapping[int | str, str]) -> tuple[int | str, str] | None:
    """(new rows, the rule in words) where ``present`` is ``past`` plus new rows, else None.
    Sums are parsed (``dims.linear``), not matched as strings: ``present - past`` is a
    positive number (``s53 + 1``, ``17`` after ``16``), or one new-token dim (``news``: the
    last axis of input_ids/position_ids, or a name such as ``sequence_length``: ``s53 + s70``,
    ``past_sequence_length + sequence_length``); a bare symbol of its own (genai's
    ``total_sequence_length``) or an unnamed dim is past + the new-token dim (one row where
    the graph names none and the symbol says ``total``)."""
    new = next((v for v, w in news.items() if isinstance(v, str) and w != "its name"),
               next(iter(news), None))
    where = f"new = {news[new]}" if new is not None else "new = one row"
    if past is None or present is None:
        return new if new is not None else 1, f"an unnamed dim, {where}"
    a = linear(str(past))
    b = linear(str(present))
    if a is None or b is None:
        return None
    diff = dict(b[0])
    for k, v in a[0].items():
        diff[k] = diff.get(k, 0) - v
    diff = {k: v for k, v in diff.items() if v}
    const = b[1] - a[1]
    if not diff and const > 0:
        return const, f"{present}, new = {const} row{'s' * (const > 1)}"
    if const == 0 and len(diff) == 1 and next(iter(diff.values())) == 1:
        (sym,) = diff
        if sym in news:
            return sym, f"{present}, new = {news[sym]}"
    bare = b[1] == 0 and len(b[0]) == 1 and next(iter(b[0].values())) == 1
    if bare and a[0] and not set(b[0]) & (set(a[0]) | set(news)):  # total_sequence_length
        if new is not None:
            return new, f"{present}, a symbol of its own: past + new, {where}"
        if "total" in str(present).lower():
            return 1, f"{present}: past + one new token (by name)"
    return None


def _pair_kind(name: str, past: onnx.ValueInfoProto, out: str, present: onnx.ValueInfoProto,
               news: Mapping[int | str, str]) -> tuple[str, int | None, int | str | None, str]:
    """(kind, axis, new rows, how): ("overwrite", None, None, ...) for same shapes,
    ("append", axis, rows, ...) for a present that is the past plus new rows on one axis."""
    a, b = past.type.tensor_type, present.type.tensor_type

    def show(t) -> str:
        return (f"{onnx.TensorProto.DataType.Name(t.elem_type).lower()}"
                f"{[_dim(d) for d in t.shape.dim]}")

    if a.elem_type != b.elem_type or len(a.shape.dim) != len(b.shape.dim):
        raise ConversionError(f"cache pair {name!r} -> {out!r}: {show(a)} vs {show(b)}")
    differ = [k for k, (x, y) in enumerate(zip(a.shape.dim, b.shape.dim, strict=True))
              if not _same(_dim(x), _dim(y))]
    if not differ:
        return "overwrite", None, None, "same shape: overwrite"
    said = ", ".join(f"{v} ({w})" for v, w in news.items()) or "none: no input_ids/position_ids"
    if len(differ) > 1:
        raise ConversionError(
            f"cache pair {name!r} -> {out!r}: {show(a)} vs {show(b)} differ on axes "
            f"{', '.join(map(str, differ))} (a pair may differ on one axis only)")
    axis = differ[0]
    x, y = _dim(a.shape.dim[axis]), _dim(b.shape.dim[axis])
    grows = _growth(x, y, news)
    if grows is None:
        raise ConversionError(
            f"cache pair {name!r} -> {out!r}: {show(a)} vs {show(b)}: axis {axis} goes from "
            f"{x} to {y}, not the past plus a number of rows or plus the new-token dim "
            f"(new-token dims: {said})")
    return "append", axis, grows[0], f"past+new on axis {axis} ({grows[1]})"


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
    conv = Converter(model, context, base)
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


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
           "Equal": "equal", "Greater": "greater", "Less": "lesser",
           "LessOrEqual": "lesser_or_equal", "GreaterOrEqual": "greater_or_equal"}
_UNARY = {"Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "neg", "Abs": "abs",
          "Sigmoid": "sigmoid", "Softplus": "softplus", "Tanh": "tanh"}


@handles(*_BINARY)
def _binary(c: Converter, node, attrs):
    return getattr(c.builder, _BINARY[node.op_type])(c.operand(node.input[0]), c.operand(node.input[1]))


@handles("Max", "Min")
def _variadic(c: Converter, node, attrs):
    fn = getattr(c.builder, node.op_type.lower())
    ops = [c.operand(n) for n in node.input if n]
    out = ops[0]
    for o in ops[1:]:
        out = fn(out, o)
    if len(ops) == 1:
        raise ConversionError(f"{node.op_type} with one input is not supported")
    return out


@handles(*_UNARY)
def _unary(c: Converter, node, attrs):
    return getattr(c.builder, _UNARY[node.op_type])(c.operand(node.input[0]))


@handles("Reciprocal")
def _reciprocal(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    return c.builder.div(c.scalar_like(1.0, x), x)


@handles("Relu")
def _relu(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    return c.builder.max(x, c.scalar_like(0, x))


@handles("Identity")
def _identity(c: Converter, node, attrs):
    name = node.input[0]
    return c.consts[name] if name in c.consts else c.operand(name)


@handles("Constant")
def _constant(c: Converter, node, attrs):
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    for key, dt in (("value_float", np.float32), ("value_int", np.int64),
                    ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dt)
    raise ConversionError(f"Constant node {node.output[0]!r}: unsupported attribute {list(attrs)}")


@handles("Shape")
def _shape_op(c: Converter, node, attrs):
    shape = np.asarray(c.shape_of(node.input[0]), dtype=np.int64)
    start, end = attrs.get("start", 0), attrs.get("end", None)
    return shape[start:end]


@handles("Size")
def _size_op(c: Converter, node, attrs):
    return np.asarray(int(np.prod(c.shape_of(node.input[0]))), dtype=np.int64)


@handles("MatMul")
def _matmul(c: Converter, node, attrs):
    a, b = c.operand(node.input[0]), c.operand(node.input[1])
    sa, sb = c.shape(a), c.shape(b)
    # WebNN matmul needs rank >= 2: ONNX (numpy) promotes a 1-D side and drops the dim after
    if len(sa) == 1:
        a = c.builder.reshape(a, [1, sa[0]])
    if len(sb) == 1:
        b = c.builder.reshape(b, [sb[0], 1])
    out = c.builder.matmul(a, b)
    if len(sa) == 1 or len(sb) == 1:
        so = list(c.shape(out))
        if len(sb) == 1:
            so.pop(-1)
        if len(sa) == 1:
            so.pop(-2 if len(sb) != 1 else -1)
        out = c.builder.reshape(out, so)
    return out


@handles("Gemm")
def _gemm(c: Converter, node, attrs):
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


@handles("Softmax")
def _softmax(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    rank = len(c.shape(x))
    axis = attrs.get("axis", -1 if c.opset >= 13 else 1) % rank
    if c.opset < 13 and axis != rank - 1:
        raise ConversionError("Softmax before opset 13 (flattening semantics) is supported on the "
                              "last axis only")
    return c.builder.softmax(x, axis)


def _axes_of(c: Converter, node, attrs, input_index: int, rank: int) -> list[int] | None:
    if len(node.input) > input_index and node.input[input_index]:
        axes = c.const_input(node, input_index, "axes").tolist()
    else:
        axes = attrs.get("axes")
    if axes is None:
        return None
    return sorted(int(a) % rank for a in axes)


@handles("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
def _reduce(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    rank = len(c.shape(x))
    axes = _axes_of(c, node, attrs, 1, rank)
    if axes is None or axes == []:
        if attrs.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(rank))
    fn = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max",
          "ReduceMin": "reduce_min"}[node.op_type]
    return getattr(c.builder, fn)(x, axes=axes, keep_dimensions=bool(attrs.get("keepdims", 1)))


@handles("Reshape")
def _reshape(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    src = c.shape(x)
    spec = [int(d) for d in c.const_input(node, 1, "shape").tolist()]
    allowzero = attrs.get("allowzero", 0)
    out = [src[i] if (d == 0 and not allowzero) else d for i, d in enumerate(spec)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(src)) // max(known, 1)
    return c.builder.reshape(x, out)


@handles("Flatten")
def _flatten(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    s = c.shape(x)
    ax = attrs.get("axis", 1) % (len(s) + 1)
    return c.builder.reshape(x, [int(np.prod(s[:ax])), int(np.prod(s[ax:]))])


@handles("Unsqueeze")
def _unsqueeze(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    s = list(c.shape(x))
    axes = (c.const_input(node, 1, "axes").reshape(-1).tolist() if c.opset >= 13
            else attrs["axes"])  # ORT takes a scalar as one axis
    rank = len(s) + len(axes)
    for a in sorted(int(a) % rank for a in axes):
        s.insert(a, 1)
    return c.builder.reshape(x, s)


@handles("Squeeze")
def _squeeze(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    s = c.shape(x)
    if c.opset >= 13:
        axes = (c.const_input(node, 1, "axes").reshape(-1).tolist()
                if len(node.input) > 1 and node.input[1] else None)
    else:
        axes = attrs.get("axes")
    drop = {int(a) % len(s) for a in axes} if axes is not None else {i for i, d in enumerate(s) if d == 1}
    return c.builder.reshape(x, [d for i, d in enumerate(s) if i not in drop])


@handles("Transpose")
def _transpose(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    perm = attrs.get("perm") or list(range(len(c.shape(x))))[::-1]
    return c.builder.transpose(x, permutation=[int(p) for p in perm])


@handles("Concat")
def _concat(c: Converter, node, attrs):
    """An empty input adds nothing: the Concat of the others (one left: itself), exactly."""
    names = [n for n in node.input if n]
    kept = [n for n in names if not c.is_empty(n)]
    if len(kept) == 1:
        return c.consts[kept[0]] if kept[0] in c.consts else c.operand(kept[0])
    ops = [c.operand(n) for n in kept]
    rank = len(c.shape(ops[0]))
    return c.builder.concat(ops, attrs["axis"] % rank)


@handles("Slice")
def _slice(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    s = c.shape(x)
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
        # WebNN's sizes is the window (its output ceil(window / step) long), as ONNX's end - start
        begin[ax], sizes[ax], strides[ax] = int(st), max(int(en - st), 0), int(step)
    if 0 in sizes:  # WebNN has no 0-sized tensors: the empty value is its shape alone
        return c.empty_like(x, [-(-n // k) for n, k in zip(sizes, strides, strict=True)])
    if any(d != 1 for d in strides):
        return c.builder.slice(x, begin, sizes, strides=strides)
    return c.builder.slice(x, begin, sizes)


@handles("Expand")
def _expand(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    target = [int(d) for d in c.const_input(node, 1, "shape").tolist()]
    src = c.shape(x)
    # ONNX Expand broadcasts both ways; WebNN expand takes the final shape
    rank = max(len(src), len(target))
    a = [1] * (rank - len(src)) + list(src)
    b = [1] * (rank - len(target)) + target
    out = [max(p, q) if 1 in (p, q) else p for p, q in zip(a, b, strict=True)]
    if list(src) == out:
        return x
    return c.builder.expand(x, out)


@handles("Where")
def _where(c: Converter, node, attrs):
    return c.builder.where(c.operand(node.input[0]), c.operand(node.input[1]), c.operand(node.input[2]))


@handles("ScatterND")
def _scatter_nd(c: Converter, node, attrs):
    if attrs.get("reduction", b"none") not in (b"none", "none"):
        raise ConversionError(f"ScatterND with reduction {attrs['reduction']!r} is not supported")
    if c.is_empty(node.input[1]) or c.is_empty(node.input[2]):  # no update: the data as it is
        return _same_value(c, node.input[0])
    return c.builder.scatter_nd(c.operand(node.input[0]), c.operand(node.input[1]),
                                c.operand(node.input[2]))


def _same_value(c: Converter, name: str):
    """``name`` unchanged (a value known at conversion time stays one)."""
    return c.consts[name] if name in c.consts else c.operand(name)


@handles("Gather")
def _gather(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    axis = attrs.get("axis", 0) % len(c.shape(x))
    name = node.input[1]
    if name in c.consts:  # ONNX allows negative indices; WebNN clamps, so normalise them here
        idx = c.consts[name].astype(np.int64)
        idx = np.where(idx < 0, idx + c.shape(x)[axis], idx)
        ind = c.constant(idx)
    else:
        ind = c.operand(name)
    return c.builder.gather(x, ind, axis=axis)


@handles("Cast")
def _cast(c: Converter, node, attrs):
    to = attrs["to"]
    if to not in ONNX_TO_WEBNN:
        raise ConversionError(f"Cast to {onnx.TensorProto.DataType.Name(to)} is not supported")
    x = c.operand(node.input[0])
    if to == onnx.TensorProto.BOOL:  # bool is uint8 0 or 1: x != 0
        return c.builder.logical_not(c.builder.equal(x, c.scalar_like(0, x)))
    if c.dtype(x) == ONNX_TO_WEBNN[to]:
        return x
    return c.builder.cast(x, ONNX_TO_WEBNN[to])


@handles("DequantizeLinear")
def _dequantize_linear(c: Converter, node, attrs):
    """ONNX's per-tensor, per-axis (``axis``) and blocked (``block_size`` on ``axis``, opset
    21) forms as WebNN's one: a scale (and zero point) whose shape divides the input's."""
    x = c.operand(node.input[0])
    shape = c.shape(x)
    scale = c.operand(node.input[1])
    sshape = c.shape(scale)
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
    kind = c.dtype(x)
    if len(node.input) > 2 and node.input[2]:
        zp = c.operand(node.input[2])
        if list(c.shape(zp)) != want:
            zp = c.builder.reshape(zp, want)
    elif kind in ("int4", "uint4"):
        count = int(np.prod(want, dtype=np.int64))
        zp = c.builder.constant(data_type=kind, shape=want,
                                value=np.zeros(packed_bytes(dtype(kind), count), np.uint8))
    else:
        zp = c.constant(np.zeros(want, HOST_DTYPES[kind]))
    return c.builder.dequantize_linear(x, scale, zp)


#: every ONNX op the converter takes (its own handlers above, the handler modules' and two
#: folded on the host only)
SUPPORTED_OPS = supported_ops()
