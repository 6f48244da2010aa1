"""The ops issue 29 adds, each against a float64 NumPy oracle on fresh random inputs (never
zeros), with the web-platform-tests WebNN tolerance for that op (``webnn/resources/utils.js``,
``PrecisionMetrics``, and the conformance test files): a ULP distance measured as WPT does, on
the bit patterns of the output's type. One graph per data type computes every case (one
build, one dispatch), so the module stays fast on lavapipe.
"""

from __future__ import annotations

import numpy as np
import pytest
from webnn_run import dtype_results, run_graph

from backends.webnn import MLGraphBuilder
from backends.webnn.op_limits import TABLE

RNG = np.random.default_rng(29)

SHAPE = (3, 4, 5)
#: (min, max) of the uniform inputs, away from 0 (``_draw``)
LO, HI = 0.25, 2.0


def _draw(shape, dt, lo=LO, hi=HI):
    """Uniform magnitudes in [lo, hi) with random signs: never zero, as the house rules ask."""
    mag = RNG.uniform(lo, hi, size=shape)
    return (mag * RNG.choice([-1.0, 1.0], size=shape)).astype(dt)


def _ordered(a: np.ndarray) -> np.ndarray:
    """Float bit patterns mapped to integers that count ULPs monotonically across zero."""
    bits = a.view(np.int32 if a.dtype == np.float32 else np.int16).astype(np.int64)
    mag = bits & (0x7FFFFFFF if a.dtype == np.float32 else 0x7FFF)
    return np.where(bits < 0, -mag, mag)


def ulp_distance(got: np.ndarray, want64: np.ndarray) -> np.ndarray:
    """WPT's ULP distance: |bits(got) - bits(expected rounded to got's type)|."""
    want = want64.astype(got.dtype)
    return np.abs(_ordered(np.ascontiguousarray(got)) - _ordered(np.ascontiguousarray(want)))


def _layer_norm(x, scale, axes, bias=None, eps=1e-5):
    ax = tuple(axes)
    m = x.mean(axis=ax, keepdims=True)
    v = ((x - m) ** 2).mean(axis=ax, keepdims=True)
    order = np.argsort(axes)
    view = [x.shape[i] if i in ax else 1 for i in range(x.ndim)]
    y = (x - m) / np.sqrt(v + eps) * np.transpose(scale, order).reshape(view)
    return y if bias is None else y + np.transpose(bias, order).reshape(view)


def _cases(b: MLGraphBuilder, x, scale, dt: str):
    """name -> (operand, float64 oracle of x, ULP tolerance (None: exact equality))."""
    n = {1: 4, 2: 5, 0: 3}  # reduced element counts per axis of SHAPE
    c = {}
    c["clamp"] = (b.clamp(x, min_value=-0.75, max_value=1.25), lambda v: np.clip(v, -0.75, 1.25), 0)
    c["clamp_min_only"] = (b.clamp(x, min_value=-0.5), lambda v: np.maximum(v, -0.5), 0)
    c["leaky_relu"] = (b.leaky_relu(x), lambda v: np.where(v > 0, v, 0.01 * v), 1)
    c["leaky_relu_alpha"] = (b.leaky_relu(x, alpha=0.3), lambda v: np.where(v > 0, v, 0.3 * v), 1)
    c["reduce_l2"] = (b.reduce_l2(x, [1]), lambda v: np.sqrt((v * v).sum(1)), 2 * n[1] + 1)
    c["reduce_sum_square"] = (b.reduce_sum_square(x, [0, 2], keep_dimensions=True),
                              lambda v: (v * v).sum((0, 2), keepdims=True), 2 * n[0] * n[2])
    c["reduce_product"] = (b.reduce_product(x, [2]), lambda v: v.prod(2), n[2])
    c["reduce_product_all"] = (b.reduce_product(b.slice(x, [0, 0, 0], [1, 2, 5])),
                               lambda v: v[:1, :2, :].prod(), 10)
    c["reduce_log_sum_exp"] = (b.reduce_log_sum_exp(x, [1, 2]),
                               lambda v: np.log(np.exp(v).sum((1, 2))), 2 * n[1] * n[2] + 18)
    c["reduce_log_sum_exp_keep"] = (b.reduce_log_sum_exp(x, [0], keep_dimensions=True),
                                    lambda v: np.log(np.exp(v).sum(0, keepdims=True)), 2 * n[0] + 18)
    # WPT's layer_normalization tolerance: 840 ULP (float32), 8400 (float16)
    ln_ulp = 840 if dt == "float32" else 8400
    c["layer_normalization"] = (b.layer_normalization(x), lambda v: _layer_norm(
        v, np.ones(SHAPE[1:]), [1, 2]), ln_ulp)
    sv = scale._value.astype(np.float64)
    c["layer_normalization_axes"] = (  # scale and bias in the axes' order ([5, 4] for [2, 1])
        b.layer_normalization(x, scale=scale, bias=scale, axes=[2, 1], epsilon=1e-3),
        lambda v: _layer_norm(v, sv, [2, 1], sv, 1e-3), ln_ulp)
    c["pad_edge"] = (b.pad(x, [1, 0, 2], [0, 2, 1], mode="edge"),
                     lambda v: np.pad(v, [(1, 0), (0, 2), (2, 1)], mode="edge"), 0)
    c["pad_reflection"] = (b.pad(x, [2, 1, 0], [1, 3, 4], mode="reflection"),
                           lambda v: np.pad(v, [(2, 1), (1, 3), (0, 4)], mode="reflect"), 0)
    c["pad_constant"] = (b.pad(x, [0, 1, 1], [1, 0, 2], value=1.5),
                         lambda v: np.pad(v, [(0, 1), (1, 0), (1, 2)], constant_values=1.5), 0)
    return c


