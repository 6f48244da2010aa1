"""Pairing and pinning the dims real tracers write (issue 30 item 6): torch.export's
symbols (``s53``, ``s70``, ``s53 + s70``), numeric strings (``"16"``), named forms
(``past_sequence_length + 1``, ``total_sequence_length``), a new-token dim read from
input_ids / position_ids, and which rule matched. A multi-token-decode graph (transformers'
``multi_token_decode=True``: input_ids ``[1, s70]``, caches ``[1, 2, s53, 16] -> [1, 2,
s53 + s70, 16]``) pairs as a K-row append, is pinned at K = 1 and decodes the float64
oracle's greedy tokens; pairs that differ by anything else are refused in one line. The
committed real exports (tests/models) are checked against their own interfaces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from backends.pages import StatelessCopy
from backends.webnn.dims import default_dims, linear, new_token_dims, rows_per_step
from backends.webnn.fixed_capacity import FixedCapacityError, fixed_model, make_fixed_capacity
from backends.webnn.onnx_converter import ConversionError, list_kv_pairs
from harness.greedy import generate
from harness.model_info import inspect_model, model_file
from tests.decoder_graphs import oracle_greedy
from tests.test_cli import one_line_error, statebench

MODELS = Path(__file__).parent / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())["models"]
PROMPT, NEW, CAP = [3, 1, 4], 5, 12


# --- linear: dims as sums of symbols ----------------------------------------------------------


@pytest.mark.parametrize("expr, form", [
    ("s53 + s70", ({"s53": 1, "s70": 1}, 0)),
    ("s53+s70", ({"s53": 1, "s70": 1}, 0)),
    (" s70 + s53 ", ({"s53": 1, "s70": 1}, 0)),
    ("16", ({}, 16)),
    (" 16 ", ({}, 16)),
    ("s53", ({"s53": 1}, 0)),
    ("s53 + 1", ({"s53": 1}, 1)),
    ("1 + s53", ({"s53": 1}, 1)),
    ("past_sequence_length + 1", ({"past_sequence_length": 1}, 1)),
    ("past_sequence_length + sequence_length",
     ({"past_sequence_length": 1, "sequence_length": 1}, 0)),
    ("total_sequence_length", ({"total_sequence_length": 1}, 0)),
    ("2*s53 + 3", ({"s53": 2}, 3)),
    ("(s53 + 1) * 2", ({"s53": 2}, 2)),
    ("s53 - 1", ({"s53": 1}, -1)),
    ("-s4 + 8", ({"s4": -1}, 8)),
    ("s53 + s70 - s70", ({"s53": 1}, 0)),
    ("3 * 4", ({}, 12)),
])
def test_linear_parses_sums_of_symbols(expr, form):
    assert linear(expr) == form


@pytest.mark.parametrize("expr", ["s53*s70", "s53 * (s70 + 1)", "s53 // 2", "s53 / 2", "s53**2",
                                  "s53 % 4", "Max(1, s53)", "a.b", "", "s53 +", "True", "1.5",
                                  "s53 if s70 else 1", "[s53]"])
def test_linear_refuses_what_is_not_a_sum(expr):
    assert linear(expr) is None


# --- a multi-token-decode graph in transformers' names -----------------------------------------


def retraced(model: onnx.ModelProto, names: dict, numbers_as_strings: bool = False) -> onnx.ModelProto:
    """``model`` with its dim symbols renamed as another tracer writes them (a str: a new
    symbol; an int: a fixed dim); ``numbers_as_strings``: the inputs' fixed dims (but a
    cache's first) written as numeric strings, as transformers' exporter writes them
    (caches ``[1, '2', s53, '16']``, position_ids ``['3', 1, s70]``)."""
    g = model.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in names:
                v = names[d.dim_param]
                if isinstance(v, int):
                    d.dim_value = v
                else:
                    d.dim_param = v
            elif numbers_as_strings and vi.name in {i.name for i in g.input} \
                    and d.HasField("dim_value"):
                d.dim_param = str(d.dim_value)
    return model


#: transformers' multi_token_decode=True names: batch fixed, s70 new tokens, s53 the past
MTD = {"batch_size": 1, "sequence_length": "s70", "cache_length": "s53",
       "cache_length + 1": "s53 + s70"}


def mtd_model() -> onnx.ModelProto:
    """``tests.decoder_graphs``' transformers-scheme decoder (no attention_mask; Qwen's
    position_ids [3, B, S]; a growing KV cache, a recurrent state, a conv window) in the
    names of a multi-token decode."""
    from tests.decoder_graphs import decoder_model

    return retraced(decoder_model("transformers"), MTD, numbers_as_strings=True)


@pytest.fixture(scope="module")
def mtd(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dims") / "mtd.onnx"
    onnx.save(mtd_model(), str(path))
    return path


def _shape(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in vi.type.tensor_type.shape.dim]


def test_the_graph_is_written_as_a_multi_token_decode():
    model = mtd_model()
    io = {v.name: _shape(v) for v in [*model.graph.input, *model.graph.output]}
    assert io["input_ids"] == [1, "s70"] and io["position_ids"] == ["3", 1, "s70"]
    assert io["input.cache.layers.0.keys"] == [1, "2", "s53", "4"]
    assert io["output.cache.layers.0.keys"] == [1, 2, "s53 + s70", 4]


def test_the_new_token_dim_is_read_from_input_ids_and_position_ids():
    model = mtd_model()
    assert new_token_dims(model) == {"s70": "input_ids[1]"}
    del model.graph.input[0]  # no input_ids: position_ids [3, B, S] says it
    assert new_token_dims(model) == {"s70": "position_ids[2]"}


def test_a_multi_token_decode_pairs_as_an_append_of_the_new_token_dim():
    pairs = {p.input: p for p in list_kv_pairs(mtd_model())}
    for key in ("keys", "values"):
        p = pairs[f"input.cache.layers.0.{key}"]
        assert (p.kind, p.axis, p.new) == ("append", 2, "s70")
        assert "s53 + s70" in p.how and "input_ids[1]" in p.how, p.how
    states = [p for p in pairs.values() if "states" in p.input]
    assert len(states) == 2 and all(p.kind == "overwrite" and p.new is None for p in states)


def test_a_decode_step_pins_k_1_and_the_past_at_the_capacity():
    got = default_dims(mtd_model(), CAP)
    assert (got["s70"].value, got["s53"].value, got["s53 + s70"].value) == (1, CAP, CAP + 1)
    assert "new tokens K = 1" in got["s70"].how and "input_ids[1]" in got["s70"].how
    assert "grows" in got["s53"].how, got["s53"].how
    assert got["2"].value == 2 and got["2"].how == "a number"
    assert all(rows_per_step(p, {k: d.value for k, d in got.items()}) == 1
               for p in list_kv_pairs(mtd_model()) if p.kind == "append")


def test_the_past_is_found_without_the_pairs_from_the_present_it_grows_into():
    """No pair given: the output's s53 + s70, s70 the new tokens, makes s53 a past."""
    got = default_dims(mtd_model(), CAP, pairs=[])
    assert got["s53"].value == CAP and "s53 + s70: past + new" in got["s53"].how, got["s53"]


