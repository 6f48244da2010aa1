"""gatherElements, gatherND, quantizeLinear and reverse (the W3C ops WPT's conformance tests
try): a subset of WPT's own cases at WPT's tolerances (gathers and reverse 0 ULP,
quantizeLinear 1 ULP of the integer output, ``webnn/conformance_tests/*.https.any.js``), then
fresh random inputs (never zeros) against NumPy oracles, negative and out-of-range indices
(counted from the end, then clamped: ``gather``'s choice, which WPT's expected values
assume), and the builder's TypeErrors where the spec throws. Few graphs, so the module stays
fast on lavapipe.
"""

from __future__ import annotations

import numpy as np
import pytest
from webnn_run import run_graph

from backends.webnn import MLGraphBuilder

RNG = np.random.default_rng(4747)

#: WPT's gather/gatherND/gatherElements/reverse input data (16 values)
W = np.array([-66.05901336669922, -68.9197006225586, -77.02045440673828, -26.158037185668945,
              89.0337142944336, -45.89653396606445, 43.84803771972656, 48.81806945800781,
              51.79948425292969, 41.94132614135742, -1.1303654909133911, -50.42131042480469,
              90.2870101928711, 55.620765686035156, 44.92119598388672, 56.828636169433594],
             np.float32)
#: WPT's quantizeLinear input data
Q = np.array([-2.549168109893799, -4.794857501983643, 8.413617134094238, 6.108623504638672],
             np.float32)


def _const(b, dt, shape, values):
    return b.constant(data_type=dt, shape=list(shape),
                      value=np.asarray(values, dtype=dt).reshape(shape))


def _draw(shape, dt="float32"):
    """Uniform magnitudes in [0.25, 8) with random signs: never zero."""
    mag = RNG.uniform(0.25, 8.0, size=shape)
    return (mag * RNG.choice([-1.0, 1.0], size=shape)).astype(dt)


def _wrap_clamp(idx, dim):
    """The index semantics: negative counts from the end, then clamped into [0, dim)."""
    i = np.asarray(idx, np.int64)
    return np.clip(np.where(i < 0, i + dim, i), 0, dim - 1)


def _gather_elements_ref(x, idx, axis):
    return np.take_along_axis(x, _wrap_clamp(idx, x.shape[axis]), axis)


def _gather_nd_ref(x, idx):
    k = idx.shape[-1]
    tup = np.stack([_wrap_clamp(idx[..., j], x.shape[j]) for j in range(k)], -1)
    flat = tup.reshape(-1, k)
    rows = [x[tuple(t)] for t in flat]
    return np.stack(rows).reshape(idx.shape[:-1] + x.shape[k:])


def _quantize_ref(x, scale, zp, block, lo, hi):
    """clamp(roundEven(x / scale) + zp): the division in float32, as the kernel and the
    spec's float32 operands have it (halves to even: ``np.rint``)."""
    pad = (1,) * (x.ndim - np.ndim(scale))
    s, z = np.reshape(scale, pad + np.shape(scale)), np.reshape(zp, pad + np.shape(zp))
    for ax, bk in enumerate(block):
        s, z = np.repeat(s, bk, ax), np.repeat(z, bk, ax)
    q = np.rint((x / s.astype(np.float32)).astype(np.float64)) + z.astype(np.float64)
    return np.clip(q, lo, hi)


