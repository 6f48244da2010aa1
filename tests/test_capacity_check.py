"""The capacity check (PROPOSAL behaviour 4, ``kernels/movement.capacity_check``), accepted by
naga and Tint, run alone on the device against its rule computed in NumPy: pairs sharing
index bindings and cache shapes (checked once a group), more tuples than the workgroup's
invocations, negative and past-the-end components, and which pair is reported (the first
that would overflow)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn.kernels import movement as MV
from tests import test_webnn_gdn_capsule as capsule

device = capsule.device  # the module's adapter device (a fixture)

RNG = np.random.default_rng(4)


def _status(device, checks, sources, indices: list[np.ndarray]) -> int:
    """status[0] after one launch of the kernel over these index buffers (naga and Tint
    accepting it first)."""
    k = MV.capacity_check(checks, sources)
    arrays = [np.full(1, 7, np.uint32)] + [np.ascontiguousarray(i, np.int32) for i in indices]
    return int(capsule.launch(device, k, arrays)[0][0])


def _want(checks, sources, indices) -> int:
    for p, (_, ishape, cshape) in enumerate(checks):
        t = indices[sources[p]].reshape(-1, ishape[-1])
        if np.any((t < 0) | (t >= np.asarray(cshape[:ishape[-1]]))):
            return p + 1
    return 0


@pytest.mark.parametrize("tuples", [8, 200])
def test_the_first_overflowing_pair_is_reported(device, tuples):
    """Six pairs over two index tensors and two cache shapes (three groups): each group's
    tuples in range, then one component of one tuple moved past its cache or below zero;
    status is 0, else 1 + the first pair whose cache that tuple overflows."""
    a, b = (1, 4, 16, 8), (1, 4, 40, 8)  # two cache shapes (capacity 16 and 40)
    checks = [("i32", (tuples, 4), a), ("i32", (tuples, 4), a), ("i32", (tuples, 4), b),
              ("i32", (tuples, 4), b), ("i32", (tuples, 4), a), ("i32", (tuples, 4), b)]
    sources = [0, 0, 0, 1, 1, 1]  # groups: {0, 1}, {2}, {3, 5}, {4}

    def ok():
        t = np.zeros((tuples, 4), np.int64)
        t[:, 1] = RNG.integers(0, 4, tuples)
        t[:, 2] = RNG.integers(0, 16, tuples)
        t[:, 3] = RNG.integers(0, 8, tuples)
        return t

    idx = [ok(), ok()]
    assert _status(device, checks, sources, idx) == 0 == _want(checks, sources, idx)
    for src, row, comp, value in [(0, tuples - 1, 2, 16), (0, 3, 2, 40), (1, tuples - 1, 2, 16),
                                  (1, 0, 2, 40), (1, tuples // 2, 1, -1), (0, 5, 3, 8)]:
        bad = [x.copy() for x in idx]
        bad[src][row, comp] = value
        want = _want(checks, sources, bad)
        assert want > 0
        assert _status(device, checks, sources, bad) == want, (src, row, comp, value)


def test_one_group_when_every_pair_reads_one_tensor():
    """32 pairs of one index tensor into same-shaped caches (a llama-1b decoder): their
    tuples are checked once, not 32 times."""
    checks = [("i32", (8, 4), (1, 8, 8200, 64))] * 32
    k = MV.capacity_check(checks, [0] * 32)
    assert k.wgsl.count("for (var t = lid;") == 1 and k.bytes == 4 + 4 * 8 * 4
