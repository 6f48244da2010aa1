"""A two-launch attention's combine computed by the o projection's workgroups
(``KernelOptions.attention_combine`` "product", ``passes.attention_combines``): each
workgroup of the 4-bit "quad" product (or the float rows kernel) weighs the splits' partials
and sums them into its workgroup memory before its own sums (``attention.combine_vector``),
so a layer has no combine launch. Checked on the stateful tiny pages with the GPU's plan
forced on this adapter, at a depth filling several splits (the rest empty), against the
float64 reference:
flash and tile partials, the splits' loads straight-line and in loops, float16 and float32
caches, the int8 parts' product, float weights."""

from __future__ import annotations

import numpy as np
import pytest
from at_depth import at_depth
from test_pages import _gpu_target, _three_steps_match, f16kv

from backends.pages import StatefulInPlace
from backends.webnn.kernels.attention import COMBINE_UNROLL
from backends.webnn.wgpu_impl.options import KernelOptions
from harness.metrics import logits_tolerance

ok, why = StatefulInPlace.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

DEPTH = 140  # past a flash split's 128 rows, five of tile_t32's


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("name,how,cap,splits,q4", [
    ("tiny+q4f16", "flash", 300, 3, None),
    ("tiny+q4f16", "tile_t64", 300, 5, None),
    ("tiny+q4f16", "tile_t32", 600, 19, None),  # beyond COMBINE_UNROLL: the loops
    ("tiny+q4f16", "tile_t64", 300, 5, "quad_k4_i8"),  # the int8 parts of the vector
    ("tiny+q4", "flash", 300, 3, None),  # a float32 cache and graph
    ("tiny+f16", "tile_t32", 600, 19, None),  # float weights: the rows kernel's o
])
def test_the_combine_computed_by_the_o_product_matches_the_reference(monkeypatch, name, how,
                                                                      cap, splits, q4):
    _gpu_target(monkeypatch)
    wl = f16kv(name)
    b = StatefulInPlace(options=KernelOptions(attention=how, attention_combine="product",
                                              q4_gemv=q4))
    b.prepare(wl, cap)
    try:
        plan = b.converted.graph._plan
        names = [la.kernel.name for la in plan.launches if hasattr(la, "kernel")]
        attentions = sum(n.startswith("attention_") for n in names)
        assert attentions == len(plan.combined) > 0 and "attention_combine" not in names, names
        for pid in plan.combined.values():
            assert plan.prologue[pid].combine.splits == splits
        readers = [la.kernel for la in plan.launches
                   if hasattr(la, "kernel") and "cb_v[" in la.kernel.wgsl]
        product = "gemv_q4_quad" if "q4" in name else "matmul_gemv"
        assert len(readers) == attentions and all(k.name == product for k in readers)
        assert all(("for (var s" in k.wgsl) == (splits > COMBINE_UNROLL) for k in readers)
        _three_steps_match(b, wl, cap, logits_tolerance(wl.config), f"{name} {how}", DEPTH)
    finally:
        b.close()


@pytest.mark.parametrize("name,how,cap", [("tiny+q4", "flash", 300), ("tiny+q4", "tile_t32", 600),
                                          ("tiny", "flash", 300)])
def test_a_float32_page_computes_the_combine_launchs_logits(monkeypatch, name, how, cap):
    """A float32 graph (4-bit weights on the "quad" kernel; float32 weights on the rows
    kernel) with its combine computed by the o product and with its own launch, at the same
    depth: the same logits within float32 rounding (the weights' normalisation once a row,
    a multiply for a division), so the sum is the combine's own and not merely one within
    the reference's tolerance. Each head's last workgroup combining, in flash's and tile's
    pass 1 (``attention_combine`` "last", no combine launch; its row write folded in, 18
    bindings: an NVIDIA adapter allows many more) likewise."""
    _gpu_target(monkeypatch, max_storage=24)
    wl = f16kv(name)
    got = {}
    knobs = ("launch", "product", "last")
    for knob in knobs:
        b = StatefulInPlace(options=KernelOptions(attention=how, attention_combine=knob))
        b.prepare(wl, cap)
        try:
            plan = b.converted.graph._plan
            assert bool(plan.combined) == (knob == "product")
            names = [la.kernel.name for la in plan.launches if hasattr(la, "kernel")]
            assert ("attention_combine" in names) == (knob == "launch"), (knob, names)
            tokens, _ = at_depth(b, wl, cap, DEPTH)
            got[knob] = [np.asarray(b.step(int(t)), np.float64) for t in tokens[DEPTH:DEPTH + 3]]
        finally:
            b.close()
    for knob in knobs[1:]:
        for folded, launched in zip(got[knob], got["launch"], strict=True):
            assert np.abs(folded - launched).max() <= 1e-5 * np.abs(launched).max(), knob


