"""4-bit weights (``+q4``): the packings against ORT's and ONNX's own kernels, the preset, and
both exported flavours against the float64 reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from model import export as E
from model import quantize as Q
from model.errors import UserError
from model.reference import Reference
from model.workload import Workload, cache_specs, preset, quantised_names, token_stream

CAPACITY = 16
STEPS = 5
TOL = 1e-5


def _weights(rng, k=96, n=40):
    return (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)


def test_quantise_is_symmetric_exact_and_idempotent():
    rng = np.random.default_rng(11)
    w = _weights(rng)
    w[32:64, 3] = 0.0  # an all-zero block
    q, s = Q.quantise(w)
    assert q.dtype == np.int8 and q.min() >= -7 and q.max() <= 7
    assert s.shape == (3, 40) and s[1, 3] == 0
    assert np.array_equal(s.astype(np.float16).astype(np.float32), s)  # float16 values
    d = Q.dequantise(q, s)
    exact = q.astype(np.float64) * np.repeat(s.astype(np.float64), 32, axis=0)
    assert np.array_equal(d.astype(np.float64), exact)  # q·s is exact in float32
    assert np.max(np.abs(d - w)) <= np.max(s) / 2 * 1.001
    q2, s2 = Q.recover(d)
    assert np.array_equal(q2, q) and np.array_equal(s2, s)
    with pytest.raises(ValueError, match="not a 4-bit"):
        Q.recover(w)
    with pytest.raises(ValueError, match="multiple of the block size"):
        Q.quantise(w[:40])


def test_round_trip_in_slabs_is_the_whole(monkeypatch):
    w = _weights(np.random.default_rng(15), 64, 45)
    whole = Q.dequantise(*Q.quantise(w))
    monkeypatch.setattr(Q, "ROUND_TRIP_COLUMNS", 8)
    assert np.array_equal(Q.round_trip(w), whole)


def test_int4_packing_round_trip_and_nibble_order():
    rng = np.random.default_rng(12)
    q = rng.integers(-8, 8, size=37).astype(np.int8)
    packed = Q.pack_int4(q)
    assert packed.size == 19
    assert packed[0] == (int(q[0]) & 0xF) | ((int(q[1]) & 0xF) << 4)  # low nibble first
    assert np.array_equal(Q.unpack_int4(packed, 37), q)


def _run_onnx(nodes, inits, inp, out_shape, evaluator):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     list(inp.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    if evaluator == "reference":
        return ReferenceEvaluator(m).run(None, {"x": inp})[0]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": inp})[0]


def test_matmulnbits_packing_is_what_ort_computes():
    """ORT's own MatMulNBits kernel (float activations) is the oracle for the layout."""
    rng = np.random.default_rng(13)
    k, n = 96, 40
    q, s = Q.quantise(_weights(rng, k, n))
    x = rng.standard_normal((1, k)).astype(np.float32)
    b, sc = Q.pack_matmulnbits(q, s)
    node = helper.make_node("MatMulNBits", ["x", "B", "S"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=32, accuracy_level=0)
    y = _run_onnx([node], [numpy_helper.from_array(b, "B"), numpy_helper.from_array(sc, "S")],
                  x, [1, n], "ort")
    want = x.astype(np.float64) @ Q.dequantise(q, s).astype(np.float64)
    assert np.max(np.abs(y - want)) < TOL * np.max(np.abs(want))


@pytest.mark.parametrize("evaluator", ["reference", "ort"])
def test_int4_dequantizelinear_packing(evaluator):
    """onnx.reference and ORT read the int4 initializer and block scales as written."""
    rng = np.random.default_rng(14)
    k, n = 64, 10
    q, s = Q.quantise(_weights(rng, k, n))
    qt = TensorProto(name="Q", data_type=TensorProto.INT4, dims=[k, n],
                     raw_data=Q.pack_int4(q).tobytes())
    nodes = [helper.make_node("DequantizeLinear", ["Q", "S"], ["W"], axis=0, block_size=32),
             helper.make_node("MatMul", ["x", "W"], ["y"])]
    x = rng.standard_normal((1, k)).astype(np.float32)
    y = _run_onnx(nodes, [qt, numpy_helper.from_array(s, "S")], x, [1, n], evaluator)
    want = x.astype(np.float64) @ Q.dequantise(q, s).astype(np.float64)
    assert np.max(np.abs(y - want)) < TOL * np.max(np.abs(want))


def test_q4_preset_composes_and_says_what_is_quantised():
    cfg = preset("tiny+q4+f16kv")
    assert (cfg.weights, cfg.kv_cache) == ("q4", "float16")
    names = quantised_names(cfg)
    assert "embed_tokens" not in names and "lm_head" in names
    assert {"layers.0.a_proj", "layers.1.q_proj", "layers.1.down_proj"} <= set(names)
    assert cfg.describe()["quantised"]["tensors"] == names
    with pytest.raises(UserError, match="unknown preset"):
        preset("tiny+q4+f16")
    wl = Workload.build(preset("tiny+q4"), seed=3)
    for n in names:
        Q.recover(wl.weights[n], n)
    assert not np.array_equal(wl.weights["lm_head"], wl.weights["embed_tokens"].T)
    # the head is its own 4-bit tensor, so a step gathers one embedding row, not the table
    one_row = wl.weights["embed_tokens"].shape[1]
    plain = one_row + sum(
        w.size for n, w in wl.weights.items() if n not in names and n != "embed_tokens")
    q4 = sum(wl.weights[n].size for n in names)
    assert wl.weights_bytes == 4 * plain + q4 // 2 + q4 // 32 * 4
    tied = Workload.build(preset("tiny"), seed=3)  # tied: the table is read whole, as the head
    assert tied.weights_bytes == 4 * sum(w.size for w in tied.weights.values())


def test_q4f16_preset_is_q4_with_float16_activations_and_caches():
    """'+q4f16': the '+q4' tensors quantised, float16 activations and KV caches, the float
    weights float16 values (2 bytes a parameter in the floor), one weight format a name;
    ``describe()`` says the activations' type."""
    cfg = preset("tiny+q4f16")
    assert (cfg.weights, cfg.kv_cache, cfg.dtype) == ("q4", "float16", "float16")
    assert quantised_names(cfg) == quantised_names(preset("tiny+q4"))
    assert cfg.describe()["activations"] == "float16"
    assert preset("tiny+q4").describe()["activations"] == "float32"
    for bad in ("tiny+q4f16+q4", "tiny+q4f16+f16", "tiny+q4f16+q4f16"):
        with pytest.raises(UserError, match="unknown preset"):
            preset(bad)
    wl = Workload.build(cfg, seed=3)
    for n, w in wl.weights.items():
        if n not in quantised_names(cfg):
            assert np.array_equal(w.astype(np.float16).astype(np.float32), w), n
    q4 = Workload.build(preset("tiny+q4"), seed=3)
    plain = sum(w.size for n, w in q4.weights.items() if n not in quantised_names(cfg))
    plain += cfg.hidden - q4.weights["embed_tokens"].size  # a step gathers one row
    assert q4.weights_bytes - wl.weights_bytes == 2 * plain


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory):
    wl = Workload.build(preset("tiny+q4"), seed=3)
    root = tmp_path_factory.mktemp("q4")
    return wl, {f: E.export(wl, f, CAPACITY, root) for f in E.FLAVOURS}


