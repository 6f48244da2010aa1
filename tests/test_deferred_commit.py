"""A real hybrid export's K-token graph in deferred-commit form
(``backends/webnn/deferred_commit.py``): onnxruntime-genai's Qwen3.5 export
(tests/models/genai-qwen35, LinearAttention and CausalConvWithState layers) rolled back to
any m of K verified tokens by ``accepted_count``.

The oracle shares no code with the rewrite: ORT's CPU EP on the original export, fed one
token at a time the tokens kept. Fresh random prompts and drafts per case; every kept
count 0 .. K at K = 2 and 4: each verify's kept logits rows (and their argmax) as the
walk's, and the state after the loop (the recurrent state and conv window the next
dispatch commits, read where the graph itself wrote it) as the walk's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.page_marks import needs_page
from tests.test_cli import statebench

MODEL = Path(__file__).parent / "models" / "genai-qwen35" / "model.onnx"
VOCAB = 997
HEAD = 32  # genai's kv_cache_dim
TOL = 1e-4


def _session(proto_or_path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    data = proto_or_path.SerializeToString() if isinstance(proto_or_path, onnx.ModelProto) \
        else str(proto_or_path)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _past(name: str) -> str:
    return "past" + name[len("present"):] if not name.startswith("present.") or \
        name.endswith(("conv", "recurrent")) else "past_key_values." + name[len("present."):]


class Walk:
    """The original export on ORT's CPU EP, one token a run (the oracle)."""

    def __init__(self) -> None:
        self.sess = _session(MODEL)
        self.state = {}
        for i in self.sess.get_inputs():
            if i.name.startswith("past"):
                shape = [1 if d == "batch_size" else HEAD if d == "kv_cache_dim"
                         else 0 if isinstance(d, str) else d for d in i.shape]
                self.state[i.name] = np.zeros(shape, np.float32)
        self.position = 0

    def feed(self, token: int) -> np.ndarray:
        p = self.position
        feed = {"input_ids": np.array([[token]], np.int64),
                "attention_mask": np.ones((1, p + 1), np.int64),
                "position_ids": np.full((3, 1, 1), p, np.int64), **self.state}
        names = [o.name for o in self.sess.get_outputs()]
        outs = dict(zip(names, self.sess.run(None, feed), strict=True))
        self.state = {_past(n): v for n, v in outs.items() if n != "logits"}
        self.position += 1
        return outs["logits"][0, 0]


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def _kept_counts(k: int, rng) -> list[int]:
    """Every count 0 .. K, a K first (the capsule full) and 0 twice in a row, then random."""
    return [k, 0, 0, *range(1, k + 1), *rng.integers(0, k + 1, 3).tolist(), k - 1]


# -- the rewritten graph itself, on ORT's CPU EP ------------------------------------------------


def _rewritten(k: int):
    from backends.webnn.deferred_commit import make_deferred
    from backends.webnn.dims import pin

    proto = pin(onnx.load(str(MODEL)), {"batch_size": 1, "sequence_length": k})
    return proto, make_deferred(proto, k)


@pytest.mark.parametrize("k", [2, 4])
def test_the_rewritten_graph_rolls_back_every_m_on_ort(k):
    """The rewritten K-token graph run by ORT itself (its KV cache grown and cut back by
    position): each verify's kept rows and the state it commits at the next dispatch (its
    present state, the graph's own) as the walk's; ``committed`` (the pages' state check)
    agrees."""
    proto, deferred = _rewritten(k)
    assert [r.state for r in deferred.recurrent] == ["past.0.recurrent", "past.2.recurrent"]
    assert [c.past for c in deferred.conv] == ["past.0.conv", "past.2.conv"]
    sess, walk = _session(proto), Walk()
    rng = np.random.default_rng(100 + k)
    for t in rng.integers(3, VOCAB, 2 * k + 1):
        walk.feed(int(t))
    state, accepted = deferred.load(walk.state), 0
    names = [o.name for o in sess.get_outputs()]
    for kept in _kept_counts(k, rng):
        p = walk.position
        fed = rng.integers(3, VOCAB, k)
        outs = dict(zip(names, sess.run(None, {
            "input_ids": fed[None], "attention_mask": np.ones((1, p + k), np.int64),
            "position_ids": np.broadcast_to(np.arange(p, p + k), (3, 1, k)).copy(),
            "accepted_count": np.array([accepted], np.int64), **state}), strict=True))
        for r in deferred.recurrent:  # the last verify committed, by the graph
            assert _rel(outs[r.state.replace("past", "present", 1)], walk.state[r.state]) < TOL
        want = [walk.feed(int(t)) for t in fed[:kept]]
        for j, row in enumerate(want):
            assert _rel(outs["logits"][0, j], row) < TOL, (kept, j)
            assert int(np.argmax(outs["logits"][0, j])) == int(np.argmax(row))
        state = {_past(n): v for n, v in outs.items() if n != "logits"}
        for n in state:
            if n.startswith("past_key_values."):
                state[n] = state[n][:, :, :walk.position]  # KV rows roll back by position
        accepted = kept
        for n, a in deferred.committed(state, accepted).items():
            if not n.startswith("past_key_values."):
                assert _rel(a, walk.state[n]) < TOL, (kept, n)


