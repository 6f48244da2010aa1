"""`statebench inspect` on small graphs in each exporter's naming scheme (an attention
layer whose cache grows by Concat, a gated-delta-like layer whose recurrent state, and
where the scheme has one its conv window, are overwritten): the JSON checked whole, and
bad files and folders. Also ``list_kv_pairs``' hand-named pairs and refusals, and the
dims pinned for a decode step."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.pages import StatelessCopy
from backends.webnn.dims import default_dims
from backends.webnn.onnx_converter import ConversionError, list_kv_pairs
from tests.test_cli import one_line_error, statebench

H, DH, D, DV, DK, CONV, K = 2, 4, 8, 4, 4, 6, 3  # heads, head dim, hidden, state dims, conv
#: scheme -> (key/value names, past and present dims of the growing axis, state names)
SCHEMES = {
    "optimum": (("past_key_values.0.key", "present.0.key", "past_key_values.0.value",
                 "present.0.value"), ("past_sequence_length", "past_sequence_length + 1"),
                {"recurrent": ("past_state.1", "present_state.1")}),
    "transformers": (("input.cache.layers.0.keys", "output.cache.layers.0.keys",
                      "input.cache.layers.0.values", "output.cache.layers.0.values"),
                     ("cache_length", "cache_length + 1"),
                     {"conv": ("input.cache.layers.1.conv_states.0",
                               "output.cache.layers.1.conv_states.0"),
                      "recurrent": ("input.cache.layers.1.recurrent_states.0",
                                    "output.cache.layers.1.recurrent_states.0")}),
    "genai": (("past_key_values.0.key", "present.0.key", "past_key_values.0.value",
               "present.0.value"), ("past_sequence_length", "total_sequence_length"),
              {"conv": ("past.1.conv", "present.1.conv"),
               "recurrent": ("past.1.recurrent", "present.1.recurrent")}),
}
RULES = {"optimum": ["past_key_values", "past_state"], "transformers": ["input.cache.layers"],
         "genai": ["past_key_values", "past.N"]}


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def scheme_model(scheme: str, key_major: bool = True) -> onnx.ModelProto:
    """x [batch, 1, D] -> attention over a cache grown by Concat, plus a recurrent state
    S' = S * decay + v kᵀ (and a conv window shifted by one column) overwritten in place."""
    (pk, ok_, pv, ov), (past, total), states = SCHEMES[scheme]
    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal(s).astype(np.float32) for n, s in (
        ("wq", (D, H * DH)), ("wk", (D, H * DH)), ("wv", (D, H * DH)), ("wo", (H * DH, D)),
        ("wsk", (D, DK)), ("wsv", (D, DV)), ("wc", (D, CONV)))}
    w.update(shape4=np.array([0, 1, H, DH], np.int64), shape3=np.array([0, 1, H * DH], np.int64),
             decay=np.float32(0.9), one=np.array([1], np.int64), big=np.array([K], np.int64),
             axis2=np.array([2], np.int64), shape_col=np.array([0, CONV, 1], np.int64),
             shape_k=np.array([0, 1, 1, DK], np.int64), shape_v=np.array([0, 1, DV, 1], np.int64))
    n = helper.make_node
    nodes = []
    for x in ("q", "k", "v"):
        nodes += [n("MatMul", ["x", f"w{x}"], [f"{x}2"]), n("Reshape", [f"{x}2", "shape4"], [f"{x}4"]),
                  n("Transpose", [f"{x}4"], [f"{x}h"], perm=[0, 2, 1, 3])]
    nodes += [n("Concat", [pk, "kh"], [ok_], axis=2), n("Concat", [pv, "vh"], [ov], axis=2),
              n("Transpose", [ok_], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["qh", "kt"], ["s"]),
              n("Softmax", ["s"], ["p"], axis=-1), n("MatMul", ["p", ov], ["o"]),
              n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]), n("Reshape", ["ot", "shape3"], ["o3"]),
              n("MatMul", ["o3", "wo"], ["attn"])]
    rs_in, rs_out = states["recurrent"]
    nodes += [n("MatMul", ["x", "wsk"], ["sk"]), n("Reshape", ["sk", "shape_k"], ["sk4"]),
              n("MatMul", ["x", "wsv"], ["sv"]), n("Reshape", ["sv", "shape_v"], ["sv4"]),
              n("Mul", ["sv4", "sk4"], ["outer"]), n("Mul", [rs_in, "decay"], ["kept"]),
              n("Add", ["kept", "outer"], [rs_out]), n("ReduceSum", [rs_out], ["rsum"], keepdims=0)]
    inputs = [_vi("x", ["batch_size", 1, D]), _vi(pk, ["batch_size", H, past, DH]),
              _vi(pv, ["batch_size", H, past, DH])]
    kv_out = [_vi(ok_, ["batch_size", H, total, DH]), _vi(ov, ["batch_size", H, total, DH])]
    state_in = [_vi(rs_in, ["batch_size", 1, DV, DK])]
    state_out = [_vi(rs_out, ["batch_size", 1, DV, DK])]
    if "conv" in states:
        cin, cout = states["conv"]
        nodes += [n("MatMul", ["x", "wc"], ["c"]), n("Reshape", ["c", "shape_col"], ["ccol"]),
                  n("Slice", [cin, "one", "big", "axis2"], ["cshift"]),
                  n("Concat", ["cshift", "ccol"], [cout], axis=2)]
        state_in.insert(0, _vi(cin, ["batch_size", CONV, K]))
        state_out.insert(0, _vi(cout, ["batch_size", CONV, K]))
    nodes.append(n("Add", ["attn", "rsum"], ["logits"]))  # the state's sum, broadcast
    outputs = [_vi("logits", ["batch_size", 1, D])]
    # key-major: every present key, then values, then states (genai's order); otherwise
    # states first, unlike the inputs
    outputs += (kv_out + state_out) if key_major else (state_out + kv_out[::-1])
    g = helper.make_graph(nodes, scheme, inputs + state_in, outputs,
                          [numpy_helper.from_array(np.asarray(a), k) for k, a in w.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def expected(scheme: str, path: str, capacity: int, adapter: bool) -> dict:
    (pk, ok_, pv, ov), (past, total), states = SCHEMES[scheme]
    kv_in = {"type": "float", "shape": ["batch_size", H, past, DH]}
    grows = (f"past+new on axis 2 ({total}: past + one new token (by name))" if "total" in total
             else f"past+new on axis 2 ({total}, new = 1 row)")
    pairs = [{"input": pk, "output": ok_, "kind": "append", "axis": 2, "new": 1, "how": grows},
             {"input": pv, "output": ov, "kind": "append", "axis": 2, "new": 1, "how": grows}]
    ins = [{"name": "x", "type": "float", "shape": ["batch_size", 1, D]},
           {"name": pk, **kv_in}, {"name": pv, **kv_in}]
    outs_kv = [{"name": ok_, "type": "float", "shape": ["batch_size", H, total, DH]},
               {"name": ov, "type": "float", "shape": ["batch_size", H, total, DH]}]
    outs_state = []
    for kind in ("conv", "recurrent"):
        if kind in states:
            shape = ["batch_size", CONV, K] if kind == "conv" else ["batch_size", 1, DV, DK]
            ins.append({"name": states[kind][0], "type": "float", "shape": shape})
            outs_state.append({"name": states[kind][1], "type": "float", "shape": shape})
            pairs.append({"input": states[kind][0], "output": states[kind][1], "kind": "overwrite",
                          "axis": None, "new": None, "how": "same shape: overwrite"})
    dims = {"batch_size": {"value": 1, "how": "batch 1"},
            past: {"value": capacity, "how": "past = capacity"},
            total: {"value": capacity + 1,
                    "how": "past + 1 new token" if "total" in total else "expression"}}
    webnn = "" if adapter else None
    # the pages' fixed-capacity rewrite refuses: nothing here masks rows beyond the position
    grows = (f"{pk!r} -> {ok_!r} grows by Concat and the graph has neither an 'attention_mask' "
             "input nor position_ids to mask the rows beyond the position: a fixed-capacity "
             "cache would attend its empty rows")
    report = {
        "model": path, "inputs": ins,
        "outputs": [{"name": "logits", "type": "float", "shape": ["batch_size", 1, D]},
                    *outs_kv, *outs_state],
        "capacity": capacity, "dims": dims, "pairs": pairs, "naming_rules": RULES[scheme],
        "pairs_error": "",
        "backends": {"webnn": {"runs": False, "why_not": grows},
                     "webnn-stateful": {"runs": False, "why_not": grows},
                     "ort-cpu": {"runs": True, "why_not": ""}},
    }
    if webnn is None:
        del report["backends"]["webnn"]
    return report


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_inspect_json_in_each_naming_scheme(scheme, tmp_path):
    ok, _ = StatelessCopy.available()
    path = tmp_path / f"{scheme}.onnx"
    onnx.save(scheme_model(scheme), str(path))
    proc = statebench("inspect", path, "--format", "json", "--capacity", "32")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    want = expected(scheme, str(path), 32, ok)
    if not ok:  # no adapter here: the WebNN verdict is that reason
        assert got["backends"].pop("webnn")["runs"] is False
    assert got == want


def test_the_graphs_compute_what_they_say():
    """The test graphs run under ORT, and the growing cache is one row longer: they are the
    graphs the JSON above describes, not shapes that merely look right."""
    import onnxruntime as ort

    model = scheme_model("genai")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng()
    feeds = {"x": rng.standard_normal((1, 1, D)).astype(np.float32),
             "past_key_values.0.key": rng.standard_normal((1, H, 5, DH)).astype(np.float32),
             "past_key_values.0.value": rng.standard_normal((1, H, 5, DH)).astype(np.float32),
             "past.1.conv": rng.standard_normal((1, CONV, K)).astype(np.float32),
             "past.1.recurrent": rng.standard_normal((1, 1, DV, DK)).astype(np.float32)}
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    assert outs["present.0.key"].shape == (1, H, 6, DH)
    np.testing.assert_array_equal(outs["present.0.key"][:, :, :5], feeds["past_key_values.0.key"])
    np.testing.assert_array_equal(outs["present.1.conv"][:, :, :-1], feeds["past.1.conv"][:, :, 1:])


def test_inspect_a_folder_finds_decode_onnx(tmp_path):
    onnx.save(scheme_model("transformers"), str(tmp_path / "decode.onnx"))
    proc = statebench("inspect", tmp_path, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["model"] == str(tmp_path / "decode.onnx") and len(got["pairs"]) == 4


def test_the_table_names_the_pairs_rules_and_verdicts(tmp_path):
    from io import StringIO

    from rich.console import Console

    from harness.cli import main

    onnx.save(scheme_model("genai"), str(tmp_path / "model.onnx"))
    out = StringIO()
    assert main(["inspect", str(tmp_path)], console=Console(file=out, width=300)) == 0
    text = out.getvalue()
    for word in ("past.1.recurrent", "present.1.conv", "overwrite", "append", "past.N",
                 "total_sequence_length", "past + 1 new token", "ort-cpu", "webnn-stateful",
                 "grows by Concat and the graph has neither"):
        assert word in text, word


@pytest.mark.parametrize("make, says", [
    (lambda d: (d / "m.onnx").write_bytes(b"\x00\xffnot a model at all"), "not an ONNX model"),
    (lambda d: None, "no such file or folder"),
    (lambda d: (d / "sub").mkdir(), "a folder with no model.onnx or decode.onnx"),
])
def test_inspect_bad_file_is_one_line_exit_2(make, says, tmp_path):
    make(tmp_path)
    target = {"not an ONNX model": "m.onnx", "no such file or folder": "missing.onnx"}.get(says, "sub")
    assert says in one_line_error(statebench("inspect", tmp_path / target))


def test_inspect_hand_pairs_naming_no_input_is_one_line(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(scheme_model("genai"), str(path))
    line = one_line_error(statebench("inspect", path, "--pairs", "nope=present.0.key"))
    assert "'nope' is not an input" in line
    assert "not INPUT=OUTPUT" in one_line_error(statebench("inspect", path, "--pairs", "x"))


# -- list_kv_pairs directly ---------------------------------------------------------------------


def test_pairs_follow_the_inputs_whatever_the_output_order():
    a = [(p.input, p.output) for p in list_kv_pairs(scheme_model("genai", key_major=True))]
    b = [(p.input, p.output) for p in list_kv_pairs(scheme_model("genai", key_major=False))]
    assert a == b and all(i.split(".")[-1] == o.split(".")[-1] for i, o in a)


def test_a_cache_like_input_without_a_rule_is_named_and_hand_pairs_fix_it():
    model = scheme_model("genai")
    model.graph.input[4].name = "past_conv_window.1"  # no rule knows this name
    for node in model.graph.node:
        node.input[:] = ["past_conv_window.1" if i == "past.1.recurrent" else i for i in node.input]
    with pytest.raises(ConversionError, match="'past_conv_window.1' matches no naming rule"):
        list_kv_pairs(model)
    pairs = list_kv_pairs(model, {"past_conv_window.1": "present.1.recurrent"})
    hand = [p for p in pairs if p.rule == "hand"]
    assert [(p.input, p.output, p.kind) for p in hand] == [
        ("past_conv_window.1", "present.1.recurrent", "overwrite")]


def test_a_pair_differing_on_two_axes_is_refused():
    model = scheme_model("optimum")
    model.graph.output[1].type.tensor_type.shape.dim[1].dim_value = H + 1
    with pytest.raises(ConversionError, match="differ on axes 1, 2"):
        list_kv_pairs(model)


def test_default_dims_numbers_names_and_expressions():
    model = scheme_model("optimum")
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "16"
    got = {k: (d.value, d.how) for k, d in default_dims(model, 10).items()}
    assert got == {"batch_size": (1, "batch 1"), "16": (16, "a number"),
                   "past_sequence_length": (10, "past = capacity"),
                   "past_sequence_length + 1": (11, "expression")}


def test_pin_copies_unless_the_caller_owns_the_model():
    """``pin`` leaves a model it was handed as it was; with copy=False (a model the caller
    loaded itself, as ``convert`` does from a path) it pins in place without copying."""
    from onnx import TensorProto, helper

    from backends.webnn.dims import pin

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    pinned = pin(model, {"batch": 1})
    assert pinned is not model
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert pinned.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    same = pin(model, {"batch": 3}, copy=False)
    assert same is model
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [3, 4]


def test_a_decoder_taking_inputs_embeds_is_refused_in_one_line(tmp_path):
    """An export without its embedding (the genai builder's exclude_embeds=true) takes
    inputs_embeds where statebench feeds token ids: inspect says no family runs it, and run
    and speculative refuse it in one line, exit 2, before any backend starts."""
    from harness.model_info import inspect_model

    model = scheme_model("genai")
    model.graph.input[0].name = "inputs_embeds"
    for node in model.graph.node:
        node.input[:] = ["inputs_embeds" if i == "x" else i for i in node.input]
    onnx.save(model, str(tmp_path / "model.onnx"))
    report = inspect_model(tmp_path, capacity=32)
    assert len(report["pairs"]) == 4
    for verdict in report["backends"].values():
        assert not verdict["runs"] and "inputs_embeds" in verdict["why_not"], verdict
    for cmd in (("run", "--steps", "2"), ("speculative", "--k", "3", "--tokens", "2")):
        line = one_line_error(statebench(*cmd, "--model", tmp_path, "--backends",
                                         "ort-cpu:copy", "--contexts", "8", "--warm-s", "0",
                                         "--out", tmp_path / "x.json"))
        assert "takes inputs_embeds, not input_ids" in line and "exclude_embeds" in line
        assert not (tmp_path / "x.json").exists()
