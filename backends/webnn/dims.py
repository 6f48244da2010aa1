"""Symbolic dimensions of an exported decoder pinned to numbers, so WebNN (static shapes
only) can build it: batch 1, one new token, the past at a capacity, the total one more.

Real exporters name their dynamic dimensions (``batch_size``, ``sequence_length``,
``past_sequence_length``, ``total_sequence_length``), write numbers as strings (``"16"``)
and expressions (``past_sequence_length + 1``); each is resolved from its name here. A
name that says nothing (torch.export's ``s53``) is resolved from how the graph uses it
(``_from_graph``); genai's ``kv_cache_dim`` names every layer's head size alike, so it is
resolved per past (``past_head_sizes``); one no rule knows is left symbolic, for the
converter to name.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

#: the name of the new tokens' count (one per decode step)
NEW_TOKENS = re.compile(r"^(sequence_length|seq_len|sequence|seq|seqlen|query_length|"
                         r"input_sequence_length|num_tokens|tokens)$", re.IGNORECASE)


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
    if "total" in low:
        return PinnedDim(capacity + 1, "past + 1 new token")
    if ("past" in low or "cache" in low) and "dim" not in low:  # not genai's kv_cache_dim
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
    for s, pinned in _from_graph(model, capacity).items():
        out.setdefault(s, pinned)
    for s in names:
        if s not in out:
            v = _evaluate(s, {k: p.value for k, p in out.items()})
            if v is not None and v > 0:
                out[s] = PinnedDim(v, "expression")
    if any(s not in out for s in names):
        out.update(_attention_widths(model, {k: p.value for k, p in out.items()}, names))
    return out


def _from_graph(model: onnx.ModelProto, capacity: int) -> dict[str, PinnedDim]:
    """Symbols whose names say nothing, resolved from the graph's structure:

    - ``s + 1`` or ``s + <new tokens>`` written for an output: ``s`` is a past length (the
      capacity); torch.export names it ``s53``;
    - the last axis of an input concatenated on that axis into a Conv's input (a causal-conv
      window, transformers' ``[B, conv_dim, s84]``): the Conv's kernel width.
    """
    g = model.graph
    out: dict[str, PinnedDim] = {}
    for vi in g.output:
        for d in vi.type.tensor_type.shape.dim:
            head, plus, tail = d.dim_param.replace(" ", "").partition("+")
            if plus and re.fullmatch(r"[A-Za-z_]\w*", head) and (tail == "1" or NEW_TOKENS.match(tail)):
                out.setdefault(head, PinnedDim(capacity, "past = capacity (grows by one)"))
    inputs = {i.name: i for i in g.input}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    inits = {t.name: t for t in g.initializer}

    def last_symbol(name: str) -> str | None:
        dims = inputs[name].type.tensor_type.shape.dim if name in inputs else []
        return dims[-1].dim_param or None if dims and not dims[-1].HasField("dim_value") else None

    for n in g.node:
        if n.op_type == "Concat":
            for c in consumers.get(n.output[0], []):
                if c.op_type != "Conv":
                    continue
                kernel = next((list(a.ints) for a in c.attribute if a.name == "kernel_shape"), None)
                if not kernel and c.input[1] in inits:
                    kernel = list(inits[c.input[1]].dims[2:])
                for i in n.input:
                    if kernel and (s := last_symbol(i)):
                        out.setdefault(s, PinnedDim(kernel[-1], "conv window (Conv kernel)"))
    return out


def _attention_widths(model: onnx.ModelProto, known: Mapping[str, int],
                      names: list[str]) -> dict[str, PinnedDim]:
    """Symbols on the last axis of a GroupQueryAttention's past (genai's ``kv_cache_dim``):
    its head size traced from the projection feeding the node (``past_head_sizes``)."""
    inputs = {i.name: i for i in model.graph.input}
    sizes: dict[str, set[int]] = {}
    for past, size in past_head_sizes(model).items():
        last = inputs[past].type.tensor_type.shape.dim[-1] if past in inputs else None
        if last is not None and last.dim_param in names and last.dim_param not in known:
            sizes.setdefault(last.dim_param, set()).add(size)
    # one symbol whose layers disagree (a hybrid's) stays symbolic: the converter names it
    return {s: PinnedDim(v.pop(), "GroupQueryAttention head size")
            for s, v in sizes.items() if len(v) == 1}


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


def _width(name: str, producers: Mapping[str, onnx.NodeProto],
           inits: Mapping[str, onnx.TensorProto]) -> int | None:
    """The last dimension of ``name`` traced back through the projection that makes it:
    a MatMul by a weight (its last dim), MatMulNBits (N), a Split of one by constant sizes,
    and ops that keep the width (bias Add, Cast, Identity); None where the trace ends."""
    for _ in range(16):
        node = producers.get(name)
        if node is None:
            return None
        if node.op_type == "MatMul" and node.input[1] in inits:
            return int(inits[node.input[1]].dims[-1])
        if node.op_type == "MatMulNBits":
            return next((int(a.i) for a in node.attribute if a.name == "N"), None)
        if node.op_type == "Split":
            sizes = (onnx.numpy_helper.to_array(inits[node.input[1]]).tolist()
                     if len(node.input) > 1 and node.input[1] in inits else
                     next((list(a.ints) for a in node.attribute if a.name == "split"), None))
            return int(sizes[list(node.output).index(name)]) if sizes else None
        if node.op_type not in ("Add", "Cast", "Identity"):
            return None
        name = node.input[0]
    return None


def past_head_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """past input -> its head size, for each GroupQueryAttention past: a symbol cannot give
    it (genai names it ``kv_cache_dim`` in every layer, though a hybrid's layers differ), the
    projection feeding the node can: value width / kv_num_heads, or a packed query's width /
    (num_heads + 2 kv_num_heads)."""
    g = model.graph
    producers = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    inits.update({n.output[0]: a.t for n in g.node if n.op_type == "Constant"
                  for a in n.attribute if a.name == "value"})  # exporters' constants as nodes
    out: dict[str, int] = {}
    for n in g.node:
        if n.op_type != "GroupQueryAttention" or len(n.input) < 5:
            continue
        attrs = {a.name: a.i for a in n.attribute}
        heads, kv = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
        if not kv:
            continue
        value = _width(n.input[2], producers, inits) if n.input[2] else None
        packed = None if n.input[2] else _width(n.input[0], producers, inits)
        size = (value // kv if value else
                packed // (heads + 2 * kv) if packed and heads else None)
        if size:
            out.update({n.input[3]: size, n.input[4]: size})
    return out
