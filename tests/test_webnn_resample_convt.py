"""resample2d and convTranspose2d: a subset of web-platform-tests' own cases
(``webnn/resources/test_data/resample2d.json``, ``conv_transpose2d.json``,
``conformance_tests/resample2d-nearest-half-pixel.https.any.js``) at WPT's tolerances
(``utils.js``: nearest 0 ULP, linear 84 float32 / 10 float16; convTranspose2d
``kh * kw * inputChannels / groups * 2``), fresh random inputs against float64 NumPy
references written here, and the spec's TypeErrors. One graph per data type (one build, one
dispatch), so the module stays fast on lavapipe.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from test_webnn_conformance import ulp_distance
from webnn_run import dtype_results, run_graph

from backends.webnn import MLGraphBuilder

RNG = np.random.default_rng(2024)

# -- float64 references ------------------------------------------------------------------


def _source(i: int, o: int) -> list[Fraction]:
    """The spec's half-pixel input coordinate of each output index, clamped, exactly."""
    return [min(max(Fraction(2 * k + 1, 2) * i / o - Fraction(1, 2), Fraction(0)),
                Fraction(i - 1)) for k in range(o)]


def ref_resample2d(x: np.ndarray, out_shape, axes, mode: str) -> np.ndarray:
    """Separable: nearest takes ``ceil(u - 0.5)`` per axis, linear blends ``floor(u)`` and
    ``ceil(u)`` by ``u - floor(u)`` per axis (bilinear is the two in turn)."""
    y = x.astype(np.float64)
    for ax in axes:
        us = _source(y.shape[ax], out_shape[ax])
        if mode == "nearest-neighbor":
            y = np.take(y, [math.ceil(u - Fraction(1, 2)) for u in us], axis=ax)
        else:
            lo = np.take(y, [math.floor(u) for u in us], axis=ax)
            hi = np.take(y, [math.ceil(u) for u in us], axis=ax)
            view = [1] * y.ndim
            view[ax] = len(us)
            t = np.array([float(u - math.floor(u)) for u in us]).reshape(view)
            y = lo * (1 - t) + hi * t
    return y


