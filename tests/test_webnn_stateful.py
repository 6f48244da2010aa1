"""The stateful-graph proposal (DESIGN §2, §3): behaviours 1-6 and the decided open points."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn import (
    InvalidStateError,
    MLGraphBuilder,
    MLKVCachePair,
    OperationError,
    ml,
)
from backends.webnn.wgpu_impl.options import KernelOptions

D = 4  # head dim
H = 2  # heads
PAIRS = [MLKVCachePair(input="past_k", output="present_k"),
         MLKVCachePair(input="past_v", output="present_v")]
RNG = np.random.default_rng(7)
WQ, WK, WV = (RNG.standard_normal((D, H * D)).astype(np.float32) * 0.5 for _ in range(3))


@pytest.fixture(scope="module")
def plain_ctx():
    c = ml.create_context(state_support=False)
    yield c
    c.destroy()


def decoder(ctx, cap: int, *, read_past_after: bool = False):
    """A toy attention decoder step: scatter the new k/v row at ``pos`` into a
    (1, H, cap, D) cache, attend over positions <= pos. Indices are computed in the graph
    from the ``pos`` input. ``read_past_after`` adds a reader of the old cache that
    depends on the new one, which forbids in-place (two buffers)."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, D])
    pos = b.input("pos", data_type="int32", shape=[1, 1, 1, 1])
    past_k = b.input("past_k", data_type="float32", shape=[1, H, cap, D])
    past_v = b.input("past_v", data_type="float32", shape=[1, H, cap, D])

    def const(a, dt="float32"):
        a = np.asarray(a)
        return b.constant(data_type=dt, shape=list(a.shape), value=a)

    base = const(np.array([[0, h, 0] for h in range(H)], np.int32).reshape(1, H, 1, 3), "int32")
    sel = const(np.array([0, 0, 1], np.int32), "int32")
    idx = b.add(base, b.mul(pos, sel))  # (1, H, 1, 3): (0, h, pos)
    q = b.reshape(b.matmul(x, const(WQ)), [1, H, 1, D])
    k = b.reshape(b.matmul(x, const(WK)), [1, H, 1, D])
    v = b.reshape(b.matmul(x, const(WV)), [1, H, 1, D])
    present_k = b.scatter_nd(past_k, idx, k)
    present_v = b.scatter_nd(past_v, idx, v)
    scores = b.matmul(q, b.transpose(present_k, [0, 1, 3, 2]))  # (1, H, 1, cap)
    valid = b.lesser_or_equal(const(np.arange(cap, dtype=np.int32), "int32"),
                              b.reshape(pos, [1]))
    scores = b.where(valid, scores, const(np.float32([-1e9])))
    out = b.matmul(b.softmax(scores, 3), present_v)  # (1, H, 1, D)
    y = b.reshape(out, [1, H * D])
    if read_past_after:
        y = b.add(y, b.reshape(b.reduce_sum(b.sub(present_k, past_k), axes=[2]), [1, H * D]))
    return b, {"y": y, "present_k": present_k, "present_v": present_v}


def decoder_ref(xs, cap, read_past_after=False):
    kc = np.zeros((1, H, cap, D), np.float64)
    vc = np.zeros_like(kc)
    ys = []
    for p, x in enumerate(xs):
        q, k, v = (x @ w for w in (WQ, WK, WV))
        old_k = kc.copy()
        kc[0, :, p] = k.reshape(H, D)
        vc[0, :, p] = v.reshape(H, D)
        s = np.einsum("hd,hcd->hc", q.reshape(H, D), kc[0])
        s[:, p + 1:] = -1e9
        e = np.exp(s - s.max(-1, keepdims=True))
        y = np.einsum("hc,hcd->hd", e / e.sum(-1, keepdims=True), vc[0]).reshape(1, H * D)
        if read_past_after:
            y = y + (kc - old_k).sum(axis=2).reshape(1, H * D)
        ys.append(y)
    return ys


class Page:
    """What a page does: tensors for x, pos, y; steps through the graph."""

    def __init__(self, ctx, graph, cap):
        self.ctx, self.g, self.cap = ctx, graph, cap
        self.x = ctx.create_tensor(data_type="float32", shape=[1, D], writable=True)
        self.pos = ctx.create_tensor(data_type="int32", shape=[1, 1, 1, 1], writable=True)
        self.y = ctx.create_tensor(data_type="float32", shape=[1, H * D], readable=True)
        self.caches = None
        if not graph.is_stateful:  # the page binds the pairs itself (ping-pong)
            mk = [ctx.create_tensor(data_type="float32", shape=[1, H, cap, D]) for _ in range(4)]
            self.caches = [mk[0:2], mk[2:4]]

    def step(self, x, p, read=True):
        self.ctx.write_tensor(self.x, x)
        self.ctx.write_tensor(self.pos, np.array(p, np.int32))
        ins = {"x": self.x, "pos": self.pos}
        outs = {"y": self.y}
        if self.caches is not None:
            (pk, pv), (nk, nv) = self.caches
            ins.update(past_k=pk, past_v=pv)
            outs.update(present_k=nk, present_v=nv)
        self.ctx.dispatch(self.g, ins, outs)
        if self.caches is not None:
            self.caches.reverse()
        return self.ctx.read_tensor(self.y) if read else None


