"""A layer's K and V row writes folded into its attention's first launch
(``KernelOptions.attention_writes``, ``match_attention.fold_row_writes``): on the GPU's plan
(forced on this adapter) the stateful page has no ``scatter_nd`` launch and still computes
the float64 reference's logits (presets: float32 and float16 caches, every load path of
``flash_decode``: 16-byte words of 8 halves, ``vec4``, scalars) and ORT's (the exporters'
own spellings of attention); the other pages, which write the rows into a copy, keep the
row-write launch."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from at_depth import at_depth

from backends.base import DepthState, registry
from backends.pages import StatefulInPlace, StatelessCopy
from backends.webnn.wgpu_impl import context, options
from backends.webnn.wgpu_impl.options import KernelOptions
from harness.metrics import FLOAT32_TOLERANCE, logits_tolerance
from model.reference import Reference
from model.workload import ATTENTION, Workload, preset, token_stream

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)


@pytest.fixture
def gpu_plan(monkeypatch):
    """This adapter's contexts plan as a GPU's (the passes and kernels the H200 runs)."""
    real = context.target_of
    monkeypatch.setattr(context, "target_of", lambda *a: dataclasses.replace(
        real(*a), cpu=False, max_storage=16, shared_bytes=32768))


def _names(page) -> list[str]:
    return [la.kernel.name for la in page.converted.graph._plan.launches
            if hasattr(la, "kernel")]


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("name,head_dim,loads", [
    ("tiny", 16, None),  # float32 cache: vec4 words
    ("tiny+f16kv", 16, None),  # float16 cache: 16-byte words of 8 halves
    ("tiny+f16kv", 16, "vec4"),  # float16 cache: vec4<f16>
    ("tiny+q4f16", 16, None),
    ("tiny", 6, None),  # a row of 6: scalars
    ("tiny+f16kv", 6, None),
    ("tiny+f16kv", 16, "tile"),  # attention="tile": its first launch writes the rows
    ("tiny+q4f16", 16, "tile")])
def test_folded_row_writes_compute_the_reference(gpu_plan, name, head_dim, loads):
    """Two attention layers (q 4 heads, kv 2, the row written at the new position in each
    layer's float32 or float16 cache): the walk to depth 16 and 3 more steps, each within the
    preset's tolerance of the float64 reference, argmax included; the same with the fold
    off, which keeps one row-write launch a layer. ``loads`` "tile": the attention is
    ``attention_tile``'s (``KernelOptions.attention``), which takes the rows the same way."""
    cfg = replace(preset(name), layers=(ATTENTION,) * 2, head_dim=head_dim)
    wl = Workload.build(cfg)
    tol = logits_tolerance(cfg) if "q4f16" in name else (
        1e-5 if "f16kv" in name else FLOAT32_TOLERANCE)
    cap, depth = 24, 16
    counts = {}
    for fold in (None, "off"):
        tile = loads == "tile"
        b = StatefulInPlace(options=KernelOptions(
            attention_writes=fold, f16_loads=None if tile else loads, gemv="rows",
            attention="tile" if tile else None))
        b.prepare(wl, cap)
        try:
            counts[fold] = _names(b).count("scatter_nd")
            assert _names(b).count("attention_tile") == (2 if tile else 0)
            tokens, ref = at_depth(b, wl, cap, depth)
            for i in range(3):
                tok = int(tokens[depth + i])
                got, want = np.asarray(b.step(tok), np.float64), ref.step(tok)
                rel = np.abs(got - want).max() / np.abs(want).max()
                assert rel < tol, f"{name} d{head_dim} fold={fold} step {i}: {rel:.2e}"
                assert got.argmax() == want.argmax()
        finally:
            b.close()
    assert counts == {None: 0, "off": 2}, counts


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("name,head_dim,loads,cap,depth", [
    ("tiny+f16kv", 64, None, 24, 16), ("tiny", 32, None, 24, 16),
    ("tiny+q4f16", 64, None, 24, 16),
    ("tiny+f16kv", 64, "first", 24, 16),  # K and V loaded before the write, then again
    ("tiny+q4f16", 64, "first", 100, 40),  # 4 splits: the row in the second, the rest not
    ("tiny", 32, "first", 100, 70)])  # float32 words, the row in the third split
def test_folded_row_writes_with_the_tiles_lane_probs_v(monkeypatch, subgroup_size, name,
                                                       head_dim, loads, cap, depth):
    """The tile attention's first launch writing the rows, its probs·V in registers and
    summed by subgroups (``attention_tile._lane_pv``, at the adapter's own subgroup width):
    the walk to ``depth`` and 3 more steps within the preset's tolerance of the float64
    reference, argmax included. ``loads`` "first" (``KernelOptions.attention_loads``): every
    workgroup loads its K and V words before the row write, the one whose split takes the
    row loads them again after it (a stale word there fails the reference); its kernel
    compiles with naga and Tint."""
    if not subgroup_size or subgroup_size & (subgroup_size - 1):
        pytest.skip(f"no fixed power-of-two subgroup width ({subgroup_size})")
    real = context.target_of
    monkeypatch.setattr(context, "target_of", lambda *a: dataclasses.replace(
        real(*a), cpu=False, max_storage=16, shared_bytes=32768, subgroup=subgroup_size))
    cfg = replace(preset(name), layers=(ATTENTION,) * 2, head_dim=head_dim)
    wl = Workload.build(cfg)
    tol = logits_tolerance(cfg) if "q4f16" in name else (
        1e-5 if "f16kv" in name else FLOAT32_TOLERANCE)
    b = StatefulInPlace(options=KernelOptions(gemv="rows", attention_loads=loads,
                                              attention="tile" if cap < 32 else "tile_t32"))
    b.prepare(wl, cap)
    try:
        tiles = [la.kernel for la in b.converted.graph._plan.launches
                 if hasattr(la, "kernel") and la.kernel.name == "attention_tile"]
        assert len(tiles) == 2 and all("subgroupAdd(a0_0)" in k.wgsl for k in tiles)
        assert tiles[0].groups[0] == -(-cap // 32)
        assert ("if (wrote) {" in tiles[0].wgsl) == (loads == "first")
        assert "scatter_nd" not in _names(b)
        if loads == "first":
            from test_wgsl_engines import ENGINES, _rejected, compiler_device

            errors = [err for e in ENGINES if compiler_device(e)[0] is not None
                      and (err := _rejected(e, {tiles[0].wgsl: "attention_tile"}))]
            assert not errors, "\n".join(errors)
        tokens, ref = at_depth(b, wl, cap, depth)
        for i in range(3):
            tok = int(tokens[depth + i])
            got, want = np.asarray(b.step(tok), np.float64), ref.step(tok)
            assert np.abs(got - want).max() / np.abs(want).max() < tol, (name, i)
            assert got.argmax() == want.argmax()
    finally:
        b.close()


def test_pages_that_write_a_copy_keep_the_row_write(gpu_plan):
    """The stateless page's caches are its inputs and outputs (each row write copies the
    cache first): nothing to fold, the row writes keep their launch."""
    cfg = replace(preset("tiny"), layers=(ATTENTION,) * 2)
    b = StatelessCopy(options=KernelOptions(gemv="rows"))
    b.prepare(Workload.build(cfg), 24)
    try:
        assert "scatter_nd" in _names(b)
    finally:
        b.close()


@pytest.mark.parametrize("attention", [None, "tile"])
@pytest.mark.parametrize("maker,folded", [("genai_model", True), ("optimum_model", False),
                                          ("onnx_attention_model", False)])
def test_folded_row_writes_in_exported_graphs_compute_orts_logits(gpu_plan, tmp_path, maker,
                                                                  folded, attention):
    """The exporters' spellings of attention (GroupQueryAttention with its rotary caches,
    optimum's concatenated cache and rotate-half, ai.onnx Attention), float32: on the GPU's
    plan the stateful page computes ORT's CPU logits for 6 fresh random tokens, writing
    GroupQueryAttention's rows from its attention launch. The growing caches made
    fixed-capacity (optimum's, ai.onnx Attention's) attend over ``concat(past, new)``, not
    over the written cache, so their row writes keep their launch. ``attention`` "tile": the
    same through ``attention_tile``."""
    import attention_graphs as AG
    import onnx

    from harness.model_run import backend_for

    path = tmp_path / "model.onnx"
    onnx.save(getattr(AG, maker)(), str(path))
    tokens = [int(t) for t in np.random.default_rng().integers(1, AG.VOCAB, 6)]
    want = AG.ort_oracle(path, tokens)
    page = backend_for(registry()["wgpu:stateful"], path, None,
                       KernelOptions(gemv="rows", attention=attention))
    page.prepare(None, 16)
    try:
        kernel = "attention_tile" if attention else "attention_flash"
        assert ("scatter_nd" not in _names(page)) == folded and kernel in _names(page)
        for i, tok in enumerate(tokens):
            got = np.asarray(page.step(tok), np.float64).reshape(-1)
            rel = np.abs(got - want[i]).max() / np.abs(want[i]).max()
            assert rel < 1e-4, f"{maker} step {i}: {rel:.2e}"
    finally:
        page.close()


def test_a_pair_left_two_buffers_keeps_its_row_write(gpu_plan, monkeypatch):
    """Where the planner cannot write a pair in place (forced here: no in-place order), the
    attention cannot write the state it reads: the graph is compiled again without the
    fold, its row writes copy into the other buffer, and the steps still compute the
    reference's logits."""
    from backends.webnn.wgpu_impl import planning

    real = planning.schedule
    monkeypatch.setattr(planning, "schedule", lambda steps, in_place, check: (
        None if in_place else real(steps, in_place, check)))
    cfg = replace(preset("tiny"), layers=(ATTENTION,) * 2)
    wl = Workload.build(cfg)
    b = StatefulInPlace(options=KernelOptions(gemv="rows"))
    b.prepare(wl, 24)
    try:
        plan = b.converted.graph._plan
        assert not plan.in_place and _names(b).count("scatter_nd") == 2, _names(b)
        assert plan.options.attention_writes == "off"
        tokens = token_stream(cfg, 24)
        ref = Reference(cfg, wl.weights, 24)
        ref.prefill(tokens[:8])
        b.reach_depth(DepthState(tokens=tokens[:8].copy(), cache=ref.cache_arrays()))
        for i in range(2):
            tok = int(tokens[8 + i])
            got, want = np.asarray(b.step(tok), np.float64), ref.step(tok)
            assert np.abs(got - want).max() / np.abs(want).max() < FLOAT32_TOLERANCE
    finally:
        b.close()


@pytest.mark.parametrize("k,attention", [(2, None), (4, None), (4, "tile")])
def test_k_token_rows_written_by_attention(gpu_plan, k, attention):
    """The K-token decode graph (issue 31: K new rows a head a dispatch, possibly in two
    splits): every row written by the workgroup whose split holds it, and the steps the
    reference's (``test_ktoken.assert_steps``); flash's workgroups, or tile's."""
    from backends.pages import StatefulInPlace
    from tests.test_ktoken import TINY, assert_steps

    b = StatefulInPlace(options=KernelOptions(attention_writes="fold", attention=attention,
                                              attention_rows=attention), tokens_per_step=k)
    b.prepare(TINY, 24)
    try:
        kernel = "attention_tile" if attention else "attention_flash"
        assert "scatter_nd" not in _names(b) and kernel in _names(b)
        assert_steps(b, k, where=f"K = {k}, rows written by attention")
    finally:
        b.close()


def test_k_token_rows_keep_their_launch_by_default(gpu_plan):
    """By default only a one-token step folds its row writes: a K-row verify's attention
    was slower with them (PERFORMANCE.md, "Knobs"), so its rows keep their launch."""
    from tests.test_ktoken import page

    one, four = page("wgpu:stateful", 1), page("wgpu:stateful", 4)
    try:
        assert "scatter_nd" not in _names(one), _names(one)
        assert "scatter_nd" in _names(four), _names(four)
    finally:
        one.close()
        four.close()


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("q4_rows,attention_rows,q4_norms", [
    (None, None, None), (None, None, "off"), (None, None, "partials"), ("quad", None, None),
    ("quad", "lanes", None), (None, "tile", None), ("cols_h", None, "partials")])
@pytest.mark.parametrize("hybrid", [False, True], ids=["attention", "hybrid"])
def test_q4f16_verify_on_the_gpus_plan_computes_the_reference(gpu_plan, monkeypatch, hybrid,
                                                              q4_rows, attention_rows,
                                                              q4_norms):
    """A K = 4 verify of a q4f16 preset (two attention layers, or tiny's own hybrid of gated
    delta and attention layers) on the H200's plan: the several-row 4-bit products by column
    (``gemm_q4_cols``), each gate/up pair writing SwiGLU (no activation launch), the rows
    written by their own launch (the default for K rows), the verify's q rows in groups;
    two verifies from depth 8, each row within the preset's tolerance of the float64
    reference, argmax included. ``attention_rows`` "lanes": the K rows' queries (tiny's
    8 a KV head at K = 4 is not "many" — ``MANY_Q_ROWS`` is lowered here — 16 on llama-1b)
    scored by ``attention_lanes`` with an online softmax, each cache row loaded once for
    all of them; "tile": scored for all of them by one workgroup a split
    (``attention_tile``). "quad": on the one-token layout, each layer's norms computed in its
    products from the partial sums of squares o and down write (stats and prologue,
    ``q4_norms`` "partials", quad's GPU default): the one norm launch the first layer's; by
    column the same where "partials" is asked for (not yet the default: untimed); else,
    and with ``q4_norms=off``, one launch a norm. "cols_h": by column with float16
    products (q4f16's float16 weights: every product's kernel unpacks code pairs, ``hq``),
    its norms from partial sums as asked."""
    cfg = preset("tiny+q4f16")
    if not hybrid:
        cfg = replace(cfg, layers=(ATTENTION,) * 2)
    wl = Workload.build(cfg)
    k, cap, depth = 4, 24, 8
    monkeypatch.setattr(options, "MANY_Q_ROWS", k * cfg.q_heads // cfg.kv_heads - 1)
    b = StatefulInPlace(options=KernelOptions(q4_rows=q4_rows, attention_rows=attention_rows,
                                              q4_norms=q4_norms), tokens_per_step=k)
    b.prepare(wl, cap)
    try:
        names = _names(b)
        # 4 products a layer (the gate/up pair writing SwiGLU: no "fused:sigmoid+mul+mul",
        # which is its launch with q4_epilogue=off) and the head; "quad": on the one-token
        # layout (quant_quad_rows)
        kernel = "gemm_q4_quad" if q4_rows == "quad" else "gemm_q4_cols"
        assert names.count(kernel) == 4 * len(cfg.layers) + 1, names
        wgsl = [la.kernel.wgsl for la in b.converted.graph._plan.launches
                if getattr(la, "kernel", None) is not None and la.kernel.name == kernel]
        assert all(("hq(" in w) == (q4_rows == "cols_h") for w in wgsl)
        assert "fused:sigmoid+mul+mul" not in names, names
        folded = q4_norms == "partials" or (q4_norms is None and q4_rows == "quad")
        norms = 1 if folded else 2 * len(cfg.layers) + 1  # + the final norm
        assert names.count("fused_vector") == norms, names
        assert names.count("scatter_nd") == cfg.layers.count(ATTENTION), names
        attn = {"lanes": "attention_lanes", "tile": "attention_tile"}.get(attention_rows,
                                                                          "attention_flash")
        assert names.count(attn) == cfg.layers.count(ATTENTION), names
        tokens, ref = at_depth(b, wl, cap, depth)
        for j in range(2):
            ids = tokens[depth + j * k:depth + (j + 1) * k]
            got, want = np.asarray(b.step_tokens(ids), np.float64), ref.step_tokens(ids)
            rel = np.abs(got - want).max() / np.abs(want).max()
            assert rel < logits_tolerance(cfg), f"verify {j}: {rel:.2e}"
            assert np.array_equal(got.argmax(-1), want.argmax(-1))
    finally:
        b.close()
