"""Shape inference, one small function per op family; TypeError where the spec says so."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Static shape, every dimension an int > 0 (the spec forbids 0-sized dimensions)."""
    try:
        out = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise TypeError(f"shape must be a sequence of integers, got {shape!r}") from None
    if any(d <= 0 for d in out) or any(int(d) != d for d in shape):
        raise TypeError(f"every dimension must be an integer > 0, got {list(shape)}")
    return out


def size(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides."""
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * shape[i + 1]
    return tuple(out)


def broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy-style bidirectional broadcasting."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise TypeError(f"shapes {[list(s) for s in shapes]} cannot be broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def unidirectional(src: Sequence[int], target: Sequence[int]) -> bool:
    """Whether ``src`` broadcasts to exactly ``target`` (expand's rule)."""
    if len(src) > len(target):
        return False
    try:
        return broadcast(src, target) == tuple(target)
    except TypeError:
        return False


def broadcast_strides(src: Sequence[int], out: Sequence[int]) -> tuple[int, ...]:
    """Strides to read ``src`` at output coordinates (0 on broadcast dimensions)."""
    st = strides(src)
    pad = len(out) - len(src)
    res = []
    for i in range(len(out)):
        j = i - pad
        res.append(0 if j < 0 or src[j] == 1 else st[j])
    return tuple(res)


def axis(ax: int, rank: int) -> int:
    if not isinstance(ax, int) or not -rank <= ax < max(rank, 1):
        raise TypeError(f"axis {ax!r} out of range for rank {rank}")
    return ax % max(rank, 1)


def axes(axs: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    if axs is None:
        return tuple(range(rank))
    out = tuple(axis(a, rank) for a in axs)
    if len(set(out)) != len(out):
        raise TypeError(f"duplicate axes {list(axs)}")
    return out


def matmul(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    if len(a) < 2 or len(b) < 2:
        raise TypeError("matmul needs inputs of rank >= 2")
    if a[-1] != b[-2]:
        raise TypeError(f"matmul inner dimensions differ: {list(a)} @ {list(b)}")
    return broadcast(a[:-2], b[:-2]) + (a[-2], b[-1])


def slice_shape(shape: Sequence[int], starts: Sequence[int], sizes: Sequence[int],
                steps: Sequence[int] | None) -> tuple[int, ...]:
    """The spec's slice: on each axis a window of ``sizes[d]`` input elements from
    ``starts[d]``, read every ``steps[d]``-th, so ``ceil(sizes[d] / steps[d])`` outputs."""
    r = len(shape)
    try:
        st = [int(s) for s in starts]
        sz = [int(s) for s in sizes]
        sd = [int(s) for s in steps] if steps is not None else [1] * r
    except (TypeError, ValueError):
        raise TypeError("slice starts, sizes and strides must be integers") from None
    if not len(st) == len(sz) == len(sd) == r:
        raise TypeError(f"slice starts/sizes/strides must each have the input's rank {r}")
    out = []
    for d in range(r):
        if sz[d] < 1:
            raise TypeError(f"slice size on axis {d} must be > 0, got {sz[d]}")
        if sd[d] < 1:
            raise TypeError(f"slice stride on axis {d} must be > 0, got {sd[d]}")
        if st[d] < 0 or st[d] + sz[d] > shape[d]:
            raise TypeError(f"slice window [{st[d]}, {st[d] + sz[d]}) is outside axis {d} of "
                            f"size {shape[d]}")
        out.append(-(-sz[d] // sd[d]))
    return tuple(out)


#: [EnforceRange] unsigned long; the spec's "valid dimension" is in [1, ULONG_MAX]
ULONG_MAX = (1 << 32) - 1


def pool2d(in_hw: Sequence[int], window: Sequence[int], padding: Sequence[int],
           strides: Sequence[int], dilations: Sequence[int], rounding: str,
           output_sizes: Sequence[int] | None) -> tuple[int, int]:
    """The spec's pooling output height and width ("calculate conv2d output sizes", then
    rounded, or ``output_sizes`` where it is the floor or the ceiling of both)."""
    num = [in_hw[k] - ((window[k] - 1) * dilations[k] + 1) + padding[2 * k] + padding[2 * k + 1]
           for k in (0, 1)]  # exact integers: num / stride + 1 rounded either way
    floor = tuple(num[k] // strides[k] + 1 for k in (0, 1))
    ceil = tuple(-(-num[k] // strides[k]) + 1 for k in (0, 1))
    if output_sizes is not None:
        out = tuple(output_sizes)
        if out not in (floor, ceil):
            raise TypeError(f"outputSizes {list(out)} is neither the floor {list(floor)} nor "
                            f"the ceiling {list(ceil)} of the computed output size")
    else:
        out = floor if rounding == "floor" else ceil
    if any(not 0 < d <= ULONG_MAX for d in out):
        raise TypeError(f"pooling output size {list(out)} is not a valid dimension (the "
                        f"window exceeds the padded input)")
    return out[0], out[1]


def ulongs(what: str, values: Sequence[int], n: int) -> tuple[int, ...]:
    """A ``sequence<[EnforceRange] unsigned long>`` option of length ``n``: integers in
    [0, 2^32), else TypeError (WebIDL's EnforceRange, then the op's length check)."""
    try:
        out = tuple(values)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of integers, got {values!r}") from None
    if len(out) != n:
        raise TypeError(f"{what} must have {n} items, got {list(out)}")
    return tuple(_ulong(what, v) for v in out)


def _ulong(what: str, v: object) -> int:
    """WebIDL's ``[EnforceRange] unsigned long``: a finite number, its integer part in
    [0, 2^32)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what}: {v!r} is not an unsigned long")
    if not np.isfinite(v):
        raise TypeError(f"{what}: {v!r} is not finite")
    n = int(v)  # the integer part
    if not 0 <= n <= ULONG_MAX:
        raise TypeError(f"{what}: {v!r} is out of the unsigned long range")
    return n


def _valid_dim(what: str, d: int) -> int:
    """The spec's "valid dimension": an integer in [1, 2^32)."""
    if not 1 <= d <= ULONG_MAX:
        raise TypeError(f"{what} {d} is not a valid dimension")
    return int(d)


def resample2d(shape: Sequence[int], scales: Sequence[float] | None,
               sizes: Sequence[int] | None, axes: Sequence[int] | None
               ) -> tuple[tuple[int, ...], tuple[int, int]]:
    """The resample2d output shape and its two axes (the spec's steps: scales positive, sizes
    non-zero and taking precedence, axes two distinct dimensions in any order)."""
    ax = ulongs("resample2d axes", axes, 2) if axes is not None else (2, 3)
    if ax[0] == ax[1] or any(a >= len(shape) for a in ax):
        raise TypeError(f"resample2d axes {list(ax)} are not two distinct axes of rank "
                        f"{len(shape)}")
    out = list(shape)
    if sizes is not None:
        sz = ulongs("resample2d sizes", sizes, 2)
        for a, s in zip(ax, sz, strict=True):
            out[a] = _valid_dim("resample2d size", s)
        return tuple(out), ax
    if scales is None:
        scales = (1.0, 1.0)
    sc = tuple(scales)
    if len(sc) != 2:
        raise TypeError(f"resample2d scales must have 2 items, got {list(sc)}")
    for a, s in zip(ax, sc, strict=True):
        f = float(np.float32(s))  # an IDL float
        if not np.isfinite(f) or f <= 0:
            raise TypeError(f"resample2d scale {s!r} is not a positive float")
        out[a] = _valid_dim("resample2d output size", int(np.floor(shape[a] * f)))
    return tuple(out), ax


def conv_transpose2d(in_shape: Sequence[int], w_shape: Sequence[int], padding: Sequence[int],
                     strides: Sequence[int], dilations: Sequence[int],
                     output_padding: Sequence[int], output_sizes: Sequence[int] | None,
                     groups: int, input_layout: str, filter_layout: str
                     ) -> tuple[tuple[int, ...], tuple[int, int, int, int], tuple[int, int]]:
    """The convTranspose2d output shape, the filter's logical (i, o/groups, kh, kw) sizes and
    the output's spatial sizes (the spec's steps, TypeError where they throw)."""
    if input_layout not in ("nchw", "nhwc"):
        raise TypeError(f"convTranspose2d inputLayout {input_layout!r} is not nchw or nhwc")
    if filter_layout not in ("iohw", "hwoi", "ohwi"):
        raise TypeError(f"convTranspose2d filterLayout {filter_layout!r} is not iohw, hwoi "
                        "or ohwi")
    pad = ulongs("convTranspose2d padding", padding, 4)
    st = ulongs("convTranspose2d strides", strides, 2)
    dil = ulongs("convTranspose2d dilations", dilations, 2)
    op = ulongs("convTranspose2d outputPadding", output_padding, 2)
    if 0 in st or 0 in dil:
        raise TypeError("convTranspose2d strides and dilations must be non-zero")
    if output_sizes is not None:
        osz = ulongs("convTranspose2d outputSizes", output_sizes, 2)
    elif op[0] >= st[0] or op[1] >= st[1]:
        raise TypeError(f"convTranspose2d outputPadding {list(op)} must be below the strides "
                        f"{list(st)}")
    g = ulongs("convTranspose2d groups", [groups], 1)[0]
    if g == 0:
        raise TypeError("convTranspose2d groups must be non-zero")
    if input_layout == "nchw":
        nb, c, h, w = in_shape
    else:
        nb, h, w, c = in_shape
    i, o, kh, kw = {"iohw": (0, 1, 2, 3), "hwoi": (3, 2, 0, 1), "ohwi": (3, 0, 1, 2)}[
        filter_layout]
    fi, fo, fh, fw = w_shape[i], w_shape[o], w_shape[kh], w_shape[kw]
    if c != fi:
        raise TypeError(f"convTranspose2d input channels {c} differ from the filter's {fi}")
    if c % g:
        raise TypeError(f"convTranspose2d input channels {c} do not split into {g} groups")
    oc = _valid_dim("convTranspose2d output channels", fo * g)
    calc = [(n - 1) * s + (k - 1) * d + 1 - p0 - p1 for n, k, s, d, p0, p1 in (
        (h, fh, st[0], dil[0], pad[0], pad[1]), (w, fw, st[1], dil[1], pad[2], pad[3]))]
    if output_sizes is not None:
        for want, cal, s in zip(osz, calc, st, strict=True):
            if not cal <= want < cal + s:
                raise TypeError(f"convTranspose2d outputSizes {list(osz)} are not within a "
                                f"stride of the computed {calc}")
        oh, ow = osz
    else:
        oh, ow = calc[0] + op[0], calc[1] + op[1]
    oh, ow = _valid_dim("convTranspose2d output height", oh), \
        _valid_dim("convTranspose2d output width", ow)
    out = (nb, oc, oh, ow) if input_layout == "nchw" else (nb, oh, ow, oc)
    return out, (fi, fo, fh, fw), (oh, ow)
