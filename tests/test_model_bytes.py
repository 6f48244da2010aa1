"""A model's bytes (``harness.model_bytes``) against what nothing of it computes: the weights
against the arrays ONNX's own numpy_helper loads (external data included); the state
against the reference's depth arrays, the bytes ORT's CPU EP and the WebNN pages count
crossing the host link, and the cache tensors a page allocates; a float16 export's sweep has
a floor, MBU and no `?` cell, the floor what DESIGN §7's formula gives from those figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.base import DepthState, registry
from backends.pages import StatelessCopy
from harness import metrics, model_bytes, verdicts
from harness.model_info import model_file
from harness.results import Match, Point, Results, Stats
from harness.sources import ModelSource
from tests.test_cli import statebench

MODELS = Path(__file__).parent / "models"
MANIFEST = {m["name"]: m for m in json.loads((MODELS / "manifest.json").read_text())["models"]}
_WGPU_OK, _WGPU_WHY = StatelessCopy.available()


def _arrays(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every stored tensor as ONNX's own loader gives it (initializers, Constant values)."""
    out = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    out.update({n.output[0]: numpy_helper.to_array(a.t) for n in proto.graph.node
                if n.op_type == "Constant" for a in n.attribute if a.name == "value"})
    return out


def _head_weights(proto: onnx.ModelProto) -> set[str]:
    """The stored tensors the node making the logits reads (through a Cast)."""
    producers = {o: n for n in proto.graph.node for o in n.output}
    stored = {t.name for t in proto.graph.initializer}
    node = producers["logits"]
    while node.op_type == "Cast":
        node = producers[node.input[0]]
    return {i for i in node.input if i in stored}