def xs(n):
    return [RNG.standard_normal((1, D)).astype(np.float32) for _ in range(n)]


# -- behaviour 1: a request, and the fallback --------------------------------------------

def test_stateful_granted_and_correct(ctx):
    b, outs = decoder(ctx, 6)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    assert g.is_stateful
    assert g.in_place == {"past_k": True, "past_v": True}
    assert set(g.inputs) == {"x", "pos"} and set(g.outputs) == {"y"}
    page = Page(ctx, g, 6)
    inputs = xs(5)
    for p, (x, want) in enumerate(zip(inputs, decoder_ref(inputs, 6), strict=False)):
        np.testing.assert_allclose(page.step(x, p), want, atol=1e-5)


def test_fallback_without_state_support(plain_ctx, ctx):
    """A backend without state support builds the same graph stateless; the page binds
    the pairs; the results are the stateful ones."""
    b, outs = decoder(plain_ctx, 6)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    assert not g.is_stateful
    assert g.in_place == {}
    assert {"past_k", "past_v"} <= set(g.inputs)
    assert {"present_k", "present_v"} <= set(g.outputs)
    page = Page(plain_ctx, g, 6)
    b2, outs2 = decoder(ctx, 6)
    sp = Page(ctx, b2.build(outs2, use_stateful=True, kv_cache_pairs=PAIRS), 6)
    for p, x in enumerate(xs(5)):
        np.testing.assert_array_equal(page.step(x, p), sp.step(x, p))
    with pytest.raises(InvalidStateError):
        plain_ctx.reset_kv_cache(g)


# -- behaviour 2: pairs leave the interface ----------------------------------------------

def test_binding_a_pair_is_type_error(ctx):
    b, outs = decoder(ctx, 4)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    page = Page(ctx, g, 4)
    cache = ctx.create_tensor(data_type="float32", shape=[1, H, 4, D])
    with pytest.raises(TypeError, match="KV-cache pairs"):
        ctx.dispatch(g, {"x": page.x, "pos": page.pos, "past_k": cache}, {"y": page.y})
    with pytest.raises(TypeError, match="KV-cache pairs"):
        ctx.dispatch(g, {"x": page.x, "pos": page.pos}, {"y": page.y, "present_k": cache})
    ctx.dispatch(g, {"x": page.x, "pos": page.pos}, {"y": page.y})  # not required


# -- behaviour 3: the graph owns the cache -----------------------------------------------

def test_cache_starts_zero_updates_in_order_and_reset_reproduces(ctx):
    b, outs = decoder(ctx, 5)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    np.testing.assert_array_equal(ctx._peek_state(g, "past_k"), 0)
    page = Page(ctx, g, 5)
    inputs = xs(4)
    first = [page.step(x, p) for p, x in enumerate(inputs)]
    k = ctx._peek_state(g, "past_k")
    assert np.all(k[0, :, :4] != 0) and np.all(k[0, :, 4] == 0)
    ctx.reset_kv_cache(g)
    np.testing.assert_array_equal(ctx._peek_state(g, "past_k"), 0)
    again = [page.step(x, p) for p, x in enumerate(inputs)]
    for a, c in zip(first, again, strict=False):
        np.testing.assert_array_equal(a, c)  # bit for bit


def test_two_graphs_never_share(ctx):
    """Two graphs built from the same operands each have their own cache (so a prefill
    graph cannot hand its state to a decode graph)."""
    b, outs = decoder(ctx, 5)
    g1 = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    g2 = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    p1, p2 = Page(ctx, g1, 5), Page(ctx, g2, 5)
    inputs = xs(3)
    ref = [p1.step(x, p) for p, x in enumerate(inputs)]
    np.testing.assert_array_equal(ctx._peek_state(g2, "past_k"), 0)
    for p, x in enumerate(inputs):
        np.testing.assert_array_equal(p2.step(x, p), ref[p])
    g1.destroy()
    p2.step(inputs[0], 3)  # g2 still works after g1 is destroyed