# -- WPT's own cases ---------------------------------------------------------------------
def test_wpt_cases(ctx):
    """Cases of gatherND, gatherElements, quantizeLinear, quantize_linear_subgraph and
    reverse as WPT encodes them (inputs, options, expected outputs)."""
    b = MLGraphBuilder(ctx)
    x16 = b.input("x16", data_type="float32", shape=[16])
    x9 = b.input("x9", data_type="float32", shape=[9])
    x12 = b.input("x12", data_type="float32", shape=[12])
    i32 = lambda shape, v: _const(b, "int32", shape, v)  # noqa: E731
    out, want = {}, {}
    out["nd_3d"] = b.gather_nd(b.reshape(x16, [2, 2, 4]), i32([3, 2], [1, 0, 0, 1, 1, 1]))
    want["nd_3d"] = W.reshape(4, 4)[[2, 1, 3]]
    for dt in ("int64", "uint32"):
        out[f"nd_4d_{dt}"] = b.gather_nd(b.reshape(x16, [2, 2, 2, 2]),
                                         _const(b, dt, [3], [1, 0, 0]))
        want[f"nd_4d_{dt}"] = W[8:10]
    out["nd_minimum"] = b.gather_nd(b.reshape(x16, [2, 2, 2, 2]), i32([3], [-2, -2, -2]))
    want["nd_minimum"] = W[:2]
    out["nd_negative"] = b.gather_nd(b.reshape(x16, [4, 4]), i32([2, 2], [-1, -2, -3, -4]))
    want["nd_negative"] = np.array([W[14], W[4]])
    out["nd_out_of_bounds"] = b.gather_nd(x16, i32([2, 1], [16, 20]))
    want["nd_out_of_bounds"] = np.array([W[15], W[15]])
    out["nd_out_of_bounds_2d"] = b.gather_nd(b.reshape(x16, [16, 1]), i32([2, 1], [16, 20]))
    want["nd_out_of_bounds_2d"] = np.array([[W[15]], [W[15]]])
    out["ge_axis1_uint32"] = b.gather_elements(b.reshape(x9, [3, 3]),
                                               _const(b, "uint32", [3, 2], [1, 0, 2, 2, 1, 0]),
                                               axis=1)
    want["ge_axis1_uint32"] = np.array([W[1], W[0], W[5], W[5], W[7], W[6]]).reshape(3, 2)
    out["ge_axis0"] = b.gather_elements(b.reshape(x9, [3, 3]), i32([2, 3], [1, 0, 2, 2, 1, 0]))
    want["ge_axis0"] = np.array([W[3], W[1], W[8], W[6], W[4], W[2]]).reshape(2, 3)
    out["ge_negative"] = b.gather_elements(b.reshape(b.slice(x9, [0], [8]), [2, 2, 2]),
                                           i32([1, 2, 2], [-1, 0, 0, -1]))
    want["ge_negative"] = np.array([W[4], W[1], W[2], W[7]]).reshape(1, 2, 2)
    out["ge_out_of_bounds"] = b.gather_elements(b.slice(x9, [3], [6]), i32([1], [7]))
    want["ge_out_of_bounds"] = W[8:9]
    out["rev_default"] = b.reverse(b.reshape(x12, [3, 4]))
    want["rev_default"] = W[:12][::-1].reshape(3, 4)
    out["rev_axes_1_2"] = b.reverse(b.reshape(x12, [3, 2, 2]), axes=[1, 2])
    want["rev_axes_1_2"] = W[:12].reshape(3, 2, 2)[:, ::-1, ::-1]
    out["rev_axes_3_1"] = b.reverse(b.reshape(x12, [3, 2, 1, 2]), axes=[3, 1])
    want["rev_axes_3_1"] = W[:12].reshape(3, 2, 1, 2)[:, ::-1, :, ::-1]
    out["rev_no_axes"] = b.reverse(b.reshape(x12, [2, 1, 2, 3]), axes=[])
    want["rev_no_axes"] = W[:12].reshape(2, 1, 2, 3)
    # quantizeLinear.https.any.js
    f32 = lambda shape, v: _const(b, "float32", shape, v)  # noqa: E731
    out["q_0d_int8"] = b.quantize_linear(f32([], 10.794857501983643), f32([], 1.1202747821807861),
                                         _const(b, "int8", [], 1))
    want["q_0d_int8"] = np.int8(11)
    s4 = [9.343092918395996, 0.2800687253475189, 4.617084980010986, 1.1202747821807861]
    u128 = _const(b, "uint8", [4], [128] * 4)
    out["q_1d_uint8"] = b.quantize_linear(f32([4], Q), f32([4], s4), u128)
    want["q_1d_uint8"] = np.array([128, 111, 130, 133], np.uint8)
    s4n = list(s4)
    s4n[2] = -s4n[2]
    out["q_negative_scale"] = b.quantize_linear(f32([4], Q), f32([4], s4n), u128)
    want["q_negative_scale"] = np.array([128, 111, 126, 133], np.uint8)
    out["q_broadcast"] = b.quantize_linear(f32([2, 2], Q), f32([1, 1], [9.343092918395996]),
                                           _const(b, "uint8", [1, 1], [128]))
    want["q_broadcast"] = np.array([[128, 127], [129, 129]], np.uint8)
    out["q_block_1_2_1"] = b.quantize_linear(
        f32([1, 4, 1], Q), f32([1, 2, 1], [0.2800687253475189, -4.617084980010986]),
        _const(b, "uint8", [1, 2, 1], [128, 189]))
    want["q_block_1_2_1"] = np.array([119, 111, 187, 188], np.uint8).reshape(1, 4, 1)
    # quantize_linear_subgraph.https.any.js: zeroPoint an input, blocks [2, 1] of [4, 3]
    qin = b.input("qin", data_type="float32", shape=[1, 1, 4, 3])
    qs = b.input("qs", data_type="float32", shape=[2, 3])
    qz = b.input("qz", data_type="int8", shape=[2, 3])
    out["q_subgraph"] = b.quantize_linear(qin, qs, qz)
    out["q_subgraph_relu"] = b.relu(qs)
    want["q_subgraph"] = np.array([13, 121, 25, 12, 121, 26, 44, 23, 55, 45, 24, 56],
                                  np.int8).reshape(1, 1, 4, 3)
    qs_v = np.array([0.3804761469364166, -0.5280312299728394, 0.21947036683559418,
                     -0.36689770221710205, 0.33974137902259827, -0.4200059771537781],
                    np.float32).reshape(2, 3)
    want["q_subgraph_relu"] = np.maximum(qs_v, 0)
    qin_v = np.array([0.6124474406242371, 0.8857858777046204, 0.13667134940624237,
                      0.5645291209220886, 0.8965172171592712, 0.36792829632759094,
                      0.6811466217041016, 0.0479511022567749, 0.33355462551116943,
                      0.19882695376873016, 0.41167140007019043, 0.07934240251779556],
                     np.float32).reshape(1, 1, 4, 3)
    got = run_graph(ctx, b, out, {"x16": W, "x9": W[:9], "x12": W[:12], "qin": qin_v, "qs": qs_v,
                             "qz": np.array([11, 123, 24, 46, 23, 56], np.int8).reshape(2, 3)})
    for k, w in want.items():
        g = got[k]
        w = np.asarray(w)
        assert g.shape == w.shape, (k, g.shape, w.shape)
        if k.startswith("q_") and k != "q_subgraph_relu":
            assert g.dtype == w.dtype, (k, g.dtype)
            d = np.abs(g.astype(np.int64) - w.astype(np.int64))
            assert d.max() <= 1, f"{k}: {g} vs {w}"  # WPT: 1 ULP of the integer output
        else:
            np.testing.assert_array_equal(g, w.astype(np.float32), err_msg=k)


