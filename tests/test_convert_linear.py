"""ORT's linear-attention contrib ops (convert_linear.py), each alone and together in a
small hybrid decoder step (stateful and not), against ORT's CPU EP on graphs made with
onnx.helper, fresh random inputs, float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.utils import Extractor
from test_convert_ops import check, f32, ort_model
from test_onnx_converter import compare, context, run_graph  # noqa: F401  (the fixture)

from backends.pages import StatelessCopy
from backends.webnn.dims import pin
from backends.webnn.onnx_converter import ConversionError, convert, list_kv_pairs
from backends.webnn.wgpu_impl.options import GDN_COL_ROWS

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

rng = np.random.default_rng(3535)
MS = "com.microsoft"


def node(op, ins, outs, **attrs):
    return helper.make_node(op, list(ins), list(outs), domain=MS, **attrs)


def _gates(t: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """A log-space decay (negative) and an update rate in (0, 1)."""
    return (-rng.random((1, t, width)).astype(np.float32) - 0.05,
            rng.random((1, t, width)).astype(np.float32))


@pytest.mark.parametrize("rule", ["gated_delta", "delta", "gated", "linear"])
@pytest.mark.parametrize("hq,hk,hkv", [(2, 4, 4), (2, 2, 4), (4, 2, 2), (3, 3, 3)])
@pytest.mark.parametrize("t", [1, 3])
def test_linear_attention(context, rule, hq, hk, hkv, t):  # noqa: F811
    """(2, 2, 4): genai's Qwen3.5 layout, as many key heads as query heads, fewer than the
    value heads."""
    dk, dv = 8, 6
    decay, beta = _gates(t, hkv)
    feeds = {"q": f32(1, t, hq * dk), "k": f32(1, t, hk * dk), "v": f32(1, t, hkv * dv),
             "s": f32(1, hkv, dk, dv) * 0.5}
    ins = ["q", "k", "v", "s", "", ""]
    if rule in ("gated", "gated_delta"):
        feeds["g"], ins[4] = decay, "g"
    if rule in ("delta", "gated_delta"):
        feeds["b"], ins[5] = beta, "b"
    n = node("LinearAttention", ins, ["y", "ns"], q_num_heads=hq, kv_num_heads=hkv,
             update_rule=rule, scale=1.0 if hq < hkv else 0.0)
    check(context, [n], feeds, outputs=("y", "ns"), atol=2e-5, rtol=1e-4)


def test_linear_attention_per_key_decay_and_shared_beta(context):  # noqa: F811
    """Decay per key dimension (B, T, H_kv * d_k), one update rate for all heads (B, T, 1),
    no past state (zeros)."""
    hkv, dk, dv = 2, 4, 5
    decay, _ = _gates(2, hkv * dk)
    _, beta = _gates(2, 1)
    feeds = {"q": f32(1, 2, hkv * dk), "k": f32(1, 2, hkv * dk), "v": f32(1, 2, hkv * dv),
             "g": decay, "b": beta}
    n = node("LinearAttention", ["q", "k", "v", "", "g", "b"], ["y", "ns"], q_num_heads=hkv,
             kv_num_heads=hkv)
    check(context, [n], feeds, outputs=("y", "ns"), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("t,past,bias,act,dil", [(1, True, False, "silu", 1),
                                                 (3, True, True, "none", 1),
                                                 (2, False, True, "silu", 1),
                                                 (1, True, True, "silu", 2)])
def test_causal_conv_with_state(context, t, past, bias, act, dil):  # noqa: F811
    ch, k = 6, 4
    feeds = {"x": f32(1, ch, t)}
    if past:
        feeds["p"] = f32(1, ch, (k - 1) * dil)
    inits = {"w": f32(ch, 1, k)} | ({"bias": f32(ch)} if bias else {})
    n = node("CausalConvWithState", ["x", "w", "bias" if bias else "", "p" if past else ""],
             ["y", "ps"], activation=act, dilation=dil)
    check(context, [n], feeds, inits, outputs=("y", "ps"))


def test_causal_conv_channels_last(context):  # noqa: F811
    ch, k = 5, 3
    n = node("CausalConvWithState", ["x", "w", "", "p"], ["y", "ps"], activation="silu",
             channels_last=1)
    check(context, [n], {"x": f32(1, 2, ch), "p": f32(1, k - 1, ch)}, {"w": f32(ch, 1, k)},
          outputs=("y", "ps"))


def test_linear_attention_gate(context):  # noqa: F811
    h = 4
    n = node("LinearAttentionGate", ["a", "dt", "ds", "b"], ["y", "beta"])
    check(context, [n], {"a": f32(1, 1, h), "b": f32(1, 1, h)},
          {"dt": f32(h), "ds": -np.exp(f32(h))}, outputs=("y", "beta"))


@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_gated_rms_norm(context, act):  # noqa: F811
    n = node("GatedRMSNorm", ["x", "w", "z"], ["y"], activation=act, epsilon=1e-6)
    check(context, [n], {"x": f32(1, 1, 24), "z": f32(1, 1, 24)}, {"w": f32(8)}, atol=1e-5)


def test_float16_tensors_computed_in_float32(context):  # noqa: F811
    """float16 inputs and outputs, float32 arithmetic inside (as ORT's kernels): the four
    ops in one graph against ORT, to float16's resolution."""
    hq, hkv, dk, dv, ch, k = 2, 4, 8, 8, 8, 4
    decay, beta = _gates(1, hkv)
    h = lambda a: np.asarray(a, np.float16)  # noqa: E731
    feeds = {"q": h(f32(1, 1, hq * dk)), "k": h(f32(1, 1, hq * dk)), "v": h(f32(1, 1, hkv * dv)),
             "s": h(f32(1, hkv, dk, dv) * 0.5), "a": h(f32(1, 1, hkv)), "bb": h(f32(1, 1, hkv)),
             "x": h(f32(1, ch, 1)), "p": h(f32(1, ch, k - 1)), "z": h(f32(1, 1, hkv * dv))}
    inits = {"dt": f32(hkv), "ds": -np.exp(f32(hkv)), "w": h(f32(ch, 1, k)), "nw": h(f32(dv))}
    nodes = [node("LinearAttentionGate", ["a", "dt", "ds", "bb"], ["g", "beta"]),
             node("LinearAttention", ["q", "k", "v", "s", "g", "beta"], ["o", "ns"],
                  q_num_heads=hq, kv_num_heads=hkv),
             node("GatedRMSNorm", ["o", "nw", "z"], ["y"], epsilon=1e-6),
             node("CausalConvWithState", ["x", "w", "", "p"], ["cy", "ps"], activation="silu")]
    outs = ("y", "ns", "cy", "ps")
    check(context, nodes, feeds, inits, outputs=outs, rtol=4e-3, atol=4e-3,
          types=dict.fromkeys(outs, np.float16))


def test_unsupported_rule_is_named(context):  # noqa: F811
    feeds = {"q": f32(1, 1, 8), "k": f32(1, 1, 8), "v": f32(1, 1, 8)}
    model, _ = ort_model([node("LinearAttention", ["q", "k", "v"], ["y", "ns"], q_num_heads=1,
                               kv_num_heads=1, update_rule="linear")], feeds,
                         outputs=("y", "ns"))
    model.graph.node[0].attribute[-1].s = b"mamba"
    with pytest.raises(ConversionError, match="update_rule 'mamba'"):
        convert(model, context)


# --- a hybrid decoder step, as genai's Qwen3.5 builder lays one out -------------------------

D, HQ, HKV, DK, DV, K = 32, 2, 4, 8, 8, 4
CONV = 2 * HQ * DK + HKV * DV  # as many key heads as query heads, as genai's Qwen3.5


def _hybrid_step():
    """hidden -> qkv -> causal conv (carried window) -> split -> per-head L2 norm ->
    LinearAttention (inverse grouped heads, scale 1) with LinearAttentionGate's decay and
    rate -> GatedRMSNorm -> output projection."""
    w = {"wqkv": f32(D, CONV) * 0.3, "wa": f32(D, HKV) * 0.3, "wb": f32(D, HKV) * 0.3,
         "wz": f32(D, HKV * DV) * 0.3, "wo": f32(HKV * DV, D) * 0.3, "cw": f32(CONV, 1, K),
         "dt": f32(HKV), "ds": -np.exp(f32(HKV) * 0.5), "nw": f32(DV),
         "sizes": np.array([HQ * DK, HQ * DK, HKV * DV], np.int64),
         "qh": np.array([1, 1, HQ, DK], np.int64), "q3": np.array([1, 1, HQ * DK], np.int64)}
    plain = lambda op, i, o, **a: helper.make_node(op, i, o, **a)  # noqa: E731
    nodes = [
        plain("MatMul", ["x", "wqkv"], ["qkv"]),
        plain("Transpose", ["qkv"], ["qkv_t"], perm=[0, 2, 1]),
        node("CausalConvWithState", ["qkv_t", "cw", "", "past.0.conv"], ["conv", "present.0.conv"],
             activation="silu"),
        plain("Transpose", ["conv"], ["conv_t"], perm=[0, 2, 1]),
        plain("Split", ["conv_t", "sizes"], ["q0", "k0", "v"], axis=-1),
        plain("Reshape", ["q0", "qh"], ["q1"]), plain("LpNormalization", ["q1"], ["q2"], axis=-1),
        plain("Reshape", ["q2", "q3"], ["q"]),
        plain("Reshape", ["k0", "qh"], ["k1"]), plain("LpNormalization", ["k1"], ["k2"], axis=-1),
        plain("Reshape", ["k2", "q3"], ["k"]),
        plain("MatMul", ["x", "wa"], ["a"]), plain("MatMul", ["x", "wb"], ["b"]),
        node("LinearAttentionGate", ["a", "dt", "ds", "b"], ["decay", "beta"]),
        node("LinearAttention", ["q", "k", "v", "past.0.recurrent", "decay", "beta"],
             ["o", "present.0.recurrent"], q_num_heads=HQ, kv_num_heads=HKV, scale=1.0),
        plain("MatMul", ["x", "wz"], ["z"]),
        node("GatedRMSNorm", ["o", "nw", "z"], ["n"], epsilon=1e-6),
        plain("MatMul", ["n", "wo"], ["y"]),
    ]
    feeds = {"x": f32(1, 1, D), "past.0.conv": f32(1, CONV, K - 1),
             "past.0.recurrent": f32(1, HKV, DK, DV) * 0.3}
    return nodes, feeds, w


STEP_OUT = ("y", "present.0.conv", "present.0.recurrent")


def test_hybrid_step(context):  # noqa: F811
    nodes, feeds, w = _hybrid_step()
    check(context, nodes, feeds, w, outputs=STEP_OUT, atol=3e-5, rtol=1e-4)


def _steps_against_ort(ctx, model, steps: int = 4):
    """``steps`` decode steps of a stateful build (the pairs found by genai's names), each
    step's output against ORT's with its presents fed back; the build's launch names."""
    pairs = list_kv_pairs(model)
    assert {(p.input, p.output, p.kind) for p in pairs} == {
        ("past.0.conv", "present.0.conv", "overwrite"),
        ("past.0.recurrent", "present.0.recurrent", "overwrite")}
    cg = convert(model, ctx, use_stateful=True, kv_cache_pairs=pairs)
    assert cg.is_stateful
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x_t = ctx.create_tensor(data_type="float32", shape=[1, 1, D], writable=True)
    y_t = ctx.create_tensor(data_type="float32", shape=[1, 1, D], readable=True)
    state = {"past.0.conv": np.zeros((1, CONV, K - 1), np.float32),
             "past.0.recurrent": np.zeros((1, HKV, DK, DV), np.float32)}
    ctx.reset_kv_cache(cg.graph)
    for _ in range(steps):
        x = f32(1, 1, D)
        y, conv, rec = sess.run(list(STEP_OUT), {"x": x} | state)
        state = {"past.0.conv": conv, "past.0.recurrent": rec}
        ctx.write_tensor(x_t, x)
        ctx.dispatch(cg.graph, {"x": x_t}, {"y": y_t})
        # to the output's scale: the gated RMS norm of a head whose q and k are nearly
        # orthogonal (a small output) magnifies float32 rounding; the generic ops and the
        # fused kernel differ from ORT alike there
        np.testing.assert_allclose(ctx.read_tensor(y_t).reshape(y.shape), y, rtol=1e-4,
                                   atol=3e-4 * float(np.abs(y).max()))
    return [la.kernel.name for la in cg.graph._plan.launches if hasattr(la, "kernel")]


def test_hybrid_steps_stateful(context):  # noqa: F811
    """Four decode steps with the conv window and the recurrent state kept by the graph."""
    nodes, feeds, w = _hybrid_step()
    _steps_against_ort(context, ort_model(nodes, feeds, w, STEP_OUT)[0])


@pytest.mark.parametrize("variant", ["fused", "fused_norms", "fused8", "fused_cols",
                                     "fused_norms_cols"])
@pytest.mark.parametrize("stateful", [False, True])
def test_hybrid_step_fuses_linear_attention(ctx_with, variant, stateful):
    """LinearAttention's recurrence over its K-major state (genai's key heads broadcast over
    the value heads, scale 1) is matched into the one-launch gated delta kernel (the state
    updated in place when stateful), and the steps still match ORT; "_cols": the state read
    a column a lane (``kernels/gdn.gated_delta``'s ``cols``)."""
    ctx = ctx_with(gdn=variant)
    nodes, feeds, w = _hybrid_step()
    model, expected = ort_model(nodes, feeds, w, STEP_OUT)
    if stateful:
        launches = _steps_against_ort(ctx, model)
    else:
        launches = [la.kernel.name for la in convert(model, ctx).graph._plan.launches
                    if hasattr(la, "kernel")]
        got = run_graph(ctx, model, feeds)
        for name, want in zip(STEP_OUT, expected, strict=True):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=3e-5, err_msg=name)
    assert launches.count("gated_delta") == 1, launches
    assert "matmul" not in launches, launches  # the retrieval and output products absorbed
    if variant.endswith("_cols") and not stateful:
        (k,) = [la.kernel for la in convert(model, ctx).graph._plan.launches
                if hasattr(la, "kernel") and la.kernel.name == "gated_delta"]
        assert f"let r = lid % {GDN_COL_ROWS}u;" in k.wgsl and "subgroupAdd" not in k.wgsl


