"""backends/webnn/ir.py and wgpu_impl/lowerings.py: the frozen graph build() hands the context
(shared constants, read-only, one node an operand) and the lowering registry's checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder
from backends.webnn.wgpu_impl import lowerings

RNG = np.random.default_rng(28)


@pytest.fixture(scope="module")
def handed(ctx):
    """(the ir.Graph the context was handed, the constant's array, the graph's result)."""
    from backends.webnn.wgpu_impl.context import WgpuContext

    seen = []
    own = WgpuContext._build

    def keep(self, graph, use_stateful):
        seen.append(graph)
        return own(self, graph, use_stateful)

    mp = pytest.MonkeyPatch()
    mp.setattr(WgpuContext, "_build", keep)
    try:
        w = RNG.standard_normal((4, 3)).astype(np.float32)
        w.flags.writeable = False  # kept by reference by constant()
        b = MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[2, 4])
        y = b.transpose(b.matmul(x, b.constant(data_type="float32", shape=[4, 3], value=w)))
        g = b.build({"y": y})
    finally:
        mp.undo()
    feed = RNG.standard_normal((2, 4)).astype(np.float32)
    out = ctx.create_tensor(data_type="float32", shape=[3, 2], readable=True)
    xin = ctx.create_tensor(data_type="float32", shape=[2, 4], writable=True)
    ctx.write_tensor(xin, feed)
    ctx.dispatch(g, {"x": xin}, {"y": out})
    got = ctx.read_tensor(out)
    return seen[0], w, got, (feed.astype(np.float64) @ w.astype(np.float64)).T


def test_the_graph_handed_over_computes_the_result(handed):
    _, _, got, want = handed
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nodes_are_frozen_and_in_topological_order(handed):
    graph, *_ = handed
    assert [n.kind for n in graph.nodes].count("op") == 2
    pos = {n.id: i for i, n in enumerate(graph.nodes)}
    assert all(pos[x.id] < pos[n.id] for n in graph.nodes for x in n.inputs)
    y = graph.outputs["y"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        y.op = "add"
    with pytest.raises(TypeError):
        y.attrs["permutation"] = [0, 1]
    assert graph.inputs["x"].name == "x" and graph.inputs["x"].shape == (2, 4)


def test_constants_are_shared_not_copied(handed):
    graph, w, *_ = handed
    (c,) = graph.constants
    assert np.shares_memory(c.value, w)  # the caller's read-only array, as constant() kept it


def test_registry_refuses_a_second_lowering_of_an_op_and_a_taken_rank():
    with pytest.raises(ValueError, match="already lowered"):
        lowerings.lowers("matmul")(lambda n: None)
    taken = lowerings.CLAIMS[0][0]
    with pytest.raises(ValueError, match="taken"):
        lowerings.claims(taken, lambda plan, o: False)(lambda n: None)


def test_every_op_the_builder_makes_has_a_lowering():
    """An op without a registered lowering would fail only at build; the builder's ops that
    reach the compiler (views and composites aside) all have one."""
    from backends.webnn import _classes
    from backends.webnn.wgpu_impl import lowering  # noqa: F401  (registers)

    ops = {*_classes.ELEMENTWISE_BINARY, *_classes.ELEMENTWISE_UNARY, *_classes.COMPARISON,
           "matmul", "softmax", "transpose", "slice", "concat", "gather", "scatter_nd",
           "cumulative_sum", "scatter_elements", "dequantize_linear", "reduce_sum"}
    ops |= {"gather_elements", "gather_nd", "reverse", "quantize_linear"}
    assert ops <= set(lowerings.LOWERINGS)
