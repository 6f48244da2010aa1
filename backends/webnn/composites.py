"""WebNN ops this implementation lowers to others when the graph is built, each by the
spec's own decomposition (its "emulation" notes): the lowered graph computes the same
values, and the element-wise fusion then makes one kernel of most of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import op_limits
from . import shapes as S

if TYPE_CHECKING:
    from ._classes import MLGraphBuilder, MLOperand


def _filled(b: MLGraphBuilder, like: MLOperand, shape: Sequence[int], value: float) -> MLOperand:
    return b.constant(data_type=like.data_type, shape=list(shape),
                      value=np.full(S.size(shape), value, like._dtype.host))


def triangular(b: MLGraphBuilder, x: MLOperand, upper: bool, diagonal: int) -> MLOperand:
    """The upper (``col - row >= diagonal``) or lower (``col - row <= diagonal``) triangle of
    the last two axes, the rest zero: ``where(mask, x, 0)`` with the mask a constant."""
    b._own(x)
    if len(x._shape) < 2:
        raise TypeError("triangular needs an input of rank >= 2")
    rows, cols = x._shape[-2:]
    d = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    mask = (d >= diagonal) if upper else (d <= diagonal)
    m = b.constant(data_type="uint8", shape=[rows, cols], value=mask.astype(np.uint8))
    return b.where(m, x, _filled(b, x, [], 0))


def tile(b: MLGraphBuilder, x: MLOperand, repetitions: Sequence[int]) -> MLOperand:
    """Each axis ``d`` repeated ``r`` times as a view of shape (1, d) expanded to (r, d)."""
    b._own(x)
    reps = [int(r) for r in repetitions]
    if len(reps) != len(x._shape) or any(r < 1 for r in reps):
        raise TypeError(f"tile needs one repetition >= 1 per axis, got {reps}")
    view = [v for d in x._shape for v in (1, d)]
    wide = [v for r, d in zip(reps, x._shape, strict=True) for v in (r, d)]
    out = b.expand(b.reshape(x, view), wide)
    return b.reshape(out, [r * d for r, d in zip(reps, x._shape, strict=True)])


def pad(b: MLGraphBuilder, x: MLOperand, begin: Sequence[int], end: Sequence[int], mode: str,
        value: float) -> MLOperand:
    """Constant padding: per axis, ``concat([value block, x, value block])``; "edge" and
    "reflection": one ``pad`` node (``kernels/movement.pad``)."""
    b._own(x)
    op_limits.check("pad", [x])
    r = len(x._shape)
    if len(begin) != r or len(end) != r or any(int(p) < 0 for p in (*begin, *end)):
        raise TypeError("pad needs one non-negative beginning and ending padding per axis")
    if mode not in ("constant", "edge", "reflection"):
        raise TypeError(f"pad mode {mode!r} is not one of 'constant', 'edge', 'reflection'")
    if mode == "reflection" and any(int(p) >= d for p, d in zip((*begin, *end), x._shape * 2,
                                                                 strict=True)):
        raise TypeError(f"reflection padding {list(begin)}, {list(end)} must be shorter than "
                        f"each axis of {list(x._shape)}")
    if mode != "constant":
        if not any(int(p) for p in (*begin, *end)):
            return b.identity(x)
        shp = tuple(d + int(p) + int(q) for d, p, q in zip(x._shape, begin, end, strict=True))
        return b._node("pad", (x,), x._dtype, shp, beginning=tuple(int(p) for p in begin),
                       mode=mode)
    value = _scalar(x, value, "pad value")
    out = x
    for ax in range(r):
        parts = []
        for count, where in ((int(begin[ax]), 0), (int(end[ax]), 1)):
            if count:
                shp = list(out._shape)
                shp[ax] = count
                parts.append((where, _filled(b, x, shp, value)))
        if parts:
            out = b.concat([p for w, p in parts if w == 0] + [out]
                           + [p for w, p in parts if w == 1], ax)
    return out


def split(b: MLGraphBuilder, x: MLOperand, splits: int | Sequence[int],
          axis: int) -> list[MLOperand]:
    """``splits`` equal parts (a number) or parts of the given sizes, as slices."""
    b._own(x)
    ax = S.axis(axis, len(x._shape))
    dim = x._shape[ax]
    if isinstance(splits, int):
        if splits < 1 or dim % splits:
            raise TypeError(f"split: {splits} parts do not divide axis {ax} of {dim}")
        sizes = [dim // splits] * splits
    else:
        sizes = [int(s) for s in splits]
        if sum(sizes) != dim or any(s < 1 for s in sizes):
            raise TypeError(f"split sizes {sizes} do not sum to axis {ax} of {dim}")
    out, start = [], 0
    for n in sizes:
        starts = [0] * len(x._shape)
        starts[ax] = start
        shp = list(x._shape)
        shp[ax] = n
        out.append(b.slice(x, starts, shp))
        start += n
    return out


def conv2d(b: MLGraphBuilder, x: MLOperand, w: MLOperand, padding: Sequence[int],
           strides: Sequence[int], dilations: Sequence[int], groups: int,
           bias: MLOperand | None) -> MLOperand:
    """A depthwise convolution (N, C, H, W) * (C, 1, kh, kw): per filter tap, the strided
    slice of the padded input it reads times the tap's per-channel weight, summed."""
    b._own(x, w)
    if len(x._shape) != 4 or len(w._shape) != 4:
        raise TypeError("conv2d needs 4-D input and filter (nchw, oihw)")
    n, c, h, wd = x._shape
    oc, per, kh, kw = w._shape
    if not (groups == c == oc and per == 1):
        raise TypeError("conv2d is implemented here for depthwise filters only (groups = input "
                        f"channels = output channels); got groups {groups}, input {list(x._shape)}, "
                        f"filter {list(w._shape)}")
    b._same_type(x, w)
    top, bottom, left, right = (int(p) for p in padding)
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilations)
    ho = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    wo = (wd + left + right - (kw - 1) * dw - 1) // sw + 1
    if ho < 1 or wo < 1:
        raise TypeError("conv2d output would be empty")
    xp = pad(b, x, [0, 0, top, left], [0, 0, bottom, right], "constant", 0) \
        if top or bottom or left or right else x
    acc = None
    for i in range(kh):
        for j in range(kw):
            tap = b.slice(xp, [0, 0, i * dh, j * dw], [n, c, (ho - 1) * sh + 1, (wo - 1) * sw + 1],
                          strides=[1, 1, sh, sw])
            wt = b.reshape(b.slice(w, [0, 0, i, j], [c, 1, 1, 1]), [1, c, 1, 1])
            term = b.mul(tap, wt)
            acc = term if acc is None else b.add(acc, term)
    if bias is not None:
        b._own(bias)
        if bias._shape != (c,):
            raise TypeError(f"conv2d bias must have shape [{c}]")
        acc = b.add(acc, b.reshape(bias, [1, c, 1, 1]))
    return acc


