"""The spec's rules at the API boundary: dispatch binding, tensors, destroy, counters."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn import (
    DataError,
    InvalidStateError,
    MLGraphBuilder,
    ml,
)


def simple_graph(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 4])
    c = b.constant(data_type="float32", shape=[4], value=np.arange(1, 5, dtype=np.float32))
    return b.build({"y": b.mul(x, c)})


def tensors(ctx, readable=True, writable=True):
    t_in = ctx.create_tensor(data_type="float32", shape=[2, 4], readable=readable,
                             writable=writable)
    t_out = ctx.create_tensor(data_type="float32", shape=[2, 4], readable=True)
    return t_in, t_out


def test_round_trip_and_zero_fill(ctx):
    g = simple_graph(ctx)
    t_in, t_out = tensors(ctx)
    np.testing.assert_array_equal(ctx.read_tensor(t_out), np.zeros((2, 4), np.float32))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    ctx.write_tensor(t_in, x)
    ctx.dispatch(g, {"x": t_in}, {"y": t_out})
    np.testing.assert_array_equal(ctx.read_tensor(t_out), x * np.arange(1, 5, dtype=np.float32))


def test_every_input_and_output_bound(ctx):
    g = simple_graph(ctx)
    t_in, t_out = tensors(ctx)
    extra = ctx.create_tensor(data_type="float32", shape=[2, 4])
    with pytest.raises(TypeError):
        ctx.dispatch(g, {}, {"y": t_out})
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": t_in}, {})
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": t_in, "z": extra}, {"y": t_out})
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": t_in}, {"y": t_out, "w": extra})


def test_descriptors_match_exactly(ctx):
    g = simple_graph(ctx)
    _, t_out = tensors(ctx)
    wrong_shape = ctx.create_tensor(data_type="float32", shape=[8])
    wrong_type = ctx.create_tensor(data_type="int32", shape=[2, 4])
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": wrong_shape}, {"y": t_out})
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": wrong_type}, {"y": t_out})


def test_same_tensor_twice_is_type_error(ctx):
    g = simple_graph(ctx)
    t_in, _ = tensors(ctx)
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": t_in}, {"y": t_in})


def test_foreign_or_destroyed_tensor_is_type_error(ctx):
    g = simple_graph(ctx)
    t_in, t_out = tensors(ctx)
    other = ml.create_context()
    foreign = other.create_tensor(data_type="float32", shape=[2, 4])
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": foreign}, {"y": t_out})
    with pytest.raises(TypeError):
        ctx.read_tensor(foreign)
    other.destroy()
    dead = ctx.create_tensor(data_type="float32", shape=[2, 4], readable=True, writable=True)
    dead.destroy()
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": dead}, {"y": t_out})
    with pytest.raises(TypeError):
        ctx.read_tensor(dead)
    with pytest.raises(TypeError):
        ctx.write_tensor(dead, np.ones((2, 4)))


def test_a_binding_checked_once_is_still_checked_for_what_changes(ctx):
    """dispatch checks a binding once per graph (the same tensors every step, or two sets in
    turn, are not checked again): a tensor destroyed since, or another binding, is checked
    as the first was."""
    g = simple_graph(ctx)
    t_in, t_out = tensors(ctx)
    x = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
    ctx.write_tensor(t_in, x)
    for _ in range(2):  # checked, then the same binding again
        ctx.dispatch(g, {"x": t_in}, {"y": t_out})
        np.testing.assert_allclose(ctx.read_tensor(t_out), x * np.arange(1.0, 5.0), rtol=1e-6)
    other = ctx.create_tensor(data_type="float32", shape=[2, 4], readable=True)
    for out in (other, t_out, other):  # two bindings in turn: each checked once, both kept
        ctx.dispatch(g, {"x": t_in}, {"y": out})
        np.testing.assert_allclose(ctx.read_tensor(out), x * np.arange(1.0, 5.0), rtol=1e-6)
    assert len(g._checked) == 2
    other.destroy()
    with pytest.raises(TypeError, match="destroyed"):
        ctx.dispatch(g, {"x": t_in}, {"y": other})
    wrong = ctx.create_tensor(data_type="float32", shape=[4, 2], readable=True)
    with pytest.raises(TypeError, match="graph wants"):
        ctx.dispatch(g, {"x": t_in}, {"y": wrong})
    with pytest.raises(TypeError, match="more than once"):
        ctx.dispatch(g, {"x": t_in}, {"y": t_in})
    t_out.destroy()
    with pytest.raises(TypeError, match="destroyed"):
        ctx.dispatch(g, {"x": t_in}, {"y": t_out})


def test_destroyed_graph_is_invalid_state(ctx):
    g = simple_graph(ctx)
    t_in, t_out = tensors(ctx)
    g.destroy()
    with pytest.raises(InvalidStateError):
        ctx.dispatch(g, {"x": t_in}, {"y": t_out})


def test_graph_of_another_context_is_type_error(ctx):
    other = ml.create_context()
    g = simple_graph(other)
    t_in, t_out = tensors(ctx)
    with pytest.raises(TypeError):
        ctx.dispatch(g, {"x": t_in}, {"y": t_out})
    other.destroy()


def test_readable_writable(ctx):
    t = ctx.create_tensor(data_type="float32", shape=[2, 4])
    with pytest.raises(TypeError):
        ctx.read_tensor(t)
    with pytest.raises(TypeError):
        ctx.write_tensor(t, np.ones((2, 4), np.float32))
    w = ctx.create_tensor(data_type="float32", shape=[2, 4], writable=True)
    with pytest.raises(TypeError):
        ctx.write_tensor(w, np.ones(7, np.float32))  # wrong size


def test_read_tensors_in_one_round_trip(ctx, monkeypatch):
    """read_tensors (a page's Promise.all over readTensor): every tensor's own values and
    type, odd sizes, mixed types; split over several staging buffers when they exceed the
    device's max buffer size; a tensor that is not readable is a TypeError."""
    rng = np.random.default_rng()
    shapes = [(3, 5), (7,), (2, 2, 3), (1,)]
    want = [rng.standard_normal(sh).astype(np.float32) for sh in shapes]
    want.append(rng.integers(-2**31, 2**31 - 1, size=9, dtype=np.int64))
    ts = []
    for a in want:
        t = ctx.create_tensor(data_type="int64" if a.dtype == np.int64 else "float32",
                              shape=list(a.shape), readable=True, writable=True)
        ctx.write_tensor(t, a)
        ts.append(t)
    for max_buffer in (ctx._reads.max_buffer, 64):  # 64 bytes: one staging buffer per tensor or two
        monkeypatch.setattr(ctx._reads, "max_buffer", max_buffer)
        before = ctx.counters.d2h
        got = ctx.read_tensors(ts)
        assert ctx.counters.d2h - before == sum(4 * a.size for a in want)
        for g, a in zip(got, want, strict=True):
            assert g.dtype == a.dtype and g.shape == a.shape
            np.testing.assert_array_equal(g, a)
        outs = [np.full(a.shape, 7, a.dtype) for a in want]  # readTensor(tensor, outputData)
        back = ctx.read_tensors(ts, outs)
        for o, b, a in zip(outs, back, want, strict=True):
            assert b is o
            np.testing.assert_array_equal(o, a)
    assert len(ctx._reads.buffers) > 1
    with pytest.raises(TypeError):
        ctx.read_tensors([ts[0], ctx.create_tensor(data_type="float32", shape=[2])])
    for bad in ([np.zeros(15, np.float64)], [np.zeros(14, np.float32)],
                [np.zeros((5, 3), np.float32).T]):  # type, size, not contiguous
        with pytest.raises(TypeError):
            ctx.read_tensors(ts[:1], bad)
    with pytest.raises(TypeError):
        ctx.read_tensors(ts[:2], [np.zeros(15, np.float32)])  # one array for two tensors


def test_large_writes_are_staged_and_batched(ctx):
    """Writes of STAGED_WRITE_MIN bytes or more are staged into a mapped arena and copied in
    one submit when the queue next runs something; each read sees the latest write, the
    bytes are counted once, and once the arenas have grown to a batch (after the first)
    each batch is one submit in a reused arena."""
    from backends.webnn.wgpu_impl import context as wctx

    n = wctx.STAGED_WRITE_MIN // 4 + 3  # not a multiple of 16 bytes
    ts = [ctx.create_tensor(data_type="float32", shape=[n], readable=True, writable=True)
          for _ in range(3)]
    rng = np.random.default_rng()
    arenas = None
    for round_ in range(4):
        arrs = [rng.standard_normal(n).astype(np.float32) for _ in ts]
        before, submits = ctx.counters.h2d, ctx._staged.submits
        for t, a in zip(ts, arrs, strict=True):
            ctx.write_tensor(t, a[::-1].copy())
            ctx.write_tensor(t, a)  # the later write wins
        assert ctx.counters.h2d - before == 2 * sum(a.nbytes for a in arrs)
        for got, a in zip(ctx.read_tensors(ts), arrs, strict=True):
            np.testing.assert_array_equal(got, a)
        if round_:
            assert ctx._staged.submits - submits == 1
        if round_ < 2:
            continue
        if arenas is None:
            arenas = list(ctx._staged._arenas)
        assert ctx._staged._arenas == arenas


def test_staged_writes_in_pieces_and_to_destroyed_tensors(ctx, monkeypatch):
    """A write larger than an arena goes through in arena-sized pieces; a pending write to a
    tensor destroyed before the flush is dropped, and the others still land."""
    from backends.webnn.wgpu_impl import context as wctx
    from backends.webnn.wgpu_impl.staging import StagedWrites

    monkeypatch.setattr(ctx, "_staged", StagedWrites(ctx._device, limit=64 << 10))
    n = wctx.STAGED_WRITE_MIN // 4 + 5  # 16 arenas and a bit
    keep, gone = (ctx.create_tensor(data_type="float32", shape=[n], readable=True,
                                    writable=True) for _ in range(2))
    a = np.random.default_rng().standard_normal(n).astype(np.float32)
    ctx.write_tensor(keep, a)
    ctx.write_tensor(gone, a)
    gone.destroy()
    np.testing.assert_array_equal(ctx.read_tensor(keep), a)
    tiny = ctx.create_tensor(data_type="float32", shape=[3], readable=True, writable=True)
    ctx.write_tensor(keep, a[::-1].copy())
    ctx.write_tensor(tiny, a[:3].copy())  # a small write flushes the staged one first
    np.testing.assert_array_equal(ctx.read_tensors([keep, tiny])[0], a[::-1])


def test_shapes_static_and_positive(ctx):
    for bad in ([2, 0], [-1], [1.5]):
        with pytest.raises(TypeError):
            ctx.create_tensor(data_type="float32", shape=bad)
    with pytest.raises(TypeError):
        ctx.create_tensor(data_type="float64", shape=[2])


def test_int64_is_range_checked(ctx):
    t = ctx.create_tensor(data_type="int64", shape=[3], readable=True, writable=True)
    ctx.write_tensor(t, np.array([-5, 0, 2**31 - 1], np.int64))
    got = ctx.read_tensor(t)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [-5, 0, 2**31 - 1])
    with pytest.raises(DataError):
        ctx.write_tensor(t, np.array([0, 2**31, 1], np.int64))
    one = ctx.create_tensor(data_type="int64", shape=[1, 1], writable=True)  # a token's path
    ctx.write_tensor(one, np.array([[2**31 - 1]], np.int64))
    for bad in (2**31, -2**31 - 1):
        with pytest.raises(DataError):
            ctx.write_tensor(one, np.array([[bad]], np.int64))


