"""Flash-decoding attention (wgpu_impl/match_attention.py, kernels/attention.py) against a float64
NumPy oracle on fresh random inputs: several splits, a capacity that is not a multiple of
the split, grouped q rows, masks with a finite and an infinite fill value; and the
pattern left alone when the softmax has another reader."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder

RNG = np.random.default_rng(966)


def graph(ctx, heads: int, g: int, cap: int, d: int, fill: float, extra_reader: bool = False):
    b = MLGraphBuilder(ctx)
    q = b.input("q", data_type="float32", shape=[1, heads, g, d])
    k = b.input("k", data_type="float32", shape=[1, heads, cap, d])
    v = b.input("v", data_type="float32", shape=[1, heads, cap, d])
    valid = b.input("valid", data_type="float32", shape=[1, 1, 1, cap])
    scale = b.constant(data_type="float32", shape=[1], value=np.float32([1 / np.sqrt(d)]))
    zero = b.constant(data_type="float32", shape=[1], value=np.float32([0.0]))
    neg = b.constant(data_type="float32", shape=[1], value=np.float32([fill]))
    s = b.mul(b.matmul(q, b.transpose(k, [0, 1, 3, 2])), scale)
    s = b.where(b.greater(valid, zero), s, neg)
    p = b.softmax(s, 3)
    outs = {"y": b.matmul(p, v)}
    if extra_reader:
        outs["p_sum"] = b.reduce_sum(p, axes=[3])
    return b.build(outs), outs


def oracle(q, k, v, valid):
    d = q.shape[-1]
    s = np.einsum("bhgd,bhcd->bhgc", q.astype(np.float64), k) / np.sqrt(d)
    s = np.where(valid > 0, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhgc,bhcd->bhgd", e / e.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("heads,g,cap,d,fill,depth", [
    (2, 4, 300, 16, float(np.finfo(np.float32).min), None),  # 3 splits, the last short
    (1, 1, 7, 6, -np.inf, None),  # one short split; infinite fill; d % 4 != 0
    (2, 4, 300, 16, -np.inf, 5),  # splits whose rows are all masked with -inf
    (2, 4, 300, 16, float(np.finfo(np.float32).min), 5),  # ... with a finite fill
    (3, 8, 4000, 32, -1e9, None),  # 32 splits of 128 rows
    (2, 32, 1000, 64, -np.inf, None),  # 32 q rows a head: a K = 8 verify of 4 q heads a KV head
    (1, 24, 300, 16, float(np.finfo(np.float32).min), 7),
])
def test_flash_matches_oracle(ctx, heads, g, cap, d, fill, depth):
    gr, outs = graph(ctx, heads, g, cap, d, fill)
    names = [la.kernel.name for la in gr._plan.launches]
    assert names == ["attention_flash", "attention_combine"], names
    depth = depth or int(RNG.integers(1, cap))
    feeds = {"q": RNG.standard_normal((1, heads, g, d)), "k": RNG.standard_normal((1, heads, cap, d)),
             "v": RNG.standard_normal((1, heads, cap, d)),
             "valid": (np.arange(cap) < depth).astype(np.float64).reshape(1, 1, 1, cap)}
    got = run(ctx, gr, outs, feeds)["y"]
    np.testing.assert_allclose(got, oracle(**feeds), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("splits", [8, 64])
def test_splits_per_head_option(ctx_with, splits):
    """KernelOptions.attention_splits: fewer or more splits per head (a longer or
    shorter combine), the same result."""
    from backends.webnn.kernels import attention as AT

    ctx = ctx_with(attention_splits=splits)
    cap = 64 * 128 - 50
    assert AT.split_rows(cap, 4, 16, 1 << 14, splits) == (512 if splits == 8 else 128)
    gr, outs = graph(ctx, 1, 4, cap, 16, -np.inf)
    feeds = {"q": RNG.standard_normal((1, 1, 4, 16)), "k": RNG.standard_normal((1, 1, cap, 16)),
             "v": RNG.standard_normal((1, 1, cap, 16)),
             "valid": (np.arange(cap) < cap - 77).astype(np.float64).reshape(1, 1, 1, cap)}
    np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], oracle(**feeds), rtol=2e-5,
                               atol=2e-6)


def test_softmax_read_elsewhere_keeps_generic_kernels(ctx):
    gr, outs = graph(ctx, 2, 4, 40, 8, -1e9, extra_reader=True)
    names = [la.kernel.name for la in gr._plan.launches]
    assert "attention_flash" not in names and "softmax" in names
    feeds = {"q": RNG.standard_normal((1, 2, 4, 8)), "k": RNG.standard_normal((1, 2, 40, 8)),
             "v": RNG.standard_normal((1, 2, 40, 8)), "valid": np.ones((1, 1, 1, 40))}
    out = run(ctx, gr, outs, feeds)
    np.testing.assert_allclose(out["y"], oracle(**feeds), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out["p_sum"], 1.0, rtol=1e-5)


def run(ctx, gr, outs, feeds):
    ins = {}
    for n, v in feeds.items():
        t = ctx.create_tensor(data_type="float32", shape=list(v.shape), writable=True)
        ctx.write_tensor(t, v.astype(np.float32))
        ins[n] = t
    res = {n: ctx.create_tensor(data_type="float32", shape=o.shape, readable=True)
           for n, o in outs.items()}
    ctx.dispatch(gr, ins, res)
    return {n: ctx.read_tensor(t) for n, t in res.items()}


def verify_graph(ctx, heads: int, g: int, k: int, cap: int, d: int):
    """A K-token verify's attention: ``g`` q rows a head, token i's ``g // k`` rows each
    with its own mask row (the positions it may see: causal inside the K), as a real
    K-token decode graph's mask is."""
    b = MLGraphBuilder(ctx)
    q = b.input("q", data_type="float32", shape=[1, heads, g, d])
    kc = b.input("k", data_type="float32", shape=[1, heads, cap, d])
    v = b.input("v", data_type="float32", shape=[1, heads, cap, d])
    valid = b.input("valid", data_type="float32", shape=[1, 1, g, cap])
    scale = b.constant(data_type="float32", shape=[1], value=np.float32([1 / np.sqrt(d)]))
    zero = b.constant(data_type="float32", shape=[1], value=np.float32([0.0]))
    neg = b.constant(data_type="float32", shape=[1], value=np.float32([-np.inf]))
    s = b.mul(b.matmul(q, b.transpose(kc, [0, 1, 3, 2])), scale)
    s = b.softmax(b.where(b.greater(valid, zero), s, neg), 3)
    outs = {"y": b.matmul(s, v)}
    return b.build(outs), outs


