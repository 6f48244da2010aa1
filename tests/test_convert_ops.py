"""The converter's plain ops on runtime values (convert_ops.py), each against ORT's CPU EP
on a graph made with onnx.helper, fresh random inputs, float32 at tight tolerance."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_onnx_converter import compare, context, run_graph  # noqa: F401  (the fixture)

from backends.pages import StatelessCopy
from backends.webnn.onnx_converter import ConversionError, convert

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

rng = np.random.default_rng(1717)
OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]


def _vi(name: str, arr: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype),
                                         arr.shape)


def ort_model(nodes, inputs: dict, inits: dict | None = None, outputs=("y",), opsets=OPSETS,
              types: dict | None = None):
    """The graph, its outputs shaped from what ORT's CPU EP computes, and those values (the
    oracle). ``types``: output element types other than float32."""
    inits = inits or {}
    types = types or {}

    def make(out_vis):
        g = helper.make_graph(nodes, "t", [_vi(n, a) for n, a in inputs.items()], out_vis,
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
        return helper.make_model(g, opset_imports=opsets)

    probe = make([helper.make_tensor_value_info(
        o, helper.np_dtype_to_tensor_dtype(np.dtype(types.get(o, np.float32))), None)
        for o in outputs])
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = [np.asarray(e) for e in sess.run(list(outputs), inputs)]
    return make([_vi(o, e) for o, e in zip(outputs, expected, strict=True)]), expected


def check(context, nodes, inputs, inits=None, outputs=("y",), atol=1e-5, rtol=1e-5,  # noqa: F811
          types=None, opsets=OPSETS):
    model, expected = ort_model(nodes, inputs, inits, outputs, opsets, types)
    compare(run_graph(context, model, inputs), outputs, expected, rtol, atol)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def node(op, ins, outs=("y",), **attrs):
    return helper.make_node(op, list(ins), list(outs), **attrs)


@pytest.mark.parametrize("op", ["Cos", "Sin"])
def test_trig(context, op):  # noqa: F811
    check(context, [node(op, ["x"])], {"x": 4 * f32(2, 3, 8)}, atol=2e-6)


def test_is_nan(context):  # noqa: F811
    x = f32(3, 7)
    x[0, 1] = x[2, 5] = np.nan
    x[1, 2] = np.inf
    check(context, [node("IsNaN", ["x"])], {"x": x}, types={"y": np.bool_})


def test_arg_max_min(context):  # noqa: F811
    """ArgMax/ArgMin with each keepdims, a negative axis, ties (the first index; the last with
    select_last_index=1), against ORT's int64 indices."""
    x = f32(3, 7, 5)
    x[:, 4] = x[:, 1]  # ties along axis 1
    nodes = [node("ArgMax", ["x"], ["a"], axis=1, keepdims=0),
             node("ArgMin", ["x"], ["b"], axis=-1),
             node("ArgMin", ["x"], ["c"], axis=1, keepdims=1),
             node("ArgMax", ["x"], ["d"], axis=1, keepdims=0, select_last_index=1),
             node("ArgMin", ["x"], ["e"], axis=0, select_last_index=1)]
    outs = ("a", "b", "c", "d", "e")
    check(context, nodes, {"x": x}, outputs=outs, atol=0, rtol=0,
          types=dict.fromkeys(outs, np.int64))


def test_bool_logic_and_casts(context):  # noqa: F811
    """Cast to and from bool, Not, And, Or on runtime masks (what exports build their
    attention masks from)."""
    a, b = f32(2, 6), f32(2, 6)
    a[0, :2] = 0
    nodes = [node("Cast", ["a"], ["ab"], to=TensorProto.BOOL),
             node("Greater", ["b", "z"], ["bb"]),
             node("Not", ["ab"], ["na"]),
             node("And", ["na", "bb"], ["x1"]), node("Or", ["ab", "bb"], ["x2"]),
             node("Cast", ["x1"], ["y"], to=TensorProto.FLOAT),
             node("Cast", ["x2"], ["y2"], to=TensorProto.INT64)]
    check(context, nodes, {"a": a, "b": b}, {"z": np.zeros(1, np.float32)},
          outputs=("y", "y2", "ab"), types={"y2": np.int64, "ab": np.bool_})


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization(context, p):  # noqa: F811
    check(context, [node("LpNormalization", ["x"], axis=-1, p=p)], {"x": f32(2, 3, 16)})


@pytest.mark.parametrize("form", ["sizes", "equal", "num_outputs"])
def test_split(context, form):  # noqa: F811
    x = f32(2, 10, 3)
    if form == "sizes":
        n, inits, kw = node("Split", ["x", "s"], ["y", "y1", "y2"], axis=1), \
            {"s": np.array([2, 5, 3], np.int64)}, {}
    elif form == "equal":
        # equal parts from the output count: opsets before 18
        n, inits, kw = node("Split", ["x"], ["y", "y1"], axis=-2), {}, \
            {"opsets": [helper.make_opsetid("", 13)]}
    else:
        n, inits, kw = node("Split", ["x"], ["y", "y1", "y2"], axis=1, num_outputs=3), {}, {}
    check(context, [n], {"x": x}, inits, outputs=("y", "y1", "y2") if form != "equal"
          else ("y", "y1"), **kw)