# -- behaviour 4: capacity -----------------------------------------------------------------

@pytest.mark.parametrize("read_past_after", [False, True])
def test_overflow_fails_and_leaves_cache(ctx, read_past_after):
    cap = 3
    b, outs = decoder(ctx, cap, read_past_after=read_past_after)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    # reading the old keys after the new ones forbids in place for keys only
    assert g.in_place == {"past_k": not read_past_after, "past_v": True}
    page = Page(ctx, g, cap)
    inputs = xs(cap + 1)
    for p in range(cap):
        page.step(inputs[p], p)
    before_k = ctx._peek_state(g, "past_k")
    before_v = ctx._peek_state(g, "past_v")
    for bad in (cap, cap + 5, -1):
        with pytest.raises(OperationError, match="capacity"):
            page.step(inputs[cap], bad)
        np.testing.assert_array_equal(ctx._peek_state(g, "past_k"), before_k)
        np.testing.assert_array_equal(ctx._peek_state(g, "past_v"), before_v)
    # the graph goes on as if the failed dispatches never happened
    want = decoder_ref(inputs[:cap], cap, read_past_after)
    ctx.reset_kv_cache(g)
    for p in range(cap):
        got = page.step(inputs[p], p)
    np.testing.assert_allclose(got, want[-1], atol=1e-5)


def test_status_comes_back_with_the_read(ctx, monkeypatch):
    """A stateful step's read brings the capacity status back in its own round trip (one
    map a step, not two); an overflow is still reported by that read."""
    cap = 3
    b, outs = decoder(ctx, cap)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    page = Page(ctx, g, cap)
    seen: list[dict[int, int]] = []
    real = ctx._settle_through

    def settle(number, known, report=True) -> None:
        seen.append(dict(known))
        real(number, known, report)

    monkeypatch.setattr(ctx, "_settle_through", settle)
    inputs = xs(cap)
    maps = ctx.queue_counts.maps
    for p in range(cap):
        page.step(inputs[p], p)
    assert [list(k.values()) for k in seen if k] == [[0]] * cap
    assert ctx.queue_counts.maps - maps == cap
    with pytest.raises(OperationError, match="capacity"):
        page.step(inputs[0], cap)
    assert list(seen[-1].values()) == [1]  # the first appended pair overflowed, read with y


def _reset_refill_destroy(ctx, g, page, inputs, want) -> None:
    """A reset drops the graph's unread overflow (the next calls do not raise); the graph
    then fills to capacity as the reference ``want`` says; a dispatch past it and the
    graph's destroy leave nothing to report at the next read."""
    cap = len(inputs)
    ctx.reset_kv_cache(g)
    for p in range(cap):
        got = page.step(inputs[p], p)
    np.testing.assert_allclose(got, want[-1], atol=1e-5)
    page.step(inputs[0], cap, read=False)
    g.destroy()
    ctx.read_tensor(page.y)  # the destroyed graph's overflow is not reported


def test_overflow_of_a_double_buffered_graph_raises_at_the_next_dispatch(ctx):
    """A graph with a double-buffered pair (its keys read after the new row is written)
    has its status read before the next dispatch runs, as its parity swap-back needs: a
    dispatch returns, and the error comes from the next read_tensor (after its read) or
    the next dispatch (before it runs); a reset or destroy of the graph drops it. Either
    way the cache is unchanged."""
    cap = 3
    b, outs = decoder(ctx, cap, read_past_after=True)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    assert g._double
    page = Page(ctx, g, cap)
    inputs = xs(cap)
    for p in range(cap - 1):
        page.step(inputs[p], p)
    before = {n: ctx._peek_state(g, n) for n in ("past_k", "past_v")}
    page.step(inputs[0], cap, read=False)  # returns: nothing has waited for the device yet
    with pytest.raises(OperationError, match="capacity"):
        page.step(inputs[0], cap - 1, read=False)  # raised before this dispatch runs
    for n, arr in before.items():
        np.testing.assert_array_equal(ctx._peek_state(g, n), arr)
    page.step(inputs[0], cap + 1, read=False)
    _reset_refill_destroy(ctx, g, page, inputs, decoder_ref(inputs, cap, read_past_after=True))


