"""A per-head norm of q (Qwen3.5's ``SimplifiedLayerNormalization`` over the head dimension
before the rotary embedding): its mean of squares computed by the attention kernel reading
q's rows (``wgpu_impl/row_stat``, ``kernels/attention.RowReduce``), no ``reduce_mean``
launch. Checked against a float64 NumPy oracle on fresh random inputs for the flash and
tile kernels; the reduction keeps its launch where it is read otherwise or is not one a
row; the kernels' WGSL (q's statistic, a row write's) is checked with naga and Tint."""

from __future__ import annotations

import numpy as np
import pytest
from test_webnn_attention import RNG
from test_webnn_attention_epilogue import _check as check
from test_webnn_attention_epilogue import _launches

from backends.webnn import MLGraphBuilder

EPS = 1e-6


def graph(ctx, heads: int, g: int, cap: int, d: int, variant: str = "norm"):
    """Decode attention whose q is ``x`` (one flat row) RMS-normalised per head (rows of
    ``d``) with a weight, then half-rotated on its first half (partial rotary);
    ``variant`` "output": the mean of squares a graph output too; "whole": the mean over
    all heads at once (not one a row); "permuted": x's rows are (q row, head), the heads
    transposed out after the rotary (a K-token verify's q: ``RowStat.rows``)."""
    b = MLGraphBuilder(ctx)
    n = heads * g * d
    x = b.input("x", data_type="float32", shape=[1, 1, n])
    w = b.input("w", data_type="float32", shape=[d])
    k = b.input("k", data_type="float32", shape=[1, heads, cap, d])
    v = b.input("v", data_type="float32", shape=[1, heads, cap, d])
    valid = b.input("valid", data_type="float32", shape=[1, 1, 1, cap])
    scale = b.constant(data_type="float32", shape=[1], value=np.float32([1 / np.sqrt(d)]))
    eps = b.constant(data_type="float32", shape=[], value=np.float32(EPS))
    zero = b.constant(data_type="float32", shape=[1], value=np.float32([0.0]))
    neg = b.constant(data_type="float32", shape=[1], value=np.float32([-np.inf]))
    rows = b.reshape(x, [1, heads * g, d] if variant != "whole" else [1, 1, n])
    ms = b.reduce_mean(b.mul(rows, rows), axes=[2], keep_dimensions=True)
    normed = b.mul(b.div(rows, b.sqrt(b.add(ms, eps))),
                   w if variant != "whole" else b.reshape(b.expand(
                       b.reshape(w, [1, d]), [heads * g, d]), [n]))
    q4 = b.reshape(normed, [1, heads * g, d])
    h, r = d // 2, d // 4  # rotate half of the first half; the rest passes through
    lo = b.slice(q4, [0, 0, 0], [1, heads * g, r])
    hi = b.slice(q4, [0, 0, r], [1, heads * g, r])
    rest = b.slice(q4, [0, 0, h], [1, heads * g, d - h])
    q = b.concat([b.neg(hi), lo, rest], 2)
    if variant == "permuted":
        q = b.transpose(b.reshape(q, [1, g, heads, d]), [0, 2, 1, 3])
    q = b.reshape(q, [1, heads, g, d])
    s = b.mul(b.matmul(q, b.transpose(k, [0, 1, 3, 2])), scale)
    o = b.matmul(b.softmax(b.where(b.greater(valid, zero), s, neg), 3), v)
    outs = {"y": o}
    if variant == "output":
        outs["ms"] = ms
    return b.build(outs), outs


def feeds_and_oracle(heads: int, g: int, cap: int, d: int, variant: str = "norm"):
    """Fresh random inputs and the float64 results."""
    n = heads * g * d
    depth = int(RNG.integers(1, cap))
    feeds = {"x": RNG.standard_normal((1, 1, n)) * 3, "w": RNG.standard_normal(d),
             "k": RNG.standard_normal((1, heads, cap, d)),
             "v": RNG.standard_normal((1, heads, cap, d)),
             "valid": (np.arange(cap) < depth).astype(np.float64).reshape(1, 1, 1, cap)}
    rows = feeds["x"].reshape(1, heads * g, d) if variant != "whole" else feeds["x"]
    ms = (rows * rows).mean(-1, keepdims=True)
    q4 = (rows / np.sqrt(ms + EPS)).reshape(1, heads * g, d) * feeds["w"]
    h, r = d // 2, d // 4
    q = np.concatenate([-q4[..., r:h], q4[..., :r], q4[..., h:]], -1)
    if variant == "permuted":
        q = q.reshape(1, g, heads, d).transpose(0, 2, 1, 3)
    q = q.reshape(1, heads, g, d)
    sc = np.einsum("bhgd,bhcd->bhgc", q, feeds["k"]) / np.sqrt(d)
    sc = np.where(feeds["valid"] > 0, sc, -np.inf)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    want = {"y": np.einsum("bhgc,bhcd->bhgd", e / e.sum(-1, keepdims=True), feeds["v"])}
    if variant == "output":
        want["ms"] = ms
    return feeds, want


def _check(ctx, gr, outs, feeds, want) -> None:
    check(ctx, gr, outs, feeds, want, atol=2e-5)