@pytest.mark.parametrize("q_rows,per_group", [(None, 2), (1, 1), (5, 4), (16, 12)])
def test_verify_rows_split_into_groups(ctx_with, q_rows, per_group):
    """KernelOptions.attention_q_rows: a K = 3 verify's 12 q rows a head scored 2 (the
    default), 1, 4 or all 12 a workgroup (5 is taken as 4, the largest divisor); each row under its own
    causal mask row, so a group reading another's mask or q rows, or writing another's
    partials, fails against the oracle."""
    from backends.webnn.kernels import attention as AT

    assert AT.q_row_groups(12, q_rows) == per_group
    heads, g, k, cap, d, depth = 2, 12, 3, 700, 16, 650
    ctx = ctx_with(attention_q_rows=q_rows)
    gr, outs = verify_graph(ctx, heads, g, k, cap, d)
    flash = next(la.kernel for la in gr._plan.launches if la.kernel.name == "attention_flash")
    assert flash.groups[2] == g // per_group
    token = np.arange(g) // (g // k)  # the new token each q row belongs to
    valid = (np.arange(cap)[None, :] < depth + token[:, None] + 1).astype(np.float64)
    feeds = {"q": RNG.standard_normal((1, heads, g, d)), "k": RNG.standard_normal((1, heads, cap, d)),
             "v": RNG.standard_normal((1, heads, cap, d)), "valid": valid.reshape(1, 1, g, cap)}
    np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], oracle(**feeds), rtol=2e-5,
                               atol=2e-6)


@pytest.mark.parametrize("heads,g,k,cap,q_rows", [
    (2, 32, 4, 150, None),  # hybrid-1b's K = 4 verify: 8 q heads a KV head, d 256
    (1, 64, 8, 70, 64),  # its K = 8 verify, all 64 rows asked for: groups that fit instead
])
def test_verify_rows_too_many_for_one_workgroup(ctx_with, heads, g, k, cap, q_rows):
    """A verify whose head's q rows at d 256 outgrow workgroup memory together (hybrid-1b:
    16 q / 2 KV heads) still runs the flash kernels, in q-row groups that fit, never the
    generic matmul/softmax chain, and matches the oracle with a causal mask row per row."""
    from backends.webnn.kernels import attention as AT

    d = 256
    ctx = ctx_with(attention_q_rows=q_rows)
    shared = ctx._target.shared_bytes // 4
    assert not AT.fits(g, d, shared) and AT.fits(1, d, shared)
    gr, outs = verify_graph(ctx, heads, g, k, cap, d)
    names = [la.kernel.name for la in gr._plan.launches]
    assert names == ["attention_flash", "attention_combine"], names
    per_group = AT.q_row_groups(g, q_rows, d, shared)
    assert AT.fits(per_group, d, shared)
    assert gr._plan.launches[0].kernel.groups[2] == g // per_group
    depth = cap - k - 9
    token = np.arange(g) // (g // k)
    valid = (np.arange(cap)[None, :] < depth + token[:, None] + 1).astype(np.float64)
    feeds = {"q": RNG.standard_normal((1, heads, g, d)), "k": RNG.standard_normal((1, heads, cap, d)),
             "v": RNG.standard_normal((1, heads, cap, d)), "valid": valid.reshape(1, 1, g, cap)}
    np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], oracle(**feeds), rtol=2e-5,
                               atol=2e-6)


