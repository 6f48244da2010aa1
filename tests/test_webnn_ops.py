"""Each WebNN op against NumPy on fresh random inputs (never zeros), WPT-style tolerances."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder

RNG = np.random.default_rng(1234)


def rand(shape, dtype="float32", lo=-2.0, hi=2.0):
    if dtype == "float32":
        a = RNG.uniform(lo, hi, size=shape).astype(np.float32)
        a[np.abs(a) < 1e-3] = 0.5  # never zeros
        return a
    a = RNG.integers(int(lo), int(hi), size=shape).astype(np.dtype(dtype))
    a[a == 0] = 1
    return a


def run(ctx, build, inputs: dict[str, np.ndarray]):
    """Build with input operands for each array, dispatch once, return the output."""
    b = MLGraphBuilder(ctx)
    ops = {n: b.input(n, data_type=str(a.dtype), shape=list(a.shape)) for n, a in inputs.items()}
    y = build(b, **ops)
    g = b.build({"y": y})
    tin = {}
    for n, a in inputs.items():
        t = ctx.create_tensor(data_type=str(a.dtype), shape=list(a.shape), writable=True)
        ctx.write_tensor(t, a)
        tin[n] = t
    out = ctx.create_tensor(data_type=y.data_type, shape=y.shape, readable=True)
    ctx.dispatch(g, tin, {"y": out})
    r = ctx.read_tensor(out)
    g.destroy()
    return r


def ulp_close(got, want, ulp):
    want = want.astype(np.float32)
    tol = ulp * np.spacing(np.abs(want).astype(np.float32))
    assert got.shape == want.shape
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.all(err <= tol + 1e-30), f"max err {err.max()} vs tol {tol[err > tol]}"


def atol_close(got, want, atol, rtol=0.0):
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want.astype(got.dtype), atol=atol, rtol=rtol)


BIN_SHAPES = [([3, 4], [3, 4]), ([2, 3, 4], [4]), ([2, 1, 4], [3, 1]), ([1], [5, 2])]


@pytest.mark.parametrize("op,ref,ulp", [
    ("add", np.add, 1), ("sub", np.subtract, 1), ("mul", np.multiply, 1),
    ("div", np.divide, 2), ("max", np.maximum, 0), ("min", np.minimum, 0)])
@pytest.mark.parametrize("sa,sb", BIN_SHAPES)
def test_binary_float(ctx, op, ref, ulp, sa, sb):
    a, b = rand(sa), rand(sb)
    got = run(ctx, lambda bl, a, b: getattr(bl, op)(a, b), {"a": a, "b": b})
    ulp_close(got, ref(a, b), ulp)


@pytest.mark.parametrize("op,ref", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                    ("max", np.maximum), ("min", np.minimum)])
@pytest.mark.parametrize("dt", ["int32", "uint32", "int64"])
def test_binary_int(ctx, op, ref, dt):
    lo = 0 if dt == "uint32" else -50
    a, b = rand([2, 3, 4], dt, lo, 50), rand([3, 1], dt, lo, 50)
    if op == "sub" and dt == "uint32":
        a = a + 100
    got = run(ctx, lambda bl, a, b: getattr(bl, op)(a, b), {"a": a, "b": b})
    np.testing.assert_array_equal(got, ref(a, b).astype(dt))


def test_pow(ctx):
    a = rand([3, 5], lo=0.1, hi=3.0)
    b = rand([5], lo=-2.0, hi=2.0)
    ulp_close(run(ctx, lambda bl, a, b: bl.pow(a, b), {"a": a, "b": b}), np.power(a, b), 32)
    # negative base with integral exponents
    a2 = rand([4, 3])
    e = np.array([2.0, 3.0, -1.0], np.float32)
    got = run(ctx, lambda bl, a, b: bl.pow(a, b), {"a": a2, "b": e})
    atol_close(got, np.power(a2, e), atol=1e-5, rtol=1e-5)
    # a negative base with a fractional exponent is NaN (IEEE pow), a runtime NaN in the
    # kernel since WGSL forbids a constant one
    neg = -rand([2, 3], lo=0.5, hi=2.0)
    got = run(ctx, lambda bl, a, b: bl.pow(a, b), {"a": neg, "b": np.array([0.5, 1.5, 2.0],
                                                                           np.float32)})
    assert np.isnan(got[:, :2]).all()
    atol_close(got[:, 2], neg[:, 2] ** 2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op,ref,lo,hi,tol", [
    ("sqrt", np.sqrt, 0.01, 4, ("ulp", 1)),
    ("exp", np.exp, -5, 5, ("ulp", 32)),
    ("log", np.log, 0.01, 10, ("atol", 1.0 / 1024)),
    ("neg", np.negative, -3, 3, ("ulp", 0)),
    ("abs", np.abs, -3, 3, ("ulp", 0)),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x.astype(np.float64))), -8, 8, ("ulp", 34)),
    ("softplus", lambda x: np.log1p(np.exp(x.astype(np.float64))), -8, 8, ("atol", 1e-5)),
    ("tanh", np.tanh, -6, 6, ("atol", 1.0 / 1024)),
    ("relu", lambda x: np.maximum(x, 0), -3, 3, ("ulp", 0)),
    ("reciprocal", lambda x: 1 / x, 0.5, 3, ("ulp", 2)),
    ("cos", np.cos, -3, 3, ("atol", 1.0 / 1024)),
    ("sin", np.sin, -3, 3, ("atol", 1.0 / 1024)),
    ("floor", np.floor, -3, 3, ("ulp", 0)),
    ("ceil", np.ceil, -3, 3, ("ulp", 0)),
    ("erf", lambda x: np.vectorize(__import__("math").erf)(x), -3, 3, ("atol", 1e-6)),
])
@pytest.mark.parametrize("shape", [[7], [2, 3, 5]])
def test_unary(ctx, op, ref, lo, hi, tol, shape):
    x = rand(shape, lo=lo, hi=hi)
    got = run(ctx, lambda bl, x: getattr(bl, op)(x), {"x": x})
    want = ref(x)
    if tol[0] == "ulp":
        ulp_close(got, want, tol[1])
    else:
        atol_close(got, want, tol[1])


@pytest.mark.parametrize("op,ref", [
    ("equal", np.equal), ("greater", np.greater), ("lesser", np.less),
    ("lesser_or_equal", np.less_equal), ("greater_or_equal", np.greater_equal)])
def test_compare(ctx, op, ref):
    a = rand([3, 4], "int32", -3, 3)
    b = rand([4], "int32", -3, 3)
    got = run(ctx, lambda bl, a, b: getattr(bl, op)(a, b), {"a": a, "b": b})
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref(a, b).astype(np.uint8))
    fa, fb = rand([2, 3]), rand([2, 1])
    fa[0, 0] = fb[0, 0]
    got = run(ctx, lambda bl, a, b: getattr(bl, op)(a, b), {"a": fa, "b": fb})
    np.testing.assert_array_equal(got, ref(fa, fb).astype(np.uint8))


def test_where(ctx):
    a, b = rand([2, 3, 4]), rand([4])
    c = (rand([3, 1], "int32", 0, 2) > 1).astype(np.uint8)
    c[0, 0] = 1
    c[1, 0] = 0
    got = run(ctx, lambda bl, c, a, b: bl.where(c, a, b), {"c": c, "a": a, "b": b})
    ulp_close(got, np.where(c != 0, a, b), 0)


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("int32", "float32"),
                                     ("int64", "float32"), ("float32", "int64"),
                                     ("uint32", "int32"), ("int32", "uint32")])
def test_cast(ctx, src, dst):
    x = rand([3, 4], src, 0 if "u" in src else -9, 9) if src != "float32" \
        else rand([3, 4], lo=-9, hi=9)
    if "u" in dst:
        x = np.abs(x)
    got = run(ctx, lambda bl, x: bl.cast(x, dst), {"x": x})
    assert got.dtype == np.dtype(dst)
    np.testing.assert_array_equal(got, x.astype(dst))


@pytest.mark.parametrize("sa,sb", [
    ([1, 8], [8, 12]), ([1, 6], [6, 5]), ([3, 7], [7, 5]), ([2, 1, 16], [16, 9]),
    ([2, 3, 4, 5], [5, 6]), ([2, 1, 4, 5], [3, 5, 2]), ([1, 64], [64, 130])])
def test_matmul(ctx, sa, sb):
    a, b = rand(sa), rand(sb)
    got = run(ctx, lambda bl, a, b: bl.matmul(a, b), {"a": a, "b": b})
    atol_close(got, np.matmul(a.astype(np.float64), b), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("sa,sb", [([1, 16], [16, 24]), ([1, 10], [10, 7]), ([3, 16], [16, 5]),
                                   ([1, 1, 256], [256, 9])])
def test_matmul_constant_weights(ctx, sa, sb):
    """Constant B takes the repacked matrix-vector path when M == 1."""
    a, w = rand(sa), rand(sb)
    got = run(ctx, lambda bl, a: bl.matmul(a, bl.constant(data_type="float32", shape=sb,
                                                          value=w)), {"a": a})
    atol_close(got, np.matmul(a.astype(np.float64), w), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("sq,sk", [([1, 2, 1, 8], [1, 2, 6, 8]), ([2, 3, 4], [2, 5, 4]),
                                   ([1, 2, 1, 6], [1, 2, 5, 6])])
def test_matmul_transposed_b(ctx, sq, sk):
    """matmul(q, transpose(k)) reads k in place (the transpose is folded)."""
    q, k = rand(sq), rand(sk)
    perm = list(range(len(sk) - 2)) + [len(sk) - 1, len(sk) - 2]
    got = run(ctx, lambda bl, q, k: bl.matmul(q, bl.transpose(k, perm)), {"q": q, "k": k})
    atol_close(got, np.matmul(q.astype(np.float64), np.transpose(k, perm)), atol=1e-4)


def test_gemm(ctx):
    a, b, c = rand([3, 4]), rand([5, 4]), rand([5])
    got = run(ctx, lambda bl, a, b, c: bl.gemm(a, b, c=c, alpha=0.5, beta=2.0, b_transpose=True),
              {"a": a, "b": b, "c": c})
    atol_close(got, 0.5 * a.astype(np.float64) @ b.T + 2 * c, atol=1e-5)


@pytest.mark.parametrize("shape,axis", [([3, 7], 1), ([2, 5, 3], 1), ([4, 130], -1), ([6], 0)])
def test_softmax(ctx, shape, axis):
    x = rand(shape, lo=-4, hi=4)
    got = run(ctx, lambda bl, x: bl.softmax(x, axis), {"x": x})
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    atol_close(got, e / e.sum(axis=axis, keepdims=True), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("op,ref", [("reduce_mean", np.mean), ("reduce_sum", np.sum),
                                    ("reduce_max", np.max), ("reduce_min", np.min)])
@pytest.mark.parametrize("shape,axes,keep", [([3, 5], [1], False), ([2, 3, 4], [0, 2], True),
                                             ([4, 100], None, False), ([2, 3, 4], [1], True),
                                             # short rows (an invocation a row: SHORT_ROW),
                                             # a ragged last workgroup, and either side of
                                             # the bound
                                             ([1, 600, 4], [2], False), ([5, 16], [1], True),
                                             ([5, 17], [1], False)])
def test_reduce(ctx, op, ref, shape, axes, keep):
    x = rand(shape)
    got = run(ctx, lambda bl, x: getattr(bl, op)(x, axes=axes, keep_dimensions=keep), {"x": x})
    want = ref(x.astype(np.float64), axis=None if axes is None else tuple(axes), keepdims=keep)
    atol_close(got, np.asarray(want).reshape(got.shape), atol=1e-5, rtol=1e-5)
    if axes is None:
        assert got.shape == ()  or got.shape == (1,) or got.size == 1


@pytest.mark.parametrize("width", [70, 6])  # a workgroup a row; an invocation a row
@pytest.mark.parametrize("dt", ["float32", "int32"])
def test_reduce_max_min_extremes(ctx, dt, width):
    """max and min start from each row's first element, not from an infinity (which WGSL
    cannot write as a constant): rows of -inf (max), +inf (min) and the type's extremes."""
    if dt == "float32":
        x = rand([4, width])
        x[0, :] = -np.inf
        x[1, :] = np.inf
        x[2, 5] = np.finfo(np.float32).min
        x[3, width - 1] = np.finfo(np.float32).max
    else:
        x = rand([4, width], dt, -20, 20)
        x[0, :] = np.iinfo(np.int32).min
        x[1, :] = np.iinfo(np.int32).max
    for op, ref in (("reduce_max", np.max), ("reduce_min", np.min)):
        got = run(ctx, lambda bl, x, op=op: getattr(bl, op)(x, axes=[1]), {"x": x})
        np.testing.assert_array_equal(got, ref(x, axis=1))


