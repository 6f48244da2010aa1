"""WebNN int4/uint4 constants and dequantizeLinear with block scales, against NumPy float64
on fresh random data (odd sizes), and the 4-bit matrix-vector kernel it feeds."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder
from backends.webnn.kernels import quant_rows as QR
from backends.webnn.wgpu_impl.options import WIDE_VARIANT
from tests import test_webnn_gdn_capsule as capsule

RNG = np.random.default_rng(4242)
#: float16 products (the ``_h`` variants, where the adapter has 'shader-f16'): the error
#: bound on random data, relative to the largest output (``quant_rows._unpack_half_fns``'s worst
#: case is 2.5e-3 of each word's sum of magnitudes; q4f16's tolerance is 2.2e-2)
_F16_PRODUCTS = 2e-3
_names = iter(range(10**6))  # fresh input names


def _pack(values: np.ndarray) -> np.ndarray:
    """The spec's int4/uint4 buffer, written here without the library: low nibble first."""
    flat = (values.reshape(-1).astype(np.int64) & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def _codes(kind: str, shape) -> np.ndarray:
    lo, hi = (-8, 8) if kind == "int4" else (0, 16) if kind == "uint4" else (0, 256)
    return RNG.integers(lo, hi, size=shape)


def _const(b, kind, values):
    data = _pack(values) if kind in ("int4", "uint4") else values.astype(np.uint8)
    return b.constant(data_type=kind, shape=list(values.shape), value=data)


def _dequantize(ctx, kind, x, scale, zp, out="float32", consume=None):
    b = MLGraphBuilder(ctx)
    y = b.dequantize_linear(_const(b, kind, x),
                            b.constant(data_type=out, shape=list(scale.shape), value=scale),
                            _const(b, kind, zp))
    inputs = {}
    if consume is not None:
        v = b.input("v", data_type=out, shape=[1, x.shape[0]])
        y = consume(b, v, y)
        inputs = {"v": consume.vector}
    g = b.build({"y": y})
    tin = {}
    for n, a in inputs.items():
        t = ctx.create_tensor(data_type=out, shape=list(a.shape), writable=True)
        ctx.write_tensor(t, a)
        tin[n] = t
    t_out = ctx.create_tensor(data_type=y.data_type, shape=y.shape, readable=True)
    ctx.dispatch(g, tin, {"y": t_out})
    return ctx.read_tensor(t_out)


def _want(x, scale, zp):
    block = [d // s for d, s in zip(x.shape, (1,) * (x.ndim - scale.ndim) + scale.shape,
                                    strict=True)]
    s, z = scale.astype(np.float64), zp.astype(np.float64)
    for ax, bl in enumerate(block[x.ndim - scale.ndim:], start=0):
        s, z = np.repeat(s, bl, axis=ax), np.repeat(z, bl, axis=ax)
    return (x.astype(np.float64) - z) * s


@pytest.mark.parametrize("kind", ["int4", "uint4", "uint8"])
@pytest.mark.parametrize("shape,sshape", [
    ((7, 5), (7, 5)),  # elementwise, odd element count
    ((96, 13), (3, 13)),  # blocks of 32 along axis 0
    ((3, 10, 9), (3, 2, 3)),  # blocks (1, 5, 3)
    ((6, 9), (9,)),  # per-axis, scale of lower rank
    ((5, 3), (1, 1)),  # per-tensor
])
def test_dequantize_linear_blocks(ctx, kind, shape, sshape):
    x, zp = _codes(kind, shape), _codes(kind, sshape)
    scale = RNG.uniform(0.01, 2.0, size=sshape).astype(np.float32)
    got = _dequantize(ctx, kind, x, scale, zp)
    np.testing.assert_allclose(got, _want(x, scale, zp), rtol=2e-7, atol=0)


def test_int4_buffer_and_shapes_are_checked(ctx):
    b = MLGraphBuilder(ctx)
    with pytest.raises(TypeError, match="uint8 buffer of 3 bytes"):
        b.constant(data_type="int4", shape=[5], value=np.zeros(5, np.uint8))
    with pytest.raises(TypeError, match="uint8 buffer of 2 bytes"):  # the page's, packed
        ctx.write_tensor(ctx.create_tensor(data_type="int4", shape=[4], writable=True),
                         np.zeros(4, np.uint8))
    x = b.constant(data_type="int4", shape=[4, 6], value=np.zeros(12, np.uint8))
    s = b.constant(data_type="float32", shape=[3, 6], value=np.ones((3, 6), np.float32))
    z = b.constant(data_type="int4", shape=[3, 6], value=np.zeros(9, np.uint8))
    with pytest.raises(TypeError, match="does not divide"):
        b.dequantize_linear(x, s, z)
    with pytest.raises(TypeError, match="only dequantizeLinear"):
        b.add(x, x)
    with pytest.raises(TypeError, match="zeroPoint must be int4"):
        b.dequantize_linear(x, s, s)


def _q4_matmul(ctx, kind, k, n, zero_points, residual=False, block=32, dt="float32"):
    """y = v @ dequantizeLinear(4-bit (k, n), block-32 scales) (+ r, a constant, or a graph
    input where ``residual`` is "input"): the decode step's projection, its row, scales,
    residual and result of type ``dt``; returns (y, float64 oracle on the same values,
    launched kernel names)."""
    codes = _codes(kind, (k, n))
    scale = RNG.uniform(0.005, 0.1, size=(k // block, n)).astype(dt)
    zp = _codes(kind, scale.shape) if zero_points else np.zeros(scale.shape, np.int64)
    v = RNG.standard_normal((1, k)).astype(dt)
    r = RNG.standard_normal((1, n)).astype(dt)
    b = MLGraphBuilder(ctx)
    w = b.dequantize_linear(_const(b, kind, codes),
                            b.constant(data_type=dt, shape=list(scale.shape), value=scale),
                            _const(b, kind, zp))
    vi = b.input("v", data_type=dt, shape=[1, k])
    y = b.matmul(vi, w)
    assert y.data_type == dt
    feeds = {"v": v}
    if residual == "input":  # the residual stream, as a decoder's (not a constant)
        y = b.add(y, b.input("r", data_type=dt, shape=[1, n]))
        feeds["r"] = r
    elif residual:
        y = b.add(y, b.constant(data_type=dt, shape=[1, n], value=r))
    g = b.build({"y": y})
    tensors = {}
    for name, x in feeds.items():
        tensors[name] = ctx.create_tensor(data_type=dt, shape=list(x.shape), writable=True)
        ctx.write_tensor(tensors[name], x)
    t_out = ctx.create_tensor(data_type=dt, shape=[1, n], readable=True)
    ctx.dispatch(g, tensors, {"y": t_out})
    want = (v.astype(np.float64) @ _want(codes, scale.astype(np.float32), zp)
            + (r.astype(np.float64) if residual else 0.0))
    return ctx.read_tensor(t_out), want, [la.kernel.name for la in g._plan.launches]


@pytest.mark.parametrize("kind,k,n,zero_points,block", [
    ("int4", 64, 40, False, 32), ("int4", 96, 7, True, 32), ("uint4", 320, 130, True, 32),
    ("uint4", 128, 33, False, 32), ("int4", 40, 9, True, 8), ("uint4", 48, 11, False, 16)])
@pytest.mark.parametrize("how", ["fused", "generic", "multi", "multi3_l8_u2", "multi8_l16_g2",
                                 "multi_u3", "multi2_u2_h", "wide", "wide3_k2_h", "quad_k2",
                                 "quad_h"])
def test_4bit_matmul_one_row(ctx_with, how, kind, k, n, zero_points, block):
    """matmul(vector, dequantizeLinear(4-bit weights)): fused, the codes are read and no
    float weights are written (no dequantize launch; 16-byte loads where the block is a
    multiple of 32, words otherwise); multi, the same several rows an invocation (rows
    and lanes not dividing N, sums through subgroups or workgroup memory); generic, they
    are."""
    ctx = ctx_with(q4_gemv=how)
    got, want, names = _q4_matmul(ctx, kind, k, n, zero_points, block=block)
    half = how.endswith("_h") and block % 32 == 0 and ctx._target.f16
    assert np.max(np.abs(got - want)) <= (_F16_PRODUCTS if half else 1e-5) * np.max(np.abs(want))
    if how == "fused":
        assert names == ["gemv_q4"]
    elif how.startswith(("multi", "wide", "quad")):  # 16-byte loads: word blocks stay fused
        m = WIDE_VARIANT.fullmatch(how)  # (wide) at most a row an invocation
        fits = block % 32 == 0 and (m is None or int(m.group(1) or 1) <= QR.wide_lanes(
            k, int(m.group(2) or 1)))
        kernel = "gemv_q4_" + how[:5].rstrip("0123456789_")
        assert names == [kernel if fits else "gemv_q4"], names
    else:
        assert "dequantize_linear" in names and not any("gemv_q4" in x for x in names)


@pytest.mark.parametrize("how", ["fused", "multi", "wide2_h", "quad_k4_h", "quad"])
@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_uint4_codes_centred_on_8_run_as_signed_codes(ctx_with, how, dt):
    """uint4 codes whose zero points are all 8 (MatMulNBits without zero points, as genai
    exports it): the product is (code - 8) · scale, computed as signed codes (their nibbles
    flipped at upload) with no zero-point buffer bound and no zero-point bytes counted; a
    zero point of 7 somewhere keeps the zero-point path."""
    ctx = ctx_with(q4_gemv=how)
    if dt == "float16" and not ctx._target.f16:
        pytest.skip("no shader-f16 on this adapter")
    k, n, block = 128, 36, 32
    outs = {}
    for fill in ("centred", "one off"):
        codes = _codes("uint4", (k, n))
        scale = RNG.uniform(0.005, 0.1, size=(k // block, n)).astype(dt)
        zp = np.full(scale.shape, 8, np.int64)
        if fill == "one off":
            zp[1, 3] = 7
        v = RNG.standard_normal((1, k)).astype(dt)
        b = MLGraphBuilder(ctx)
        w = b.dequantize_linear(_const(b, "uint4", codes),
                                b.constant(data_type=dt, shape=list(scale.shape), value=scale),
                                _const(b, "uint4", zp))
        y = b.matmul(b.input("v", data_type=dt, shape=[1, k]), w)
        g = b.build({"y": y})
        t_in = ctx.create_tensor(data_type=dt, shape=[1, k], writable=True)
        ctx.write_tensor(t_in, v)
        t_out = ctx.create_tensor(data_type=dt, shape=[1, n], readable=True)
        ctx.dispatch(g, {"v": t_in}, {"y": t_out})
        want = v.astype(np.float64) @ _want(codes, scale.astype(np.float32), zp)
        got = ctx.read_tensor(t_out).astype(np.float64)
        tol = _F16_PRODUCTS if how.endswith("_h") and dt == "float16" else 1e-5
        if dt == "float16":
            tol += 2e-3  # the float16 result's rounding
        assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want)), (how, fill)
        (la,) = [la for la in g._plan.launches if "gemv_q4" in la.kernel.name]
        outs[fill] = la
    centred, off = outs["centred"], outs["one off"]
    assert len(off.slots) == len(centred.slots) + 1  # the zero-point terms' buffer
    assert off.kernel.bytes > centred.kernel.bytes


@pytest.mark.parametrize("how,kernel", [(None, "gemv_q4"), ("wide2_h", "gemv_q4_wide"),
                                        ("quad", "gemv_q4_quad")])
def test_4bit_matmul_in_chunks_and_with_a_residual(ctx_with, monkeypatch, how, kernel):
    """Columns beyond the binding limit run as chunks, each at its offset."""
    from backends.webnn.wgpu_impl import match_q4

    real = match_q4.lower_q4

    def small(plan, *args):
        plan.max_binding = 64 * 16  # 64 bytes a row of K = 128: chunks of 16 columns
        return real(plan, *args)

    monkeypatch.setattr(match_q4, "lower_q4", small)
    ctx = ctx_with(q4_gemv=how)
    got, want, names = _q4_matmul(ctx, "int4", 128, 50, True, residual=True)
    assert names.count(kernel) == 4
    tol = _F16_PRODUCTS if how and how.endswith("_h") and ctx._target.f16 else 1e-5
    assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))


