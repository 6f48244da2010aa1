"""The two-launch attentions' statistics met by subgroups (``KernelOptions.attention_sync``
"subgroups"): flash's split maximum and sum by ``subgroupMax`` /
``subgroupAdd``, its float16 probs·V with the V words loaded before the scores and the
row-groups summed by shuffles, tile's per-row statistics alike, and the combine's split
weights by every invocation, against the float64 NumPy oracle at the adapter's own fixed
subgroup width, on fresh random inputs (masks leaving whole splits empty, the stateful
float16 graph writing its row in the first launch); "trees" keeps the kernels before."""

from __future__ import annotations

import numpy as np
import pytest
from test_webnn_attention import _check_f16_stateful, _three_depths_match, graph
from test_webnn_quant import _gpu_at_width

LOWEST = float(np.finfo(np.float32).min)


def _ctx(ctx_with, subgroup_size, monkeypatch, **knobs):
    """A context planning as a GPU (cpu=False) at the adapter's own fixed subgroup width."""
    return _gpu_at_width(ctx_with(**knobs), True, subgroup_size, monkeypatch)


@pytest.mark.parametrize("shape,how,fill", [
    ((2, 4, 300, 16), "flash", LOWEST),  # 3 splits, the last short; float32: stats only
    ((1, 1, 37, 4), "flash", -np.inf),
    ((3, 8, 4000, 32), "flash", -1e9),  # 32 splits of 128 rows: the combine's 32 weights
    ((2, 4, 300, 16), "tile", -np.inf),
    ((2, 16, 517, 64), "tile_t64", LOWEST),  # 16 q rows: 16 invocations a row's statistics
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))
def test_subgroup_statistics_float32_cache(ctx_with, subgroup_size, monkeypatch, shape, how,
                                           fill):
    ctx = _ctx(ctx_with, subgroup_size, monkeypatch, attention=how, attention_rows=how,
               attention_sync="subgroups")
    gr, outs = graph(ctx, shape[0], shape[1], shape[2], shape[3], fill)
    k1, k2 = (la.kernel for la in gr._plan.launches)
    assert "subgroupAdd(" in k2.wgsl and "subgroupMax(" in k1.wgsl
    _three_depths_match(ctx, gr, outs, shape, 2)
    # each head's last workgroup combining (flash and tile), its weights at the same width
    last = _ctx(ctx_with, subgroup_size, monkeypatch, attention=how, attention_rows=how,
                attention_sync="subgroups", attention_combine="last")
    gl, outs = graph(last, shape[0], shape[1], shape[2], shape[3], fill)
    assert [la.kernel.name for la in gl._plan.launches] == [k1.name]
    assert "atomicAdd(&cnt[" in gl._plan.launches[0].kernel.wgsl
    _three_depths_match(last, gl, outs, shape, 2)
    trees = _ctx(ctx_with, subgroup_size, monkeypatch, attention=how, attention_rows=how,
                 attention_sync="trees")
    gt, _ = graph(trees, *shape, fill)
    t1, t2 = (la.kernel for la in gt._plan.launches)  # (tile's probs·V keeps its subgroupAdd)
    assert "subgroupMax(" not in t1.wgsl and "subgroup" not in t2.wgsl


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("loads", [None, "first", "first+last", "kv+last"])
@pytest.mark.parametrize("heads,g,cap,d,how", [
    (2, 4, 544, 64, "flash"),  # llama-1b's head: 8 words a row, 8 V words an invocation first
    (2, 4, 4104, 64, "flash"),  # 256 rows a split: 16 a row-group, V loaded after the statistics
    (2, 4, 300, 16, "flash"),  # 2 words a row: row-groups summed by shuffles within a subgroup
    (2, 4, 700, 64, "tile_t256"),  # tile's statistics and the combine
])
def test_subgroup_statistics_float16_cache(ctx_with, subgroup_size, monkeypatch, heads, g, cap,
                                           d, how, loads):
    """``loads`` "first" (``KernelOptions.attention_loads``): K's and V's words loaded
    before the folded row write and q, loaded again by the workgroup that wrote (the
    written rows fall in the last, a random and the first split); its kernel compiles
    with naga and Tint; "kv": V's words issued with K's (tile). "+last": the splits
    combined by each head's last workgroup (``attention_combine``), no combine launch."""
    loads, _, last = (loads or "").partition("+")
    ctx = _ctx(ctx_with, subgroup_size, monkeypatch, attention=how, attention_sync="subgroups",
               attention_loads=loads or None, attention_combine=last or None)
    names = _check_f16_stateful(ctx, heads, g, cap, d)
    assert names.count(f"attention_{how.split('_')[0]}") == 1, names
    assert ("attention_combine" in names) != bool(last), names
    if loads == "first":
        from test_webnn_attention import f16_cache_graph
        from test_wgsl_engines import ENGINES, _rejected, compiler_device

        k1 = next(la.kernel for la in f16_cache_graph(ctx, heads, g, cap, d, True)[0]._plan
                  .launches if la.kernel.name.startswith("attention_"))
        if cap == 4104:  # 512 rows a split: an invocation scores two, so K stays in place
            assert "kw0" not in k1.wgsl and "wrote" not in k1.wgsl
        else:
            assert k1.wgsl.index("kw0 = k[") < k1.wgsl.index("qs[jj] =")
            assert "if (wrote) {" in k1.wgsl
        errors = [err for e in ENGINES if compiler_device(e)[0] is not None
                  and (err := _rejected(e, {k1.wgsl: k1.name}))]
        assert not errors, "\n".join(errors)
