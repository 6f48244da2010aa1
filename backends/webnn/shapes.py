"""Shape inference, one small function per op family; TypeError where the spec says so."""

from __future__ import annotations

from collections.abc import Sequence


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


#: [EnforceRange] unsigned long
ULONG_MAX = (1 << 32) - 1
#: the spec's "valid dimension": in the range of a WebIDL ``long``
LONG_MAX = (1 << 31) - 1


def ulongs(what: str, values: Sequence[int], n: int) -> tuple[int, ...]:
    """A ``sequence<[EnforceRange] unsigned long>`` of ``n`` items; TypeError otherwise."""
    try:
        out = tuple(values)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of {n} unsigned longs, got {values!r}") from None
    if len(out) != n or any(isinstance(v, bool) or not isinstance(v, int)
                            or not 0 <= v <= ULONG_MAX for v in out):
        raise TypeError(f"{what} must be a sequence of {n} unsigned longs, got {values!r}")
    return out


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
    if any(not 0 < d <= LONG_MAX for d in out):
        raise TypeError(f"pooling output size {list(out)} is not a valid dimension (the "
                        f"window exceeds the padded input)")
    return out[0], out[1]
