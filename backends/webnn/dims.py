"""Symbolic dimensions of an exported decoder pinned to numbers, so WebNN (static shapes
only) can build it: batch 1, K new tokens (a decode step pins K = 1), the past at a
capacity, the total ``capacity + K``.

Real exporters name their dynamic dimensions (``batch_size``, ``sequence_length``,
``past_sequence_length``, ``total_sequence_length``), write numbers as strings (``"16"``)
and expressions (``past_sequence_length + 1``, torch.export's ``s53 + s70``); expressions
are parsed (``linear``), never matched as strings. A name that says nothing (torch.export's
``s53``, ``s70``) is resolved from how the graph uses it: the second axis of ``input_ids``
or ``position_ids`` is the new tokens' count (``new_token_dims``), a growing cache's axis is
the past (the pairs of ``list_kv_pairs``), an output's ``X + new`` makes ``X`` a past, a
conv window's width is its Conv's kernel (``_from_graph``); genai's ``kv_cache_dim`` names
every layer's head size alike, so it is resolved per past (``past_head_sizes``); one no rule
knows is left symbolic, for the converter to name. Each pinned dim says which rule gave it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

#: the name of the new tokens' count (K per step; a decode step pins K = 1)
NEW_TOKENS = re.compile(r"^(sequence_length|seq_len|sequence|seq|seqlen|query_length|"
                         r"input_sequence_length|num_tokens|tokens|new_tokens)$", re.IGNORECASE)
#: the new tokens a decode step feeds (K): later K-token verify graphs pin another K
DECODE_TOKENS = 1
#: inputs whose last axis counts the new tokens (input_ids [B, K]; position_ids [B, K] or
#: Qwen's [3, B, K])
NEW_TOKEN_INPUTS = ("input_ids", "position_ids")
_NAME = re.compile(r"[A-Za-z_]\w*")


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


def linear(expr: str) -> tuple[dict[str, int], int] | None:
    """``expr`` as a sum of integer multiples of symbols plus a constant (``"s53 + s70"`` ->
    ({s53: 1, s70: 1}, 0), ``"16"`` -> ({}, 16), ``"past + 1"`` -> ({past: 1}, 1)); None for
    anything else (a product of symbols, a division, not an expression)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        return None

    def walk(n: ast.AST) -> tuple[dict[str, int], int] | None:
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
            return {}, n.value
        if isinstance(n, ast.Name):
            return {n.id: 1}, 0
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            inner = walk(n.operand)
            return None if inner is None else ({k: -v for k, v in inner[0].items()}, -inner[1])
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = walk(n.left), walk(n.right)
            if a is None or b is None:
                return None
            if isinstance(n.op, ast.Mult):  # only a number times a form stays linear
                (fa, ca), (fb, cb) = (a, b) if not a[0] else (b, a)
                if fa:
                    return None
                return {k: ca * v for k, v in fb.items()}, ca * cb
            sign = 1 if isinstance(n.op, ast.Add) else -1
            coefs = dict(a[0])
            for k, v in b[0].items():
                coefs[k] = coefs.get(k, 0) + sign * v
            return {k: v for k, v in coefs.items() if v}, a[1] + sign * b[1]
        return None

    return walk(tree)


def new_token_dims(model: onnx.ModelProto) -> dict[int | str, str]:
    """The new tokens' count as the graph writes it -> where it was read: the last axis of
    ``input_ids`` / ``position_ids`` (a symbol such as ``s70`` or ``sequence_length``, or a
    number), and any symbol whose name says so (``NEW_TOKENS``)."""
    out: dict[int | str, str] = {}
    inputs = {i.name: i for i in model.graph.input}
    for name in NEW_TOKEN_INPUTS:
        dims = inputs[name].type.tensor_type.shape.dim if name in inputs else []
        if len(dims) >= 2:
            d = dims[-1]
            v = int(d.dim_value) if d.HasField("dim_value") else d.dim_param.strip()
            if isinstance(v, str) and v.isdigit():
                v = int(v)
            if v != "":
                out.setdefault(v, f"{name}[{len(dims) - 1}]")
    for s in symbols(model):
        if NEW_TOKENS.match(s):
            out.setdefault(s, "its name")
    return out


def batch_dims(model: onnx.ModelProto) -> dict[str, str]:
    """The batch as the graph writes it -> where it was read: the axis before the new
    tokens' of ``input_ids`` / ``position_ids`` (``[B, K]``, Qwen's ``[3, B, K]``), where
    it is a symbol (torch.export's ``s1``)."""
    out: dict[str, str] = {}
    inputs = {i.name: i for i in model.graph.input}
    for name in NEW_TOKEN_INPUTS:
        dims = inputs[name].type.tensor_type.shape.dim if name in inputs else []
        if len(dims) >= 2 and _NAME.fullmatch(d := dims[-2].dim_param.strip()):
            out.setdefault(d, f"{name}[{len(dims) - 2}]")
    return out


def _by_name(name: str, capacity: int, k: int) -> PinnedDim | None:
    """What a symbol's own name says (batch, past, the total, the new tokens)."""
    low = name.lower()
    if "batch" in low:
        return PinnedDim(1, "batch 1")
    if ("past" in low or "cache" in low) and "dim" not in low:  # not genai's kv_cache_dim
        return PinnedDim(capacity, "past = capacity")
    if NEW_TOKENS.match(name):
        return PinnedDim(k, f"new tokens K = {k} (by name)")
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


