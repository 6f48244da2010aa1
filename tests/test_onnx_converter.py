"""ONNX -> WebNN converter: each op against onnx.reference, the tiny decoder against the oracle."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from backends.pages import StatelessCopy
from backends.webnn.onnx_converter import ConversionError, convert, list_kv_pairs
from model.errors import UserError
from model.export import export
from model.reference import Reference
from model.workload import Workload, cache_specs, preset, token_stream

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

OPSET = 21
rng = np.random.default_rng(7)


@pytest.fixture(scope="module")
def context():
    from backends.webnn import ml

    ctx = ml.create_context(state_support=True)
    yield ctx
    ctx.destroy()


def _vi(name: str, arr: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)


def _model(nodes, inputs: dict, inits: dict, outputs: list[str], opset: int = OPSET):
    """A graph with the given nodes; output types and shapes come from onnx.reference."""
    def make(out_vis):
        g = helper.make_graph(nodes, "t", [_vi(n, a) for n, a in inputs.items()], out_vis,
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

    probe = make([helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs])
    expected = ReferenceEvaluator(probe).run(None, inputs)
    model = make([_vi(o, np.asarray(e)) for o, e in zip(outputs, expected, strict=True)])
    return model, [np.asarray(e) for e in expected]


def run_graph(context, model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Convert, bind one tensor per input/output, dispatch once, read everything back."""
    cg = convert(model, context)
    ins, outs = {}, {}
    for name, d in cg.inputs.items():
        ins[name] = context.create_tensor(data_type=d.data_type, shape=list(d.shape), writable=True)
        context.write_tensor(ins[name], feeds[name])
    for name, d in cg.outputs.items():
        outs[name] = context.create_tensor(data_type=d.data_type, shape=list(d.shape), readable=True)
    context.dispatch(cg.graph, ins, outs)
    return {n: np.asarray(context.read_tensor(t)).reshape(cg.outputs[n].shape) for n, t in outs.items()}


def check(context, nodes, inputs, inits=None, outputs=("y",), opset=OPSET, atol=1e-5):
    model, expected = _model(nodes, inputs, inits or {}, list(outputs), opset)
    compare(run_graph(context, model, inputs), outputs, expected, 1e-5, atol)


def compare(got: dict[str, np.ndarray], outputs, expected, rtol: float, atol: float) -> None:
    """Each named output against its expected value (bool as WebNN's uint8), shape included."""
    for name, e in zip(outputs, expected, strict=True):
        g = got[name]
        if e.dtype == np.bool_:
            e = e.astype(np.uint8)
        assert g.shape == e.shape, name
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=name)


def f32(*shape, positive=False):
    a = rng.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.1 if positive else a


def i64(*values):
    return np.asarray(values, np.int64)


# --- element-wise ----------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_broadcast(context, op):
    b = f32(4, positive=op == "Div")
    check(context, [helper.make_node(op, ["a", "b"], ["y"])], {"a": f32(2, 3, 4), "b": b})


def test_pow_and_scalar_initializer(context):
    check(context, [helper.make_node("Pow", ["a", "e"], ["y"])], {"a": f32(3, 4, positive=True)},
          {"e": np.array(1.5, np.float32)})


@pytest.mark.parametrize("op", ["Sqrt", "Exp", "Log", "Neg", "Abs", "Sigmoid", "Softplus", "Tanh"])
def test_unary(context, op):
    check(context, [helper.make_node(op, ["x"], ["y"])],
          {"x": f32(2, 5, positive=op in ("Sqrt", "Log"))})


@pytest.mark.parametrize("op", ["LessOrEqual", "Less", "Greater", "GreaterOrEqual", "Equal"])
def test_compare_then_where(context, op):
    nodes = [helper.make_node(op, ["p", "q"], ["c"]), helper.make_node("Where", ["c", "a", "b"], ["y"])]
    p = i64(*range(6)).reshape(1, 6)
    check(context, nodes, {"q": i64(3).reshape(1, 1), "a": f32(2, 6), "b": f32(1, 6)}, {"p": p})


