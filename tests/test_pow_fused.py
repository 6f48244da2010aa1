"""Pow feeding a reduction or a gemv prologue (RMSNorm as real exporters write it:
``Pow(x, 2) -> ReduceMean -> Add -> Sqrt -> Div``), converted and dispatched, against a
float64 NumPy oracle on fresh random data. The chain is spliced into the reduction (and
the gemv) kernel, which must carry the ``wpow`` helper it calls."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.pages import StatelessCopy
from tests.test_onnx_converter import run_graph

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)


@pytest.fixture(scope="module")
def context():
    from backends.webnn import ml

    ctx = ml.create_context(state_support=True)
    yield ctx
    ctx.destroy()


def _rmsnorm_model(x_shape, w: np.ndarray, proj: np.ndarray | None, eps: float):
    """RMSNorm as exported: Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(w),
    then a MatMul by ``proj`` when given (the gemv computes the norm as its prologue)."""
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["xn"]),
        helper.make_node("Mul", ["xn", "w"], ["y" if proj is None else "yn"]),
    ]
    inits = {"two": np.array(2.0, np.float32), "axes": np.array([-1], np.int64),
             "eps": np.array(eps, np.float32), "w": w}
    out_shape = list(x_shape)
    if proj is not None:
        nodes.append(helper.make_node("MatMul", ["yn", "proj"], ["y"]))
        inits["proj"] = proj
        out_shape[-1] = proj.shape[1]
    g = helper.make_graph(
        nodes, "rmsnorm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("shape,with_proj", [((1, 1, 64), False), ((2, 3, 48), False),
                                             ((1, 1, 64), True)])
def test_rmsnorm_as_exported_matches_float64(context, shape, with_proj):
    rng = np.random.default_rng()  # fresh data every run
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    proj = rng.standard_normal((shape[-1], 40)).astype(np.float32) if with_proj else None
    eps = 1e-6
    got = run_graph(context, _rmsnorm_model(shape, w, proj, eps), {"x": x})["y"]
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 ** 2, axis=-1, keepdims=True) + eps) * w.astype(np.float64)
    if proj is not None:
        want = want @ proj.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("where", ["query", "score"])
def test_pow_inside_attention_matches_float64(ctx, where):
    """A pow in the query chain (q = qin³) or in the score chain (s = (q·kᵀ / 4)³) is
    computed inside the flash-decoding kernel: still two launches, same result."""
    from backends.webnn import MLGraphBuilder

    rng = np.random.default_rng()
    heads, g, cap, d = 2, 4, 96, 8
    b = MLGraphBuilder(ctx)
    qin = b.input("qin", data_type="float32", shape=[1, heads, g, d])
    k = b.input("k", data_type="float32", shape=[1, heads, cap, d])
    v = b.input("v", data_type="float32", shape=[1, heads, cap, d])
    three = b.constant(data_type="float32", shape=[1], value=np.float32([3.0]))
    quarter = b.constant(data_type="float32", shape=[1], value=np.float32([0.25]))
    q = b.pow(qin, three) if where == "query" else qin
    s = b.matmul(q, b.transpose(k, [0, 1, 3, 2]))
    if where == "score":
        s = b.pow(b.mul(s, quarter), three)
    outs = {"y": b.matmul(b.softmax(s, 3), v)}
    gr = b.build(outs)
    assert [la.kernel.name for la in gr._plan.launches] == ["attention_flash", "attention_combine"]
    feeds = {"qin": 0.5 * rng.standard_normal((1, heads, g, d)),
             "k": rng.standard_normal((1, heads, cap, d)), "v": rng.standard_normal((1, heads, cap, d))}
    q64 = feeds["qin"] ** 3 if where == "query" else feeds["qin"]
    s64 = np.einsum("bhgd,bhcd->bhgc", q64, feeds["k"])
    if where == "score":
        s64 = (s64 / 4) ** 3
    e = np.exp(s64 - s64.max(-1, keepdims=True))
    want = np.einsum("bhgc,bhcd->bhgd", e / e.sum(-1, keepdims=True), feeds["v"])
    ins = {}
    for n, a in feeds.items():
        ins[n] = ctx.create_tensor(data_type="float32", shape=list(a.shape), writable=True)
        ctx.write_tensor(ins[n], a.astype(np.float32))
    out = ctx.create_tensor(data_type="float32", shape=[1, heads, g, d], readable=True)
    ctx.dispatch(gr, ins, {"y": out})
    got = np.asarray(ctx.read_tensor(out), np.float64).reshape(1, heads, g, d)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