def test_overflow_of_an_in_place_graph_raises_at_the_read(ctx):
    """An in-place graph's dispatch never waits for an earlier one's status (its writes are
    gated on the device): later dispatches run, and the error comes from the read that
    brings the status back (a read of the overflowing dispatch's output, or of a later
    one's), or from a dispatch that finds ``PENDING_MAX`` statuses unread (it waits for the
    oldest, and does not run). A reset or destroy drops it; the cache is unchanged."""
    from backends.webnn.wgpu_impl.readback import PENDING_MAX

    cap = 3
    b, outs = decoder(ctx, cap)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    assert not g._double
    page = Page(ctx, g, cap)
    inputs = xs(cap)
    want = decoder_ref(inputs, cap)
    for p in range(cap - 1):
        page.step(inputs[p], p)
    before = {n: ctx._peek_state(g, n) for n in ("past_k", "past_v")}
    page.step(inputs[0], cap, read=False)
    page.step(inputs[0], cap + 1, read=False)  # runs: the overflow above is not read yet
    with pytest.raises(OperationError, match="capacity"):
        ctx.read_tensor(page.y)  # the last dispatch's copy, both statuses with it
    ctx.read_tensor(page.y)  # reported once
    for n, arr in before.items():
        np.testing.assert_array_equal(ctx._peek_state(g, n), arr)
    np.testing.assert_allclose(page.step(inputs[cap - 1], cap - 1), want[-1], atol=1e-5)
    # an older dispatch's output (its own copy) reports its overflow; the later one's is fine
    other = ctx.create_tensor(data_type="float32", shape=[1, H * D], readable=True)
    ctx.reset_kv_cache(g)
    page.step(inputs[0], 0)
    page.step(inputs[1], cap, read=False)
    first, page.y = page.y, other
    page.step(inputs[1], 1, read=False)
    with pytest.raises(OperationError, match="capacity"):
        ctx.read_tensor(first)
    np.testing.assert_allclose(ctx.read_tensor(page.y), want[1], atol=1e-5)
    # a loop that never reads: the dispatch past PENDING_MAX unread ones waits and raises
    for _ in range(PENDING_MAX):
        page.step(inputs[0], cap, read=False)
    with pytest.raises(OperationError, match="capacity"):
        page.step(inputs[2], 2, read=False)
    _reset_refill_destroy(ctx, g, page, inputs, want)  # the reset drops the rest


# -- behaviour 5: hidden ---------------------------------------------------------------------

def test_no_public_api_reaches_the_cache(ctx):
    b, outs = decoder(ctx, 3)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    public = {n: getattr(g, n) for n in dir(g) if not n.startswith("_")}
    for name, value in public.items():
        assert "Buffer" not in type(value).__name__, name
        assert "MLTensor" not in type(value).__name__, name
    with pytest.raises(TypeError):
        ctx.read_tensor(g)


# -- behaviour 6 and the open points ---------------------------------------------------

def test_pairs_are_named_on_an_ordinary_graph(ctx):
    b, outs = decoder(ctx, 4)
    g = b.build(outs)  # the same graph, stateless, with no new op
    assert not g.is_stateful and {"past_k", "past_v"} <= set(g.inputs)
    with pytest.raises(InvalidStateError):
        ctx.reset_kv_cache(g)


def test_malformed_pairs_are_type_errors(ctx):
    b, outs = decoder(ctx, 4)
    P = MLKVCachePair
    bad = [
        [P("nope", "present_k")],
        [P("past_k", "nope")],
        [P("past_k", "present_k"), P("past_k", "present_v")],
        [P("past_k", "present_k"), P("past_v", "present_k")],
        [P("pos", "present_k")],  # dtype and shape differ
        [P("past_k", "y")],  # shape differs
    ]
    for pairs in bad:
        with pytest.raises(TypeError):
            b.build(outs, use_stateful=True, kv_cache_pairs=pairs)
    with pytest.raises(TypeError, match="use_stateful"):
        b.build(outs, kv_cache_pairs=PAIRS)


def test_reset_on_other_context_or_destroyed(ctx):
    other = ml.create_context()
    b, outs = decoder(other, 3)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    with pytest.raises(TypeError):
        ctx.reset_kv_cache(g)
    g.destroy()
    with pytest.raises(InvalidStateError):
        other.reset_kv_cache(g)
    other.destroy()


# -- recurrent (overwrite) pairs ---------------------------------------------------------------

def recurrent(ctx, *, in_place_possible=True):
    """S' = a*S + outer(k, v); y = q @ S'. With ``in_place_possible=False`` the output
    also reads the old state after the new one exists, y = (q @ S') @ S (two buffers)."""
    b = MLGraphBuilder(ctx)
    q = b.input("q", data_type="float32", shape=[1, D])
    k = b.input("k", data_type="float32", shape=[D, 1])
    v = b.input("v", data_type="float32", shape=[1, D])
    a = b.input("a", data_type="float32", shape=[1, 1])
    s = b.input("past_state", data_type="float32", shape=[D, D])
    new = b.add(b.mul(a, s), b.mul(k, v))
    y = b.matmul(q, new)
    if not in_place_possible:
        y = b.matmul(y, s)
    return b.build({"y": y, "present_state": new}, use_stateful=True,
                   kv_cache_pairs=[MLKVCachePair("past_state", "present_state")])