@pytest.mark.parametrize("op,ref", [("reduce_sum", np.sum), ("reduce_mean", np.mean),
                                    ("reduce_max", np.max)])
def test_short_reduction_is_computed_where_its_activation_reads_it(ctx, op, ref):
    """A short convolution as a hybrid layer writes it: the window (the state's 3 columns
    and the new one) times the weights, summed over its 4, then SiLU. The short sum is
    computed inside the activation's launch (each element its 4 products, read twice by
    ``x · sigmoid(x)``), so neither the sum nor the product is written; the window itself,
    read by the new state's slice too, is written once. A short reduction read broadcast
    over its rows (a norm's statistic) keeps its own launch. Against float64 NumPy."""
    state, x, w = rand([1, 37, 3]), rand([1, 37, 1]), rand([37, 4])
    b = MLGraphBuilder(ctx)
    si = b.input("state", data_type="float32", shape=[1, 37, 3])
    xi = b.input("x", data_type="float32", shape=[1, 37, 1])
    win = b.concat([si, xi], 2)
    s = getattr(b, op)(b.mul(win, b.constant(data_type="float32", shape=[37, 4], value=w)),
                       axes=[2])
    y = b.mul(s, b.sigmoid(s))
    new_state = b.slice(win, [0, 0, 1], [1, 37, 3])
    norm = b.div(win, getattr(b, op)(win, axes=[2], keep_dimensions=True))
    g = b.build({"y": y, "state_out": new_state, "norm": norm})
    names = [la.kernel.name for la in g._plan.launches]
    fused = [n for n in names if op in n]
    assert len(fused) == 2 and any(n.endswith(f"mul+{op}+sigmoid+mul") for n in fused), names
    feeds = {}
    for name, a in (("state", state), ("x", x)):
        feeds[name] = ctx.create_tensor(data_type="float32", shape=list(a.shape), writable=True)
        ctx.write_tensor(feeds[name], a)
    outs = {k: ctx.create_tensor(data_type="float32", shape=list(v.shape), readable=True)
            for k, v in (("y", y), ("state_out", new_state), ("norm", norm))}
    ctx.dispatch(g, feeds, outs)
    wn = np.concatenate([state, x], 2).astype(np.float64)
    sv = ref(wn * w.astype(np.float64), axis=2)
    atol_close(ctx.read_tensor(outs["y"]), sv / (1 + np.exp(-sv)), atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(ctx.read_tensor(outs["state_out"]), wn[:, :, 1:])
    # a sum or mean of 4 random values may nearly cancel: float32's error in it, relative to
    # it, is its condition number (sum |w| / |sum w|) times its spacing, and so is the norm's
    cond = (np.ones_like(wn) if op == "reduce_max" else
            np.abs(wn).sum(2, keepdims=True) / np.abs(wn.sum(2, keepdims=True)))
    want = wn / ref(wn, axis=2, keepdims=True)
    err = np.abs(ctx.read_tensor(outs["norm"]) - want)
    assert (err <= 1e-4 + 1e-6 * cond * np.abs(want)).all(), (err.max(), cond.max())
    g.destroy()


def test_reduce_int(ctx):
    x = rand([3, 4], "int32", -20, 20)
    got = run(ctx, lambda bl, x: bl.reduce_sum(x, axes=[1]), {"x": x})
    np.testing.assert_array_equal(got, x.sum(axis=1))


def test_reshape_transpose_concat_slice(ctx):
    x = rand([2, 3, 4])
    got = run(ctx, lambda bl, x: bl.reshape(x, [4, 6]), {"x": x})
    np.testing.assert_array_equal(got, x.reshape(4, 6))
    got = run(ctx, lambda bl, x: bl.transpose(x, [2, 0, 1]), {"x": x})
    np.testing.assert_array_equal(got, np.transpose(x, [2, 0, 1]))
    got = run(ctx, lambda bl, x: bl.transpose(x), {"x": x})
    np.testing.assert_array_equal(got, x.T)
    y = rand([2, 5, 4])
    got = run(ctx, lambda bl, x, y: bl.concat([x, y, x], 1), {"x": x, "y": y})
    np.testing.assert_array_equal(got, np.concatenate([x, y, x], 1))
    got = run(ctx, lambda bl, x: bl.slice(x, [1, 1, 0], [1, 2, 3]), {"x": x})
    np.testing.assert_array_equal(got, x[1:2, 1:3, 0:3])
    # the spec's sizes is the window read: ceil(window / stride) elements come out
    got = run(ctx, lambda bl, x: bl.slice(x, [0, 0, 1], [2, 3, 3], strides=[1, 2, 2]), {"x": x})
    np.testing.assert_array_equal(got, x[0:2, 0:3:2, 1:4:2])


def test_strided_slice_window_is_sizes_long(ctx):
    """Issue 29: input 12, starts 2, sizes 3, strides 4 reads x[2:5:4] (one element); a
    window past the end is a TypeError even where its strided elements would fit."""
    x = rand([12])
    b = MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=[12])
    assert b.slice(xi, [2], [3], strides=[4]).shape == [1]
    assert b.slice(xi, [0], [12], strides=[5]).shape == [3]
    with pytest.raises(TypeError):
        b.slice(xi, [10], [3], strides=[2])  # the window [10, 13) leaves the axis
    with pytest.raises(TypeError):
        b.slice(xi, [0], [4], strides=[0])
    got = run(ctx, lambda bl, x: bl.slice(x, [1], [11], strides=[3]), {"x": x})
    np.testing.assert_array_equal(got, x[1:12:3])