def test_inspect_records_the_rule_of_each_pair_and_dim(mtd):
    report = inspect_model(mtd, capacity=CAP, backends=False)
    assert report["pairs_error"] == ""
    kv = [p for p in report["pairs"] if p["kind"] == "append"]
    assert len(kv) == 2 and all(p["new"] == "s70" and "s53 + s70" in p["how"] for p in kv)
    assert report["dims"]["s70"]["value"] == 1 and report["dims"]["s53"]["value"] == CAP


def test_the_fixed_capacity_rewrite_says_the_rule_that_paired_it():
    model = mtd_model()
    dims, rewrites = fixed_model(model, CAP)
    assert dims["s70"] == 1 and dims["s53"] == CAP
    assert len(rewrites) == 2 and all(r.how.startswith("past+new on axis 2 (s53 + s70")
                                      for r in rewrites), rewrites


def test_k_rows_a_step_are_refused_by_the_one_row_rewrite():
    """Pinned for a K = 2 verify, the same graph gains two rows a step: the fixed-capacity
    rewrite (one row at the position) refuses it rather than write one."""
    model = mtd_model()
    dims = {k: d.value for k, d in default_dims(model, CAP, new_tokens=2).items()}
    assert (dims["s70"], dims["s53 + s70"]) == (2, CAP + 2)
    from backends.webnn.dims import pin

    pin(model, dims, copy=False)
    with pytest.raises(FixedCapacityError, match="gains 2 rows a step") as exc:
        make_fixed_capacity(model, list_kv_pairs(mtd_model()), dims)
    assert "\n" not in str(exc.value)


