"""The many-rows decode attention (``KernelOptions.attention_rows`` / ``attention`` "tile",
``kernels/attention_tile.py``) against the float64 NumPy oracle on fresh random inputs: float32
and float16 caches, a K-token verify's rows each under its own causal mask row, q rows in
groups along the grid's z, splits no capacity divides, masks leaving whole splits empty with a
finite and an infinite fill; where it does not apply, the flash kernels."""

from __future__ import annotations

import numpy as np
import pytest
from test_webnn_attention import (
    _check_f16_stateful,
    _one_names,
    _three_depths_match,
    graph,
    oracle,
    run,
    verify_graph,
)

from backends.webnn.kernels import attention_tile as ATT
from backends.webnn.wgpu_impl.options import KernelOptions
from backends.webnn.wgpu_impl.target import Target

RNG = np.random.default_rng(20261206)
LOWEST = float(np.finfo(np.float32).min)


@pytest.mark.parametrize("shape,how,fill", [
    ((2, 4, 300, 16), "tile", LOWEST),  # 3 splits of 128, the last short
    ((1, 1, 37, 4), "tile", -np.inf),  # one short split of 64 rows, one q row
    ((2, 16, 517, 64), "tile_t32", LOWEST),  # 16 rows, d 64 float32: 256 outputs, no row splits
    ((1, 24, 300, 16), "tile_t64", -np.inf),  # 24 rows: two groups of 12 along z
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))
def test_tile_matches_oracle_float32_cache(ctx_with, shape, how, fill):
    heads, g, cap, d = shape
    ctx = ctx_with(attention=how, attention_rows=how)
    gr, outs = graph(ctx, heads, g, cap, d, fill)
    assert _one_names(gr) == ["attention_tile", "attention_combine"]
    tile = gr._plan.launches[0].kernel
    rows = ATT.tile_plan(g, cap, d, "f32", ctx._target.shared_bytes // 4,
                         KernelOptions(attention=how).attention_tile()[0]).rows
    assert tile.groups == (-(-cap // rows), heads, g // min(g, 12 if g == 24 else 16))
    _three_depths_match(ctx, gr, outs, shape, 2)


@pytest.mark.parametrize("heads,g,k,cap,d", [
    (2, 16, 4, 700, 64),  # llama-1b's K = 4 verify: 16 rows a KV head
    (2, 12, 3, 300, 16),
    (1, 32, 8, 150, 16),  # K = 8: two groups of 16 along z
    (1, 16, 4, 2200, 64),  # 18 splits, a lane a (row, word): the last combine's load batches
])
@pytest.mark.parametrize("combine", [None, "last"])
def test_tile_verify_rows_causal_inside_k(ctx_with, heads, g, k, cap, d, combine):
    """Each q row under its own mask row (causal inside the K new tokens), so a workgroup
    scoring one row against another's mask, or writing another's partials, fails;
    ``combine`` "last": each (KV head, q-row group)'s last workgroup combines its rows (its
    own counter: two groups along z at K = 8)."""
    ctx = ctx_with(attention_rows="tile", attention_combine=combine)
    gr, outs = verify_graph(ctx, heads, g, k, cap, d)
    assert _one_names(gr) == ["attention_tile"] + ([] if combine else ["attention_combine"])
    depth = cap - k - 9
    token = np.arange(g) // (g // k)
    valid = (np.arange(cap)[None, :] < depth + token[:, None] + 1).astype(np.float64)
    feeds = {"q": RNG.standard_normal((1, heads, g, d)),
             "k": RNG.standard_normal((1, heads, cap, d)),
             "v": RNG.standard_normal((1, heads, cap, d)), "valid": valid.reshape(1, 1, g, cap)}
    np.testing.assert_allclose(run(ctx, gr, outs, feeds)["y"], oracle(**feeds), rtol=2e-5,
                               atol=2e-6)


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("g,cap,d", [
    (4, 8192 - 5, 64),  # llama-1b's head, one token: 65 splits of 128 rows
    (16, 300, 64),  # a K = 4 verify's rows a KV head
    (8, 150, 128),  # 16 words a row: the most an invocation holds
    (3, 70, 24),  # 3 words a row, 3 q rows
])
def test_tile_float16_cache(ctx_with, g, cap, d):
    """Float16 caches read as 16-byte words of 8 halves, in the stateful graph (its row
    write a launch of its own: only flash takes it in), against float64 NumPy with the
    rows rounded to float16."""
    names = _check_f16_stateful(ctx_with(attention="tile", attention_rows="tile"), 2, g, cap, d)
    assert names.count("attention_tile") == 1 and "attention_flash" not in names, names


@pytest.mark.adapter_feature("shader-f16")
def test_tile_not_applicable_keeps_flash(ctx_with):
    """d 256 over a float16 cache (32 words a row, hybrid-1b's head) and d 20 (not whole
    16-byte words): the flash kernels, still matching the oracle."""
    for g, d in ((8, 256), (4, 20)):
        assert ATT.tile_plan(g, 300, d, "f16", 12288) is None
        names = _check_f16_stateful(ctx_with(attention="tile", attention_rows="tile"), 1, g,
                                    300, d)
        assert "attention_tile" not in names and "attention_flash" in names, names


def test_tile_plan_and_knob():
    """llama-1b's verify head on a GPU's 48 KB: 128 rows a split, 16 rows a workgroup, two
    invocations an output word; fewer rows where workgroup memory or the cache is short."""
    plan = ATT.tile_plan(16, 8200, 64, "f16", 12288)
    assert (plan.rows, plan.group, plan.words, plan.row_splits) == (128, 16, 8, 2)
    assert plan.shared_floats(64) <= 12288
    assert ATT.tile_plan(16, 8200, 64, "f16", 12288, rows=256).rows == 256
    assert ATT.tile_plan(16, 8200, 64, "f16", 4200).rows == 32
    assert ATT.tile_plan(16, 8200, 64, "f16", 1000) is None
    assert ATT.tile_plan(4, 40, 64, "f16", 12288).rows == 64
    assert ATT.tile_plan(12, 8200, 64, "f32", 12288).group == 12
    assert KernelOptions(attention_rows="tile_t64").attention_tile(16) == (64,)
    assert KernelOptions(attention_rows="tile").attention_tile(16) == (None,)
    assert KernelOptions(attention_rows="tile").attention_tile(4) is None  # one token: flash
    assert KernelOptions(attention_rows="tile").attention_matched(16)
    gpu, cpu = Target(cpu=False, subgroup=32), Target(cpu=True)
    default = KernelOptions()
    assert default.attention_tile(4, 8200, gpu) == (256,)  # one token at 8200: tile, T 256
    assert default.attention_tile(16, 8200, gpu) == (None,)  # a verify's rows: the default T
    assert default.attention_tile(4, 544, gpu) is None  # short caches: flash
    assert default.attention_tile(4, 1032, gpu) is None
    assert default.attention_tile(4, 2056, gpu) == (256,)  # one token from 2048 rows: tile
    assert default.attention_tile(16, 2056, gpu) is None  # a verify's from 8192 rows
    assert default.attention_tile(16, 8200, cpu) is None  # CPU adapters: flash
    assert KernelOptions(attention="flash").attention_tile(4, 8200, gpu) is None
    for bad in ("tile_t48", "tile64", "tiles"):
        with pytest.raises(ValueError, match="tile"):
            KernelOptions(attention_rows=bad)


@pytest.mark.parametrize("cache,g,cap,d,how", [
    ("float16", 4, 700, 64, "tile_t256"),  # llama-1b's one-token head: 8 V words an invocation
    ("float16", 1, 150, 128, "tile_t32"),  # 16 words a row: 16 row shares, 2 rows each
    ("float32", 4, 300, 16, "tile"),  # 4 words a row: 64 row shares, 2 rows each
    ("float32", 2, 517, 64, "tile_t64"),  # 16 words: 16 shares, 4 rows each, last split short
])
def test_tile_lane_pv_at_the_subgroup_width(ctx_with, subgroup_size, monkeypatch, cache, g, cap,
                                            d, how):
    """At a fixed subgroup width a one-token head's probs·V holds every V word an invocation
    needs in registers, loaded before the softmax's statistics, the row shares summed by
    subgroupAdd and the word's subgroups through workgroup memory (``_lane_pv``): against
    float64 NumPy at the adapter's own width."""
    import dataclasses

    if not subgroup_size or subgroup_size & (subgroup_size - 1):
        pytest.skip(f"no fixed power-of-two subgroup width ({subgroup_size})")
    if cache == "float16" and not ctx_with()._target.f16:
        pytest.skip("no shader-f16 on this adapter")
    ctx = ctx_with(attention=how, attention_rows=how)
    monkeypatch.setattr(ctx, "_target", dataclasses.replace(ctx._target, subgroup=subgroup_size))
    if cache == "float16":
        names = _check_f16_stateful(ctx, 2, g, cap, d)
        assert names.count("attention_tile") == 1, names
        return
    gr, outs = graph(ctx, 2, g, cap, d, LOWEST)
    tile = gr._plan.launches[0].kernel
    assert tile.name == "attention_tile" and "subgroupAdd(a0_0)" in tile.wgsl
    _three_depths_match(ctx, gr, outs, (2, g, cap, d), 2)
    first = ctx_with(attention=how, attention_rows=how, attention_loads="first")  # K, V at the start
    monkeypatch.setattr(first, "_target", dataclasses.replace(first._target,
                                                              subgroup=subgroup_size))
    gf, outs = graph(first, 2, g, cap, d, LOWEST)
    src = gf._plan.launches[0].kernel.wgsl
    assert src.index("let vw0 = v[") < src.index("qs[jj] =")
    _three_depths_match(first, gf, outs, (2, g, cap, d), 2)
    kv = ctx_with(attention=how, attention_rows=how, attention_loads="kv")  # V with K
    monkeypatch.setattr(kv, "_target", dataclasses.replace(kv._target, subgroup=subgroup_size))
    gk, outs = graph(kv, 2, g, cap, d, LOWEST)
    src = gk._plan.launches[0].kernel.wgsl
    assert src.index("qs[jj] =") < src.index("let vw0 = v[") < src.index("let raw")
    _three_depths_match(kv, gk, outs, (2, g, cap, d), 2)
    walk = ctx_with(attention=how, attention_rows=how, tile_pv="walk")  # the knob's other way
    monkeypatch.setattr(walk, "_target", dataclasses.replace(walk._target, subgroup=subgroup_size))
    gw, _ = graph(walk, 2, g, cap, d, LOWEST)
    assert "subgroupAdd" not in gw._plan.launches[0].kernel.wgsl


def test_tile_lane_pv_where_it_applies():
    """``_lane_pv`` takes a one-token head's probs·V only at a fixed subgroup width that
    divides the row shares, whose rows a split they divide; the verify's 16 rows and other
    widths keep the walk."""
    one = ATT.tile_plan(4, 8200, 64, "f16", 12288, rows=256)
    assert ATT.lane_pv_applies(one, 32) and ATT.lane_pv_applies(one, 8)
    assert not ATT.lane_pv_applies(one, None) and not ATT.lane_pv_applies(one, 64)
    assert not ATT.lane_pv_applies(ATT.tile_plan(16, 8200, 64, "f16", 12288), 32)
    assert not ATT.lane_pv_applies(ATT.tile_plan(3, 70, 24, "f16", 12288), 8)  # 3 words
    k1 = ATT.flash_tile(8, 4, 8200, 64, None, one, kv="f16", subgroup=32)[0]
    assert k1.wgsl.count("subgroupAdd(") == 8 and "let vw7 = v[" in k1.wgsl
    walk = ATT.flash_tile(8, 4, 8200, 64, None, one, kv="f16")[0]
    assert "subgroupAdd" not in walk.wgsl