def test_reshape_of_reshape_chain_is_shared(ctx):
    x = rand([2, 6])
    got = run(ctx, lambda bl, x: bl.add(bl.reshape(bl.reshape(x, [3, 4]), [12]),
                                        bl.reshape(x, [12])), {"x": x})
    np.testing.assert_array_equal(got, (x + x).reshape(12))


@pytest.mark.parametrize("shape,ishape,axis,dt", [([5, 3], [2], 0, "int32"),
                                                  ([2, 6, 3], [2, 2], 1, "int64"),
                                                  ([4, 3], [3], 1, "uint32")])
def test_gather(ctx, shape, ishape, axis, dt):
    x = rand(shape)
    idx = RNG.integers(0, shape[axis], size=ishape).astype(dt)
    got = run(ctx, lambda bl, x, i: bl.gather(x, i, axis), {"x": x, "i": idx})
    np.testing.assert_array_equal(got, np.take(x, idx.astype(np.int64), axis=axis))


def test_expand(ctx):
    x = rand([3, 1])
    got = run(ctx, lambda bl, x: bl.expand(x, [2, 3, 4]), {"x": x})
    np.testing.assert_array_equal(got, np.broadcast_to(x, (2, 3, 4)))


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_scatter_nd(ctx, dt):
    x = rand([4, 3, 2])
    idx = np.array([[2], [0]], dt)
    upd = rand([2, 3, 2])
    got = run(ctx, lambda bl, x, i, u: bl.scatter_nd(x, i, u), {"x": x, "i": idx, "u": upd})
    want = x.copy()
    want[idx[:, 0]] = upd
    np.testing.assert_array_equal(got, want)
    idx2 = np.array([[1, 2], [3, 0]], dt)
    upd2 = rand([2, 2])
    got = run(ctx, lambda bl, x, i, u: bl.scatter_nd(x, i, u), {"x": x, "i": idx2, "u": upd2})
    want = x.copy()
    want[idx2[:, 0], idx2[:, 1]] = upd2
    np.testing.assert_array_equal(got, want)


