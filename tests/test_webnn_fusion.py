"""Loop fusion (wgpu_impl/fusion.py, kernels/fused.py): fused chains compute what the ops
compute one by one (float64 NumPy oracle, fresh random inputs) in fewer launches."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder
from backends.webnn.wgpu_impl import fusion

RNG = np.random.default_rng(20261129)


def run(ctx, b, outs: dict, feeds: dict[str, np.ndarray]):
    g = b.build(outs)
    ins = {}
    for n, v in feeds.items():
        t = ctx.create_tensor(data_type="float32", shape=list(v.shape), writable=True)
        ctx.write_tensor(t, v)
        ins[n] = t
    res = {n: ctx.create_tensor(data_type=o.data_type, shape=o.shape, readable=True)
           for n, o in outs.items()}
    ctx.dispatch(g, ins, res)
    return g, {n: ctx.read_tensor(t) for n, t in res.items()}


def const(b, value):
    v = np.asarray(value, np.float32)
    return b.constant(data_type="float32", shape=list(v.shape), value=v)


def names(g) -> list[str]:
    return [la.kernel.name for la in g._plan.launches]


def test_rope_like_chain_is_one_launch(ctx):
    """slice, neg, concat, broadcast mul and add, with x read by three ops of the group."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 4, 3, 8])
    cos = b.input("cos", data_type="float32", shape=[1, 1, 3, 8])
    sin = b.input("sin", data_type="float32", shape=[1, 1, 3, 8])
    lo = b.slice(x, [0, 0, 0, 0], [1, 4, 3, 4])
    hi = b.slice(x, [0, 0, 0, 4], [1, 4, 3, 4])
    rot = b.concat([b.neg(hi), lo], 3)
    y = b.add(b.mul(x, cos), b.mul(rot, sin))
    xv, cv, sv = (RNG.standard_normal(s).astype(np.float32)
                  for s in ((1, 4, 3, 8), (1, 1, 3, 8), (1, 1, 3, 8)))
    g, out = run(ctx, b, {"y": y}, {"x": xv, "cos": cv, "sin": sv})
    assert len(names(g)) == 1 and names(g)[0].startswith("fused:")
    x64 = xv.astype(np.float64)
    want = x64 * cv + np.concatenate([-x64[..., 4:], x64[..., :4]], -1) * sv
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-6)


def test_transpose_where_cast_reshape_in_a_group(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3, 5])
    m = b.input("m", data_type="float32", shape=[5])
    t = b.transpose(x, permutation=[2, 0, 1])  # (5, 2, 3)
    cond = b.greater(b.reshape(m, [5, 1, 1]), const(b, [0.0]))
    y = b.where(cond, b.exp(t), b.sqrt(b.abs(t)))
    xv = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    mv = RNG.standard_normal(5).astype(np.float32)
    g, out = run(ctx, b, {"y": y}, {"x": xv, "m": mv})
    assert len(names(g)) == 1
    tv = xv.astype(np.float64).transpose(2, 0, 1)
    want = np.where(mv.reshape(5, 1, 1) > 0, np.exp(tv), np.sqrt(np.abs(tv)))
    np.testing.assert_allclose(out["y"], want, rtol=1e-5)


def test_op_read_by_two_groups_is_materialised_once(ctx):
    """A residual read by a reduction's input chain and by the next add is computed once
    (not recomputed by every later consumer)."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 16])
    r = b.add(x, const(b, np.arange(16).reshape(1, 16)))
    ms = b.reduce_mean(b.mul(r, r), axes=[1], keep_dimensions=True)
    y = b.add(b.div(r, b.sqrt(ms)), r)
    xv = RNG.standard_normal((1, 16)).astype(np.float32)
    g, out = run(ctx, b, {"y": y}, {"x": xv})
    # r materialised once; r * r computed inside the reduction
    assert names(g) == ["add", "reduce_mean", "fused:sqrt+div+add"], names(g)
    r64 = xv.astype(np.float64) + np.arange(16)
    want = r64 / np.sqrt((r64 * r64).mean(axis=1, keepdims=True)) + r64
    np.testing.assert_allclose(out["y"], want, rtol=1e-5)


def test_group_beyond_the_binding_limit_is_split(ctx):
    """More leaves than the device's storage bindings: the group gives subtrees back."""
    n = ctx._target.max_storage + 3
    b = MLGraphBuilder(ctx)
    xs = [b.input(f"x{k}", data_type="float32", shape=[7]) for k in range(n)]
    y = xs[0]
    for x in xs[1:]:
        y = b.add(b.mul(y, const(b, [0.5])), x)
    feeds = {f"x{k}": RNG.standard_normal(7).astype(np.float32) for k in range(n)}
    g, out = run(ctx, b, {"y": y}, feeds)
    assert 1 < len(names(g)) < 2 * (n - 1)
    for la in g._plan.launches:
        assert len(la.kernel.bindings) <= ctx._target.max_storage
    want = feeds["x0"].astype(np.float64)
    for k in range(1, n):
        want = want * 0.5 + feeds[f"x{k}"]
    np.testing.assert_allclose(out["y"], want, rtol=1e-5)