def _scalar(like: MLOperand, value: float, what: str) -> np.ndarray:
    """An MLNumber cast to ``like``'s data type (the spec's "casting" of an option): integer
    types take it truncated and clipped to their range."""
    host = np.dtype(like._dtype.host)
    if host.kind in "iu":
        info = np.iinfo(host)
        if not np.isfinite(value):
            raise TypeError(f"{what} {value} is not a {like._dtype.name} value")
        return np.array(min(max(int(value), info.min), info.max), host)
    return np.array(value, host)


def clamp(b: MLGraphBuilder, x: MLOperand, min_value: float | None,
          max_value: float | None) -> MLOperand:
    """``min(max(x, minValue), maxValue)``, each bound only where given (the spec's
    emulation); TypeError where minValue > maxValue once cast to x's type."""
    b._own(x)
    op_limits.check("clamp", [x])
    lo = None if min_value is None else _scalar(x, min_value, "clamp minValue")
    hi = None if max_value is None else _scalar(x, max_value, "clamp maxValue")
    if lo is not None and hi is not None and lo > hi:
        raise TypeError(f"clamp minValue {min_value} is greater than maxValue {max_value}")
    out = x if lo is not None or hi is not None else b.identity(x)
    if lo is not None:
        out = b.max(out, _filled(b, x, [], lo))
    if hi is not None:
        out = b.min(out, _filled(b, x, [], hi))
    return out