def test_wpt_qdq_subgraph_add(ctx):
    """qdq_subgraph.https.any.js's "quantized element-wise binary add": quantizeLinear ->
    dequantizeLinear (int8) -> add -> quantizeLinear -> dequantizeLinear."""
    b = MLGraphBuilder(ctx)
    a = b.input("a", data_type="float32", shape=[1, 1, 2, 3])
    sc = _const(b, "float32", [1], [0.003921568859368563])
    zp = _const(b, "int8", [1], [-128])
    da = b.dequantize_linear(b.quantize_linear(a, sc, zp), sc, zp)
    db = b.dequantize_linear(_const(b, "int8", [1, 1, 2, 3], [2, 7, 8, 11, 5, 23]), sc, zp)
    y = b.dequantize_linear(b.quantize_linear(b.add(da, db), sc, zp), sc, zp)
    av = np.array([0.41167140007019043, 0.0479511022567749, 0.33355462551116943,
                   0.19882695376873016, 0.41167140007019043, 0.07934240251779556],
                  np.float32).reshape(1, 1, 2, 3)
    got = run_graph(ctx, b, {"y": y}, {"a": av})["y"]
    want = np.array([0.9215686917304993, 0.5764706134796143, 0.8666667342185974,
                     0.7450980544090271, 0.9333333969116211, 0.6705882549285889]).reshape(1, 1, 2, 3)
    np.testing.assert_allclose(got, want, rtol=1e-6)


# -- random inputs against NumPy ----------------------------------------------------------
def test_random_against_numpy(ctx):
    """Random shapes' worth of inputs, indices spanning [-2 dim, 2 dim) (negative, in range and
    out of range on both sides), each index type; int32 and int8 data move too; quantizeLinear
    per tensor, per axis and in blocks to int8, uint8 and int32, with saturation and exact
    halves (scales of powers of two make x / scale exact)."""
    b = MLGraphBuilder(ctx)
    x = _draw((4, 5, 6))
    xi = RNG.integers(1, 100, size=(4, 5, 6)).astype(np.int32)
    x8 = RNG.integers(-128, 128, size=(3, 7)).astype(np.int8)
    x8[x8 == 0] = 5
    xin = b.input("x", data_type="float32", shape=[4, 5, 6])
    iin = b.input("xi", data_type="int32", shape=[4, 5, 6])
    i8in = b.input("x8", data_type="int8", shape=[3, 7])
    out, want = {}, {}
    for axis, ishape, it in ((0, (7, 5, 6), "int32"), (1, (4, 3, 6), "int64"),
                             (2, (4, 5, 9), "uint32")):
        d = x.shape[axis]
        lo = 0 if it == "uint32" else -2 * d
        idx = RNG.integers(lo, 2 * d, size=ishape).astype(it)
        c = _const(b, it, ishape, idx)
        out[f"ge{axis}"] = b.gather_elements(xin, c, axis=axis)
        want[f"ge{axis}"] = _gather_elements_ref(x, idx, axis)
        out[f"ge{axis}_int"] = b.gather_elements(iin, c, axis=axis)
        want[f"ge{axis}_int"] = _gather_elements_ref(xi, idx, axis)
    for k, ishape, it in ((1, (3, 1), "int32"), (2, (2, 3, 2), "int64"), (3, (5, 3), "int32"),
                          (2, (2,), "uint32")):
        hi = [2 * d for d in x.shape[:k]]
        idx = np.stack([RNG.integers(0 if it == "uint32" else -h, h, size=ishape[:-1])
                        for h in hi], -1).astype(it)
        c = _const(b, it, ishape, idx)
        name = f"nd{k}_{len(ishape)}"
        out[name] = b.gather_nd(xin, c)
        want[name] = _gather_nd_ref(x, idx)
        out[name + "_int"] = b.gather_nd(iin, c)
        want[name + "_int"] = _gather_nd_ref(xi, idx)
    i8idx = np.array([[-1, 9], [2, -9]], np.int32)
    out["nd_int8"] = b.gather_nd(i8in, _const(b, "int32", [2, 2], i8idx))
    want["nd_int8"] = _gather_nd_ref(x8, i8idx)
    for axes in (None, [0], [2, 0], [1]):
        key = f"rev_{axes}"
        out[key] = b.reverse(xin, axes=axes)
        want[key] = np.flip(x, axis=None if axes is None else tuple(axes))
    out["rev_int8"] = b.reverse(i8in, axes=[1])
    want["rev_int8"] = x8[:, ::-1]
    out["rev_int"] = b.reverse(iin)
    want["rev_int"] = xi[::-1, ::-1, ::-1]
    # quantizeLinear: (zero point type, its range, scale shape)
    for zt, (lo, hi), sshape in (("int8", (-128, 127), (1, 5, 1)), ("uint8", (0, 255), ()),
                                 ("int32", (-2 ** 31, 2 ** 31 - 1), (2, 1, 3))):
        block = [d // s for d, s in zip(x.shape, (1,) * (3 - len(sshape)) + sshape,
                                         strict=True)]
        sv = RNG.uniform(0.01, 0.2, size=sshape).astype(np.float32)
        sv *= RNG.choice([-1.0, 1.0], size=sshape).astype(np.float32)
        zv = RNG.integers(max(lo, -100), min(hi, 100) + 1, size=sshape).astype(zt)
        zv = np.where(zv == 0, 3, zv).astype(zt)
        q = b.quantize_linear(xin, _const(b, "float32", sshape, sv), _const(b, zt, sshape, zv))
        assert q.data_type == zt
        out[f"q_{zt}"] = q
        want[f"q_{zt}"] = _quantize_ref(x, sv, zv, block, lo, hi).astype(zt)
    halves = (np.arange(-40, 40) + 0.5).astype(np.float32) * 0.25  # x / 0.25 = k + 0.5 exactly
    hin = b.input("h", data_type="float32", shape=[80])
    out["q_halves"] = b.quantize_linear(hin, _const(b, "float32", [], 0.25),
                                        _const(b, "int8", [], -3))
    want["q_halves"] = (np.rint(np.arange(-40, 40) + 0.5) - 3).astype(np.int8)
    big = np.array([1e6, -1e6, 300.0, -300.0, 3e9, -3e9], np.float32)
    bin_ = b.input("big", data_type="float32", shape=[6])
    one = _const(b, "float32", [], 1.0)
    out["sat_uint8"] = b.quantize_linear(bin_, one, _const(b, "uint8", [], 7))
    want["sat_uint8"] = np.array([255, 0, 255, 0, 255, 0], np.uint8)
    out["sat_int8"] = b.quantize_linear(bin_, one, _const(b, "int8", [], -7))
    want["sat_int8"] = np.array([127, -128, 127, -128, 127, -128], np.int8)
    out["sat_int32"] = b.quantize_linear(bin_, one, _const(b, "int32", [], 5))
    want["sat_int32"] = np.array([1000005, -999995, 305, -295, 2 ** 31 - 128, -2 ** 31],
                                 np.int32)
    got = run_graph(ctx, b, out, {"x": x, "xi": xi, "x8": x8, "h": halves, "big": big})
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype)
        if k in ("q_int8", "q_uint8", "q_int32"):  # WPT: 1 ULP of the integer output
            d = np.abs(g.astype(np.int64) - w.astype(np.int64))
            assert d.max() <= 1, (k, d.max())
        else:
            np.testing.assert_array_equal(g, w, err_msg=k)


