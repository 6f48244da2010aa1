"""The fast kernels (backends/webnn/PERFORMANCE.md) against NumPy on fresh random inputs,
every variant, odd shapes included (K not a multiple of 4, N not a multiple of the
workgroup, weights split into chunks)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.pages import StatelessCopy

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

from backends.webnn import MLGraphBuilder  # noqa: E402
from backends.webnn.wgpu_impl.target import Target  # noqa: E402


def run(ctx, build, feeds: dict[str, np.ndarray]) -> np.ndarray:
    b = MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=list(a.shape)) for n, a in feeds.items()}
    y = build(b, ins)
    g = b.build({"y": y})
    ts = {}
    for n, a in feeds.items():
        ts[n] = ctx.create_tensor(data_type="float32", shape=list(a.shape), writable=True)
        ctx.write_tensor(ts[n], a)
    out = ctx.create_tensor(data_type="float32", shape=list(y.shape), readable=True)
    ctx.dispatch(g, ts, {"y": out})
    got = ctx.read_tensor(out)
    g.destroy()
    return got


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


GEMV_VARIANTS = ["legacy", "cols", "cols2", "cols4g8", "rows", "rows_sh", "rows16", "rows64",
                 "rows_u8", "rows16_sh_u2"]
GEMV_SHAPES = [(37, 333), (64, 1), (8, 700), (260, 129), (1024, 96)]


@pytest.mark.parametrize("variant", GEMV_VARIANTS)
@pytest.mark.parametrize("K,N", GEMV_SHAPES)
@pytest.mark.parametrize("lead", [(1,), (3, 1)])
def test_gemv_variants(ctx_with, variant, K, N, lead):
    rng = np.random.default_rng()
    ctx = ctx_with(gemv=variant)
    w = rand(rng, K, N)
    x = rand(rng, *lead, K)
    got = run(ctx, lambda b, i: b.matmul(i["x"], b.constant(data_type="float32", shape=[K, N],
                                                             value=w)), {"x": x})
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["cols", "rows", "legacy"])
def test_gemv_weights_split_into_chunks(ctx_with, variant):
    """Weights beyond the storage-binding limit: one launch per chunk of columns."""
    rng = np.random.default_rng()
    ctx = ctx_with(gemv=variant)
    K, N = 20, 301
    w, x = rand(rng, K, N), rand(rng, 1, K)
    saved = ctx._max_binding
    ctx._max_binding = 4 * K * 64  # 64 columns per chunk
    try:
        got = run(ctx, lambda b, i: b.matmul(
            i["x"], b.constant(data_type="float32", shape=[K, N], value=w)), {"x": x})
    finally:
        ctx._max_binding = saved
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.adapter_feature("subgroup")
@pytest.mark.parametrize("K,N", [(37, 333), (2048, 70), (12, 5)])
def test_gemv_subgroup_reduction(ctx_with, subgroup_size, K, N):
    """The subgroupAdd path (taken when the adapter reports one fixed subgroup size)."""
    size = subgroup_size
    lanes = {8: "rows8", 16: "rows16", 32: "rows", 64: "rows64"}.get(size or 0)
    if lanes is None:
        pytest.skip(f"no usable fixed subgroup size ({size})")
    rng = np.random.default_rng()
    ctx = ctx_with(gemv=lanes)
    w, x = rand(rng, K, N), rand(rng, 1, K)
    saved = ctx._target
    ctx._target = Target(cpu=False, subgroup=size)
    try:
        got = run(ctx, lambda b, i: b.matmul(
            i["x"], b.constant(data_type="float32", shape=[K, N], value=w)), {"x": x})
    finally:
        ctx._target = saved
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("M,K,N", [(4, 64, 300), (3, 5, 37), (8, 16, 1), (2, 7, 65)])
def test_scores_small_m_reads_keys_in_place(ctx, M, K, N):
    """matmul(q, transpose(k)) with a few rows: the key rows are read once for all rows."""
    rng = np.random.default_rng()
    q, k = rand(rng, 1, 3, M, K), rand(rng, 1, 3, N, K)
    got = run(ctx, lambda b, i: b.matmul(i["q"], b.transpose(i["k"], [0, 1, 3, 2])),
              {"q": q, "k": k})
    np.testing.assert_allclose(got, q.astype(np.float64) @ k.transpose(0, 1, 3, 2),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", [False, True])
@pytest.mark.parametrize("M,K,N,bb", [(4, 1000, 64, (1, 3)), (1, 256, 17, (2,)),
                                      (3, 777, 5, (1, 2)), (8, 300, 1, ())])
def test_split_k_matmul(ctx, M, K, N, bb, cpu):
    """probs·V over a long cache: K split into chunks, partial sums added by a 2nd pass."""
    rng = np.random.default_rng()
    a, b_ = rand(rng, *bb, M, K), rand(rng, *bb, K, N)
    saved = ctx._target
    ctx._target = Target(cpu=cpu)
    try:
        got = run(ctx, lambda b, i: b.matmul(i["a"], i["b"]), {"a": a, "b": b_})
    finally:
        ctx._target = saved
    np.testing.assert_allclose(got, a.astype(np.float64) @ b_, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["rows_w", "rows_u8_w", "rows16_sh_u2_w"])
@pytest.mark.parametrize("K", [264, 260, 8])
def test_gemv_float16_weights_sixteen_byte_loads(ctx_with, variant, K):
    """``_w``: float16 weights loaded 8 to a ``vec4<u32>`` (K % 8 == 0; else the 8-byte
    loads), each against two vec4 of the input; the float64 product of the weights as
    stored, with loads left over after the unrolled loop."""
    rng = np.random.default_rng()
    ctx = ctx_with(gemv=variant, gemv_weights="f16")
    N = 129
    w, x = rand(rng, K, N), rand(rng, 1, K)
    kernels, got = _gemv_plan_and_result(ctx, w, x)
    (k,) = [k for k in kernels if k.name == "matmul_gemv"]
    wide = K % 8 == 0
    assert ("array<vec4<u32>>" in k.wgsl) == wide and ("fn wv(" in k.wgsl) != wide
    assert k.bytes == 4 * (K + N) + 2 * K * N
    stored = w.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(got, x.astype(np.float64) @ stored, rtol=1e-4, atol=1e-4)


def test_gemv_sixteen_byte_loads_with_a_computed_input(ctx_with):
    """``_w`` where the gemv computes its input (RMSNorm's tail, ``gemv_prologue`` "full"),
    two stacked products: the input vector's words are read two a weight load."""
    rng = np.random.default_rng()
    ctx = ctx_with(gemv="rows_sh_w", gemv_prologue="full", gemv_weights="f16")
    K = 48
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, K])
    w1, w2, gm = rand(rng, K, 5), rand(rng, K, 3), rand(rng, 1, K)
    ms = b.reduce_mean(b.mul(x, x), axes=[1], keep_dimensions=True)
    v = b.mul(b.div(x, b.sqrt(b.add(ms, b.constant(data_type="float32", shape=[1, 1],
                                                     value=np.float32([[1e-5]]))))),
              b.constant(data_type="float32", shape=[1, K], value=gm))
    ys = {f"y{i}": b.matmul(v, b.constant(data_type="float32", shape=[K, w.shape[1]], value=w))
          for i, w in ((1, w1), (2, w2))}
    g = b.build(ys)
    kernels = [la.kernel for la in g._plan.launches if hasattr(la, "kernel")]
    assert [k.name for k in kernels] == ["matmul_gemv"] and "fn whi(" in kernels[0].wgsl
    xv = rand(rng, 1, K)
    tx = ctx.create_tensor(data_type="float32", shape=[1, K], writable=True)
    outs = {n: ctx.create_tensor(data_type="float32", shape=[1, w.shape[1]], readable=True)
            for n, w in (("y1", w1), ("y2", w2))}
    ctx.write_tensor(tx, xv)
    ctx.dispatch(g, {"x": tx}, outs)
    x64 = xv.astype(np.float64)
    vv = x64 / np.sqrt((x64 * x64).mean() + 1e-5) * gm
    for n, w in (("y1", w1), ("y2", w2)):
        want = vv @ w.astype(np.float16).astype(np.float64)
        np.testing.assert_allclose(ctx.read_tensor(outs[n]), want, rtol=1e-4, atol=1e-4)
    g.destroy()