def test_q_row_groups_fit_workgroup_memory():
    """The q rows a workgroup scores shrink to a divisor whose rows fit (one at the least);
    without the memory given, the divisor no larger than the request."""
    from backends.webnn.kernels import attention as AT

    assert AT.q_row_groups(32, 32) == 32
    assert AT.q_row_groups(32, 32, 256, 1 << 12) == 8
    assert AT.q_row_groups(32, 32, 256, 1 << 13) == 16
    assert AT.q_row_groups(32, None, 256, 1 << 12) == AT.GROUP_ROWS
    assert AT.q_row_groups(12, 12, 256, 100) == 1
    for g in (1, 2, 4, 8, 16):
        assert AT.fits(g, 256, 1 << 12) == (g <= 8)


def test_attention_q_rows_option_is_checked():
    from backends.webnn.wgpu_impl.options import KernelOptions

    with pytest.raises(ValueError, match="attention_q_rows = 0; accepted: None or a positive int"):
        KernelOptions(attention_q_rows=0)
    assert KernelOptions.parse(["attention_q_rows=8"]).attention_q_rows == 8


@pytest.mark.parametrize("shared_floats", [1 << 12, 1 << 14])
def test_kernel_layouts_without_and_with_shared_pv(ctx_with, shared_floats, monkeypatch):
    """probs·V summed in workgroup memory (room for it) or by one invocation per
    (row, columns) pair (no room): both match the oracle (8 q rows a workgroup)."""
    from backends.webnn.kernels import attention as AT
    from backends.webnn.wgpu_impl import match_attention as match

    assert AT._layout(8, 64, 1 << 12)[3] is False and AT._layout(8, 64, 1 << 14)[3] is True
    real = AT.flash_decode
    monkeypatch.setattr(match.AT, "flash_decode",
                        lambda *a, **kw: real(*a[:5], shared_floats, *a[6:], **kw))
    ctx = ctx_with(attention_q_rows=8)
    gr, outs = graph(ctx, 2, 8, 300, 64, -1e9)
    feeds = {"q": RNG.standard_normal((1, 2, 8, 64)), "k": RNG.standard_normal((1, 2, 300, 64)),
             "v": RNG.standard_normal((1, 2, 300, 64)),
             "valid": (np.arange(300) < 250).astype(np.float64).reshape(1, 1, 1, 300)}
    np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], oracle(**feeds), rtol=2e-5, atol=2e-6)


def test_query_chain_computed_by_the_attention_kernel(ctx):
    """q = q_in * c + rotate(q_in) (a RoPE-like chain read only by q·Kᵀ) is computed by
    each flash workgroup: still two launches, same result."""
    gr, outs = rope_graph(ctx)
    assert [la.kernel.name for la in gr._plan.launches] == ["attention_flash", "attention_combine"]
    feeds, want = rope_feeds_and_oracle()
    np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], want, rtol=2e-5, atol=2e-6)


ROPE_SHAPE = (2, 4, 96, 8)  # heads, q rows, capacity, head dim


