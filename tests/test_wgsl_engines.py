"""Every WGSL kernel the compiler emits compiles with naga (wgpu-native) and with Tint (Dawn).

The kernels come from the compiler itself, not from a list: the graphs are every WebNN op on
its own (each float op in float32 and float16, integer ops in int32) and the tiny decoder
(attention and gated delta net; float32, float16 weights, float16 caches; stateful and not;
the gated delta step on float16 q and k;
a K-token verify, and a hybrid's deferred-commit verify with its capture and replay),
each compiled by ``compile_graph`` for CPU and GPU targets (with and without subgroups) under
every value of every kernel-choosing ``KernelOptions`` knob. A kernel only one engine
accepts fails here, with the compiler's message. Tint runs on Dawn's Null backend and naga on
any wgpu-native adapter; where either is missing the test skips with the reason. The builds
are swept in ``SHARDS`` shares, a test each that both engines check, so pytest-xdist's
workers split the sweep between them.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
from wgsl_compilers import compiler_device, rejection

from backends.webnn.engines import ENGINES

#: the knobs that choose how a context encodes, submits, reads and waits, not any kernel's
#: source
CONTEXT_MODES = {"record_ahead", "read_copy", "pass_calls", "map_wait", "queue_calls"}
#: values of each kernel-choosing knob (wgpu_impl/options.py documents them)
OPTION_VALUES: dict[str, list[str | int | None]] = {
    "gemv": [None, "legacy", "rows", "rows8", "rows_sh", "rows16_sh_u2", "rows_u8_w", "cols", "cols2",
             "cols4", "cols4g8", "cols8g8", "cols2g4", "cols2g16", "cols4g4", "cols1g8"],
    "attention": [None, "flash", "flash1", "lanes", "lanes1", "lanes_u8", "tile", "tile_t32",
                  "unfused", "generic"],
    "attention_rows": [None, "lanes", "tile"],
    "gemv_prologue": [None, "launch", "off", "full", "vector"],
    "row_vector": [None, "unrolled", "loop"],
    "row_writes": [None, "separate"],
    "attention_splits": [None, 1, 64],
    "attention_q_rows": [None, 1, 16],
    "cache_copy": [None, "vec4", "identity", "buffer"],
    "gemv_weights": [None, "f32", "f16"],
    "gdn": [None, "generic", "fused", "fused8", "fused64_sh", "fused_norms", "fused16_sh_norms",
            "fused_cols", "fused_norms_cols", "fused_cols64"],
    "f16_loads": [None, "wide", "vec4"],
    "q4_gemv": [None, "fused", "generic", "multi", "multi2_l8_u2", "multi8_l16_g2", "multi_u2",
                "multi_h", "wide2_k2_h", "wide4", "quad_k2_h", "quad_k4_i8"],
    "q4_prologue": [None, "off", "vector", "full"],
    "q4_epilogue": [None, "off", "gated"],
    "q4_norms": [None, "partials", "shared", "off"],
    "gemv_epilogue": [None, "off", "gated"],
    "gemv_norms": [None, "partials", "off"],
    "attention_writes": [None, "fold", "off"],
    "tile_pv": [None, "lanes", "walk"],
    "attention_loads": [None, "scores", "first", "kv"],
    "attention_sync": [None, "subgroups", "trees"],
    "attention_combine": [None, "launch", "product", "last"],
    "q4_rows": [None, "rows", "cols", "cols4", "cols_c32", "quad", "cols_h", "cols2_c16_h"],
    "gdn_replay": [None, "fused", "launch"],
}
#: knob combinations swept besides the single values: a verify's products by column with
#: float16 products that also write and read a norm's partial sums (and the gated pair)
OPTION_SETS: list[dict[str, str]] = [{"q4_rows": "cols_h", "q4_norms": "partials"}]


def _targets():
    from backends.webnn.wgpu_impl.target import Target

    return {
        "cpu": Target(cpu=True, shared_bytes=32768),
        "gpu": Target(cpu=False, subgroup=None, max_storage=8, shared_bytes=16384),
        "gpu-subgroup32": Target(cpu=False, subgroup=32, vendor="NVIDIA", max_storage=16,
                                 shared_bytes=49152, f16=True),
    }


_UNARY = ["sqrt", "exp", "log", "neg", "abs", "sigmoid", "softplus", "tanh", "relu",
          "reciprocal", "cos", "sin", "floor", "ceil", "erf", "gelu", "identity", "sign", "tan",
          "round_even"]
_BINARY = ["add", "sub", "mul", "div", "pow", "max", "min"]
_COMPARE = ["equal", "not_equal", "greater", "greater_or_equal", "lesser", "lesser_or_equal"]
_REDUCE = ["reduce_mean", "reduce_sum", "reduce_max", "reduce_min", "reduce_product"]


def _op_graphs(b, dt: str) -> dict[str, object]:
    """One output per op (and form) on inputs of type ``dt``."""
    x = b.input("x", data_type=dt, shape=[2, 3, 8])
    y = b.input("y", data_type=dt, shape=[8])
    w = b.constant(data_type=dt, shape=[8, 5], value=np.linspace(-1, 1, 40).reshape(8, 5))
    idx = b.input("idx", data_type="int32", shape=[2])
    out: dict[str, object] = {}
    floats = dt != "int32"
    for op in _BINARY if floats else ["add", "sub", "mul", "max", "min"]:
        out[op] = getattr(b, op)(x, y)
    for op in _COMPARE:
        out[op] = b.cast(getattr(b, op)(x, y), dt)
    out["logical_not"] = b.cast(b.logical_not(b.greater(x, y)), dt)
    out["logical_and"] = b.cast(b.logical_and(b.greater(x, y), b.lesser(x, y)), dt)
    out["logical_or"] = b.cast(b.logical_or(b.greater(x, y), b.equal(x, y)), dt)
    out["triangular"] = b.triangular(x, upper=False, diagonal=1)
    out["tile"] = b.tile(x, [1, 2, 1])
    out["pad"] = b.pad(x, [0, 1, 2], [1, 0, 0], value=1)
    out["pad_edge"] = b.pad(x, [0, 1, 2], [1, 0, 0], mode="edge")
    out["pad_reflection"] = b.pad(x, [1, 2, 0], [0, 0, 3], mode="reflection")
    out["clamp"] = b.clamp(x, min_value=-1, max_value=1)
    out["cast_int8"] = b.cast(b.cast(x, "int8"), dt)
    out["split"] = b.split(x, [3, 5], 2)[1]
    out["scatter_elements"] = b.scatter_elements(x, b.input("ie", data_type="int32",
                                                            shape=[2, 3, 2]),
                                                 b.slice(x, [0, 0, 0], [2, 3, 2]), axis=2)
    out["where"] = b.where(b.greater(x, y), x, y)
    out["cumulative_sum"] = b.cumulative_sum(x, 1, exclusive=True)
    out["cumulative_sum_rev"] = b.cumulative_sum(x, 2, reversed=True)
    for op in _REDUCE if floats else _REDUCE[1:]:
        out[op] = getattr(b, op)(x, axes=[2])
        out[op + "_all"] = getattr(b, op)(x)
    for to in ("float32", "int32", "uint32") + (("float16",) if floats else ()):
        out["cast_" + to] = b.cast(b.cast(x, to), dt)
    out["transpose"] = b.transpose(x, [2, 0, 1])
    out["concat"] = b.concat([x, x], 1)
    out["slice"] = b.slice(x, [0, 1, 2], [2, 2, 4])
    out["gather"] = b.gather(x, idx, 2)
    out["expand"] = b.expand(y, [3, 8])
    out["reshape"] = b.add(b.reshape(x, [6, 8]), y)
    upd = b.input("upd", data_type=dt, shape=[1, 3, 8])
    pos = b.input("pos", data_type="int32", shape=[1, 1])
    out["scatter_nd"] = b.scatter_nd(x, pos, upd)
    x4 = b.reshape(x, [1, 2, 3, 8])
    out["max_pool2d"] = b.max_pool2d(x4, window_dimensions=[2, 3], padding=[1, 0, 0, 1],
                                     strides=[1, 2], dilations=[1, 2])
    if floats:
        out["average_pool2d"] = b.average_pool2d(x4, window_dimensions=[2, 2],
                                                 output_shape_rounding="ceil", strides=[2, 2])
        out["l2_pool2d"] = b.l2_pool2d(b.reshape(x, [1, 3, 8, 2]), layout="nhwc",
                                       window_dimensions=[3, 2], padding=[1, 1, 0, 0])
    out["gather_elements"] = b.gather_elements(x, b.input("ig", data_type="int32",
                                                          shape=[2, 3, 3]), axis=2)
    out["gather_nd"] = b.gather_nd(x, b.input("ind", data_type="uint32", shape=[4, 2]))
    out["reverse"] = b.reverse(x, axes=[0, 2])
    if floats:
        for op in _UNARY:
            out[op] = getattr(b, op)(x)
        out["is_nan"] = b.cast(b.is_nan(x), dt)
        out["is_infinite"] = b.cast(b.is_infinite(x), dt)
        out["logical_xor"] = b.cast(b.logical_xor(b.greater(x, y), b.lesser(x, y)), dt)
        out["arg_max"] = b.cast(b.arg_max(x, 2), dt)  # a row of 8: one invocation's
        out["arg_min_long"] = b.cast(b.arg_min(b.reshape(x, [48]), 0), dt)  # a workgroup's
        vocab = b.tile(b.reshape(x, [1, 48]), [2, 100])  # rows of 4800: split (arg_split)
        out["arg_max_split"] = b.cast(b.arg_max(vocab, 1), dt)
        out["leaky_relu"] = b.leaky_relu(x)
        out["layer_normalization"] = b.layer_normalization(x)
        out["reduce_l2"] = b.reduce_l2(x, axes=[2])
        out["reduce_log_sum_exp"] = b.reduce_log_sum_exp(x, axes=[1, 2])
        out["conv2d"] = b.conv2d(b.reshape(x, [1, 6, 1, 8]), b.reshape(b.slice(
            w, [0, 0], [6, 3]), [6, 1, 1, 3]), padding=[0, 0, 2, 0], groups=6)
        x4 = b.reshape(x, [1, 2, 3, 8])
        out["resample2d"] = b.resample2d(x4, sizes=[5, 4], axes=[1, 3])
        out["resample2d_linear"] = b.resample2d(x4, mode="linear", scales=[1.5, 0.75])
        out["conv_transpose2d"] = b.conv_transpose2d(
            x4, b.reshape(b.slice(w, [0, 0], [6, 4]), [2, 3, 2, 2]), padding=[1, 0, 0, 1],
            strides=[2, 1], dilations=[1, 2], output_padding=[1, 0], groups=2)
        out["conv_transpose2d_nhwc"] = b.conv_transpose2d(
            b.reshape(x, [1, 3, 8, 2]), b.reshape(b.slice(w, [0, 0], [4, 4]), [2, 2, 2, 2]),
            input_layout="nhwc", filter_layout="hwoi", bias=b.slice(y, [0], [2]))
        out["softmax"] = b.softmax(x, 2)
        out["matmul"] = b.matmul(x, w)  # batched, M > 1
        v = b.input("v", data_type=dt, shape=[1, 8])
        out["gemv"] = b.matmul(v, w)  # M == 1, constant weights
        out["matmul_bt"] = b.matmul(x, b.transpose(x, [0, 2, 1]))
        c = b.constant(data_type=dt, shape=[5], value=np.linspace(0, 1, 5))
        out["gemm"] = b.gemm(b.reshape(x, [6, 8]), w, c=c, alpha=0.5, beta=2.0)
        out["fused_chain"] = b.sigmoid(b.mul(b.add(x, y), b.exp(x)))
        for kind in ("int4", "uint4", "uint8"):  # dequantizeLinear, blocks (4, 1)
            nbytes = 20 if kind != "uint8" else 40
            q = b.constant(data_type=kind, shape=[8, 5], value=np.arange(nbytes, dtype=np.uint8))
            zp = b.constant(data_type=kind, shape=[2, 5], value=np.ones(5 if kind != "uint8"
                                                                       else 10, np.uint8))
            sc = b.constant(data_type=dt, shape=[2, 5], value=np.linspace(0.1, 1, 10))
            out["dq_" + kind] = b.dequantize_linear(q, sc, zp)
        q8 = b.constant(data_type="int4", shape=[8, 5], value=np.arange(20, dtype=np.uint8))
        sc8 = b.constant(data_type=dt, shape=[1, 5], value=np.linspace(0.1, 1, 5))
        zp8 = b.constant(data_type="int4", shape=[1, 5], value=np.zeros(3, np.uint8))
        out["gemv_q4"] = b.matmul(v, b.dequantize_linear(q8, sc8, zp8))
        # blocks of 32 (the 16-byte loads, the several-rows kernel): signed with zero points,
        # two products of one row stacked and one writing a residual add; unsigned alone
        v64 = b.input("v64", data_type=dt, shape=[1, 64])
        for kind, n in (("int4", 5), ("int4", 3), ("uint4", 7)):
            q = b.constant(data_type=kind, shape=[64, n], value=np.arange(32 * n, dtype=np.uint8))
            sc = b.constant(data_type=dt, shape=[2, n], value=np.linspace(0.1, 1, 2 * n))
            zp = b.constant(data_type=kind, shape=[2, n], value=np.full(n, 0x21, np.uint8))
            out[f"gemv_q4_{kind}_{n}"] = b.matmul(v64, b.dequantize_linear(q, sc, zp))
        out["gemv_q4_res"] = b.add(out.pop("gemv_q4_int4_3"),
                                   b.input("r3", data_type=dt, shape=[1, 3]))
        for zt in ("int8", "uint8", "int32"):  # quantizeLinear, blocks (2, 1, 8)
            sc = b.constant(data_type=dt, shape=[3, 1], value=np.linspace(0.1, 1, 3))
            zp = b.constant(data_type=zt, shape=[3, 1], value=np.arange(1, 4))
            out["q_" + zt] = b.dequantize_linear(b.quantize_linear(x, sc, zp), sc, zp)
        out["rmsnorm"] = b.mul(x, b.reciprocal(b.sqrt(b.add(
            b.reduce_mean(b.mul(x, x), axes=[2], keep_dimensions=True), y))))
    return out


class _Capture:
    """The arguments of every build on a context, for compiling them again."""

    def __init__(self, monkeypatch):
        from backends.webnn.wgpu_impl.context import WgpuContext

        self.builds: list[tuple] = []
        own = WgpuContext._build

        def build(ctx, graph, use_stateful):
            built = own(ctx, graph, use_stateful)  # only builds that succeed
            self.builds.append((graph, use_stateful and ctx.state_support))
            return built

        monkeypatch.setattr(WgpuContext, "_build", build)


#: the builds are swept in this many shares, a test each, so that pytest-xdist's workers each
#: compile a share of the sweep, not every worker all of it
SHARDS = 8


def _settings() -> list[dict[str, str | int]]:
    """The sweep's option settings: the defaults, each knob's each value alone, and
    ``OPTION_SETS``."""
    return [{}] + [{k: v} for k, vs in OPTION_VALUES.items() for v in vs if v] + OPTION_SETS


@pytest.fixture(scope="module")
def builds() -> list[tuple[object, bool]]:
    """Every build of the swept graphs, as (graph, stateful): captured from a context's
    builds, so they are the graphs the converter and builder hand the compiler."""
    naga, why = compiler_device("wgpu")
    if naga is None:
        pytest.skip(why)
    from test_convert_linear import STEP_OUT, _hybrid_step, _plain_gated_delta
    from test_convert_ops import ort_model
    from test_webnn_gdn import gdn_graph

    from backends.webnn import MLGraphBuilder, NotSupportedError, ml
    from backends.webnn.onnx_converter import convert, list_kv_pairs
    from model.export import export
    from model.workload import Workload, preset

    mp = pytest.MonkeyPatch()
    cap = _Capture(mp)
    ctx = ml.create_context()
    try:
        for dt in ("float32", "float16", "int32"):
            b = MLGraphBuilder(ctx)
            outs = _op_graphs(b, dt)
            if dt == "float16":  # one graph per op: some ops take no float16 (passes.F16_OPS)
                for name, o in outs.items():
                    with contextlib.suppress(NotSupportedError):
                        b.build({name: o})
            else:
                b.build(outs)
        for name in ("tiny", "tiny+f16", "tiny+f16kv", "tiny+f16+f16kv", "tiny+q4",
                     "tiny+q4f16"):
            path = export(Workload.build(preset(name)), "standard", 24)
            pairs = list_kv_pairs(path)
            convert(path, ctx)
            convert(path, ctx, use_stateful=True, kv_cache_pairs=pairs)
        # a K-token verify's graph (several-row 4-bit products, K-query attention)
        path = export(Workload.build(preset("tiny+q4f16")), "standard", 24, tokens=4)
        convert(path, ctx, use_stateful=True, kv_cache_pairs=list_kv_pairs(path))
        # the hybrid's deferred-commit verify (capture, and the last verify's replay)
        path = export(Workload.build(preset("tiny")), "standard", 24, tokens=4,
                      rollback="deferred")
        convert(path, ctx, use_stateful=True, kv_cache_pairs=list_kv_pairs(path))
        # ORT's linear-attention contrib ops and transformers' plain-ops recurrence (the
        # K-major gated delta kernel, q scaled in the sum form)
        for graph in (ort_model(*_hybrid_step(), STEP_OUT)[0],
                      ort_model(*_plain_gated_delta(), ("y", "present_state"))[0]):
            convert(graph, ctx)
            convert(graph, ctx, use_stateful=True, kv_cache_pairs=list_kv_pairs(graph))
        # q and k in float16 with genai q4f16's norms (the kernel reading them as float16),
        # rows of vec4 words (32 lanes: subgroup sums on the NVIDIA target) and of scalars
        for shape in ((1, 2, 4, 128), (1, 3, 5, 6)):
            gdn_graph(ctx, *shape, half=True)
    finally:
        ctx.destroy()
        mp.undo()
    return cap.builds


def _sweep(numbered: list[tuple[int, tuple[object, bool]]], settings: list[dict],
           targets: dict[str, object]) -> dict[str, str]:
    """Every distinct kernel source of the builds ``numbered`` ((index, build) pairs) under
    each of ``settings`` for each of ``targets``: source -> where it was first made."""
    from backends.webnn.wgpu_impl.compiler import compile_graph
    from backends.webnn.wgpu_impl.options import KernelOptions
    from backends.webnn.wgpu_impl.plan import KernelLaunch

    found: dict[str, str] = {}
    for knobs, (tname, target), (n, (graph, stateful)) in itertools.product(
            settings, targets.items(), numbered):
        plan = compile_graph(graph, stateful, 1 << 27, target=target,
                             options=KernelOptions(**knobs))
        said = ", ".join(f"{k}={v!r}" for k, v in knobs.items()) or "defaults"
        for la in plan.launches:
            if isinstance(la, KernelLaunch):
                found.setdefault(la.kernel.wgsl, f"{la.kernel.name} (build {n}, {tname}, "
                                                 f"{said})")
    return found


def _runs(weights: list[int], shares: int) -> list[range]:
    """``range(len(weights))`` cut into ``shares`` runs of about equal total weight."""
    total, acc, bounds = sum(weights), 0, [0]
    for i, w in enumerate(weights):
        acc += w
        if len(bounds) < shares and acc * shares >= total * len(bounds):
            bounds.append(i + 1)
    bounds += [len(weights)] * (shares + 1 - len(bounds))
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def _shard(builds: list[tuple[object, bool]], shard: int) -> dict[str, str]:
    """The kernels of shard ``shard`` of the sweep: a run of consecutive builds under every
    setting for every target. The runs partition the builds and weigh about the same in
    nodes, what a build's compile time goes with; neighbours share most kernels, so a run
    leaves few for another worker to validate again."""
    run = _runs([len(graph.nodes) for graph, _ in builds], SHARDS)[shard]
    return _sweep([(n, builds[n]) for n in run], _settings(), _targets())


def _swept_under(builds: list[tuple[object, bool]], settings: list[dict],
                 tname: str) -> dict[str, str]:
    """The kernels of every build under ``settings`` for target ``tname``: a part of what
    the shards validate, so each setting must be one the sweep takes."""
    assert all(knobs in _settings() for knobs in settings)
    return _sweep(list(enumerate(builds)), settings, {tname: _targets()[tname]})


def test_the_sweep_covers_every_kernel_knob():
    """Every knob is swept but the context modes, and every value swept is one the
    options accept (KernelOptions checks each), so a new knob cannot go unvalidated."""
    import dataclasses

    from backends.webnn.wgpu_impl.options import KernelOptions

    knobs = {f.name for f in dataclasses.fields(KernelOptions)}
    assert set(OPTION_VALUES) | CONTEXT_MODES == knobs
    for knob, values in OPTION_VALUES.items():
        for v in values:
            KernelOptions(**{knob: v})


def test_the_shards_partition_the_builds():
    """Every build is in one shard, the shards in order, however the weights fall."""
    for weights in ([264] + [8] * 100 + [180] * 18 + [60] * 4, [1] * 3, [5, 1, 1, 1, 40], []):
        runs = _runs(weights, SHARDS)
        assert len(runs) == SHARDS
        assert [i for run in runs for i in run] == list(range(len(weights)))


def test_the_sweep_reaches_a_verifys_norms_in_its_products(builds):
    """The K-token verify with ``q4_rows=quad`` on the subgroup target: its several-row
    products writing a norm's partial sums and reading them, each row's summed by
    subgroups (``gemm_q4_quad`` ``stats`` and ``prologue``), are among the kernels the
    engines compile. (Without subgroups the tiny verify's sums leave no room in 16 KB of
    workgroup memory for the rows' reductions: its norms keep their launch there.)"""
    kernels = _swept_under(builds, [{"q4_rows": "quad"}], "gpu-subgroup32")
    quads = [src for src, where in kernels.items() if where.startswith("gemm_q4_quad")]
    assert any("pt[" in src for src in quads)
    assert any("red_p1_sg" in src for src in quads)  # subgroupAdd of row 1's partials


def test_the_sweep_reaches_float16_products_by_column(builds):
    """``q4_rows=cols_h`` on the float16-weight verify (the f16 target): ``gemm_q4_cols``
    with float16 code pairs (``hq``), among them ones writing a norm's partial sums and
    reading them and a gated pair's, are among the kernels the engines compile."""
    kernels = _swept_under(builds, [{"q4_rows": "cols_h"}, *OPTION_SETS], "gpu-subgroup32")
    cols = [src for src, where in kernels.items()
            if where.startswith("gemm_q4_cols") and "hq(" in src]
    assert cols
    assert any("pt[" in src for src in cols) and any("row_in(" in src for src in cols)
    assert any("pair_sh" in src for src in cols)


def _rejected(engine: str, kernels: dict[str, str]) -> str:
    """"" where engine ``engine``'s compiler accepts every one of ``kernels``, else what it
    said of the first few it rejects."""
    bad = [(where, err) for src, where in kernels.items() if (err := rejection(engine, src))]
    if not bad:
        return ""
    eng = ENGINES[engine]
    return (f"{eng.compiler} ({eng.implementation}) rejects {len(bad)} of {len(kernels)} "
            "kernels; first: " + "; ".join(f"{w}: {e[:300]}" for w, e in bad[:3]))


def test_the_sweep_reaches_float_products_writing_norms_and_pairs(builds):
    """The float-weight products on the GPU targets (``gemv_norms``, ``gemv_epilogue``: on
    by default there): ``matmul_gemv`` kernels writing a norm's partial sums (``pt[``),
    reading them (``pt_in[``; summed by subgroups on the subgroup target) and writing a
    gated pair's activation (``pair_sh``), float16 weights among them, are among the
    kernels the engines compile."""
    kernels = {**_swept_under(builds, [{}], "gpu-subgroup32"), **_swept_under(builds, [{}], "gpu")}
    gemvs = [src for src, where in kernels.items() if where.startswith("matmul_gemv")]
    assert any("pt[" in src for src in gemvs)
    assert any("pt_in[" in src and "red_p_sg" in src for src in gemvs)
    assert any("pt_in[" in src and "red_p_sg" not in src for src in gemvs)
    assert any("pair_sh" in src and "unpack2x16float" in src for src in gemvs)
    assert any("pair_sh" in src and "pt_in[" in src for src in gemvs)  # gate/up: both


@pytest.mark.parametrize("first,last", [(False, False), (True, False), (True, True)],
                         ids=["scores", "first", "first-last"])
@pytest.mark.parametrize("g,cap,d,kv,rows", [
    (4, 8200, 64, "f16", 256),  # llama-1b's one-token head: one subgroup a word's shares
    (4, 300, 16, "f32", 128),  # 64 shares a word: two subgroups
    (2, 517, 32, "f32", 64),  # 2 rows an invocation, the last split short
])
def test_the_tile_attentions_lane_probs_v_compiles(g, cap, d, kv, rows, first, last):
    """The tile attention's one-token probs·V at the NVIDIA subgroup width (V words in
    registers, the row shares summed by subgroups: ``attention_tile._lane_pv``), which the
    sweep's tiny graphs (24 cache rows) do not reach, compiles with every engine here;
    ``first``: its K and V words loaded at the kernel's start (``attention_loads``);
    ``last``: each head's last workgroup combining (``attention_combine``)."""
    from backends.webnn.kernels import attention_tile as ATT

    plan = ATT.tile_plan(g, cap, d, kv, 49152 // 4, rows)
    assert ATT.lane_pv_applies(plan, 32)
    k1 = ATT.flash_tile(2, g, cap, d, None, plan, kv=kv, subgroup=32, sync=32,
                        loads_first=first, last=last)[0]
    assert ("atomicAdd(&cnt[" in k1.wgsl) == last
    assert (k1.wgsl.index("let vw0 = v[") < k1.wgsl.index("qs[jj] =")) == first
    engines = [e for e in ENGINES if compiler_device(e)[0] is not None]
    if not engines:
        pytest.skip("no WGSL compiler here")
    errors = [err for e in engines if (err := _rejected(e, {k1.wgsl: "attention_tile"}))]
    assert not errors, "\n".join(errors)

@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_kernel_compiles(builds, shard):
    """Every engine's compiler here accepts every kernel of this shard of the sweep; skipped
    with the reason, once the others have passed, where an engine's compiler is missing."""
    kernels = _shard(builds, shard)
    assert len(kernels) > 50  # the shard's builds reached the compiler's variety
    missing = [why for engine in ENGINES if (why := compiler_device(engine)[1])]
    errors = [err for engine in ENGINES
              if compiler_device(engine)[0] is not None and (err := _rejected(engine, kernels))]
    assert not errors, "\n".join(errors)
    if missing:
        pytest.skip("; ".join(missing))


def test_the_chunked_gather_compiles():
    """The gather of a table bound in chunks (``movement.gather_chunks``: a chain of ``if``
    over the chunks' bindings, the whole table and a middle group of chunks), which the
    sweep's tiny tables do not reach, compiles with every engine here."""
    from backends.webnn.kernels import movement as MV

    kernels = {MV.gather_chunks("f16", "i32", [151936, 2048], [1, 1],
                                [(r, min(r + 16384, 151936)) for r in range(0, 151936, 16384)])
               .wgsl: "gather",
               MV.gather_chunks("f32", "i32", [70, 16], [1, 4],
                                [(16, 32), (32, 48)]).wgsl: "gather"}
    engines = [e for e in ENGINES if compiler_device(e)[0] is not None]
    if not engines:
        pytest.skip("no WGSL compiler here")
    errors = [err for e in engines if (err := _rejected(e, kernels))]
    assert not errors, "\n".join(errors)