def _spec_ops(b: MLGraphBuilder, xi, yi, hi, x, y, h, dt: str):
    """The ops added for the W3C conformance tests: name -> (operand, float64 oracle value,
    tolerance: WPT's ULP count, ("atol", bound), or None for exact equality)."""
    v, w, hv = (a.astype(np.float64) for a in (x, y, h))
    n = {1: 4, 2: 5, 0: 3}
    c = {}
    ties = b.concat([xi, xi], 1)  # every maximum and minimum twice: the first index wins
    c["arg_max"] = (b.arg_max(ties, 1), np.concatenate([v, v], 1).argmax(1), None)
    c["arg_min_keep_int64"] = (b.arg_min(ties, 1, keep_dimensions=True, output_data_type="int64"),
                               np.concatenate([v, v], 1).argmin(1)[:, None], None)
    c["arg_max_axis0"] = (b.arg_max(xi, 0), v.argmax(0), None)
    c["arg_min_axis2"] = (b.arg_min(xi, 2), v.argmin(2), None)
    c["elu"] = (b.elu(xi), np.where(v > 0, v, np.expm1(v)), 18)
    c["elu_alpha"] = (b.elu(xi, alpha=0.5), np.where(v > 0, v, 0.5 * np.expm1(v)), 18)
    a02 = float(np.array(0.2, dt))  # the spec casts alpha to the input's type
    c["hard_sigmoid"] = (b.hard_sigmoid(xi), np.clip(a02 * v + 0.5, 0, 1), 2)
    c["hard_sigmoid_opts"] = (b.hard_sigmoid(xi, alpha=0.75, beta=0.25),
                              np.clip(0.75 * v + 0.25, 0, 1), 2)
    c["hard_swish"] = (b.hard_swish(b.mul(xi, b.constant(data_type=dt, shape=[], value=2.0))),
                       2 * v * np.clip(2 * v + 3, 0, 6) / 6, 4)
    c["softsign"] = (b.softsign(xi), v / (1 + np.abs(v)), 3)
    c["linear"] = (b.linear(xi), v, 2)
    c["linear_opts"] = (b.linear(xi, alpha=1.5, beta=0.125), 1.5 * v + 0.125, 2)
    c["prelu"] = (b.prelu(xi, yi), np.where(v > 0, v, w * v), 1)
    c["prelu_broadcast"] = (b.prelu(b.slice(xi, [0, 0, 0], [1, 4, 5]), b.slice(yi, [0, 0, 0], [3, 4, 1])),
                            np.where(v[:1] > 0, v[:1], w[:, :, :1] * v[:1]), 1)
    c["sign"] = (b.sign(xi), np.sign(v), 0)
    c["tan"] = (b.tan(b.mul(xi, b.constant(data_type=dt, shape=[], value=0.5))), np.tan(0.5 * v),
                ("atol", 1 / 1024 if dt == "float32" else 1 / 512))
    c["round_even"] = (b.round_even(hi), np.round(hv), 0)  # NumPy rounds halves to even
    c["round_even_random"] = (b.round_even(b.mul(xi, b.constant(data_type=dt, shape=[], value=3.0))),
                              np.round(3 * v), 0)
    c["reduce_l1"] = (b.reduce_l1(xi, [1]), np.abs(v).sum(1), n[1])
    c["reduce_l1_all"] = (b.reduce_l1(xi, keep_dimensions=True), np.abs(v).sum(keepdims=True), 60)
    c["reduce_log_sum"] = (b.reduce_log_sum(b.abs(xi), [0, 2]), np.log(np.abs(v).sum((0, 2))),
                           n[0] * n[2] + 18)
    c["is_infinite"] = (b.is_infinite(xi), np.isinf(v).astype(np.uint8), None)
    gt, lt = b.greater(xi, yi), b.lesser(xi, b.constant(data_type=dt, shape=[], value=0.5))
    c["logical_xor"] = (b.logical_xor(gt, lt), ((v > w) ^ (v < 0.5)).astype(np.uint8), None)
    # batchNormalization over axis 1 of (3, 4, 5) and axis 2; the mean below every x, scale and
    # bias positive: WPT's 6 ULP holds where the bias adds to the normalized value (its
    # cancellation against scale * x' amplifies the product's rounding in any implementation)
    mean = (RNG.uniform(-3.0, -2.5, 4), RNG.uniform(-3.0, -2.5, 5))
    var, sc, bias = (RNG.uniform(0.25, 2.0, 4), RNG.uniform(0.25, 2.0, 4), RNG.uniform(0.25, 2.0, 4))
    cst = lambda a: b.constant(data_type=dt, shape=[len(a)], value=a.astype(dt))  # noqa: E731
    q = lambda a: a.astype(dt).astype(np.float64)  # noqa: E731  (the constants as stored)
    view = (1, 4, 1)
    c["batch_normalization"] = (
        b.batch_normalization(xi, cst(mean[0]), cst(var), scale=cst(sc), bias=cst(bias)),
        q(sc).reshape(view) * (v - q(mean[0]).reshape(view))
        / np.sqrt(q(var).reshape(view) + q(np.array(1e-5))[()]) + q(bias).reshape(view), 6)
    var5 = RNG.uniform(0.25, 2.0, 5)
    c["batch_normalization_axis2"] = (
        b.batch_normalization(xi, cst(mean[1]), cst(var5), axis=2, epsilon=1e-3),
        (v - q(mean[1])) / np.sqrt(q(var5) + q(np.array(1e-3))[()]), 6)
    x4 = b.reshape(xi, [1, 3, 4, 5])
    sc3, bias3 = RNG.uniform(0.25, 2.0, 3), RNG.uniform(0.25, 2.0, 3)
    m = v.mean((1, 2), keepdims=True)
    inorm = (v - m) / np.sqrt(((v - m) ** 2).mean((1, 2), keepdims=True) + 1e-5)
    in_ulp = 840 if dt == "float32" else 8400
    c["instance_normalization"] = (
        b.instance_normalization(x4, scale=cst(sc3), bias=cst(bias3)),
        (q(sc3).reshape(3, 1, 1) * inorm + q(bias3).reshape(3, 1, 1))[None], in_ulp)
    x4h = b.reshape(b.transpose(xi, [1, 2, 0]), [1, 4, 5, 3])
    c["instance_normalization_nhwc"] = (b.instance_normalization(x4h, layout="nhwc"),
                                        inorm.transpose(1, 2, 0)[None], in_ulp)
    return c


