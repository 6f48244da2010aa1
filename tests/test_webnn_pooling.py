"""averagePool2d, l2Pool2d and maxPool2d (the ops WPT's ``webnn/conformance_tests``
pooling files try) at WPT's tolerances (``webnn/resources/utils.js``: averagePool2d and
l2Pool2d window height × width + 2 ULP, maxPool2d 0 ULP).

Three kinds of cases, one graph a data type (one build, one dispatch): the reference
implementation's own cases (webmachinelearning/webnn-baseline ``test/pool2d_test.js`` and
``test/l2pool2d_test.js``, whose ``pool2d.js`` computes WPT's expected values: padding is
skipped, not averaged in), fresh random inputs against a float64 NumPy oracle written here
(every option: padding, strides, dilations, nhwc, "ceil" rounding, outputSizes), and the
spec's TypeErrors (WPT's ``validation_tests/pooling.https.any.js`` cases).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_webnn_conformance import ulp_distance
from webnn_run import dtype_results, run_graph

from backends.webnn import MLGraphBuilder

RNG = np.random.default_rng(2024)

_I16 = list(range(1, 17))
_I25 = list(range(1, 26))
_I49 = list(range(1, 50))
_PAD5 = dict(window_dimensions=[5, 5], padding=[2, 2, 2, 2])
_PAD7 = dict(window_dimensions=[4, 4], padding=[2, 1, 2, 1], strides=[2, 2])
_GLOBAL_X = [  # webnn-baseline's global averagePool2d input, [1, 3, 5, 5]
    -1.1289884, 0.34016284, 0.497431, 2.1915932, 0.42038894, -0.18261199, -0.15769927,
    -0.26465914, 0.03877424, 0.39492005, -0.33410737, 0.74918455, -1.3542547, -0.0222946,
    0.7094626, -0.09399617, 0.790736, -0.75826526, 0.27656242, 0.46543223, -1.2342638,
    1.1549494, 0.24823844, 0.75670505, -1.7108902, -1.4767597, -1.4969662, -0.31936142,
    0.5327554, -0.06070877, 0.31212643, 2.2274113, 1.2775147, 0.59886885, -1.5765078,
    0.18522178, 0.22655599, 0.88869494, 0.38609484, -0.05860576, -0.72732115, -0.0046324,
    -1.3593693, -0.6295078, 1.384531, 0.06825881, 0.19907428, 0.20298219, -0.8399954,
    1.3583295, 0.02117888, -1.0636739, -0.30460566, -0.92678875, -0.09120782, -0.88333017,
    -0.9641269, 0.6065926, -0.5830042, -0.81138134, 1.3569402, 1.2891295, 0.2508177,
    0.20211531, 0.8832168, -0.19886094, -0.61088, 0.682026, -0.5253442, 1.5022339, 1.0256356,
    1.0642492, -0.4169051, -0.8740329, 1.1494869]
_MAX_PAD5 = [13, 14, 15, 15, 15, 18, 19, 20, 20, 20, 23, 24, 25, 25, 25, 23, 24, 25, 25, 25,
             23, 24, 25, 25, 25]
_L2_PAD5 = [
    24.43358344574123, 29.832867780352597, 35.21363372331802, 32.89376840679705,
    29.748949561287034, 38.28837943815329, 46.04345773288535, 53.5723809439155,
    49.558046773455466, 44.384682042344295, 54.037024344425184, 64.42049363362563,
    74.33034373659252, 68.33739825307956, 60.8276253029822, 53.907327887774215,
    64.18722614352485, 73.95944834840239, 67.94115100585212, 60.41522986797286,
    52.507142371300304, 62.369864518050704, 71.69379331573968, 65.7419196555744,
    58.35237784358063]
_L2_PAD7 = [
    12.24744871391589, 19.8997487421324, 24.899799195977465, 24.879710609249457,
    40.54626986542659, 60.860496218811754, 67.82329983125268, 63.324560795950255,
    76.81145747868608, 112.5344391730816, 120.2331069215131, 109.1146186356347,
    90.50414355155237, 131.4610208388783, 138.31124321616085, 124.21352583354198]

#: name -> (op, input shape, input values, options, output shape, expected values)
REFERENCE = {
    "max_window3": ("max_pool2d", [1, 1, 4, 4], _I16, dict(window_dimensions=[3, 3]),
                    [1, 1, 2, 2], [11, 12, 15, 16]),
    "max_window3_nhwc": ("max_pool2d", [1, 4, 4, 1], _I16,
                         dict(window_dimensions=[3, 3], layout="nhwc"), [1, 2, 2, 1],
                         [11, 12, 15, 16]),
    "max_dilations": ("max_pool2d", [1, 1, 4, 4], _I16,
                      dict(window_dimensions=[2, 2], dilations=[2, 2]), [1, 1, 2, 2],
                      [11, 12, 15, 16]),
    "max_padding": ("max_pool2d", [1, 1, 5, 5], _I25, _PAD5, [1, 1, 5, 5], _MAX_PAD5),
    "max_padding_strides_nhwc": ("max_pool2d", [1, 7, 7, 1], _I49, _PAD7 | dict(layout="nhwc"),
                                 [1, 4, 4, 1], [9, 11, 13, 14, 23, 25, 27, 28, 37, 39, 41, 42,
                                                44, 46, 48, 49]),
    "max_strides": ("max_pool2d", [1, 1, 5, 5], _I25,
                    dict(window_dimensions=[2, 2], strides=[2, 2]), [1, 1, 2, 2], [7, 9, 17, 19]),
    "avg_window3": ("average_pool2d", [1, 1, 4, 4], _I16, dict(window_dimensions=[3, 3]),
                    [1, 1, 2, 2], [6, 7, 10, 11]),
    "avg_padding_nhwc": ("average_pool2d", [1, 5, 5, 1], _I25, _PAD5 | dict(layout="nhwc"),
                         [1, 5, 5, 1], [7 + k / 2 for k in range(25)]),
    "avg_padding_strides_nhwc": ("average_pool2d", [1, 7, 7, 1], _I49, _PAD7 | dict(layout="nhwc"),
                                 [1, 4, 4, 1], [5, 6, 8, 9.5, 12, 13, 15, 16.5, 26, 27, 29, 30.5,
                                                36.5, 37.5, 39.5, 41]),
    "avg_strides": ("average_pool2d", [1, 1, 5, 5], _I25,
                    dict(window_dimensions=[2, 2], strides=[2, 2]), [1, 1, 2, 2], [4, 6, 14, 16]),
    "avg_global": ("average_pool2d", [1, 3, 5, 5], _GLOBAL_X, {}, [1, 3, 1, 1],
                   [0.07170041, 0.05194739, 0.07117923]),
    "avg_global_nhwc": ("average_pool2d", [1, 5, 5, 3],
                        np.array(_GLOBAL_X).reshape(3, 25).T.ravel().tolist(),
                        dict(layout="nhwc"), [1, 1, 1, 3], [0.07170041, 0.05194739, 0.07117923]),
    "l2_window3": ("l2_pool2d", [1, 1, 4, 4], _I16, dict(window_dimensions=[3, 3]), [1, 1, 2, 2],
                   [20.639767440550294, 23.302360395462088, 31.654383582688826,
                    34.51086785347479]),
    "l2_dilations_nhwc": ("l2_pool2d", [1, 4, 4, 1], _I16,
                          dict(window_dimensions=[2, 2], dilations=[2, 2], layout="nhwc"),
                          [1, 2, 2, 1], [14.560219778561036, 16.24807680927192,
                                         21.633307652783937, 23.49468024894146]),
    "l2_padding": ("l2_pool2d", [1, 1, 5, 5], _I25, _PAD5, [1, 1, 5, 5], _L2_PAD5),
    "l2_padding_strides_nhwc": ("l2_pool2d", [1, 7, 7, 1], _I49, _PAD7 | dict(layout="nhwc"),
                                [1, 4, 4, 1], _L2_PAD7),
    "l2_strides": ("l2_pool2d", [1, 1, 5, 5], _I25,
                   dict(window_dimensions=[2, 2], strides=[2, 2]), [1, 1, 2, 2],
                   [9.486832980505138, 13.038404810405298, 28.460498941515414, 32.4037034920393]),
}

#: the random input's nchw shape; its nhwc twin is the same values transposed
SHAPE = (2, 3, 7, 6)
#: name -> options (the op is the name's prefix); every option and their combinations
RANDOM = {
    "global": {},
    "window": dict(window_dimensions=[3, 2]),
    "all_options": dict(window_dimensions=[3, 2], padding=[1, 0, 2, 1], strides=[2, 1],
                        dilations=[1, 2]),
    "ceil": dict(window_dimensions=[3, 3], padding=[1, 0, 0, 1], strides=[2, 2],
                 output_shape_rounding="ceil"),
    "output_sizes": dict(window_dimensions=[2, 3], padding=[1, 1, 0, 0], strides=[2, 2],
                         output_sizes=[5, 3]),  # the ceilings of 4.5 and 2.5
    "nhwc": dict(window_dimensions=[2, 2], padding=[0, 1, 1, 0], strides=[1, 2],
                 dilations=[2, 1], layout="nhwc"),
    "all_padding_row": dict(window_dimensions=[1, 1], padding=[0, 2, 0, 0]),  # 0 there
}
OPS = {"avg": "average_pool2d", "l2": "l2_pool2d", "max": "max_pool2d"}


def pool_ref(op: str, x: np.ndarray, opts: dict) -> np.ndarray:
    """The pooling ops in float64, as webnn-baseline's ``pool2d.js`` defines them: a
    window's taps in the padding or past the input are skipped (0 where all are)."""
    nhwc = opts.get("layout") == "nhwc"
    if nhwc:
        x = x.transpose(0, 3, 1, 2)
    n, c, h, w = x.shape
    win = opts.get("window_dimensions", [h, w])
    pad = opts.get("padding", [0, 0, 0, 0])
    st = opts.get("strides", [1, 1])
    dil = opts.get("dilations", [1, 1])
    rnd = math.ceil if opts.get("output_shape_rounding") == "ceil" else math.floor
    out_hw = opts.get("output_sizes") or [
        rnd((size - (win[k] - 1) * dil[k] - 1 + pad[2 * k] + pad[2 * k + 1]) / st[k] + 1)
        for k, size in enumerate((h, w))]
    y = np.zeros((n, c, *out_hw))
    for oh in range(out_hw[0]):
        rows = [r for k in range(win[0]) if 0 <= (r := oh * st[0] - pad[0] + k * dil[0]) < h]
        for ow in range(out_hw[1]):
            cols = [q for k in range(win[1]) if 0 <= (q := ow * st[1] - pad[2] + k * dil[1]) < w]
            if not rows or not cols:
                continue
            blk = x[:, :, rows][:, :, :, cols].astype(np.float64)
            if op == "avg":
                y[:, :, oh, ow] = blk.mean((2, 3))
            elif op == "l2":
                y[:, :, oh, ow] = np.sqrt((blk * blk).sum((2, 3)))
            else:
                y[:, :, oh, ow] = blk.max((2, 3))
    return y.transpose(0, 2, 3, 1) if nhwc else y