BACKENDS = ["ort-cpu:copy", "ort-cpu:iobinding"]
_WGPU_OK, _WGPU_WHY = StatelessCopy.available()
if _WGPU_OK:
    BACKENDS += ["wgpu:stateless", "wgpu:stateful"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_multi_token_decode_gives_the_oracles_tokens_at_k_1(mtd, backend):
    want = oracle_greedy("transformers", PROMPT, NEW)
    assert len(set(want)) > 2
    assert generate(mtd, PROMPT, NEW, backend) == want


# --- refused: a pair that is not the past plus new rows -----------------------------------------


def _present_axis(model: onnx.ModelProto, axis: int, value) -> onnx.ModelProto:
    for vi in model.graph.output:
        if vi.name == "output.cache.layers.0.keys":
            d = vi.type.tensor_type.shape.dim[axis]
            if isinstance(value, int):
                d.dim_value = value
            else:
                d.dim_param = value
    return model


@pytest.mark.parametrize("axis, value, says", [
    (2, "s53*s70", "axis 2 goes from s53 to s53*s70, not the past plus"),
    (2, "2*s53", "axis 2 goes from s53 to 2*s53"),
    (2, "s53 - 1", "axis 2 goes from s53 to s53 - 1"),
    (2, "s53 + s99", "new-token dims: s70 (input_ids[1])"),
    (1, 3, "differ on axes 1, 2 (a pair may differ on one axis only)"),
])
def test_a_pair_that_is_not_past_plus_new_rows_is_refused_in_one_line(axis, value, says):
    model = _present_axis(mtd_model(), axis, value)
    with pytest.raises(ConversionError) as exc:
        list_kv_pairs(model)
    msg = str(exc.value)
    assert says in msg and "\n" not in msg, msg
    assert msg.startswith("cache pair 'input.cache.layers.0.keys' -> 'output.cache.layers.0.keys'")


def test_a_refused_pair_is_one_line_exit_2_from_generate(tmp_path):
    path = tmp_path / "product.onnx"
    onnx.save(_present_axis(mtd_model(), 2, "s53*s70"), str(path))
    proc = statebench("generate", path, "--prompt", "3,1", "--max-new-tokens", 1,
                      "--backend", "ort-cpu:copy")
    assert "s53*s70" in one_line_error(proc)


# --- the symbols real exporters write, one by one --------------------------------------------


def _cache_graph(past: str, present: str, ids: list, extra: tuple = ()) -> onnx.ModelProto:
    """A past -> present Concat of a new row (input_ids' embedding as the row), the
    past/present axis and input_ids written as given; ``extra``: more outputs' dims."""
    vi = helper.make_tensor_value_info
    n = helper.make_node
    emb = onnx.numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "emb")
    shape = onnx.numpy_helper.from_array(np.array([1, 1, -1, 4], np.int64), "s")
    nodes = [n("Gather", ["emb", "input_ids"], ["e"]), n("Reshape", ["e", "s"], ["row"]),
             n("Concat", ["past_key_values.0.key", "row"], ["present.0.key"], axis=2)]
    outs = [vi("present.0.key", TensorProto.FLOAT, [1, 1, present, "4"])]
    outs += [vi(f"extra{k}", TensorProto.FLOAT, [d]) for k, d in enumerate(extra)]
    nodes += [n("Identity", ["e"], [f"extra{k}"]) for k in range(len(extra))]
    g = helper.make_graph(nodes, "cache", [vi("input_ids", TensorProto.INT64, ids),
                                           vi("past_key_values.0.key", TensorProto.FLOAT,
                                              [1, 1, past, "4"])], outs, [emb, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("past, present, ids, new, pinned", [
    # torch.export, one token a step and K a step
    ("s53", "s53 + 1", [1, 1], 1, {"s53": CAP, "s53 + 1": CAP + 1}),
    ("s53", "s53 + s70", [1, "s70"], "s70", {"s53": CAP, "s70": 1, "s53 + s70": CAP + 1}),
    ("s53", "s53+s70", [1, "s70"], "s70", {"s53": CAP, "s70": 1, "s53+s70": CAP + 1}),
    ("s53", "s70 + s53", ["s1", "s70"], "s70", {"s53": CAP, "s70": 1, "s1": 1}),
    # optimum and genai
    ("past_sequence_length", "past_sequence_length + 1", ["batch_size", 1], 1,
     {"past_sequence_length": CAP, "batch_size": 1}),
    ("past_sequence_length", "past_sequence_length + sequence_length",
     ["batch_size", "sequence_length"], "sequence_length",
     {"past_sequence_length": CAP, "sequence_length": 1}),
    ("past_sequence_length", "total_sequence_length", ["batch_size", "sequence_length"],
     "sequence_length", {"total_sequence_length": CAP + 1, "past_sequence_length": CAP}),
    # numbers, some written as strings
    ("16", "17", [1, 1], 1, {"16": 16}),
    (16, "17", [1, 1], 1, {"17": 17}),
])
def test_each_form_pairs_and_pins(past, present, ids, new, pinned):
    model = _cache_graph(past, present, ids)
    if isinstance(past, int):
        d = model.graph.input[1].type.tensor_type.shape.dim[2]
        d.dim_value = past
    (p,) = list_kv_pairs(model)
    assert (p.kind, p.axis, p.new) == ("append", 2, new), p
    assert p.how, p
    got = default_dims(model, CAP)
    for sym, value in pinned.items():
        assert (got[sym].value if sym in got else None) == value, (sym, got)
    assert rows_per_step(p, {k: d.value for k, d in got.items()}) == 1


def test_the_same_dim_written_two_ways_is_an_overwrite():
    model = _cache_graph("s53 + s70", "s53+s70", [1, "s70"])
    (p,) = list_kv_pairs(model)
    assert (p.kind, p.axis, p.new) == ("overwrite", None, None)


# --- the committed real exports ---------------------------------------------------------------


def _ids_axis(proto: onnx.ModelProto):
    ids = next(i for i in proto.graph.input if i.name == "input_ids")
    d = ids.type.tensor_type.shape.dim[-1]
    return d.dim_value if d.HasField("dim_value") else d.dim_param


@pytest.mark.parametrize("name", [m["name"] for m in MANIFEST])
def test_each_real_exports_appends_grow_by_its_input_ids_axis(name):
    """Each growing pair of a committed export gains what its input_ids' last axis counts
    (a fixed 1 or the new-token symbol), pinned to one row a step, and says its rule."""
    e = next(m for m in MANIFEST if m["name"] == name)
    proto = onnx.load(str(model_file(MODELS / e["path"])), load_external_data=False)
    axis = _ids_axis(proto)
    pairs = list_kv_pairs(proto)
    dims = {k: d.value for k, d in default_dims(proto, CAP).items()}
    grows = [p for p in pairs if p.kind == "append"]
    assert len(grows) == sum(p["kind"] == "append" for p in e["pairs"]) > 0
    for p in grows:
        assert p.new == axis or (axis in (1, "1") and p.new == 1), (p, axis)
        assert rows_per_step(p, dims) == 1 and p.how.startswith(f"past+new on axis {p.axis}")
    if isinstance(axis, str) and not axis.isdigit():
        assert dims[axis] == 1


MTD_EXPORTS = [m for m in MANIFEST if "multi_token_decode=True" in m["exporter"]]


@pytest.mark.parametrize("name", [m["name"] for m in MTD_EXPORTS])
def test_a_real_multi_token_decode_export_is_a_k_row_append_decoded_at_k_1(name):
    """transformers' multi_token_decode=True export: every growing pair gains the new-token
    dim its input_ids declare (a symbol, not 1), pinned to 1; it decodes the source's
    greedy tokens one token a step (the WebNN pages on it: tests/test_real_exports.py)."""
    e = next(m for m in MTD_EXPORTS if m["name"] == name)
    proto = onnx.load(str(model_file(MODELS / e["path"])), load_external_data=False)
    k = _ids_axis(proto)
    assert isinstance(k, str) and not k.isdigit(), k
    grows = [p for p in list_kv_pairs(proto) if p.kind == "append"]
    assert grows and all(p.new == k and "input_ids[1]" in p.how for p in grows), grows
    assert default_dims(proto, CAP)[k].value == 1
    got = generate(MODELS / e["path"], e["prompt"], NEW, "ort-cpu:copy")
    assert got == e["greedy_tokens"][:NEW]


def test_a_multi_token_decode_export_is_committed():
    assert MTD_EXPORTS, "tests/models has no multi_token_decode=True export"
