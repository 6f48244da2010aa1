"""An element-wise group reading a two-launch attention's output, written by the attention's
combine instead of the output (``passes.attention_epilogues``, ``kernels/attention.Epilogue``):
Qwen3.5's output gate ``o · sigmoid(gate)`` and any element-wise function of the output and
other values. Checked against a float64 NumPy oracle on fresh random inputs for the flash,
tile and lanes combines, 16-byte and scalar output words, a gate sliced from a packed
product and a broadcast bias; the group keeps its launch where the output has another
reader or is read at another index, and where the attention is one launch. The combines'
WGSL is checked with naga and Tint."""

from __future__ import annotations

import numpy as np
import pytest
from test_webnn_attention import RNG, run

from backends.webnn import MLGraphBuilder


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def graph(ctx, heads: int, g: int, cap: int, d: int, tail: str,
          o_weights: np.ndarray | None = None):
    """Decode attention of ``heads`` KV heads of ``g`` q rows, its output flattened to one
    row and put through ``tail``: "gate" (``o · sigmoid(gate)``), "packed" (the gate a
    slice of a product twice as wide), "bias" (``o · sigmoid(gate) + bias`` by rows of the
    head dimension, the bias broadcast over them), "extra" (the gate, the output a graph output too),
    "transposed" (the gate over the output's (g, heads) transpose); ``o_weights``: that
    times these constant weights (an o projection)."""
    b = MLGraphBuilder(ctx)
    n = heads * g * d
    q = b.input("q", data_type="float32", shape=[1, heads, g, d])
    k = b.input("k", data_type="float32", shape=[1, heads, cap, d])
    v = b.input("v", data_type="float32", shape=[1, heads, cap, d])
    valid = b.input("valid", data_type="float32", shape=[1, 1, 1, cap])
    gate = b.input("gate", data_type="float32", shape=[1, 1, 2 * n if tail == "packed" else n])
    scale = b.constant(data_type="float32", shape=[1], value=np.float32([1 / np.sqrt(d)]))
    zero = b.constant(data_type="float32", shape=[1], value=np.float32([0.0]))
    neg = b.constant(data_type="float32", shape=[1], value=np.float32([-np.inf]))
    s = b.mul(b.matmul(q, b.transpose(k, [0, 1, 3, 2])), scale)
    o = b.matmul(b.softmax(b.where(b.greater(valid, zero), s, neg), 3), v)
    if tail == "transposed":
        o = b.transpose(o, [0, 2, 1, 3])
    flat = b.reshape(o, [1, 1, n])
    if tail == "packed":
        gate = b.slice(gate, [0, 0, n], [1, 1, n])
    y = b.mul(flat, b.sigmoid(gate))
    outs = {}
    if tail == "bias":
        y = b.add(b.reshape(y, [1, heads * g, d]),
                  b.input("bias", data_type="float32", shape=[d]))
    if tail == "extra":
        outs["o"] = o
    if o_weights is not None:
        y = b.matmul(y, b.constant(data_type="float32", shape=list(o_weights.shape),
                                   value=o_weights.astype(np.float32)))
    outs["y"] = y
    return b.build(outs), outs


def feeds_and_oracle(heads: int, g: int, cap: int, d: int, tail: str) -> tuple[dict, dict]:
    """Fresh random inputs and the float64 results."""
    n = heads * g * d
    depth = int(RNG.integers(1, cap))
    feeds = {"q": RNG.standard_normal((1, heads, g, d)),
             "k": RNG.standard_normal((1, heads, cap, d)),
             "v": RNG.standard_normal((1, heads, cap, d)),
             "valid": (np.arange(cap) < depth).astype(np.float64).reshape(1, 1, 1, cap),
             "gate": RNG.standard_normal((1, 1, 2 * n if tail == "packed" else n))}
    if tail == "bias":
        feeds["bias"] = RNG.standard_normal(d)
    sc = np.einsum("bhgd,bhcd->bhgc", feeds["q"], feeds["k"]) / np.sqrt(d)
    sc = np.where(feeds["valid"] > 0, sc, -np.inf)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    o = np.einsum("bhgc,bhcd->bhgd", e / e.sum(-1, keepdims=True), feeds["v"])
    gate = feeds["gate"][..., n:] if tail == "packed" else feeds["gate"]
    src = o.transpose(0, 2, 1, 3) if tail == "transposed" else o
    y = src.reshape(1, 1, n) * _sigmoid(gate)
    if tail == "bias":
        y = y.reshape(1, heads * g, d) + feeds["bias"]
    want = {"y": y}
    if tail == "extra":
        want["o"] = o
    return feeds, want