def _onnx_dq_matmul(k: int, n: int, zero_point: bool):
    """An opset-21 graph: y = x @ DequantizeLinear(int4 (k, n), block_size 32 on axis 0)."""
    from onnx import TensorProto, helper, numpy_helper

    q = RNG.integers(-8, 8, size=(k, n))
    s = RNG.uniform(0.01, 0.5, size=(k // 32, n)).astype(np.float32)
    inits = [TensorProto(name="Q", data_type=TensorProto.INT4, dims=[k, n],
                         raw_data=_pack(q).tobytes()), numpy_helper.from_array(s, "S")]
    ins = ["Q", "S"]
    if zero_point:
        z = RNG.integers(-8, 8, size=s.shape)
        inits.append(TensorProto(name="Z", data_type=TensorProto.INT4, dims=list(s.shape),
                                 raw_data=_pack(z).tobytes()))
        ins.append("Z")
    nodes = [helper.make_node("DequantizeLinear", ins, ["W"], axis=0, block_size=32),
             helper.make_node("MatMul", ["x", "W"], ["y"])]
    g = helper.make_graph(nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [1, 1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, n])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("zero_point", [False, True])
def test_converter_maps_blocked_dequantizelinear(ctx, zero_point):
    """ONNX DequantizeLinear (int4, block_size) -> WebNN dequantizeLinear, checked against
    onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    from backends.webnn.onnx_converter import convert

    model = _onnx_dq_matmul(96, 21, zero_point)
    x = RNG.standard_normal((1, 1, 96)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    cg = convert(model, ctx)
    t_in = ctx.create_tensor(data_type="float32", shape=[1, 1, 96], writable=True)
    ctx.write_tensor(t_in, x)
    t_out = ctx.create_tensor(data_type="float32", shape=[1, 1, 21], readable=True)
    ctx.dispatch(cg.graph, {"x": t_in}, {"y": t_out})
    got = ctx.read_tensor(t_out)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.parametrize("q4", [None, "multi", "multi3_l8", "wide2_h", "quad_h"])
@pytest.mark.parametrize("gemv,gemvs", [("rows", 2), ("cols", 4)])
def test_4bit_projections_stack_and_take_the_residual(ctx_with, gemv, gemvs, q4):
    """A layer's shape in small: with the GPU gemv passes (rows), q, k, v of one vector in
    one launch (their columns stacked) and an output projection writing x + W·o (no add
    launch); without them (a CPU adapter's cols), one launch each and the add."""
    k, sizes = 64, (32, 16, 24)
    ctx = ctx_with(gemv=gemv, q4_gemv=q4)
    b = MLGraphBuilder(ctx)
    x = RNG.standard_normal((1, k)).astype(np.float32)
    xi = b.input("x", data_type="float32", shape=[1, k])
    outs, wants = {}, {}
    for j, n in enumerate(sizes):
        codes = _codes("int4", (k, n))
        scale = RNG.uniform(0.005, 0.1, size=(k // 32, n)).astype(np.float32)
        zp = np.zeros(scale.shape, np.int64)
        w = b.dequantize_linear(_const(b, "int4", codes),
                                b.constant(data_type="float32", shape=[k // 32, n],
                                           value=scale), _const(b, "int4", zp))
        outs[f"y{j}"] = b.matmul(xi, w)
        wants[f"y{j}"] = x.astype(np.float64) @ _want(codes, scale, zp)
    codes = _codes("int4", (24, k))
    scale = RNG.uniform(0.005, 0.1, size=(3, k)).astype(np.float32)
    zp = np.zeros(scale.shape, np.int64)
    wo = b.dequantize_linear(_const(b, "int4", codes),
                             b.constant(data_type="float32", shape=[3, k], value=scale),
                             _const(b, "int4", zp))
    z = b.add(xi, b.matmul(outs["y2"], wo))  # read by a product, not an output itself
    outs["z"] = b.mul(z, z)
    wants["z"] = (x + wants["y2"] @ _want(codes, scale, zp)) ** 2
    g = b.build(outs)
    t_in = ctx.create_tensor(data_type="float32", shape=[1, k], writable=True)
    ctx.write_tensor(t_in, x)
    t_out = {n: ctx.create_tensor(data_type="float32", shape=o.shape, readable=True)
             for n, o in outs.items()}
    ctx.dispatch(g, {"x": t_in}, t_out)
    tol = _F16_PRODUCTS if q4 and q4.endswith("_h") and ctx._target.f16 else 1e-5
    for n, t in t_out.items():
        got = ctx.read_tensor(t)
        assert np.max(np.abs(got - wants[n])) <= tol * np.max(np.abs(wants[n])), n
    names = [la.kernel.name for la in g._plan.launches]
    q4s = [x for x in names if x.startswith("gemv_q4")]
    assert len(q4s) == gemvs and len(names) == gemvs + 1, names
    if q4:  # the several-rows kernel where the block is 32 (not the block-8 o projection)
        assert q4s.count("gemv_q4_" + q4[:5].rstrip("0123456789_")) == gemvs - 1, names


@pytest.mark.parametrize("gemv,q4,epi", [(None, None, None), ("rows_sh", None, None),
                                         ("rows_sh", "multi", None), (None, "multi2_l8", None),
                                         ("rows_sh", "wide2", None), ("rows_sh", "wide_h", None),
                                         ("rows_sh", "quad", None), ("rows_sh", "quad", "gated")])
@pytest.mark.parametrize("page", ["wgpu:stateful", "wgpu:stateless"])
def test_q4_pages_match_the_reference(page, gemv, q4, epi):
    """tiny+q4's standard graph on the pages, the adapter's gemv kernels and the GPU ones
    (forced: 4-bit q/k/v and gate/up stacked, residuals written by the o and down
    projections); no dequantizeLinear is launched, the logits are the reference's (within
    float16 rounding where the products are float16); ``epi``: the q4_epilogue knob, SwiGLU
    written by the gate/up launch, no launch of its own."""
    from backends.pages import StatefulInPlace, StatelessCopy
    from backends.webnn.wgpu_impl.options import KernelOptions
    from model.reference import Reference
    from model.workload import Workload, preset, token_stream

    wl = Workload.build(preset("tiny+q4"), seed=2)
    cls = {"wgpu:stateful": StatefulInPlace, "wgpu:stateless": StatelessCopy}[page]
    b = cls(options=KernelOptions(gemv=gemv, q4_gemv=q4, q4_epilogue=epi))
    b.prepare(wl, 24)
    # float16 products (``_h``) round each product: the step's logits within _F16_PRODUCTS
    tol = _F16_PRODUCTS if q4 and q4.endswith("_h") and b.context._target.f16 else 1e-4
    try:
        plan = b.converted.graph._plan
        names = [la.kernel.name for la in plan.launches if hasattr(la, "kernel")]
        assert "dequantize_linear" not in names
        assert ("gemv_q4_" + q4[:5].rstrip("0123456789_") if q4 else "gemv_q4") in names
        assert bool(plan.gated) == (epi == "gated")
        assert ("fused:sigmoid+mul+mul" in names) == (epi is None)
        if gemv:
            assert max(len(g) for g in plan.stacked.values()) >= 3
            assert len([g for g in plan.epilogue if g in plan.q4]) >= 2 * len(wl.config.layers)
        ref = Reference(wl.config, wl.weights, 24)
        b.reset()
        for tok in token_stream(wl.config, 4, seed=9):
            want = ref.step(int(tok))
            got = np.asarray(b.step(int(tok)), np.float64)
            assert np.abs(got - want).max() <= tol * np.abs(want).max()
    finally:
        b.close()


@pytest.mark.parametrize("page", ["wgpu:stateful", "wgpu:stateless"])
@pytest.mark.parametrize("pro", ["vector", "full"])
def test_q4_prologue_computes_the_input_where_it_is_read(page, pro):
    """tiny+q4 with the 4-bit "quad" kernel computing its input vector (``q4_prologue``):
    "vector" drops SwiGLU's launch (the down projection computes silu(g)·u), "full" the
    RMSNorms read only by 4-bit products too (each workgroup takes the mean of squares);
    the logits stay the float64 reference's, with fresh tokens each step."""
    from collections import Counter

    from backends.pages import StatefulInPlace, StatelessCopy
    from backends.webnn.wgpu_impl.options import KernelOptions
    from model.reference import Reference
    from model.workload import Workload, preset, token_stream

    wl = Workload.build(preset("tiny+q4"), seed=3)
    cls = {"wgpu:stateful": StatefulInPlace, "wgpu:stateless": StatelessCopy}[page]
    counts = {}
    for how in ("off", pro):
        b = cls(options=KernelOptions(gemv="rows_sh", q4_gemv="quad", q4_prologue=how))
        b.prepare(wl, 24)
        try:
            plan = b.converted.graph._plan
            counts[how] = Counter(la.kernel.name for la in plan.launches if hasattr(la, "kernel"))
            ref = Reference(wl.config, wl.weights, 24)
            b.reset()
            for tok in token_stream(wl.config, 3, seed=11):
                want = ref.step(int(tok))
                got = np.asarray(b.step(int(tok)), np.float64)
                assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), how
        finally:
            b.close()
    off, on = counts["off"], counts[pro]
    assert on["gemv_q4_quad"] == off["gemv_q4_quad"] > 0
    assert off["fused:sigmoid+mul+mul"] > 0 and on["fused:sigmoid+mul+mul"] == 0, on
    layers = len(wl.config.layers)
    if pro == "full":  # both norms of every layer and the final one are computed in place
        assert off["fused_vector"] - on["fused_vector"] >= 2 * layers + 1, (off, on)
    else:
        assert on["fused_vector"] == off["fused_vector"], (off, on)


def test_dequantize_linear_validation_as_wpt(ctx):
    """WPT's validation cases: a scale of lower rank broadcasts (right-aligned), a scale
    dimension must divide the input's, zeroPoint has the scale's shape and the input's
    type, the input is a quantised type and the scale a float."""
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="uint8", shape=[3, 2, 5])
    f = b.input("f", data_type="float32", shape=[3, 2, 5])

    def arg(dt, shape):
        return b.input(f"a{next(_names)}", data_type=dt, shape=shape)

    assert b.dequantize_linear(x, arg("float32", [5]), arg("uint8", [5])).shape == [3, 2, 5]
    assert b.dequantize_linear(x, arg("float32", []), arg("uint8", [])).shape == [3, 2, 5]
    six = b.input("six", data_type="uint8", shape=[6, 4, 5])
    assert b.dequantize_linear(six, arg("float32", [3, 2, 1]), arg("uint8", [3, 2, 1])).shape \
        == [6, 4, 5]
    for scale, zp, why in [(("float32", [2]), ("uint8", [2]), "does not divide"),
                           (("float32", [5]), ("uint8", [2]), "one shape"),
                           (("int32", [5]), ("uint8", [5]), "scale must be float")]:
        with pytest.raises(TypeError, match=why):
            b.dequantize_linear(x, arg(*scale), arg(*zp))
    with pytest.raises(TypeError, match="input must be one of int4, uint4, int8, uint8"):
        b.dequantize_linear(f, arg("float32", [5]), arg("float32", [5]))



@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("kind,k,n,residual", [("int4", 64, 40, False), ("int4", 320, 130, True),
                                               ("uint4", 96, 33, True)])
@pytest.mark.parametrize("cpu,q4", [(True, None), (False, None), (True, "multi"),
                                    (False, "multi"), (False, "wide2_h"), (True, "multi_h"),
                                    (False, "quad_h")])
def test_4bit_matmul_on_float16_activations(ctx_with, monkeypatch, kind, k, n, residual, cpu,
                                            q4):
    """A float16 model's projection: float16 row, float16 scales, float16 result (+ a float16
    residual). The context runs the matmul in float32 between casts (``_widened``) and the
    fused kernel still reads the codes (no dequantize launch), on CPU and GPU targets (whose
    residual epilogue a decoder's plan checks: tests/test_pages.py). Against float64 NumPy
    on the same float16 values, within one float16 rounding of each add."""
    import dataclasses

    ctx = ctx_with(q4_gemv=q4)
    monkeypatch.setattr(ctx, "_target", dataclasses.replace(ctx._target, cpu=cpu))
    got, want, names = _q4_matmul(ctx, kind, k, n, False, residual and "input", dt="float16")
    assert got.dtype == np.float16
    chosen = q4 or ("fused" if cpu else "quad_k4_h")  # unset: "quad_k4_h" on GPU targets
    assert ("gemv_q4" if chosen == "fused" else "gemv_q4_" + chosen[:5].rstrip("0123456789_")
            ) in names, names
    assert not any("dequantize" in x for x in names), names
    # the product rounded to float16 (half a ULP), then the add's rounding (half a ULP);
    # float16 products (``_h``) their own error on top (``_F16_PRODUCTS``)
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    rel = _F16_PRODUCTS if chosen.endswith("_h") else 1e-5
    assert np.all(np.abs(got - want) <= (1.0 + residual) * ulp + rel * np.abs(want).max())


#: llama-1b's 4-bit launches (K, N): q/k/v stacked, o, gate/up stacked, down, the head
LLAMA_Q4 = [(2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048), (2048, 128256)]


def _q4_llama(ctx, K: int, N: int, dtype: str = "float32"):
    """y = x @ dequantizeLinear(random int4 (K, N), float16-valued block-32 scales) through
    the context's 4-bit kernel, in a ``dtype`` graph: (y as float32, launched kernels, x as
    the graph holds it, codes (K, N), scales), the codes and scales unpacked here without
    the library."""
    rng = np.random.default_rng(K + N)
    packed = rng.integers(0, 256, size=K * N // 2, dtype=np.uint8)
    scale = rng.uniform(0.5, 1.5, size=(K // 32, N)).astype(np.float16).astype(np.float32)
    scale /= np.float32(64.0)
    x = rng.standard_normal((1, K)).astype(dtype).astype(np.float32)
    b = MLGraphBuilder(ctx)
    w = b.dequantize_linear(
        b.constant(data_type="int4", shape=[K, N], value=packed),
        b.constant(data_type=dtype, shape=[K // 32, N], value=scale.astype(dtype)),
        b.constant(data_type="int4", shape=[K // 32, N],
                   value=np.zeros(-(-(K // 32) * N // 2), np.uint8)))
    xi = b.input("x", data_type=dtype, shape=[1, K])
    g = b.build({"y": b.matmul(xi, w)})
    tx = ctx.create_tensor(data_type=dtype, shape=[1, K], writable=True)
    ctx.write_tensor(tx, x.astype(dtype))
    ty = ctx.create_tensor(data_type=dtype, shape=[1, N], readable=True)
    ctx.dispatch(g, {"x": tx}, {"y": ty})
    got = np.asarray(ctx.read_tensor(ty)[0], np.float32)
    kernels = [la.kernel for la in g._plan.launches]
    g.destroy()
    codes = (np.stack([packed & 0xF, packed >> 4], axis=1).reshape(K, N).astype(np.int8)
             ^ 8) - 8  # row-major (K, N), low nibble first, sign-extended
    return got, kernels, x[0], codes, scale


@pytest.mark.parametrize("how", ["quad_k4_h", "wide2_h", "multi_h"])
def test_4bit_half_products_only_in_a_float16_graph(ctx_with, how):
    """``_h`` asks for float16 products; a float32 graph keeps float32's precision (its
    tolerance is 1e-3, not float16's), so its kernel multiplies in float32."""
    got, kernels, x, codes, scale = _q4_llama(ctx_with(q4_gemv=how), 2048, 64)
    assert all("hword(" not in k.wgsl for k in kernels)
    want = x.astype(np.float64) @ (codes * np.repeat(scale.astype(np.float64), 32, axis=0))
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.parametrize("how,K,N", [
    (how, K, N) for how in ("fused", "multi", "multi8_l16", "multi2_l8_u2", "quad_k4")
    for K, N in LLAMA_Q4
    # the head (chunked beyond the binding limit) once per kernel family
    if N != 128256 or how in ("fused", "multi", "quad_k4")])
def test_4bit_matmul_at_llama_shapes(ctx_with, how, K, N):
    """Every llama-1b 4-bit launch shape (the head in chunks beyond the binding limit) with
    random codes (int4) and float16-valued scales (the several-rows kernel then reads them
    as float16 pairs): against float64 NumPy, a column chunk at a time."""
    got, kernels, x, codes, scale = _q4_llama(ctx_with(q4_gemv=how), K, N)
    names = {k.name for k in kernels}
    assert names == {"gemv_q4" if how == "fused"
                     else "gemv_q4_" + how[:5].rstrip("0123456789_")}, names
    x64 = x.astype(np.float64)
    for c in range(0, N, 8192):
        wc = codes[:, c:c + 8192] * np.repeat(scale[:, c:c + 8192].astype(np.float64), 32,
                                              axis=0)
        want = x64 @ wc
        err = np.max(np.abs(got[c:c + 8192] - want))
        assert err <= 1e-5 * np.max(np.abs(want)), (c, err)


def _gpu_at_width(ctx, sub: bool, subgroup_size, monkeypatch):
    """``ctx``, planning as a GPU at the adapter's own fixed subgroup width where ``sub``
    (skipped without one), else as it is."""
    import dataclasses

    if sub:
        if not subgroup_size or subgroup_size & (subgroup_size - 1):
            pytest.skip(f"no fixed power-of-two subgroup width ({subgroup_size})")
        monkeypatch.setattr(ctx, "_target", dataclasses.replace(ctx._target, cpu=False,
                                                                subgroup=subgroup_size))
    return ctx


@pytest.mark.parametrize("how,sub,K,N", [
    ("wide", False, 2048, 3072), ("wide", False, 8192, 2048), ("wide", False, 1024, 77),
    ("wide2_k2", True, 2048, 2048), ("wide2_k2", True, 8192, 1000),
    ("wide4", True, 2048, 3072), ("wide4", True, 8192, 2048),
    ("wide2_h", True, 2048, 3072), ("wide2_h", True, 8192, 2048), ("wide4_h", True, 1024, 77),
    ("wide3_k2_h", True, 512, 45),
    ("wide_h", False, 2048, 2048), ("wide_h", False, 8192, 1000),
    ("multi_h", False, 2048, 3072), ("multi_h", False, 8192, 2048),
    ("quad", True, 2048, 3072), ("quad_k2", False, 8192, 1000), ("quad_h", True, 8192, 2048),
    ("quad_k4_h", False, 1024, 77), ("quad_k2", True, 512, 45),
    ("quad_k4_h", False, 64, 256), ("quad_k4", False, 64, 130)])
def test_4bit_wide_and_half_at_llama_shapes(ctx_with, subgroup_size, monkeypatch, how, sub,
                                            K, N):
    """The wide variants (every code load in flight) and float16 products at llama-1b's
    launch shapes but gate/up and the head (only N differs from q/k/v's: the head's
    chunks ``test_4bit_matmul_in_chunks...`` covers) and odd ones (rows not dividing N,
    K = 1024: one subgroup a row group on a 32-wide GPU; K = 512 over 2 loads: on
    lavapipe's 8-wide subgroups), sums through workgroup memory or (``sub``) subgroupAdd
    at the adapter's own width. Against float64 NumPy; with
    float16 products within the worst case
    ``quant_rows._unpack_half_fns`` states, per output (5 roundings of 2^-11 a product's
    magnitude), and the random-data bound ``_F16_PRODUCTS`` over all."""
    ctx = _gpu_at_width(ctx_with(q4_gemv=how), sub, subgroup_size, monkeypatch)
    half = how.endswith("_h") and ctx._target.f16  # float16 products: a float16 graph's
    got, kernels, x, codes, scale = _q4_llama(ctx, K, N, "float16" if half else "float32")
    assert [k.name for k in kernels if k.name.startswith("gemv")] == [
        "gemv_q4_" + how[:5].rstrip("0123456789_")]
    kernels = [k for k in kernels if k.name.startswith("gemv")]
    assert ("subgroupAdd" in kernels[0].wgsl) == sub
    assert ("hword(" in kernels[0].wgsl) == half
    w = codes * np.repeat(scale.astype(np.float64), 32, axis=0)
    x64 = x.astype(np.float64)
    want, mags = x64 @ w, np.abs(x64) @ np.abs(w)
    err = np.abs(got - want)
    if half:  # the products' worst case, and the float16 output's rounding
        assert np.all(err <= 5 * 2.0**-11 * mags + 2.0**-11 * np.abs(want)
                      + 1e-6 * np.max(np.abs(want)))
        assert np.max(err) <= _F16_PRODUCTS * np.max(np.abs(want))
    else:
        assert np.max(err) <= 1e-5 * np.max(np.abs(want))


def _gated_mlp(ctx, act, F, dt="float32", also_out=False):
    """A gated MLP in small: gate and up 4-bit products of one input row (``F`` columns
    each), ``act(b, g, u)`` of the two, read by a float down projection; returns (each
    output, its float64 oracle, the plan)."""
    k = 64
    x = RNG.standard_normal((1, k)).astype(dt)
    b = MLGraphBuilder(ctx)
    xi = b.input("x", data_type=dt, shape=[1, k])
    vals = []
    for _ in range(2):
        codes = _codes("int4", (k, F))
        scale = RNG.uniform(0.02, 0.1, size=(k // 32, F)).astype(dt)
        zp = _codes("int4", scale.shape)
        w = b.dequantize_linear(_const(b, "int4", codes),
                                b.constant(data_type=dt, shape=list(scale.shape), value=scale),
                                _const(b, "int4", zp))
        vals.append((b.matmul(xi, w), x.astype(np.float64) @ _want(codes, scale, zp)))
    (g, gw), (u, uw) = vals
    down = RNG.standard_normal((F, 8)).astype(dt)
    outs = {"y": b.matmul(act(b, g, u), b.constant(data_type=dt, shape=[F, 8], value=down))}
    a = {"swiglu": gw / (1 + np.exp(-gw)) * uw, "relu_first": uw * np.maximum(gw, 0),
         "tanh_sum": np.tanh(gw + uw) * gw}[act.__name__]
    wants = {"y": a @ down.astype(np.float64)}
    if also_out:  # the gate also read outside the activation
        outs["g"], wants["g"] = g, gw
    graph = b.build(outs)
    t_in = ctx.create_tensor(data_type=dt, shape=[1, k], writable=True)
    ctx.write_tensor(t_in, x)
    t_out = {n: ctx.create_tensor(data_type=dt, shape=o.shape, readable=True)
             for n, o in outs.items()}
    ctx.dispatch(graph, {"x": t_in}, t_out)
    return ({n: ctx.read_tensor(t).astype(np.float64) for n, t in t_out.items()}, wants,
            graph._plan)


def swiglu(b, g, u):
    return b.mul(b.mul(g, b.sigmoid(g)), u)


def relu_first(b, g, u):  # the up product first, another activation
    return b.mul(u, b.relu(g))


def tanh_sum(b, g, u):
    return b.mul(b.tanh(b.add(g, u)), g)


@pytest.mark.parametrize("q4", ["quad", "quad_k2_h"])
@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("act", [swiglu, relu_first, tanh_sum])
def test_gated_pair_writes_its_activation(ctx_with, act, dt, q4):
    """``q4_epilogue=gated``: a stacked gate/up pair of 4-bit products read only by one
    element-wise group (however spelled) writes the group's result: no launch for it, the
    down projection's input as float64 computes it (float16 graphs: within their
    rounding)."""
    ctx = ctx_with(gemv="rows", q4_gemv=q4, q4_epilogue="gated")
    if dt == "float16" and not ctx._target.f16:
        pytest.skip("no shader-f16 on this adapter")
    got, want, plan = _gated_mlp(ctx, act, 48, dt)
    assert len(plan.gated) == 1
    names = [la.kernel.name for la in plan.launches]
    assert names.count("gemv_q4_quad") == 1 and not [n for n in names if "fused" in n], names
    tol = 2e-2 if dt == "float16" else _F16_PRODUCTS if q4.endswith("_h") else 1e-5
    assert np.abs(got["y"] - want["y"]).max() <= tol * np.abs(want["y"]).max()


@pytest.mark.parametrize("F,also_out", [(47, False), (48, True)])
def test_gated_pair_left_alone(ctx_with, F, also_out):
    """No gated write where the pair's rows cannot pair up (an odd length) or a product is
    read outside the activation (a graph output): both products written, the result
    the same."""
    ctx = ctx_with(gemv="rows", q4_gemv="quad", q4_epilogue="gated")
    got, want, plan = _gated_mlp(ctx, swiglu, F, also_out=also_out)
    assert not plan.gated
    for n in want:
        assert np.abs(got[n] - want[n]).max() <= 1e-5 * np.abs(want[n]).max(), n


def _q4_weights(b, rng, K: int, N: int, dt: str):
    """A random int4 (K, N) weight with float16-valued block-32 scales, as dequantizeLinear
    (the builder's op) and as float64 (the oracle's)."""
    packed = rng.integers(0, 256, size=K * N // 2, dtype=np.uint8)
    scale = (rng.uniform(0.5, 1.5, size=(K // 32, N)) / np.sqrt(K)).astype(np.float16)
    w = b.dequantize_linear(
        b.constant(data_type="int4", shape=[K, N], value=packed),
        b.constant(data_type=dt, shape=[K // 32, N], value=scale.astype(dt)),
        b.constant(data_type="int4", shape=[K // 32, N],
                   value=np.zeros(-(-(K // 32) * N // 2), np.uint8)))
    codes = (np.stack([packed & 0xF, packed >> 4], axis=1).reshape(K, N).astype(np.int8) ^ 8) - 8
    return w, codes * np.repeat(scale.astype(np.float64), 32, axis=0)


def _norm(b, x, g, dt: str, spelling: str):
    """RMSNorm of each row of ``x`` as exporters spell it: "mean" (x / sqrt(mean(x·x) +
    eps) · g, the preset's), "sum" (x · 1 / sqrt(sum(x·x) · 1/n + eps) · g: a sum
    reduction); in a float16 graph the squares widened before the reduction, the scale
    narrowed after."""
    n, last = x.shape[-1], len(x.shape) - 1
    f32 = lambda v: b.cast(v, "float32") if dt == "float16" else v  # noqa: E731
    back = lambda v: b.cast(v, dt) if dt == "float16" else v  # noqa: E731
    sq = f32(b.mul(x, x))
    eps = b.constant(data_type="float32", shape=[], value=np.array(1e-5, np.float32))
    if spelling == "mean":
        ms = b.reduce_mean(sq, axes=[last], keep_dimensions=True)
        return b.mul(b.div(x, back(b.sqrt(b.add(ms, eps)))), g)
    inv_n = b.constant(data_type="float32", shape=[], value=np.array(1 / n, np.float32))
    ss = b.reduce_sum(sq, axes=[last], keep_dimensions=True)
    return b.mul(b.mul(x, back(b.reciprocal(b.sqrt(b.add(b.mul(ss, inv_n), eps))))), g)


def _norm64(x, g, dt: str):
    """The oracle's RMSNorm of each row (float16 graphs: the square and the scaled row
    rounded where the graph rounds them)."""
    r16 = (lambda v: v.astype(np.float16).astype(np.float64)) if dt == "float16" else (
        lambda v: v)
    ms = np.mean(r16(x * x), axis=-1, keepdims=True)
    return r16(r16(x / r16(np.sqrt(ms + 1e-5))) * g)


def _norms_between_products(ctx_with, subgroup_size, monkeypatch, options: dict, dt: str,
                            K: int, N: int, spelling: str, sub: bool,
                            M: int | None) -> dict:
    """x = r + v·W1, x2 = x + RMSNorm(x)·W2, logits = RMSNorm(x2)·W3 on ``options``' plans
    with ``q4_norms`` partials and off, the same fresh random inputs (one row, or ``M`` rows
    of their own scale, so each row has its own norm), each checked against the float64
    reference and the two within rounding: {norms: (outputs, the launches' names bar casts,
    the product launches' WGSL, the cast launches, the target)}."""
    import dataclasses

    seed = int(np.random.default_rng().integers(1 << 31))  # fresh; both plans see the same
    rows = [1] if M is None else [1, M]
    got = {}
    # "shared": one row's readers compute the norm once a workgroup, in workgroup memory
    for norms in ("partials", "off") + (("shared",) if M is None else ()):
        ctx = ctx_with(q4_norms=norms, **options)
        if dt == "float16" and not ctx._target.f16:
            pytest.skip("no shader-f16 on this adapter")
        if sub:
            if not subgroup_size or subgroup_size & (subgroup_size - 1):
                pytest.skip(f"no fixed power-of-two subgroup width ({subgroup_size})")
            monkeypatch.setattr(ctx, "_target", dataclasses.replace(
                ctx._target, cpu=False, subgroup=subgroup_size))
        r2 = np.random.default_rng(seed)
        b = MLGraphBuilder(ctx)
        w1, w1v = _q4_weights(b, r2, K, N, dt)
        w2, w2v = _q4_weights(b, r2, N, N, dt)
        w3, w3v = _q4_weights(b, r2, N, 160, dt)
        gains = [r2.uniform(0.5, 1.5, N).astype(dt) for _ in range(2)]
        g1, g2 = (b.constant(data_type=dt, shape=[N], value=v) for v in gains)
        rms = 1.0 if M is None else r2.uniform(0.25, 4.0, (1, M, 1))
        v = (rms * r2.standard_normal((*rows, K))).astype(dt)
        r = (rms * r2.standard_normal((*rows, N))).astype(dt)
        vi = b.input("v", data_type=dt, shape=[*rows, K])
        ri = b.input("r", data_type=dt, shape=[*rows, N])
        x = b.add(ri, b.matmul(vi, w1))
        x2 = b.add(x, b.matmul(_norm(b, x, g1, dt, spelling), w2))
        g = b.build({"y": b.matmul(_norm(b, x2, g2, dt, spelling), w3)})
        feeds = {}
        for name, a in (("v", v), ("r", r)):
            feeds[name] = ctx.create_tensor(data_type=dt, shape=list(a.shape), writable=True)
            ctx.write_tensor(feeds[name], a)
        ty = ctx.create_tensor(data_type=dt, shape=[*rows, 160], readable=True)
        ctx.dispatch(g, feeds, {"y": ty})
        names = [la.kernel.name for la in g._plan.launches if la.kernel.name != "cast"]
        wgsl = [la.kernel.wgsl for la in g._plan.launches if la.kernel.name.startswith("ge")]
        got[norms] = (np.asarray(ctx.read_tensor(ty), np.float64).reshape(-1, 160), names,
                      wgsl, len(g._plan.launches) - len(names), ctx._target)
        g.destroy()
    r16 = (lambda a: a.astype(np.float16).astype(np.float64)) if dt == "float16" else (
        lambda a: a)
    x64 = r16(r.reshape(-1, N).astype(np.float64) + v.reshape(-1, K).astype(np.float64) @ w1v)
    x264 = r16(x64 + _norm64(x64, gains[0].astype(np.float64), dt) @ w2v)
    want = _norm64(x264, gains[1].astype(np.float64), dt) @ w3v
    tol = 1e-5 if dt == "float32" else 8e-3  # float16 rows and products
    scale = np.max(np.abs(want))
    for norms in got:
        assert np.max(np.abs(got[norms][0] - want)) <= tol * scale, norms
    assert np.max(np.abs(got["partials"][0] - got["off"][0])) <= tol * scale
    if "shared" in got:  # the readers' vector in workgroup memory, the plan the same
        assert got["shared"][1] == got["partials"][1]
        ints = options.get("q4_gemv", "").endswith("_i8")  # always there, as int8 parts
        assert [("xq[" if ints else "xs[") in w for w in got["shared"][2]] == [
            ints, True, True]
    return got


def _assert_partials_plan(got: dict, kernel: str, sub: bool) -> None:
    """The partials plan: three ``kernel`` launches, the first two writing partial sums and
    the last two reading them (``sub``: summed by subgroupAdd); the other plan two norm
    launches."""
    names, quads = got["partials"][1], got["partials"][2]
    assert names == [kernel] * 3, names
    assert ["pt[" in w for w in quads] == [True, True, False]  # the writers
    assert ["pt_in[" in w for w in quads] == [False, True, True]  # the readers
    assert ("subgroupAdd" in quads[1]) == sub
    off = got["off"][1]
    assert off.count("fused_vector") == 2 and off.count(kernel) == 3, off


@pytest.mark.parametrize("how,dt,K,N,spelling,sub", [
    ("quad_k4_h", "float16", 2048, 2048, "mean", False),
    ("quad_k4_h", "float16", 8192, 2048, "sum", True),
    ("quad_k4", "float32", 2048, 2048, "sum", True),
    ("quad", "float32", 256, 96, "mean", False),
    ("quad_k2_h", "float16", 64, 96, "mean", True),
    ("quad_k4_h", "float32", 512, 544, "sum", False),
    ("quad_k4_i8", "float16", 2048, 2048, "mean", True),
    ("quad_k4_i8", "float16", 8192, 2048, "sum", False),
    ("quad_i8", "float16", 256, 96, "mean", True)])
def test_norm_between_4bit_products_from_partial_sums(ctx_with, subgroup_size, monkeypatch,
                                                      how, dt, K, N, spelling, sub):
    """x = r + v·W1 (a residual 4-bit product), x2 = x + RMSNorm(x)·W2, logits =
    RMSNorm(x2)·W3: with ``q4_norms=partials`` each residual product writes its workgroups'
    partial sums of squares and the next product computes the norm where it reads it, so
    the step is three launches (W2's both reader and writer), not five; against float64
    NumPy on fresh random inputs (float16 graphs rounded where the graph rounds), the same
    within rounding as the norms' own launches (``q4_norms=off``), sums through workgroup
    memory or (``sub``) subgroupAdd at the adapter's width."""
    got = _norms_between_products(ctx_with, subgroup_size, monkeypatch,
                                  {"gemv": "rows", "q4_gemv": how}, dt, K, N, spelling, sub,
                                  None)
    # a float16 graph's input row is widened by a cast launch, its output narrowed (by
    # the last product itself where q4_epilogue is on: GPU targets)
    for norms in ("partials", "off"):
        casts, target = got[norms][3], got[norms][4]
        assert casts == (2 - (not target.cpu) if dt == "float16" else 0), casts
    _assert_partials_plan(got, "gemv_q4_quad", sub)


@pytest.mark.parametrize("dt,M,K,N,spelling,sub", [
    ("float16", 4, 2048, 2048, "mean", False),
    ("float16", 3, 8192, 2048, "sum", True),
    ("float32", 4, 2048, 2048, "sum", True),
    ("float32", 3, 2048, 2048, "mean", False),
    ("float32", 5, 64, 96, "mean", True)])
def test_norm_between_several_row_4bit_products_from_partial_sums(
        ctx_with, subgroup_size, monkeypatch, dt, M, K, N, spelling, sub):
    """A K-token verify's norms (``q4_rows=quad``): x = r + v·W1, x2 = x + RMSNorm(x)·W2,
    logits = RMSNorm(x2)·W3 of M rows (llama-1b's o/down into q/k/v shapes, a ragged M):
    with ``q4_norms=partials`` each residual ``gemm_q4_quad`` writes each row's partial
    sums of squares and the next computes each row's norm where it reads it, three
    launches and no norm launch; against float64 NumPy on fresh random inputs (float16
    graphs rounded where the graph rounds), and within rounding of the norms' own launches
    (``q4_norms=off``), the partials summed through workgroup memory or (``sub``)
    subgroupAdd at the adapter's width."""
    got = _norms_between_products(ctx_with, subgroup_size, monkeypatch,
                                  {"gemv": "rows", "q4_gemv": "quad", "q4_rows": "quad"},
                                  dt, K, N, spelling, sub, M)
    _assert_partials_plan(got, "gemm_q4_quad", sub)


@pytest.mark.parametrize("variant,dt,M,K,N,spelling,sub", [
    ("cols", "float16", 4, 2048, 2048, "mean", False),
    ("cols", "float16", 3, 8192, 2048, "sum", True),
    ("cols", "float32", 4, 2048, 2048, "sum", True),
    ("cols", "float32", 3, 2048, 2048, "mean", False),
    ("cols", "float32", 5, 64, 96, "mean", True),
    ("cols2", "float16", 4, 2048, 2048, "mean", True),
    ("cols4_c8", "float32", 5, 512, 544, "sum", False),
    ("cols_c32", "float16", 4, 8192, 2048, "sum", False),
    ("cols", "float32", 11, 256, 96, "mean", True),  # two row tiles, the last ragged
    ("cols2", "float16", 16, 2048, 2048, "sum", False),  # a prefill chunk's two tiles
    ("cols_h", "float16", 4, 1024, 512, "mean", False),  # float16 products
    ("cols2_h", "float16", 5, 512, 544, "sum", True),
    ("cols_h", "float32", 3, 256, 96, "mean", False)])  # float32 weights: float32 products
def test_norm_between_several_row_4bit_products_by_column_from_partial_sums(
        ctx_with, subgroup_size, monkeypatch, variant, dt, M, K, N, spelling, sub):
    """A K-token verify's norms by column (``q4_rows=cols``, the GPU default): as
    ``gemm_q4_quad``'s above, each residual ``gemm_q4_cols`` writes each row's partial
    sums of squares (a workgroup's over its columns) and the next computes each row's norm
    where it reads it: three launches and no norm launch; against float64 NumPy on fresh
    random inputs and within rounding of ``q4_norms=off``, at llama-1b's o/down into
    q/k/v shapes, a ragged M, more rows than a tile (a prefill chunk's: each tile's
    workgroups write and read their own rows' partials), several columns an invocation
    and fixed slice-groups, the partials summed through workgroup memory or (``sub``)
    subgroupAdd; "_h": float16 products (the kernels unpack code pairs, ``hq``) on a float16
    graph's weights, float32 ones on a float32 graph's."""
    got = _norms_between_products(ctx_with, subgroup_size, monkeypatch,
                                  {"gemv": "rows", "q4_rows": variant}, dt, K, N, spelling,
                                  sub, M)
    _assert_partials_plan(got, "gemm_q4_cols", sub)
    half = variant.endswith("_h") and dt == "float16"
    assert [("hq(" in w) for w in got["partials"][2] + got["off"][2]] == [half] * 6


@pytest.mark.parametrize("tail", ["cast16", "cast16_32", "tanh"])
@pytest.mark.parametrize("chunks", [False, True])
def test_a_product_read_by_one_elementwise_tail_writes_the_tail(ctx_with, monkeypatch, tail,
                                                                 chunks):
    """A 4-bit product read only by an element-wise chain of its shape (the LM head's
    logits rounded to float16, or widened back: the preset's ``cast+cast``; any chain of
    it alone):
    with ``q4_epilogue=gated`` the product's launch writes the chain's result, no launch of
    its own (each chunk at its offset, where the columns exceed the binding limit); against
    float64 NumPy (rounded to float16 where the chain rounds)."""
    from backends.webnn.wgpu_impl import match_q4

    if chunks:
        real = match_q4.lower_q4

        def small(plan, *args):
            plan.max_binding = 64 * 32  # 64 bytes a row of K = 128: chunks of 32 columns
            return real(plan, *args)

        monkeypatch.setattr(match_q4, "lower_q4", small)
    k, n = 128, 96
    seeds = np.random.default_rng().integers(1 << 31, size=2)  # fresh; both plans alike
    got, names = {}, {}
    for epi in ("gated", "off"):
        ctx = ctx_with(gemv="rows", q4_gemv="quad_k4", q4_epilogue=epi)
        if "16" in tail and not ctx._target.f16:
            pytest.skip("no shader-f16 on this adapter")
        b = MLGraphBuilder(ctx)
        w, wv = _q4_weights(b, np.random.default_rng(seeds[0]), k, n, "float32")
        v = np.random.default_rng(seeds[1]).standard_normal((1, k)).astype(np.float32)
        y = b.matmul(b.input("v", data_type="float32", shape=[1, k]), w)
        if tail == "cast16":
            y = b.cast(y, "float16")
        elif tail == "cast16_32":
            y = b.cast(b.cast(y, "float16"), "float32")
        else:
            y = b.tanh(b.sigmoid(y))
        g = b.build({"y": y})
        tv = ctx.create_tensor(data_type="float32", shape=[1, k], writable=True)
        ctx.write_tensor(tv, v)
        ty = ctx.create_tensor(data_type=y.data_type, shape=[1, n], readable=True)
        ctx.dispatch(g, {"v": tv}, {"y": ty})
        got[epi] = np.asarray(ctx.read_tensor(ty), np.float64)
        names[epi] = [la.kernel.name for la in g._plan.launches]
        g.destroy()
    lin = v.astype(np.float64) @ wv
    want = (np.tanh(1 / (1 + np.exp(-lin))) if tail == "tanh"
            else lin.astype(np.float16).astype(np.float64))
    tol = 1e-5 if tail == "tanh" else 2.0**-10  # float16 rounding either side of a tie
    assert np.max(np.abs(got["gated"] - want)) <= tol * np.max(np.abs(want))
    per = 3 if chunks else 1  # 96 columns in chunks of 32
    assert names["gated"] == ["gemv_q4_quad"] * per, names
    assert len(names["off"]) == per + 1, names


@pytest.mark.parametrize("dt", ["float32", pytest.param(
    "float16", marks=pytest.mark.adapter_feature("shader-f16"))])
@pytest.mark.parametrize("kind,k,n,m,zero_points,block", [
    ("int4", 64, 40, 4, False, 32), ("uint4", 96, 7, 3, True, 32),
    ("int4", 64, 44, 3, False, 32),  # odd M: chunks of 8 columns, the last of 4 (quad: n_off)
    pytest.param("uint4", 320, 130, 8, True, 32, marks=pytest.mark.slow),
    ("int4", 40, 9, 11, True, 8),
    pytest.param("uint4", 48, 11, 2, False, 16, marks=pytest.mark.slow),
    pytest.param("int4", 128, 33, 17, False, 32, marks=pytest.mark.slow)])
@pytest.mark.parametrize("variant", ["rows", "cols", "cols4", "quad"])
def test_4bit_matmul_of_several_rows(ctx_with, monkeypatch, variant, dt, kind, k, n, m,
                                     zero_points, block):
    """A K-token verify's (or a prefill chunk's) projection: M rows against 4-bit weights
    in one launch that reads the codes (``gemm_q4_rows``, rows a tile of 8 at a time: M
    of 2 to 17, tiles not dividing M), no dequantize launch, no float weights written;
    chunked by columns past the binding limit; lanes sharing a column ("rows") or an
    invocation a column over codes laid out by load ("cols"). Against float64 NumPy."""
    ctx = ctx_with(q4_rows=variant)
    codes = _codes(kind, (k, n))
    scale = RNG.uniform(0.005, 0.1, size=(k // block, n)).astype(dt)
    zp = _codes(kind, scale.shape) if zero_points else np.zeros(scale.shape, np.int64)
    v = RNG.standard_normal((1, m, k)).astype(dt)
    # odd M (float32: a float16 graph's casts need the binding whole): columns in chunks
    # of 8 (a binding limit of 8 columns' codes)
    if m % 2 and dt == "float32":
        monkeypatch.setattr(ctx, "_max_binding", 8 * k // 2, raising=False)
    b = MLGraphBuilder(ctx)
    w = b.dequantize_linear(_const(b, kind, codes),
                            b.constant(data_type=dt, shape=list(scale.shape), value=scale),
                            _const(b, kind, zp))
    g = b.build({"y": b.matmul(b.input("v", data_type=dt, shape=[1, m, k]), w)})
    t = ctx.create_tensor(data_type=dt, shape=[1, m, k], writable=True)
    ctx.write_tensor(t, v)
    out = ctx.create_tensor(data_type=dt, shape=[1, m, n], readable=True)
    ctx.dispatch(g, {"v": t}, {"y": out})
    want = v.astype(np.float64) @ _want(codes, scale.astype(np.float32), zp)
    got = ctx.read_tensor(out).astype(np.float64)
    names = [la.kernel.name for la in g._plan.launches]
    kernel = _rows_kernel(variant, k, block, zero_points, m, ctx)
    assert kernel in names and not any("dequantize" in x for x in names), names
    bound = 1e-5 * np.max(np.abs(want))
    if dt == "float16":  # the product rounded to float16 once
        bound += np.spacing(np.abs(want).astype(np.float16)).astype(np.float64).max()
    assert np.max(np.abs(got - want)) <= bound


def _rows_kernel(variant: str, k: int, block: int = 32, zero_points: bool = False,
                 m: int = 1, ctx=None) -> str:
    """The kernel a several-row 4-bit product runs for ``q4_rows=variant``: "quad" falls
    back to "cols" where a 16-byte load would straddle a block, zero points are read or
    its M rows' sums exceed ``ctx``'s workgroup memory."""
    from backends.webnn.kernels import quant_quad_rows as QQ

    t = getattr(ctx, "_target", None)
    if variant == "quad" and (k % 32 or block % 32 or zero_points or (
            t is not None and QQ.shared_bytes(k, m, t.subgroup) > t.shared_bytes)):
        return "gemm_q4_cols"
    return "gemm_q4_" + variant.rstrip("0123456789")


@pytest.mark.parametrize("variant,cols", [("cols", 8), ("cols_c16", 16), ("cols_c32", 32),
                                          ("cols2", 8), ("cols4_c8", 8)])
def test_4bit_products_by_column_in_narrow_column_groups(ctx_with, variant, cols):
    """A narrow product (the H200's o and down projections: 2048 columns) by column
    (``gemm_q4_cols``): ``cols_shape`` gives fewer columns a workgroup and more slices of K
    (8 columns, 32 slices) so the grid fills the device; the "_cCOLS" variants fix the
    width. Each width, ragged columns (a last group past N) and slices summed in workgroup
    memory, against float64 NumPy."""
    from backends.webnn.kernels import quant as QK

    k, n, m = 1024, 76, 5
    per = int(variant[4] if variant[4:5].isdigit() else 1)
    assert QK.cols_shape(k, n, 32, per, None if variant in ("cols", "cols2") else cols) == {
        "cols": cols, "slices": 256 // cols}
    ctx = ctx_with(q4_rows=variant)
    codes = _codes("int4", (k, n))
    scale = RNG.uniform(0.005, 0.1, size=(k // 32, n)).astype("float32")
    zp = np.zeros(scale.shape, np.int64)
    v = RNG.standard_normal((1, m, k)).astype("float32")
    b = MLGraphBuilder(ctx)
    w = b.dequantize_linear(_const(b, "int4", codes),
                            b.constant(data_type="float32", shape=list(scale.shape), value=scale),
                            _const(b, "int4", zp))
    g = b.build({"y": b.matmul(b.input("v", data_type="float32", shape=[1, m, k]), w)})
    (kern,) = [la.kernel for la in g._plan.launches]
    assert kern.name == "gemm_q4_cols" and "@workgroup_size(256)" in kern.wgsl
    assert f"let c = lid % {cols}u;" in kern.wgsl
    t = ctx.create_tensor(data_type="float32", shape=[1, m, k], writable=True)
    ctx.write_tensor(t, v)
    out = ctx.create_tensor(data_type="float32", shape=[1, m, n], readable=True)
    ctx.dispatch(g, {"v": t}, {"y": out})
    want = v.astype(np.float64) @ _want(codes, scale, zp)
    got = ctx.read_tensor(out).astype(np.float64)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.parametrize("dt", ["float32", pytest.param(
    "float16", marks=pytest.mark.adapter_feature("shader-f16"))])
@pytest.mark.parametrize("variant", ["cols", "cols2_c8", "rows", "quad", "cols_h"])
def test_several_rows_gate_and_up_write_their_swiglu(ctx_with, variant, dt):
    """A K-token layer's gate and up (stacked 4-bit products of one input of M rows) read
    only by SwiGLU: by column (``q4_epilogue=gated``), one ``gemm_q4_cols`` launch over the
    pair's interleaved columns writes ``silu(gate) · up`` (no activation launch, no product
    written); by rows the activation keeps its launch. Against float64 NumPy (float16: the
    activation rounded once, the products' float16 roundings bounded)."""
    ctx = ctx_with(q4_rows=variant, q4_epilogue="gated")
    k, f, m = 1024, 44, 5
    v = RNG.standard_normal((1, m, k)).astype(dt)
    b = MLGraphBuilder(ctx)
    x = b.input("v", data_type=dt, shape=[1, m, k])
    lin = []
    prods = []
    for _ in range(2):
        codes = _codes("int4", (k, f))
        scale = RNG.uniform(0.005, 0.05, size=(k // 32, f)).astype(dt)
        zp = np.zeros(scale.shape, np.int64)
        w = b.dequantize_linear(_const(b, "int4", codes),
                                b.constant(data_type=dt, shape=list(scale.shape), value=scale),
                                _const(b, "int4", zp))
        prods.append(b.matmul(x, w))
        lin.append(v.astype(np.float64) @ _want(codes, scale.astype(np.float32), zp))
    g, u = prods
    y = b.mul(b.mul(g, b.sigmoid(g)), u)
    down = RNG.standard_normal((f, 8)).astype(dt)  # the activation read on, as down reads it
    gr = b.build({"z": b.matmul(y, b.constant(data_type=dt, shape=[f, 8], value=down))})
    names = [la.kernel.name for la in gr._plan.launches]
    q4 = [x for x in names if x.startswith("gemm_q4")]
    acts = [x for x in names if "sigmoid" in x]
    assert q4 == ["gemm_q4_" + variant[:4]] and len(acts) == (variant == "rows"), names
    wgsl = [la.kernel.wgsl for la in gr._plan.launches if la.kernel.name.startswith("gemm")]
    assert ("hq(" in wgsl[0]) == (variant.endswith("_h") and dt == "float16")  # f16 products
    t = ctx.create_tensor(data_type=dt, shape=[1, m, k], writable=True)
    ctx.write_tensor(t, v)
    out = ctx.create_tensor(data_type=dt, shape=[1, m, 8], readable=True)
    ctx.dispatch(gr, {"v": t}, {"z": out})
    got = ctx.read_tensor(out).astype(np.float64)
    gs, us = lin
    act = gs / (1 + np.exp(-gs)) * us
    want = act @ down.astype(np.float64)
    scale = np.abs(act) @ np.abs(down.astype(np.float64))
    tol = 1e-5 if dt == "float32" else 2.0**-8  # float16: the products and the activation rounded
    assert np.all(np.abs(got - want) <= tol * scale + 1e-6)


@pytest.mark.parametrize("variant", ["rows", "cols", "cols4", "quad"])
def test_4bit_products_of_several_rows_stack_on_their_input(ctx_with, variant):
    """A K-token layer's q, k and v (three 4-bit products of one input of M rows): one
    ``gemm_q4_rows`` launch over their stacked columns writing each output, against
    float64 NumPy; a product of another input stays apart."""
    ctx = ctx_with(q4_rows=variant)
    k, m, ns = 64, 5, (48, 16, 24)
    v = RNG.standard_normal((1, m, k)).astype("float32")
    u = RNG.standard_normal((1, m, k)).astype("float32")
    b = MLGraphBuilder(ctx)
    vi = b.input("v", data_type="float32", shape=[1, m, k])
    ui = b.input("u", data_type="float32", shape=[1, m, k])
    wants, outs = {}, {}
    for i, n in enumerate((*ns, 8)):
        codes = _codes("uint4", (k, n))
        scale = RNG.uniform(0.005, 0.1, size=(k // 32, n)).astype("float32")
        zp = np.full(scale.shape, 8, np.int64)
        w = b.dequantize_linear(_const(b, "uint4", codes),
                                b.constant(data_type="float32", shape=list(scale.shape),
                                           value=scale), _const(b, "uint4", zp))
        x, xv = (vi, v) if i < len(ns) else (ui, u)
        outs[f"y{i}"] = b.matmul(x, w)
        wants[f"y{i}"] = xv.astype(np.float64) @ _want(codes, scale, zp)
    g = b.build(outs)
    tensors = {}
    for name, x in (("v", v), ("u", u)):
        tensors[name] = ctx.create_tensor(data_type="float32", shape=[1, m, k], writable=True)
        ctx.write_tensor(tensors[name], x)
    res = {name: ctx.create_tensor(data_type="float32", shape=list(wants[name].shape),
                                   readable=True) for name in outs}
    ctx.dispatch(g, tensors, res)
    names = [la.kernel.name for la in g._plan.launches]
    assert names.count("gemm_q4_" + variant.rstrip("0123456789")) == 2, names
    for name, want in wants.items():
        got = ctx.read_tensor(res[name])
        assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), name


@pytest.mark.parametrize("dt", ["float32", pytest.param(
    "float16", marks=pytest.mark.adapter_feature("shader-f16"))])
@pytest.mark.parametrize("variant", ["rows", "cols", "cols4", "quad"])
def test_4bit_product_of_several_rows_takes_its_residual_add(ctx_with, variant, dt):
    """A K-token layer's output projection plus the residual stream (a graph input, M rows),
    the sum read on: the add folded into the product's launch (float16: summed in float32, rounded once),
    against float64 NumPy within one float16 rounding of the sum."""
    ctx = ctx_with(q4_rows=variant)
    k, n, m = 96, 40, 6
    codes = _codes("uint4", (k, n))
    scale = RNG.uniform(0.005, 0.1, size=(k // 32, n)).astype(dt)
    zp = np.full(scale.shape, 8, np.int64)
    v = RNG.standard_normal((1, m, k)).astype(dt)
    r = RNG.standard_normal((1, m, n)).astype(dt)
    b = MLGraphBuilder(ctx)
    w = b.dequantize_linear(_const(b, "uint4", codes),
                            b.constant(data_type=dt, shape=list(scale.shape), value=scale),
                            _const(b, "uint4", zp))
    y = b.add(b.matmul(b.input("v", data_type=dt, shape=[1, m, k]), w),
              b.input("r", data_type=dt, shape=[1, m, n]))
    # the sum read on by a reduction, as the next norm reads it, and by a matmul
    g = b.build({"y": b.reduce_sum(y, axes=[2]), "z": b.matmul(y, b.constant(
        data_type=dt, shape=[n, 1], value=np.ones((n, 1), dt)))})
    feeds = {}
    for name, x in (("v", v), ("r", r)):
        feeds[name] = ctx.create_tensor(data_type=dt, shape=list(x.shape), writable=True)
        ctx.write_tensor(feeds[name], x)
    out = ctx.create_tensor(data_type=dt, shape=[1, m], readable=True)
    out_z = ctx.create_tensor(data_type=dt, shape=[1, m, 1], readable=True)
    ctx.dispatch(g, feeds, {"y": out, "z": out_z})
    names = [la.kernel.name for la in g._plan.launches]
    assert names.count("gemm_q4_" + variant.rstrip("0123456789")) == 1, names
    if dt == "float32":  # (a float16 sum read by float32 ops keeps its cast group; a
        # decoder's is read by the next norm's vector: tests/test_webnn_launches.py)
        assert not any("add" in x for x in names), names
    s = (v.astype(np.float64) @ _want(codes, scale.astype(np.float32), zp)
         + r.astype(np.float64))
    if dt == "float16":  # the sum as the kernel writes it: rounded once
        s = s.astype(np.float16).astype(np.float64)
    want = s.sum(axis=2)
    got = ctx.read_tensor(out).astype(np.float64)
    ulp = 0.0
    if dt == "float16":  # each sum may round to either neighbour, then the reduction's
        ulp = (np.spacing(np.abs(s).astype(np.float16)).astype(np.float64).sum(axis=2)
               + np.spacing(np.abs(want).astype(np.float16)).astype(np.float64))
    assert np.all(np.abs(got - want) <= ulp + 1e-5 * np.abs(s).sum(axis=2))


@pytest.mark.parametrize("shape,axis", [((1, 3, 5, 16), 2), ((1, 2, 4, 2, 16), 2),
                                        ((1, 2, 6, 32), 2), ((1, 2, 3, 5, 8), 3)])
@pytest.mark.parametrize("variant", ["rows", "cols", "cols4", "quad"])
def test_4bit_product_of_several_rows_reads_through_the_heads_transpose(ctx_with, variant,
                                                                        shape, axis):
    """o's rows in a K-token layer: attention's output (1, heads.., M, rest..) transposed
    to put the M tokens first, reshaped to (1, M, K): the product reads the output as it
    lies (its rows gathered head by head; a head narrower than a load: vec4 by vec4) and
    the transpose has no launch. Against float64 NumPy."""
    ctx = ctx_with(q4_rows=variant)
    n = len(shape)
    perm = (0, axis, *range(1, axis), *range(axis + 1, n))
    M = shape[axis]
    k = int(np.prod(shape)) // M
    codes = _codes("uint4", (k, 24))
    scale = RNG.uniform(0.005, 0.1, size=(k // 32 if k % 32 == 0 else k // 8, 24)).astype(
        "float32")
    zp = np.full(scale.shape, 8, np.int64)
    x = RNG.standard_normal(shape).astype("float32")
    b = MLGraphBuilder(ctx)
    w = b.dequantize_linear(_const(b, "uint4", codes),
                            b.constant(data_type="float32", shape=list(scale.shape),
                                       value=scale), _const(b, "uint4", zp))
    xi = b.input("x", data_type="float32", shape=list(shape))
    e = b.exp(xi)  # in memory (a result too), as attention's combine writes its output
    rows = b.reshape(b.transpose(e, permutation=list(perm)), [1, M, k])
    g = b.build({"y": b.matmul(rows, w), "e": e})
    t = ctx.create_tensor(data_type="float32", shape=list(shape), writable=True)
    ctx.write_tensor(t, x)
    out = ctx.create_tensor(data_type="float32", shape=[1, M, 24], readable=True)
    out_e = ctx.create_tensor(data_type="float32", shape=list(shape), readable=True)
    ctx.dispatch(g, {"x": t}, {"y": out, "e": out_e})
    names = [la.kernel.name for la in g._plan.launches]
    assert names == ["exp", _rows_kernel(variant, k, m=M, ctx=ctx)], names
    a = np.exp(x.astype(np.float64)).transpose(perm).reshape(1, M, k)
    want = a @ _want(codes, scale, zp)
    got = ctx.read_tensor(out)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


# -- float16 products by column (``q4_rows`` "_h": ``quant.gemm_q4_cols(half=True)``) ----------
#: ``gemm_q4_cols(half=True)``'s worst case a load (``quant.gemm_q4_cols``): each input rounded
#: and each of a lane's 16 pair FMAs rounding once, 17 · 2^-11 of the load's Σ|code · input|
_COLS_HALF_WORST = 17 * 2.0**-11
#: its bound on random data, relative to the largest output (float16 outputs' rounding
#: included; measured ~1.2e-3 at most over fresh draws with unsigned codes and zero points,
#: whose float16 part sums raw codes 0..15 that the zero points' term then cancels)
_COLS_HALF_RANDOM = 3e-3


def _pair_words(codes: np.ndarray, block: int) -> np.ndarray:
    """Codes (K, N) as ``gemm_q4_cols(half=True)`` reads them, written here without
    ``match_q4``: each column's words of 8 codes in pair order (element 2m of a word in
    nibble m, 2m + 1 in nibble m + 4), laid out load by load, then column (a load 4 words
    where the block is a multiple of 32, else 1)."""
    K, N = codes.shape
    nib = (codes.astype(np.int64) & 0xF).T.reshape(N, K // 8, 8).astype(np.uint32)
    pos = np.array([e // 2 + 4 * (e % 2) for e in range(8)], np.uint32)
    words = np.bitwise_or.reduce(nib << (4 * pos), axis=2).astype(np.uint32)  # (N, K / 8)
    per_load = 4 if block % 32 == 0 else 1
    return np.ascontiguousarray(words.reshape(N, -1, per_load).transpose(1, 0, 2)).reshape(-1)


@pytest.mark.parametrize("M,kind,zero_points,block,out,extra", [
    (1, "int4", False, 32, "f32", {}),
    (3, "uint4", True, 32, "f16", {"residual": True}),
    (4, "int4", False, 32, "f16", {"gated": True, "per_thread": 2}),
    (5, "uint4", True, 16, "f32", {"residual": True}),  # 8 codes a load (u32 words)
    (8, "int4", True, 32, "f32", {"cols": 8}),  # 8 columns of 32 slices of K
    (4, "uint4", False, 32, "f16", {"head_d": 16}),
    (3, "int4", False, 32, "f16", {"stats": True, "residual": True}),
    (5, "int4", False, 32, "f32", {"prologue": True}),
    (2, "uint4", False, 32, "f32", {"per_thread": 4})])
def test_cols_half_products_against_float64(ctx, M, kind, zero_points, block, out, extra):
    """``gemm_q4_cols(half=True)`` launched alone on fresh random inputs (never zeros) against
    float64 NumPy: M of 1 to 8 rows, signed and unsigned codes with and without zero
    points, blocks of 32 (16-byte loads) and 16 (words), float16 and float32 outputs,
    a residual, a gated pair's write, several columns an invocation, attention's (heads, M,
    head_d) rows, a norm's partial sums written (``stats``) and read (``prologue``). Each
    output within the kernel's stated worst case (17 roundings of 2^-11 of each load's
    magnitudes, plus the float16 output's rounding) and all within the random-data bound;
    naga and Tint both accept the kernel; its WGSL multiplies float16 code pairs."""
    from backends.webnn.kernels import quant as QK
    from backends.webnn.kernels.common import decl
    from backends.webnn.kernels.matmul import VectorSource
    from backends.webnn.kernels.quant_rows import GatedOutput, StatsOutput

    if not ctx._target.f16:
        pytest.skip("no shader-f16 on this adapter")
    rng = np.random.default_rng()
    K, N = 256, 44
    signed = kind == "int4"
    codes = rng.integers(-8, 8, (K, N)) if signed else rng.integers(0, 16, (K, N))
    scale = rng.uniform(0.02, 0.1, (K // block, N)).astype(np.float16).astype(np.float32)
    zp = (_codes(kind, scale.shape) if zero_points else np.zeros(scale.shape, np.int64))
    x = rng.standard_normal((M, K)).astype(np.float32)
    io = np.float16 if out == "f16" else np.float32
    shape = QK.cols_shape(K, N, block, extra.get("per_thread", 1), extra.get("cols"))
    kw = dict(per_thread=extra.get("per_thread", 1), residual=extra.get("residual", False),
              half_out=out == "f16", head_d=extra.get("head_d"), **shape)
    s64 = np.repeat(scale.astype(np.float64), block, axis=0)
    a = x.astype(np.float64)
    arrays = []
    if extra.get("prologue"):  # an RMSNorm of the rows from 3 partial sums of squares a row
        parts = np.stack([np.sum(x[:, i::3].astype(np.float64) ** 2, axis=1)
                          for i in range(3)], axis=1).astype(np.float32)
        kw["prologue"] = VectorSource(decl(0, "xr", "f32", "read") + decl(1, "pin", "f32", "read"),
                                      ["read", "read"], "xr[{}] * inverseSqrt(red + 1e-5)",
                                      partials=("pin[{}]", 3, K))
        a = a / np.sqrt(parts.astype(np.float64).sum(axis=1, keepdims=True) / K + 1e-5)
        arrays += [x.reshape(-1), parts.reshape(-1)]
    elif extra.get("head_d"):  # the rows as attention leaves them: (heads, M, head_d)
        d = extra["head_d"]
        arrays.append(np.ascontiguousarray(x.reshape(M, K // d, d).transpose(1, 0, 2)).reshape(-1))
    else:
        arrays.append(x.reshape(-1))
    if extra.get("gated"):  # a linear function of the pair: its write, not the activation
        kw["gated"] = GatedOutput(f"fn gt(a: f32, b: f32) -> {out} {{\n"
                                  f"  return {out}(a - 2.0 * b);\n}}\n", "gt(g0, g1)", out)
    if extra.get("stats"):
        kw["stats"] = StatsOutput(f"fn norm_el(i: u32, xs: {out}) -> f32 {{\n"
                                  "  return f32(xs) * f32(xs);\n}\n")
    k = QK.gemm_q4_cols(K, N, block, M, signed=signed, zero_points=zero_points, half=True,
                        subgroup=None, **kw)
    assert "hq(" in k.wgsl and "vec2<f16>(0.0h)" in k.wgsl and "lo(" not in k.wgsl
    arrays += [_pair_words(codes, block), scale.reshape(-1)]
    if zero_points:
        arrays.append((-zp * scale).astype(np.float32).reshape(-1))
    res = rng.standard_normal((M, N)).astype(io)
    if kw["residual"]:
        arrays.append(res.reshape(-1))
    W = QK.cols_workgroups(K, N, block, kw["per_thread"], extra.get("cols"))
    arrays.append(np.full(M * (N // 2 if "gated" in kw else N), np.nan, io))
    if "stats" in kw:
        arrays.append(np.full(M * W, np.nan, np.float32))
    got = capsule.launch(ctx._device, k, arrays)
    y = got[0].astype(np.float64).reshape(M, -1)
    lin = a @ ((codes - np.repeat(zp, block, axis=0)) * s64)
    mags = np.abs(a) @ np.abs(codes * s64)  # the float16 part's: raw codes
    if kw["residual"]:
        lin = lin + res.astype(np.float64)
    if "gated" in kw:  # columns 2n and 2n + 1 are a pair
        want, mags = lin[:, 0::2] - 2 * lin[:, 1::2], mags[:, 0::2] + 2 * mags[:, 1::2]
    else:
        want = lin
    err = np.abs(y - want)
    rounding = 2.0**-11 * np.abs(want) if out == "f16" else 0.0
    assert np.all(err <= _COLS_HALF_WORST * mags + rounding + 1e-6 * np.abs(want).max())
    assert err.max() <= _COLS_HALF_RANDOM * np.abs(want).max(), err.max() / np.abs(want).max()
    if "stats" in kw:  # each row's partials: its written values' squares, summed (each
        # value as written or, as lavapipe hands ``norm_el`` a float16 value, unrounded:
        # within half a float16 spacing of it)
        pt = got[1].reshape(M, W).astype(np.float64)
        ulp = np.spacing(np.abs(y).astype(io)).astype(np.float64)
        slack = (np.abs(y) * ulp + ulp**2).sum(axis=1) if out == "f16" else 0.0
        assert np.all(np.abs(pt.sum(axis=1) - (y ** 2).sum(axis=1))
                      <= slack + 1e-5 * (y ** 2).sum(axis=1))


@pytest.mark.parametrize("M,kind,zp,block,residual", [
    (3, "int4", False, 32, False), (4, "uint4", True, 32, True),
    (5, "uint4", "centred", 32, False),  # MatMulNBits' zero points of 8: signed codes
    (8, "int4", True, 16, True)])
@pytest.mark.parametrize("variant", ["cols_h", "cols2_c16_h"])
def test_several_row_half_products_by_column_in_a_float16_graph(ctx_with, variant, M, kind,
                                                                zp, block, residual):
    """``q4_rows=cols_h`` (and "cols2_c16_h") on a float16 graph's K-token product (float16
    rows, scales, residual and result; the products' codes repacked in pair order at
    upload): its ``gemm_q4_cols`` multiplies in float16 pairs (its WGSL unpacks code pairs
    with ``hq``: the float16 path is taken, not silently dropped), within the kernel's
    random-data bound of float64 NumPy; the same weights in a float32 graph multiply in
    float32 (no ``hq``), within 1e-5."""
    got, want = {}, {}
    rng = np.random.default_rng()
    k, n = 256, 40
    codes = _codes(kind, (k, n))
    scale = rng.uniform(0.005, 0.05, size=(k // block, n)).astype(np.float16)
    zps = (np.full(scale.shape, 8, np.int64) if zp == "centred" else _codes(kind, scale.shape)
           if zp else np.zeros(scale.shape, np.int64))
    v = rng.standard_normal((1, M, k)).astype(np.float16)
    r = rng.standard_normal((1, M, n)).astype(np.float16)
    ctx = ctx_with(q4_rows=variant)
    if not ctx._target.f16:
        pytest.skip("no shader-f16 on this adapter")
    for dt in ("float16", "float32"):
        b = MLGraphBuilder(ctx)
        w = b.dequantize_linear(_const(b, kind, codes),
                                b.constant(data_type=dt, shape=list(scale.shape),
                                           value=scale.astype(dt)), _const(b, kind, zps))
        y = b.matmul(b.input("v", data_type=dt, shape=[1, M, k]), w)
        feeds = {"v": v}
        if residual:
            y = b.add(y, b.input("r", data_type=dt, shape=[1, M, n]))
            feeds["r"] = r
        g = b.build({"y": y})
        ts = {}
        for name, a in feeds.items():
            ts[name] = ctx.create_tensor(data_type=dt, shape=list(a.shape), writable=True)
            ctx.write_tensor(ts[name], a.astype(dt))
        out = ctx.create_tensor(data_type=dt, shape=[1, M, n], readable=True)
        ctx.dispatch(g, ts, {"y": out})
        got[dt] = ctx.read_tensor(out).astype(np.float64)
        (kern,) = [la.kernel for la in g._plan.launches if la.kernel.name.startswith("gemm")]
        assert kern.name == "gemm_q4_cols"
        assert ("hq(" in kern.wgsl) == (dt == "float16"), dt  # float16 weights only
        g.destroy()
    want = v.astype(np.float64) @ _want(codes, scale.astype(np.float64), zps)
    if residual:
        want = want + r.astype(np.float64)
    top = np.abs(want).max()
    assert np.abs(got["float16"] - want).max() <= _COLS_HALF_RANDOM * top
    assert np.abs(got["float32"] - want).max() <= 1e-5 * top


@pytest.mark.parametrize("how,sub,K,N", [
    ("quad_k4_i8", True, 2048, 3072), ("quad_k4_i8", False, 8192, 2048),
    ("quad_i8", True, 1024, 77), ("quad_k2_i8", False, 64, 130), ("quad_k4_i8", True, 96, 45)])
def test_4bit_int8_parts_at_llama_shapes(ctx_with, subgroup_size, monkeypatch, how, sub, K, N):
    """``_i8``: the input split into two int8 parts a 32-input block
    (``quant_rows._int8_vector``), the codes times them as integer dot products, in a
    float16 graph (a float32 one keeps float32 products:
    ``test_4bit_int8_parts_not_in_a_float32_graph``). Against float64 NumPy, within what the
    split allows: each input within 1/64516 of its block's largest magnitude (the error of
    each product bounded by |code · scale| times that), the float16 output's rounding and
    float32 sums; at llama-1b's shapes, odd
    ones (rows not dividing N; K = 96: a ragged last load), through workgroup memory or
    subgroupAdd."""
    ctx = _gpu_at_width(ctx_with(q4_gemv=how), sub, subgroup_size, monkeypatch)
    if not ctx._target.f16:
        pytest.skip("no shader-f16 on this adapter")
    got, kernels, x, codes, scale = _q4_llama(ctx, K, N, "float16")
    kernels = [k for k in kernels if k.name.startswith("gemv")]
    assert [k.name for k in kernels] == ["gemv_q4_quad"]
    assert "dot4I8Packed" in kernels[0].wgsl and "hword(" not in kernels[0].wgsl
    w = codes * np.repeat(scale.astype(np.float64), 32, axis=0)
    x64 = x.astype(np.float64)
    want = x64 @ w
    block_max = np.repeat(np.abs(x64).reshape(-1, 32).max(axis=1), 32)
    bound = (block_max / 64516) @ np.abs(w)  # and the float16 output's rounding
    assert np.all(np.abs(got - want) <= 1.01 * bound + 2.0**-11 * np.abs(want)
                  + 1e-6 * np.max(np.abs(want)))
    half = _q4_llama(ctx_with(q4_gemv=how.replace("_i8", "_h")), K, N, "float16")
    assert np.max(np.abs(got - want)) < np.max(np.abs(half[0] - half[2].astype(np.float64) @ w))


def test_4bit_int8_parts_not_in_a_float32_graph(ctx_with):
    """``_i8`` on float32 weights: the float32 products (2^-16 of a block's largest input is
    float16's kind of error, not float32's), within float32's 1e-5."""
    got, kernels, x, codes, scale = _q4_llama(ctx_with(q4_gemv="quad_k4_i8"), 2048, 64)
    assert all("dot4I8Packed" not in k.wgsl for k in kernels)
    want = x.astype(np.float64) @ (codes * np.repeat(scale.astype(np.float64), 32, axis=0))
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