def _tolerance(op: str, opts: dict, in_shape) -> int:
    """WPT's ULP count: window height × width + 2 for average and L2, 0 for max."""
    if op == "max_pool2d":
        return 0
    hw = in_shape[1:3] if opts.get("layout") == "nhwc" else in_shape[2:]
    return math.prod(opts.get("window_dimensions", hw)) + 2


def _graph(ctx, dt: str):
    """Every case of this module on ``dt`` inputs: name -> (got, float64 want, ULP)."""
    b = MLGraphBuilder(ctx)
    outputs, want, feeds = {}, {}, {}
    for name, (op, shape, values, opts, out_shape, expected) in REFERENCE.items():
        feeds[name] = np.asarray(values, np.float64).reshape(shape).astype(dt)
        y = getattr(b, op)(b.input(name, data_type=dt, shape=shape), **opts)
        assert y.shape == out_shape and y.data_type == dt, (name, y.shape)
        outputs[name] = y
        want[name] = (np.asarray(expected, np.float64).reshape(out_shape),
                      _tolerance(op, opts, shape))
    pos = RNG.uniform(0.25, 2.0, SHAPE)  # averages of positive values: no cancellation
    signed = pos * RNG.choice([-1.0, 1.0], SHAPE)
    for nhwc in (False, True):
        for key, x in (("pos", pos), ("signed", signed)):
            v = x.transpose(0, 2, 3, 1) if nhwc else x
            feeds[f"{key}{int(nhwc)}"] = v.astype(dt)
    ins = {k: b.input(k, data_type=dt, shape=list(a.shape)) for k, a in feeds.items()
           if k[:-1] in ("pos", "signed")}
    for name, opts in RANDOM.items():
        for short, op in OPS.items():
            key = f"{'pos' if short == 'avg' else 'signed'}{int(opts.get('layout') == 'nhwc')}"
            x64 = feeds[key].astype(np.float64)  # the input as the device holds it
            outputs[f"random_{short}_{name}"] = getattr(b, op)(ins[key], **opts)
            want[f"random_{short}_{name}"] = (pool_ref(short, x64, opts),
                                       _tolerance(op, opts, x64.shape))
    got = run_graph(ctx, b, outputs, feeds)
    return {k: (got[k], *want[k]) for k in outputs}


