"""ONNX ops on runtime values that real exports carry (trig for rotary tables, masks as
bool logic, Split, Trilu, Tile, Pad, CumSum, ScatterElements, depthwise Conv), each as the
WebNN op it maps to, as ORT's WebNN EP maps them. Registered into ``convert_core``'s
handler table on import; every op here also folds on the host when its inputs are known
at conversion time."""

from __future__ import annotations

import numpy as np

from .convert_core import FOLDABLE, ConversionError, Converter, handles

FOLDABLE.update({"Cos", "Sin", "IsNaN", "Split", "Trilu", "Tile", "Pad", "CumSum",
                  "ScatterElements", "LpNormalization", "ArgMax", "ArgMin"})


def _name(node) -> str:
    return node.name or node.output[0]


def _optional_const(c: Converter, node, i: int, what: str) -> np.ndarray | None:
    return c.const_input(node, i, what) if len(node.input) > i and node.input[i] else None


@handles("Cos", "Sin")
def _trig(c: Converter, node, attrs):
    return getattr(c.builder, node.op_type.lower())(c.operand(node.input[0]))


@handles("IsNaN")
def _is_nan(c: Converter, node, attrs):
    return c.builder.is_nan(c.operand(node.input[0]))


@handles("ArgMax", "ArgMin")
def _arg(c: Converter, node, attrs):
    """WebNN argMax / argMin (int64 indices, the first of tied ones); select_last_index=1
    as ``n - 1`` less the first index along the axis reversed (a gather)."""
    b = c.builder
    x = c.operand(node.input[0])
    rank = len(c.shape(x))
    if rank == 0:
        raise ConversionError(f"{node.op_type} node {_name(node)!r}: a scalar input has no axis")
    axis = int(attrs.get("axis", 0)) % rank
    fn = b.arg_max if node.op_type == "ArgMax" else b.arg_min
    keep = bool(attrs.get("keepdims", 1))
    if not attrs.get("select_last_index", 0):
        return fn(x, axis, keep_dimensions=keep, output_data_type="int64")
    n = c.shape(x)[axis]
    rev = b.constant(data_type="int32", shape=[n], value=np.arange(n - 1, -1, -1, dtype=np.int32))
    first = fn(b.gather(x, rev, axis=axis), axis, keep_dimensions=keep, output_data_type="int64")
    return b.sub(b.constant(data_type="int64", shape=[], value=np.int64(n - 1)), first)


@handles("Not")
def _not(c: Converter, node, attrs):
    return c.builder.logical_not(c.operand(node.input[0]))


@handles("And", "Or")
def _logical(c: Converter, node, attrs):
    fn = c.builder.logical_and if node.op_type == "And" else c.builder.logical_or
    return fn(c.operand(node.input[0]), c.operand(node.input[1]))


@handles("LpNormalization")
def _lp_normalization(c: Converter, node, attrs):
    """x / ||x||_p along ``axis``: p = 2 as sqrt(reduce_sum(x * x)), p = 1 as
    reduce_sum(abs(x)) (ORT's WebNN EP decomposes it the same way)."""
    b = c.builder
    x = c.operand(node.input[0])
    axis = attrs.get("axis", -1) % len(c.shape(x))
    p = attrs.get("p", 2)
    if p == 2:
        norm = b.sqrt(b.reduce_sum(b.mul(x, x), axes=[axis], keep_dimensions=True))
    elif p == 1:
        norm = b.reduce_sum(b.abs(x), axes=[axis], keep_dimensions=True)
    else:
        raise ConversionError(f"LpNormalization node {_name(node)!r}: p must be 1 or 2, got {p}")
    return b.div(x, norm)


