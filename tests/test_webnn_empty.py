"""0-sized tensors in a graph the pages convert (issue 30 item 6): WebNN has none (a
dimension must be positive, webmachinelearning/webnn#391), but real exports make them (a
rotary section of width 0: an empty Slice, transposed and scattered by an empty
ScatterND). The converter keeps every empty value on the host and folds it away exactly:
a Concat of it is the Concat of the others, a scatter of no updates is its data. Each graph
is checked against ORT's CPU EP on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_convert_ops import check, f32, node
from test_onnx_converter import context  # noqa: F401  (the fixture)

from backends.pages import StatelessCopy
from backends.webnn.onnx_converter import ConversionError, convert

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)


def _i64(*v):
    return np.array(v, np.int64)


def test_an_empty_slice_concatenated_is_the_others(context):  # noqa: F811
    """Three sections of a rotary half, the last 0 wide, scaled and concatenated back."""
    x = f32(1, 2, 3, 6)
    nodes = [node("Slice", ["x", "s0", "e0", "ax"], ["a"]),
             node("Slice", ["x", "s1", "e1", "ax"], ["b"]),
             node("Slice", ["x", "e1", "e1", "ax"], ["empty"]),  # [1, 2, 3, 0]
             node("Mul", ["empty", "k"], ["scaled"]),            # still empty: folded
             node("Neg", ["scaled"], ["neg"]),
             node("Concat", ["a", "neg", "b"], ["y"], axis=-1),
             node("Concat", ["neg", "x"], ["z"], axis=3)]
    inits = {"s0": _i64(0), "e0": _i64(2), "s1": _i64(2), "e1": _i64(6), "ax": _i64(3),
             "k": np.float32(2.0)}
    check(context, nodes, {"x": x}, inits, outputs=("y", "z"))


def test_a_scatter_of_an_empty_slice_is_its_data(context):  # noqa: F811
    """The exporter's interleave of a 0-wide section: Slice -> Transpose -> ScatterND with
    no rows; then the data goes on to be computed with."""
    x, d = f32(1, 4, 5), f32(5, 1, 4)
    nodes = [node("Slice", ["x", "s", "s", "ax"], ["sec"]),        # [1, 4, 0]
             node("Transpose", ["sec"], ["t"], perm=[2, 0, 1]),    # [0, 1, 4]
             node("ScatterND", ["d", "idx", "t"], ["scat"]),
             node("Reshape", ["t", "shape"], ["flat"]),            # [0, 4]
             node("ScatterND", ["scat", "idx2", "flat"], ["scat2"]),
             node("Add", ["scat2", "d"], ["sum"]),
             node("Transpose", ["x"], ["xt"], perm=[2, 0, 1]),
             node("Add", ["sum", "xt"], ["y"])]
    inits = {"s": _i64(2), "ax": _i64(2), "shape": _i64(0, 4),
             "idx": np.zeros((0, 1), np.int64), "idx2": np.zeros((0, 2), np.int64)}
    check(context, nodes, {"x": x, "d": d}, inits)


def test_a_scatter_of_computed_empty_indices_is_its_data(context):  # noqa: F811
    """Indices computed from the graph's shapes (a Range of length 0 unsqueezed) and updates
    gathered with them: every empty value still folds."""
    x, d = f32(2, 6), f32(6, 2)
    nodes = [node("Range", ["lo", "lo", "step"], ["r"]),             # [] : 0 long
             node("Unsqueeze", ["r", "one"], ["idx"]),               # [0, 1]
             node("Gather", ["x", "r"], ["g"], axis=1),              # [2, 0]
             node("Transpose", ["g"], ["upd"]),                      # [0, 2]
             node("ScatterND", ["d", "idx", "upd"], ["s"]),
             node("ScatterElements", ["x", "ie", "ue"], ["e"], axis=1),
             node("Add", ["s", "d"], ["y"]),
             node("Mul", ["e", "e"], ["z"])]
    inits = {"lo": _i64(3)[0], "step": _i64(1)[0], "one": _i64(1),
             "ie": np.zeros((2, 0), np.int64), "ue": np.zeros((2, 0), np.float32)}
    check(context, nodes, {"x": x, "d": d}, inits, outputs=("y", "z"))


def test_a_split_with_an_empty_part(context):  # noqa: F811
    x = f32(2, 7, 3)
    nodes = [node("Split", ["x", "sizes"], ["a", "none", "b"], axis=1),
             node("Concat", ["b", "none", "a"], ["y"], axis=1),
             node("Split", ["x", "one"], ["c", "nothing"], axis=2),
             node("Sigmoid", ["nothing"], ["sn"]),
             node("Concat", ["sn", "c"], ["z"], axis=2)]
    check(context, nodes, {"x": x}, {"sizes": _i64(4, 0, 3), "one": _i64(3, 0)},
          outputs=("y", "z"))


def test_an_empty_input_with_a_full_result_is_refused_in_one_line(context):  # noqa: F811
    """A MatMul over an empty axis is zeros whatever its inputs hold, but folding on the host
    only takes results that are empty too: one line naming the node, never a guess."""
    nodes = [node("Slice", ["x", "s", "s", "ax"], ["e"]),   # [2, 0]
             node("MatMul", ["e", "w"], ["y"], name="mm")]
    inits = {"s": _i64(1), "ax": _i64(1), "w": np.zeros((0, 3), np.float32)}
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", 1, [2, 4])],
                          [helper.make_tensor_value_info("y", 1, [2, 3])],
                          [helper.make_tensor(k, 7 if v.dtype == np.int64 else 1, v.shape,
                                              v.reshape(-1).tolist()) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ConversionError, match=r"MatMul node 'mm' reads an empty tensor but its "
                       r"output 'y' has 6 elements"):
        convert(model, context)