@pytest.mark.parametrize("max_leaves", [1, 2, 8])
def test_plan_respects_leaf_limit(ctx, max_leaves):
    b = MLGraphBuilder(ctx)
    xs = [b.input(f"x{k}", data_type="float32", shape=[3]) for k in range(6)]
    y = xs[0]
    for x in xs[1:]:
        y = b.mul(b.add(y, x), x)
    from backends.webnn._classes import _frozen  # the build's hand-off (ir.Graph)

    nodes = _frozen({"y": y}, {}, []).nodes
    inlined, groups = fusion.plan(nodes, {y._id}, set(), max_leaves)
    for grp in groups.values():
        assert len(grp.leaves) <= max_leaves
        assert all(o.id in inlined for o in grp.ops[:-1])


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max"])
def test_reduction_computes_its_input_chain(ctx, op):
    """A transposed, broadcast product reduced over two axes in one launch."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3, 4, 5])
    w = b.input("w", data_type="float32", shape=[5, 1, 1])
    t = b.transpose(x, permutation=[2, 0, 1])  # (5, 3, 4)
    y = getattr(b, op)(b.mul(t, w), axes=[0, 2])
    xv = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    wv = RNG.standard_normal((5, 1, 1)).astype(np.float32)
    g, out = run(ctx, b, {"y": y}, {"x": xv, "w": wv})
    assert names(g) == [op]
    prod = xv.astype(np.float64).transpose(2, 0, 1) * wv
    want = {"reduce_sum": prod.sum(axis=(0, 2)), "reduce_mean": prod.mean(axis=(0, 2)),
            "reduce_max": prod.max(axis=(0, 2))}[op]
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [6, 8])
@pytest.mark.parametrize("norm,mode,launches", [
    (False, "full", ["matmul_gemv"]), (True, "full", ["matmul_gemv"]),
    (True, "vector", ["reduce_mean", "matmul_gemv"]),
    (True, None, ["fused_vector", "matmul_gemv"]), (True, "launch", ["fused_vector", "matmul_gemv"]),
    (False, None, ["fused:sqrt+div+mul", "matmul_gemv"]),
    (True, "off", ["reduce_mean", "fused:add+sqrt+div+mul", "matmul_gemv"])])
def test_gemv_prologue_and_stacking_with_gpu_kernel(ctx_with, k, norm, mode, launches):
    """Forced GPU gemv: an element-wise input vector read only by two single-row matmuls
    is computed by the (stacked) gemv itself, vec4 (k = 8) or scalar (k = 6) loads; with
    ``norm`` it is RMSNorm, whose mean of squares the gemv's workgroups compute too
    (``gemv_prologue`` "full"; "vector": the mean launched alone; None/"launch": the
    vector and its mean in one launch of their own; "off": neither)."""
    ctx = ctx_with(gemv="rows_sh", gemv_prologue=mode)
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, k])
    s = b.input("s", data_type="float32", shape=[1, 1])
    w1, w2, g = (RNG.standard_normal(sh).astype(np.float32) for sh in ((k, 5), (k, 3), (1, k)))
    if norm:
        ms = b.reduce_mean(b.mul(x, x), axes=[1], keep_dimensions=True)
        v = b.mul(b.div(x, b.sqrt(b.add(ms, s))), const(b, g))
    else:
        v = b.mul(b.div(x, b.sqrt(s)), const(b, g))
    y1 = b.matmul(v, const(b, w1))
    y2 = b.matmul(v, const(b, w2))
    xv = RNG.standard_normal((1, k)).astype(np.float32)
    sv = np.float32([[2.5]])
    gr, out = run(ctx, b, {"y1": y1, "y2": y2}, {"x": xv, "s": sv})
    assert names(gr) == launches
    x64 = xv.astype(np.float64)
    denom = np.sqrt((x64 * x64).mean() + 2.5) if norm else np.sqrt(2.5)
    vv = x64 / denom * g
    np.testing.assert_allclose(out["y1"], vv @ w1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["y2"], vv @ w2, rtol=1e-5, atol=1e-5)


def _row_norms(ctx, rows: int, d: int, kind: str):
    """One fused_vector launch over (1, rows, d) on fresh inputs; its output and the float64
    oracle's. ``kind``: "rms" (RMSNorm: mean of squares, times a weight), "l2" (sum of
    squares per row), "max" (x minus the row's max)."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, rows, d])
    xv = RNG.standard_normal((1, rows, d)).astype(np.float32)
    x64 = xv.astype(np.float64)
    eps = b.constant(data_type="float32", shape=[1], value=np.float32([1e-6]))
    if kind == "max":
        y = b.sub(x, b.reduce_max(x, axes=[2], keep_dimensions=True))
        want = x64 - x64.max(axis=2, keepdims=True)
    else:
        red = (b.reduce_mean if kind == "rms" else b.reduce_sum)(
            b.mul(x, x), axes=[2], keep_dimensions=True)
        y = b.div(x, b.sqrt(b.add(red, eps)))
        stat = (x64 * x64).mean(2, keepdims=True) if kind == "rms" else (x64 * x64).sum(
            2, keepdims=True)
        want = x64 / np.sqrt(stat + 1e-6)
        if kind == "rms":
            g = RNG.standard_normal((d,)).astype(np.float32)
            y = b.mul(y, const(b, g))
            want = want * g
    gr, out = run(ctx, b, {"y": y}, {"x": xv})
    return gr, out["y"], want


ROW_SHAPES = [(1, 2048), (1, 2000), (16, 128), (3, 37), (2, 5000), (2, 3)]


@pytest.mark.parametrize("variant", [None, "loop"])
@pytest.mark.parametrize("rows,d", ROW_SHAPES)
@pytest.mark.parametrize("kind", ["rms", "l2", "max"])
def test_row_vector_variants_match_oracle(ctx_with, variant, rows, d, kind):
    """``KernelOptions.row_vector``: the unrolled kernel (the default: a workgroup no wider
    than the row, straight-line loads; rows of 2048 as llama-1b's RMSNorm, 128 as a GDN
    head's L2 norm, odd widths, one beyond the unrolled size that falls back to loops)
    and the loop one compute the float64 oracle's rows, in one launch."""
    ctx = ctx_with(gemv="rows_sh", row_vector=variant)
    gr, got, want = _row_norms(ctx, rows, d, kind)
    assert names(gr) == ["fused_vector"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.adapter_feature("subgroup")
@pytest.mark.parametrize("rows,d", ROW_SHAPES)
@pytest.mark.parametrize("kind", ["rms", "l2", "max"])
def test_row_vector_subgroup_sums_match_oracle(ctx_with, subgroup_size, rows, d, kind):
    """The unrolled kernel's subgroup path (taken where the target reports one fixed
    subgroup width; lavapipe's probed width forced here): the row's partial results
    combined by subgroupAdd/Max and one barrier, against the float64 oracle."""
    from backends.webnn.wgpu_impl.target import Target

    if not subgroup_size:
        pytest.skip("no fixed subgroup width")
    ctx = ctx_with(gemv="rows_sh")
    saved = ctx._target
    ctx._target = Target(cpu=False, subgroup=subgroup_size)
    try:
        gr, got, want = _row_norms(ctx, rows, d, kind)
        src = gr._plan.launches[0].kernel.wgsl
    finally:
        ctx._target = saved
    assert names(gr) == ["fused_vector"]
    if d <= 16 * 256:  # unrolled; the longest row keeps the loops
        assert "subgroupAdd" in src or "subgroupMax" in src, src
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_row_write_computes_its_updates(ctx):
    """scatter_nd writes rows computed inline (a RoPE-like chain of the new key); the
    unchanged rows are still copied (stateless graph)."""
    b = MLGraphBuilder(ctx)
    past = b.input("past", data_type="float32", shape=[1, 2, 5, 4])
    k = b.input("k", data_type="float32", shape=[1, 2, 1, 4])
    c = b.input("c", data_type="float32", shape=[1, 1, 1, 4])
    idx = b.constant(data_type="int32", shape=[1, 2, 1, 3],
                     value=np.array([0, 0, 3, 0, 1, 3], np.int32).reshape(1, 2, 1, 3))
    rot = b.concat([b.neg(b.slice(k, [0, 0, 0, 2], [1, 2, 1, 2])),
                    b.slice(k, [0, 0, 0, 0], [1, 2, 1, 2])], 3)
    upd = b.add(b.mul(k, c), rot)
    y = b.scatter_nd(past, idx, upd)
    pv, kv, cv = (RNG.standard_normal(s).astype(np.float32)
                  for s in ((1, 2, 5, 4), (1, 2, 1, 4), (1, 1, 1, 4)))
    g, out = run(ctx, b, {"y": y}, {"past": pv, "k": kv, "c": cv})
    assert names(g) == ["copy_vec4", "scatter_nd"]
    want = pv.astype(np.float64).copy()
    k64 = kv.astype(np.float64)
    want[0, :, 3] = (k64 * cv + np.concatenate([-k64[..., 2:], k64[..., :2]], -1))[0, :, 0]
    np.testing.assert_allclose(out["y"], want, rtol=1e-6, atol=1e-6)


def test_row_write_never_computes_updates_from_the_cache_it_writes(ctx):
    """Updates that read a paired cache stay a launch of their own (``no_read``)."""
    from backends.webnn._classes import _frozen  # the build's hand-off (ir.Graph)

    b = MLGraphBuilder(ctx)
    past = b.input("past", data_type="float32", shape=[1, 1, 4, 2])
    idx = b.constant(data_type="int32", shape=[1, 1, 1, 3],
                     value=np.array([0, 0, 2], np.int32).reshape(1, 1, 1, 3))
    upd = b.mul(b.slice(past, [0, 0, 0, 0], [1, 1, 1, 2]), const(b, [2.0]))
    y = b.scatter_nd(past, idx, upd)
    nodes = _frozen({"y": y}, {}, []).nodes
    _, free = fusion.plan(nodes, {y._id}, set(), 8)
    _, guarded = fusion.plan(nodes, {y._id}, set(), 8, no_read={past._id})
    assert y._id in free and y._id not in guarded


@pytest.mark.parametrize("heads,d,other_reader", [(3, 37, False), (5, 300, False), (3, 37, True)])
def test_row_norm_is_one_launch(ctx_with, heads, d, other_reader):
    """An L2 norm per head, ``x / sqrt(sum(x * x, last axis) + eps)`` over (1, heads, d),
    with GPU kernels forced: one launch with a workgroup per head (rows longer than the
    workgroup too); a reduction read by anything else keeps its own launch."""
    ctx = ctx_with(gemv="rows_sh")
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, heads, d])
    ss = b.reduce_sum(b.mul(x, x), axes=[2], keep_dimensions=True)
    eps = b.constant(data_type="float32", shape=[1], value=np.float32([1e-6]))
    outs = {"y": b.div(x, b.sqrt(b.add(ss, eps)))}
    if other_reader:
        outs["ss"] = ss
    xv = RNG.standard_normal((1, heads, d)).astype(np.float32)
    gr, out = run(ctx, b, outs, {"x": xv})
    kinds = names(gr)
    if other_reader:
        assert "fused_vector" not in kinds and "reduce_sum" in kinds, kinds
    else:
        assert kinds == ["fused_vector"], kinds
    x64 = xv.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).sum(axis=2, keepdims=True) + 1e-6)
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-6)