def _graph(ctx, dt: str):
    x = _draw(SHAPE, dt)
    y = _draw(SHAPE, dt)
    y[0] = x[0]  # some equal elements for notEqual
    h = (RNG.integers(1, 12, size=SHAPE) * RNG.choice([-0.5, 0.5], size=SHAPE)).astype(dt)
    b = MLGraphBuilder(ctx)
    xi = b.input("x", data_type=dt, shape=list(SHAPE))
    scale = b.constant(data_type=dt, shape=[5, 4], value=_draw((5, 4), dt))
    cases = _cases(b, xi, scale, dt)
    yi = b.input("y", data_type=dt, shape=list(SHAPE))
    hi = b.input("h", data_type=dt, shape=list(SHAPE))
    spec = _spec_ops(b, xi, yi, hi, x, y, h, dt)
    outputs = ({k: v[0] for k, v in cases.items()} | {"not_equal": b.not_equal(xi, yi)}
               | {k: v[0] for k, v in spec.items()})
    got = run_graph(ctx, b, outputs, {"x": x, "y": y, "h": h})
    want = {k: (f(x.astype(np.float64)), tol) for k, (_, f, tol) in cases.items()}
    want["not_equal"] = ((x != y).astype(np.uint8), None)
    want |= {k: (w, tol) for k, (_, w, tol) in spec.items()}
    return got, want


