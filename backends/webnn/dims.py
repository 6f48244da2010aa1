"""Symbolic dimensions of an exported decoder pinned to numbers, so WebNN (static shapes
only) can build it: batch 1, one new token, the past at a capacity, the total one more.

Real exporters name their dynamic dimensions (``batch_size``, ``sequence_length``,
``past_sequence_length``, ``total_sequence_length``), write numbers as strings (``"16"``)
and expressions (``past_sequence_length + 1``); each is resolved from its name here. A
name that says nothing (torch.export's ``s53``, genai's ``kv_cache_dim``) is resolved from
how the graph uses it (``_from_graph``); one no rule knows is left symbolic, for the
converter to name.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass

import onnx
from onnx import numpy_helper

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
    if re.search(r"(dim|size|width|heads?)$", low):  # genai's kv_cache_dim is a head size
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


def default_dims(model: onnx.ModelProto, capacity: int) -> dict[str, PinnedDim]:
    """symbol -> its value for a decode step at ``capacity`` past rows; symbols no rule
    knows are absent."""
    names = symbols(model)
    out: dict[str, PinnedDim] = {}
    for s in names:
        if re.fullmatch(r"[A-Za-z_]\w*|\s*\d+\s*", s):
            pinned = _by_name(s, capacity)
            if pinned is not None:
                out[s] = pinned
    for s, pinned in _from_graph(model, capacity).items():
        out.setdefault(s, pinned)
    for s in names:
        if s not in out:
            v = _evaluate(s, {k: p.value for k, p in out.items()})
            if v is not None and v > 0:
                out[s] = PinnedDim(v, "expression")
    return out


#: ops whose output's last axis is their first input's (element-wise, norms, rotary)
_SAME_WIDTH = frozenset({"Add", "Cast", "Identity", "Mul", "SimplifiedLayerNormalization",
                         "LayerNormalization", "RMSNormalization", "RotaryEmbedding",
                         "MRotaryEmbedding"})


def _from_graph(model: onnx.ModelProto, capacity: int) -> dict[str, PinnedDim]:
    """Symbols whose names say nothing, resolved from the graph's structure:

    - ``s + 1`` or ``s + <new tokens>`` written for an output: ``s`` is a past length (the
      capacity); torch.export names it ``s53``;
    - the head-size axis of a GroupQueryAttention's past key/value (genai's ``kv_cache_dim``):
      the query's width over its heads (packed q/k/v: over q + 2 kv heads);
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
    producer: dict[str, onnx.NodeProto] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
        for o in n.output:
            producer[o] = n
    inits = {t.name: t for t in g.initializer}

    def last_symbol(name: str) -> str | None:
        dims = inputs[name].type.tensor_type.shape.dim if name in inputs else []
        return dims[-1].dim_param or None if dims and not dims[-1].HasField("dim_value") else None

    def width(name: str) -> int | None:  # the last axis of a value, from what produced it
        if name in inits:
            return int(inits[name].dims[-1])
        n = producer.get(name)
        if n is None:
            return None
        if n.op_type == "MatMul" and n.input[1] in inits:
            return int(inits[n.input[1]].dims[-1])
        if n.op_type == "MatMulNBits":
            return next((a.i for a in n.attribute if a.name == "N"), None)
        if n.op_type == "Reshape" and (shape := constant(n.input[1])) is not None \
                and len(shape) and shape[-1] > 0:
            return int(shape[-1])
        if n.op_type in _SAME_WIDTH:
            return width(next((i for i in n.input if i not in inits), n.input[0]))
        return None

    def constant(name: str) -> list[int] | None:
        if name in inits:
            return numpy_helper.to_array(inits[name]).reshape(-1).tolist()
        n = producer.get(name)
        if n is not None and n.op_type == "Constant" and n.attribute and n.attribute[0].HasField("t"):
            return numpy_helper.to_array(n.attribute[0].t).reshape(-1).tolist()
        return None

    for n in g.node:
        if n.op_type == "GroupQueryAttention" and len(n.input) > 4:
            attrs = {a.name: a.i for a in n.attribute}
            heads, kv = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
            w = width(n.input[0])
            packed = len(n.input) < 2 or not n.input[1]
            size = w // (heads + 2 * kv if packed else heads) if w and heads else None
            for past in n.input[3:5]:
                if size and (s := last_symbol(past)):
                    out.setdefault(s, PinnedDim(size, "head size (GroupQueryAttention)"))
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