def test_concat_costs_its_dearest_input_not_their_sum(ctx):
    """A concat's element evaluates one of its inputs (kernels/fused returns from the
    branch it falls in), so two 31-evaluation branches cost 32 an element, inside
    MAX_CALLS (48), and stay one launch; summed (63) they would be split. As
    genai's q4f16 Qwen3.5 spells partial RoPE after q_norm, with float16 round trips
    lengthening each branch."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 8])
    c1, c2 = const(b, [0.9]), const(b, [0.125])

    def branch(t):
        for _ in range(15):
            t = b.add(b.mul(t, c1), c2)
        return t

    lo = branch(b.slice(x, [0, 0], [2, 4]))
    hi = branch(b.slice(x, [0, 4], [2, 4]))
    y = b.concat([hi, lo], 1)
    assert fusion.MAX_CALLS < 2 * 31 + 1 and 31 + 1 <= fusion.MAX_CALLS
    xv = RNG.standard_normal((2, 8)).astype(np.float32)
    g, out = run(ctx, b, {"y": y}, {"x": xv})
    assert len(names(g)) == 1 and names(g)[0].startswith("fused:"), names(g)
    t = xv.astype(np.float64)
    for _ in range(15):
        t = t * np.float64(np.float32(0.9)) + 0.125
    want = np.concatenate([t[:, 4:], t[:, :4]], 1)
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads,d,flat_gate", [(3, 37, False), (4, 16, True), (2, 300, False)])
def test_row_norm_of_a_flat_view_is_one_launch(ctx_with, heads, d, flat_gate):
    """The norm per head read back as one flat row (1, 1, heads * d) and scaled there (q
    scaled after its L2 norm, genai's Qwen3.5; with ``flat_gate`` a gate of the flat
    shape too, as GatedRMSNorm's ``* silu(z)``): the root is a view of the reduction's
    input, so a workgroup per head still computes each element with its own head's
    reduction: one launch, against float64 NumPy on fresh random inputs."""
    ctx = ctx_with(gemv="rows_sh")
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 1, heads * d])
    z = b.input("z", data_type="float32", shape=[1, 1, heads * d])
    xh = b.reshape(x, [1, 1, heads, d])
    ss = b.reduce_sum(b.mul(xh, xh), axes=[3], keep_dimensions=True)
    eps = b.constant(data_type="float32", shape=[1], value=np.float32([1e-6]))
    flat = b.reshape(b.div(xh, b.sqrt(b.add(ss, eps))), [1, 1, heads * d])
    y = b.mul(flat, b.sigmoid(z)) if flat_gate else b.mul(flat, const(b, [0.25]))
    xv, zv = (RNG.standard_normal((1, 1, heads * d)).astype(np.float32) for _ in range(2))
    gr, out = run(ctx, b, {"y": y}, {"x": xv, "z": zv} if flat_gate else {"x": xv})
    assert names(gr) == ["fused_vector"], names(gr)
    x64 = xv.astype(np.float64).reshape(1, 1, heads, d)
    want = (x64 / np.sqrt((x64 * x64).sum(axis=3, keepdims=True) + 1e-6)).reshape(1, 1, -1)
    want = want / (1 + np.exp(-zv.astype(np.float64))) if flat_gate else want * 0.25
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-6)


def test_row_norm_read_across_heads_keeps_its_launches(ctx_with):
    """A root of the reduction input's shape whose elements are read out of order (a
    transpose between the norm and the root) is no row of its own head: the reduction
    and the tail stay apart (one launch a workgroup per row read each element with the
    wrong row's reduction before: 24 of 32 wrong)."""
    ctx = ctx_with(gemv="rows_sh")
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 4, 8])
    ss = b.reduce_sum(b.mul(x, x), axes=[2], keep_dimensions=True)
    y = b.reshape(b.transpose(b.div(x, b.sqrt(ss)), permutation=[0, 2, 1]), [1, 4, 8])
    y = b.mul(y, const(b, [2.0]))
    xv = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    gr, out = run(ctx, b, {"y": y}, {"x": xv})
    assert "fused_vector" not in names(gr), names(gr)
    x64 = xv.astype(np.float64)
    want = 2.0 * (x64 / np.sqrt((x64 * x64).sum(axis=2, keepdims=True))).transpose(0, 2, 1)
    np.testing.assert_allclose(out["y"], want.reshape(1, 4, 8), rtol=1e-5, atol=1e-6)