float32_results, float16_results = dtype_results(_graph)


CASES = ["clamp", "clamp_min_only", "leaky_relu", "leaky_relu_alpha", "reduce_l2",
         "reduce_sum_square", "reduce_product", "reduce_product_all", "reduce_log_sum_exp",
         "reduce_log_sum_exp_keep", "layer_normalization", "layer_normalization_axes",
         "pad_edge", "pad_reflection", "pad_constant", "not_equal",
         "arg_max", "arg_min_keep_int64", "arg_max_axis0", "arg_min_axis2", "elu", "elu_alpha",
         "hard_sigmoid", "hard_sigmoid_opts", "hard_swish", "softsign", "linear", "linear_opts",
         "prelu", "prelu_broadcast", "sign", "tan", "round_even", "round_even_random",
         "reduce_l1", "reduce_l1_all", "reduce_log_sum", "is_infinite", "logical_xor",
         "batch_normalization", "batch_normalization_axis2", "instance_normalization",
         "instance_normalization_nhwc"]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("case", CASES)
def test_op_within_wpt_tolerance(request, dt, case):
    got, want = request.getfixturevalue(f"{dt}_results")
    w, tol = want[case]
    g = got[case]
    assert g.shape == w.shape, (g.shape, w.shape)
    if tol is None:
        np.testing.assert_array_equal(g, w.astype(g.dtype))
        return
    assert g.dtype == np.dtype(dt)
    if isinstance(tol, tuple):  # WPT's ATOL metric
        err = np.abs(g.astype(np.float64) - w)
        assert err.max() <= tol[1], f"{case} {dt}: off by {err.max()} > {tol[1]}"
        return
    d = ulp_distance(g, w)
    assert d.max() <= tol, f"{case} {dt}: {d.max()} ULP > {tol} (worst got {g.flat[d.argmax()]}, " \
                           f"want {w.flat[d.argmax()]})"


def test_the_ulp_measure_can_fail():
    """The oracle check is not vacuous: one float32 ULP off is 1, a sign flip is far."""
    w = np.array([1.0, -2.0, 0.5])
    g = w.astype(np.float32).copy()
    assert ulp_distance(g, w).max() == 0
    g[0] = np.nextafter(g[0], np.float32(2))
    g[2] = -g[2]
    d = ulp_distance(g, w)
    assert d[0] == 1 and d[2] > 1 << 29


def test_int8_casts_keep_the_low_8_bits(ctx):
    """The spec's cast table: between integer types the lowest 8 bits, read as int8 or uint8
    (int8 -1 -> uint8 255); a float in range truncated toward zero."""
    ints = RNG.integers(-300, 300, size=24).astype(np.int32)
    ints[ints == 0] = 7
    floats = _draw((24,), "float32", 1.0, 127.0)
    b = MLGraphBuilder(ctx)
    i = b.input("i", data_type="int32", shape=[24])
    f = b.input("f", data_type="float32", shape=[24])
    i8 = b.cast(i, "int8")
    out = {"i8": i8, "f8": b.cast(f, "int8"), "u8": b.cast(i8, "uint8"),
           "back": b.cast(b.cast(i8, "uint8"), "int8"), "wide": b.cast(i8, "int32"),
           "float": b.cast(b.cast(f, "int8"), "float32"), "u8i": b.cast(i, "uint8")}
    got = run_graph(ctx, b, out, {"i": ints, "f": floats})
    low = ints.astype(np.int8)  # NumPy keeps the low 8 bits too, two's complement
    np.testing.assert_array_equal(got["i8"], low)
    assert got["i8"].dtype == np.int8
    np.testing.assert_array_equal(got["f8"], np.trunc(floats).astype(np.int8))
    np.testing.assert_array_equal(got["u8"], low.view(np.uint8))
    np.testing.assert_array_equal(got["back"], low)
    np.testing.assert_array_equal(got["wide"], low.astype(np.int32))
    np.testing.assert_array_equal(got["float"], np.trunc(floats).astype(np.float32))
    np.testing.assert_array_equal(got["u8i"], ints.astype(np.uint8))