@pytest.mark.parametrize("in_place", [True, False])
def test_recurrent_state(ctx, in_place):
    g = recurrent(ctx, in_place_possible=in_place)
    assert g.is_stateful and g.in_place == {"past_state": in_place}
    t = {n: ctx.create_tensor(data_type="float32", shape=s, writable=True)
         for n, s in (("q", [1, D]), ("k", [D, 1]), ("v", [1, D]), ("a", [1, 1]))}
    y = ctx.create_tensor(data_type="float32", shape=[1, D], readable=True)
    S = np.zeros((D, D))
    for _ in range(4):
        vals = {n: RNG.uniform(0.2, 1.0, tt.shape).astype(np.float32) for n, tt in t.items()}
        for n in t:
            ctx.write_tensor(t[n], vals[n])
        ctx.dispatch(g, t, {"y": y})
        old, S = S, vals["a"] * S + vals["k"] * vals["v"]
        want = vals["q"] @ S if in_place else vals["q"] @ S @ old
        np.testing.assert_allclose(ctx.read_tensor(y), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ctx._peek_state(g, "past_state"), S, rtol=1e-5)
    ctx.reset_kv_cache(g)
    np.testing.assert_array_equal(ctx._peek_state(g, "past_state"), 0)


# -- counters ------------------------------------------------------------------------------

def step_counters(ctx, cap, stateful):
    b, outs = decoder(ctx, cap)
    g = b.build(outs, use_stateful=stateful, kv_cache_pairs=PAIRS if stateful else ())
    page = Page(ctx, g, cap)
    page.step(xs(1)[0], 0)
    ctx.counters.reset()
    page.step(xs(1)[0], 1)
    return ctx.counters.snapshot(), g


@pytest.mark.parametrize("row_writes", [None, "separate"])
def test_counters_stateful_writes_only_new_rows(ctx_with, row_writes):
    ctx = ctx_with(row_writes=row_writes)
    row = H * D * 4  # bytes of one new row over all heads
    s4, g4 = step_counters(ctx, 4, True)
    s8, g8 = step_counters(ctx, 8, True)
    # host traffic: x (16) + pos (4) up; y (32) + the 4-byte capacity status down
    assert (s4.h2d, s4.d2h, s4.d2d) == (D * 4 + 4, H * D * 4 + 4, 0)
    assert (s8.h2d, s8.d2h, s8.d2d) == (s4.h2d, s4.d2h, s4.d2d)
    for g in (g4, g8):
        scatters = [la.kernel for la in g._plan.launches
                    if hasattr(la, "kernel") and la.kernel.name == "scatter_nd"]
        # K and V rows at one index tensor: one launch, unless asked for one per cache;
        # index tuples read once per launch + for each cache: updates read + rows written
        if row_writes is None:
            assert [k.bytes for k in scatters] == [H * 3 * 4 + 2 * (2 * row)]
        else:
            assert [k.bytes for k in scatters] == [H * 3 * 4 + 2 * row] * 2
    # the rest of the kernel traffic grows only with the attention reads of the cache
    assert s8.kernel > s4.kernel


def test_counters_stateless_copies_the_cache(ctx):
    cap = 4
    cache = H * cap * D * 4
    s, g = step_counters(ctx, cap, False)
    # the scatter's copy of the unchanged rows is a copy kernel over each whole cache
    # (in the step's compute pass: read once + written once), not a buffer copy
    copies = [la.kernel for la in g._plan.launches
              if hasattr(la, "kernel") and la.kernel.name == "copy_vec4"]
    assert [k.bytes for k in copies] == [2 * cache, 2 * cache]
    assert s.d2d == 0
    assert s.h2d == D * 4 + 4 and s.d2h == H * D * 4


# -- recording ahead (dispatch._record_ahead) ---------------------------------------------------

def _count_encodes(ctx, monkeypatch) -> list[int]:
    calls = [0]
    real = type(ctx)._encode

    def counted(self, *args, **kw):
        calls[0] += 1
        return real(self, *args, **kw)

    monkeypatch.setattr(type(ctx), "_encode", counted)
    return calls


