"""The graph rewrites before planning (wgpu_impl/rewrite.py): duplicate ops computed once and
transposes that move no element read as views, each checked against float64 NumPy on fresh
random inputs, with the launches they save counted."""

from __future__ import annotations

import numpy as np

from backends.webnn import MLGraphBuilder
from backends.webnn.wgpu_impl import rewrite

RNG = np.random.default_rng()


def _run(ctx, b, outs: dict, feeds: dict[str, np.ndarray]):
    g = b.build(outs)
    ins = {}
    for n, v in feeds.items():
        t = ctx.create_tensor(data_type="float32", shape=list(v.shape), writable=True)
        ctx.write_tensor(t, v)
        ins[n] = t
    res = {n: ctx.create_tensor(data_type=o.data_type, shape=o.shape, readable=True)
           for n, o in outs.items()}
    ctx.dispatch(g, ins, res)
    return g, {n: ctx.read_tensor(t) for n, t in res.items()}


def _names(g) -> list[str]:
    return [la.kernel.name for la in g._plan.launches]


def test_duplicate_ops_are_computed_once(ctx):
    """Two layers' copies of one chain (a gather of the same rows, the same scale): the
    second copy merges into the first, both readers get its value, and a graph output that
    duplicates another keeps its own result."""
    b = MLGraphBuilder(ctx)
    table = RNG.standard_normal((16, 8)).astype(np.float32)
    x = b.input("x", data_type="float32", shape=[1, 8])
    idx = b.constant(data_type="int32", shape=[1], value=np.array([5], np.int32))
    # the same constant made twice (a converter's per-node copy) and the same gather
    t1 = b.constant(data_type="float32", shape=[16, 8], value=table)
    t2 = b.constant(data_type="float32", shape=[16, 8], value=table.copy())
    r1, r2 = b.gather(t1, idx, axis=0), b.gather(t2, idx, axis=0)
    y1 = b.mul(x, b.sigmoid(r1))
    y2 = b.add(x, b.sigmoid(r2))
    out = b.add(y1, y2)
    twin = b.add(y1, y2)  # an output equal to another: not merged away
    xv = RNG.standard_normal((1, 8)).astype(np.float32)
    g, got = _run(ctx, b, {"out": out, "twin": twin}, {"x": xv})
    s = 1 / (1 + np.exp(-table[5].astype(np.float64)))
    want = xv * s + (xv + s)
    np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["twin"], want, rtol=1e-5, atol=1e-6)
    assert _names(g).count("gather") == 1, _names(g)


def test_a_transpose_of_unit_axes_is_a_view_and_a_real_one_stays(ctx):
    """[1, 4, 1, 6] -> [1, 1, 4, 6] keeps every element where it was: no launch of its own
    (it was a copy launch); [2, 3] -> [3, 2] is still computed."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 4, 1, 6])
    w = b.input("w", data_type="float32", shape=[2, 3])
    t = b.transpose(b.exp(x), permutation=[0, 2, 1, 3])
    y = b.reshape(t, [1, 24])
    z = b.transpose(b.exp(w), permutation=[1, 0])
    xv = RNG.standard_normal((1, 4, 1, 6)).astype(np.float32)
    wv = RNG.standard_normal((2, 3)).astype(np.float32)
    g, got = _run(ctx, b, {"y": y, "z": z}, {"x": xv, "w": wv})
    x64, w64 = xv.astype(np.float64), wv.astype(np.float64)
    np.testing.assert_allclose(got["y"], np.exp(x64).transpose(0, 2, 1, 3).reshape(1, 24),
                               rtol=1e-5)
    np.testing.assert_allclose(got["z"], np.exp(w64).T, rtol=1e-5)
    assert "transpose" not in _names(g) and len(_names(g)) == 2, _names(g)


def test_moves_nothing_reads_the_axes_longer_than_one():
    from backends.webnn.dtypes import dtype
    from backends.webnn.ir import node

    f32 = dtype("float32")
    for shape, perm, same in (((1, 4, 1, 6), (0, 2, 1, 3), True),
                              ((2, 1, 3), (1, 0, 2), True),
                              ((2, 3, 1), (1, 0, 2), False),
                              ((1, 1, 1), (2, 1, 0), True)):
        x = node(0, "input", f32, shape, "", (), {}, "x", None)
        t = node(1, "op", f32, tuple(shape[p] for p in perm), "transpose", (x,),
                 {"permutation": perm}, "", None)
        assert rewrite.moves_nothing(t) is same, (shape, perm)