def test_int8_tensors_round_trip(ctx):
    a = RNG.integers(-128, 128, size=(2, 7)).astype(np.int8)
    a[a == 0] = -1
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="int8", shape=[2, 7])
    got = run_graph(ctx, b, {"t": b.transpose(x), "s": b.slice(x, [0, 1], [2, 5], strides=[1, 2])},
               {"x": a})
    np.testing.assert_array_equal(got["t"], a.T)
    np.testing.assert_array_equal(got["s"], a[:, 1:6:2])


def test_arg_min_max_long_rows_ties_and_specials(ctx):
    """argMax/argMin along a vocabulary-sized row (``arg_split``: workgroups over chunks of
    the row, then their winners combined) and a 3000-wide one (one workgroup's strided
    shares and tree): ties at indices far apart (other chunks) go to the first; a NaN wins
    over numbers (the first NaN where there are several, as NumPy); infinities are numbers.
    isInfinite and isNaN on the same specials. Integer inputs compare as integers."""
    vocab = 128256
    v = _draw((3, vocab), "float32")
    v[0, [5, 100000]] = 9.0  # tied maxima, in different invocations' shares
    v[0, [77, 64077]] = -9.0  # tied minima
    v[1, [70000, 90000]] = np.nan
    v[2, 3], v[2, 4000] = np.inf, -np.inf
    ints = RNG.integers(-50, 50, size=(6, 40)).astype(np.int32)
    ints[ints == 0] = 3
    b = MLGraphBuilder(ctx)
    vi = b.input("v", data_type="float32", shape=[3, vocab])
    ii = b.input("i", data_type="int32", shape=[6, 40])
    out = {"max": b.arg_max(vi, 1), "min": b.arg_min(vi, 1, output_data_type="int64"),
           "mid": b.arg_max(b.slice(vi, [0, 0], [3, 3000]), 1),
           "imax": b.arg_max(ii, 1, keep_dimensions=True), "imin": b.arg_min(ii, 0),
           "isinf": b.is_infinite(b.slice(vi, [2, 0], [1, 4096])),
           "isnan": b.is_nan(b.slice(vi, [1, 69000], [1, 2000])),
           "isign": b.sign(ii), "ixor": b.logical_xor(b.greater(ii, ii), b.equal(ii, ii))}
    got = run_graph(ctx, b, out, {"v": v, "i": ints})
    np.testing.assert_array_equal(got["max"], np.argmax(v, 1))
    np.testing.assert_array_equal(got["min"], np.argmin(v, 1))
    np.testing.assert_array_equal(got["mid"], np.argmax(v[:, :3000], 1))
    assert got["max"][0] == 5 and got["min"][0] == 77 and got["max"][1] == got["min"][1] == 70000
    assert got["max"][2] == 3 and got["min"][2] == 4000 and got["min"].dtype == np.int64
    np.testing.assert_array_equal(got["imax"], ints.argmax(1)[:, None])
    np.testing.assert_array_equal(got["imin"], ints.argmin(0))
    np.testing.assert_array_equal(got["isinf"], np.isinf(v[2:, :4096]).astype(np.uint8))
    np.testing.assert_array_equal(got["isnan"], np.isnan(v[1:2, 69000:71000]).astype(np.uint8))
    np.testing.assert_array_equal(got["isign"], np.sign(ints))
    np.testing.assert_array_equal(got["ixor"], np.ones_like(ints, np.uint8))