def ref_conv_transpose2d(x, w, *, padding=(0, 0, 0, 0), strides=(1, 1), dilations=(1, 1),
                         out_hw=None, groups=1, input_layout="nchw", filter_layout="iohw",
                         bias=None) -> np.ndarray:
    """Scatter form: every input element times the filter added at ``i * stride + k *
    dilation``, then the padding cropped (the kernel gathers instead)."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    if input_layout == "nhwc":
        x = x.transpose(0, 3, 1, 2)
    w = {"iohw": w, "hwoi": w.transpose(3, 2, 0, 1), "ohwi": w.transpose(3, 0, 1, 2)}[
        filter_layout]
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    full = ((h - 1) * sh + (kh - 1) * dh + 1, (wd - 1) * sw + (kw - 1) * dw + 1)
    if out_hw is None:
        out_hw = (full[0] - padding[0] - padding[1], full[1] - padding[2] - padding[3])
    big = np.zeros((n, og * groups, max(full[0], padding[0] + out_hw[0]),
                    max(full[1], padding[2] + out_hw[1])))
    cg = c // groups
    for ic in range(c):
        g = ic // cg
        for ky in range(kh):
            for kx in range(kw):
                big[:, g * og:(g + 1) * og, ky * dh:ky * dh + (h - 1) * sh + 1:sh,
                    kx * dw:kx * dw + (wd - 1) * sw + 1:sw] += \
                    x[:, ic][:, None] * w[ic, :, ky, kx][None, :, None, None]
    y = big[:, :, padding[0]:padding[0] + out_hw[0], padding[2]:padding[2] + out_hw[1]]
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :, None, None]
    return y.transpose(0, 2, 3, 1) if input_layout == "nhwc" else y


# -- WPT's cases ---------------------------------------------------------------------------

#: resample2d-nearest-half-pixel: (input, shape, options, expected, output shape)
NEAREST_HALF_PIXEL = {
    "up_scales": ([10, 20, 30], [1, 1, 1, 3], {"scales": [1, 1.5]}, [10, 20, 20, 30], [1, 1, 1, 4]),
    "down_scales": ([10, 20, 30, 40], [1, 1, 1, 4], {"scales": [1, 0.75]}, [10, 20, 40],
                    [1, 1, 1, 3]),
    "down_sizes": ([10, 20, 30, 40, 50], [1, 1, 1, 5], {"sizes": [1, 2]}, [20, 40], [1, 1, 1, 2]),
    "ties": ([10, 20], [1, 1, 1, 2], {"sizes": [1, 3]}, [10, 10, 20], [1, 1, 1, 3]),
    "singleton_dst": ([10, 20, 30], [1, 1, 1, 3], {"sizes": [1, 1]}, [20], [1, 1, 1, 1]),
    "singleton_src": ([10], [1, 1, 1, 1], {"sizes": [1, 4]}, [10, 10, 10, 10], [1, 1, 1, 4]),
    "nhwc_sizes_over_scales": (
        list(range(1, 13)), [1, 2, 3, 2], {"axes": [1, 2], "sizes": [3, 4], "scales": [99, 99]},
        [1, 2, 3, 4, 3, 4, 5, 6, 1, 2, 3, 4, 3, 4, 5, 6, 7, 8, 9, 10, 9, 10, 11, 12],
        [1, 3, 4, 2]),
    "reversed_axes": (
        list(range(1, 13)), [1, 2, 3, 2], {"axes": [3, 2], "sizes": [3, 4]},
        [1, 1, 2, 3, 3, 4, 3, 3, 4, 5, 5, 6, 7, 7, 8, 9, 9, 10, 9, 9, 10, 11, 11, 12],
        [1, 2, 4, 3]),
}

#: resample2d.json's inputs: [1, 1, 4, 6] and [1, 1, 2, 3]
R46 = [3.8600528355143604, 45.18463077286585, 87.67153742917091, 98.78210347338205,
       66.3741434682883, 3.4115834948988955, 86.14930500548006, 95.98133720121507,
       76.87126314100948, 16.52591355131756, 65.98782867250333, 25.470921564461158,
       22.56010547750855, 92.08479613461083, 85.80876634651386, 92.6316602716033,
       29.91620870840146, 75.40461275485572, 62.063754512670435, 1.7712158798243394,
       99.47231285272224, 11.440550135595085, 25.39634271166711, 67.02175102425608]
R23 = [59.92947164849423, 41.989187594696546, 66.39534663077877, 90.70066412516924,
       86.95106056135486, 79.10004839481242]
#: its float32 expectation for linear, scales [2, 2] (and sizes [4, 6])
R23_LINEAR = [59.92947006225586, 55.444400787353516, 46.47425842285156, 48.090728759765625,
              60.29380798339844, 66.39534759521484, 67.62226867675781, 64.02411651611328,
              56.82780838012695, 57.31512451171875, 65.48605346679688, 69.57152557373047,
              83.00786590576172, 81.18354797363281, 77.534912109375, 75.76390838623047,
              75.87055206298828, 75.92387390136719, 90.7006607055664, 89.76325988769531,
              87.88845825195312, 84.9883041381836, 81.06280517578125, 79.10005187988281]

#: conv_transpose2d.json: (input, shape), (filter, shape)
CT_X22 = ([-76.02988383382066, -71.32389057460688, -2.085512195999769, -76.10441972856492],
          [1, 1, 2, 2])
CT_W22 = ([63.98739089703227, -97.92857637226295, -87.83247798464106, -19.121183948450366],
          [1, 1, 2, 2])
CT_X33 = ([9.894964540954291, 85.68415702346587, 24.094748480252548, 12.874409836228523,
           32.236353301686904, -38.46024349445712, -68.43195409231569, -96.19399584390335,
           -10.756102339485494], [1, 1, 3, 3])
CT_W1233 = ([40.96311950512268, -92.30080102023575, 93.07175377236138, -24.275884210454365,
             40.96179340360786, 63.58423287755542, 66.61102029547635, 38.26567426829985,
             35.453481305983416, -50.56008968241721, -95.59720535330331, -14.890781966723395,
             -86.73116027713128, 71.45942817317783, -78.4748360510919, 2.367216720219375,
             2.41961735973382, 58.25714567285877], [1, 2, 3, 3])
CT_XD = ([-23.303862322607927, -60.660800814902856, -45.27723579857441, 79.39347194577522,
          16.536097856789752, -46.916933052373636, -47.06090492120389, 82.67905506257102,
          -6.757763278948744], [1, 1, 3, 3])
CT_WD = ([80.87123567764502, -18.78697954458781, -66.28471209276029, -25.946448546240262],
         [1, 1, 2, 2])
#: float32 expectations: default options (2x2 * 2x2), padding [1, 1, 1, 1], dilations [2, 2],
#: and the 3x3 * [1, 2, 3, 3] case's (nchw, iohw; its other layouts give it transposed)
CT_DEFAULT = [-4864.9541015625, 2881.66845703125, 6984.64697265625, 6544.44677734375,
              3052.84326171875, 8816.5947265625, 183.1757049560547, 6724.31787109375,
              1455.2066650390625]
CT_PADDING = [3052.84326171875]
CT_DILATIONS = [-1884.6121826171875, -4905.71435546875, -3223.817138671875, 1139.6331787109375,
                850.62255859375, 6420.6484375, 1337.2947998046875, -5285.7939453125,
                -310.6633605957031, 881.4274291992188, -2261.183837890625, 10707.2412109375,
                3943.46484375, 20.642683029174805, 1301.741455078125, -5262.5732421875,
                -1096.090576171875, 1049.896728515625, -429.05303955078125, 1217.3277587890625,
                3119.418701171875, -5480.357421875, 1668.999755859375, -2145.227783203125,
                175.3399658203125]
CT_33 = [405.32861328125, 2596.5771484375, -6000.77880859375, 5750.810546875, 2242.54052734375,
         287.1669616699219, -1542.5599365234375, 201.3699493408203, 12985.3310546875,
         -2047.5162353515625, -2456.6103515625, 8206.8583984375, 10376.37109375,
         -3526.02001953125, -2592.311767578125, 2518.82373046875, 2172.04345703125,
         -8902.2451171875, -6885.82666015625, -2047.468017578125, -4558.322265625,
         -9026.1748046875, -6823.5537109375, -3822.001220703125, -381.3412780761719,
         -500.290283203125, -5278.12939453125, -9556.7421875, -3579.294677734375,
         -358.7896423339844, -1509.133056640625, -9585.0283203125, 1927.8074951171875,
         -1805.5863037109375, -1318.1282958984375, 2366.736572265625, 9756.3564453125, 16228.5,
         2232.58203125, 4582.01953125, 5965.65966796875, 3560.370361328125, 166.09043884277344,
         8565.1220703125, -1396.5006103515625, -161.99327087402344, -393.29119873046875,
         -4244.86474609375, -5630.01318359375, -626.6198120117188]


def _positive(shape, dt):
    """Magnitudes in [0.25, 2): sums without cancellation, so WPT's ULP bound is the
    accumulation's, not a near-zero result's."""
    return RNG.uniform(0.25, 2.0, size=shape).astype(dt)


def _graph(ctx, dt: str):
    """name -> (got, float64 expectation, ULP tolerance, the WPT value or None)."""
    b = MLGraphBuilder(ctx)
    feeds: dict[str, np.ndarray] = {}
    cases: dict[str, tuple] = {}

    def inp(name, data, shape):
        a = np.asarray(data, np.float64).reshape(shape).astype(dt)
        feeds[name] = a
        return b.input(name, data_type=dt, shape=list(shape)), a

    def const(data, shape):
        a = np.asarray(data, np.float64).reshape(shape).astype(dt)
        return b.constant(data_type=dt, shape=list(shape), value=a), a

    # resample2d, nearest: WPT's half-pixel cases, exact
    for name, (data, shape, opts, want, oshape) in NEAREST_HALF_PIXEL.items():
        xi, _ = inp(f"nh_{name}", data, shape)
        cases[f"nearest_{name}"] = (b.resample2d(xi, mode="nearest-neighbor", **opts),
                                    np.reshape(want, oshape), 0, None)
    x46, a46 = inp("r46", R46, [1, 1, 4, 6])
    x23, a23 = inp("r23", R23, [1, 1, 2, 3])
    down = a46.astype(np.float64)[:, :, ::2, ::2]  # WPT: rows 0, 2; columns 0, 2, 4
    cases["nearest_default"] = (b.resample2d(x46), a46.astype(np.float64), 0, None)
    cases["nearest_r46_down_scales"] = (b.resample2d(x46, scales=[0.5, 0.5]), down, 0, None)
    cases["nearest_r46_down_sizes"] = (b.resample2d(x46, sizes=[2, 3]), down, 0, None)
    up = np.repeat(np.repeat(a23.astype(np.float64), 2, 2), 2, 3)
    cases["nearest_up_sizes_ignore_scales"] = (
        b.resample2d(x23, scales=[0.5, 0.5], sizes=[4, 6]), up, 0, None)
    cases["nearest_axes01"] = (b.resample2d(b.reshape(x46, [4, 6, 1, 1]), scales=[0.5, 0.5],
                                            axes=[0, 1]), down.reshape(2, 3, 1, 1), 0, None)
    lin_ulp = 84 if dt == "float32" else 10
    lin = ref_resample2d(a23, (1, 1, 4, 6), (2, 3), "linear")
    wpt_lin = np.reshape(R23_LINEAR, (1, 1, 4, 6)) if dt == "float32" else None
    cases["linear_scales"] = (b.resample2d(x23, mode="linear", scales=[2, 2]), lin, lin_ulp,
                              wpt_lin)
    cases["linear_sizes_nhwc"] = (
        b.resample2d(b.reshape(x23, [1, 2, 3, 1]), mode="linear", sizes=[4, 6], axes=[1, 2]),
        lin.reshape(1, 4, 6, 1), lin_ulp, None)
    # resample2d, fresh inputs: downscales, non-integer ratios, reversed axes, linear both ways
    xr, ar = inp("rr", _positive((2, 3, 5, 7), dt), (2, 3, 5, 7))
    for name, mode, opts, axes in (
            ("rand_nearest_up", "nearest-neighbor", {"sizes": [9, 11]}, (2, 3)),
            ("rand_nearest_down", "nearest-neighbor", {"scales": [0.6, 0.45]}, (2, 3)),
            ("rand_nearest_axes31", "nearest-neighbor", {"sizes": [3, 7]}, (3, 1)),
            ("rand_linear_up", "linear", {"scales": [1.7, 2.3]}, (2, 3)),
            ("rand_linear_down", "linear", {"sizes": [3, 4]}, (2, 3)),
            ("rand_linear_axes02", "linear", {"sizes": [5, 2]}, (0, 2))):
        y = b.resample2d(xr, mode=mode, axes=list(axes), **opts)
        ulp = 0 if mode == "nearest-neighbor" else lin_ulp
        cases[name] = (y, ref_resample2d(ar, y.shape, axes, mode), ulp, None)

    # convTranspose2d: WPT's cases (float32 values where WPT lists them)
    f32 = dt == "float32"
    xa, va = inp("ct22", *CT_X22)
    wa, ua = const(*CT_W22)
    cases["ct_default"] = (b.conv_transpose2d(xa, wa), ref_conv_transpose2d(va, ua), 8,
                           np.reshape(CT_DEFAULT, (1, 1, 3, 3)) if f32 else None)
    cases["ct_padding"] = (b.conv_transpose2d(xa, wa, padding=[1, 1, 1, 1]),
                           ref_conv_transpose2d(va, ua, padding=(1, 1, 1, 1)), 8,
                           np.reshape(CT_PADDING, (1, 1, 1, 1)) if f32 else None)
    xd, vd = inp("ctd", *CT_XD)
    wd, ud = const(*CT_WD)
    cases["ct_dilations"] = (b.conv_transpose2d(xd, wd, dilations=[2, 2]),
                             ref_conv_transpose2d(vd, ud, dilations=(2, 2)), 8,
                             np.reshape(CT_DILATIONS, (1, 1, 5, 5)) if f32 else None)
    x3, v3 = inp("ct33", *CT_X33)
    w3, u3 = const(*CT_W1233)
    want33 = ref_conv_transpose2d(v3, u3)
    wpt33 = np.reshape(CT_33, (1, 2, 5, 5)) if f32 else None
    cases["ct_nchw_iohw"] = (b.conv_transpose2d(x3, w3), want33, 18, wpt33)
    x3h = b.reshape(x3, [1, 3, 3, 1])
    cases["ct_nhwc"] = (b.conv_transpose2d(x3h, w3, input_layout="nhwc"),
                        want33.transpose(0, 2, 3, 1), 18,
                        None if wpt33 is None else wpt33.transpose(0, 2, 3, 1))
    w3hwoi, _ = const(u3.transpose(2, 3, 1, 0), [3, 3, 2, 1])
    cases["ct_hwoi"] = (b.conv_transpose2d(x3, w3hwoi, filter_layout="hwoi"), want33, 18, wpt33)
    w3ohwi, _ = const(u3.transpose(1, 2, 3, 0), [2, 3, 3, 1])
    cases["ct_ohwi"] = (b.conv_transpose2d(x3, w3ohwi, filter_layout="ohwi"), want33, 18, wpt33)
    cases["ct_strides_output_padding"] = (
        b.conv_transpose2d(x3, w3, strides=[3, 2], output_padding=[1, 1]),
        ref_conv_transpose2d(v3, u3, strides=(3, 2), out_hw=(10, 8)), 18, None)
    cases["ct_output_sizes"] = (
        b.conv_transpose2d(x3, w3, strides=[3, 2], output_sizes=[10, 8]),
        ref_conv_transpose2d(v3, u3, strides=(3, 2), out_hw=(10, 8)), 18, None)
    # fresh inputs: groups, bias, every option at once, each layout pair
    xg, vg = inp("ctg", _positive((2, 4, 5, 4), dt), (2, 4, 5, 4))
    wg_, ug = const(_positive((4, 3, 3, 2), dt), (4, 3, 3, 2))  # iohw, 3 outputs a group
    bias, bv = const(_positive((6,), dt), (6,))
    tol = 3 * 2 * 2 * 2  # kh * kw * channels a group * 2
    opts = dict(padding=(1, 0, 2, 1), strides=(2, 3), dilations=(2, 1), groups=2)
    cases["rand_ct_groups_bias"] = (
        b.conv_transpose2d(xg, wg_, padding=[1, 0, 2, 1], strides=[2, 3], dilations=[2, 1],
                           output_padding=[1, 2], groups=2, bias=bias),
        ref_conv_transpose2d(vg, ug, out_hw=(13, 10), bias=bv, **opts), tol, None)
    xgh = b.transpose(xg, [0, 2, 3, 1])
    for fl, perm in (("hwoi", (2, 3, 1, 0)), ("ohwi", (1, 2, 3, 0))):
        wl, _ = const(ug.transpose(perm), ug.transpose(perm).shape)
        y = b.conv_transpose2d(xgh, wl, padding=[1, 0, 2, 1], strides=[2, 3],
                               dilations=[2, 1], output_sizes=[12, 9], groups=2,
                               input_layout="nhwc", filter_layout=fl, bias=bias)
        cases[f"rand_ct_nhwc_{fl}"] = (y, ref_conv_transpose2d(
            vg.transpose(0, 2, 3, 1), ug.transpose(perm), out_hw=(12, 9), bias=bv,
            input_layout="nhwc", filter_layout=fl, **opts), tol, None)
    got = run_graph(ctx, b, {k: v[0] for k, v in cases.items()}, feeds)
    return {k: (got[k], want, tol, wpt) for k, (_, want, tol, wpt) in cases.items()}


float32_results, float16_results = dtype_results(_graph)


CASES = [f"nearest_{k}" for k in NEAREST_HALF_PIXEL] + [
    "nearest_default", "nearest_r46_down_scales", "nearest_r46_down_sizes",
    "nearest_up_sizes_ignore_scales", "nearest_axes01", "linear_scales", "linear_sizes_nhwc",
    "rand_nearest_up", "rand_nearest_down", "rand_nearest_axes31", "rand_linear_up",
    "rand_linear_down", "rand_linear_axes02", "ct_default", "ct_padding", "ct_dilations",
    "ct_nchw_iohw", "ct_nhwc", "ct_hwoi", "ct_ohwi", "ct_strides_output_padding",
    "ct_output_sizes", "rand_ct_groups_bias", "rand_ct_nhwc_hwoi", "rand_ct_nhwc_ohwi"]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("case", CASES)
def test_within_wpt_tolerance(request, dt, case):
    """Against the float64 reference, and against WPT's own listed values where given (both
    at WPT's ULP tolerance for the op)."""
    got, want, tol, wpt = request.getfixturevalue(f"{dt}_results")[case]
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == np.dtype(dt)
    for w in (want, wpt):
        if w is None:
            continue
        d = ulp_distance(got, np.asarray(w, np.float64))
        assert d.max() <= tol, f"{case} {dt}: {d.max()} ULP > {tol} (got " \
                               f"{got.flat[d.argmax()]}, want {w.flat[d.argmax()]})"