def test_float16_moves_exactly(ctx):
    """float16 data through the three moves and quantizeLinear (widened to float32 here:
    exact for the moves, the division in float32 for quantizeLinear)."""
    from conftest import missing_adapter_features

    why = missing_adapter_features("shader-f16")
    if why:
        pytest.skip(why)
    x = _draw((3, 4)).astype(np.float16)
    b = MLGraphBuilder(ctx)
    xin = b.input("x", data_type="float16", shape=[3, 4])
    idx = np.array([[-1, 5, 0, 2], [1, -4, 3, 0]], np.int32)
    nd = np.array([[2, -1], [0, 9]], np.int32)
    sc = np.float16(0.0625)
    out = {"ge": b.gather_elements(xin, _const(b, "int32", [2, 4], idx)),
           "nd": b.gather_nd(xin, _const(b, "int32", [2, 2], nd)),
           "rev": b.reverse(xin, axes=[1]),
           "q": b.quantize_linear(xin, _const(b, "float16", [], sc), _const(b, "int8", [], 1))}
    got = run_graph(ctx, b, out, {"x": x})
    np.testing.assert_array_equal(got["ge"], _gather_elements_ref(x, idx, 0))
    np.testing.assert_array_equal(got["nd"], _gather_nd_ref(x, nd))
    np.testing.assert_array_equal(got["rev"], x[:, ::-1])
    assert got["ge"].dtype == np.float16 and got["q"].dtype == np.int8
    want_q = np.clip(np.rint(x.astype(np.float32) / np.float32(sc)) + 1, -128, 127)
    np.testing.assert_array_equal(got["q"], want_q.astype(np.int8))


