"""The launches of a decode step on the GPU's plan (scripts/launch_census.py, no GPU needed):
what a point records (``MLGraph.launches``), and the launches a layer of the preset and of
onnxruntime-genai's real q4f16 export (PERFORMANCE.md, "Launches a layer")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_a_graph_counts_the_launches_of_its_dispatch(ctx):
    """``MLGraph.launches`` is the plan's launches, kernels and copies (a page's
    ``details["launches"]``): here two element-wise launches and a matmul."""
    import numpy as np

    from backends.webnn import MLGraphBuilder

    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3, 4])
    w = b.constant(data_type="float32", shape=[4, 5], value=np.ones((4, 5), np.float32))
    y = b.matmul(b.exp(x), w)
    g = b.build({"y": y, "e": b.sqrt(b.abs(x))})
    assert g.launches == len(g._plan.launches) == 3


def _census(model: str | None, workload=None, tokens: int = 1, **knobs: str
            ) -> tuple[list[str], int, dict[str, int]]:
    """(one layer's kernels, the layers, the kernels outside them) of the model's (or the
    workload's) stateful step of ``tokens`` new tokens on the H200's plan (``knobs``: its
    ``KernelOptions`` besides the defaults; the combine a launch unless a knob says)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import launch_census as LC

    from backends.webnn.wgpu_impl.options import KernelOptions

    options = KernelOptions(**({"attention_combine": "launch"} | knobs))
    graph, stateful = LC.capture("wgpu:stateful", workload, 32, model, options, tokens)
    one, count, rest = LC.layers(LC.census(graph, stateful, LC.targets()["nvidia"], options))
    return [la["kernel"] for la in one], count, dict(rest)


def test_the_real_export_plans_the_presets_layer(tmp_path):
    """genai's q4f16 export with its MLP 192 wide (its full-size path: no padded block) on
    the H200's plan: each layer the packed q/k/v product (its norm computed where it reads
    it), attention (writing the new K and V rows) and its combine, o with the residual,
    gate/up with the norm and SwiGLU, down with the residual (the preset's layer:
    PERFORMANCE.md "Launches a layer"); the rotary rows and the row-write index once a step,
    not once a layer, one norm launch (the first layer's: it reads the embedding row), and
    the head writing the float16 logits itself."""
    import onnx
    from genai_shapes import widened_mlp

    path = tmp_path / "model.onnx"
    onnx.save(widened_mlp(), str(path))
    one, count, rest = _census(str(path))
    assert count == 2 and sorted(one) == sorted(
        ["gemv_q4_quad", "attention_flash", "attention_combine",
         "gemv_q4_quad", "gemv_q4_quad", "gemv_q4_quad"]), one
    # the embedding row, the cos and sin rows; the first norm; the head
    assert rest["gather"] == 3 and rest["fused_vector"] == 1 and rest["gemv_q4_quad"] == 1, rest
    assert not {"transpose", "cast", "scatter_nd"} & set(rest), rest
    assert sum(rest.values()) == 10, rest


@pytest.mark.parametrize("widened,combine", [(False, "launch"), (True, "launch"),
                                            (False, "product")])
def test_the_real_export_on_the_gpu_plan_computes_orts_logits(monkeypatch, tmp_path, widened,
                                                              combine):
    """genai's q4f16 export (and its 192-wide MLP: the full-size path, SwiGLU in gate/up)
    on the stateful page with the GPU's plan forced on this adapter (rewrites, the 4-bit
    "quad" kernel, norms from partial sums, residual and gated epilogues, the K and V rows
    written by attention over the float16 cache's 16-byte words; ``combine``: the
    ``attention_combine`` knob, the o product combining the splits): each of 6 steps
    from fresh random tokens within the export's float16 tolerance of ORT's CPU EP on the
    reference's copy of the graph (float32 products), argmax included; fewer launches than
    the CPU plan's."""
    import dataclasses

    import numpy as np
    import onnx
    from genai_shapes import GENAI_Q4F16, widened_mlp

    from backends.base import registry
    from backends.webnn.wgpu_impl import context
    from backends.webnn.wgpu_impl.options import KernelOptions
    from harness.model_run import UserModel, backend_for, reference_graph

    path = GENAI_Q4F16
    if widened:
        (tmp_path / "m").mkdir()
        path = tmp_path / "m" / "model.onnx"
        onnx.save(widened_mlp(), str(path))
    model = UserModel.load(path)
    (tmp_path / "ref").mkdir()
    oracle = backend_for(registry()["ort-cpu:copy"], reference_graph(model, tmp_path / "ref"),
                         None)
    cpu_page = backend_for(registry()["wgpu:stateful"], path, None)
    real = context.target_of
    monkeypatch.setattr(context, "target_of", lambda *a: dataclasses.replace(
        real(*a), cpu=False, max_storage=16, shared_bytes=32768))
    page = backend_for(registry()["wgpu:stateful"], path, None,
                       KernelOptions(attention_combine=combine))
    cap = 16
    rng = np.random.default_rng()
    try:
        for b in (oracle, page):
            b.prepare(None, cap)
        monkeypatch.setattr(context, "target_of", real)
        cpu_page.prepare(None, cap)
        names = [la.kernel.name for la in page.converted.graph._plan.launches]
        assert "fused_vector" in names and names.count("fused_vector") == 1, names
        assert "scatter_nd" not in names, names  # the rows written by attention
        assert page.converted.graph.launches < cpu_page.converted.graph.launches
        assert names.count("attention_combine") == (0 if combine == "product" else 2), names
        for i, tok in enumerate(rng.integers(1, 1000, 6)):
            want = np.asarray(oracle.step(int(tok)), np.float64).reshape(-1)
            got = np.asarray(page.step(int(tok)), np.float64).reshape(-1)
            rel = np.abs(got - want).max() / np.abs(want).max()
            # (the bound puts the page's pick within 2 tolerances of the reference's top
            # logit: a near-tie on a tiny random model may pick the reference's second)
            assert rel < model.tolerance, f"step {i}: {rel:.2e} (tolerance {model.tolerance})"
    finally:
        for b in (oracle, page, cpu_page):
            b.close()


def test_a_verify_step_reads_the_codes_and_adds_in_its_products():
    """A K = 4 verify step of a q4f16 preset with llama-1b's layer (attention layers only)
    on the H200's plan: every 4-bit product reads the codes (``gemm_q4_cols``; nothing
    dequantised a dispatch, the 17 GB a verify of llama-1b+q4f16 moved on the H200 before),
    q/k/v and gate/up each one launch over their stacked columns, o and down with the
    residual add in their launch (float16, rounded once), o reading attention's output as it
    lies (no transpose launched), SwiGLU written by the gate/up launch, the K rows written
    by their own launch (a K-row verify's attention was slower with them folded in), a
    launch a norm: 9 launches a layer; 7 with ``q4_norms=partials`` (each norm computed in
    its readers from the partial sums o and down write; by column not yet the default)."""
    from dataclasses import replace

    from model.workload import ATTENTION, Workload, preset

    workload = Workload.build(replace(preset("tiny+q4f16"), layers=(ATTENTION,) * 2))
    one, count, rest = _census(None, workload, tokens=4, q4_norms="partials")
    assert count == 2, (one, rest)
    assert one.count("gemm_q4_cols") == 4 and len(one) == 7, one  # the GPU's variant
    assert one.count("scatter_nd") == 1, one
    assert not any("sigmoid" in k for k in one), one
    assert not any(x in k for k in one + list(rest) for x in ("dequantize", "add", "transpose")), (
        one, rest)
    for how in (None, "off"):  # by column the default keeps a launch a norm
        off, count, _ = _census(None, workload, tokens=4, q4_norms=how)
        assert count == 2 and len(off) == 9 and off.count("fused_vector") == 2, (how, off)


@pytest.mark.parametrize("q4_rows,kernel", [("quad", "gemm_q4_quad"),
                                            (None, "gemm_q4_cols"), ("cols2", "gemm_q4_cols")])
def test_a_verify_computes_its_norms_in_its_products(q4_rows, kernel):
    """The K = 4 verify of llama-1b+q4f16 (attention layers only) on the H200's plan, with
    ``q4_rows=quad`` or by column (the default, with ``q4_norms=partials``): o and down
    write each row's partial sums
    of squares of the residual stream, and q/k/v and gate/up compute the norm where they
    read it, each workgroup summing each row's partials (``stats`` and ``prologue``): 7
    launches a layer (9 with a norm launch each), the one norm launch the first layer's
    (of the embedding rows); the one-token step's 6 unchanged, its last norm a launch."""
    from dataclasses import replace

    from model.workload import ATTENTION, Workload, preset

    workload = Workload.build(replace(preset("llama-1b+q4f16"), layers=(ATTENTION,) * 2))
    # quad folds by default on the GPU; by column where "partials" is asked for
    knobs = {"q4_rows": q4_rows} if q4_rows == "quad" else {"q4_rows": q4_rows,
                                                             "q4_norms": "partials"}
    one, count, rest = _census(None, workload, tokens=4, **knobs)
    assert count == 2, (one, rest)
    assert sorted(one) == sorted(["attention_flash", "attention_combine", "scatter_nd"]
                                 + [kernel] * 4), one
    assert rest["fused_vector"] == 1, rest
    one, count, rest = _census(None, workload, tokens=1, **knobs)
    # the one-token head (8016 workgroups, over gemv.PROLOGUE_WORKGROUPS) reads the last
    # norm from its launch; the verify's head of several rows computes it (above)
    assert len(one) == 6 and one.count("gemv_q4_quad") == 4 and rest["fused_vector"] == 2, (
        one, rest)


def test_a_float_weight_layer_launches_as_a_4bit_one():
    """tiny+f16 (float16-valued weights, the rows kernels) with 16 of llama-1b's layers
    (attention only) on the H200's plan: 6 launches a layer as on q4 (attention and its
    combine, o writing the residual and its norm's partial sums, gate/up computing the norm
    from them and writing SwiGLU, down as o, q/k/v as gate/up) and 104 a step, one norm
    launch (the first layer's: it reads the embedding row); with ``gemv_norms`` and
    ``gemv_epilogue`` off 9 a layer, 152 a step (PERFORMANCE.md "Launches a layer")."""
    from dataclasses import replace

    from model.workload import ATTENTION, Workload, preset

    workload = Workload.build(replace(preset("tiny+f16"), layers=(ATTENTION,) * 16))
    one, count, rest = _census(None, workload)
    assert count == 16 and sorted(one) == sorted(
        ["attention_flash", "attention_combine"] + ["matmul_gemv"] * 4), one
    assert rest["fused_vector"] == 1 and rest["matmul_gemv"] == 1, rest  # the head
    assert 16 * len(one) + sum(rest.values()) == 104, rest
    off, count, rest = _census(None, workload, gemv_norms="off", gemv_epilogue="off")
    assert count == 16 and len(off) == 9, off
    assert off.count("fused_vector") == 2 and off.count("fused:sigmoid+mul+mul") == 1, off
    assert 16 * len(off) + sum(rest.values()) == 152, rest


@pytest.mark.parametrize("attention", [None, "tile"])
def test_the_combine_in_the_o_product_leaves_five_launches_a_layer(attention):
    """llama-1b+q4f16's layer (attention only) on the H200's plan with
    ``attention_combine=product``: the o product combines the attention's splits where it
    reads them, so a layer is attention (writing the K and V rows), o, gate/up, down and
    q/k/v: 5 launches, one fewer than by default; the float-weight layer's o (the rows
    kernel) alike; a verify's layer keeps its combine launch (its o has K rows)."""
    from dataclasses import replace

    from model.workload import ATTENTION, Workload, preset

    workload = Workload.build(replace(preset("llama-1b+q4f16"), layers=(ATTENTION,) * 2))
    kernel = f"attention_{attention or 'flash'}"
    one, count, rest = _census(None, workload, attention=attention, attention_combine="product")
    assert count == 2 and sorted(one) == sorted([kernel] + ["gemv_q4_quad"] * 4), one
    default, _, rest_default = _census(None, workload, attention=attention)
    assert sorted(default) == sorted(one + ["attention_combine"]) and rest == rest_default
    verify, _, _ = _census(None, workload, tokens=4, attention_combine="product")
    assert "attention_combine" in verify, verify
    floats = Workload.build(replace(preset("tiny+f16"), layers=(ATTENTION,) * 2))
    one, _, _ = _census(None, floats, attention=attention, attention_combine="product")
    assert sorted(one) == sorted([kernel] + ["matmul_gemv"] * 4), one


GENAI_INT4_QWEN35 = ROOT / "tests" / "models" / "genai-int4-qwen35" / "model.onnx"
#: the same source exported q4f16 (the held-out set tests/models-float16)
GENAI_Q4F16_QWEN35 = ROOT / "tests" / "models-float16" / "genai-q4f16-qwen35-small" / "model.onnx"
#: a gated delta net layer and an attention layer of genai's int4 Qwen3.5 export on the
#: H200's plan (its MLP 176 wide: the down projection reads a zero-padded input, so SwiGLU
#: keeps a launch in each layer)
QWEN35_LAYERS = sorted(
    # gated delta net: q/k/v and z stacked, the float a and b, the conv window, the conv,
    # the new window, the step, out (computing the gated per-head norm it reads:
    # ``gemv.grouped_reduction``), gate/up, SwiGLU with the pad, down
    ["gemv_q4_quad", "matmul_gemv", "fused:concat",
     "fused:slice+slice+mul+slice+slice+mul+add+slice+slice+mul...", "slice", "gated_delta",
     "gemv_q4_quad", "gemv_q4_quad", "fused:sigmoid+mul+mul+concat",
     "gemv_q4_quad"]
    # attention: q, gate, k and v stacked (no slice), attention (q's and k's per-head norms
    # reduced by its first launch: ``row_stat``) and its combine (writing the output gate's
    # product: ``attention_epilogues``), o, gate/up, SwiGLU with the pad, down
    + ["gemv_q4_quad", "attention_flash", "attention_combine",
       "gemv_q4_quad", "gemv_q4_quad", "fused:sigmoid+mul+mul+concat", "gemv_q4_quad"])


def test_the_real_qwen35_export_launches_as_the_presets_layers():
    """genai's int4 Qwen3.5 export on the H200's plan: its packed q/gate/k/v product split
    into stacked products (``split_columns``: no slice launched), the conv window's concat
    one launch, the output gate written by the attention's combine, q's and k's per-head
    norms reduced by the attention's first launch, the gated norm computed by the out
    product; 17 launches a gated delta net and attention layer pair; with its MLP 192 wide
    (the full-size path) SwiGLU written by gate/up: 15."""
    import onnx
    from genai_shapes import widened_mlp

    one, count, rest = _census(str(GENAI_INT4_QWEN35))
    assert count == 2 and sorted(one) == QWEN35_LAYERS, one
    assert sum(rest.values()) == 12, rest
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.onnx"
        onnx.save(widened_mlp(path=GENAI_INT4_QWEN35), str(path))
        one, count, _ = _census(str(path))
    pads = [k for k in QWEN35_LAYERS if k == "fused:sigmoid+mul+mul+concat"]
    assert count == 2 and len(one) == len(QWEN35_LAYERS) - len(pads), one
    assert "fused:sigmoid+mul+mul+concat" not in one, one


def test_the_real_q4f16_qwen35_export_folds_its_norms_into_the_step():
    """genai's q4f16 Qwen3.5 export (LpNormalization in float16, q scaled in float16, casts
    around the linear attention's ops) on the H200's plan: q's and k's norms and q's scale
    computed in the gated_delta launch, q and k read as float16 where they lie in the
    convolution's output (no slice, no vector launch of their own), as the int4 export
    runs them; the one vector launch left is the first layer's input norm; the output
    gate is written by the attention's combine."""
    launches = _census_all(str(GENAI_Q4F16_QWEN35))
    assert launches.count("gated_delta") == 1, launches
    assert "slice" not in launches and launches.count("fused_vector") == 1, launches
    # one mean launch: the gated RMS norm's after the step; q's and k's per-head norms
    # are reduced by the attention's first launch
    assert launches.count("reduce_mean") == 1, launches
    assert len(launches) == 28, launches  # the output gate written by the combine


def _census_all(model: str) -> list[str]:
    """Every kernel of the model's stateful step on the H200's plan, in order (the combine
    a launch)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import launch_census as LC

    from backends.webnn.wgpu_impl.options import KernelOptions

    options = KernelOptions(attention_combine="launch")
    graph, stateful = LC.capture("wgpu:stateful", None, 32, model, options)
    return [la["kernel"] for la in LC.census(graph, stateful, LC.targets()["nvidia"], options)]


@pytest.mark.parametrize("combine,storage,attention", [
    ("launch", 16, None), ("product", 16, None), ("launch", 48, None), ("product", 48, None),
    ("launch", 48, "tile")])
@pytest.mark.parametrize("path,slices,means", [(GENAI_INT4_QWEN35, 2, 0),
                                               (GENAI_Q4F16_QWEN35, 0, 1)])
def test_the_real_qwen35_export_on_the_gpu_plan_computes_orts_logits(
        monkeypatch, tmp_path, path, slices, means, combine, storage, attention):
    """genai's int4 and q4f16 Qwen3.5 exports on the stateful page with the GPU's plan
    forced on this adapter (the packed product split, the conv window's one-launch concat,
    the 4-bit "quad" kernel, norms from partial sums, epilogues, the output gate written by
    the attention's combine, the gated delta's q and k norms in its step; with
    ``attention_combine`` "product", combine and gate computed by the o product; q's
    per-head norm reduced by the attention's first launch, and with ``storage`` 48 storage
    buffers k's too, as that launch writes the new K row; the tile attention): 6 steps from
    fresh random tokens against ORT's CPU EP; ``slices``: the new conv
    windows' slice launches (the q4f16 export's are fused with their float16 casts);
    ``means``: the mean launches that are not the attention's norms (on this adapter the
    q4f16 export's gated RMS norm after the gated delta step).

    The float32 export's every step is within the export's tolerance. The float16 export's
    median step is, and every step within 4 times it: a gated-delta step whose decays are ~0
    and whose q and k are nearly orthogonal turns one float16 spacing of the conv window
    into up to 2 tolerances of the logits, for ORT's float16 run as for the page's
    (``results/lavapipe/2026-12-06-63cd189-outlier/``: 1.65e-2 and 1.24e-2 from the exact
    step), so the two may differ by their sum there (2 times once failed CI); a lowering
    fault is off at every step, and by far more. A step's bound puts the page's pick within
    twice it of ORT's top logit."""
    import dataclasses

    import numpy as np

    from backends.base import registry
    from backends.webnn.wgpu_impl import context
    from backends.webnn.wgpu_impl.options import KernelOptions
    from harness.model_run import UserModel, backend_for, reference_graph

    model = UserModel.load(path)
    (tmp_path / "ref").mkdir()
    oracle = backend_for(registry()["ort-cpu:copy"], reference_graph(model, tmp_path / "ref"),
                         None)
    real = context.target_of
    monkeypatch.setattr(context, "target_of", lambda *a: dataclasses.replace(
        real(*a), cpu=False, max_storage=storage, shared_bytes=32768))
    page = backend_for(registry()["wgpu:stateful"], path, None,
                       KernelOptions(attention_combine=combine, attention=attention))
    rng = np.random.default_rng()
    try:
        for b in (oracle, page):
            b.prepare(None, 16)
        names = [la.kernel.name for la in page.converted.graph._plan.launches]
        assert names.count("slice") == slices, names  # the new conv windows
        assert "concat" not in names and "gated_delta" in names, names
        plan = page.converted.graph._plan
        assert "fused:sigmoid+mul" not in names and plan.attention, names  # the gate: no launch
        assert all(m.epilogue is not None for m in plan.attention.values()), names
        # q's per-head norm reduced by the attention's first launch; k's too where that
        # launch writes the new K row (else the row write's launch reads k's reduction)
        folded = storage == 48
        assert ("scatter_nd" in names) != folded, names
        assert names.count("reduce_mean") == means + (0 if folded else len(plan.attention)), names
        assert all(m.q_norm is not None and (m.write_norms[0] is not None) == folded
                   for m in plan.attention.values()), names
        assert names.count("attention_tile") == (len(plan.attention) if attention else 0)
        assert len(plan.combined) == (len(plan.attention) if combine == "product" else 0), names
        assert ("attention_combine" in names) == (combine == "launch"), names
        vocab = json.loads((path.parent / "genai_config.json").read_text())["model"][
            "vocab_size"]
        float16 = path == GENAI_Q4F16_QWEN35
        bound, rels = model.tolerance * (4 if float16 else 1), []
        for i, tok in enumerate(rng.integers(1, vocab, 6)):
            want = np.asarray(oracle.step(int(tok)), np.float64).reshape(-1)
            got = np.asarray(page.step(int(tok)), np.float64).reshape(-1)
            rel = np.abs(got - want).max() / np.abs(want).max()
            rels.append(rel)
            assert rel < bound, f"step {i}: {rel:.2e} (bound {bound:.2e})"
        assert np.median(rels) < model.tolerance, (rels, model.tolerance)
    finally:
        for b in (oracle, page):
            b.close()