@pytest.mark.adapter_feature("subgroup")
def test_plain_gated_delta_subgroup_sums(ctx_with, subgroup_size, monkeypatch):
    """The K-major kernel with its row sums through subgroupAdd (the GPU default where the
    subgroup is as wide as a row's lanes), at the adapter's own width, against ORT."""
    import dataclasses

    width = subgroup_size
    if width is None or width > 32 or width & (width - 1):
        pytest.skip(f"no fixed power-of-two subgroup width to test with ({width})")
    ctx = ctx_with(gdn=f"fused{width}")
    monkeypatch.setattr(ctx, "_target", dataclasses.replace(ctx._target, subgroup=width))
    nodes, feeds, w = _plain_gated_delta(dk=width, dv=6)
    outs = ("y", "present_state")
    model, expected = ort_model(nodes, feeds, w, outs)
    (kernel,) = [la.kernel for la in convert(model, ctx).graph._plan.launches
                 if hasattr(la, "kernel") and la.kernel.name == "gated_delta"]
    assert "subgroupAdd" in kernel.wgsl and "workgroupBarrier" not in kernel.wgsl
    compare(run_graph(ctx, model, feeds), outs, expected, 1e-4, 2e-5)


MODELS = Path(__file__).parent / "models"  # the real exports (scripts/make_test_models.py)
GENAI_QWEN35 = MODELS / "genai-qwen35" / "model.onnx"
TRANSFORMERS_QWEN35 = MODELS / "transformers-qwen35" / "decode.onnx"


