"""K-token graphs (issue 31 item 1): a step of K new tokens at positions P .. P+K-1 in one
dispatch, in both flavours of statebench's export, against the float64 reference
(``Reference.step_tokens``): ORT's CPU EP on the ORT flavour (GroupQueryAttention,
CausalConvWithState and LinearAttention of sequence length K) and on the standard one, the
wgpu pages on the standard flavour (stateless, reuse, stateful, fallback); the K-query
attention pattern fused as the one-token one is (the same launches), on fresh random
inputs in float32 and with float16 caches; capacity overflow by K rows refused as DESIGN §2
item 4 says; and the cache rows a K-token step writes against K one-token steps'."""

from __future__ import annotations

import numpy as np
import pytest

from backends.base import DepthState
from model import export as E
from model.reference import Reference
from model.workload import Workload, preset, token_stream
from tests.page_marks import PAGE_OK, PAGE_WHY, needs_page  # noqa: F401

TINY = Workload.build(preset("tiny"))
CAPACITY = 24
DEPTH = 8
TOKENS = token_stream(TINY.config, CAPACITY + 8, seed=3)


def reached(capacity: int = CAPACITY, depth: int = DEPTH) -> tuple[DepthState, Reference]:
    ref = Reference(TINY.config, TINY.weights, capacity)
    ref.prefill(TOKENS[:depth])
    return DepthState(tokens=TOKENS[:depth].copy(), cache=ref.cache_arrays()), ref


def assert_steps(b, k: int, steps: int = 2, where: str = "") -> None:
    """``steps`` K-token steps from DEPTH against the reference's: (K, vocab) logits within
    float32 rounding, the same greedy token per row."""
    state, ref = reached()
    b.reach_depth(state)
    for j in range(steps):
        ids = TOKENS[DEPTH + j * k:DEPTH + (j + 1) * k]
        got = np.asarray(b.step_tokens(ids), np.float64)
        want = ref.step_tokens(ids)
        assert got.shape == (k, TINY.config.vocab), where
        rel = np.abs(got - want).max() / np.abs(want).max()
        assert rel < 1e-5, f"{where} K={k} step {j}: max|d|/max|ref| = {rel:.2e}"
        assert np.array_equal(got.argmax(-1), want.argmax(-1)), where


# -- the export -----------------------------------------------------------------------------

def test_graph_path_names_k_only_above_one(tmp_path):
    one = E.graph_path(TINY, "standard", 16, tmp_path)
    assert one == E.graph_path(TINY, "standard", 16, tmp_path, tokens=1)
    assert one.name == "standard-c16.onnx"
    assert E.graph_path(TINY, "ort", 16, tmp_path, tokens=4).name == "ort-c16-k4.onnx"
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="tokens"):
            E.graph_path(TINY, "standard", 16, tmp_path, tokens=bad)


@pytest.mark.parametrize("k", [2, 4])
def test_k_token_graph_shapes_and_ops(tmp_path, k):
    """K ids and positions in, logits [1, K, vocab] out; the standard flavour stays inside
    STANDARD_OPS and writes K rows with one ScatterND per cache; the ORT flavour's GQA and
    LinearAttention take all K at once."""
    import onnx

    for flavour in E.FLAVOURS:
        m = onnx.load(str(E.export(TINY, flavour, CAPACITY, tmp_path, tokens=k)),
                      load_external_data=False)
        dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
                for v in [*m.graph.input, *m.graph.output]}
        assert dims["input_ids"] == [1, k] and dims["logits"] == [1, k, TINY.config.vocab]
        ops = [n.op_type for n in m.graph.node]
        if flavour == E.STANDARD:
            assert dims["position_ids"] == [1, k]
            assert set(ops) <= E.STANDARD_OPS
            assert ops.count("ScatterND") == 2 * len(TINY.config.attention_layers)
        else:
            for op in ("GroupQueryAttention", "LinearAttention", "CausalConvWithState"):
                assert ops.count(op) >= 1, op


# -- ORT's CPU EP, both flavours -------------------------------------------------------------

ORT_MODES = ("ort-cpu:copy", "ort-cpu:shared", "ort-cpu:standard")