def test_build_rules(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2])
    with pytest.raises(TypeError):
        b.build({})
    with pytest.raises(TypeError):
        b.build({"x": x})  # an input operand is not an output
    other = MLGraphBuilder(ctx)
    z = other.input("z", data_type="float32", shape=[2])
    with pytest.raises(TypeError):
        b.add(x, z)


def test_destroyed_context(ctx):
    other = ml.create_context()
    g = simple_graph(other)
    other.destroy()
    with pytest.raises(InvalidStateError):
        other.create_tensor(data_type="float32", shape=[1])
    with pytest.raises(InvalidStateError):
        MLGraphBuilder(other)
    with pytest.raises(InvalidStateError):
        other.dispatch(g, {}, {})


def test_counters_and_no_per_dispatch_allocation(ctx):
    g = simple_graph(ctx)
    t_in, t_out = tensors(ctx)
    ctx.counters.reset()
    ctx.write_tensor(t_in, np.ones((2, 4), np.float32))
    ctx.dispatch(g, {"x": t_in}, {"y": t_out})
    ctx.read_tensor(t_out)
    s = ctx.counters.snapshot()
    # mul reads x (8) and c (4) and writes y (8): 20 elements of 4 bytes
    assert (s.h2d, s.d2h, s.d2d, s.kernel) == (32, 32, 0, 80)
    ctx.counters.reset()
    assert ctx.counters.snapshot().kernel == 0
    # bind groups of page tensors are made once per set of bound tensors
    ctx.dispatch(g, {"x": t_in}, {"y": t_out})
    n = sum(len(c) for c in g._bind_cache)
    for _ in range(3):
        ctx.dispatch(g, {"x": t_in}, {"y": t_out})
    assert sum(len(c) for c in g._bind_cache) == n


