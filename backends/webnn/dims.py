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

import onnx

_NEW_TOKENS = re.compile(r"^(sequence_length|seq_len|sequence|seq|seqlen|query_length|"
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
    if "past" in low or "cache" in low:
        return PinnedDim(capacity, "past = capacity")
    if _NEW_TOKENS.match(name):
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
    for s in names:
        if s not in out:
            v = _evaluate(s, {k: p.value for k, p in out.items()})
            if v is not None and v > 0:
                out[s] = PinnedDim(v, "expression")
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