@pytest.mark.parametrize("piecewise", [False, True])
@pytest.mark.parametrize("stateful", [True, False])
def test_record_ahead_is_used_and_matches(plain_ctx, ctx, stateful, piecewise, monkeypatch):
    """A decode loop's dispatches submit what the previous one recorded (in one submit, or
    piece by piece): one encoding per step once the page's binding pattern repeats (same
    tensors, or a ping-pong of two sets), and the results are those of the reference."""
    c = ctx if stateful else plain_ctx
    monkeypatch.setattr(c, "record_ahead", True)
    monkeypatch.setattr(c, "_piecewise", piecewise)
    monkeypatch.setattr(c, "submit_every", 2)
    b, outs = decoder(c, 8)
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    page = Page(c, g, 8)
    calls = _count_encodes(c, monkeypatch)
    inputs = xs(7)
    for p, (x, want) in enumerate(zip(inputs, decoder_ref(inputs, 8), strict=True)):
        np.testing.assert_allclose(page.step(x, p), want, atol=1e-5)
    # stateful: the first dispatch encodes twice (its own, the next); ping-pong: the second
    # dispatch's guess (the first's tensors again) misses, so one more
    assert calls[0] == len(inputs) + (1 if stateful else 2)


def test_record_ahead_survives_rebinding_destroy_and_reset(ctx, monkeypatch):
    """What was recorded for tensors that are no longer bound is never submitted: a fresh
    output tensor (the old one destroyed), a reset, and a double-buffered pair's parity
    all give the reference's results."""
    b, outs = decoder(ctx, 6, read_past_after=True)  # keys double-buffered: parity matters
    g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
    page = Page(ctx, g, 6)
    inputs = xs(5)
    want = decoder_ref(inputs, 6, read_past_after=True)
    for p in range(3):
        page.step(inputs[p], p)
    old, page.y = page.y, ctx.create_tensor(data_type="float32", shape=[1, H * D], readable=True)
    old.destroy()
    for p in range(3, 5):
        np.testing.assert_allclose(page.step(inputs[p], p), want[p], atol=1e-5)
    ctx.reset_kv_cache(g)
    for p in range(3):
        np.testing.assert_allclose(page.step(inputs[p], p), want[p], atol=1e-5)


def test_record_ahead_off_encodes_every_dispatch(monkeypatch):
    c = ml.create_context(options=KernelOptions(record_ahead="off"))
    try:
        b, outs = decoder(c, 4)
        page = Page(c, b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS), 4)
        calls = _count_encodes(c, monkeypatch)
        inputs = xs(4)
        for p, (x, want) in enumerate(zip(inputs, decoder_ref(inputs, 4), strict=True)):
            np.testing.assert_allclose(page.step(x, p), want, atol=1e-5)
        assert calls[0] == len(inputs)
    finally:
        c.destroy()


# -- the read copy (readback._read_copy_for) ---------------------------------------------------

def _context(read_copy: str | None, record_ahead: str = "on"):
    # the oracle (conftest's queue_calls) counts wgpu-py's submits: the queue through them
    return ml.create_context(options=KernelOptions(read_copy=read_copy, record_ahead=record_ahead,
                                                   queue_calls="wgpu-py"))


@pytest.mark.parametrize("record_ahead", ["on", "off"])
@pytest.mark.parametrize("read_copy, read_submits", [
    (None, 0), ("separate", 1), ("separate_sync", 2)])
def test_read_copy_submits_and_maps_per_step(read_copy, read_submits, record_ahead,
                                             monkeypatch, queue_calls):
    """A stateful decode step (write x and pos, dispatch, read y) maps once, and with the read
    copy the read submits nothing: the dispatch's submit (one, of what was recorded ahead;
    else one per command buffer as they are encoded) is the step's only one. A read that
    copies for itself adds its own submit, and wgpu-py's default map one more. The
    context's counts agree with wgpu-py's calls, and every step's y is the float64
    reference's."""
    c = _context(read_copy, record_ahead)
    try:
        monkeypatch.setattr(c, "submit_every", 2)  # several command buffers per dispatch
        b, outs = decoder(c, 8)
        g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
        page = Page(c, g, 8)
        pieces = len(g._submit_after) + 1
        assert pieces > 1
        dispatch_submits = 1 if record_ahead == "on" else pieces
        inputs = xs(8)
        want = decoder_ref(inputs, 8)
        for p in range(2):  # the first steps make the read copy and the recording
            page.step(inputs[p], p)
        calls = queue_calls()
        before = (c.queue_counts.submits, c.queue_counts.maps)
        steps = 6
        for p in range(2, 2 + steps):
            np.testing.assert_allclose(page.step(inputs[p], p), want[p], atol=1e-5)
        per_step = (steps * (dispatch_submits + read_submits), steps)
        assert (calls["submits"], calls["maps"]) == per_step
        assert (c.queue_counts.submits - before[0], c.queue_counts.maps - before[1]) == per_step
    finally:
        c.destroy()