def _against_ort(ctx, model, feeds: dict, outs: list[str]) -> list[str]:
    """``model`` on ``ctx`` against ORT's CPU EP on the same feeds; its launch names."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compare(run_graph(ctx, model, feeds), outs, sess.run(outs, feeds), 1e-4, 1e-5)
    return [la.kernel.name for la in convert(model, ctx).graph._plan.launches
            if hasattr(la, "kernel")]


def _random_feeds(model) -> dict[str, np.ndarray]:
    return {vi.name: f32(*[d.dim_value for d in vi.type.tensor_type.shape.dim])
            for vi in model.graph.input}


@pytest.mark.skipif(not GENAI_QWEN35.exists(), reason="no genai Qwen3.5 export in tests/models")
@pytest.mark.parametrize("t,variant", [(1, "generic"), (2, "generic"), (1, "fused"),
                                       (1, "fused_cols")])
def test_genai_qwen35_linear_attention_block(ctx_with, t, variant):
    """The real export's first gated-delta block (conv, split, L2 norms, gate, linear
    attention, gated norm), cut out of genai's graph, against ORT on the same cut; one
    token on the fused kernel is one gated delta launch."""
    model = onnx.shape_inference.infer_shapes(onnx.load(GENAI_QWEN35))
    la = "/model/layers.0/linear_attn/"
    ins = [la + "qkv_proj/Transpose/output_0", la + "a_proj/MatMul/output_0",
           la + "b_proj/MatMul/output_0", la + "z_proj/MatMul/output_0", "past.0.conv",
           "past.0.recurrent"]
    outs = [la + "GatedRMSNorm/output_0", "present.0.conv", "present.0.recurrent"]
    cut = pin(Extractor(model).extract_model(ins, outs), {"batch_size": 1, "sequence_length": t})
    assert {"LinearAttention", "CausalConvWithState", "LinearAttentionGate",
            "GatedRMSNorm"} <= {n.op_type for n in cut.graph.node}
    launches = _against_ort(ctx_with(gdn=variant), cut, _random_feeds(cut), outs)
    assert launches.count("gated_delta") == variant.startswith("fused"), launches


@pytest.mark.skipif(not TRANSFORMERS_QWEN35.exists(),
                    reason="no transformers Qwen3.5 export in tests/models")
@pytest.mark.parametrize("variant", ["generic", "fused"])
def test_transformers_qwen35_decode_step(ctx_with, variant):
    """transformers' own Qwen3.5 export (plain ops: Conv, Tile, ScatterElements, Split, the
    torch recurrence), dims pinned by hand (conv window 4, 8 cached rows), one decode step
    against ORT: logits and every present; fused, both gated-delta layers are one launch
    each."""
    model = onnx.load(TRANSFORMERS_QWEN35)
    dims = {d.dim_param: int(d.dim_param) for vi in [*model.graph.input, *model.graph.output]
            for d in vi.type.tensor_type.shape.dim if d.dim_param.isdigit()}
    conv = {d.dim_param for vi in model.graph.input if "conv_states" in vi.name
            for d in vi.type.tensor_type.shape.dim[2:]}
    past = {d.dim_param for vi in model.graph.input if vi.name.endswith(".keys")
            for d in vi.type.tensor_type.shape.dim[2:3]}
    dims |= dict.fromkeys(conv, 4) | dict.fromkeys(past, 8) | {f"{p} + 1": 9 for p in past}
    model = pin(model, dims)
    feeds = _random_feeds(model)
    feeds["input_ids"] = np.array([[17]], np.int64)
    feeds["position_ids"] = np.array([[8]], np.int64)
    launches = _against_ort(ctx_with(gdn=variant), model, feeds,
                            [o.name for o in model.graph.output])
    assert launches.count("gated_delta") == (2 if variant == "fused" else 0), launches


# --- transformers' plain-ops gated delta step (torch_recurrent_gated_delta_rule, one token) --

def _plain_gated_delta(hk: int = 2, hv: int = 4, dk: int = 8, dv: int = 8):
    """The decode step as transformers' Qwen3.5 writes it in torch, in the ONNX ops its
    exporter emits: q and k repeated per value head, L2-normalised (x * rsqrt(sum x² +
    eps)), q scaled; the K-major state decayed, the retrieval and the output as Mul +
    ReduceSum over d_k."""
    r = hv // hk
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    w = {"rep": i64(1, 1, hk, r, dk), "flat": i64(1, 1, hv, dk), "ax3": i64(3), "ax1": i64(1),
         "axm1": i64(-1), "axm2": i64(-2), "idx0": np.array(0, np.int64),
         "eps": np.array(1e-6, np.float32),
         "sc": np.array(dk ** -0.5, np.float32)}
    p = lambda op, i, o, **a: helper.make_node(op, i, o, **a)  # noqa: E731
    nodes = []
    for x in ("q", "k"):
        nodes += [p("Unsqueeze", [x, "ax3"], [x + "u"]), p("Expand", [x + "u", "rep"], [x + "e"]),
                  p("Reshape", [x + "e", "flat"], [x + "r"]),
                  p("Transpose", [x + "r"], [x + "t"], perm=[0, 2, 1, 3]),
                  p("Mul", [x + "t", x + "t"], [x + "sq"]),
                  p("ReduceSum", [x + "sq", "axm1"], [x + "ss"], keepdims=1),
                  p("Add", [x + "ss", "eps"], [x + "se"]), p("Sqrt", [x + "se"], [x + "rt"]),
                  p("Reciprocal", [x + "rt"], [x + "in"]), p("Mul", [x + "t", x + "in"], [x + "n"]),
                  p("Gather", [x + "n", "idx0"], [x + "0"], axis=2)]  # (1, hv, dk)
    nodes += [p("Mul", ["q0", "sc"], ["qs"]),
              p("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
              p("Gather", ["vt", "idx0"], ["v0"], axis=2),  # (1, hv, dv)
              p("Transpose", ["g"], ["gt"], perm=[0, 2, 1]), p("Gather", ["gt", "idx0"], ["g0"], axis=2),
              p("Exp", ["g0"], ["ge"]), p("Unsqueeze", ["ge", "axm1"], ["ge1"]),
              p("Unsqueeze", ["ge1", "axm1"], ["ge2"]),
              p("Mul", ["past_state", "ge2"], ["s"]),
              p("Transpose", ["b"], ["bt"], perm=[0, 2, 1]), p("Gather", ["bt", "idx0"], ["b0"], axis=2),
              p("Unsqueeze", ["b0", "axm1"], ["b1"]),
              p("Unsqueeze", ["k0", "axm1"], ["kc"]),
              p("Mul", ["s", "kc"], ["sk"]), p("ReduceSum", ["sk", "axm2"], ["mem"], keepdims=0),
              p("Sub", ["v0", "mem"], ["dd"]), p("Mul", ["dd", "b1"], ["delta"]),
              p("Unsqueeze", ["delta", "axm2"], ["dr"]), p("Mul", ["kc", "dr"], ["u"]),
              p("Add", ["s", "u"], ["present_state"]),
              p("Unsqueeze", ["qs", "axm1"], ["qc"]), p("Mul", ["present_state", "qc"], ["nq"]),
              p("ReduceSum", ["nq", "axm2"], ["o"], keepdims=0),
              p("Unsqueeze", ["o", "ax1"], ["y"])]
    feeds = {"q": f32(1, 1, hk, dk), "k": f32(1, 1, hk, dk), "v": f32(1, 1, hv, dv),
             "g": -rng.random((1, 1, hv)).astype(np.float32), "b": rng.random((1, 1, hv)).astype(np.float32),
             "past_state": f32(1, hv, dk, dv) * 0.3}
    return nodes, feeds, w


@pytest.mark.parametrize("hv,dk,dv,rows", [(3, 12, 6, 32), (5, 4, 40, 32), (1, 20, 3, 32),
                                           (3, 12, 6, 16), (2, 30, 10, 64), (1, 9, 5, 256)])
def test_k_major_cols_ragged_shapes(ctx_with, hv, dk, dv, rows):
    """The K-major column layout (``rows`` a workgroup, "fused_colsROWS") where a
    workgroup's rows span heads and run past the last (hv · dv not a multiple of them) and
    dk is not a multiple of the shares (256 / rows; at 256 rows one share): the step
    against ORT."""
    ctx = ctx_with(gdn=f"fused_cols{rows}")
    nodes, feeds, w = _plain_gated_delta(hk=1, hv=hv, dk=dk, dv=dv)
    outs = ("y", "present_state")
    model, expected = ort_model(nodes, feeds, w, outs)
    (k,) = [la.kernel for la in convert(model, ctx).graph._plan.launches
            if hasattr(la, "kernel") and la.kernel.name == "gated_delta"]
    assert f"let r = lid % {rows}u;" in k.wgsl
    compare(run_graph(ctx, model, feeds), outs, expected, 1e-4, 2e-5)


@pytest.mark.parametrize("variant", ["generic", "fused", "fused8", "fused_cols"])
def test_plain_gated_delta_step(ctx_with, variant):
    """The torch recurrence's step converts and matches ORT; on the fused kernel its four
    passes over the state (decay, retrieval sum, update, output sum) are one launch, q's
    1/sqrt(d_k) applied to the output; stateful, the state is updated in place over steps
    ("fused_cols": the K-major state a column a lane, its 4 heads × 8 rows in one
    workgroup of 32 rows)."""
    ctx = ctx_with(gdn=variant)
    nodes, feeds, w = _plain_gated_delta()
    outs = ("y", "present_state")
    model, expected = ort_model(nodes, feeds, w, outs)
    launches = [la.kernel.name for la in convert(model, ctx).graph._plan.launches
                if hasattr(la, "kernel")]
    assert launches.count("gated_delta") == (variant != "generic"), launches
    compare(run_graph(ctx, model, feeds), outs, expected, 1e-4, 2e-5)
    pairs = list_kv_pairs(model)
    cg = convert(model, ctx, use_stateful=True, kv_cache_pairs=pairs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    state = np.zeros_like(feeds["past_state"])
    ctx.reset_kv_cache(cg.graph)
    names = [n for n in feeds if n != "past_state"]
    ins = {n: ctx.create_tensor(data_type="float32", shape=list(feeds[n].shape), writable=True)
           for n in names}
    y_t = ctx.create_tensor(data_type="float32", shape=list(expected[0].shape), readable=True)
    for _ in range(3):
        step = {n: feeds[n] + f32(*feeds[n].shape) * 0.1 for n in names}
        step["g"], step["b"] = -np.abs(step["g"]), np.clip(np.abs(step["b"]), 0, 1)
        y, state = sess.run(list(outs), step | {"past_state": state})
        for n in names:
            ctx.write_tensor(ins[n], step[n])
        ctx.dispatch(cg.graph, ins, {"y": y_t})
        np.testing.assert_allclose(ctx.read_tensor(y_t).reshape(y.shape), y, rtol=1e-4,
                                   atol=2e-5)


GENAI_Q4F16_QWEN35 = (Path(__file__).parent / "models-float16" / "genai-q4f16-qwen35-small"
                      / "model.onnx")


@pytest.mark.skipif(not GENAI_Q4F16_QWEN35.exists(), reason="no genai q4f16 Qwen3.5 export")
@pytest.mark.parametrize("variant", ["generic", "fused", "fused+rows", "fused_cols"])
def test_genai_q4f16_linear_attention_block_float16_state(ctx_with, variant):
    """genai's q4f16 export (`-p int4 -e webgpu`) keeps the recurrent state in float16: the
    converter widens it for the recurrence and narrows the new state, and the fused kernel
    reads and writes the float16 state itself (one gated delta launch, no cast launches of
    the state); q's and k's L2 norms behind their float16 casts (and q's float16 scale)
    are computed in the gated delta launch, q and k read as float16 where they lie in the
    convolution's output (no slice, no norm launch), the GPU's row kernels or not.
    Its first gated-delta block cut out of the graph, four stateful decode steps
    on fresh random float16 inputs, each step's output against ORT's CPU EP (fed back its
    own presents), to float16's resolution."""
    model = onnx.shape_inference.infer_shapes(onnx.load(GENAI_Q4F16_QWEN35))
    la = "/model/layers.0/linear_attn/"
    xs = [la + "qkv_proj/Transpose/output_0", la + "a_proj/MatMul/output_0",
          la + "b_proj/MatMul/output_0", la + "z_proj/MatMul/output_0"]
    y = la + "GatedRMSNorm/output_0"
    cut = pin(Extractor(model).extract_model(xs + ["past.0.conv", "past.0.recurrent"],
                                             [y, "present.0.conv", "present.0.recurrent"]),
              {"batch_size": 1, "sequence_length": 1})
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in cut.graph.input}
    assert all(vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
               for vi in cut.graph.input)
    ctx = (ctx_with(gdn="fused", gemv="rows_sh") if variant == "fused+rows"
           else ctx_with(gdn=variant))
    pairs = list_kv_pairs(cut)
    cg = convert(cut, ctx, use_stateful=True, kv_cache_pairs=pairs)
    assert cg.is_stateful
    launches = [la_.kernel.name for la_ in cg.graph._plan.launches if hasattr(la_, "kernel")]
    if variant != "generic":
        assert launches.count("gated_delta") == 1 and "matmul" not in launches, launches
        # the output's float16 round trip before the gated norm computed by the kernel
        assert "fused:cast+cast" not in launches, launches
    # the conv's new float16 window: the slice of the widened window narrowed in the state
    # writer's one launch (its chain reads no paired input)
    assert "fused:slice+cast" in launches, launches
    assert variant == "generic" or "cast" not in launches, launches
    if variant != "generic":  # q's and k's norms in the step (the gated norm here writes
        # the cut's float16 output, no float32 vector: its reduction keeps its launch)
        assert "fused_vector" not in launches and "reduce_sum" not in launches, launches
        assert "slice" not in launches, launches
    sess = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    ins = {n: ctx.create_tensor(data_type="float16", shape=dims[n], writable=True) for n in xs}
    out_shape = list(cg.outputs[y].shape)
    y_t = ctx.create_tensor(data_type="float16", shape=out_shape, readable=True)
    state = {p: np.zeros(dims[p], np.float16) for p in ("past.0.conv", "past.0.recurrent")}
    ctx.reset_kv_cache(cg.graph)
    for _ in range(4):
        feeds = {n: f32(*dims[n]).astype(np.float16) for n in xs}
        want, conv, rec = sess.run([y, "present.0.conv", "present.0.recurrent"], feeds | state)
        state = {"past.0.conv": conv, "past.0.recurrent": rec}
        for n in xs:
            ctx.write_tensor(ins[n], feeds[n])
        ctx.dispatch(cg.graph, ins, {y: y_t})
        got = np.asarray(ctx.read_tensor(y_t), np.float64).reshape(want.shape)
        np.testing.assert_allclose(got, want.astype(np.float64), rtol=1e-2,
                                   atol=1e-2 * float(np.abs(want).max()))