def _config(name: str) -> dict:
    cfg = MANIFEST[name]["source"]["config"]
    return cfg.get("text_config", cfg)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_weights_are_the_stored_arrays_an_embedding_one_row(name):
    """Every tensor as stored (4-bit MatMulNBits blocks and scales: uint8 and float arrays),
    the embedding a step gathers one row of at the source's hidden size, and nothing the
    head reads (untied in these sources) counted at a row."""
    path = model_file(MODELS / MANIFEST[name]["path"])
    w = model_bytes.weights_bytes(onnx.load(str(path), load_external_data=False))
    arrays = _arrays(onnx.load(str(path)))
    assert w.stored == sum(a.nbytes for a in arrays.values())
    assert w.total == w.stored - sum(arrays[n].nbytes - -(-arrays[n].nbytes // len(arrays[n]))
                                     for n in w.gathered)
    embed = next(n for n in w.gathered if n.endswith("embed_tokens.weight"))
    cfg = _config(name)
    assert arrays[embed].shape == (cfg["vocab_size"], cfg["hidden_size"])
    head = _head_weights(onnx.load(str(path), load_external_data=False))
    assert head and not head & set(w.gathered)
    if "int4" in name or "q4f16" in name:
        proto = onnx.load(str(path), load_external_data=False)
        blocks = {n.input[1] for n in proto.graph.node if n.op_type == "MatMulNBits"}
        assert blocks and all(arrays[b].dtype == np.uint8 for b in blocks)


def test_external_data_is_sized_without_reading_it(tmp_path):
    """The weights beside the graph (the builder's layout): the same figure as the single
    file, from the graph alone, with the data file gone."""
    proto = onnx.load(str(model_file(MODELS / "genai-q4f16-llama")))
    onnx.save(proto, str(tmp_path / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)
    outside = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in outside.graph.initializer)
    loaded = _arrays(onnx.load(str(tmp_path / "model.onnx")))
    (tmp_path / "model.onnx.data").unlink()
    w = model_bytes.weights_bytes(outside)
    assert w == model_bytes.weights_bytes(proto)
    assert w.stored == sum(a.nbytes for a in loaded.values())


def _quantized_table(tied: bool, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict]:
    """A 4-bit embedding gathered by GatherBlockQuantized (genai's tied Llama-3.2 head) and,
    where ``tied``, read whole by the head's MatMulNBits too; else a head of its own."""
    vocab, hidden, block = 48, 64, 32
    arrays = {
        "embed.q": rng.integers(0, 256, (vocab, hidden // 2), dtype=np.uint8),
        "embed.scales": rng.random((vocab, hidden // block), dtype=np.float32).astype(np.float16),
        "head.q": rng.integers(0, 256, (vocab, hidden // block, block // 2), dtype=np.uint8),
        "head.scales": rng.random(vocab * hidden // block, dtype=np.float32).astype(np.float16),
    }
    if tied:
        arrays["head.q"] = arrays["embed.q"].reshape(vocab, hidden // block, block // 2)
    nodes = [helper.make_node("GatherBlockQuantized", ["embed.q", "input_ids", "embed.scales"],
                              ["h"], domain="com.microsoft", gather_axis=0, quantize_axis=1,
                              block_size=block, bits=4),
             helper.make_node("MatMulNBits", ["h", "head.q", "head.scales"], ["logits"],
                              domain="com.microsoft", K=hidden, N=vocab, bits=4,
                              block_size=block)]
    if tied:  # the head reads the embedding's own blocks through a reshape
        nodes.insert(1, helper.make_node("Reshape", ["embed.q", "shape"], ["head.q"]))
        del arrays["head.q"]
        arrays["shape"] = np.array([vocab, hidden // block, block // 2], np.int64)
    graph = helper.make_graph(
        nodes, "table", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT16, [1, 1, vocab])],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)]), arrays


@pytest.mark.parametrize("tied", [False, True])
def test_a_gather_block_quantized_table_is_one_row_unless_the_head_reads_it(tied):
    rng = np.random.default_rng()
    proto, arrays = _quantized_table(tied, rng)
    w = model_bytes.weights_bytes(proto)
    assert w.stored == sum(a.nbytes for a in arrays.values())
    table = ["embed.q", "embed.scales"]
    if tied:  # the blocks are read whole by the head; only the scales are gathered alone
        assert w.gathered == ("embed.scales",)
    else:
        assert set(w.gathered) == set(table)
    rows = sum(arrays[n].nbytes // len(arrays[n]) for n in w.gathered)
    assert w.total == w.stored - sum(arrays[n].nbytes for n in w.gathered) + rows


@pytest.fixture(scope="module")
def depths():
    """Each export's source and the reference's state at depth 3 (capacity 8), with the
    logits of the step after it."""
    out = {}
    for name in sorted(MANIFEST):
        src = ModelSource.load(MODELS / MANIFEST[name]["path"], seed=5)
        out[name] = (src, src.depth_arrays(3, 8, 1))
    return out


def _depth(arrays: dict) -> DepthState:
    return DepthState(tokens=arrays["tokens"][:3],
                      cache={k[6:]: v for k, v in arrays.items() if k.startswith("cache:")})


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_the_state_is_what_the_reference_holds_and_ort_copy_moves(name, depths):
    """The valid state at a depth is the reference's depth arrays; a copy step at position P
    uploads the other inputs and P rows of every past and downloads the logits and P + 1
    rows of every present, as ORT's CPU EP counts them (its own arrays' sizes)."""
    src, arrays = depths[name]
    state = src.state
    assert state is not None, src.state_reason
    cache = {k: v for k, v in arrays.items() if k.startswith("cache:")}
    assert state.valid(3) == sum(v.nbytes for v in cache.values()) == src.cache_bytes(3, cache)
    assert state.written == state.valid(1) and state.new_rows == 1
    backend = src.backend(registry()["ort-cpu:copy"])
    try:
        backend.prepare(None, 8)
        backend.reach_depth(_depth(arrays))
        backend.counters.reset()
        backend.step(int(arrays["tokens"][3]))
        c = backend.counters
        assert c.h2d == state.fed(3) + state.valid(3)
        assert c.d2h == state.logits + state.valid(4)
    finally:
        backend.close()


@pytest.mark.skipif(not _WGPU_OK, reason=_WGPU_WHY)
@pytest.mark.parametrize("name", ["genai-q4f16-llama", "transformers-qwen35"])
def test_a_stateless_page_moves_the_whole_state_both_ways(name, depths):
    """wgpu:stateless on a fixed-capacity rewrite: its cache tensors are the state at the
    capacity; a step uploads them with the other inputs and reads them back with the
    logits (float16 ones from the float16 export); wgpu:stateful moves no cache."""
    src, arrays = depths[name]
    state = src.state
    for backend_name in ("wgpu:stateless", "wgpu:stateful"):
        backend = src.backend(registry()[backend_name])
        try:
            backend.prepare(None, 8)
            backend.reach_depth(_depth(arrays))
            backend.counters.reset()
            backend.step(int(arrays["tokens"][3]))
            c = backend.counters
            if backend_name == "wgpu:stateless":
                ins = backend.converted.inputs
                held = sum(int(np.prod(ins[p.input].shape)) * np.dtype(ins[p.input].host_dtype).itemsize
                           for p in backend._pairs)
                assert held == state.full(8)
                assert c.d2h == state.logits + state.full(8)
                assert 0 < c.h2d - state.full(8) <= state.fed(8)
            else:
                assert c.h2d <= state.fed(8) and c.d2h - state.logits < state.written
                assert state.link_cache(c.h2d, c.d2h, 8) == (0, 0)
        finally:
            backend.close()


def test_floor_of_a_model_is_the_formula_over_its_figures(depths):
    """DESIGN §7 for a model: weights + valid state + written over the device bandwidth; a
    host-cache mode adds the state at capacity both ways over the link."""
    src, _ = depths["genai-qwen35"]

    cal = {"host": {"copy_gbps": 3.0, "gemv_gbps": 5.0},
           "wgpu": {"stream_gbps": 2.0, "h2d_gbps": 0.5, "d2h_gbps": 0.25}}
    s, w = src.state, src.weights_bytes
    assert s.whole and s.rows  # gated delta layers and attention layers
    floor = w + s.valid(20) + s.written

    def point(backend, host_cache=False):
        return Point(backend, 20, 30, 3, step_ms=Stats(1.0, 1.0, 1.0), match=Match(True, 0, 0, 1),
                     weights_bytes=w, details={"host_cache": True} if host_cache else {})

    assert np.isclose(src.floor(point("wgpu:stateful"), cal)[0], floor / 2e6)
    assert np.isclose(src.floor(point("wgpu:stateless"), cal)[0],
                      floor / 2e6 + s.full(30) / 0.5e6 + s.full(30) / 0.25e6)
    assert np.isclose(src.floor(point("ort-cpu:copy", True), cal)[0],
                      floor / 5e6 + 2 * s.full(30) / 3e6)
    assert np.isclose(src.floor(point("ort-cpu:shared"), cal)[0], floor / 5e6)


def test_the_state_crosses_to_the_worker_and_into_the_results(depths):
    src, _ = depths["transformers-qwen35"]
    again = ModelSource.from_wire(json.loads(json.dumps(src.to_wire())))
    assert (again.state, again.weights_bytes) == (src.state, src.weights_bytes)
    record = src.describe(8)["model"]["bytes"]
    results = Results("", "", {}, {"model": {"bytes": record}})
    assert verdicts.model_config(results) == src.state
    assert record["weights_bytes"] == src.weights_bytes < record["weights_stored_bytes"]


def test_a_preset_s_state_bytes_are_its_cache_specs():
    """The preset path unchanged: StateBytes of a config give the figures the specs give."""
    from model.workload import cache_specs, preset, valid_cache_bytes

    for name in ("tiny", "tiny+q4f16", "hybrid-1b+f16kv"):
        cfg = preset(name)
        s = metrics.StateBytes.of_config(cfg)
        assert s.full(9) == sum(x.nbytes for x in cache_specs(cfg, 9))
        assert s.valid(5) == valid_cache_bytes(cfg, 5)
        assert s.logits == cfg.vocab * 4 and s.fed(100) == 0


def test_a_model_sweep_has_cache_cells_floors_and_mbu(tmp_path):
    """`run --model` on genai's export: every cell has a cache figure (none `?`), and
    each point, given a calibration, the floor of its mode and an MBU (``runner.finish_point``,
    as a calibrated run makes them)."""
    from harness.runner import finish_point

    out = tmp_path / "run.json"
    proc = statebench("run", "--model", MODELS / "genai-llama", "--backends",
                      "ort-cpu:copy,ort-cpu:shared", "--contexts", "5", "--steps", "2",
                      "--warmup", "1", "--warm-s", "0", "--no-calibrate", "--inprocess",
                      "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "cache ?" not in proc.stdout and proc.stdout.count("cache ") >= 2
    results = Results.from_dict(json.loads(out.read_text()))
    src = ModelSource.load(MODELS / "genai-llama")
    state = verdicts.model_config(results)
    assert state == src.state
    cal = {"host": {"copy_gbps": 3.0, "gemv_gbps": 5.0}}
    for p in results.points:
        assert p.status == "ok" and p.matches, p.reason
        assert verdicts.cache_traffic(p, state) is not None
        done = finish_point(p, src, cal)
        floor = p.weights_bytes + state.valid(5) + state.written
        want = (floor / 5e6 + 2 * state.full(p.capacity) / 3e6 if p.backend == "ort-cpu:copy"
                else floor / 5e6)
        assert np.isclose(done.floor_ms, want) and np.isclose(done.mbu, want / p.step_ms.median)