@pytest.mark.parametrize("stateful", [True, False])
def test_read_copy_is_bit_identical_to_the_separate_read(stateful, monkeypatch):
    """The same graph and inputs through the read copy and through a read of its own give
    the same bits every step (the stateless page ping-pongs its caches: the recorded
    command buffers alternate, the read copy is one)."""
    inputs = xs(6)
    got = {}
    for how in (None, "separate"):
        c = _context(how)
        try:
            b, outs = decoder(c, 6)
            g = b.build(outs, use_stateful=stateful, kv_cache_pairs=PAIRS if stateful else ())
            page = Page(c, g, 6)
            got[how] = [page.step(x, p) for p, x in enumerate(inputs)]
        finally:
            c.destroy()
    for p, (a, s, want) in enumerate(zip(got[None], got["separate"],
                                         decoder_ref(inputs, 6), strict=True)):
        np.testing.assert_array_equal(a, s, err_msg=f"step {p}")
        np.testing.assert_allclose(a, want, atol=1e-5)


def _scale_graph(c, k: float):
    """y = k * a over y's shape: a second graph that writes the page's output tensor."""
    b = MLGraphBuilder(c)
    a = b.input("a", data_type="float32", shape=[1, H * D])
    kc = b.constant(data_type="float32", shape=[1], value=np.float32([k]))
    return b.build({"y": b.mul(a, kc)})


def test_read_copy_never_returns_stale_data(monkeypatch, queue_calls):
    """What a read returns is the tensor as the queue's order leaves it, whatever was copied
    at a dispatch's end: after a second dispatch (of this graph or another one writing the
    tensor), after a write to the tensor, and for a tensor the dispatch did not copy; a
    write to another tensor, a fallback read, a reset or a later dispatch writing other
    tensors in between keep the copy usable."""
    c = _context(None)
    try:
        calls = queue_calls()
        b, outs = decoder(c, 8)
        g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
        page = Page(c, g, 8)
        page.y.destroy()
        page.y = c.create_tensor(data_type="float32", shape=[1, H * D], readable=True,
                                 writable=True)
        inputs = xs(8)
        want = decoder_ref(inputs, 8)
        rng = np.random.default_rng()

        def read_y(copied: bool) -> np.ndarray:
            before = calls["submits"]
            y = c.read_tensor(page.y)
            assert (calls["submits"] - before == 0) == copied  # copied: only a map
            return y

        for p in range(2):
            np.testing.assert_allclose(page.step(inputs[p], p), want[p], atol=1e-5)
        # two dispatches, one read: the second dispatch's y (its own copy)
        page.step(inputs[2], 2, read=False)
        page.step(inputs[3], 3, read=False)
        np.testing.assert_allclose(read_y(True), want[3], atol=1e-5)
        # a write to y after the dispatch: the written values, read from y itself
        page.step(inputs[4], 4, read=False)
        mine = rng.standard_normal((1, H * D)).astype(np.float32)
        c.write_tensor(page.y, mine)
        np.testing.assert_array_equal(read_y(False), mine)
        # a write to another tensor, a reset, and a read of a tensor the dispatch did not
        # copy (read by its own submit) change nothing the copy holds
        c.reset_kv_cache(g)
        for p in range(3):
            page.step(inputs[p], p, read=False)
        other = c.create_tensor(data_type="float32", shape=[1, D], readable=True,
                                writable=True)
        c.write_tensor(other, inputs[7])
        before = calls["submits"]
        np.testing.assert_array_equal(c.read_tensor(other), inputs[7])
        assert calls["submits"] - before == 1
        c.write_tensor(page.x, inputs[6])
        np.testing.assert_allclose(read_y(True), want[2], atol=1e-5)
        np.testing.assert_allclose(read_y(True), want[2], atol=1e-5)  # and again
        # another graph writes y after this one: its values (its copy)
        a = c.create_tensor(data_type="float32", shape=[1, H * D], writable=True)
        c.write_tensor(a, mine)
        g3 = _scale_graph(c, 3.0)
        page.step(inputs[3], 3, read=False)
        c.dispatch(g3, {"a": a}, {"y": page.y})
        np.testing.assert_allclose(read_y(True), 3.0 * mine, rtol=1e-6)
        # another graph writes another tensor after this one: y from this dispatch's copy
        # (an older dispatch's: nothing has written y since)
        z = c.create_tensor(data_type="float32", shape=[1, H * D], readable=True)
        page.step(inputs[4], 4, read=False)
        c.dispatch(g3, {"a": a}, {"y": z})
        np.testing.assert_allclose(read_y(True), want[4], atol=1e-5)
        np.testing.assert_allclose(c.read_tensor(z), 3.0 * mine, rtol=1e-6)
        # the graph destroyed after its dispatch: y from y itself
        page.step(inputs[5], 5, read=False)
        g.destroy()
        np.testing.assert_allclose(read_y(False), want[5], atol=1e-5)
    finally:
        c.destroy()