float32_results, float16_results = dtype_results(_graph)


CASES = list(REFERENCE) + [f"random_{s}_{n}" for n in RANDOM for s in OPS]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("case", CASES)
def test_pooling_within_wpt_tolerance(request, dt, case):
    got, want, tol = request.getfixturevalue(f"{dt}_results")[case]
    assert got.shape == want.shape and got.dtype == np.dtype(dt)
    d = ulp_distance(got, want)
    assert d.max() <= tol, f"{case} {dt}: {d.max()} ULP > {tol} (worst got " \
                           f"{got.flat[d.argmax()]}, want {want.flat[d.argmax()]})"


def test_max_pool2d_on_integers_and_nan(ctx):
    """maxPool2d takes any data type (int32 exactly here), and a NaN in a window wins, as
    ``Math.max`` gives it in the reference implementation."""
    b = MLGraphBuilder(ctx)
    xi = RNG.integers(-1000, 1000, size=(1, 2, 5, 4)).astype(np.int32)
    xf = RNG.uniform(-2, 2, size=(1, 1, 4, 4)).astype(np.float32)
    xf[0, 0, 1, 2] = np.nan
    opts = dict(window_dimensions=[2, 3], padding=[1, 0, 1, 1], strides=[2, 1])
    outputs = {"i": b.max_pool2d(b.input("xi", data_type="int32", shape=[1, 2, 5, 4]), **opts),
               "f": b.max_pool2d(b.input("xf", data_type="float32", shape=[1, 1, 4, 4]),
                                 window_dimensions=[2, 2])}
    got = run_graph(ctx, b, outputs, {"xi": xi, "xf": xf})
    np.testing.assert_array_equal(got["i"], pool_ref("max", xi, opts).astype(np.int32))
    want = np.array([[np.nanmax(xf[0, 0, r:r + 2, q:q + 2]) if not np.isnan(
        xf[0, 0, r:r + 2, q:q + 2]).any() else np.nan for q in range(3)] for r in range(3)])
    np.testing.assert_array_equal(got["f"][0, 0], want.astype(np.float32))