def test_shape_inference_errors(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    y = b.input("y", data_type="float32", shape=[4, 3])
    i = b.input("i", data_type="int32", shape=[2, 3])
    with pytest.raises(TypeError):
        b.add(x, y)
    with pytest.raises(TypeError):
        b.add(x, i)
    with pytest.raises(TypeError):
        b.matmul(x, y)
    with pytest.raises(TypeError):
        b.reshape(x, [5])
    with pytest.raises(TypeError):
        b.slice(x, [1, 0], [2, 3])
    with pytest.raises(TypeError):
        b.input("z", data_type="float32", shape=[2, 0])
    with pytest.raises(TypeError):
        b.input("x", data_type="float32", shape=[2])
    with pytest.raises(TypeError):
        b.input("w", data_type="bfloat99", shape=[2])
    assert b.matmul(x, b.transpose(y)).shape == [2, 4]
    assert b.reduce_mean(x, axes=[1], keep_dimensions=True).shape == [2, 1]


def test_constants_beyond_the_binding_limit_are_chunked(ctx):
    """An LM head or embedding table larger than max-storage-buffer-binding-size is split
    into chunks (forced here with a tiny limit)."""
    saved = ctx._max_binding
    ctx._max_binding = 1024  # bytes
    try:
        a, w = rand([1, 16]), rand([16, 70])
        got = run(ctx, lambda bl, a: bl.matmul(a, bl.constant(data_type="float32", shape=[16, 70],
                                                               value=w)), {"a": a})
        atol_close(got, a.astype(np.float64) @ w, atol=1e-4)
        e = rand([70, 16])  # tied: logits = x @ E^T reads E (N, K) in chunks
        got = run(ctx, lambda bl, a: bl.matmul(a, bl.transpose(bl.constant(
            data_type="float32", shape=[70, 16], value=e))), {"a": a})
        atol_close(got, a.astype(np.float64) @ e.T, atol=1e-4)
        idx = np.array([[3, 69, 20, 0]], np.int32)
        got = run(ctx, lambda bl, i: bl.gather(bl.constant(data_type="float32", shape=[70, 16],
                                                            value=e), i), {"i": idx})
        np.testing.assert_array_equal(got, e[idx])
    finally:
        ctx._max_binding = saved


@pytest.mark.parametrize("max_storage,launches", [(None, 1), (4, 3), (3, 5)])
def test_a_chunked_table_is_gathered_in_as_few_launches_as_bindings_allow(ctx, monkeypatch,
                                                                         max_storage, launches):
    """A table split by the binding limit (70 rows of 64 bytes at 1024 bytes a binding: five
    chunks) is gathered by one launch binding every chunk where the storage-buffer limit
    allows, else by launches of as many chunks as it allows (two at 4 buffers, one at 3),
    each writing only the outputs whose index falls in its chunks; indices in every
    chunk, at their edges, negative ones from the end."""
    import dataclasses

    if max_storage is not None:
        monkeypatch.setattr(ctx, "_target", dataclasses.replace(ctx._target,
                                                                max_storage=max_storage))
    monkeypatch.setattr(ctx, "_max_binding", 1024)
    e = rand([70, 16])
    idx = np.array([[3, 69, 20, 0, -1, 47, 48, 33, -70, 15, 16, 31, 32, 64]], np.int32)
    b = MLGraphBuilder(ctx)
    i = b.input("i", data_type="int32", shape=list(idx.shape))
    g = b.build({"y": b.gather(b.constant(data_type="float32", shape=[70, 16], value=e), i)})
    try:
        assert [la.kernel.name for la in g._plan.launches] == ["gather"] * launches
        assert max(len(la.kernel.bindings) for la in g._plan.launches) <= ctx._target.max_storage
        ti = ctx.create_tensor(data_type="int32", shape=list(idx.shape), writable=True)
        ctx.write_tensor(ti, idx)
        out = ctx.create_tensor(data_type="float32", shape=[1, idx.shape[1], 16], readable=True)
        ctx.dispatch(g, {"i": ti}, {"y": out})
        np.testing.assert_array_equal(ctx.read_tensor(out), e[idx])
    finally:
        g.destroy()


@pytest.mark.parametrize("sa,sx,sb", [([1, 2, 2, 16, 16], [1, 2, 16], [1, 2, 1, 16, 1]),
                                      ([1, 6], [2, 3, 5], [6, 5])])
def test_matmul_of_reshaped_operand(ctx, sa, sx, sb):
    """B is a view (reshape) of storage with another shape; the view's shape rules."""
    a, x = rand(sa), rand(sx)
    got = run(ctx, lambda bl, a, x: bl.matmul(a, bl.reshape(x, sb)), {"a": a, "x": x})
    atol_close(got, np.matmul(a.astype(np.float64), x.reshape(sb)), atol=1e-4)
    w = rand(sx)
    got = run(ctx, lambda bl, a: bl.matmul(a, bl.reshape(bl.constant(
        data_type="float32", shape=sx, value=w), sb)), {"a": a})
    atol_close(got, np.matmul(a.astype(np.float64), w.reshape(sb)), atol=1e-4)


def test_matmul_transpose_of_reshape_is_folded_with_its_shape(ctx):
    q, k = rand([1, 2, 1, 4]), rand([2, 12])
    got = run(ctx, lambda bl, q, k: bl.matmul(q, bl.transpose(bl.reshape(k, [1, 2, 3, 4]),
                                                              [0, 1, 3, 2])), {"q": q, "k": k})
    atol_close(got, q.astype(np.float64) @ k.reshape(1, 2, 3, 4).transpose(0, 1, 3, 2), atol=1e-5)


# -- float16 (WGSL f16 storage, where the adapter has 'shader-f16') ----------------------------



def f16_close(got, want64, ulp=1):
    """``got`` (float16) within ``ulp`` float16 steps of the float64 value ``want64``."""
    assert got.dtype == np.float16 and got.shape == want64.shape
    tol = ulp * np.spacing(np.abs(want64).astype(np.float16)).astype(np.float64)
    err = np.abs(got.astype(np.float64) - want64)
    assert np.all(err <= tol), f"max err {err.max()}"


@pytest.mark.adapter_feature("shader-f16")
def test_float16_cast_rounds_to_nearest_and_widens_exactly(ctx):
    x = rand([7, 33]) * 37.0
    got = run(ctx, lambda b, x: b.cast(x, "float16"), {"x": x})
    np.testing.assert_array_equal(got, x.astype(np.float16))
    h = (rand([5, 9]) * 3.0).astype(np.float16)
    np.testing.assert_array_equal(run(ctx, lambda b, h: b.cast(h, "float32"), {"h": h}),
                                  h.astype(np.float32))
    ints = run(ctx, lambda b, h: b.cast(h, "int32"), {"h": h})
    np.testing.assert_array_equal(ints, h.astype(np.float32).astype(np.int32))


@pytest.mark.parametrize("op,ref", [
    ("add", lambda a, b: a + b), ("mul", lambda a, b: a * b), ("sub", lambda a, b: a - b)])
@pytest.mark.adapter_feature("shader-f16")
def test_float16_elementwise_binary(ctx, op, ref):
    a, b = (rand([3, 17]).astype(np.float16) for _ in "ab")
    got = run(ctx, lambda bl, a, b: getattr(bl, op)(a, b), {"a": a, "b": b})
    f16_close(got, ref(a.astype(np.float64), b.astype(np.float64)))


@pytest.mark.parametrize("op,ref,ulp", [
    ("exp", np.exp, 2), ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), 2), ("erf", None, 2)])