def leaky_relu(b: MLGraphBuilder, x: MLOperand, alpha: float) -> MLOperand:
    """``max(x, 0) + alpha * min(x, 0)`` (the spec's emulation: exact but for the one
    product's rounding; the fusion makes one kernel of it)."""
    b._own(x)
    op_limits.check("leaky_relu", [x])
    zero = _filled(b, x, [], 0)
    return b.add(b.max(x, zero), b.mul(b.min(x, zero), _filled(b, x, [], _scalar(x, alpha, "alpha"))))


def layer_normalization(b: MLGraphBuilder, x: MLOperand, scale: MLOperand | None,
                        bias: MLOperand | None, axes: Sequence[int] | None,
                        epsilon: float) -> MLOperand:
    """``(x - mean) / sqrt(variance + epsilon) * scale + bias`` over ``axes`` (default: all
    but the first), the spec's emulation; ``scale`` and ``bias`` have the input's sizes at
    ``axes``, in the order ``axes`` lists them."""
    given = [o for o in (scale, bias) if o is not None]
    b._own(x, *given)
    op_limits.check("layer_normalization", [x, scale, bias])
    r = len(x._shape)
    if axes is None:
        axs = tuple(range(1, r))
    else:
        axs = tuple(axes)
        if (any(not isinstance(a, int) or not 0 <= a < r for a in axs)
                or len(set(axs)) != len(axs)):
            raise TypeError(f"layerNormalization axes {list(axs)} must be distinct, in [0, {r})")
    for name, o in (("scale", scale), ("bias", bias)):
        if o is None:
            continue
        if o._dtype != x._dtype:
            raise TypeError(f"layerNormalization {name} is {o.data_type}, the input "
                            f"{x.data_type}")
        if o._shape != tuple(x._shape[a] for a in axs):
            raise TypeError(f"layerNormalization {name} shape {list(o._shape)} is not the "
                            f"input's sizes at axes {list(axs)}")
    mean = b.reduce_mean(x, list(axs), keep_dimensions=True)
    d = b.sub(x, mean)
    var = b.reduce_mean(b.mul(d, d), list(axs), keep_dimensions=True)
    eps = _filled(b, x, [], _scalar(x, epsilon, "epsilon"))
    y = b.div(d, b.sqrt(b.add(var, eps)))
    view = [x._shape[i] if i in axs else 1 for i in range(r)]
    for o, combine in ((scale, b.mul), (bias, b.add)):
        if o is None:
            continue
        order = sorted(range(len(axs)), key=lambda k: axs[k])  # to the input's axis order
        if order != list(range(len(axs))):
            o = b.transpose(o, order)
        y = combine(y, b.reshape(o, view) if r else o)
    return y


def reduce_sum_square(b: MLGraphBuilder, x: MLOperand, axes: Sequence[int] | None,
                      keep: bool) -> MLOperand:
    """``reduceSum(x * x)``: the square is computed inside the reduction (a host)."""
    b._own(x)
    op_limits.check("reduce_sum_square", [x])
    return b.reduce_sum(b.mul(x, x), axes, keep)


def reduce_l2(b: MLGraphBuilder, x: MLOperand, axes: Sequence[int] | None,
              keep: bool) -> MLOperand:
    """``sqrt(reduceSumSquare(x))`` (the spec's emulation)."""
    b._own(x)
    op_limits.check("reduce_l2", [x])
    return b.sqrt(reduce_sum_square(b, x, axes, keep))


def reduce_log_sum_exp(b: MLGraphBuilder, x: MLOperand, axes: Sequence[int] | None,
                       keep: bool) -> MLOperand:
    """``log(reduceSum(exp(x)))`` computed as ``m + log(reduceSum(exp(x - m)))`` with
    ``m = reduceMax(x)``: the same value, without exp overflowing beyond x ~ 88."""
    b._own(x)
    op_limits.check("reduce_log_sum_exp", [x])
    m = b.reduce_max(x, axes, keep_dimensions=True)
    s = b.reduce_sum(b.exp(b.sub(x, m)), axes, keep_dimensions=True)
    out = b.add(b.log(s), m)
    if keep:
        return out
    axs = S.axes(axes, len(x._shape))
    return b.reshape(out, [d for i, d in enumerate(x._shape) if i not in axs])