# -- validation ---------------------------------------------------------------------------
def test_builder_throws_type_error_where_the_spec_does(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 2, 3, 4])
    x3 = b.input("x3", data_type="float32", shape=[3, 2, 5])
    names = iter(range(1000))

    def i(shape: list[int], dt: str = "int32"):
        return b.input(f"i{next(names)}", data_type=dt, shape=shape)

    scale5 = b.input("s5", data_type="float32", shape=[5])
    zp5 = b.input("z5", data_type="int8", shape=[5])
    # the valid ones first (WPT's validation tests' shapes)
    assert b.gather_elements(b.input("g", data_type="float32", shape=[1, 2, 3]),
                             i([2, 2, 3])).shape == [2, 2, 3]
    assert b.gather_elements(x, i([1, 2, 1, 4]), axis=2).shape == [1, 2, 1, 4]
    assert b.gather_nd(b.input("n", data_type="float32", shape=[2, 2, 3, 3, 4]),
                       i([5, 4, 3])).shape == [5, 4, 3, 4]
    assert b.reverse(b.input("r", data_type="int32", shape=[1, 2, 3]), axes=[0, 1]).shape \
        == [1, 2, 3]
    assert b.quantize_linear(x3, scale5, zp5).shape == [3, 2, 5]
    six = b.input("six", data_type="float32", shape=[6, 4, 5])
    q = b.quantize_linear(six, b.input("sb", data_type="float32", shape=[2, 2, 1]),
                          b.input("zb", data_type="uint8", shape=[2, 2, 1]))
    assert q.data_type == "uint8" and q.shape == [6, 4, 5]
    q4 = b.quantize_linear(x3, scale5, b.constant(data_type="int4", shape=[5],
                                                  value=np.zeros(3, np.uint8)))
    assert q4.data_type == "int4" and q4.shape == [3, 2, 5]
    assert b.dequantize_linear(q4, scale5, b.input("zi4", data_type="int4", shape=[5])).shape \
        == [3, 2, 5]
    assert b.dequantize_linear(b.input("q8", data_type="int8", shape=[6]),
                               b.input("s1", data_type="float32", shape=[1]),
                               b.input("z1", data_type="int8", shape=[1])).shape == [6]
    other = MLGraphBuilder(ctx)
    ox = other.input("x", data_type="float32", shape=[2, 2])
    bad = [
        lambda: b.gather_elements(b.input("s", data_type="float32", shape=[]), i([])),  # scalar
        lambda: b.gather_elements(x, i([1, 2, 3, 4]), axis=4),  # axis >= rank
        lambda: b.gather_elements(x, i([1, 2, 3, 4]), axis=-1),  # an unsigned long
        lambda: b.gather_elements(x, i([1, 2, 3, 4], "float32")),
        lambda: b.gather_elements(x, i([1, 2, 3])),  # rank differs
        lambda: b.gather_elements(x, i([3, 2, 3, 4]), axis=3),  # shape differs outside axis
        lambda: b.gather_elements(ox, i([2, 2])),  # another builder's
        lambda: b.gather_nd(b.input("s2", data_type="float32", shape=[]), i([1, 1, 1])),
        lambda: b.gather_nd(x3, i([])),
        lambda: b.gather_nd(x3, i([1, 1, 1], "float32")),
        lambda: b.gather_nd(x3, i([1, 1, 4])),  # tuples longer than the rank
        lambda: b.gather_nd(ox, i([2, 1])),
        lambda: b.reverse(b.input("r3", data_type="float32", shape=[3, 3]), axes=[3]),
        lambda: b.reverse(x, axes=[2, 2, 3]),
        lambda: b.reverse(x, axes=[-1]),
        lambda: b.reverse(ox),
        lambda: b.quantize_linear(x3, b.input("sx", data_type="float32", shape=[2, 1, 5]),
                                  b.input("zx", data_type="int8", shape=[2, 1, 5])),  # no divide
        lambda: b.quantize_linear(x3, scale5, b.input("z25", data_type="int8", shape=[2, 5])),
        lambda: b.quantize_linear(x3, b.input("sh", data_type="float16", shape=[3, 1, 5]),
                                  b.input("zh", data_type="int8", shape=[3, 1, 5])),
        lambda: b.quantize_linear(b.input("xi", data_type="int32", shape=[3, 2, 5]), scale5,
                                  zp5),
        lambda: b.quantize_linear(x3, b.input("si", data_type="int32", shape=[5]),
                                  b.input("zu", data_type="uint8", shape=[5])),
        lambda: b.quantize_linear(x3, scale5, b.input("zf", data_type="float16", shape=[5])),
        lambda: b.quantize_linear(x3, scale5, b.input("zui", data_type="uint32", shape=[5])),
        lambda: b.quantize_linear(x3, scale5, b.constant(data_type="int4", shape=[5],
                                                         value=np.zeros(5, np.uint8))),
        lambda: b.relu(b.quantize_linear(x3, scale5, b.input("z4", data_type="int4",
                                                             shape=[5]))),  # only the two ops
        lambda: b.quantize_linear(ox, scale5, zp5),
        lambda: b.dequantize_linear(b.input("df", data_type="float32", shape=[5]), scale5, zp5),
    ]
    for k, f in enumerate(bad):
        with pytest.raises(TypeError):
            f()
            pytest.fail(f"case {k} did not raise")


def test_op_support_limits_lists_them(ctx):
    limits = ctx.op_support_limits()
    ge, nd = limits["gather_elements"], limits["gather_nd"]
    assert ge["indices"]["data_types"] == ["int32", "int64", "uint32"]
    assert ge["input"]["rank_range"]["min"] == 1 and nd["indices"]["rank_range"]["min"] == 1
    assert "int8" in nd["input"]["data_types"] and "float32" in limits["reverse"]["input"][
        "data_types"]
    ql = limits["quantize_linear"]
    assert ql["zero_point"]["data_types"] == ["int32", "int4", "int8", "uint4", "uint8"]
    assert ql["output"]["data_types"] == ql["zero_point"]["data_types"]
    assert "float32" in ql["input"]["data_types"] and "int32" not in ql["input"]["data_types"]
    dq = limits["dequantize_linear"]["input"]["data_types"]
    assert {"int4", "uint4", "int8", "uint8", "int32"} <= set(dq)
    for io in ("input", "constant", "output"):  # graph inputs and outputs move them packed
        assert {"int4", "uint4"} <= set(limits[io]["data_types"])
    assert "int4" not in limits["add"]["a"]["data_types"]