@pytest.mark.parametrize("how,kernel,heads,g,d", [
    *[(how, kernel, *shape) for how, kernel in (("flash", "attention_flash"),
                                                ("tile_t32", "attention_tile"))
      for shape in ((2, 2, 32), (2, 4, 16), (1, 3, 64))],
    ("flash", "attention_flash", 2, 2, 256)])  # Qwen3.5's head: rows longer than a workgroup
@pytest.mark.parametrize("variant", ["norm", "permuted"])
def test_the_attention_computes_qs_norm(ctx_with, how, kernel, heads, g, d, variant):
    """The attention's two launches and nothing else: pass 1 reduces each of its q rows
    (the mean of squares) before it loads them."""
    cap = 300
    ctx = ctx_with(attention=how)
    gr, outs = graph(ctx, heads, g, cap, d, variant)
    assert _launches(gr) == [kernel, "attention_combine"], _launches(gr)
    norms = [m.q_norm for m in gr._plan.attention.values()]
    assert norms and all(x is not None and (x.rows is None) == (variant == "norm" or heads == 1)
                         for x in norms), norms
    _check(ctx, gr, outs, *feeds_and_oracle(heads, g, cap, d, variant))


@pytest.mark.parametrize("variant", ["output", "whole"])
def test_the_norm_keeps_its_launch_where_it_is_not_the_kernels(ctx, variant):
    """The mean of squares read as a graph output, or over all heads at once (not one
    value a q row): a launch of its own, and the same results."""
    heads, g, cap, d = 2, 2, 100, 16
    gr, outs = graph(ctx, heads, g, cap, d, variant)
    assert "reduce_mean" in _launches(gr), _launches(gr)
    assert all(m.q_norm is None for m in gr._plan.attention.values())
    _check(ctx, gr, outs, *feeds_and_oracle(heads, g, cap, d, variant))


@pytest.mark.parametrize("engine", ["wgpu", "dawn"])
@pytest.mark.parametrize("sub", [None, 32])
def test_the_norms_kernels_compile_with_naga_and_tint(engine, sub):
    """Flash and tile pass 1 computing q's statistic (a subgroup's sums or a tree; the
    tile's q rows reading theirs through a table) and
    writing a new K row whose update reads its own (``RowWrites.stats``), at Qwen3.5's
    head dimension: both engines' compilers accept them."""
    from wgsl_compilers import compiler_device, rejection

    from backends.webnn.kernels.attention import RowWrites, flash_decode
    from backends.webnn.kernels.attention_tile import flash_tile, tile_plan
    from backends.webnn.kernels.fused import functions, leaf_decls

    if compiler_device(engine)[0] is None:
        pytest.skip(compiler_device(engine)[1])
    heads, g, cap = 2, 2, 64
    kernels = []
    for d in (256, 64):  # Qwen3.5's (flash alone), and one the tile lays out
        n = heads * g * d
        q_chain = _norm_chain(n, d, "qn")
        ops, leaves = _norm_chain(heads * d, d, "wn0")
        usrc = leaf_decls(leaves, 6, "w0_")[0] + functions(ops, leaves, "w0_")[0]
        writes = RowWrites("i32", heads, (1, heads, cap, d),
                           ((usrc, ["read"], "w0_v1"), None), True, (_squares(d, 7, "w0r_"), None))
        kernels.append(flash_decode(heads, g, cap, d, None, 12288, q_chain, kv="f16",
                                    writes=writes, subgroup=sub, q_red=_squares(d, 1, "qr_"))[0])
        plan = tile_plan(g, cap, d, "f16", 12288, None)
        if plan is not None:
            kernels.append(flash_tile(heads, g, cap, d, None, plan, q_chain, writes=writes,
                                      sync=sub, q_red=_squares(d, 1, "qr_", heads * g))[0])
    assert [k.name for k in kernels] == ["attention_flash", "attention_flash", "attention_tile"]
    assert "qr_rows[" in kernels[-1].wgsl
    for k in kernels:
        assert "qn_r[" in k.wgsl and "wn0" in k.wgsl
        assert rejection(engine, k.wgsl) == "", k.wgsl


def _norm_chain(size: int, d: int, name: str) -> tuple[list, list]:
    """Fused ops of ``x / sqrt(stat)`` over a flat row of ``size`` (rows of ``d``), the
    row's statistic the argument ``name``."""
    from backends.webnn.kernels.fused import FusedOp, Leaf

    m = size // d
    return ([FusedOp("sqrt", {}, "f32", (m, 1), [("leaf", 1)], ["f32"], [(m, 1)]),
             FusedOp("div", {}, "f32", (m, d), [("leaf", 0), ("op", 0)], ["f32", "f32"],
                     [(m, d), (m, 1)])],
            [Leaf("f32", size), Leaf("f32", m, True, name)])


def _squares(d: int, first: int, p: str, rows: int = 0):
    """The mean of squares of rows of ``d`` of one buffer bound at ``first``; ``rows``:
    that many rows read in reverse order (a table, ``RowReduce.row_of``)."""
    from backends.webnn.kernels.attention import RowReduce
    from backends.webnn.kernels.common import decl

    src = decl(first, f"{p}in0", "f32", "read")
    if rows:
        src += (f"var<private> {p}rows: array<u32, {rows}> = array<u32, {rows}>("
                + ", ".join(f"{r}u" for r in reversed(range(rows))) + ");\n")
    return RowReduce("reduce_mean", d, src, ["read"], f"{p}in0[{{0}}] * {p}in0[{{0}}]",
                     f"{p}rows[{{}}]" if rows else "{}")
