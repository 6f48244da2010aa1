"""A per-head RMS norm gated by silu(z) (Qwen3.5's GatedRMSNorm after its gated delta step)
read only by a one-row product: the product's workgroups compute every head's mean of
squares (``gemv.grouped_reduction``, ``reduce.grouped_reduction``) before they read the
vector, so the norm has no launch; against float64 NumPy on fresh random inputs, the
kernels' WGSL accepted by naga (the dispatch) and Tint."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder
from tests.test_webnn_quant import _q4_weights

EPS = 1e-6


def _gated_norm(b, x, z, g, heads: int, d: int):
    """x / sqrt(mean(x·x) + eps) · g · silu(z) over each head's d values, read flat."""
    xr = b.reshape(x, [1, heads, d])
    ms = b.reduce_mean(b.mul(xr, xr), axes=[2], keep_dimensions=True)
    n = b.mul(b.div(xr, b.sqrt(b.add(ms, b.constant(data_type="float32", shape=[],
                                                      value=np.float32(EPS))))), g)
    zr = b.reshape(z, [1, heads, d])
    return b.reshape(b.mul(n, b.mul(zr, b.sigmoid(zr))), [1, heads * d])


def _gated_norm64(x, z, g, heads: int, d: int):
    xr, zr = x.reshape(heads, d), z.reshape(heads, d)
    ms = np.mean(xr * xr, axis=-1, keepdims=True)
    return (xr / np.sqrt(ms + EPS) * g * zr / (1 + np.exp(-zr))).reshape(1, -1)


def _run(ctx, monkeypatch, heads: int, d: int, N: int, q4: bool, shared: int = 32768):
    """(the product's output, float64 oracle, launches) on the GPU's plan."""
    monkeypatch.setattr(ctx, "_target", dataclasses.replace(
        ctx._target, cpu=False, subgroup=None, shared_bytes=shared))
    rng = np.random.default_rng()
    K = heads * d
    b = MLGraphBuilder(ctx)
    if q4:
        w, w64 = _q4_weights(b, rng, K, N, "float32")
    else:
        w64 = rng.standard_normal((K, N)) / np.sqrt(K)
        w = b.constant(data_type="float32", shape=[K, N], value=w64.astype(np.float32))
        w64 = w64.astype(np.float32).astype(np.float64)
    gv = rng.uniform(0.5, 1.5, d).astype(np.float32)
    x, z = (rng.standard_normal((1, K)).astype(np.float32) for _ in range(2))
    xi = b.input("x", data_type="float32", shape=[1, K])
    zi = b.input("z", data_type="float32", shape=[1, K])
    g = b.constant(data_type="float32", shape=[d], value=gv)
    gr = b.build({"y": b.matmul(_gated_norm(b, xi, zi, g, heads, d), w)})
    feeds = {}
    for name, a in (("x", x), ("z", z)):
        feeds[name] = ctx.create_tensor(data_type="float32", shape=[1, K], writable=True)
        ctx.write_tensor(feeds[name], a)
    ty = ctx.create_tensor(data_type="float32", shape=[1, N], readable=True)
    ctx.dispatch(gr, feeds, {"y": ty})
    got = np.asarray(ctx.read_tensor(ty), np.float64)
    want = _gated_norm64(x.astype(np.float64), z.astype(np.float64), gv.astype(np.float64),
                         heads, d) @ w64
    launches = [la.kernel for la in gr._plan.launches]
    return got, want, launches


@pytest.mark.parametrize("heads,d,N", [(4, 32, 96), (32, 128, 64), (3, 64, 40),
                                       (320, 4, 32), (2, 128, 36)])
@pytest.mark.parametrize("how", ["quad", "quad_k4", "rows"])
def test_a_per_head_norm_is_computed_by_the_product_reading_it(ctx_with, monkeypatch,
                                                               heads, d, N, how):
    """4-bit products on the "quad" kernel (the default norms: computed where read) and
    float ones on the rows kernel (``gemv_prologue`` full): one launch, the product's; the
    means summed by lanes of a head at a time, or (more heads than invocations) one lane a
    head over several rounds."""
    q4 = how != "rows"
    ctx = (ctx_with(gemv="rows", q4_gemv=how) if q4
           else ctx_with(gemv="rows", gemv_prologue="full"))
    got, want, launches = _run(ctx, monkeypatch, heads, d, N, q4)
    assert [k.name for k in launches] == ["gemv_q4_quad" if q4 else "matmul_gemv"], launches
    assert "red_g[" in launches[0].wgsl
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_the_norm_keeps_its_launch_where_its_means_do_not_fit(ctx_with, monkeypatch):
    """Float weights on the rows kernel copy the vector into workgroup memory: at the
    default 16 KiB, a 4096-wide vector and its means do not fit, and the norm keeps its
    launch; the results the same."""
    ctx = ctx_with(gemv="rows", gemv_prologue="full")
    got, want, launches = _run(ctx, monkeypatch, 32, 128, 16, False, shared=16384)
    assert len(launches) > 1 and all("red_g[" not in k.wgsl for k in launches), launches
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.parametrize("heads,d", [(32, 128), (320, 4)])
def test_the_grouped_reduction_compiles_with_tint(heads, d):
    """The quad kernel and the rows kernel reading a per-head norm: Tint accepts them
    (naga does where the tests above dispatch them)."""
    from wgsl_compilers import compiler_device, rejection

    from backends.webnn.kernels import matmul as MM
    from backends.webnn.kernels import quant_rows as QR

    if compiler_device("dawn")[0] is None:
        pytest.skip(compiler_device("dawn")[1])
    K = heads * d
    src = ("@group(0) @binding(0) var<storage, read> in0: array<f32>;\n"
           "fn v0(i: u32, red: f32) -> f32 { return in0[i] / sqrt(red + 1e-6); }\n")
    pro = MM.VectorSource(src, ["read"], f"v0({{0}}, red_g[({{0}}) / {d}u])",
                          ("reduce_mean", "(in0[{}] * in0[{}])".replace("{}", "{0}"), K),
                          group=d)
    kernels = [QR.gemv_q4_quad(K, 64, 32, signed=True, zero_points=False, prologue=pro),
               MM.gemv_rows((1, K), (64, K), (1, 64), prologue=pro)]
    for k in kernels:
        assert "red_g[" in k.wgsl
        assert rejection("dawn", k.wgsl) == "", k.wgsl