@handles("Split")
def _split(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    axis = attrs.get("axis", 0) % len(c.shape(x))
    sizes = _optional_const(c, node, 1, "split") if c.opset >= 13 else attrs.get("split")
    outs = [o for o in node.output]
    if sizes is not None and len(sizes):
        splits: int | list[int] = [int(s) for s in np.asarray(sizes).tolist()]
    elif "num_outputs" in attrs:  # opset 18: the last part may be smaller
        k, dim = int(attrs["num_outputs"]), c.shape(x)[axis]
        per = -(-dim // k)
        splits = [per] * (dim // per) + ([dim % per] if dim % per else [])
    else:
        splits = len(outs)
    if isinstance(splits, list) and 0 in splits:  # an empty part is its shape alone
        shape = list(c.shape(x))
        parts = iter(c.builder.split(x, [s for s in splits if s], axis)
                     if len([s for s in splits if s]) > 1 else [x])
        return [c.empty_like(x, shape[:axis] + [0] + shape[axis + 1:]) if not s else next(parts)
                for s in splits]
    try:
        return c.builder.split(x, splits, axis)
    except TypeError as exc:
        raise ConversionError(f"Split node {_name(node)!r}: {exc}") from None


@handles("Trilu")
def _trilu(c: Converter, node, attrs):
    k = _optional_const(c, node, 1, "k")
    return c.builder.triangular(c.operand(node.input[0]), upper=bool(attrs.get("upper", 1)),
                                diagonal=int(k) if k is not None else 0)


@handles("Tile")
def _tile(c: Converter, node, attrs):
    reps = c.const_input(node, 1, "repeats")
    return c.builder.tile(c.operand(node.input[0]), [int(r) for r in reps.tolist()])


@handles("Pad")
def _pad(c: Converter, node, attrs):
    """Constant mode; negative pads (crops) become a slice first, since WebNN's padding is
    unsigned."""
    b = c.builder
    x = c.operand(node.input[0])
    rank = len(c.shape(x))
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant":
        raise ConversionError(f"Pad node {_name(node)!r}: mode {mode!r} is not supported "
                              "(constant only)")
    if c.opset >= 11:
        pads = [int(p) for p in c.const_input(node, 1, "pads").tolist()]
        value = _optional_const(c, node, 2, "constant_value")
        axes = _optional_const(c, node, 3, "axes")
    else:
        pads, value, axes = list(attrs["pads"]), attrs.get("value", 0.0), None
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes.tolist()]
    begin, end = [0] * rank, [0] * rank
    for j, ax in enumerate(axes):
        begin[ax], end[ax] = pads[j], pads[j + len(axes)]
    if any(p < 0 for p in begin + end):
        shp = c.shape(x)
        starts = [max(-p, 0) for p in begin]
        sizes = [d - max(-p, 0) - max(-q, 0) for d, p, q in zip(shp, begin, end, strict=True)]
        x = b.slice(x, starts, sizes)
        begin, end = [max(p, 0) for p in begin], [max(p, 0) for p in end]
    fill = float(np.asarray(value).reshape(-1)[0]) if value is not None and np.size(value) else 0
    return b.pad(x, begin, end, mode="constant", value=fill)


@handles("CumSum")
def _cumsum(c: Converter, node, attrs):
    x = c.operand(node.input[0])
    axis = int(np.asarray(c.const_input(node, 1, "axis")).reshape(-1)[0]) % len(c.shape(x))
    return c.builder.cumulative_sum(x, axis, exclusive=bool(attrs.get("exclusive", 0)),
                                    reversed=bool(attrs.get("reverse", 0)))


@handles("ScatterElements")
def _scatter_elements(c: Converter, node, attrs):
    red = attrs.get("reduction", b"none")
    if red not in (b"none", "none"):
        raise ConversionError(f"ScatterElements node {_name(node)!r}: reduction {red!r} is not "
                              "supported")
    if c.is_empty(node.input[1]) or c.is_empty(node.input[2]):  # no update: the data as it is
        name = node.input[0]
        return c.consts[name] if name in c.consts else c.operand(name)
    x = c.operand(node.input[0])
    return c.builder.scatter_elements(x, c.operand(node.input[1]), c.operand(node.input[2]),
                                      axis=attrs.get("axis", 0) % len(c.shape(x)))


@handles("GatherElements")
def _gather_elements(c: Converter, node, attrs):
    """Negative indices count from the end in both; ONNX's out-of-range ones are errors."""
    x = c.operand(node.input[0])
    return c.builder.gather_elements(x, c.operand(node.input[1]),
                                     axis=attrs.get("axis", 0) % len(c.shape(x)))


@handles("GatherND")
def _gather_nd(c: Converter, node, attrs):
    if attrs.get("batch_dims", 0):
        raise ConversionError(f"GatherND node {_name(node)!r}: batch_dims "
                              f"{attrs['batch_dims']} is not supported")
    return c.builder.gather_nd(c.operand(node.input[0]), c.operand(node.input[1]))


@handles("Conv")
def _conv(c: Converter, node, attrs):
    """Depthwise 1-D and 2-D convolutions (group = channels) as WebNN conv2d, 1-D ones
    viewed with a height of 1."""
    b = c.builder
    x, w = c.operand(node.input[0]), c.operand(node.input[1])
    xs, ws = c.shape(x), c.shape(w)
    spatial = len(xs) - 2
    auto = attrs.get("auto_pad", b"NOTSET")
    if auto not in (b"NOTSET", "NOTSET") or spatial not in (1, 2):
        raise ConversionError(f"Conv node {_name(node)!r}: only 1-D and 2-D convolutions with "
                              "explicit pads are supported")
    pads = list(attrs.get("pads", [0] * 2 * spatial))
    strides = list(attrs.get("strides", [1] * spatial))
    dil = list(attrs.get("dilations", [1] * spatial))
    if spatial == 1:
        x = b.reshape(x, [xs[0], xs[1], 1, xs[2]])
        w = b.reshape(w, [ws[0], ws[1], 1, ws[2]])
        padding, strides, dil = [0, 0, pads[0], pads[1]], [1, strides[0]], [1, dil[0]]
    else:
        padding = [pads[0], pads[2], pads[1], pads[3]]
    bias = c.operand(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    try:
        y = b.conv2d(x, w, padding=padding, strides=strides, dilations=dil,
                     groups=int(attrs.get("group", 1)), bias=bias)
    except TypeError as exc:
        raise ConversionError(f"Conv node {_name(node)!r}: {exc}") from None
    if spatial == 1:
        ys = c.shape(y)
        y = b.reshape(y, [ys[0], ys[1], ys[3]])
    return y