# -- int4 / uint4 beyond constants --------------------------------------------------------
#: the 4-bit types' ranges
RANGE4 = {"int4": (-8, 7), "uint4": (0, 15)}


def _pack4(values) -> np.ndarray:
    """4-bit values as the spec's buffer (two a byte, the lower index in the low nibble, an
    odd count's last high nibble zero): packed here, apart from the backend's own."""
    v = np.asarray(values, np.int64).reshape(-1) & 0xF
    if v.size % 2:
        v = np.append(v, 0)
    return (v[0::2] | (v[1::2] << 4)).astype(np.uint8)


def _unpack4(buf: np.ndarray, count: int, kind: str) -> np.ndarray:
    """The spec's buffer of ``count`` 4-bit elements as int64 values (sign-extended for
    int4); asserts the buffer's length and an odd count's zero high nibble."""
    assert buf.dtype == np.uint8 and buf.size == (count + 1) // 2, (buf.dtype, buf.size, count)
    v = np.stack([buf & 0xF, buf >> 4], -1).reshape(-1).astype(np.int64)
    if count % 2:
        assert v[-1] == 0, "an odd count's last high nibble must be zero"
    v = v[:count]
    return np.where(v > 7, v - 16, v) if kind == "int4" else v


def _const4(b, kind, shape, values):
    return b.constant(data_type=kind, shape=list(shape), value=_pack4(values))


