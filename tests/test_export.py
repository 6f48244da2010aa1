"""The exported graphs compute the reference's function; the standard flavour keeps its contract."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from model import export as E
from model.reference import Reference, causal_conv, gdn_step, l2_normalize, softplus
from model.workload import K_MAJOR, Workload, cache_specs, preset, token_stream

CAPACITY = 16
STEPS = 10
TOL = 1e-4


@pytest.fixture(scope="module")
def tiny():
    return Workload.build(preset("tiny"), seed=3)


@pytest.fixture(scope="module")
def graphs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    return {f: E.export(tiny, f, CAPACITY, root) for f in E.FLAVOURS}


def _load(path):
    return onnx.load(str(path), load_external_data=False)


def test_standard_uses_only_allowed_ops(graphs):
    model = _load(graphs["standard"])
    used = {n.op_type for n in model.graph.node}
    assert used <= E.STANDARD_OPS, used - E.STANDARD_OPS
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [E.OPSET]


def test_standard_shape_operands_are_initializers(graphs):
    g = _load(graphs["standard"]).graph
    inits = {t.name for t in g.initializer}
    operand = {"Reshape": [1], "Expand": [1], "Slice": [1, 2, 3], "ReduceMean": [1],
               "ReduceSum": [1], "ReduceMax": [1], "Unsqueeze": [1], "Squeeze": [1]}
    for n in g.node:
        for j in operand.get(n.op_type, []):
            if j < len(n.input) and n.input[j]:
                assert n.input[j] in inits, (n.name, n.input[j])


def test_standard_static_io_and_pair_names(tiny, graphs):
    g = _load(graphs["standard"]).graph
    specs = cache_specs(tiny.config, CAPACITY)

    def io(values):
        return [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim],
                 v.type.tensor_type.elem_type) for v in values]

    f = TensorProto.FLOAT
    assert io(g.input) == [("input_ids", [1, 1], TensorProto.INT64),
                           ("position_ids", [1, 1], TensorProto.INT64)] + \
        [(s.input, list(s.shape), f) for s in specs]
    assert io(g.output) == [("logits", [1, 1, tiny.config.vocab], f)] + \
        [(s.output, list(s.shape), f) for s in specs]
    assert {s.input for s in specs} >= {"past_key_values.1.key", "past_key_values.1.value",
                                        "past_state.0"}


def test_scatternd_takes_past_and_makes_present(tiny, graphs):
    g = _load(graphs["standard"]).graph
    scatters = [n for n in g.node if n.op_type == "ScatterND"]
    appends = [s for s in cache_specs(tiny.config, CAPACITY) if s.kind == "append"]
    assert len(scatters) == len(appends)
    for s in appends:
        (node,) = [n for n in scatters if n.input[0] == s.input]
        assert node.output[0] == s.output
        # the past has no other reader: the update can happen in place
        assert [n for n in g.node if s.input in n.input] == [node]


def test_ort_flavour_io(tiny, graphs):
    model = _load(graphs["ort"])
    g = model.graph
    ops = {n.op_type for n in g.node}
    # the gated delta layers as genai exports Qwen3.5, in ops ORT's WebGPU EP runs
    assert {"GroupQueryAttention", "LinearAttention", "LinearAttentionGate",
            "CausalConvWithState", "LpNormalization"} <= ops
    assert "GatedDeltaNet" not in ops  # the WebGPU EP leaves it to the CPU EP
    (la,) = [n for n in g.node if n.op_type == "LinearAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in la.attribute}
    cfg = tiny.config
    assert attrs["q_num_heads"] == cfg.gdn_qk_heads and attrs["kv_num_heads"] == cfg.gdn_v_heads
    assert attrs["update_rule"] == b"gated_delta"
    assert la.input[3] == "past_state.0" and la.output[1] == "present_state.0"
    (conv,) = [n for n in g.node if n.op_type == "CausalConvWithState"]
    assert conv.input[3] == "past_conv_state.0" and conv.output[1] == "present_conv_state.0"
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in gqa[0].attribute}
    assert attrs["do_rotary"] == 1 and attrs["rotary_interleaved"] == 0
    names = [v.name for v in g.input]
    assert names[:3] == ["input_ids", "seqlens_k", "total_sequence_length"]
    specs = cache_specs(tiny.config, CAPACITY, K_MAJOR)
    assert names[3:] == [s.input for s in specs]
    inputs = {v.name: v for v in g.input}
    past = inputs["past_key_values.1.key"]
    assert past.type.tensor_type.shape.dim[2].dim_param == E.PAST_LEN
    for s in specs:
        if s.kind == "overwrite":  # LinearAttention's K-major state, genai's conv window
            assert [d.dim_value for d in inputs[s.input].type.tensor_type.shape.dim] == \
                list(s.shape)


def test_standard_conv_window_is_a_concat_and_a_slice(tiny, graphs):
    """The standard flavour's conv pair: the past window is read once, by the Concat with
    the new column; the present is a Slice of that window (the pages pair them by name)."""
    g = _load(graphs["standard"]).graph
    for i in tiny.config.gdn_layers:
        (reader,) = [n for n in g.node if f"past_conv_state.{i}" in n.input]
        (writer,) = [n for n in g.node if f"present_conv_state.{i}" in n.output]
        assert reader.op_type == "Concat" and writer.op_type == "Slice"
        assert writer.input[0] == reader.output[0]


def test_weights_written_once_and_external(tiny, graphs, tmp_path):
    root = graphs["standard"].parent
    data = root / "weights.bin"
    before = data.stat().st_mtime_ns
    other = E.export(tiny, "standard", CAPACITY * 2, root.parent)
    assert other.parent == root and data.stat().st_mtime_ns == before
    model = _load(other)
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert {t.name for t in external} >= {"embed_tokens", "lm_head", "layers.0.q_proj"}
    # the graph file itself stays small: weights are not inlined
    assert other.stat().st_size < data.stat().st_size


def _run_stream(tiny, graphs):
    cfg = tiny.config
    specs = cache_specs(cfg, CAPACITY)
    ref = Reference(cfg, tiny.weights, CAPACITY)
    evaluator = ReferenceEvaluator(str(graphs["standard"]))
    cpu = ["CPUExecutionProvider"]
    std = ort.InferenceSession(str(graphs["standard"]), providers=cpu)
    msft = ort.InferenceSession(str(graphs["ort"]), providers=cpu)
    c_eval = {s.input: np.zeros(s.shape, s.dtype) for s in specs}
    c_std = dict(c_eval)
    c_ort = {s.input: np.zeros([*s.shape[:2], 0, s.shape[3]] if s.kind == "append" else s.shape,
                               s.dtype) for s in cache_specs(cfg, CAPACITY, K_MAJOR)}
    rows = []
    for t, tok in enumerate(token_stream(cfg, STEPS, seed=5)):
        ids = {"input_ids": np.array([[tok]], np.int64)}
        pos = {"position_ids": np.array([[t]], np.int64)}
        lens = {"seqlens_k": np.array([t], np.int32),
                "total_sequence_length": np.array(t + 1, np.int32)}
        expect = ref.step(int(tok))
        o_eval = evaluator.run(None, {**ids, **pos, **c_eval})
        o_std = std.run(None, {**ids, **pos, **c_std})
        o_ort = msft.run(None, {**ids, **lens, **c_ort})
        c_eval, c_std, c_ort = ({s.input: a for s, a in zip(specs, o[1:], strict=True)}
                                for o in (o_eval, o_std, o_ort))
        rows.append((expect, [o[0].reshape(-1) for o in (o_eval, o_std, o_ort)]))
    return rows


def test_all_oracles_agree_over_a_stream(tiny, graphs):
    for expect, got in _run_stream(tiny, graphs):
        scale = np.abs(expect).max()
        for logits in got:
            assert np.abs(logits - expect).max() / scale < TOL
            assert logits.argmax() == expect.argmax()


def test_f16kv_caches_are_float16_and_all_oracles_agree(tmp_path):
    """'+f16kv': the cache inputs and outputs are float16 in both flavours, the standard
    flavour casts new rows to float16 before its ScatterND and the cache to float32 before
    attention; ReferenceEvaluator and ORT (both flavours) match the rounding reference.
    The ORT flavour rounds q, k, v and the RoPE tables too (GroupQueryAttention has one
    type), so its bound is looser."""
    wl = Workload.build(preset("tiny+f16kv"), seed=3)
    graphs = {f: E.export(wl, f, CAPACITY, tmp_path) for f in E.FLAVOURS}
    for flavour, path in graphs.items():
        g = _load(path).graph
        f16 = {v.name for v in [*g.input, *g.output]
               if v.type.tensor_type.elem_type == TensorProto.FLOAT16}
        kv = {n for s in cache_specs(wl.config, CAPACITY) if s.kind == "append"
              for n in (s.input, s.output)}
        assert f16 == kv, flavour
        casts = [n for n in g.node if n.op_type == "Cast"]
        per_layer = {"standard": 4, "ort": 4}[flavour]  # standard: 2 in, 2 out; ort: q/k/v, out
        assert len(casts) == per_layer * len(wl.config.attention_layers), flavour
    for expect, got in _run_stream(wl, graphs):
        scale = np.abs(expect).max()
        for logits, tol in zip(got, (1e-5, 1e-5, 5e-4), strict=True):  # eval, standard, ort
            assert np.abs(logits - expect).max() / scale < tol
            assert logits.argmax() == expect.argmax()


# --- ORT's GatedDeltaNet kernel against reference.gdn_step -----------------------------------


def _gdn_graph(t, hk, hv, dk, dv, capture):
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    vi = helper.make_tensor_value_info
    inputs = [vi("q", f, [t, hk, dk]), vi("k", f, [t, hk, dk]), vi("v", f, [t, hv, dv]),
              vi("a", f, [t, hv]), vi("b", f, [t, hv]), vi("s0", f, [1, hv, dv, dk]),
              vi("a_log", f, [hv]), vi("dt_bias", f, [hv]), vi("count", i32, [1])]
    width = capture * (hv + hk * dk + hv * dv)
    outputs = [vi("o", f, [t, hv, dv]), vi("s1", f, [1, hv, dv, dk]), vi("upd", f, [1, width])]
    node = helper.make_node(
        "GatedDeltaNet", ["q", "k", "v", "", "a", "b", "s0", "a_log", "dt_bias", "count"],
        ["o", "s1", "upd"], domain=E.MS_DOMAIN, gate_activation="softplus",
        beta_activation="sigmoid", qk_l2_norm=1, state_update_capacity=capture)
    model = helper.make_model(
        helper.make_graph([node], "gdn", inputs, outputs),
        opset_imports=[helper.make_opsetid("", E.OPSET), helper.make_opsetid(E.MS_DOMAIN, 1)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


#: measured: ORT 1.32's CPU GatedDeltaNet normalises with x / sqrt(sum(x^2) + 1e-12), not the
#: 1e-6 of FLA / HF Qwen3-Next / `reference.L2_EPS`. For the workload's keys (|k|^2 ~ Dk) the
#: difference is ~1e-8 relative, far inside every tolerance; it shows only for |k|^2 ~ 1e-6.
ORT_L2_EPS = 1e-12


def _l2(x, eps):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


@pytest.mark.parametrize("tiny_norm", [False, True])
def test_ort_gated_delta_net_matches_reference(tiny_norm):
    """Normal vectors: ORT == reference.gdn_step with the reference's own L2 normalisation.

    Vectors with |x|^2 ~ 1e-7 pin the epsilon: there ORT matches eps 1e-12 and not 1e-6.
    """
    t, hk, hv, dk, dv, cap = 5, 2, 4, 16, 8, 8
    rng = np.random.default_rng(11 + tiny_norm)
    q = rng.standard_normal((t, hk, dk)).astype(np.float32)
    k = rng.standard_normal((t, hk, dk)).astype(np.float32)
    if tiny_norm:  # |x|^2 ~ eps: tells eps inside the sqrt from eps outside or a clamp
        q *= np.float32(2e-4)
        k *= np.float32(2e-4)
    v = rng.standard_normal((t, hv, dv)).astype(np.float32)
    a = rng.standard_normal((t, hv)).astype(np.float32)
    b = rng.standard_normal((t, hv)).astype(np.float32)
    s0 = rng.standard_normal((1, hv, dv, dk)).astype(np.float32)
    a_log = np.log(rng.uniform(1, 16, hv)).astype(np.float32)
    dt_bias = rng.uniform(-2, 0, hv).astype(np.float32)
    sess = _gdn_graph(t, hk, hv, dk, dv, cap)
    o, s1, upd = sess.run(None, dict(q=q, k=k, v=v, a=a, b=b, s0=s0, a_log=a_log,
                                     dt_bias=dt_bias, count=np.array([t], np.int32)))

    f64 = np.float64
    g = -np.exp(a_log.astype(f64)) * softplus(a.astype(f64) + dt_bias)
    beta = 1 / (1 + np.exp(-b.astype(f64)))
    if tiny_norm:
        qn, kn = _l2(q.astype(f64), ORT_L2_EPS), _l2(k.astype(f64), ORT_L2_EPS)
        assert not np.allclose(kn, l2_normalize(k.astype(f64)), rtol=1e-2)
    else:
        qn, kn = l2_normalize(q.astype(f64)), l2_normalize(k.astype(f64))
    s = s0[0].astype(f64)
    outs = []
    for j in range(t):
        out, s = gdn_step(s, qn[j], kn[j], v[j].astype(f64), g[j], beta[j], 1 / np.sqrt(dk))
        outs.append(out)
    np.testing.assert_allclose(o, np.stack(outs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s1[0], s, rtol=1e-4, atol=1e-4)

    # compact state update: struct of arrays decay [C, Hv], key [C, Hk, Dk], delta [C, Hv, Dv]
    row = upd[0].astype(f64)
    decay = row[:cap * hv].reshape(cap, hv)
    keys = row[cap * hv:cap * (hv + hk * dk)].reshape(cap, hk, dk)
    delta = row[cap * (hv + hk * dk):].reshape(cap, hv, dv)
    rep = hv // hk
    replay = s0[0].astype(f64)
    for j in range(t):
        replay *= decay[j][:, None, None]
        replay += delta[j][:, :, None] * np.repeat(keys[j], rep, axis=0)[:, None, :]
    np.testing.assert_allclose(np.exp(g), decay[:t], rtol=1e-5)
    np.testing.assert_allclose(kn, keys[:t], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(replay, s1[0], rtol=1e-4, atol=1e-4)


# --- the ORT flavour's gated delta ops against the reference ------------------------------


def _ms_session(nodes, inputs, outputs):
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    model = helper.make_model(
        helper.make_graph(nodes, "g", [vi(n, f, list(sh)) for n, sh in inputs],
                          [vi(n, f, None) for n in outputs]),
        opset_imports=[helper.make_opsetid("", E.OPSET), helper.make_opsetid(E.MS_DOMAIN, 1)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_ort_linear_attention_matches_reference():
    """The ORT flavour's LinearAttentionGate + LinearAttention, token by token, equal
    reference.gdn_step: q with the qk heads, k with the qk heads too (read per q head:
    value head h uses qk head h // (Hv/Hk), as the reference), the K-major state the
    V-major one transposed. Dk != Dv, so a swapped layout cannot pass."""
    t, hk, hv, dk, dv = 4, 2, 6, 8, 5
    rng = np.random.default_rng(31)
    q = l2_normalize(rng.standard_normal((t, hk, dk))).astype(np.float32)
    k = l2_normalize(rng.standard_normal((t, hk, dk))).astype(np.float32)
    v = rng.standard_normal((t, hv, dv)).astype(np.float32)
    a, b = (rng.standard_normal((t, hv)).astype(np.float32) for _ in range(2))
    a_log = np.log(rng.uniform(1, 16, hv)).astype(np.float32)
    dt_bias = rng.uniform(-2, 0, hv).astype(np.float32)
    s0 = rng.standard_normal((1, hv, dv, dk)).astype(np.float32)
    nodes = [
        helper.make_node("LinearAttentionGate", ["a", "dt_bias", "scale", "b"], ["g", "beta"],
                         domain=E.MS_DOMAIN),
        helper.make_node("LinearAttention", ["q", "k", "v", "s", "g", "beta"], ["o", "s1"],
                         domain=E.MS_DOMAIN, q_num_heads=hk, kv_num_heads=hv,
                         update_rule="gated_delta", scale=float(1 / np.sqrt(dk)))]
    sess = _ms_session(nodes, [("q", (1, 1, hk * dk)), ("k", (1, 1, hk * dk)),
                               ("v", (1, 1, hv * dv)), ("s", (1, hv, dk, dv)),
                               ("a", (1, 1, hv)), ("b", (1, 1, hv)), ("dt_bias", (hv,)),
                               ("scale", (hv,))], ["o", "s1"])
    state = s0.transpose(0, 1, 3, 2)  # K-major
    want = s0[0].astype(np.float64)
    for j in range(t):
        o, state = sess.run(None, {"q": q[j].reshape(1, 1, -1), "k": k[j].reshape(1, 1, -1),
                                   "v": v[j].reshape(1, 1, -1), "s": state,
                                   "a": a[j].reshape(1, 1, -1), "b": b[j].reshape(1, 1, -1),
                                   "dt_bias": dt_bias, "scale": -np.exp(a_log)})
        g = -np.exp(a_log.astype(np.float64)) * softplus(a[j].astype(np.float64) + dt_bias)
        beta = 1 / (1 + np.exp(-b[j].astype(np.float64)))
        out, want = gdn_step(want, q[j].astype(np.float64), k[j].astype(np.float64),
                             v[j].astype(np.float64), g, beta, 1 / np.sqrt(dk))
        np.testing.assert_allclose(o.reshape(hv, dv), out, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(state[0].transpose(0, 2, 1), want, rtol=1e-4, atol=1e-5)


def test_ort_causal_conv_with_state_matches_reference():
    """CausalConvWithState (SiLU fused), one column at a time, on genai's (1, C, K-1)
    window with the stored (C, K) taps read as (C, 1, K): reference.causal_conv's output
    and window at every step, from a random window."""
    c, k, t = 7, 4, 6
    rng = np.random.default_rng(32)
    x = rng.standard_normal((t, c)).astype(np.float32)
    taps = rng.standard_normal((c, k)).astype(np.float32)
    window = rng.standard_normal((1, c, k - 1)).astype(np.float32)
    node = helper.make_node("CausalConvWithState", ["x", "w", "", "p"], ["y", "p1"],
                            domain=E.MS_DOMAIN, activation="silu")
    sess = _ms_session([node], [("x", (1, c, 1)), ("w", (c, 1, k)), ("p", (1, c, k - 1))],
                       ["y", "p1"])
    want = window[0].astype(np.float64)
    for j in range(t):
        y, window = sess.run(None, {"x": x[j].reshape(1, c, 1), "w": taps.reshape(c, 1, k),
                                    "p": window})
        out, want = causal_conv(want, x[j:j + 1].astype(np.float64), taps.astype(np.float64))
        np.testing.assert_allclose(y.reshape(c), out[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(window[0], want, rtol=1e-6)


def test_a_graph_cached_by_another_exporter_is_written_again(tiny, tmp_path):
    """A cached graph is found by its name (the workload's), so the exporter's digest beside
    it decides reuse: one written by other exporter code is exported again, the weights kept."""
    path = E.export(tiny, E.STANDARD, 16, tmp_path)
    stamp = path.with_name(path.name + ".exporter")
    assert stamp.read_text() == E.exporter_digest()
    weights = sorted(p for p in path.parent.iterdir() if p.suffix in (".bin", ".f32"))
    assert weights
    mtimes = [p.stat().st_mtime_ns for p in weights]
    onnx.save(helper.make_model(helper.make_graph([], "stale", [], [])), str(path))
    stamp.write_text("0" * 16)  # the stale graph, sealed as another exporter's
    from model import checksum
    checksum.seal(path)
    again = E.export(tiny, E.STANDARD, 16, tmp_path)
    assert again == path and len(onnx.load(str(path), load_external_data=False).graph.node) > 0
    assert stamp.read_text() == E.exporter_digest()
    assert [p.stat().st_mtime_ns for p in weights] == mtimes
    # the same exporter's graph is reused as it is
    before = path.stat().st_mtime_ns
    E.export(tiny, E.STANDARD, 16, tmp_path)
    assert path.stat().st_mtime_ns == before