def _in_float32(b: MLGraphBuilder, xs: Sequence[MLOperand | None], fn) -> MLOperand:
    """``fn(*xs)`` where the operands are float32; float16 ones widened first and the result
    rounded to float16 once (as the context runs the ops it widens, ``_widened``) rather
    than after each op of the emulation, whose roundings add up past WPT's few ULP."""
    first = xs[0]
    if first._dtype.name != "float16":
        return fn(*xs)
    out = fn(*(None if x is None else b._wide(x) for x in xs))
    narrow = b.cast(out, "float16")
    b._narrowed.add(narrow._id)
    return narrow


def _number(x: MLOperand, value: float, what: str) -> float:
    """An option cast to ``x``'s data type (the spec's "casting"), as a Python number."""
    return _scalar(x, value, what).item()


def elu(b: MLGraphBuilder, x: MLOperand, alpha: float) -> MLOperand:
    """``max(x, 0) + alpha * (exp(min(x, 0)) - 1)`` (the spec's emulation)."""
    b._own(x)
    op_limits.check("elu", [x])
    a = _number(x, alpha, "alpha")

    def f(v: MLOperand) -> MLOperand:
        zero = _filled(b, v, [], 0)
        em1 = b.sub(b.exp(b.min(v, zero)), _filled(b, v, [], 1))
        return b.add(b.max(v, zero), b.mul(em1, _filled(b, v, [], a)))
    return _in_float32(b, [x], f)


def hard_sigmoid(b: MLGraphBuilder, x: MLOperand, alpha: float, beta: float) -> MLOperand:
    """``max(min(alpha * x + beta, 1), 0)`` (the spec's emulation)."""
    b._own(x)
    op_limits.check("hard_sigmoid", [x])
    a, c = _number(x, alpha, "alpha"), _number(x, beta, "beta")

    def f(v: MLOperand) -> MLOperand:
        y = b.add(b.mul(v, _filled(b, v, [], a)), _filled(b, v, [], c))
        return b.max(b.min(y, _filled(b, v, [], 1)), _filled(b, v, [], 0))
    return _in_float32(b, [x], f)


def hard_swish(b: MLGraphBuilder, x: MLOperand) -> MLOperand:
    """``x * max(0, min(6, x + 3)) / 6`` (the spec's emulation)."""
    b._own(x)
    op_limits.check("hard_swish", [x])

    def f(v: MLOperand) -> MLOperand:
        gate = b.max(b.min(b.add(v, _filled(b, v, [], 3)), _filled(b, v, [], 6)),
                     _filled(b, v, [], 0))
        return b.div(b.mul(v, gate), _filled(b, v, [], 6))
    return _in_float32(b, [x], f)


def softsign(b: MLGraphBuilder, x: MLOperand) -> MLOperand:
    """``x / (1 + |x|)`` (the spec's emulation)."""
    b._own(x)
    op_limits.check("softsign", [x])
    return _in_float32(b, [x], lambda v: b.div(v, b.add(b.abs(v), _filled(b, v, [], 1))))


def linear(b: MLGraphBuilder, x: MLOperand, alpha: float, beta: float) -> MLOperand:
    """``alpha * x + beta`` (the spec's emulation)."""
    b._own(x)
    op_limits.check("linear", [x])
    a, c = _number(x, alpha, "alpha"), _number(x, beta, "beta")
    return _in_float32(b, [x], lambda v: b.add(b.mul(v, _filled(b, v, [], a)),
                                               _filled(b, v, [], c)))


def prelu(b: MLGraphBuilder, x: MLOperand, slope: MLOperand) -> MLOperand:
    """``max(x, 0) + slope * min(x, 0)``, the two broadcast bidirectionally (the spec's
    emulation)."""
    b._own(x, slope)
    op_limits.check("prelu", [x, slope])
    b._same_type(x, slope)
    S.broadcast(x._shape, slope._shape)  # TypeError where they do not broadcast

    def f(v: MLOperand, s: MLOperand) -> MLOperand:
        zero = _filled(b, v, [], 0)
        return b.add(b.max(v, zero), b.mul(s, b.min(v, zero)))
    return _in_float32(b, [x, slope], f)


def reduce_l1(b: MLGraphBuilder, x: MLOperand, axes: Sequence[int] | None,
              keep: bool) -> MLOperand:
    """``reduceSum(abs(x))`` (the spec's emulation; the abs is computed by the reduction)."""
    b._own(x)
    op_limits.check("reduce_l1", [x])
    return b.reduce_sum(b.abs(x), axes, keep)