def rope_graph(ctx):
    """Attention whose q is ``q_in * c + rotate(q_in)`` (a RoPE-like chain read only by q·Kᵀ)."""
    heads, g, cap, d = ROPE_SHAPE
    b = MLGraphBuilder(ctx)
    qin = b.input("qin", data_type="float32", shape=[1, heads, g, d])
    c = b.input("c", data_type="float32", shape=[1, 1, 1, d])
    k = b.input("k", data_type="float32", shape=[1, heads, cap, d])
    v = b.input("v", data_type="float32", shape=[1, heads, cap, d])
    rot = b.concat([b.neg(b.slice(qin, [0, 0, 0, d // 2], [1, heads, g, d // 2])),
                    b.slice(qin, [0, 0, 0, 0], [1, heads, g, d // 2])], 3)
    q = b.add(b.mul(qin, c), rot)
    p = b.softmax(b.matmul(q, b.transpose(k, [0, 1, 3, 2])), 3)
    outs = {"y": b.matmul(p, v)}
    return b.build(outs), outs


def rope_feeds_and_oracle():
    """Fresh random inputs of ``rope_graph`` and its float64 output."""
    heads, g, cap, d = ROPE_SHAPE
    feeds = {"qin": RNG.standard_normal((1, heads, g, d)), "c": RNG.standard_normal((1, 1, 1, d)),
             "k": RNG.standard_normal((1, heads, cap, d)), "v": RNG.standard_normal((1, heads, cap, d))}
    q64 = feeds["qin"] * feeds["c"] + np.concatenate([-feeds["qin"][..., d // 2:],
                                                      feeds["qin"][..., :d // 2]], -1)
    s = np.einsum("bhgd,bhcd->bhgc", q64, feeds["k"])
    e = np.exp(s - s.max(-1, keepdims=True))
    return feeds, np.einsum("bhgc,bhcd->bhgd", e / e.sum(-1, keepdims=True), feeds["v"])


# -- float16 KV caches: the row write and flash-decoding read float16 directly ----------------


def f16_cache_graph(ctx, heads, g, cap, d, stateful):
    """A decode attention over float16 caches as the standard export spells it: the new
    rows cast to float16 and scattered in, the caches cast to float32 where read."""
    from backends.webnn import MLKVCachePair

    b = MLGraphBuilder(ctx)
    q = b.input("q", data_type="float32", shape=[1, heads, g, d])
    kc = b.input("kc", data_type="float16", shape=[1, heads, cap, d])
    vc = b.input("vc", data_type="float16", shape=[1, heads, cap, d])
    idx = b.input("idx", data_type="int64", shape=[1, heads, 1, 3])
    kn = b.input("kn", data_type="float32", shape=[1, heads, 1, d])
    vn = b.input("vn", data_type="float32", shape=[1, heads, 1, d])
    valid = b.input("valid", data_type="float32", shape=[1, 1, 1, cap])
    scale = b.constant(data_type="float32", shape=[1], value=np.float32([1 / np.sqrt(d)]))
    zero = b.constant(data_type="float32", shape=[1], value=np.float32([0.0]))
    neg = b.constant(data_type="float32", shape=[1], value=np.float32([-np.inf]))
    pk = b.scatter_nd(kc, idx, b.cast(kn, "float16"))
    pv = b.scatter_nd(vc, idx, b.cast(vn, "float16"))
    kt = b.transpose(b.cast(pk, "float32"), [0, 1, 3, 2])
    s = b.where(b.greater(valid, zero), b.mul(b.matmul(q, kt), scale), neg)
    outs = {"y": b.matmul(b.softmax(s, 3), b.cast(pv, "float32")), "pk": pk, "pv": pv}
    pairs = [MLKVCachePair(input="kc", output="pk"), MLKVCachePair(input="vc", output="pv")]
    if stateful:
        return b.build(outs, use_stateful=True, kv_cache_pairs=pairs), outs
    return b.build(outs), outs


def _tensor(ctx, dtype, value, **kw):
    t = ctx.create_tensor(data_type=dtype, shape=list(np.shape(value)), writable=True, **kw)
    ctx.write_tensor(t, np.asarray(value).astype(dtype))
    return t


def _seed_state(ctx, gr, name, value):
    """Tests only (as ``_peek_state`` reads it): a stateful graph's hidden cache set to
    ``value``, so attention reads random rows rather than the zeros it starts with."""
    pp = next(p for p in gr._plan.pairs if p.pair.input == name)
    buf = ctx._resolve(gr, ("state", pp.index, "cur"), {}, gr._parity)
    ctx._queue.write_buffer(buf, 0, np.ascontiguousarray(value).tobytes())
    np.testing.assert_array_equal(ctx._peek_state(gr, name), value)


#: (heads, q rows, capacity, head dim) of the float16-cache tests, and how flash-decoding
#: loads the cache under KernelOptions.f16_loads = "wide" (the default)
F16_SHAPES = [
    ((2, 4, 300, 16), "wide"),  # 2 words a row, probs·V through workgroup memory
    ((2, 4, 300, 64), "wide"),  # llama-1b's head: 8 words a row
    ((2, 8, 300, 256), "wide"),  # hybrid-1b's attention head (8 q rows a kv head)
    ((1, 3, 70, 24), "wide"),  # 3 words a row: probs·V without workgroup memory
    ((2, 4, 150, 20), "vec4"),  # d % 8 != 0: vec4<f16> loads
    ((1, 3, 70, 6), "f16"),  # d % 4 != 0: f16 loads
]


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("f16_loads", ["wide", "vec4"])
@pytest.mark.parametrize("stateful", [True, False])
@pytest.mark.parametrize("shape", [s for s, _ in F16_SHAPES], ids=lambda s: "x".join(map(str, s)))
def test_f16_cache_row_write_and_flash_read_float16(ctx, ctx_with, stateful, shape, f16_loads):
    """Against float64 NumPy with the rows rounded to float16, for both ways of loading
    the cache (KernelOptions.f16_loads): the stateful graph over three dispatches into its
    hidden cache (seeded random, rows written at random positions), the stateless one over
    a random page-owned cache, whose present must hold exactly the float16 rows."""
    ctx = ctx_with(f16_loads=f16_loads)
    heads, g, cap, d = shape
    gr, outs = f16_cache_graph(ctx, heads, g, cap, d, stateful)
    names = [la.kernel.name for la in gr._plan.launches if hasattr(la, "kernel")]
    # fused casts: no launch widens a cache to float32 (the row cast is in the row write)
    assert not [n for n in names if "cast" in n], names
    assert names.count("attention_flash") == 1 and names.count("scatter_nd") == 1, names
    # stateful: + the capacity check; stateless: + a copy of each cache into its present
    assert len(names) == (4 if stateful else 5), names
    kc, vc = RNG.standard_normal((2, 1, heads, cap, d)).astype(np.float16)
    if stateful:
        _seed_state(ctx, gr, "kc", kc)
        _seed_state(ctx, gr, "vc", vc)
    want_k, want_v = kc.astype(np.float64), vc.astype(np.float64)
    for depth in RNG.choice(cap, 3 if stateful else 1, replace=False):
        q, kn, vn = (RNG.standard_normal(s) for s in ((1, heads, g, d), (1, heads, 1, d),
                                                      (1, heads, 1, d)))
        idx = np.zeros((1, heads, 1, 3), np.int64)
        idx[0, :, 0, 1], idx[0, :, 0, 2] = np.arange(heads), depth
        valid = (RNG.random(cap) < 0.7) | (np.arange(cap) == depth)
        valid = valid.astype(np.float32).reshape(1, 1, 1, cap)
        ins = {n: _tensor(ctx, dt, v) for n, dt, v in (
            ("q", "float32", q), ("idx", "int64", idx), ("kn", "float32", kn),
            ("vn", "float32", vn), ("valid", "float32", valid))}
        res = {"y": ctx.create_tensor(data_type="float32", shape=[1, heads, g, d], readable=True)}
        if not stateful:
            ins["kc"], ins["vc"] = _tensor(ctx, "float16", kc), _tensor(ctx, "float16", vc)
            res["pk"], res["pv"] = (ctx.create_tensor(data_type="float16", readable=True,
                                                      shape=[1, heads, cap, d]) for _ in "kv")
        ctx.dispatch(gr, ins, res)
        out = {n: ctx.read_tensor(t) for n, t in res.items()}
        if stateful:
            got_k, got_v = ctx._peek_state(gr, "kc"), ctx._peek_state(gr, "vc")
        else:
            assert out["pk"].dtype == np.float16 and out["pv"].dtype == np.float16
            got_k, got_v = out["pk"], out["pv"]
        for want, got, row in ((want_k, got_k, kn), (want_v, got_v, vn)):
            # the rest of the cache is untouched, byte for byte
            others = np.arange(cap) != depth
            np.testing.assert_array_equal(got[:, :, others], want[:, :, others].astype(np.float16))
            _take_written_row(want, got, row, depth)
        np.testing.assert_allclose(out["y"], oracle(q, want_k, want_v, valid), rtol=2e-5,
                                   atol=2e-6)


def _take_written_row(want: np.ndarray, got: np.ndarray, row: np.ndarray, depth: int) -> None:
    """The cache row the graph wrote at ``depth`` is the float32 input ``row`` rounded to a
    float16 neighbour (WGSL leaves the rounding mode to the implementation: either neighbour
    is conformant); the oracle's cache ``want`` takes that row. Rounding the float64 source
    straight to float16 instead differs from float64 -> float32 -> float16 in about 6 of
    100000 elements, enough to fail a seeded run now and then."""
    _assert_f16_rounding(got[0, :, depth], row[0, :, 0].astype(np.float32))
    want[:, :, depth] = got[:, :, depth]


def _assert_f16_rounding(got: np.ndarray, x32: np.ndarray) -> None:
    """Each float16 in `got` is one of the two float16 neighbours of its float32 value
    (the one value where it is exactly representable), as the WebGPU CTS's
    correctlyRoundedF16 accepts."""
    near = x32.astype(np.float16)
    toward = np.where(near.astype(np.float32) < x32, np.inf, -np.inf).astype(np.float16)
    other = np.where(near.astype(np.float32) == x32, near, np.nextafter(near, toward))
    ok = (got == near) | (got == other)
    assert ok.all(), (got[~ok], x32[~ok])


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("f16_loads", [None, "wide", "vec4"])
@pytest.mark.parametrize("shape,how", F16_SHAPES, ids=lambda x: "x".join(map(str, x))
                         if isinstance(x, tuple) else x)
def test_f16_cache_loads_as_the_option_says(ctx_with, shape, how, f16_loads):
    """The generated pass 1 loads a float16 cache as KernelOptions.f16_loads asks: by default
    16-byte words of 8 halves (d/8 loads a K row, unpacked), so a silent fallback to the
    narrower loads fails here; "vec4" (or d % 8 != 0) keeps vec4<f16>; d % 4 != 0: f16.
    The byte count is the same either way: 2 bytes an element."""
    from backends.webnn.kernels import attention as AT

    ctx = ctx_with(f16_loads=f16_loads)
    heads, g, cap, d = shape
    gr, _ = f16_cache_graph(ctx, heads, g, cap, d, True)
    k1 = next(la.kernel for la in gr._plan.launches
              if hasattr(la, "kernel") and la.kernel.name == "attention_flash")
    want = how if f16_loads != "vec4" or how == "f16" else "vec4"
    decl = {"wide": "array<vec4<u32>>", "vec4": "array<vec4<f16>>", "f16": "array<f16>"}[want]
    for name in ("k", "v"):
        assert f"var<storage, read> {name}: {decl};" in k1.wgsl, (want, k1.wgsl[:600])
    words = {"wide": d // 8, "vec4": d // 4, "f16": d}[want]
    assert f"e0 < {words}u;" in k1.wgsl  # the K row's loads
    assert ("unpack2x16float" in k1.wgsl) == (want == "wide")
    assert ("f16" in k1.wgsl.replace("unpack2x16float", "")) == (want != "wide")
    shared = ctx._target.shared_bytes // 4
    wide, narrow = (AT.flash_decode(heads, g, cap, d, None, shared, kv="f16", f16_loads=x)[0]
                    for x in AT.F16_LOADS)
    assert wide.bytes == narrow.bytes
    f32 = AT.flash_decode(heads, g, cap, d, None, shared)[0]
    # K and V: 2 bytes less each, read once a q-row group
    assert f32.bytes - wide.bytes == 2 * heads * cap * d * 2 * (g // AT.q_row_groups(g))


def test_f16_loads_option_is_checked():
    from backends.webnn.kernels import attention as AT

    with pytest.raises(ValueError, match="f16_loads"):
        AT.flash_decode(1, 4, 300, 64, None, 1 << 14, kv="f16", f16_loads="vec8")


# -- one launch (KernelOptions.attention = "flash1"): the combine folded into the last split --


ONE_SHAPES = [
    (2, 4, 300, 16),  # 2 halves-words a row (float16), 4 floats-words (float32)
    (2, 4, 517, 64),  # llama-1b's head, capacity not a multiple of any split
    (1, 8, 2053, 32),  # 8 q rows a kv head
    (2, 4, 4099, 64),  # 8 rows an invocation, a last split of 3 rows
]


def _one_names(gr):
    return [la.kernel.name for la in gr._plan.launches if hasattr(la, "kernel")]


@pytest.mark.parametrize("shape", ONE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fill", [-np.inf, float(np.finfo(np.float32).min)])
def test_one_launch_matches_oracle_float32_cache(ctx_with, shape, fill):
    """One launch, float32 caches, three dispatches of fresh random inputs (the head
    counters must come back to zero after each), masks leaving whole splits empty."""
    ctx = ctx_with(attention="flash1")
    heads, g, cap, d = shape
    gr, outs = graph(ctx, heads, g, cap, d, fill)
    assert _one_names(gr) == ["attention_flash1"]
    _three_depths_match(ctx, gr, outs, shape, 3)


def _three_depths_match(ctx, gr, outs, shape, second: int) -> None:
    """Three dispatches of fresh random inputs (a one-launch kernel's counters must come
    back to zero after each), masks valid up to a random depth, ``second``, the last row
    (with random holes), leaving whole splits empty: each against the float64 oracle."""
    heads, g, cap, d = shape
    for depth in (int(RNG.integers(1, cap)), second, cap - 1):
        feeds = {"q": RNG.standard_normal((1, heads, g, d)),
                 "k": RNG.standard_normal((1, heads, cap, d)),
                 "v": RNG.standard_normal((1, heads, cap, d)),
                 "valid": ((np.arange(cap) < depth) & (RNG.random(cap) < 0.8)
                           | (np.arange(cap) == 0)).astype(np.float64).reshape(1, 1, 1, cap)}
        np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], oracle(**feeds), rtol=2e-5,
                                   atol=2e-6)


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("cap", [512, 2048 + 37, 8192 - 5, 16384 - 3])
def test_one_launch_float16_cache_512_to_16384_rows(ctx_with, cap):
    """llama-1b's head over a float16 cache of 512 to 16384 rows: the stateful graph's
    row write and one-launch read, three positions that are no multiple of any tile,
    against float64 NumPy with the rows rounded to float16."""
    ctx = ctx_with(attention="flash1")
    names = _check_f16_stateful(ctx, 2, 4, cap, 64)
    assert names.count("attention_flash1") == 1 and "attention_combine" not in names, names


def _check_f16_stateful(ctx, heads, g, cap, d) -> list[str]:
    """The stateful float16-cache graph over its hidden caches (seeded random) at three
    positions that are no multiple of any tile (the last row, a random one, the second),
    against float64 NumPy with the rows rounded to float16; its launches' names."""
    gr, outs = f16_cache_graph(ctx, heads, g, cap, d, True)
    kc, vc = RNG.standard_normal((2, 1, heads, cap, d)).astype(np.float16)
    _seed_state(ctx, gr, "kc", kc)
    _seed_state(ctx, gr, "vc", vc)
    want_k, want_v = kc.astype(np.float64), vc.astype(np.float64)
    for depth in (cap - 1, int(RNG.integers(1, cap)), 1):
        q, kn, vn = (RNG.standard_normal(s) for s in ((1, heads, g, d), (1, heads, 1, d),
                                                      (1, heads, 1, d)))
        idx = np.zeros((1, heads, 1, 3), np.int64)
        idx[0, :, 0, 1], idx[0, :, 0, 2] = np.arange(heads), depth
        valid = (np.arange(cap) <= depth).astype(np.float32).reshape(1, 1, 1, cap)
        ins = {n: _tensor(ctx, dt, v) for n, dt, v in (
            ("q", "float32", q), ("idx", "int64", idx), ("kn", "float32", kn),
            ("vn", "float32", vn), ("valid", "float32", valid))}
        res = {"y": ctx.create_tensor(data_type="float32", shape=[1, heads, g, d], readable=True)}
        ctx.dispatch(gr, ins, res)
        _take_written_row(want_k, ctx._peek_state(gr, "kc"), kn, depth)
        _take_written_row(want_v, ctx._peek_state(gr, "vc"), vn, depth)
        np.testing.assert_allclose(ctx.read_tensor(res["y"]), oracle(q, want_k, want_v, valid),
                                   rtol=2e-5, atol=2e-6)
    return _one_names(gr)


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("shared_floats", [1 << 12, 1 << 13, 1 << 16])
def test_one_launch_rounds_and_fallback_by_workgroup_memory(ctx_with, shared_floats, monkeypatch):
    """The partial dots in 1 to 8 rounds as workgroup memory allows, all matching the
    oracle; where nothing fits, the two-launch kernels."""
    from backends.webnn.kernels import attention as AT
    from backends.webnn.wgpu_impl import match_attention as match

    heads, g, cap, d = 2, 4, 4099, 64
    plan = AT.one_launch_plan(g, cap, d, "f16", shared_floats)
    real = AT.flash_decode_one
    monkeypatch.setattr(match.AT, "flash_decode_one",
                        lambda *a, **kw: real(*a[:5], shared_floats, *a[6:], **kw))
    ctx = ctx_with(attention="flash1")
    gr, outs = f16_cache_graph(ctx, heads, g, cap, d, False)
    names = _one_names(gr)
    if plan is None:
        assert "attention_combine" in names, names
    else:
        assert plan[1] in (1, 2, 4, 8) and plan[2] in (1, 2, 4, 8) and plan[2] <= plan[1], plan
        assert "attention_flash1" in names, names
    kc, vc = RNG.standard_normal((2, 1, heads, cap, d)).astype(np.float16)
    q, kn, vn = (RNG.standard_normal(s) for s in ((1, heads, g, d), (1, heads, 1, d),
                                                  (1, heads, 1, d)))
    depth = 3001
    idx = np.zeros((1, heads, 1, 3), np.int64)
    idx[0, :, 0, 1], idx[0, :, 0, 2] = np.arange(heads), depth
    valid = (np.arange(cap) <= depth).astype(np.float32).reshape(1, 1, 1, cap)
    ins = {n: _tensor(ctx, dt, v) for n, dt, v in (
        ("q", "float32", q), ("idx", "int64", idx), ("kn", "float32", kn), ("vn", "float32", vn),
        ("valid", "float32", valid), ("kc", "float16", kc), ("vc", "float16", vc))}
    res = {"y": ctx.create_tensor(data_type="float32", shape=[1, heads, g, d], readable=True)}
    for n in ("pk", "pv"):
        res[n] = ctx.create_tensor(data_type="float16", shape=[1, heads, cap, d], readable=True)
    ctx.dispatch(gr, ins, res)
    want_k, want_v = kc.astype(np.float64), vc.astype(np.float64)
    _take_written_row(want_k, ctx.read_tensor(res["pk"]), kn, depth)
    _take_written_row(want_v, ctx.read_tensor(res["pv"]), vn, depth)
    np.testing.assert_allclose(ctx.read_tensor(res["y"]), oracle(q, want_k, want_v, valid),
                               rtol=2e-5, atol=2e-6)


def test_one_launch_query_chain_and_layouts(ctx_with):
    """q computed inside the one-launch kernel (a RoPE-like chain); the plan's splits:
    more, shorter splits on short caches, at most 8 rows an invocation; head dims that
    are no power-of-two count of 16-byte words keep the two-launch kernels."""
    from backends.webnn.kernels import attention as AT

    assert AT.one_launch_plan(4, 512, 64, "f16", 1 << 14) == (8, 1, 1, 32)
    assert AT.one_launch_plan(4, 8192, 64, "f16", 1 << 14) == (8, 8, 8, 64)
    assert AT.one_launch_plan(4, 16384, 64, "f16", 1 << 16) == (8, 8, 8, 128)
    assert AT.one_launch_plan(4, 300, 24, "f16", 1 << 14) is None  # 3 words a row
    assert AT.one_launch_plan(4, 300, 6, "f32", 1 << 14) is None
    ctx = ctx_with(attention="flash1")
    gr, outs = rope_graph(ctx)
    assert _one_names(gr) == ["attention_flash1"]
    feeds, want = rope_feeds_and_oracle()
    np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], want, rtol=2e-5, atol=2e-6)


# -- lane-groups and an online softmax (KernelOptions.attention = "lanes", "lanes1") ----------


#: (heads, q rows, capacity, head dim), variant, with the adapter's subgroup shuffles, the
#: mask's fill: 16-byte words a row of a float32 cache 4, 1 and 16 (more than a lavapipe
#: subgroup: through workgroup memory either way)
LANE_F32 = [
    ((2, 4, 300, 16), "lanes1", True, -np.inf),
    ((1, 1, 37, 4), "lanes1_u2", True, float(np.finfo(np.float32).min)),
    ((2, 4, 517, 64), "lanes_u8", False, float(np.finfo(np.float32).min)),
]


def _lanes_ctx(ctx_with, how, shuffle, subgroup_size, monkeypatch):
    """A context for ``how`` whose kernels shuffle across the adapter's own fixed subgroup
    width where ``shuffle`` (and it has one), else sum partial dots in workgroup memory."""
    import dataclasses

    sub = subgroup_size if shuffle and subgroup_size in (8, 16, 32, 64) else None
    ctx = ctx_with(attention=how)
    monkeypatch.setattr(ctx, "_target", dataclasses.replace(ctx._target, subgroup=sub))
    return ctx, sub


def _lanes_ids(x):
    return "x".join(map(str, x)) if isinstance(x, tuple) else str(x)


@pytest.mark.parametrize("shape,how,shuffle,fill", LANE_F32, ids=_lanes_ids)
def test_lanes_match_oracle_float32_cache(ctx_with, subgroup_size, monkeypatch, shape, how,
                                          shuffle, fill):
    """Float32 caches, masks leaving whole splits empty, three dispatches of fresh random
    inputs (the one-launch counters come back to zero)."""
    heads, g, cap, d = shape
    ctx, sub = _lanes_ctx(ctx_with, how, shuffle, subgroup_size, monkeypatch)
    gr, outs = graph(ctx, heads, g, cap, d, fill)
    names = _one_names(gr)
    assert names == (["attention_lanes", "attention_combine_rows"] if how.startswith("lanes_")
                     or how == "lanes" else ["attention_lanes1"]), names
    shuffles = sub is not None and d // 4 <= sub
    assert ("subgroupShuffleXor" in gr._plan.launches[0].kernel.wgsl) == shuffles
    _three_depths_match(ctx, gr, outs, shape, 2)


#: (heads, q rows, capacity, head dim), variant, with the adapter's subgroup shuffles
LANE_F16 = [
    ((2, 4, 8192 - 5, 64), "lanes", True),  # llama-1b's head: 8 lanes a row, shuffles
    ((2, 4, 8192 - 5, 64), "lanes1", True),
    ((2, 16, 8192 - 5, 64), "lanes", True),  # a K = 4 verify's 16 rows a kv head
    ((1, 1, 300, 64), "lanes1", False),  # one q row a kv head, through workgroup memory
]


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("shape,how,shuffle", LANE_F16, ids=_lanes_ids)
def test_lanes_float16_cache(ctx_with, subgroup_size, monkeypatch, shape, how, shuffle):
    """Float16 caches read as 16-byte words of 8 halves by the lane-group kernels, in the
    stateful graph, against float64 NumPy."""
    ctx, _ = _lanes_ctx(ctx_with, how, shuffle, subgroup_size, monkeypatch)
    heads, g, cap, d = shape
    names = _check_f16_stateful(ctx, heads, g, cap, d)
    assert names.count(f"attention_{how}") == 1, names
    assert ("attention_combine_rows" in names) == (how == "lanes"), names


@pytest.mark.adapter_feature("shader-f16")
def test_lanes_not_applicable_keeps_flash(ctx_with):
    """3 words a row (d = 24 over a float16 cache): the "flash" kernels."""
    gr, _ = f16_cache_graph(ctx_with(attention="lanes"), 1, 3, 70, 24, True)
    assert _one_names(gr).count("attention_flash") == 1, _one_names(gr)


def test_lanes_query_chain(ctx_with):
    """q computed by each invocation for its own columns (a RoPE-like chain)."""
    ctx = ctx_with(attention="lanes")
    gr, outs = rope_graph(ctx)
    assert _one_names(gr) == ["attention_lanes", "attention_combine_rows"]
    feeds, want = rope_feeds_and_oracle()
    np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], want, rtol=2e-5, atol=2e-6)


def test_lanes_plan_and_knob():
    """llama-1b's head on a GPU: 8 lanes a row, 4 rows loaded at once, 128 rows a split
    at 8192 (64 splits), shuffles within a 32-wide subgroup; a bad knob value is refused."""
    from backends.webnn.kernels import attention_lanes as AL
    from backends.webnn.wgpu_impl.options import KernelOptions

    plan = AL.lanes_plan(4, 8192, 64, "f16", 12288, subgroup=32)
    assert (plan.lw, plan.unroll, plan.rows, plan.splits, plan.sub) == (8, 4, 128, 64, 32)
    assert AL.lanes_plan(4, 8192, 64, "f16", 12288, splits=32, subgroup=32).rows == 256
    assert AL.lanes_plan(4, 300, 24, "f16", 12288) is None
    assert AL.lanes_plan(4, 300, 64, "f32", 12288, subgroup=8).sub is None  # 16 lanes a row
    assert AL.lanes_plan(4, 8192, 64, "f16", 12288, subgroup=32, unroll=8).rows == 128
    assert AL.lanes_plan(4, 300, 64, "f16", 12288, unroll=8).unroll == 8
    assert AL.lanes_plan(4, 1 << 20, 64, "f16", 12288, splits=1 << 12, fold=True) is None
    assert KernelOptions(attention="lanes1_u8").attention_lanes() == (True, 8)
    assert KernelOptions(attention="flash").attention_lanes() is None
    for bad in ("lanes2", "lanes_u3", "lanes_8"):
        with pytest.raises(ValueError, match=r"KernelOptions.attention = .*lanes"):
            KernelOptions(attention=bad)