def test_noop_reshape_shares_storage(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 6])
    # softmax reads neg's buffer (no fusion across it): no copy for the reshapes
    y = b.softmax(b.reshape(b.reshape(b.neg(x), [3, 4]), [12]), axis=0)
    g = b.build({"y": y})
    assert [la.kernel.name for la in g._plan.launches] == ["neg", "softmax"]
    assert len(g._plan.temps) == 1


def test_output_that_is_a_view_of_an_input_is_copied(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    g = b.build({"y": b.reshape(x, [6])})
    t_in = ctx.create_tensor(data_type="float32", shape=[2, 3], writable=True)
    t_out = ctx.create_tensor(data_type="float32", shape=[6], readable=True)
    v = np.arange(1, 7, dtype=np.float32)
    ctx.write_tensor(t_in, v)
    ctx.dispatch(g, {"x": t_in}, {"y": t_out})
    np.testing.assert_array_equal(ctx.read_tensor(t_out), v)


def test_gpu_timing_opt_in(ctx):
    assert ctx.gpu_time_ns is None and ctx.gpu_time_reason
    timed = ml.create_context(timing=True)
    g = simple_graph(timed)
    t_in, t_out = tensors(timed)
    timed.dispatch(g, {"x": t_in}, {"y": t_out})
    if "timestamp-query" in timed._adapter.features:
        assert timed.gpu_time_ns is not None and timed.gpu_time_ns >= 0
    else:
        assert timed.gpu_time_ns is None and timed.gpu_time_reason
    timed.destroy()


def test_intermediate_buffers_are_reused(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3, 5])
    y = x
    for _ in range(6):  # softmax ends every fusible chain: each op has its own buffer
        y = b.softmax(b.abs(y), axis=1)
    g = b.build({"y": y})
    temps = {id(buf) for slot, buf in g._buffers.items() if slot[0] == "temp"}
    assert len(g._plan.temps) == 11 and len(temps) == 2
    assert g.device_bytes == sum({id(v): v.size for v in g._buffers.values()}.values())
    t_in = ctx.create_tensor(data_type="float32", shape=[3, 5], writable=True)
    t_out = ctx.create_tensor(data_type="float32", shape=[3, 5], readable=True)
    v = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    ctx.write_tensor(t_in, v)
    ctx.dispatch(g, {"x": t_in}, {"y": t_out})
    want = v.astype(np.float64)
    for _ in range(6):
        e = np.exp(np.abs(want) - np.abs(want).max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(ctx.read_tensor(t_out), want, rtol=1e-5)
