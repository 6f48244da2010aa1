"""Symbolic dimensions of an exported decoder pinned to numbers, so WebNN (static shapes
only) can build it: batch 1, one new token, the past at a capacity, the total one more.

Real exporters name their dynamic dimensions (``batch_size``, ``sequence_length``,
``past_sequence_length``, ``total_sequence_length``), write numbers as strings (``"16"``)
and expressions (``past_sequence_length + 1``); each is resolved from its name here, and
a name no rule knows is left symbolic, for the converter to name.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

NEW_TOKENS = re.compile(r"^(sequence_length|seq_len|sequence|seq|seqlen|query_length|"
                        r"input_sequence_length|num_tokens|tokens)$", re.IGNORECASE)


#: names of widths, never lengths, whatever else they say (``kv_cache_dim``, ``head_size``)
_WIDTH = re.compile(r"(^|_)(dim|head|heads|head_size|head_dim|hidden|hidden_size)$")


@dataclass(frozen=True)
class PinnedDim:
    """One symbol's value and the rule that gave it."""

    value: int
    how: str


def symbols(model: onnx.ModelProto) -> list[str]:
    """Every ``dim_param`` of the graph's inputs, outputs and value_info, first seen first."""
    out: dict[str, None] = {}
    g = model.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param:
                out.setdefault(d.dim_param, None)
    return list(out)


def _by_name(name: str, capacity: int) -> PinnedDim | None:
    low = name.lower()
    if name.strip().isdigit():
        return PinnedDim(int(name), "a number")
    if "batch" in low:
        return PinnedDim(1, "batch 1")
    if _WIDTH.search(low):  # a head's or cache row's width (genai's kv_cache_dim), not a length
        return None
    if "total" in low:
        return PinnedDim(capacity + 1, "past + 1 new token")
    if "past" in low or "cache" in low:
        return PinnedDim(capacity, "past = capacity")
    if NEW_TOKENS.match(name):
        return PinnedDim(1, "one new token")
    return None