def _blocks(xshape, sshape) -> list[int]:
    pad = (1,) * (len(xshape) - len(sshape)) + tuple(sshape)
    return [d // s for d, s in zip(xshape, pad, strict=True)]


#: WPT's quantizeLinear int4/uint4 cases (quantizeLinear.https.any.js): name -> (input,
#: its shape, scale, its shape, zero point, its type, WPT's expected output). WPT lists some
#: expected values one off the spec's (16 for a uint4, 13 where roundEven(1.60) + 12 is 14;
#: its tolerance is 1 ULP of the integer output), so results are checked exactly against the
#: float64 oracle and within 1 of WPT's.
WPT_Q4 = {
    "int4 zeroPoint odd size": ([4.794857501983643], [], [1.1202747821807861], [], [-4],
                                "int4", [-1]),
    "int4 zeroPoint even size": ([4.794857501983643, 3.23434354545], [2],
                                 [1.1202747821807861] * 2, [2], [-6, -5], "int4", [-2, -2]),
    "2D int4 zeroPoint even size": (
        [4.794857501983643, 3.23434354545, 2.794857501983643, 5.794857501983643, 0,
         7.23434354545], [3, 2], [1.1202747821807861, 2.1202747821807861], [2], [-6, -5],
        "int4", [-2, -3, -4, -3, -5, -2]),
    "int4 zeroPoint block_size [3, 2]": (
        [4.794857501983643, 3.23434354545, 2.794857501983643, 5.794857501983643, 0,
         7.23434354545] * 2, [3, 4], [1.1202747821807861, 2.1202747821807861], [2],
        [-6, -5], "int4", [-2, -3, -4, -3, -5, 0, -2, -3, -4, -1, -5, -2]),
    "uint4 zeroPoint odd size": (
        [4.794857501983643, 2.794857501983643, 1.794857501983643, 0, 3.794857501983643],
        [5], [1.1202747821807861], [], [12], "uint4", [16, 14, 13, 12, 15]),
    "uint4 zeroPoint even size": ([4.794857501983643, 3.23434354545], [2],
                                  [1.1202747821807861] * 2, [2], [1, 5], "uint4", [5, 8]),
    "uint4 zeroPoint block_size 3": (
        [4.794857501983643, 3.23434354545, 1.794857501983643, 2.23434354545,
         4.794857501983643, 3.23434354545], [6], [1.1202747821807861] * 2, [2], [1, 5],
        "uint4", [5, 4, 3, 7, 9, 8]),
}


def test_wpt_int4_uint4_quantize_linear(ctx):
    """WPT's quantizeLinear cases with an int4/uint4 zeroPoint: each result a graph output,
    read back as the spec's packed buffer (odd and even element counts)."""
    b = MLGraphBuilder(ctx)
    out, want, wpt = {}, {}, {}
    for k, (x, xs, s, ss, z, kind, expected) in enumerate(WPT_Q4.values()):
        xv = np.asarray(x, np.float32).reshape(xs)
        sv = np.asarray(s, np.float32).reshape(ss)
        q = b.quantize_linear(_const(b, "float32", xs, xv), _const(b, "float32", ss, sv),
                              _const4(b, kind, ss, z))
        assert q.data_type == kind and q.shape == xs
        out[f"q{k}"] = q
        zv = np.asarray(z, np.int64).reshape(ss)
        want[f"q{k}"] = _quantize_ref(xv, sv, zv, _blocks(xs, ss), *RANGE4[kind]).reshape(-1)
        wpt[f"q{k}"] = (kind, np.asarray(expected))
    got = run_graph(ctx, b, out, {})
    for key, (kind, expected) in wpt.items():
        g = _unpack4(got[key], expected.size, kind)
        np.testing.assert_array_equal(g, want[key], err_msg=key)
        assert np.abs(g - expected).max() <= 1, (key, g, expected)  # WPT: 1 ULP


#: WPT's dequantizeLinear cases whose int4/uint4 input and zeroPoint are graph inputs (not
#: constants): (input, its shape, scale, its shape, zero point, type, WPT's expected output)
WPT_DQ4 = {
    "uint4 even input size": ([15, 0], [2], [1.1202747821807861] * 2, [2], [0, 1], "uint4",
                              [16.804121017456055, -1.1202747821807861]),
    "uint4 odd input size": ([10, 12, 14], [3], [1.1202747821807861], [1], [2], "uint4",
                             [8.962198257446289, 11.202747344970703, 13.443297386169434]),
    "uint4 4D broadcasting zeroPoint": (
        [0, 1, 10, 15], [1, 1, 2, 2], [9.343092918395996, -4.617084980010986], [2, 1], [2, 3],
        "uint4", [-18.686185836791992, -9.343092918395996, -32.31959533691406,
                  -55.40502166748047]),
    "uint4 block_size [1, 1, 2]": (
        [0, 1, 10, 15], [1, 1, 4], [9.343092918395996, -4.617084980010986], [1, 2], [2, 3],
        "uint4", [-18.686185836791992, -9.343092918395996, -32.31959533691406,
                  -55.40502166748047]),
    "int4 even size": ([-8, -3], [2], [1.1202747821807861] * 2, [2], [0, -2], "int4",
                       [-8.962198257446289, -1.1202747821807861]),
    "int4 odd size": ([-1, 7, 0], [3], [1.1202747821807861], [1], [-3], "int4",
                      [2.2405495643615723, 11.202747344970703, 3.3608243465423584]),
}


def _dequantize_ref(q, scale, zp, block) -> np.ndarray:
    """(q - zp) * scale in float64, the scale and zero point repeated over their blocks."""
    pad = (1,) * (np.ndim(q) - np.ndim(scale))
    s = np.reshape(scale, pad + np.shape(scale)).astype(np.float64)
    z = np.reshape(zp, pad + np.shape(zp)).astype(np.float64)
    for ax, bk in enumerate(block):
        s, z = np.repeat(s, bk, ax), np.repeat(z, bk, ax)
    return (np.asarray(q, np.float64) - z) * s


def test_wpt_int4_uint4_dequantize_linear_inputs(ctx):
    """WPT's dequantizeLinear cases with int4/uint4 graph inputs: the input and zero point
    written by the page as packed buffers, then dequantised (1 ULP, WPT's tolerance)."""
    b = MLGraphBuilder(ctx)
    out, feeds, expect = {}, {}, {}
    for k, (x, xs, s, ss, z, kind, expected) in enumerate(WPT_DQ4.values()):
        xi = b.input(f"x{k}", data_type=kind, shape=xs)
        si = b.input(f"s{k}", data_type="float32", shape=ss)
        zi = b.input(f"z{k}", data_type=kind, shape=ss)
        out[f"d{k}"] = b.dequantize_linear(xi, si, zi)
        feeds[f"x{k}"] = (kind, xs, _pack4(x))
        feeds[f"s{k}"] = ("float32", ss, np.asarray(s, np.float32).reshape(ss))
        feeds[f"z{k}"] = (kind, ss, _pack4(z))
        ref = _dequantize_ref(np.reshape(x, xs), np.reshape(np.float32(s), ss),
                              np.reshape(z, ss), _blocks(xs, ss))
        np.testing.assert_allclose(ref.reshape(-1), expected, rtol=1e-6)  # the data agree
        expect[f"d{k}"] = np.asarray(expected, np.float32).reshape(xs)
    got = run_graph(ctx, b, out, feeds)
    for key, w in expect.items():
        g = got[key]
        assert g.dtype == np.float32 and g.shape == w.shape, key
        ulp = np.abs(g.view(np.int32).astype(np.int64) - w.view(np.int32).astype(np.int64))
        assert ulp.max() <= 1, (key, g, w)


def _draw4(kind: str, shape, rng=RNG) -> np.ndarray:
    """Random 4-bit values of ``kind`` over the whole range, zeros replaced (never zero)."""
    lo, hi = RANGE4[kind]
    v = rng.integers(lo, hi + 1, size=shape)
    return np.where(v == 0, 3, v)


@pytest.mark.parametrize("kind", ["int4", "uint4"])
def test_int4_uint4_quantize_dequantize_random(ctx, kind):
    """Fresh random inputs through quantizeLinear to int4/uint4, read packed (odd and even
    element counts) and fed to dequantizeLinear (the quantize_linear -> dequantize_linear
    subgraph), per axis and in blocks, against float64 NumPy; scales small enough that both
    ends saturate; exact halves round to even; saturation of huge values at both ends."""
    lo, hi = RANGE4[kind]
    b = MLGraphBuilder(ctx)
    out, want, feeds = {}, {}, {}
    for shape, sshape in (((3, 7), (7,)), ((4, 6), (2, 3)), ((5,), ())):
        x = _draw(shape)
        sv = RNG.uniform(0.3, 0.9, size=sshape).astype(np.float32)
        sv *= RNG.choice([-1.0, 1.0], size=sshape).astype(np.float32)
        zv = _draw4(kind, sshape)
        tag = "x".join(map(str, shape))
        xin = b.input(f"x{tag}", data_type="float32", shape=list(shape))
        feeds[f"x{tag}"] = x
        sc, zc = _const(b, "float32", sshape, sv), _const4(b, kind, sshape, zv)
        q = b.quantize_linear(xin, sc, zc)
        block = _blocks(shape, sshape)
        qref = _quantize_ref(x, sv, zv, block, lo, hi)
        out[f"q{tag}"], want[f"q{tag}"] = q, qref
        out[f"d{tag}"] = b.dequantize_linear(q, sc, zc)
        want[f"d{tag}"] = _dequantize_ref(qref, sv, zv, block)
    drawn = np.concatenate([w.reshape(-1) for k, w in want.items() if k.startswith("q")])
    assert (drawn == lo).any() and (drawn == hi).any(), "both ends saturate"
    halves = (np.arange(-10, 10) + 0.5).astype(np.float32) * 0.5  # x / 0.5 = k + 0.5 exactly
    hin = b.input("h", data_type="float32", shape=[20])
    zh = -2 if kind == "int4" else 7
    out["qh"] = b.quantize_linear(hin, _const(b, "float32", [], 0.5), _const4(b, kind, [], [zh]))
    want["qh"] = np.clip(np.rint(np.arange(-10, 10) + 0.5) + zh, lo, hi)
    big = np.array([1e6, -1e6, 3e9, -3e9, 20.0, -20.0, 7.5, -8.5, 15.5], np.float32)
    bin_ = b.input("big", data_type="float32", shape=[9])
    out["sat"] = b.quantize_linear(bin_, _const(b, "float32", [], 1.0), _const4(b, kind, [], [1]))
    want["sat"] = np.clip(np.rint(big.astype(np.float64)) + 1, lo, hi)
    got = run_graph(ctx, b, out, {**feeds, "h": halves, "big": big})
    for key, w in want.items():
        g = got[key]
        if key.startswith("d"):
            np.testing.assert_allclose(g, w, rtol=2e-7, atol=0, err_msg=key)
        else:
            np.testing.assert_array_equal(_unpack4(g, w.size, kind).reshape(w.shape), w,
                                          err_msg=key)


@pytest.mark.parametrize("kind,shape,sshape", [("int4", (13,), ()), ("int4", (3, 5), (3, 1)),
                                               ("uint4", (4, 6), (2, 3))])
def test_packed_input_written_by_the_page_is_dequantized(ctx, kind, shape, sshape):
    """A random int4/uint4 graph input (odd and even element counts) written as the spec's
    packed buffer, dequantised with a packed constant zero point (the two layouts in one
    kernel) and with a zero point that is a graph input too; read back into the page's own
    arrays (``read_tensors``' outputs) as well."""
    x, zv = _draw4(kind, shape), _draw4(kind, sshape)
    sv = RNG.uniform(0.05, 2.0, size=sshape).astype(np.float32)
    b = MLGraphBuilder(ctx)
    xin = b.input("x", data_type=kind, shape=list(shape))
    sc = _const(b, "float32", sshape, sv)
    zin = b.input("z", data_type=kind, shape=list(sshape))
    out = {"dc": b.dequantize_linear(xin, sc, _const4(b, kind, sshape, zv)),
           "di": b.dequantize_linear(xin, sc, zin)}
    got = run_graph(ctx, b, out, {"x": (kind, list(shape), _pack4(x)),
                              "z": (kind, list(sshape), _pack4(zv))})
    want = _dequantize_ref(x, sv, zv, _blocks(shape, sshape))
    assert np.any(want != 0)
    for key in out:
        np.testing.assert_allclose(got[key], want, rtol=2e-7, atol=0, err_msg=key)


def test_packed_tensor_round_trip_and_checks(ctx):
    """An int4 tensor written packed reads back the same bytes through a graph (quantize of
    its dequantisation), into a fresh buffer or the page's own array; a buffer of the wrong
    length or type is a TypeError."""
    vals = _draw4("int4", (9,))
    b = MLGraphBuilder(ctx)
    xin = b.input("x", data_type="int4", shape=[9])
    s = _const(b, "float32", [], 0.75)
    z = _const4(b, "int4", [], [-1])
    g = b.build({"y": b.quantize_linear(b.dequantize_linear(xin, s, z), s, z)})
    tx = ctx.create_tensor(data_type="int4", shape=[9], writable=True)
    ty = ctx.create_tensor(data_type="int4", shape=[9], readable=True)
    ctx.write_tensor(tx, _pack4(vals))
    ctx.dispatch(g, {"x": tx}, {"y": ty})
    np.testing.assert_array_equal(ctx.read_tensor(ty), _pack4(vals))
    mine = np.full(5, 0xAA, np.uint8)
    assert ctx.read_tensors([ty], [mine])[0] is mine
    np.testing.assert_array_equal(mine, _pack4(vals))
    for bad in (np.zeros(9, np.uint8), np.zeros(5, np.int8), np.zeros(4, np.uint8)):
        with pytest.raises(TypeError):
            ctx.write_tensor(tx, bad)
    with pytest.raises(TypeError):
        ctx.read_tensors([ty], [np.zeros(9, np.uint8)])
    g.destroy()