def test_the_combine_keeps_its_launch_unless_asked_or_where_no_product_reads_it(monkeypatch):
    """With "launch" the combine is a launch; with "product" (and by default on a GPU's plan
    at few splits) it is computed by the product only where that product alone reads the
    attention's output on the GPU's kernels: the CPU plan's products (by column) leave it a
    launch."""
    wl = f16kv("tiny+q4f16")
    counts = {}
    for gpu, knob in ((False, "product"), (True, None), (True, "launch"), (True, "product")):
        with monkeypatch.context() as m:
            if gpu:
                _gpu_target(m)
            b = StatefulInPlace(options=KernelOptions(attention_combine=knob))
            b.prepare(wl, 24)
            try:
                plan = b.converted.graph._plan
                names = [la.kernel.name for la in plan.launches if hasattr(la, "kernel")]
                counts[gpu, knob] = (len(plan.combined), names.count("attention_combine"),
                                     len(names))
            finally:
                b.close()
    assert counts[False, "product"][:2] == (0, 1), counts
    assert counts[True, None] == counts[True, "product"], counts
    assert counts[True, "launch"][:2] == (0, 1) and counts[True, "product"][:2] == (1, 0)
    assert counts[True, "product"][2] == counts[True, "launch"][2] - 1, counts


def test_the_combine_is_the_products_on_gpus_up_to_sixteen_splits():
    """Left to the adapter, a GPU computes the combine in the o product up to
    ``COMBINE_PRODUCT_SPLITS`` splits and by the tile attention's last workgroups beyond
    (timed: the product faster than the launch at 5 and 9 splits, slower at 17 to 33; the
    last workgroups faster than the launch at 17 to 33); a CPU adapter launches it; the
    knob's values decide alone."""
    from backends.webnn.wgpu_impl.options import COMBINE_PRODUCT_SPLITS
    from backends.webnn.wgpu_impl.target import Target

    gpu, cpu = Target(cpu=False, subgroup=32, device_barrier=True), Target(cpu=True)
    tint = Target(cpu=False, subgroup=32)  # Dawn's storage barrier: workgroup scope
    default = KernelOptions()
    assert COMBINE_PRODUCT_SPLITS == 16
    assert default.attention_combine_product(gpu, 16) and default.attention_combine_product(gpu, 5)
    assert not default.attention_combine_product(gpu, 17)
    assert not default.attention_combine_product(cpu, 5)
    assert default.attention_combine_last(gpu, 17) and not default.attention_combine_last(gpu, 16)
    assert not default.attention_combine_last(cpu, 33)
    assert not default.attention_combine_last(gpu, 65, 16)  # a verify's rows: not timed
    assert not default.attention_combine_last(tint, 33)
    for splits in (5, 33):
        assert KernelOptions(attention_combine="last").attention_combine_last(cpu, splits)
        assert not KernelOptions(attention_combine="product").attention_combine_last(gpu, splits)
        assert KernelOptions(attention_combine="product").attention_combine_product(gpu, splits)
        assert KernelOptions(attention_combine="product").attention_combine_product(cpu, splits)
        assert not KernelOptions(attention_combine="launch").attention_combine_product(gpu, splits)


@pytest.mark.parametrize("engine", ["wgpu", "dawn"])
@pytest.mark.parametrize("splits", [5, 33])  # llama-1b's flash at 544, its tile at 8200
def test_the_combining_product_compiles_with_naga_and_tint_at_llama_shapes(engine, splits):
    """The o product of llama-1b (K = N = 2048, float16 products, the residual and the
    norm's partial sums written) computing its 32 heads' combine, straight-line and in loops,
    at the NVIDIA width: both engines' compilers accept it."""
    from wgsl_compilers import compiler_device, rejection

    from backends.webnn.kernels.attention import combine_vector
    from backends.webnn.kernels.matmul import StatsOutput
    from backends.webnn.kernels.quant_rows import gemv_q4_quad

    if compiler_device(engine)[0] is None:
        pytest.skip(compiler_device(engine)[1])
    k = gemv_q4_quad(2048, 2048, 32, signed=False, zero_points=False, loads=4, subgroup=32,
                     residual=True, half=True, half_scales=True, half_out=True,
                     prologue=combine_vector(32, splits, 64),
                     stats=StatsOutput("fn norm_el(i: u32, xs: f16) -> f32 {\n"
                                       "  return f32(xs) * f32(xs);\n}\n"))
    assert ("for (var s" in k.wgsl) == (splits > COMBINE_UNROLL)
    assert rejection(engine, k.wgsl) == ""