@pytest.mark.adapter_feature("shader-f16")
def test_float16_elementwise_unary(ctx, op, ref, ulp):
    import math

    x = rand([4, 21]).astype(np.float16)
    ref = ref or np.vectorize(math.erf)
    got = run(ctx, lambda b, x: getattr(b, op)(x), {"x": x})
    f16_close(got, ref(x.astype(np.float64)), ulp)


@pytest.mark.adapter_feature("shader-f16")
def test_float16_data_movement_is_exact(ctx):
    x = rand([2, 3, 8]).astype(np.float16)
    got = run(ctx, lambda b, x: b.concat([b.transpose(x, [0, 2, 1]),
                                          b.slice(b.transpose(x, [0, 2, 1]), [0, 0, 1], [2, 8, 2])],
                                         2), {"x": x})
    t = x.transpose(0, 2, 1)
    np.testing.assert_array_equal(got, np.concatenate([t, t[:, :, 1:3]], 2))


def test_matmul_reads_a_transposed_operand_computed_by_fusion(ctx):
    """matmul(q, transpose(f(x))) with f fusible: the matmul reads f(x) untransposed (the
    transpose is folded), so f(x) must be written, not computed only inside the
    transpose's launch (which, unread, is dropped)."""
    q, x = rand([2, 3, 4]), rand([2, 5, 4])
    got = run(ctx, lambda b, q, x: b.matmul(q, b.transpose(b.mul(x, x), [0, 2, 1])),
              {"q": q, "x": x})
    want = q.astype(np.float64) @ (x.astype(np.float64) ** 2).transpose(0, 2, 1)
    atol_close(got, want, 1e-5, 1e-5)