@pytest.fixture(scope="module")
def ort_cache(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return tmp_path_factory.mktemp("ktoken-ort")


def ort_backend(name: str, k: int, cache, capacity: int = CAPACITY):
    from backends.ort import BACKENDS

    b = BACKENDS[name](tokens_per_step=k)
    b.cache_dir = cache
    b.prepare(TINY, capacity)
    return b


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("name", ORT_MODES)
def test_ort_cpu_k_token_steps_match_reference(ort_cache, name, k):
    b = ort_backend(name, k, ort_cache)
    try:
        assert_steps(b, k, where=name)
    finally:
        b.close()


def test_ort_refuses_k_rows_past_capacity(ort_cache):
    b = ort_backend("ort-cpu:standard", 4, ort_cache, capacity=10)
    try:
        b.step_tokens(TOKENS[:4])
        b.step_tokens(TOKENS[4:8])
        with pytest.raises(ValueError, match="capacity 10 exceeded at position 11"):
            b.step_tokens(TOKENS[8:12])
        with pytest.raises(ValueError, match="3 tokens given to a step of 4"):
            b.step_tokens(TOKENS[:3])
        with pytest.raises(ValueError, match="step_tokens"):
            b.step(int(TOKENS[0]))
    finally:
        b.close()


# -- the wgpu pages (lavapipe in CI) ---------------------------------------------------------

def _pages():
    from backends.pages import StatefulFallback, StatefulInPlace, StatelessCopy, TensorReuse

    return {c.name: c for c in (StatelessCopy, TensorReuse, StatefulInPlace, StatefulFallback)}




def page(name: str, k: int, capacity: int = CAPACITY):
    b = _pages()[name](tokens_per_step=k)
    b.prepare(TINY, capacity)
    return b


def attention_launches(b) -> list[str]:
    return [la.kernel.name for la in b.converted.graph._plan.launches
            if getattr(la, "kernel", None) is not None and la.kernel.name.startswith("attention")]


@pytest.fixture(scope="module")
def one_token_attention():
    b = page("wgpu:stateful", 1)
    try:
        yield attention_launches(b)
    finally:
        b.close()


@needs_page
@pytest.mark.parametrize("name,k", [("wgpu:stateless", 4), ("wgpu:reuse", 4), ("wgpu:stateful", 2),
                                    ("wgpu:stateful", 4), ("wgpu:fallback", 2)])
def test_pages_k_token_steps_match_reference(one_token_attention, name, k):
    """Every page runs the standard K-token graph; its attention is the fused flash
    attention in as many launches as the one-token graph's (K queries in one launch, not
    K launches)."""
    b = page(name, k)
    try:
        assert_steps(b, k, where=name)
        assert one_token_attention and attention_launches(b) == one_token_attention
        if name == "wgpu:stateful":
            assert b.details["is_stateful"] and all(b.details["in_place"].values())
    finally:
        b.close()


@needs_page
def test_stateful_page_reaches_depth_in_chunks_of_k():
    """A hidden cache is reached by dispatching: K tokens a dispatch (a chunked prefill),
    a depth that is not a multiple of K refused."""
    b = page("wgpu:stateful", 4)
    try:
        assert_steps(b, 4, steps=1, where="stateful chunks")
        with pytest.raises(ValueError, match="multiple"):
            b.reach_depth(DepthState(tokens=TOKENS[:6].copy(), cache={}))
    finally:
        b.close()


@needs_page
@pytest.mark.slow
@pytest.mark.parametrize("kv_cache", ["float32", pytest.param(
    "float16", marks=pytest.mark.adapter_feature("shader-f16"))])
def test_stateful_verify_with_hybrid_heads_matches_reference(kv_cache):
    """hybrid-1b's attention heads (16 q / 2 KV heads of 256) and a GDN layer on tiny's
    other shapes: the K = 4 verify graph's 32 q rows a KV head run the flash kernels in
    q-row groups (the generic matmul/softmax chain read the whole cache for each), and its
    logits match the float64 reference's over three steps."""
    from dataclasses import replace

    from backends.pages import StatefulInPlace
    from model.workload import ATTENTION, GDN

    cfg = replace(preset("tiny"), name="tiny-hybrid-heads", layers=(GDN, ATTENTION),
                  q_heads=16, kv_heads=2, head_dim=256, kv_cache=kv_cache)
    wl = Workload.build(cfg)
    cap, depth, k = 40, 8, 4
    tokens = token_stream(cfg, cap, seed=5)
    ref = Reference(cfg, wl.weights, cap)
    ref.prefill(tokens[:depth])
    b = StatefulInPlace(tokens_per_step=k)
    try:
        b.prepare(wl, cap)
        names = [la.kernel.name for la in b.converted.graph._plan.launches
                 if getattr(la, "kernel", None) is not None]
        assert "attention_flash" in names and "softmax" not in names, names
        b.reach_depth(DepthState(tokens=tokens[:depth].copy(), cache=ref.cache_arrays()))
        for j in range(3):
            ids = tokens[depth + j * k:depth + (j + 1) * k]
            got = np.asarray(b.step_tokens(ids), np.float64)
            want = ref.step_tokens(ids)
            rel = np.abs(got - want).max() / np.abs(want).max()
            assert rel < 1e-5, f"{kv_cache} step {j}: max|d|/max|ref| = {rel:.2e}"
            assert np.array_equal(got.argmax(-1), want.argmax(-1))
    finally:
        b.close()


@needs_page
def test_stateful_k_rows_past_capacity_fail_and_leave_the_cache():
    """DESIGN §2 item 4 with K rows: a dispatch whose last row is past the capacity fails
    (OperationError) though its first rows fit, and leaves every pair (KV rows, the
    recurrent state and the conv window) as it was."""
    from backends.webnn import OperationError

    cap, k = 10, 2
    b, clean = page("wgpu:stateful", k, cap), page("wgpu:stateful", k, cap)
    try:
        for j in range(0, 8, k):
            b.step_tokens(TOKENS[j:j + k])
            clean.step_tokens(TOKENS[j:j + k])
        b.position = cap - 1  # rows 9 and 10: the second has no room
        with pytest.raises(OperationError):
            b.step_tokens(TOKENS[8:10])
        b.position = 8
        np.testing.assert_array_equal(b.step_tokens(TOKENS[8:10]), clean.step_tokens(TOKENS[8:10]))
    finally:
        b.close()
        clean.close()


@needs_page
def test_k_token_rows_against_one_token_steps():
    """The rows a K-token step writes (the KV part of issue 31's rollback check): the rows
    before P and after P+K-1 untouched (bitwise), the K new rows and the recurrent states
    those of K one-token steps within float32 rounding. Bitwise equality of the new rows
    is the xfail below."""
    state, _ = reached(16, 4)
    one, many = page("wgpu:stateless", 1, 16), page("wgpu:stateless", 4, 16)
    try:
        for b in (one, many):
            b.reach_depth(state)
        for t in TOKENS[4:8]:
            one.step(int(t))
        many.step_tokens(TOKENS[4:8])
        for name, want in one._host.items():
            got = many._host[name]
            if name.startswith("past_key_values."):
                np.testing.assert_array_equal(got[:, :, :4], state.cache[name][:, :, :4])
                assert not got[:, :, 8:].any(), name
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6, err_msg=name)
    finally:
        one.close()
        many.close()