@pytest.mark.parametrize("upper,k", [(1, 0), (0, 0), (1, 2), (0, -1)])
def test_trilu(context, upper, k):  # noqa: F811
    check(context, [node("Trilu", ["x", "k"], upper=upper)], {"x": f32(2, 5, 7)},
          {"k": np.array(k, np.int64)})


def test_tile(context):  # noqa: F811
    check(context, [node("Tile", ["x", "r"])], {"x": f32(2, 3, 4)},
          {"r": np.array([2, 1, 3], np.int64)})


@pytest.mark.parametrize("pads,value", [([0, 1, 2, 0, 3, 1], 0.5), ([1, 0, -1, 0, 2, 3], 0.0)])
def test_pad_constant(context, pads, value):  # noqa: F811
    check(context, [node("Pad", ["x", "p", "v"])], {"x": f32(2, 3, 5)},
          {"p": np.array(pads, np.int64), "v": np.array(value, np.float32)})


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(context, exclusive, reverse):  # noqa: F811
    check(context, [node("CumSum", ["x", "ax"], exclusive=exclusive, reverse=reverse)],
          {"x": f32(2, 9, 3)}, {"ax": np.array(1, np.int64)})


def test_cumsum_int64_mask_positions(context):  # noqa: F811
    """position_ids = cumsum(attention_mask) - 1, as optimum's Llama computes them."""
    mask = (rng.random((1, 12)) > 0.3).astype(np.int64)
    check(context, [node("CumSum", ["m", "ax"], ["c"]), node("Sub", ["c", "one"])],
          {"m": mask}, {"ax": np.array(-1, np.int64), "one": np.array(1, np.int64)},
          types={"y": np.int64})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(context, axis):  # noqa: F811
    x = f32(4, 5, 6)
    shp = [3, 4, 5]
    ax = axis % 3
    # distinct indices along the axis per line (duplicates are implementation-defined)
    idx = np.argsort(rng.random([x.shape[ax] if i == ax else shp[i] for i in range(3)]),
                     axis=ax)
    idx = np.take(idx, range(shp[ax]), axis=ax).astype(np.int64)
    idx[idx == 1] = 1 - x.shape[ax]  # a negative index too
    check(context, [node("ScatterElements", ["x", "i", "u"], axis=axis)],
          {"x": x, "i": idx, "u": f32(*shp)})


@pytest.mark.parametrize("axis", [0, -1])
def test_gather_elements(context, axis):  # noqa: F811
    x = f32(4, 5, 6)
    ax = axis % 3
    shp = [3, 4, 5]
    shp = [shp[i] if i == ax else x.shape[i] for i in range(3)]
    idx = rng.integers(-x.shape[ax], x.shape[ax], size=shp).astype(np.int64)  # negative too
    check(context, [node("GatherElements", ["x", "i"], axis=axis)], {"x": x, "i": idx},
          atol=0, rtol=0)


def test_gather_nd(context):  # noqa: F811
    x = f32(4, 5, 6)
    idx = np.stack([rng.integers(-4, 4, size=(3, 2)), rng.integers(-5, 5, size=(3, 2))],
                   -1).astype(np.int64)
    check(context, [node("GatherND", ["x", "i"])], {"x": x, "i": idx}, atol=0, rtol=0)


@pytest.mark.parametrize("k,pads,dil,stride", [(4, [3, 0], 1, 1), (3, [1, 1], 2, 1),
                                               (3, [0, 2], 1, 2)])
def test_conv_depthwise_1d(context, k, pads, dil, stride):  # noqa: F811
    c = 6
    check(context, [node("Conv", ["x", "w", "b"], group=c, kernel_shape=[k], pads=pads,
                         dilations=[dil], strides=[stride])],
          {"x": f32(2, c, 9)}, {"w": f32(c, 1, k), "b": f32(c)})


def test_conv_depthwise_2d(context):  # noqa: F811
    check(context, [node("Conv", ["x", "w"], group=3, kernel_shape=[2, 3], pads=[1, 0, 0, 2])],
          {"x": f32(1, 3, 4, 5)}, {"w": f32(3, 1, 2, 3)})


def test_conv_not_depthwise_is_named(context):  # noqa: F811
    model, _ = ort_model([node("Conv", ["x", "w"], kernel_shape=[3])], {"x": f32(1, 4, 8)},
                         {"w": f32(2, 4, 3)})
    with pytest.raises(ConversionError, match="depthwise"):
        convert(model, context)