def _pairs_of(model: onnx.ModelProto, pairs) -> list:
    """The caller's pairs, else those the names give (none where the names give an error)."""
    if pairs is not None:
        return list(pairs)
    from .onnx_converter import ConversionError, list_kv_pairs  # the converter imports this module

    try:
        return list_kv_pairs(model)
    except ConversionError:
        return []


def default_dims(model: onnx.ModelProto, capacity: int, pairs: Sequence | None = None,
                 new_tokens: int = DECODE_TOKENS) -> dict[str, PinnedDim]:
    """symbol -> its value for a step of ``new_tokens`` (K) new tokens at ``capacity`` past
    rows; symbols no rule knows are absent. ``pairs``: ``list_kv_pairs``' pairs (found from
    the names where not given): a growing cache's past axis is the past whatever its symbol
    is called (transformers' ``s53``), its present's the past plus its new rows."""
    k = new_tokens
    names = symbols(model)
    forms = {s: linear(s) for s in names}
    out: dict[str, PinnedDim] = {}
    for s, form in forms.items():
        if form is not None and not form[0] and form[1] > 0:
            out[s] = PinnedDim(form[1], "a number")
    for v, where in new_token_dims(model).items():
        if isinstance(v, str) and v in forms and v not in out and _NAME.fullmatch(v):
            out[v] = PinnedDim(k, f"new tokens K = {k} ({where})")
    for s in names:
        if s not in out and _NAME.fullmatch(s) and (pinned := _by_name(s, capacity, k)):
            out[s] = pinned
    for s in names:
        if s not in out and "total" in s.lower() and _NAME.fullmatch(s):
            out[s] = PinnedDim(capacity + k, f"past + {k} new token{'s' * (k > 1)}")
    for b, where in batch_dims(model).items():
        if b not in out:
            out[b] = PinnedDim(1, f"batch 1 ({where})")
    inputs = {i.name: i for i in model.graph.input}
    outputs = {o.name: o for o in model.graph.output}
    for p in _pairs_of(model, pairs):
        if p.kind != "append" or p.input not in inputs:
            continue
        past = inputs[p.input].type.tensor_type.shape.dim[p.axis].dim_param
        if _NAME.fullmatch(past.strip()) and past not in out:
            out[past] = PinnedDim(capacity, f"past = capacity ({p.input} axis {p.axis} grows)")
        present = outputs[p.output].type.tensor_type.shape.dim[p.axis].dim_param
        rows = _rows(getattr(p, "new", None), out, k)
        if _NAME.fullmatch(present.strip()) and present not in out and rows is not None:
            out[present] = PinnedDim(capacity + rows,
                                     f"past + new = capacity + {rows} ({p.output} axis {p.axis})")
    for s, pinned in _from_graph(model, capacity, out).items():
        out.setdefault(s, pinned)
    for s in names:
        if s not in out:
            v = _evaluate(s, {x: p.value for x, p in out.items()})
            if v is not None and v > 0:
                out[s] = PinnedDim(v, "expression")
    if any(s not in out for s in names):
        out.update(_attention_widths(model, {x: p.value for x, p in out.items()}, names))
    return out


def _rows(new: int | str | None, known: Mapping[str, PinnedDim], k: int) -> int | None:
    """A pair's new rows per step as a number: a number as it is, the new-token symbol as
    pinned (K), unknown (None: the pair named no new-token dim) as K."""
    if isinstance(new, int):
        return new
    if new is None:
        return k
    return known[new].value if new in known else None


def rows_per_step(pair, dims: Mapping[str, int]) -> int | None:
    """The rows an append pair gains a step with ``dims`` pinned (K for the new-token dim);
    None for an overwrite pair or a new-token dim not pinned."""
    if pair.kind != "append":
        return None
    new = getattr(pair, "new", None)
    if isinstance(new, int):
        return new
    return dims.get(new) if new is not None else DECODE_TOKENS


def _from_graph(model: onnx.ModelProto, capacity: int,
                known: Mapping[str, PinnedDim]) -> dict[str, PinnedDim]:
    """Symbols whose names say nothing, resolved from the graph's structure:

    - an output's axis written ``X + c`` or ``X + new`` (``new`` a pinned new-token symbol,
      ``c`` a number; parsed, ``linear``): ``X`` is a past length (the capacity); torch.export
      names it ``s53`` (``s53 + 1``, ``s53 + s70``);
    - the last axis of an input concatenated on that axis into a Conv's input (a causal-conv
      window, transformers' ``[B, conv_dim, s84]``): the Conv's kernel width.
    """
    g = model.graph
    out: dict[str, PinnedDim] = {}
    news = {v for v, w in new_token_dims(model).items() if isinstance(v, str)}
    for vi in g.output:
        for d in vi.type.tensor_type.shape.dim:
            form = linear(d.dim_param) if d.dim_param else None
            if form is None:
                continue
            unknown = [x for x in form[0] if x not in known and x not in news]
            rest = {x: c for x, c in form[0].items() if x not in unknown}
            if len(unknown) == 1 and form[0][unknown[0]] == 1 and (rest or form[1] > 0) \
                    and all(c == 1 for c in rest.values()):
                out.setdefault(unknown[0], PinnedDim(
                    capacity, f"past = capacity ({vi.name} is {d.dim_param.strip()}: past + new)"))
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