def test_graphs_hold_4bit_weights(tiny_q4):
    wl, graphs = tiny_q4
    names = set(quantised_names(wl.config))
    ort_g = onnx.load(str(graphs[E.ORT]), load_external_data=False).graph
    nbits = [n for n in ort_g.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == len(names)
    for n in nbits:
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        assert (a["bits"], a["block_size"], a["accuracy_level"]) == (4, 32, 4)
    std = onnx.load(str(graphs[E.STANDARD]), load_external_data=False).graph
    dq = [n for n in std.node if n.op_type == "DequantizeLinear"]
    assert len(dq) == len(names)
    int4 = {t.name for t in std.initializer if t.data_type == TensorProto.INT4}
    assert int4 == {n + ".q4" for n in names}
    floats = {t.name for t in std.initializer if t.data_type == TensorProto.FLOAT}
    assert not floats & names and "embed_tokens" in floats
    assert {n.op_type for n in std.node} <= E.STANDARD_OPS  # what the WebNN converter takes


def _levels(graph: onnx.GraphProto) -> list[int]:
    return [a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name == "accuracy_level"]


def test_level0_graph_is_the_export_at_level_0(tiny_q4):
    """``accuracy_level=0`` is a file of its own that differs from the exported graph in
    MatMulNBits' level only; a graph without MatMulNBits is the same file at every level."""
    wl, graphs = tiny_q4
    root = graphs[E.ORT].parents[1]  # the cache directory
    path = E.export(wl, E.ORT, CAPACITY, root, accuracy_level=0)
    assert path == graphs[E.ORT].with_name(f"ort-c{CAPACITY}-acc0.onnx")
    level0 = onnx.load(str(path), load_external_data=False)
    exported = onnx.load(str(graphs[E.ORT]), load_external_data=False)
    assert set(_levels(level0.graph)) == {0} and set(_levels(exported.graph)) == {4}
    for n in exported.graph.node:
        for a in n.attribute:
            if n.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = 0
    assert exported.SerializeToString() == level0.SerializeToString()
    assert E.export(wl, E.ORT, CAPACITY, root, accuracy_level=4) == graphs[E.ORT]
    assert E.export(wl, E.STANDARD, CAPACITY, root, accuracy_level=0) == graphs[E.STANDARD]
    tiny = Workload.build(preset("tiny"), seed=3)
    assert (E.export(tiny, E.ORT, CAPACITY, root, accuracy_level=0)
            == E.graph_path(tiny, E.ORT, CAPACITY, root))
    with pytest.raises(ValueError, match="accuracy_level 5"):
        E.export(wl, E.ORT, CAPACITY, root, accuracy_level=5)


def _decode(wl, path, flavour, run):
    """Max relative logits error of STEPS decode steps against the float64 reference."""
    ref = Reference(wl.config, wl.weights, CAPACITY)
    specs = cache_specs(wl.config, CAPACITY)
    state = {}
    for s in specs:
        shape = list(s.shape)
        if flavour == E.ORT and s.kind == "append":
            shape[2] = 0
        state[s.input] = np.zeros(shape, s.dtype)
    worst = 0.0
    for t, tok in enumerate(token_stream(wl.config, STEPS, seed=5)):
        feeds = {"input_ids": np.array([[tok]], np.int64), **state}
        if flavour == E.STANDARD:
            feeds["position_ids"] = np.array([[t]], np.int64)
        else:
            feeds["seqlens_k"] = np.array([t], np.int32)
            feeds["total_sequence_length"] = np.array(t + 1, np.int32)
        outs = run(feeds)
        want = ref.step(int(tok))
        worst = max(worst, float(np.max(np.abs(outs[0].reshape(-1) - want))
                                 / np.max(np.abs(want))))
        state = {s.input: o for s, o in zip(specs, outs[1:], strict=True)}
    return worst


@pytest.mark.parametrize("flavour", E.FLAVOURS)
def test_flavours_through_ort_cpu_match_the_reference(tiny_q4, flavour):
    wl, graphs = tiny_q4
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    level0 = E.export(wl, flavour, CAPACITY, graphs[flavour].parents[1],
                      accuracy_level=E.FLOAT_ACCURACY_LEVEL)  # what the CPU EP backends run
    sess = ort.InferenceSession(str(level0), so, providers=["CPUExecutionProvider"])
    assert _decode(wl, graphs[flavour], flavour, lambda f: sess.run(None, f)) < TOL


def test_standard_flavour_through_onnx_reference(tiny_q4):
    wl, graphs = tiny_q4
    ev = ReferenceEvaluator(str(graphs[E.STANDARD]))
    assert _decode(wl, graphs[E.STANDARD], E.STANDARD, lambda f: ev.run(None, f)) < TOL


def test_ort_kernel_bytes_count_int4_at_half_a_byte(tiny_q4):
    from backends.ort import _KernelBytes

    wl, graphs = tiny_q4
    kb = _KernelBytes(graphs[E.STANDARD], shared=False)
    k, n = wl.weights["layers.1.q_proj"].shape
    assert kb._nbytes("layers.1.q_proj.q4", 0) == k * n // 2