def _launches(gr) -> list[str]:
    return [la.kernel.name for la in gr._plan.launches]


def _check(ctx, gr, outs, feeds, want, atol: float = 2e-6) -> None:
    got = run(ctx, gr, outs, feeds)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=2e-5, atol=atol, err_msg=name)


@pytest.mark.parametrize("how,launches", [
    ("flash", ["attention_flash", "attention_combine"]),
    ("tile_t32", ["attention_tile", "attention_combine"]),
    ("tile_t32+last", ["attention_tile"]),  # each head's last workgroup combines
    ("flash+last", ["attention_flash"]),
    ("lanes", ["attention_lanes", "attention_combine_rows"]),
])
@pytest.mark.parametrize("tail", ["gate", "packed", "bias"])
def test_the_combine_writes_the_gated_output(ctx_with, how, launches, tail):
    """The attention's two launches and nothing else: the combine writes the group's root
    (the gate's product, a bias added) from its leaves, the output never stored; with
    ``attention_combine`` "last" the tile kernel's last workgroups write it."""
    heads, g, cap, d = 2, 4, 300, 16
    how, _, last = how.partition("+")
    ctx = ctx_with(attention=how, attention_combine=last or None)
    gr, outs = graph(ctx, heads, g, cap, d, tail)
    assert _launches(gr) == launches
    assert all(m.epilogue is not None for m in gr._plan.attention.values())
    _check(ctx, gr, outs, *feeds_and_oracle(heads, g, cap, d, tail))


def test_scalar_output_words(ctx):
    """A head dimension not a multiple of 4: the combine's scalar words, each through the
    epilogue."""
    heads, g, cap, d = 3, 2, 200, 6
    gr, outs = graph(ctx, heads, g, cap, d, "bias")
    assert _launches(gr) == ["attention_flash", "attention_combine"]
    _check(ctx, gr, outs, *feeds_and_oracle(heads, g, cap, d, "bias"))


@pytest.mark.parametrize("tail", ["extra", "transposed"])
def test_the_group_keeps_its_launch_where_the_output_is_read_otherwise(ctx, tail):
    """The output also a graph output, or read at another index (its transpose): the
    combine writes the output and the group is a launch of its own."""
    heads, g, cap, d = 2, 4, 300, 16
    gr, outs = graph(ctx, heads, g, cap, d, tail)
    names = _launches(gr)
    assert names[:2] == ["attention_flash", "attention_combine"] and len(names) >= 3, names
    assert all(m.epilogue is None for m in gr._plan.attention.values())
    _check(ctx, gr, outs, *feeds_and_oracle(heads, g, cap, d, tail))


@pytest.mark.parametrize("how", ["flash1", "lanes1"])
@pytest.mark.parametrize("tail", ["packed", "bias"])
def test_the_one_launch_attention_writes_the_gated_output(ctx_with, how, tail):
    """"flash1" and "lanes1" fold the combine into their one launch: its head's last
    workgroup writes the epilogue (its leaves bound after the counters), one launch in
    all."""
    heads, g, cap, d = 2, 4, 300, 16
    ctx = ctx_with(attention=how)
    gr, outs = graph(ctx, heads, g, cap, d, tail)
    assert _launches(gr) == [f"attention_{how}"]
    _check(ctx, gr, outs, *feeds_and_oracle(heads, g, cap, d, tail))