def test_references_agree_with_wpt():
    """The NumPy references reproduce WPT's listed values, which are exact results on the
    float32-rounded inputs (so the random cases' oracle is the one WPT's data implies)."""
    f32 = lambda a: np.reshape(*a).astype(np.float32)  # noqa: E731
    a23 = f32((R23, (1, 1, 2, 3)))
    lin = ref_resample2d(a23, (1, 1, 4, 6), (2, 3), "linear").ravel()
    assert ulp_distance(np.float32(R23_LINEAR), lin).max() <= 1
    for want, x, w, kw in ((CT_DEFAULT, CT_X22, CT_W22, {}),
                           (CT_DILATIONS, CT_XD, CT_WD, {"dilations": (2, 2)}),
                           (CT_33, CT_X33, CT_W1233, {})):
        got = ref_conv_transpose2d(f32(x), f32(w), **kw)
        np.testing.assert_array_equal(got.ravel().astype(np.float32), want)


def test_type_errors_where_the_spec_throws(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 2, 3, 4])
    x3 = b.input("x3", data_type="float32", shape=[2, 3, 4])
    xi = b.input("xi", data_type="int32", shape=[1, 2, 3, 4])
    xh = b.input("xh", data_type="float16", shape=[1, 2, 3, 4])
    w = b.constant(data_type="float32", shape=[2, 3, 2, 2], value=np.ones(24, np.float32))
    w3 = b.constant(data_type="float32", shape=[2, 3, 2], value=np.ones(12, np.float32))
    bias = b.constant(data_type="float32", shape=[3], value=np.ones(3, np.float32))
    bad = [
        lambda: b.resample2d(x3),  # rank 3
        lambda: b.resample2d(xi),  # not a float
        lambda: b.resample2d(x, mode="cubic"),
        lambda: b.resample2d(x, scales=[2.0]),
        lambda: b.resample2d(x, scales=[2.0, 0.0]),
        lambda: b.resample2d(x, scales=[2.0, -1.0]),
        lambda: b.resample2d(x, scales=[0.1, 1.0]),  # floor(3 * 0.1) = 0: not a dimension
        lambda: b.resample2d(x, sizes=[4]),
        lambda: b.resample2d(x, sizes=[4, 0]),
        lambda: b.resample2d(x, sizes=[4, -1]),  # not an unsigned long
        lambda: b.resample2d(x, sizes=[4, 2**32]),
        lambda: b.resample2d(x, axes=[2, 2]),
        lambda: b.resample2d(x, axes=[3, 4]),
        lambda: b.resample2d(x, axes=[1]),
        lambda: b.resample2d(x, scales=[2**31, 2**31]),  # output beyond an unsigned long
        lambda: b.conv_transpose2d(x3, w),
        lambda: b.conv_transpose2d(x, w3),
        lambda: b.conv_transpose2d(xi, w),
        lambda: b.conv_transpose2d(xh, w),  # filter of another type
        lambda: b.conv_transpose2d(x, w, padding=[0, 0]),
        lambda: b.conv_transpose2d(x, w, strides=[1, 0]),
        lambda: b.conv_transpose2d(x, w, strides=[1]),
        lambda: b.conv_transpose2d(x, w, dilations=[0, 1]),
        lambda: b.conv_transpose2d(x, w, output_padding=[1, 0]),  # not below stride 1
        lambda: b.conv_transpose2d(x, w, strides=[2, 2], output_padding=[1]),
        lambda: b.conv_transpose2d(x, w, output_sizes=[5]),
        lambda: b.conv_transpose2d(x, w, strides=[2, 2], output_sizes=[5, 9]),  # below 6
        lambda: b.conv_transpose2d(x, w, strides=[2, 2], output_sizes=[8, 9]),  # 6 + 2
        lambda: b.conv_transpose2d(x, w, groups=0),
        lambda: b.conv_transpose2d(x, w, groups=4),  # 2 channels in 4 groups (here)
        lambda: b.conv_transpose2d(x, w, input_layout="nwhc"),
        lambda: b.conv_transpose2d(x, w, filter_layout="oihw"),  # conv2d's, not this op's
        lambda: b.conv_transpose2d(x, w, input_layout="nhwc"),  # 4 channels, filter's 2
        lambda: b.conv_transpose2d(x, b.constant(  # the filter's 3 input channels, not 2
            data_type="float32", shape=[3, 1, 2, 2], value=np.ones(12, np.float32))),
        lambda: b.conv_transpose2d(x, w, bias=b.constant(
            data_type="float32", shape=[4], value=np.ones(4, np.float32))),
        lambda: b.conv_transpose2d(x, w, bias=b.constant(
            data_type="float32", shape=[1, 3], value=np.ones(3, np.float32))),
        lambda: b.conv_transpose2d(x, w, bias=b.constant(
            data_type="float16", shape=[3], value=np.ones(3, np.float16))),
        lambda: b.conv_transpose2d(x, w, padding=[3, 3, 0, 0]),  # height 4 - 6 < 1
        lambda: MLGraphBuilder(ctx).conv_transpose2d(x, w),  # another builder's operand
    ]
    for k, f in enumerate(bad):
        with pytest.raises(TypeError):
            f()
            pytest.fail(f"case {k} did not raise")
    # and the valid neighbours of those cases build
    assert b.conv_transpose2d(x, w, bias=bias).shape == [1, 3, 4, 5]
    assert b.conv_transpose2d(x, w, strides=[2, 2], output_sizes=[6, 9]).shape == [1, 3, 6, 9]
    assert b.conv_transpose2d(x, w, groups=2).shape == [1, 6, 4, 5]
    assert b.resample2d(x, scales=[1.0, 0.5], axes=[0, 3]).shape == [1, 2, 3, 2]
    assert b.resample2d(xh, sizes=[5, 1]).data_type == "float16"


def test_op_support_limits(ctx):
    limits = ctx.op_support_limits()
    rs, ct = limits["resample2d"], limits["conv_transpose2d"]
    assert rs["input"]["rank_range"] == {"min": 4, "max": 4}
    assert set(rs["input"]["data_types"]) <= {"float32", "float16"}
    assert "float32" in rs["output"]["data_types"]
    assert ct["filter"]["rank_range"] == {"min": 4, "max": 4}
    assert ct["bias"]["rank_range"] == {"min": 1, "max": 1}
    assert ct["output"]["rank_range"] == {"min": 4, "max": 4}