def test_the_rewrite_keeps_the_exports_names():
    """Only ``accepted_count`` and a capsule pair per GDN layer are added; the conv pairs
    keep their names, now kernel - 1 + K columns; every other input and output as it was."""
    k = 4
    before = onnx.load(str(MODEL), load_external_data=False)
    proto, deferred = _rewritten(k)
    ins = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    outs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in proto.graph.output}
    added = {"accepted_count", "past_state_update.0", "past_state_update.2"}
    assert set(ins) - {i.name for i in before.graph.input} == added
    assert set(outs) - {o.name for o in before.graph.output} == {
        "present_state_update.0", "present_state_update.2"}
    assert ins["past.0.conv"] == outs["present.0.conv"] == [1, 128, 3 + k]
    assert ins["past.0.recurrent"] == outs["present.0.recurrent"] == [1, 4, 16, 16]
    row = 4 + 2 * 16 + 4 * 16 + 4  # log decay, key, value, beta
    assert ins["past_state_update.0"] == [1, k, row] == [1, k, deferred.recurrent[0].row]


def test_a_model_without_gdn_layers_is_left_alone_and_a_bad_node_refused():
    from backends.webnn.deferred_commit import DeferredError, make_deferred
    from backends.webnn.dims import pin

    llama = pin(onnx.load(str(MODEL.parent.parent / "genai-llama" / "model.onnx"),
                          load_external_data=False), {"batch_size": 1, "sequence_length": 2})
    nodes = len(llama.graph.node)
    assert not make_deferred(llama, 2) and len(llama.graph.node) == nodes
    proto = pin(onnx.load(str(MODEL)), {"batch_size": 1, "sequence_length": 2})
    conv = next(n for n in proto.graph.node if n.op_type == "CausalConvWithState")
    conv.attribute.append(onnx.helper.make_attribute("dilation", 2))
    nodes = len(proto.graph.node)
    with pytest.raises(DeferredError, match="dilation"):
        make_deferred(proto, 2)
    assert len(proto.graph.node) == nodes and "accepted_count" not in {
        i.name for i in proto.graph.input}
    proto = pin(onnx.load(str(MODEL)), {"batch_size": 1, "sequence_length": 2})
    proto.graph.node.append(onnx.helper.make_node("Identity", ["present.2.recurrent"], ["seen"]))
    with pytest.raises(DeferredError, match="read by another node"):
        make_deferred(proto, 2)
    with pytest.raises(DeferredError, match="K = 9"):
        make_deferred(pin(onnx.load(str(MODEL)), {"batch_size": 1, "sequence_length": 9}), 9)


# -- the pages ------------------------------------------------------------------------------------