def _evaluate(expr: str, known: Mapping[str, int]) -> int | None:
    """An expression of known symbols, integers, + - * and // (None if it is not one)."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None

    def ev(n: ast.AST) -> int | None:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            return known.get(n.id)
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            a, b = ev(n.left), ev(n.right)
            if a is None or b is None:
                return None
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
            return ops.get(type(n.op), a // b if b else None)
        return None

    return ev(tree)


def default_dims(model: onnx.ModelProto, capacity: int,
                 grown: Mapping[str, int] | None = None) -> dict[str, PinnedDim]:
    """symbol -> its value for a decode step at ``capacity`` past rows; symbols no rule
    knows are absent. ``grown``: cache input -> the axis it grows on (``list_kv_pairs``'s
    append pairs): a symbol there is the past whatever its name (transformers' ``s53``)."""
    names = symbols(model)
    out: dict[str, PinnedDim] = {}
    for s in names:
        if re.fullmatch(r"[A-Za-z_]\w*|\s*\d+\s*", s):
            pinned = _by_name(s, capacity)
            if pinned is not None:
                out[s] = pinned
    inputs = {i.name: i for i in model.graph.input}
    for name, axis in (grown or {}).items():
        d = inputs[name].type.tensor_type.shape.dim[axis]
        if d.dim_param not in out and re.fullmatch(r"[A-Za-z_]\w*", d.dim_param):
            out[d.dim_param] = PinnedDim(capacity, "a growing cache's past = capacity")
    for s in names:
        if s not in out:
            v = _evaluate(s, {k: p.value for k, p in out.items()})
            if v is not None and v > 0:
                out[s] = PinnedDim(v, "expression")
    if any(s not in out for s in names):
        out.update(_attention_widths(model, {k: p.value for k, p in out.items()}, names))
    if any(s not in out for s in names):
        out.update(_conv_windows(model, names, out))
    return out


def _conv_windows(model: onnx.ModelProto, names: list[str],
                  known: Mapping[str, PinnedDim]) -> dict[str, PinnedDim]:
    """A symbol on the last axis of a conv state (transformers' Qwen3.5 ``s84``): the state
    is concatenated with the new column and read by a Conv, whose kernel is the window
    the state keeps."""
    g = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    inits = {t.name: t for t in g.initializer}
    out: dict[str, PinnedDim] = {}
    for vi in g.input:
        dims = vi.type.tensor_type.shape.dim
        if not dims or dims[-1].dim_param not in names or dims[-1].dim_param in known:
            continue
        for cat in readers.get(vi.name, []):
            axis = next((a.i for a in cat.attribute if a.name == "axis"), None)
            if cat.op_type != "Concat" or cat.input[0] != vi.name or axis not in (-1, len(dims) - 1):
                continue
            for conv in readers.get(cat.output[0], []):
                if conv.op_type != "Conv" or conv.input[0] != cat.output[0]:
                    continue
                kernel = next((list(a.ints) for a in conv.attribute if a.name == "kernel_shape"),
                              list(inits[conv.input[1]].dims[2:]) if conv.input[1] in inits else [])
                if kernel:
                    out[dims[-1].dim_param] = PinnedDim(int(kernel[-1]), "a conv state's window "
                                                        "(the kernel of the Conv reading it)")
    return out


def _attention_widths(model: onnx.ModelProto, known: Mapping[str, int],
                      names: list[str]) -> dict[str, PinnedDim]:
    """Symbols on the last axis of a GroupQueryAttention's past (genai's ``kv_cache_dim``):
    its head size, the query's width (from ONNX shape inference on the pinned graph) over
    its heads."""
    gqa = [n for n in model.graph.node
           if n.domain == "com.microsoft" and n.op_type == "GroupQueryAttention"]
    if not gqa:
        return {}
    inputs = {i.name: i for i in model.graph.input}
    light = pin(without_weights(model), known, copy=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except Exception:  # noqa: BLE001 - a graph shape inference cannot take: nothing learned
        return {}
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None
                       for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input]}
    producer = {o: n for n in model.graph.node for o in n.output}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}

    def width_of(name: str) -> int | None:
        """The last dim inferred, else the columns of the MatMul weight that made it."""
        last = (shapes.get(name) or [None])[-1]
        node = producer.get(name)
        if last or node is None or node.op_type != "MatMul" or node.input[1] not in weights:
            return last
        return weights[node.input[1]][-1]

    out: dict[str, PinnedDim] = {}
    for n in gqa:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        width = width_of(n.input[0])
        past = inputs.get(n.input[3]) if len(n.input) > 3 else None
        if not width or past is None:
            continue
        packed = len(n.input) < 2 or not n.input[1]
        heads = attrs["num_heads"] + (2 * attrs["kv_num_heads"] if packed else 0)
        last = past.type.tensor_type.shape.dim[-1]
        if last.HasField("dim_param") and last.dim_param in names and last.dim_param not in known:
            out[last.dim_param] = PinnedDim(width // heads, "GroupQueryAttention head size")
    return out


def without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large (or external) initializers are inputs of their type
    and shape: shape inference needs no weights, only the small constants (axes, shapes)
    that shapes are computed from."""
    into = onnx.ModelProto()
    into.CopyFrom(model)
    g = into.graph
    del g.initializer[:]
    for t in model.graph.initializer:
        small = int(np.prod(t.dims, dtype=np.int64)) <= 64
        if small and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        else:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return into


def pin(model: onnx.ModelProto, dims: Mapping[str, int], *, copy: bool = True) -> onnx.ModelProto:
    """``model`` with its dimensions named in ``dims`` set to those numbers: a copy, or (``copy``
    False, for a model the caller owns) the model itself, so its initializers are not copied."""
    out = model
    if copy:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    g = out.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = int(dims[d.dim_param])
    return out