def test_cast_int64_to_float(context):
    check(context, [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
          {"x": i64(0, 5, 1023).reshape(1, 3)})


# --- matrix, normalisation, reductions -------------------------------------------------------

def test_matmul_batched_and_broadcast(context):
    check(context, [helper.make_node("MatMul", ["a", "w"], ["y"])], {"a": f32(2, 3, 8)},
          {"w": f32(8, 5)}, atol=1e-4)


def test_matmul_1d(context):
    nodes = [helper.make_node("MatMul", ["v", "w"], ["y"]), helper.make_node("MatMul", ["w", "u"], ["z"])]
    check(context, nodes, {"v": f32(4), "u": f32(6)}, {"w": f32(4, 6)}, outputs=("y", "z"), atol=1e-4)


def test_matmul_of_reshaped_operand(context):
    """The GDN readout: a (1,2,16) vector reshaped to (1,2,1,16,1), batch-broadcast."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["x5"]),
             helper.make_node("MatMul", ["a", "x5"], ["y"])]
    check(context, nodes, {"a": f32(1, 2, 2, 16, 16), "x": f32(1, 2, 16)},
          {"s": i64(1, 2, 1, 16, 1)}, atol=1e-4)


def test_softmax_axis(context):
    check(context, [helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": f32(2, 3, 4)})


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_axes_input(context, op, keepdims):
    check(context, [helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)],
          {"x": f32(2, 3, 4)}, {"axes": i64(-1, 0)})


# --- data movement ----------------------------------------------------------------------------

def test_reshape_zero_and_minus_one(context):
    check(context, [helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": f32(2, 3, 4)},
          {"s": i64(0, -1)})


def test_transpose(context):
    check(context, [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], {"x": f32(2, 3, 4)})


def test_concat_negative_axis(context):
    check(context, [helper.make_node("Concat", ["a", "b"], ["y"], axis=-1)],
          {"a": f32(2, 3), "b": f32(2, 2)})


def test_slice_negative_and_clamped(context):
    check(context, [helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], {"x": f32(3, 8)},
          {"s": i64(-6, 1), "e": i64(1000, 3), "a": i64(1, 0)})


def test_slice_with_steps(context):
    check(context, [helper.make_node("Slice", ["x", "s", "e", "a", "k"], ["y"])], {"x": f32(3, 9)},
          {"s": i64(1, 0), "e": i64(9, 3), "a": i64(1, 0), "k": i64(3, 2)})


def test_expand_bidirectional(context):
    check(context, [helper.make_node("Expand", ["x", "s"], ["y"])], {"x": f32(3, 1)},
          {"s": i64(2, 1, 4)})


def test_unsqueeze_squeeze(context):
    nodes = [helper.make_node("Unsqueeze", ["x", "a"], ["u"]),
             helper.make_node("Squeeze", ["u", "b"], ["y"])]
    check(context, nodes, {"x": f32(3, 4)}, {"a": i64(0, 3), "b": i64(0)})


def test_gather_runtime_and_negative_constant_indices(context):
    nodes = [helper.make_node("Gather", ["t", "i"], ["y"], axis=0),
             helper.make_node("Gather", ["x", "k"], ["z"], axis=1)]
    check(context, nodes, {"i": i64(3, 0).reshape(1, 2), "x": f32(2, 5)},
          {"t": f32(6, 4), "k": i64(-1, 2)}, outputs=("y", "z"))


def test_scatter_nd_cache_row(context):
    """The cache update of the standard flavour: (0, head, position) tuples, one row each."""
    idx = np.zeros((1, 2, 1, 3), np.int64)
    idx[0, :, 0, 1] = [0, 1]
    idx[0, :, 0, 2] = 5
    check(context, [helper.make_node("ScatterND", ["c", "i", "u"], ["y"])],
          {"c": f32(1, 2, 8, 4), "i": idx, "u": f32(1, 2, 1, 4)})


def test_shape_computation_is_folded(context):
    """Shape -> Gather -> Concat -> Reshape: computed at conversion time, never on the device."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    check(context, nodes, {"x": f32(2, 3, 4)}, {"zero": i64(0), "minus1": i64(-1)})


def test_opset_13_reduce_axes_attribute(context):
    check(context, [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1)],
          {"x": f32(2, 3)}, opset=13)