def test_emulated_ops_keep_a_scalar_a_scalar(ctx):
    """WPT's 0-D cases: an emulation's constants are 0-D, so they broadcast without adding an
    axis (a [1] constant made a [1] output of a scalar input)."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[])
    s = b.constant(data_type="float32", shape=[], value=np.float32(0.5))
    for y in (b.elu(x), b.hard_sigmoid(x), b.hard_swish(x), b.softsign(x), b.linear(x),
              b.prelu(x, s), b.leaky_relu(x), b.clamp(x, min_value=0), b.reduce_l1(x),
              b.reduce_log_sum(x), b.sign(x), b.tan(x), b.round_even(x)):
        assert y.shape == [], y


def test_builder_throws_type_error_where_the_spec_does(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3, 4])
    i = b.input("i", data_type="int32", shape=[2, 3])
    i8 = b.input("b", data_type="int8", shape=[2, 3])
    c3 = b.constant(data_type="float32", shape=[3], value=np.ones(3, np.float32))
    c4 = b.constant(data_type="float32", shape=[4], value=np.ones(4, np.float32))
    bad = [
        lambda: b.clamp(x, min_value=2.0, max_value=1.0),
        lambda: b.leaky_relu(i),
        lambda: b.layer_normalization(x, axes=[1, 1]),
        lambda: b.layer_normalization(x, axes=[3]),
        lambda: b.layer_normalization(x, axes=[1, 2], scale=b.constant(
            data_type="float32", shape=[4, 3], value=np.ones(12, np.float32))),
        lambda: b.layer_normalization(i),
        lambda: b.reduce_l2(i),
        lambda: b.reduce_log_sum_exp(x, [0, 0]),
        lambda: b.reduce_product(x, [3]),
        lambda: b.not_equal(x, i),
        lambda: b.pad(x, [2, 0, 0], [0, 0, 0], mode="reflection"),  # 2 >= axis 0's size
        lambda: b.pad(x, [0, 0, 0], [0, 0, 0], mode="symmetric"),
        lambda: b.pad(x, [1, 0], [0, 0], mode="edge"),
        lambda: b.add(i8, i8),  # int8 moves and casts here, no arithmetic
        lambda: b.arg_max(x, 3),  # axis >= rank
        lambda: b.arg_min(x, -1),  # an unsigned long
        lambda: b.arg_max(x, 1.0),
        lambda: b.arg_max(x, 1, output_data_type="float32"),
        lambda: b.arg_min(x, 1, output_data_type="uint32"),
        lambda: b.arg_max(b.input("s", data_type="float32", shape=[]), 0),  # a scalar: no axis
        lambda: b.elu(i),
        lambda: b.hard_sigmoid(i),
        lambda: b.hard_swish(i),
        lambda: b.softsign(i),
        lambda: b.linear(i),
        lambda: b.prelu(x, i),  # slope of another type
        lambda: b.prelu(x, b.input("p", data_type="float32", shape=[3, 2])),  # no broadcast
        lambda: b.prelu(i8, i8),
        lambda: b.sign(b.input("u", data_type="uint32", shape=[2])),
        lambda: b.tan(i),
        lambda: b.round_even(i),
        lambda: b.logical_xor(x, x),
        lambda: b.is_infinite(i),
        lambda: b.reduce_l1(i8),
        lambda: b.reduce_l1(x, [3]),
        lambda: b.reduce_log_sum(i),
        lambda: b.batch_normalization(x, c3, c3, axis=3),
        lambda: b.batch_normalization(x, c3, c3, axis=2),  # mean is [3], axis 2 is 4
        lambda: b.batch_normalization(x, c3, c3, axis=1, scale=c4),
        lambda: b.batch_normalization(i, c3, c3),
        lambda: b.instance_normalization(x),  # not 4-D
        lambda: b.instance_normalization(b.reshape(x, [1, 2, 3, 4]), layout="hwcn"),
        lambda: b.instance_normalization(b.reshape(x, [1, 2, 3, 4]), scale=c3),
    ]
    for k, f in enumerate(bad):
        with pytest.raises(TypeError):
            f()
            pytest.fail(f"case {k} did not raise")


def test_op_support_limits_is_what_the_builder_checks(ctx):
    """Every op the limits list is checked by the builder against the same table: a data
    type listed for an op's first operand is accepted, one left out is a TypeError."""
    limits = ctx.op_support_limits()
    assert limits["preferred_input_layout"] == "nchw"
    assert limits["max_tensor_byte_length"] == ctx._max_tensor_bytes() > 0
    assert "int8" in limits["input"]["data_types"]
    assert "int4" in limits["constant"]["data_types"] and "uint4" in limits["input"]["data_types"]
    for key in ("layer_normalization", "clamp", "leaky_relu", "not_equal", "reduce_l2",
                "reduce_sum_square", "reduce_product", "reduce_log_sum_exp", "pad", "cast",
                "arg_min", "arg_max", "elu", "hard_sigmoid", "hard_swish", "softsign", "linear",
                "prelu", "sign", "tan", "round_even", "logical_xor", "is_infinite", "reduce_l1",
                "reduce_log_sum", "batch_normalization", "instance_normalization"):
        assert key in limits, key
    assert limits["arg_max"]["output"]["data_types"] == ["int32", "int64"]
    assert limits["arg_max"]["input"]["rank_range"]["min"] == 1
    assert limits["arg_max"]["output"]["rank_range"]["min"] == 0
    inorm = limits["instance_normalization"]
    assert inorm["input"]["rank_range"] == {"min": 4, "max": 4}
    assert inorm["scale"]["rank_range"] == {"min": 1, "max": 1}
    assert limits["batch_normalization"]["mean"]["rank_range"] == {"min": 1, "max": 1}
    assert limits["not_equal"]["output"]["data_types"] == ["uint8"]
    assert "int8" in limits["cast"]["output"]["data_types"]
    assert limits["matmul"]["a"]["rank_range"]["min"] == 2
    unary = {"sqrt": "sqrt", "leaky_relu": "leaky_relu", "reduce_product": "reduce_product",
             "reduce_l2": "reduce_l2", "clamp": "clamp", "relu": "relu", "neg": "neg",
             "reduce_mean": "reduce_mean", "identity": "identity", "elu": "elu",
             "hard_swish": "hard_swish", "sign": "sign", "tan": "tan", "round_even": "round_even",
             "reduce_l1": "reduce_l1", "reduce_log_sum": "reduce_log_sum", "softsign": "softsign"}
    for op, method in unary.items():
        member = limits[op]
        allowed = set(member["input"]["data_types"])
        for dt in limits["input"]["data_types"]:
            b = MLGraphBuilder(ctx)
            x = b.input("x", data_type=dt, shape=[2, 3])
            if dt in allowed:
                y = getattr(b, method)(x)
                assert y.data_type in member["output"]["data_types"]
            else:
                with pytest.raises(TypeError):
                    getattr(b, method)(x)
    assert set(TABLE) >= set(unary)


