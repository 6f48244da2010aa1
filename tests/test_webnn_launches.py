"""The launches of a decode step on the GPU's plan (scripts/launch_census.py, no GPU needed):
what a point records (``MLGraph.launches``), and the launches a layer of the preset and of
onnxruntime-genai's real q4f16 export (PERFORMANCE.md, "Launches a layer")."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_graph_counts_the_launches_of_its_dispatch(ctx):
    """``MLGraph.launches`` is the plan's launches, kernels and copies (a page's
    ``details["launches"]``): here two element-wise launches and a matmul."""
    import numpy as np

    from backends.webnn import MLGraphBuilder

    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3, 4])
    w = b.constant(data_type="float32", shape=[4, 5], value=np.ones((4, 5), np.float32))
    y = b.matmul(b.exp(x), w)
    g = b.build({"y": y, "e": b.sqrt(b.abs(x))})
    assert g.launches == len(g._plan.launches) == 3


def _census(*args: str) -> dict:
    sys.path.insert(0, str(ROOT / "scripts"))
    import launch_census as LC

    from backends.webnn.wgpu_impl.options import KernelOptions

    options = KernelOptions()
    graph, stateful = LC.capture("wgpu:stateful", None, 32, args[0], options)
    launches = LC.census(graph, stateful, LC.targets()["nvidia"], options)
    runs, rest = LC.layers(launches)
    return {"runs": runs, "rest": rest, "launches": launches}


def test_the_real_export_plans_the_presets_layer(tmp_path):
    """genai's q4f16 export with its MLP 192 wide (its full-size path: no padded block) on
    the H200's plan: each layer one norm, the packed q/k/v product, the row write,
    attention and its combine, o with the residual, a norm, gate/up with SwiGLU, down with
    the residual (the preset's layer: PERFORMANCE.md "Launches a layer"); the rotary rows
    and the row-write index once a step, not once a layer."""
    import onnx
    from genai_shapes import widened_mlp

    path = tmp_path / "model.onnx"
    onnx.save(widened_mlp(), str(path))
    got = _census(str(path))
    per = [[la["kernel"] for la in r] for r in got["runs"]]
    assert len(per) == 2 and all(len(r) == len(per[0]) for r in per), per
    assert sorted(per[0]) == sorted(
        ["fused_vector", "gemv_q4_quad", "scatter_nd", "attention_flash", "attention_combine",
         "gemv_q4_quad", "fused_vector", "gemv_q4_quad", "gemv_q4_quad"]), per[0]
    rest = [la["kernel"] for la in got["rest"]]
    assert rest.count("gather") == 3, rest  # the embedding row, the cos and sin rows
    assert "transpose" not in rest + per[0]