@needs_page
@pytest.mark.xfail(strict=True, reason="the K-token graph's projections are matmuls of K rows "
                   "and the one-token graph's gemv of one: their sums run in another order, so "
                   "the new rows differ in the last bits (a K-row gemv would make them equal)")
def test_k_token_kv_rows_bitwise_equal_one_token_steps():
    state, _ = reached(16, 4)
    one, many = page("wgpu:stateless", 1, 16), page("wgpu:stateless", 4, 16)
    try:
        for b in (one, many):
            b.reach_depth(state)
        for t in TOKENS[4:8]:
            one.step(int(t))
        many.step_tokens(TOKENS[4:8])
        for name in one._host:
            if name.startswith("past_key_values."):
                np.testing.assert_array_equal(many._host[name], one._host[name], err_msg=name)
    finally:
        one.close()
        many.close()


# -- the K-query attention pattern on the WebNN kernels ----------------------------------------

def k_query_graph(ctx, hk: int, rep: int, k: int, cap: int, d: int, kv: str):
    """The standard export's K-token attention as WebNN ops: q (1, Hkv, K*rep, D); K new
    rows scattered into the (1, Hkv, C, D) caches (float16: cast as written and read), the
    mask of query j seeing rows <= P+j."""
    from backends.webnn import MLGraphBuilder

    b = MLGraphBuilder(ctx)
    g = k * rep
    q = b.input("q", data_type="float32", shape=[1, hk, g, d])
    kc = b.input("kc", data_type=kv, shape=[1, hk, cap, d])
    vc = b.input("vc", data_type=kv, shape=[1, hk, cap, d])
    idx = b.input("idx", data_type="int64", shape=[1, hk, k, 3])
    kn = b.input("kn", data_type="float32", shape=[1, hk, k, d])
    vn = b.input("vn", data_type="float32", shape=[1, hk, k, d])
    rows = b.input("rows", data_type="int64", shape=[1, 1, g, 1])  # each score row's position
    arange = b.constant(data_type="int64", shape=[cap], value=np.arange(cap))
    scale = b.constant(data_type="float32", shape=[1], value=np.float32([1 / np.sqrt(d)]))
    neg = b.constant(data_type="float32", shape=[1], value=np.float32([np.finfo(np.float32).min]))
    if kv == "float16":
        kn, vn = b.cast(kn, "float16"), b.cast(vn, "float16")
    pk, pv = b.scatter_nd(kc, idx, kn), b.scatter_nd(vc, idx, vn)
    kr, vr = (b.cast(x, "float32") if kv == "float16" else x for x in (pk, pv))
    s = b.mul(b.matmul(q, b.transpose(kr, [0, 1, 3, 2])), scale)
    s = b.where(b.lesser_or_equal(arange, rows), s, neg)
    outs = {"y": b.matmul(b.softmax(s, 3), vr), "pk": pk, "pv": pv}
    return b.build(outs), outs