def test_elementwise_split_past_the_binding_limit():
    """Issue 29: an element-wise op on tensors larger than the device's max storage binding
    (a float32 [6000, 6000] add is 144 MB against 128 MiB) is split into launches that each
    bind ranges within the limit. Here the limit is lowered to 4 KiB so tiny tensors take
    the same path; broadcast inputs are read whole."""
    from backends.webnn import ml

    c = ml.create_context()
    try:
        c._max_binding = 4096
        a = _draw((24, 100), "float32")
        r = _draw((1, 100), "float32")
        s = _draw((24, 1), "float32")
        b = MLGraphBuilder(c)
        ai = b.input("a", data_type="float32", shape=[24, 100])
        ri = b.input("r", data_type="float32", shape=[1, 100])
        si = b.input("s", data_type="float32", shape=[24, 1])
        out = {"sum": b.add(ai, ai), "chain": b.mul(b.sub(ai, ri), si),
               "cmp": b.greater(ai, ri)}
        g = b.build(out)
        ranges = [sl for la in g._plan.launches for sl in getattr(la, "slots", [])
                  if sl[0] == "range"]
        assert len(ranges) > 6 and all(sl[3] <= 4096 and sl[2] % 256 == 0 for sl in ranges)
        g.destroy()
        got = run_graph(c, b, out, {"a": a, "r": r, "s": s})
        np.testing.assert_array_equal(got["sum"], a + a)
        want = (a.astype(np.float64) - r) * s
        assert ulp_distance(got["chain"], want).max() <= 2
        np.testing.assert_array_equal(got["cmp"], (a > r).astype(np.uint8))
    finally:
        c.destroy()