# --- errors ------------------------------------------------------------------------------------

def test_unsupported_op_is_named(context):
    model, _ = _model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")],
                      {"a": f32(2, 3), "b": f32(3, 2)}, {}, ["y"])
    with pytest.raises(ConversionError, match="Einsum"):
        convert(model, context)


def test_a_page_turns_a_conversion_error_into_one_user_line(tmp_path):
    """The WebNN library raises its own ConversionError; the page (a layer up) reports it
    as the harness's UserError, so the CLI prints one line."""
    from model.workload import Workload, preset

    model, _ = _model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")],
                      {"a": f32(2, 3), "b": f32(3, 2)}, {}, ["y"])
    path = tmp_path / "einsum.onnx"
    onnx.save(model, path)
    page = StatelessCopy(onnx_path=str(path))
    with pytest.raises(UserError, match="Einsum"):
        page.prepare(Workload.build(preset("tiny")), capacity=8)


def test_contrib_op_is_named(context):
    node = helper.make_node("DecoderMaskedMultiHeadAttention", ["a"], ["y"], domain="com.microsoft")
    g = helper.make_graph([node], "t", [_vi("a", f32(2))], [_vi("y", f32(2))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET),
                                                helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(ConversionError, match="com.microsoft::DecoderMaskedMultiHeadAttention"):
        convert(model, context)


def test_dynamic_dimension_is_refused(context):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "t", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(ConversionError, match="batch"):
        convert(model, context)


def test_not_an_onnx_file(tmp_path, context):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all \x00\xff")
    with pytest.raises(ConversionError):
        convert(bad, context)


# --- the decoder -------------------------------------------------------------------------------

TINY = Workload.build(preset("tiny"))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return export(TINY, "standard", 16, tmp_path_factory.mktemp("export"))


def test_ort_flavour_needs_its_dims_pinned_then_converts(tmp_path, context):
    """The ORT flavour's symbolic cache lengths are refused by name; pinned, its contrib ops
    (SkipSimplifiedLayerNormalization, GroupQueryAttention, the linear-attention ops) all
    convert (their results are checked against ORT in test_webnn_growing and the ops'
    own tests)."""
    path = export(TINY, "ort", 16, tmp_path)
    with pytest.raises(ConversionError, match="past_sequence_length"):
        convert(path, context)
    model = onnx.load(path)
    for vi in [*model.graph.input, *model.graph.output]:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = 16  # pin the symbolic lengths
    assert {n.domain for n in model.graph.node} >= {"com.microsoft"}
    assert convert(model, context).outputs


def test_unloaded_external_data_is_a_clear_error(tiny_path, context):
    model = onnx.load(tiny_path, load_external_data=False)
    stored = next(t for t in model.graph.initializer if t.external_data)
    next(e for e in stored.external_data if e.key == "location").value = "missing.bin"
    with pytest.raises(ConversionError, match="external data"):
        convert(model, context)


def test_list_kv_pairs_from_names(tiny_path):
    pairs = [(p.input, p.output) for p in list_kv_pairs(tiny_path)]
    want = [(s.input, s.output) for s in cache_specs(TINY.config, 16)]
    assert pairs == want


def test_list_kv_pairs_needs_the_present(context):
    g = helper.make_graph([helper.make_node("Neg", ["past_key_values.0.key"], ["present.0.value"])], "t",
                          [_vi("past_key_values.0.key", f32(1, 2))], [_vi("present.0.value", f32(1, 2))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(ConversionError, match="present.0.key"):
        list_kv_pairs(model)


def test_tiny_decoder_matches_reference(context, tiny_path):
    """Teacher-forced steps through the converted graph, caches carried on the host."""
    cfg, cap = TINY.config, 16
    cg = convert(tiny_path, context)
    specs = cache_specs(cfg, cap)
    ref = Reference(cfg, TINY.weights, cap)
    ins = {n: context.create_tensor(data_type=d.data_type, shape=list(d.shape), writable=True)
           for n, d in cg.inputs.items()}
    outs = {n: context.create_tensor(data_type=d.data_type, shape=list(d.shape), readable=True)
            for n, d in cg.outputs.items()}
    cache = {s.input: np.zeros(s.shape, np.float32) for s in specs}
    for pos, tok in enumerate(token_stream(cfg, 10)):
        context.write_tensor(ins["input_ids"], np.array([[tok]], np.int64))
        context.write_tensor(ins["position_ids"], np.array([[pos]], np.int64))
        for s in specs:
            context.write_tensor(ins[s.input], cache[s.input])
        context.dispatch(cg.graph, ins, outs)
        logits = np.asarray(context.read_tensor(outs["logits"]), np.float64).reshape(-1)
        for s in specs:
            cache[s.input] = np.asarray(context.read_tensor(outs[s.output])).reshape(s.shape)
        want = ref.step(int(tok))
        assert np.abs(logits - want).max() / np.abs(want).max() < 1e-4, pos
        assert logits.argmax() == want.argmax(), pos


def _nbits_model(k: int, n: int, block: int, zero_points: bool, bias: bool, rows: int,
                 bits: int = 4):
    """One com.microsoft::MatMulNBits on fresh random weights, hand-packed as ORT's
    ContribOperators.md lays them out (B [N, blocks, block * bits / 8], low nibble first)."""
    blocks = -(-k // block)

    def pack(v):  # each row's values, two a byte for 4 bits, the row padded to a byte
        if bits == 8:
            return v.astype(np.uint8)
        v = np.pad(v, [(0, 0), (0, v.shape[1] % 2)])
        return (v[:, 0::2] | (v[:, 1::2] << 4)).astype(np.uint8)

    q = rng.integers(0, 1 << bits, size=(n, blocks * block))
    b_packed = pack(q).reshape(n, blocks, block * bits // 8)
    scales = rng.uniform(0.01, 0.2, size=(n * blocks,)).astype(np.float32)
    inits = [numpy_helper.from_array(b_packed, "B"), numpy_helper.from_array(scales, "S")]
    ins = ["A", "B", "S"]
    if zero_points:
        z = rng.integers(0, 1 << bits, size=(n, blocks))
        inits.append(numpy_helper.from_array(pack(z).reshape(-1), "Z"))
        ins.append("Z")
    if bias:
        inits.append(numpy_helper.from_array(f32(n), "bias"))
        ins += [""] * (5 - len(ins)) + ["bias"]
    node = helper.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block, accuracy_level=0)
    g = helper.make_graph([node], "nbits",
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, rows, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                               helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("k,n,block,zero_points,bias,rows,bits", [
    (64, 40, 32, False, False, 1, 4), (176, 33, 32, True, False, 1, 4),
    (96, 20, 16, True, True, 1, 4), (64, 24, 32, False, True, 3, 4),
    (80, 9, 32, True, False, 1, 4), (80, 12, 32, True, False, 1, 8),
    (64, 10, 16, False, True, 2, 8)])
def test_matmul_nbits_against_ort(context, k, n, block, zero_points, bias, rows, bits):
    """MatMulNBits -> dequantizeLinear(uint4 or uint8) + matmul, against ORT's CPU kernel
    (level 0: float activations); one-row 4-bit products run as the fused 4-bit gemv."""
    import onnxruntime as ort

    model = _nbits_model(k, n, block, zero_points, bias, rows, bits)
    a = f32(1, rows, k)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"A": a})[0]
    cg = convert(model, context)
    t_a = context.create_tensor(data_type="float32", shape=[1, rows, k], writable=True)
    context.write_tensor(t_a, a)
    t_y = context.create_tensor(data_type="float32", shape=[1, rows, n], readable=True)
    context.dispatch(cg.graph, {"A": t_a}, {"y": t_y})
    got = np.asarray(context.read_tensor(t_y)).reshape(want.shape)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    names = [la.kernel.name for la in cg.graph._plan.launches]
    assert any(x.startswith("gemv_q4") for x in names) == (rows == 1 and bits == 4), names


@pytest.mark.parametrize("attrs,inputs,message", [
    ({"bits": 2}, 3, "bits 2 is not supported"),
    ({}, 5, "g_idx"),
    ({}, 4, "float32 zero points are not supported"),
])
def test_matmul_nbits_refusals_are_one_line(context, attrs, inputs, message):
    model = _nbits_model(64, 8, 32, False, False, 1)
    node = model.graph.node[0]
    for key, v in attrs.items():
        next(a for a in node.attribute if a.name == key).i = v
    if inputs == 4:  # zero points of the scales' type (ORT allows them; WebNN's are codes)
        model.graph.initializer.append(numpy_helper.from_array(f32(16), "Zf"))
        node.input.append("Zf")
    if inputs == 5:
        model.graph.initializer.append(numpy_helper.from_array(np.zeros(64, np.int32), "G"))
        node.input.extend(["", "G"])
    with pytest.raises(ConversionError, match=message):
        convert(model, context)


@pytest.mark.parametrize("data_type,zero_points", [("uint8", False), ("uint8", True),
                                                   ("int4", True), ("uint4", False)])
def test_gather_block_quantized_against_ort(context, data_type, zero_points):
    """A 4-bit table's rows (genai's tied int4 embedding) against ORT's CPU kernel, fresh
    random codes, scales and zero points; ids as a runtime input."""
    import onnxruntime as ort

    vocab, hidden, block = 37, 64, 16
    blocks = hidden // block
    lo = -8 if data_type == "int4" else 0
    q = rng.integers(lo, lo + 16, size=(vocab, hidden))
    packed = ((q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    if data_type == "uint8":
        data = numpy_helper.from_array(packed, "D")
    else:
        data = TensorProto(name="D", data_type=getattr(TensorProto, data_type.upper()),
                           dims=[vocab, hidden], raw_data=packed.tobytes())
    scales = rng.uniform(0.01, 0.2, size=(vocab, blocks)).astype(np.float32)
    inits, ins = [data, numpy_helper.from_array(scales, "S")], ["D", "ids", "S"]
    if zero_points:
        z = rng.integers(lo, lo + 16, size=(vocab, blocks))
        zp = ((z[:, 0::2] & 0xF) | ((z[:, 1::2] & 0xF) << 4)).astype(np.uint8)
        inits.append(numpy_helper.from_array(zp, "Z") if data_type == "uint8" else
                     TensorProto(name="Z", data_type=data.data_type, dims=[vocab, blocks],
                                 raw_data=zp.tobytes()))
        ins.append("Z")
    node = helper.make_node("GatherBlockQuantized", ins, ["y"], domain="com.microsoft",
                            bits=4, block_size=block, gather_axis=0, quantize_axis=1)
    g = helper.make_graph([node], "gbq",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, hidden])],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid("com.microsoft", 1)])
    ids = rng.integers(0, vocab, size=(1, 3)).astype(np.int64)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"ids": ids})[0]
    got = run_graph(context, model, {"ids": ids})["y"]
    assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want))


def test_gather_block_quantized_refuses_other_axes_in_one_line(context):
    node = helper.make_node("GatherBlockQuantized", ["D", "ids", "S"], ["y"],
                            domain="com.microsoft", bits=4, block_size=16, gather_axis=1,
                            quantize_axis=0)
    g = helper.make_graph([node], "gbq",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 1])],
                          [numpy_helper.from_array(np.zeros((32, 8), np.uint8), "D"),
                           numpy_helper.from_array(np.ones((2, 16), np.float32), "S")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(ConversionError, match="gather_axis 1, quantize_axis 0 on rank 2 is not"):
        convert(model, context)