@pytest.mark.parametrize("engine", ["wgpu", "dawn"])
@pytest.mark.parametrize("vec", [True, False])
def test_the_gated_combines_compile_with_naga_and_tint(engine, vec):
    """The flash and tile combine (16-byte and scalar words, subgroup statistics or not),
    lanes' combine, the one-launch "flash1" and "lanes1" and the 4-bit o product computing
    the combine (``combine_vector``), each writing a packed gate's product at Qwen3.5's
    shapes: both engines' compilers accept them."""
    from wgsl_compilers import compiler_device, rejection

    from backends.webnn.kernels.attention import Epilogue, _combine, combine_vector, flash_decode_one
    from backends.webnn.kernels.attention_lanes import combine_rows, flash_lanes
    from backends.webnn.kernels.fused import FusedOp, Leaf
    from backends.webnn.kernels.quant_rows import gemv_q4_quad

    if compiler_device(engine)[0] is None:
        pytest.skip(compiler_device(engine)[1])
    d = 32 if vec else 6
    n = 4 * d
    ep = Epilogue(
        [FusedOp("slice", {"starts": [0, 0, n], "sizes": [1, 1, n], "strides": [1, 1, 1]},
                 "f32", (1, 1, n), [("leaf", 1)], ["f32"], [(1, 1, 2 * n)]),
         FusedOp("sigmoid", {}, "f32", (1, 1, n), [("op", 0)], ["f32"], [(1, 1, n)]),
         FusedOp("mul", {}, "f32", (1, 1, n), [("leaf", 0), ("op", 1)], ["f32", "f32"],
                 [(1, 1, n), (1, 1, n)])],
        [Leaf("f32", n, True, "ao"), Leaf("f32", 2 * n)])
    kernels = [_combine(4, 5, d, vec, sub, ep) for sub in (None, 32)]
    if vec:
        kernels.append(combine_rows(4, d, 5, ep))
    for k in kernels:
        assert k.bindings == ["read", "rw", "read"] and "ep_v2(" in k.wgsl
        assert rejection(engine, k.wgsl) == "", k.wgsl
    if vec:
        ones = [flash_decode_one(2, 2, 64, d, None, 12288, kv="f16", epilogue=ep)[0],
                flash_lanes(2, 2, 64, d, None, 12288, kv="f16", subgroup=32, fold=True,
                            epilogue=ep)[0][0]]
        for k in ones:
            assert k.bindings[-3:] == ["rw", "rw", "read"] and "ep_v2(" in k.wgsl
            assert rejection(engine, k.wgsl) == "", k.wgsl
        for splits in (5, 33):  # straight-line and in loops
            k = gemv_q4_quad(n, 64, 32, signed=False, zero_points=False, loads=4, subgroup=32,
                             prologue=combine_vector(4, splits, d, ep))
            assert k.bindings[:2] == ["read", "read"] and "ep_v2(" in k.wgsl
            assert rejection(engine, k.wgsl) == "", k.wgsl



@pytest.mark.parametrize("how,splits", [("flash", 3), ("tile_t32", 10)])
@pytest.mark.parametrize("tail", ["gate", "packed"])
def test_the_o_product_computes_combine_and_gate(monkeypatch, how, splits, tail):
    """``attention_combine`` "product" on a GPU plan: the float o product reading the gate's
    product computes the combine and the gate into its workgroup memory
    (``gemv.CombinePrologue`` with the epilogue): the attention's first launch and the
    product, nothing else."""
    from test_pages import _gpu_target

    from backends.webnn import ml
    from backends.webnn.wgpu_impl.options import KernelOptions

    _gpu_target(monkeypatch)
    heads, g, cap, d = 2, 4, 300, 16
    w = RNG.standard_normal((heads * g * d, 24))
    ctx = ml.create_context(options=KernelOptions(attention=how, attention_combine="product"))
    try:
        gr, outs = graph(ctx, heads, g, cap, d, tail, o_weights=w)
        plan = gr._plan
        assert len(plan.combined) == 1, _launches(gr)
        pro = plan.prologue[next(iter(plan.combined.values()))]
        assert pro.epilogue is not None and pro.combine.splits == splits
        assert _launches(gr) == [f"attention_{how.split('_')[0]}", "matmul_gemv"]
        feeds, want = feeds_and_oracle(heads, g, cap, d, tail)
        got = run(ctx, gr, outs, feeds)["y"]
        np.testing.assert_allclose(got, want["y"] @ w, rtol=2e-5, atol=2e-5)
    finally:
        ctx.destroy()