def k_query_oracle(q, kc, vc, kn, vn, p, rep):
    """float64: the K rows written at P.., then query j (rows j*rep .. j*rep+rep-1) over
    rows <= P+j."""
    k = kn.shape[2]
    kc, vc = kc.astype(np.float64).copy(), vc.astype(np.float64).copy()
    kc[:, :, p:p + k], vc[:, :, p:p + k] = kn, vn
    s = np.einsum("bhgd,bhcd->bhgc", q, kc) / np.sqrt(q.shape[-1])
    pos = p + np.arange(k * rep) // rep
    s = np.where(np.arange(kc.shape[2])[None, :] <= pos[:, None], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhgc,bhcd->bhgd", e / e.sum(-1, keepdims=True), vc), kc, vc


@needs_page
@pytest.mark.parametrize("kv", ["float32", pytest.param("float16", marks=pytest.mark.adapter_feature(
    "shader-f16"))])
@pytest.mark.parametrize("hk,rep,k,cap,d,p", [(2, 2, 4, 300, 16, 150), (1, 4, 4, 40, 64, 36),
                                              (2, 1, 2, 517, 32, 0),
                                              (2, 8, 4, 70, 256, 61)])  # hybrid-1b's heads
def test_k_query_attention_fused_matches_float64(ctx, kv, hk, rep, k, cap, d, p):
    """Fresh random q, caches and new rows: the K-query pattern is the two flash launches
    (as one query's), within float32 rounding of float64 (the float16 rows exact as
    rounded: the oracle reads the same rounded rows)."""
    rng = np.random.default_rng(31 + k + p)
    gr, outs = k_query_graph(ctx, hk, rep, k, cap, d, kv)
    names = [la.kernel.name for la in gr._plan.launches if hasattr(la, "kernel")]
    assert [n for n in names if n.startswith("attention")] == ["attention_flash",
                                                               "attention_combine"], names
    host = np.float16 if kv == "float16" else np.float32
    f = {"q": rng.standard_normal((1, hk, k * rep, d)),
         "kc": rng.standard_normal((1, hk, cap, d)).astype(host),
         "vc": rng.standard_normal((1, hk, cap, d)).astype(host),
         "kn": rng.standard_normal((1, hk, k, d)).astype(host).astype(np.float32),
         "vn": rng.standard_normal((1, hk, k, d)).astype(host).astype(np.float32)}
    idx = np.zeros((1, hk, k, 3), np.int64)
    idx[0, :, :, 1] = np.arange(hk)[:, None]
    idx[0, :, :, 2] = p + np.arange(k)
    rows = (p + np.arange(k * rep) // rep).reshape(1, 1, -1, 1)
    types = {"q": "float32", "kc": kv, "vc": kv, "kn": "float32", "vn": "float32"}
    ins = {}
    for n, v in [*f.items(), ("idx", idx), ("rows", rows)]:
        dt = types.get(n, "int64")
        t = ctx.create_tensor(data_type=dt, shape=list(v.shape), writable=True)
        ctx.write_tensor(t, np.asarray(v).astype(dt))
        ins[n] = t
    res = {n: ctx.create_tensor(data_type=o.data_type, shape=o.shape, readable=True)
           for n, o in outs.items()}
    ctx.dispatch(gr, ins, res)
    want, wk, wv = k_query_oracle(f["q"].astype(np.float32).astype(np.float64), f["kc"], f["vc"],
                                  f["kn"], f["vn"], p, rep)
    np.testing.assert_allclose(ctx.read_tensor(res["y"]), want, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(ctx.read_tensor(res["pk"]), np.float64), wk)
    np.testing.assert_array_equal(np.asarray(ctx.read_tensor(res["pv"]), np.float64), wv)