@pytest.mark.parametrize("rows,n", [(3, 1500), (32, 1024), (1, 4099)])
def test_wide_softmax(ctx, rows, n):
    rng = np.random.default_rng()
    x = rand(rng, rows, n) * 4
    saved = ctx._target
    ctx._target = Target(cpu=False)
    try:
        got = run(ctx, lambda b, i: b.softmax(i["x"], 1), {"x": x})
    finally:
        ctx._target = saved
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", [None, "identity", "buffer"])
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 4, 8)])
def test_scatter_copy_variants(ctx_with, how, shape):
    """A non-stateful scatter_nd copies the unchanged rows (vec4 kernel, identity kernel, or
    copy_buffer_to_buffer: KernelOptions.cache_copy) and writes the new one; odd sizes keep the
    vec4 copy's last vector inside the padded buffer."""
    rng = np.random.default_rng()
    ctx = ctx_with(cache_copy=how)
    data, upd = rand(rng, *shape), rand(rng, 1, *shape[1:])
    row = int(rng.integers(shape[0]))
    got = run(ctx, lambda b, i: b.scatter_nd(
        i["data"], b.constant(data_type="int32", shape=[1, 1], value=np.array([[row]], np.int32)),
        i["upd"]), {"data": data, "upd": upd})
    want = data.copy()
    want[row] = upd[0]
    np.testing.assert_array_equal(got.reshape(shape), want)