def _page_against_the_walk(name: str, k: int, seed: int) -> None:
    from backends.base import DepthState, registry

    rng = np.random.default_rng(seed)
    walk = Walk()
    prompt = rng.integers(3, VOCAB, 2 * k)
    for t in prompt:
        walk.feed(int(t))
    cls = registry()[name]
    b = (cls(model=MODEL, tokens_per_step=k) if name.startswith("ort-")
         else cls(onnx_path=MODEL, tokens_per_step=k))
    b.speculative = True
    b.prepare(None, 64)
    try:
        assert b.rollback_refusal() == ""
        assert b.details["deferred_commit"]["recurrent"] == ["past.0.recurrent",
                                                            "past.2.recurrent"]
        b.reach_depth(DepthState(tokens=prompt, cache=dict(walk.state)))
        for kept in _kept_counts(k, rng):
            fed = rng.integers(3, VOCAB, k)
            logits = b.step_tokens(fed)
            want = [walk.feed(int(t)) for t in fed[:kept]]
            for j, row in enumerate(want):
                assert _rel(logits[j], row) < TOL, (name, kept, j)
                assert int(np.argmax(logits[j])) == int(np.argmax(row)), (name, kept, j)
            b.accept(kept)
        assert b.position == walk.position
        # the page's state check (the commit in NumPy, ``DeferredGraph.committed``) ...
        snap = b.state_snapshot()
        for n in ("past.0.recurrent", "past.2.recurrent", "past.0.conv", "past.2.conv"):
            assert _rel(snap[n], walk.state[n]) < TOL, (name, n)
        # ... and the graph's own commit: one more dispatch, its first row the walk's next
        # and the pairs it wrote holding the committed state (recurrent) and window
        # (the conv pair's first kernel - 1 columns)
        t = int(rng.integers(3, VOCAB))
        logits = b.step_tokens(np.concatenate([[t], rng.integers(3, VOCAB, k - 1)]))
        pairs = b.past if name.startswith("ort-") else b._read_pairs(None)
        for n in ("past.0.recurrent", "past.2.recurrent"):
            assert _rel(pairs[n], walk.state[n]) < TOL, (name, n)
        for n in ("past.0.conv", "past.2.conv"):
            assert _rel(pairs[n][..., :3], walk.state[n]) < TOL, (name, n)
        assert _rel(logits[0], walk.feed(t)) < TOL
    finally:
        b.close()


@needs_page
@pytest.mark.parametrize("k", [2, 4])
def test_the_stateful_page_rolls_a_real_hybrid_back_every_m(k):
    """wgpu:stateful on genai's hybrid, made deferred-commit where the K-token graph is
    built for a speculative loop: every kept count as ORT's one-token walk."""
    _page_against_the_walk("wgpu:stateful", k, seed=k)


@needs_page
@pytest.mark.parametrize("name", ["wgpu:stateless", "wgpu:reuse"])
def test_the_bound_pages_reach_depth_in_the_deferred_layout(name):
    """The pages that write the state at depth: the walk's state written in the deferred
    layout (committed state, empty capsule, window then zeros), every kept count after."""
    _page_against_the_walk(name, 2, seed=7)


def test_orts_copy_mode_rolls_a_real_hybrid_back_every_m():
    """ORT's copy mode on the export rewritten (its KV grown and cut back by position, its
    GDN pairs committed by ``accepted_count``), against the same walk."""
    _page_against_the_walk("ort-cpu:copy", 4, seed=11)


def test_past_the_capsules_bound_a_rollback_is_refused_with_why():
    """K = 9 (the capsule's bound is 8): the graph is left as the export's, and a rollback
    is refused naming the rewrite's reason; all K are still kept."""
    from backends.base import registry

    b = registry()["ort-cpu:copy"](model=MODEL, tokens_per_step=9)
    b.speculative = True
    b.prepare(None, 64)
    try:
        assert "K = 9" in b.rollback_refusal() and "deferred_commit" not in b.details
        b.step_tokens(np.arange(3, 12))
        with pytest.raises(NotImplementedError, match="K = 9"):
            b.accept(4)
        b.accept(9)
    finally:
        b.close()


FLOAT16 = Path(__file__).parent / "models-float16" / "genai-q4f16-qwen35-small"


@pytest.mark.slow
@needs_page
def test_a_float16_hybrid_rolls_back_on_the_page_and_ort_says_why_not(tmp_path):
    """genai's q4f16 hybrid (`-p int4 -e webgpu`: float16 conv and recurrent state, what a
    page ships; a held-out size, tests/models-float16): the stateful page runs the rewrite
    in float16 and every kept count matches its one-token decode and greedy tokens; ORT's
    copy mode refuses the float16 rewrite in its own words (its CPU EP does not reproduce
    its one-token decode on it)."""
    out = tmp_path / "spec.json"
    proc = statebench("speculative", "--model", FLOAT16, "--backends",
                      "wgpu:stateful,ort-cpu:copy", "--k", "2", "--accept", "partial,zero",
                      "--contexts", "6", "--tokens", "4", "--warm-s", "0", "--out", out)
    assert proc.returncode == 0, proc.stderr
    points = json.loads(out.read_text())["points"]
    page = [p for p in points if p["backend"] == "wgpu:stateful"]
    assert len(page) == 2 and all(p["status"] == "ok" for p in page), page
    for p in page:
        assert p["tokens_match_greedy"] and p["logits_match_plain"] and p["state_ok"], p
        assert p["rollback"]["strategy"] == "position + accepted_count"
    (ort_point, *_) = [p for p in points if p["backend"] == "ort-cpu:copy"]
    assert ort_point["status"] == "unavailable" and "float16" in ort_point["reason"]