#: WPT's validation_tests/pooling.https.any.js: (input shape, options, output shape or None
#: for a TypeError), each for all three ops
VALIDATION = [
    ([1, 3, 4, 4], {}, [1, 3, 1, 1]),
    ([1, 3, 4, 4], dict(window_dimensions=[3, 3]), [1, 3, 2, 2]),
    ([1, 3, 5, 5], dict(window_dimensions=[5, 5], padding=[2, 2, 2, 2]), [1, 3, 5, 5]),
    ([1, 3, 5, 5], dict(window_dimensions=[2, 2], strides=[2, 2]), [1, 3, 2, 2]),
    ([1, 3, 5, 5], dict(window_dimensions=[3, 3], padding=[1, 1, 1, 1], strides=[2, 2]),
     [1, 3, 3, 3]),
    ([1, 3, 7, 7], dict(window_dimensions=[4, 4], padding=[2, 1, 2, 1], strides=[2, 2]),
     [1, 3, 4, 4]),
    ([1, 3, 7, 7], dict(window_dimensions=[4, 4], padding=[1, 1, 1, 1], strides=[2, 2],
                        output_shape_rounding="floor"), [1, 3, 3, 3]),
    ([1, 3, 7, 7], dict(window_dimensions=[4, 4], padding=[1, 1, 1, 1], strides=[2, 2],
                        output_shape_rounding="ceil"), [1, 3, 4, 4]),
    ([1, 3, 7, 7], dict(window_dimensions=[4, 4], padding=[1, 1, 1, 1], strides=[2, 2],
                        rounding_type="ceil"), [1, 3, 4, 4]),  # the member's former name
    ([1, 3, 7, 7], dict(window_dimensions=[4, 4], padding=[1, 1, 1, 1], strides=[2, 2],
                        output_shape_rounding="ceil", output_sizes=[3, 3]), [1, 3, 3, 3]),
    ([1, 3, 7, 7], dict(window_dimensions=[4, 4], padding=[1, 1, 1, 1], strides=[2, 2],
                        output_sizes=[4, 4]), [1, 3, 4, 4]),
    ([1, 2, 5, 5], dict(window_dimensions=[3, 3], layout="nchw"), [1, 2, 3, 3]),
    ([1, 5, 5, 2], dict(window_dimensions=[3, 3], layout="nhwc"), [1, 3, 3, 2]),
    ([1, 5, 5], {}, None),
    ([1, 2, 5, 5], dict(window_dimensions=[2, 2], padding=[2, 2, 2, 2], strides=[2, 2],
                        output_sizes=[3, 3]), None),
    ([1, 2, 5, 5], dict(window_dimensions=[2, 2], padding=[2, 2, 2, 2], strides=[2, 2],
                        output_sizes=[1, 2, 4, 4]), None),
    ([1, 1, 7, 6], dict(window_dimensions=[2, 3], padding=[1, 1, 0, 0], strides=[2, 2],
                        output_sizes=[5, 2]), None),  # one ceiling (of 4.5), one floor (2.5)
    ([1, 2, 5, 5], dict(window_dimensions=[1, 1, 1, 1]), None),
    ([1, 2, 5, 5], dict(window_dimensions=[0, 2]), None),
    ([1, 2, 5, 5], dict(window_dimensions=[8, 2]), None),
    ([1, 2, 5, 5], dict(window_dimensions=[2, 8]), None),
    ([1, 2, 5, 5], dict(window_dimensions=[6, 3]), None),
    ([1, 2, 5, 5], dict(window_dimensions=[3, 6]), None),
    ([1, 2, 5, 5], dict(padding=[2, 2]), None),
    ([1, 2, 5, 5], dict(strides=[2]), None),
    ([1, 2, 5, 5], dict(strides=[0, 2]), None),
    ([1, 2, 5, 5], dict(dilations=[1, 1, 2]), None),
    ([1, 2, 5, 5], dict(dilations=[1, 0]), None),
    ([1, 3, 5, 5], dict(padding=[2**32 - 1] * 4), None),  # the output's byte length
    # beyond WPT's list: the IDL's types and enums
    ([1, 2, 5, 5], dict(window_dimensions=[-1, 2]), None),
    ([1, 2, 5, 5], dict(strides=[float("nan"), 1]), None),  # (1.5 is 1: EnforceRange)
    ([1, 2, 5, 5], dict(dilations=[True, 1]), None),
    ([1, 2, 5, 5], dict(padding=[2**32, 0, 0, 0]), None),
    ([1, 2, 5, 5], dict(layout="hwcn"), None),
    ([1, 2, 5, 5], dict(output_shape_rounding="round"), None),
    ([1, 2, 5, 5, 1], {}, None),
]