def test_read_of_an_older_dispatch_maps_its_own_copy(monkeypatch, queue_calls):
    """Two outputs used in turn (a chained page's ids): after dispatch N + 1, a read of
    dispatch N's output returns N's values from N's copy (a map, no submit; its bytes and
    N's status counted once), not N + 1's; N + 1's read then gets its own. Recorded ahead
    for the alternating sets, a dispatch encodes once per step after the first three."""
    c = _context(None)
    try:
        b, outs = decoder(c, 8)
        g = b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS)
        page = Page(c, g, 8)
        ys = [page.y, c.create_tensor(data_type="float32", shape=[1, H * D], readable=True)]
        inputs = xs(8)
        want = decoder_ref(inputs, 8)
        calls = queue_calls()
        encodes = _count_encodes(c, monkeypatch)
        page.y = ys[0]
        page.step(inputs[0], 0, read=False)
        for p in range(1, 8):
            page.y = ys[p % 2]
            page.step(inputs[p], p, read=False)  # dispatch p before reading p - 1
            before = (c.counters.d2h, calls["submits"], calls["maps"])
            got = c.read_tensor(ys[(p - 1) % 2])
            np.testing.assert_allclose(got, want[p - 1], atol=1e-5)
            assert (c.counters.d2h - before[0], calls["submits"] - before[1],
                    calls["maps"] - before[2]) == (4 * H * D + 4, 0, 1)
        np.testing.assert_allclose(c.read_tensor(ys[1]), want[7], atol=1e-5)
        assert not c._pending
        assert encodes[0] == 8 + 2  # its own and the next, a miss, then recorded each step
    finally:
        c.destroy()


def test_read_copy_with_the_capacity_status(monkeypatch, queue_calls):
    """An overflowing step's read gets the status from the dispatch's copy and raises; the
    step after it reads its own copy and the cache is as if the overflow never ran."""
    c = _context(None)
    try:
        b, outs = decoder(c, 3)
        page = Page(c, b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS), 3)
        inputs = xs(3)
        want = decoder_ref(inputs, 3)
        for p in range(2):
            page.step(inputs[p], p)
        calls = queue_calls()
        with pytest.raises(OperationError, match="capacity"):
            page.step(inputs[2], 3)
        np.testing.assert_allclose(page.step(inputs[2], 2), want[2], atol=1e-5)
        assert calls["maps"] == 2  # one per read: the status came with the copy
    finally:
        c.destroy()


@pytest.mark.parametrize("engine", ["wgpu", "dawn"])
@pytest.mark.parametrize("read_copy", [None, "separate"])
def test_direct_maps_read_status_timestamps_and_values(engine, read_copy):
    """Read maps through the engine's C functions (KernelOptions.queue_calls "direct_maps",
    where the read map spins): each step's y is the float64 reference's, the GPU time is
    read, an overflow's status is read (from the read, or from a later step's read) and
    raises, and the step after it is as if the overflow never ran."""
    try:
        c = ml.create_context(engine=engine, timing=True, options=KernelOptions(
            queue_calls="direct_maps", map_wait="spin", record_ahead="on", read_copy=read_copy))
    except (ImportError, RuntimeError) as exc:
        pytest.skip(f"no {engine} adapter: {exc}")
    try:
        assert c._map_how.map_spin is not None
        b, outs = decoder(c, 3)
        page = Page(c, b.build(outs, use_stateful=True, kv_cache_pairs=PAIRS), 3)
        inputs = xs(3)
        want = decoder_ref(inputs, 3)
        for p in range(2):
            np.testing.assert_allclose(page.step(inputs[p], p), want[p], atol=1e-5)
            assert c.gpu_time_ns is None or c.gpu_time_ns >= 0
        with pytest.raises(OperationError, match="capacity"):
            page.step(inputs[2], 3)  # the status read with y
        page.step(inputs[2], 3, read=False)
        with pytest.raises(OperationError, match="capacity"):
            page.step(inputs[2], 2)  # in place: this dispatch ran; its read brings the status
        np.testing.assert_allclose(page.step(inputs[2], 2), want[2], atol=1e-5)
    finally:
        c.destroy()