def reduce_log_sum(b: MLGraphBuilder, x: MLOperand, axes: Sequence[int] | None,
                   keep: bool) -> MLOperand:
    """``log(reduceSum(x))`` (the spec's emulation)."""
    b._own(x)
    op_limits.check("reduce_log_sum", [x])
    return b.log(b.reduce_sum(x, axes, keep))


def _per_channel(op: str, x: MLOperand, axis: int,
                 named: Sequence[tuple[str, MLOperand | None]]) -> None:
    """TypeError unless each given operand is x's data type with shape [x.shape[axis]]."""
    for name, o in named:
        if o is None:
            continue
        if o._dtype != x._dtype:
            raise TypeError(f"{op}: {name} is {o.data_type}, the input {x.data_type}")
        if o._shape != (x._shape[axis],):
            raise TypeError(f"{op}: {name} shape {list(o._shape)} is not "
                            f"[{x._shape[axis]}] (the input's axis {axis})")


def _normalized(b: MLGraphBuilder, d: MLOperand, var: MLOperand, eps: float,
                scale: MLOperand | None, bias: MLOperand | None, view: list[int]) -> MLOperand:
    """``scale * d / sqrt(var + eps) + bias``, scale and bias reshaped to ``view``."""
    y = b.div(d, b.sqrt(b.add(var, _filled(b, d, [], eps))))
    if scale is not None:
        y = b.mul(b.reshape(scale, view), y)
    if bias is not None:
        y = b.add(y, b.reshape(bias, view))
    return y


def batch_normalization(b: MLGraphBuilder, x: MLOperand, mean: MLOperand, variance: MLOperand,
                        scale: MLOperand | None, bias: MLOperand | None, axis: int,
                        epsilon: float) -> MLOperand:
    """``scale * (x - mean) / sqrt(variance + epsilon) + bias``, the per-feature operands
    broadcast along ``axis`` (the spec's emulation, for any rank and axis)."""
    b._own(x, mean, variance, *(o for o in (scale, bias) if o is not None))
    op_limits.check("batch_normalization", [x, mean, variance, scale, bias])
    r = len(x._shape)
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < r:
        raise TypeError(f"batchNormalization: axis {axis!r} is not in [0, {r})")
    _per_channel("batchNormalization", x, axis,
                 [("mean", mean), ("variance", variance), ("scale", scale), ("bias", bias)])
    eps = _number(x, epsilon, "epsilon")
    view = [x._shape[axis] if i == axis else 1 for i in range(r)]

    def f(v: MLOperand, m: MLOperand, var: MLOperand, s: MLOperand | None,
          c: MLOperand | None) -> MLOperand:
        return _normalized(b, b.sub(v, b.reshape(m, view)), b.reshape(var, view), eps, s, c,
                           view)
    return _in_float32(b, [x, mean, variance, scale, bias], f)


def instance_normalization(b: MLGraphBuilder, x: MLOperand, scale: MLOperand | None,
                           bias: MLOperand | None, epsilon: float, layout: str) -> MLOperand:
    """Per sample and channel, ``scale * (x - mean) / sqrt(variance + epsilon) + bias`` with
    the mean and variance over the spatial axes (the spec's emulation; "nhwc" reduces axes
    1 and 2 and takes the channel from axis 3)."""
    b._own(x, *(o for o in (scale, bias) if o is not None))
    op_limits.check("instance_normalization", [x, scale, bias])
    if layout not in ("nchw", "nhwc"):
        raise TypeError(f"instanceNormalization layout {layout!r} is not 'nchw' or 'nhwc'")
    axis = 1 if layout == "nchw" else 3
    _per_channel("instanceNormalization", x, axis, [("scale", scale), ("bias", bias)])
    eps = _number(x, epsilon, "epsilon")
    spatial = [2, 3] if layout == "nchw" else [1, 2]
    view = [x._shape[axis] if i == axis else 1 for i in range(4)]

    def f(v: MLOperand, s: MLOperand | None, c: MLOperand | None) -> MLOperand:
        d = b.sub(v, b.reduce_mean(v, spatial, keep_dimensions=True))
        var = b.reduce_mean(b.mul(d, d), spatial, keep_dimensions=True)
        return _normalized(b, d, var, eps, s, c, view)
    return _in_float32(b, [x, scale, bias], f)