def test_float16_without_shader_f16_is_a_type_error(ctx, monkeypatch):
    """A context whose adapter lacks 'shader-f16' turns float16 down where the page asks
    for it, with one line saying why (as opSupportLimits() would report it)."""
    monkeypatch.setattr(ctx, "_f16", False)
    with pytest.raises(TypeError, match="float16 is not supported.*'shader-f16'"):
        ctx.create_tensor(data_type="float16", shape=[4], writable=True)
    b = MLGraphBuilder(ctx)
    with pytest.raises(TypeError, match="'shader-f16'"):
        b.input("x", data_type="float16", shape=[4])
    x = b.input("y", data_type="float32", shape=[4])
    with pytest.raises(TypeError, match="'shader-f16'"):
        b.cast(x, "float16")


def test_float16_refusal_says_when_the_engine_withholds_shader_f16(ctx, monkeypatch):
    """Where the engine keeps 'shader-f16' off this kind of adapter by design, the refusal's
    one line says so, and names no reason on an adapter it does not withhold it from."""
    import dataclasses

    from backends.webnn.dtypes import dtype

    info = ctx._adapter.info
    monkeypatch.setattr(ctx, "_f16", False)
    assert "by design" not in ctx._unsupported(dtype("float16"))
    withheld = (("shader-f16", str(info["backend_type"]), info["vendor_id"], "by design here"),)
    monkeypatch.setattr(ctx, "engine", dataclasses.replace(ctx.engine, withheld=withheld))
    why = ctx._unsupported(dtype("float16"))
    assert why.endswith("has no 'shader-f16': by design here") and "\n" not in why
    with pytest.raises(TypeError, match="'shader-f16': by design here"):
        MLGraphBuilder(ctx).input("x", data_type="float16", shape=[4])


