"""WebNN ops this implementation lowers to others when the graph is built, each by the
spec's own decomposition (its "emulation" notes): the lowered graph computes the same
values, and the element-wise fusion then makes one kernel of most of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

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
    return b.where(m, x, _filled(b, x, [1], 0))


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
    """Constant padding: per axis, ``concat([value block, x, value block])``."""
    b._own(x)
    r = len(x._shape)
    if len(begin) != r or len(end) != r or any(int(p) < 0 for p in (*begin, *end)):
        raise TypeError("pad needs one non-negative beginning and ending padding per axis")
    if mode != "constant":
        raise TypeError(f"pad mode {mode!r} is not implemented here (constant only)")
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