@pytest.mark.parametrize("op", ["average_pool2d", "l2_pool2d", "max_pool2d"])
def test_pooling_validation_as_wpt(ctx, op):
    b = MLGraphBuilder(ctx)
    for k, (shape, opts, out) in enumerate(VALIDATION):
        x = b.input(f"x{k}", data_type="float32", shape=shape)
        if out is None:
            with pytest.raises(TypeError):
                getattr(b, op)(x, **opts)
                pytest.fail(f"case {k} {opts} did not raise")
        else:
            y = getattr(b, op)(x, **opts)
            assert (y.shape, y.data_type) == (out, "float32"), (k, opts)
    other = MLGraphBuilder(ctx).input("o", data_type="float32", shape=[2, 2, 2, 2])
    with pytest.raises(TypeError):  # an input from another builder
        getattr(b, op)(other)


def test_pooling_data_types_and_support_limits(ctx):
    """averagePool2d and l2Pool2d take float types only, maxPool2d any; the limits say so
    and the builder checks the same table."""
    limits = ctx.op_support_limits()
    for op in ("average_pool2d", "l2_pool2d", "max_pool2d"):
        assert limits[op]["input"]["rank_range"] == {"min": 4, "max": 4}
        assert limits[op]["output"]["rank_range"] == {"min": 4, "max": 4}
    assert set(limits["average_pool2d"]["input"]["data_types"]) <= {"float32", "float16"}
    assert set(limits["l2_pool2d"]["input"]["data_types"]) <= {"float32", "float16"}
    assert {"float32", "int32", "uint32", "uint8"} <= set(limits["max_pool2d"]["input"]["data_types"])
    b = MLGraphBuilder(ctx)
    xi = b.input("i", data_type="int32", shape=[1, 1, 2, 2])
    for op in ("average_pool2d", "l2_pool2d"):
        with pytest.raises(TypeError):
            getattr(b, op)(xi)
    assert b.max_pool2d(xi).data_type == "int32"