def test_dawn_withholds_shader_f16_on_nvidia_vulkan_only():
    """Dawn's PhysicalDeviceVk.cpp refuses ShaderF16 on NVIDIA's Vulkan adapters unless the
    adapter toggle vulkan_enable_f16_on_nvidia is on (docs/dawn.md); wgpu-native exposes
    it there, and Dawn elsewhere (lavapipe, NVIDIA under D3D12)."""
    from backends.webnn.engines import ENGINES, NVIDIA

    nvidia_vk = {"vendor_id": NVIDIA, "backend_type": "Vulkan", "device": "NVIDIA H200"}
    assert "vulkan_enable_f16_on_nvidia" in ENGINES["dawn"].withholds("shader-f16", nvidia_vk)
    assert ENGINES["wgpu"].withholds("shader-f16", nvidia_vk) == ""
    assert ENGINES["dawn"].withholds("subgroups", nvidia_vk) == ""
    for info in ({"vendor_id": 0x10005, "backend_type": "Vulkan"},
                 {"vendor_id": NVIDIA, "backend_type": "D3D12"}):
        assert ENGINES["dawn"].withholds("shader-f16", info) == ""


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("op", ["matmul", "softmax", "reduce_mean", "reduce_sum"])
def test_float16_ops_accumulate_in_float32(ctx, op):
    """Ops without float16 kernels take and give float16 operands: the context computes them
    in float32 between casts, so over 512 terms the result is the float64 value rounded
    once to float16 (within one ULP) plus float32's accumulation error (512 · 2^-24 of the
    terms' magnitudes: it shows where a matmul's terms cancel to a small result), where
    float16 accumulation (8192 times that) would drift by many."""
    x = RNG.uniform(0.5, 1.5, size=(4, 512)).astype(np.float16)
    w = RNG.uniform(-1.0, 1.0, size=(512, 8)).astype(np.float16)
    b = MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float16", shape=[4, 512])
    y = {"matmul": lambda: b.matmul(xi, b.constant(data_type="float16", shape=[512, 8], value=w)),
         "softmax": lambda: b.softmax(xi, 1),
         "reduce_mean": lambda: b.reduce_mean(xi, [1]),
         "reduce_sum": lambda: b.reduce_sum(xi, [1])}[op]()
    assert y.data_type == "float16"
    g = b.build({"y": y})
    t_in = ctx.create_tensor(data_type="float16", shape=[4, 512], writable=True)
    ctx.write_tensor(t_in, x)
    t_out = ctx.create_tensor(data_type="float16", shape=y.shape, readable=True)
    ctx.dispatch(g, {"x": t_in}, {"y": t_out})
    got = ctx.read_tensor(t_out).astype(np.float64)
    x64 = x.astype(np.float64)
    want = {"matmul": lambda: x64 @ w.astype(np.float64),
            "softmax": lambda: np.exp(x64 - x64.max(1, keepdims=True))
            / np.exp(x64 - x64.max(1, keepdims=True)).sum(1, keepdims=True),
            "reduce_mean": lambda: x64.mean(1), "reduce_sum": lambda: x64.sum(1)}[op]()
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    magnitudes = {"matmul": lambda: np.abs(x64) @ np.abs(w.astype(np.float64)),
                  "softmax": lambda: np.ones_like(want),
                  "reduce_mean": lambda: np.abs(x64).mean(1),
                  "reduce_sum": lambda: np.abs(x64).sum(1)}[op]()
    bound = ulp + 512 * 2.0**-24 * magnitudes
    assert np.all(np.abs(got - want.reshape(got.shape)) <= bound.reshape(got.shape))


@pytest.mark.adapter_feature("shader-f16")
def test_float16_output_of_odd_length_copied_out(ctx):
    """Issue 29: a float16 output that is a reshape of an input ([3] -> [3, 1], [5] ->
    [1, 5]) is copied buffer to buffer; 2n bytes for odd n is not a whole word."""
    for shp, new in (([3], [3, 1]), ([5], [1, 5])):
        x = rand(shp).astype(np.float16)
        got = run(ctx, lambda bl, x, new=new: bl.reshape(x, new), {"x": x})
        np.testing.assert_array_equal(got, x.reshape(new))
