"""The hybrid presets' deferred-commit export (issue 31, ``export(..., rollback="deferred")``,
``model.export_deferred``): its interface and refusals; the default exports untouched by it;
on ORT's CPU EP and on onnx.reference (the very ONNX graph, standard ops only), verifies
accepting full, partial and zero counts give the float64 reference's logits after feeding
only the accepted tokens, and the state the next dispatch commits is the reference's; with
every count K it gives the ordinary K-token export's tokens. The WebNN stateful graph on
lavapipe: ``test_rollback_export_wgpu.py``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from model import export as E
from model import rollback_feeds as RF
from model.reference import Reference
from model.workload import Workload, cache_specs, preset, token_stream
from tests.rollback_runs import CAPACITY, SEED, OrtRun, deferred, rel, speculate

pytest.importorskip("onnxruntime")

TINY = Workload.build(preset("tiny"), seed=SEED)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("rollback-export")


def test_names_and_refusals(tmp_path):
    plain = E.graph_path(TINY, "standard", 16, tmp_path, tokens=4)
    own = E.graph_path(TINY, "standard", 16, tmp_path, tokens=4, rollback="deferred")
    assert plain.name == "standard-c16-k4.onnx" and own.name == "standard-c16-k4-deferred.onnx"
    assert E.graph_path(TINY, "standard", 16, tmp_path, rollback=None) == \
        E.graph_path(TINY, "standard", 16, tmp_path)
    llama = Workload(preset("llama-1b"))  # shapes only: no weights are made for a name
    for args, kw, why in [((TINY, "ort", 16), {"tokens": 4}, "standard flavour"),
                          ((llama, "standard", 16), {"tokens": 4}, "no GDN layers"),
                          ((TINY, "standard", 16), {"tokens": 9}, "1..8 tokens"),
                          ((TINY, "standard", 16), {"tokens": 4, "rollback": "eager"}, "accepted")]:
        with pytest.raises(ValueError, match=why):
            E.graph_path(*args, tmp_path, **{"rollback": "deferred", **kw})


@pytest.mark.parametrize("k", [1, 4])
def test_interface_standard_ops_and_pairs(cache, k):
    from backends.webnn.onnx_converter import list_kv_pairs

    path, specs = deferred(TINY, k, cache)
    m = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(str(path))
    ops = {n.op_type for n in m.graph.node}
    assert ops <= E.STANDARD_OPS, ops - E.STANDARD_OPS
    assert all(n.domain in ("", None) for n in m.graph.node)
    ins = [(i.name, i.type.tensor_type.elem_type, [d.dim_value for d in i.type.tensor_type.shape.dim])
           for i in m.graph.input]
    assert ins[:3] == [("input_ids", onnx.TensorProto.INT64, [1, k]),
                       ("position_ids", onnx.TensorProto.INT64, [1, k]),
                       (RF.ACCEPTED, onnx.TensorProto.INT64, [1])]
    assert [(n, s) for n, _, s in ins[3:]] == [(s.input, list(s.shape)) for s in specs]
    pairs = {(p.input, p.output, p.kind) for p in list_kv_pairs(path)}
    assert pairs == {(s.input, s.output, "overwrite") for s in specs}
    cfg = TINY.config
    assert [s.shape for s in specs if "state_update" in s.input] == [(1, k * RF.capsule_row(cfg))]
    assert [s.shape for s in specs if "conv" in s.input] == [(1, cfg.gdn_conv_kernel - 1 + k,
                                                               cfg.gdn_conv_dim)]


@pytest.mark.parametrize("name,k", [("tiny", 2), ("tiny", 4), ("tiny", 1), ("small", 4)])
def test_ort_cpu_full_partial_zero(cache, name, k):
    w = TINY if name == "tiny" else Workload.build(preset(name), seed=SEED)
    run = OrtRun(*deferred(w, k, cache))
    counts = [1, 0, 1, 1] if k == 1 else None
    speculate(w, k, run, lambda: run.state, counts, seed=k)


@pytest.mark.parametrize("k", [2, 4])
def test_every_count_k_gives_the_ordinary_tokens(cache, k):
    """accepted_count = K every step (0 at the first): the ordinary K-token export's
    logits within float32 rounding and its greedy token in every row."""
    cfg = TINY.config
    plain = OrtRun(E.export(TINY, "standard", CAPACITY, cache, tokens=k),
                   cache_specs(cfg, CAPACITY))
    run = OrtRun(*deferred(TINY, k, cache))
    toks = token_stream(cfg, CAPACITY, seed=k)
    for j in range(0, CAPACITY - k + 1, k):
        ids = toks[j:j + k]
        want, got = plain(ids, j, 0), run(ids, j, k if j else 0)
        assert np.array_equal(got.argmax(-1), want.argmax(-1)), j
        assert rel(got, want) < 1e-6, (j, rel(got, want))


def test_onnx_reference_runs_the_graph(cache):
    """onnx.reference (no ORT code) on the same graph: partial, zero and full acceptance."""
    from onnx.reference import ReferenceEvaluator

    k = 2
    path, specs = deferred(TINY, k, cache)
    ev = ReferenceEvaluator(onnx.load(str(path)))
    state = {s.input: np.zeros(s.shape, np.float32) for s in specs}
    outs = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]

    def dispatch(ids, pos, acc):
        got = dict(zip(outs, ev.run(None, {
            "input_ids": ids.reshape(1, k), "position_ids": (pos + np.arange(k)).reshape(1, k),
            RF.ACCEPTED: RF.feeds(RF.ACCEPTED, pos, k, acc), **state}), strict=True))
        state.update({s.input: got[s.output] for s in specs})
        return got["logits"]

    speculate(TINY, k, dispatch, lambda: state, [1, 0, 2, 1], seed=5)


def test_load_at_depth_then_speculate(cache):
    """A page-owned state at depth (``rollback_feeds.load`` of the reference's, the next
    count 0) continues as the reference does, and ``committed`` of it is that state."""
    cfg, k, depth = TINY.config, 4, 9
    ref = Reference(cfg, TINY.weights, CAPACITY)
    ref.prefill(token_stream(cfg, depth, seed=1), logits=False)
    loaded = RF.load(cfg, ref.cache_arrays(), k)
    back = RF.committed(cfg, loaded, 0, k)
    for n, a in ref.cache_arrays().items():
        np.testing.assert_array_equal(back[n], a.astype(np.float32))
    run = OrtRun(*deferred(TINY, k, cache))
    run.state = {n: np.asarray(loaded[n], np.float32) for n in run.state}
    ids = token_stream(cfg, depth + k, seed=1)[depth:]
    assert rel(run(ids, depth, 0), ref.step_tokens(ids)) < 1e-5


def test_feeds_refuse():
    assert RF.feeds(RF.ACCEPTED, 5, 4, 3).tolist() == [3]
    for name, acc in (("conv_ring", 0), (RF.ACCEPTED, 5), (RF.ACCEPTED, -1)):
        with pytest.raises(ValueError):
            RF.feeds(name, 0, 4, acc)