def _gemv_plan_and_result(ctx, w: np.ndarray, x: np.ndarray):
    b = MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=list(x.shape))
    g = b.build({"y": b.matmul(xi, b.constant(data_type="float32", shape=list(w.shape),
                                              value=w))})
    tx = ctx.create_tensor(data_type="float32", shape=list(x.shape), writable=True)
    ty = ctx.create_tensor(data_type="float32", shape=[x.shape[0], w.shape[1]], readable=True)
    ctx.write_tensor(tx, x)
    ctx.dispatch(g, {"x": tx}, {"y": ty})
    kernels = [la.kernel for la in g._plan.launches if hasattr(la, "kernel")]
    got = ctx.read_tensor(ty)
    g.destroy()
    return kernels, got


@pytest.mark.parametrize("how", [None, "f16", "f32"])
@pytest.mark.parametrize("exact", [True, False])
def test_gemv_float16_weights(ctx_with, how, exact):
    """Constant gemv weights stored as float16 (KernelOptions.gemv_weights): by default only
    where every value is a float16 value (lossless), always with "f16", never with "f32".
    The result is the float64 product of the weights as stored, and half the weight bytes
    are counted."""
    rng = np.random.default_rng()
    ctx = ctx_with(gemv="rows", gemv_weights=how)
    K, N = 260, 129
    w, x = rand(rng, K, N), rand(rng, 1, K)
    if exact:
        w = w.astype(np.float16).astype(np.float32)
    kernels, got = _gemv_plan_and_result(ctx, w, x)
    half = how == "f16" or (how is None and exact)
    (k,) = [k for k in kernels if k.name == "matmul_gemv"]
    assert ("unpack2x16float" in k.wgsl) == half
    assert k.bytes == 4 * (K + N) + (2 if half else 4) * K * N
    stored = w.astype(np.float16).astype(np.float64) if half else w.astype(np.float64)
    np.testing.assert_allclose(got, x.astype(np.float64) @ stored, rtol=1e-4, atol=1e-4)
