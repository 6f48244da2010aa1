"""The gated delta net decode step in one launch (wgpu_impl/match_gdn.py, kernels/gdn.py): the
kernel against a float64 NumPy recurrence written here from DESIGN §5, on fresh random
inputs, through a non-stateful graph (the new state in another buffer) and a stateful one
(updated in place over several dispatches); near-miss graphs keep the generic ops; whole
decode steps of the hybrid presets through the stateful and non-stateful pages."""

from __future__ import annotations

import re

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder, MLKVCachePair
from backends.webnn.wgpu_impl import compiler
from backends.webnn.wgpu_impl.options import KernelOptions

RNG = np.random.default_rng(20261966)
EPS = 1e-6


def oracle(state, q, k, v, a, bb, a_log, dt_bias, rep: int, row_decay=None,
           scaled: bool = True, eps: float = EPS, q_scale: float | None = None):
    """One step of S_t = exp(g) S + k (beta (v - exp(g) S^T k))^T, o = S_t^T q / sqrt(dk),
    q and k L2-normalised, per value head h reading q/k head h // rep. ``state`` is V-major
    (heads, dv, dk): S = state[h].T. ``row_decay`` (heads, dv): a decay per value row
    instead (a graph the kernel must not take). ``scaled``: False without the 1/sqrt(dk);
    ``q_scale``: another factor instead (a float16 constant's). ``eps``: the norms'.
    Returns (new state, o (heads, dv))."""
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    state, q, k, v, a, bb = map(f, (state, q, k, v, a, bb))
    heads, dv, dk = state.shape
    qn = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
    kn = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    factor = q_scale if q_scale is not None else 1.0 / np.sqrt(dk) if scaled else 1.0
    g = -np.exp(f(a_log)) * np.log1p(np.exp(a + f(dt_bias)))
    beta = 1.0 / (1.0 + np.exp(-bb))
    new, o = np.empty_like(state), np.empty((heads, dv))
    for h in range(heads):
        j = h // rep
        s_mat = state[h].T  # (dk, dv)
        decayed = s_mat * (np.exp(g[h]) if row_decay is None else f(row_decay)[h][None, :])
        delta = beta[h] * (v[h] - decayed.T @ kn[j])
        s_new = decayed + np.outer(kn[j], delta)
        new[h] = s_new.T
        o[h] = s_new.T @ qn[j] * factor
    return new, o


def gdn_graph(ctx, hk: int, rep: int, dv: int, dk: int, *, stateful: bool = False,
              row_decay: bool = False, extra: str | None = None, half: bool = False):
    """The GDN step as the standard ONNX flavour spells it (model/export.py ``_gdn``),
    from raw q, k, v, gate input ``a`` and beta input ``b``. ``extra``: a near miss,
    "s" (the decayed state is also an output) or "r" (the retrieval is also an output);
    "kn": the normalised k is also an output (its norm is not folded in); "decay_input":
    the decay per head is a graph input (read from its buffer, no chain); "unscaled": O is
    the output as is (no element-wise tail). ``half``: q and k float16 and their norms as
    genai's q4f16 export spells them (``half_norms``)."""
    hv = hk * rep
    b = MLGraphBuilder(ctx)
    f32 = "float32"
    past = b.input("past", data_type=f32, shape=[1, hv, dv, dk])
    qk = "float16" if half else f32
    q = b.input("q", data_type=qk, shape=[1, hk, dk])
    k = b.input("k", data_type=qk, shape=[1, hk, dk])
    v = b.input("v", data_type=f32, shape=[1, 1, hv * dv])
    a = b.input("a", data_type=f32, shape=[1, 1, hv])
    bb = b.input("b", data_type=f32, shape=[1, 1, hv])
    consts = {"a_log": RNG.uniform(-1, 1, hv).astype(np.float32),
              "dt_bias": RNG.uniform(-1, 1, hv).astype(np.float32)}

    def const(x):
        x = np.asarray(x, np.float32)
        return b.constant(data_type=f32, shape=list(x.shape), value=x)

    eps = const(np.float32(EPS).reshape(()))

    def l2(t):
        ss = b.reduce_sum(b.mul(t, t), axes=[2], keep_dimensions=True)
        return b.div(t, b.sqrt(b.add(ss, eps)))

    qn, kn = half_norms(b, q, k, dk) if half else (l2(q), l2(k))
    g = b.mul(b.neg(b.exp(const(consts["a_log"]))),
              b.softplus(b.add(a, const(consts["dt_bias"]))))
    if row_decay:
        consts["row_decay"] = RNG.uniform(0.5, 1.0, (hv, dv)).astype(np.float32)
        decay = const(consts["row_decay"].reshape(1, hk, rep, dv, 1))
    elif extra == "decay_input":
        decay = b.input("decay", data_type=f32, shape=[1, hk, rep, 1, 1])
    else:
        decay = b.reshape(b.exp(g), [1, hk, rep, 1, 1])
    beta = b.reshape(b.sigmoid(bb), [1, hk, rep, 1, 1])
    s = b.mul(b.reshape(past, [1, hk, rep, dv, dk]), decay)
    r = b.matmul(s, b.reshape(kn, [1, hk, 1, dk, 1]))
    delta = b.mul(b.sub(b.reshape(v, [1, hk, rep, dv, 1]), r), beta)
    new = b.add(s, b.mul(delta, b.reshape(kn, [1, hk, 1, 1, dk])))
    o = b.matmul(new, b.reshape(qn, [1, hk, 1, dk, 1]))
    if extra != "unscaled" and not half:
        o = b.mul(o, const(np.float32(1 / np.sqrt(dk)).reshape(())))
    y = b.reshape(o, [hv, dv])
    outs = {"y": y, "present": b.reshape(new, [1, hv, dv, dk])}
    if extra == "s":
        outs["s"] = b.reshape(s, [1, hv, dv, dk])
    elif extra == "r":
        outs["r"] = b.reshape(r, [hv, dv])
    elif extra == "kn":
        outs["kn"] = kn
    pairs = [MLKVCachePair(input="past", output="present")] if stateful else []
    g_ = b.build(outs, use_stateful=stateful, kv_cache_pairs=pairs)
    return g_, outs, consts


def half_scale(dk: int) -> float:
    """q's factor 1/sqrt(dk) as a float16 constant holds it."""
    return float(np.float16(1 / np.sqrt(dk)))


def half_norms(b, q, k, dk: int):
    """q's and k's L2 norms as genai's q4f16 export spells them: LpNormalization (no
    epsilon) on float16 (the builder sums the squares in float32), q scaled by a float16
    1/sqrt(dk) before the output product, both widened to float32 for the step."""
    def l2(t):
        return b.div(t, b.sqrt(b.reduce_sum(b.mul(t, t), axes=[2], keep_dimensions=True)))

    c = np.float16(half_scale(dk)).reshape(())
    qn = b.mul(l2(q), b.constant(data_type="float16", shape=[], value=c))
    return b.cast(qn, "float32"), b.cast(l2(k), "float32")


def feeds(hk: int, rep: int, dv: int, dk: int, with_state: bool,
          half: bool = False) -> dict[str, np.ndarray]:
    hv = hk * rep
    shapes = {"q": (1, hk, dk), "k": (1, hk, dk), "v": (1, 1, hv * dv), "a": (1, 1, hv),
              "b": (1, 1, hv)}
    if with_state:
        shapes["past"] = (1, hv, dv, dk)
    out = {n: RNG.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    if half:
        out["q"], out["k"] = out["q"].astype(np.float16), out["k"].astype(np.float16)
    return out


def dispatch(ctx, graph, outs, values):
    ins = {}
    for n, x in values.items():
        if n not in graph.inputs:
            continue  # an input this variant of the graph does not read
        kind = "float16" if x.dtype == np.float16 else "float32"
        t = ctx.create_tensor(data_type=kind, shape=list(x.shape), writable=True)
        ctx.write_tensor(t, x)
        ins[n] = t
    res = {n: ctx.create_tensor(data_type="float32", shape=list(outs[n].shape), readable=True)
           for n in graph.outputs}
    ctx.dispatch(graph, ins, res)
    return {n: ctx.read_tensor(t) for n, t in res.items()}


def names(graph) -> list[str]:
    return [la.kernel.name for la in graph._plan.launches if hasattr(la, "kernel")]


def expect(out, want_state, want_o, hk, rep, dv, dk):
    hv = hk * rep
    np.testing.assert_allclose(out["present"].reshape(hv, dv, dk), want_state, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(out["y"], want_o, rtol=1e-5, atol=1e-5)


def step_oracle(x, state, consts, rep, row_decay=None):
    hv = state.shape[0]
    return oracle(state, x["q"][0], x["k"][0], x["v"].reshape(hv, -1), x["a"].reshape(hv),
                  x["b"].reshape(hv), consts["a_log"], consts["dt_bias"], rep, row_decay)


# (hk, rep, dv, dk, variant): vec4 rows of one word per lane (dk 128, 32 lanes), several
# words per lane (8 lanes), one lane per row, scalar rows with lanes past the row's end
# (dk 6: 4 lanes, 2 words each), sums through subgroups where the adapter has them
CASES = [(2, 2, 16, 16, "fused"), (2, 1, 8, 128, "fused"), (1, 2, 8, 128, "fused8"),
         (1, 3, 5, 6, "fused"), (2, 2, 4, 12, "fused1_sh"), (1, 1, 3, 7, "fused2")]


@pytest.mark.parametrize("hk,rep,dv,dk,variant", CASES)
def test_one_launch_into_another_buffer_matches_oracle(ctx_with, hk, rep, dv, dk, variant):
    """Non-stateful: the old state an input, the new state an output of its own."""
    ctx = ctx_with(gdn=variant)
    graph, outs, consts = gdn_graph(ctx, hk, rep, dv, dk)
    assert names(graph).count("gated_delta") == 1, names(graph)
    assert not {"matmul", "add", "mul"} & set(names(graph)), names(graph)
    x = feeds(hk, rep, dv, dk, with_state=True)
    out = dispatch(ctx, graph, outs, x)
    expect(out, *step_oracle(x, x["past"][0], consts, rep), hk, rep, dv, dk)


@pytest.mark.adapter_feature("subgroup")
@pytest.mark.parametrize("stateful", [False, True])
def test_subgroup_sums_match_oracle(ctx_with, subgroup_size, stateful, monkeypatch):
    """The GPU default sums a row's partials with subgroupAdd when the subgroup is as wide
    as the row's lanes (32 on NVIDIA); run here with the adapter's own width."""
    import dataclasses

    width = subgroup_size
    if width is None or width > 32 or width & (width - 1):
        pytest.skip(f"no fixed power-of-two subgroup width to test with ({width})")
    ctx = ctx_with(gdn=f"fused{width}")
    monkeypatch.setattr(ctx, "_target", dataclasses.replace(ctx._target, subgroup=width))
    hk, rep, dv, dk = 2, 2, 8, 4 * width
    graph, outs, consts = gdn_graph(ctx, hk, rep, dv, dk, stateful=stateful)
    (kernel,) = [la.kernel for la in graph._plan.launches if hasattr(la, "kernel")]
    assert "subgroupAdd" in kernel.wgsl and "workgroupBarrier" not in kernel.wgsl
    state = np.zeros((hk * rep, dv, dk))
    for _ in range(2 if stateful else 1):
        x = feeds(hk, rep, dv, dk, with_state=not stateful)
        out = dispatch(ctx, graph, outs, x)
        state, want_o = step_oracle(x, x["past"][0] if not stateful else state, consts, rep)
        np.testing.assert_allclose(out["y"], want_o, rtol=1e-5, atol=1e-5)
        if not stateful:
            expect(out, state, want_o, hk, rep, dv, dk)


@pytest.mark.parametrize("hk,rep,dv,dk,variant", CASES[:4])
def test_one_launch_in_place_over_steps_matches_oracle(ctx_with, hk, rep, dv, dk, variant):
    """Stateful: the paired state updated in place by the kernel, dispatch after dispatch
    (the first from the zero state createTensor gives, the next ones from its result);
    the hidden state is checked through the output, which reads the new state."""
    ctx = ctx_with(gdn=variant)
    graph, outs, consts = gdn_graph(ctx, hk, rep, dv, dk, stateful=True)
    assert graph.is_stateful and graph.in_place == {"past": True}
    launch = next(la for la in graph._plan.launches if la.kernel.name == "gated_delta")
    assert ("state", 0, "cur") in launch.slots and ("state", 0, "next") not in launch.slots
    state = np.zeros((hk * rep, dv, dk))
    for _ in range(3):
        x = feeds(hk, rep, dv, dk, with_state=False)
        out = dispatch(ctx, graph, outs, x)
        state, want_o = step_oracle(x, state, consts, rep)
        np.testing.assert_allclose(out["y"], want_o, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hk,rep,dv,dk,variant", [CASES[0], CASES[3]])
def test_float16_norms_fold_in_through_their_casts(ctx_with, hk, rep, dv, dk, variant):
    """q and k float16, normalised in float16 with float32 sums, q scaled in float16 and
    both widened (genai's q4f16 export): the kernel reads them as float16 and computes the
    norms in float32, one launch, the float64 oracle on the float16 inputs; with
    "fused_norms" the norms keep their launches and the step the kernel, the oracle within
    float16's rounding of the normalised vectors."""
    want_state = None
    for how, tol in ((variant, 1e-5), ("fused_norms", 4e-3)):
        ctx = ctx_with(gdn=how)
        graph, outs, consts = gdn_graph(ctx, hk, rep, dv, dk, half=True)
        kinds = names(graph)
        assert kinds.count("gated_delta") == 1, kinds
        assert (norm_launches(kinds) == 0) == (how == variant), kinds
        (wgsl,) = [la.kernel.wgsl for la in graph._plan.launches
                   if la.kernel.name == "gated_delta"]
        assert bool(re.search(r"\bk: array<(vec4<)?f16>", wgsl)) == (how == variant), wgsl
        x = feeds(hk, rep, dv, dk, with_state=True, half=True)
        out = dispatch(ctx, graph, outs, x)
        hv = hk * rep
        want_state, want_o = oracle(
            x["past"][0], x["q"][0], x["k"][0], x["v"].reshape(hv, -1), x["a"].reshape(hv),
            x["b"].reshape(hv), consts["a_log"], consts["dt_bias"], rep, eps=0.0,
            q_scale=half_scale(dk))
        np.testing.assert_allclose(out["present"].reshape(hv, dv, dk), want_state, rtol=tol,
                                   atol=tol)
        np.testing.assert_allclose(out["y"], want_o, rtol=tol, atol=tol)


def launches_per_norm(ctx) -> int:
    """An L2 norm is a reduction and a tail on a CPU adapter, one ``fused_vector`` launch
    (a workgroup per head) on a GPU one: the same test runs on lavapipe and the H200."""
    return 2 if ctx._target.cpu else 1


def norm_launches(kinds: list[str]) -> int:
    """How many norms a launch list computes: each has one reduction or one fused_vector."""
    return kinds.count("reduce_sum") + kinds.count("fused_vector")


def test_normalised_k_read_elsewhere_keeps_its_norm(ctx_with):
    """k's norm is also an output: it keeps its launches and the kernel reads the
    normalised k; q's norm is still folded in."""
    ctx = ctx_with(gdn="fused")
    hk, rep, dv, dk = 2, 2, 8, 8
    graph, outs, consts = gdn_graph(ctx, hk, rep, dv, dk, extra="kn")
    kinds = names(graph)
    assert "gated_delta" in kinds and norm_launches(kinds) == 1, kinds
    x = feeds(hk, rep, dv, dk, with_state=True)
    out = dispatch(ctx, graph, outs, x)
    expect(out, *step_oracle(x, x["past"][0], consts, rep), hk, rep, dv, dk)
    k64 = x["k"].astype(np.float64)
    np.testing.assert_allclose(out["kn"], k64 / np.sqrt((k64 * k64).sum(-1, keepdims=True) + EPS),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("extra", ["decay_input", "unscaled"])
def test_decay_from_a_buffer_and_no_output_tail(ctx_with, extra):
    """The decay a graph input (read per head from its buffer) or O written without a
    tail: still one launch, still the oracle."""
    ctx = ctx_with(gdn="fused")
    hk, rep, dv, dk = 2, 3, 4, 8
    graph, outs, consts = gdn_graph(ctx, hk, rep, dv, dk, extra=extra)
    assert names(graph) == ["gated_delta"], names(graph)
    x = feeds(hk, rep, dv, dk, with_state=True)
    decay = None
    if extra == "decay_input":
        x["decay"] = RNG.uniform(0.3, 1.0, (1, hk, rep, 1, 1)).astype(np.float32)
        decay = np.repeat(x["decay"].reshape(hk * rep, 1), dv, axis=1)
    out = dispatch(ctx, graph, outs, x)
    hv = hk * rep
    want = oracle(x["past"][0], x["q"][0], x["k"][0], x["v"].reshape(hv, -1),
                  x["a"].reshape(hv), x["b"].reshape(hv), consts["a_log"], consts["dt_bias"],
                  rep, decay, scaled=extra != "unscaled")
    expect(out, *want, hk, rep, dv, dk)


@pytest.mark.parametrize("extra", ["s", "r", "row_decay"])
def test_near_misses_keep_the_generic_ops(ctx_with, extra):
    """The decayed state or the retrieval also read as an output, or a decay per value row
    rather than per head: no fused launch, and the generic ops compute the oracle."""
    ctx = ctx_with(gdn="fused")
    hk, rep, dv, dk = 2, 2, 8, 8
    graph, outs, consts = gdn_graph(ctx, hk, rep, dv, dk, row_decay=extra == "row_decay",
                                    extra=None if extra == "row_decay" else extra)
    assert "gated_delta" not in names(graph)
    x = feeds(hk, rep, dv, dk, with_state=True)
    out = dispatch(ctx, graph, outs, x)
    expect(out, *step_oracle(x, x["past"][0], consts, rep, consts.get("row_decay")),
           hk, rep, dv, dk)


def test_generic_option_and_cpu_default_keep_the_ops(ctx, ctx_with):
    """KernelOptions.gdn = "generic" everywhere, and None on a CPU adapter: the ops one by
    one (decayed state, retrieval, delta with the update and the new state fused, output
    matvec, scale: 4 more launches, and q's and k's norms, 2 or 4 more by the adapter);
    "fused_norms" keeps the norms' launches; an unknown value is refused when the options
    are made, and cannot reach a context."""
    hk, rep, dv, dk = 1, 2, 4, 8
    assert names(gdn_graph(ctx_with(gdn="fused"), hk, rep, dv, dk)[0]) == ["gated_delta"]
    kept = names(gdn_graph(ctx_with(gdn="fused_norms"), hk, rep, dv, dk)[0])
    per_norm = launches_per_norm(ctx)
    assert norm_launches(kept) == 2 and kept[-1] == "gated_delta", kept
    assert len(kept) == 1 + 2 * per_norm, kept
    for how in ("generic", None):
        if how is None and not ctx._target.cpu:
            continue
        generic = names(gdn_graph(ctx_with(gdn=how), hk, rep, dv, dk)[0])
        assert "gated_delta" not in generic and len(generic) == 1 + 4 + 2 * per_norm, generic
    for bad in ("fastest", "fused12", "fused0"):
        with pytest.raises(ValueError, match="fused|power of two"):
            ctx_with(gdn=bad)
        with pytest.raises(ValueError, match="fused|power of two"):
            KernelOptions.parse([f"gdn={bad}"])


@pytest.mark.parametrize("subgroup,reduction", [(32, "subgroupAdd"), (None, "workgroupBarrier")])
def test_gpu_targets_plan_the_kernel_by_default(ctx_with, subgroup, reduction, monkeypatch):
    """Planning only (no device): on a GPU target the default is the one launch, 32 lanes
    per state row of dk = 128, summed with subgroupAdd where the subgroup is 32 wide."""
    from backends.webnn.wgpu_impl.target import Target

    captured = {}
    real = compiler.compile_graph

    def keep(graph, *args, **kw):
        captured["graph"] = graph
        return real(graph, *args, **kw)

    monkeypatch.setattr("backends.webnn.wgpu_impl.context.compile_graph", keep)
    gdn_graph(ctx_with(gdn="generic"), 2, 2, 4, 128)
    plan = compiler.compile_graph(captured["graph"], False,
                                  target=Target(cpu=False, subgroup=subgroup, max_storage=16),
                                  options=KernelOptions(gdn=None))
    kernels = [la.kernel for la in plan.launches]
    assert [k.name for k in kernels] == ["gated_delta"]  # q's and k's norms folded in
    assert reduction in kernels[0].wgsl
    other = {"subgroupAdd", "workgroupBarrier"} - {reduction}
    assert other.pop() not in kernels[0].wgsl
    assert kernels[0].groups[0] == 2 * 2 * 4 // 8  # 8 rows of 32 lanes per workgroup


# -- whole decode steps of the hybrid presets ---------------------------------------------

def _model_modes():
    from backends.pages import StatefulInPlace, StatelessCopy, TensorReuse

    return {cls.name: cls for cls in (StatefulInPlace, TensorReuse, StatelessCopy)}


def _prepared(cls, workload, capacity: int, **knobs):
    b = cls(options=KernelOptions(**knobs))
    b.prepare(workload, capacity)
    return b


def _gdn_launches(backend) -> list[str]:
    return [la.kernel.name for la in backend.converted.graph._plan.launches
            if hasattr(la, "kernel")]


@pytest.mark.parametrize("preset_name", ["tiny", "small"])
@pytest.mark.parametrize("mode", ["wgpu:stateful", "wgpu:reuse", "wgpu:stateless"])
def test_decode_steps_match_reference(ctx, preset_name, mode):
    """Every GDN layer of the preset runs as one gated_delta launch (in place on the
    stateful page, into the present-state output on the others) and the logits of steps
    at depth are the model reference's."""
    from backends.base import DepthState
    from model.reference import Reference
    from model.workload import Workload, preset, token_stream

    wl = Workload.build(preset(preset_name))
    depth, steps, cap = 12, 3, 16
    tokens = token_stream(wl.config, cap + 4)
    b = _prepared(_model_modes()[mode], wl, cap, gdn="fused")
    try:
        assert _gdn_launches(b).count("gated_delta") == len(wl.config.gdn_layers)
        if mode == "wgpu:stateful":
            assert all(b.converted.graph.in_place.values())
        ref = Reference(wl.config, wl.weights, cap)
        ref.prefill(tokens[:depth])
        b.reach_depth(DepthState(tokens=tokens[:depth].copy(), cache=ref.cache_arrays()))
        for i in range(steps):
            tok = int(tokens[depth + i])
            got, want = np.asarray(b.step(tok), np.float64), ref.step(tok)
            rel = np.abs(got - want).max() / np.abs(want).max()
            assert rel < 1e-4 and got.argmax() == want.argmax(), (mode, i, rel)
    finally:
        b.close()


def test_launches_per_gdn_layer_drop_by_eight():
    """The pattern fires on the exported model, planned as on a GPU (GPU matrix-vector
    kernels forced: each norm one launch): q's and k's L2 norms, the decay, retrieval,
    delta with the rank-1 update and the new state (a state writer computes the chain it
    reads inside, fusion.plan), output matvec and scale (7 launches per GDN layer on the
    stateful page) become one, and q and k are read where they lie in the convolution's
    output (their two slices need no launch), so a silent fallback fails here; with
    "fused_norms" the two norms keep theirs, and so do the slices they read."""
    from backends.pages import StatefulInPlace
    from model.workload import Workload, preset

    wl = Workload.build(preset("small"))
    counts = {}
    for how in ("generic", "fused", "fused_norms"):
        b = _prepared(StatefulInPlace, wl, 8, gemv="rows_sh", gdn=how)
        counts[how] = _gdn_launches(b)
        b.close()
    layers = len(wl.config.gdn_layers)
    assert counts["fused"].count("gated_delta") == layers
    assert len(counts["generic"]) - len(counts["fused"]) == 8 * layers, counts
    assert len(counts["fused_norms"]) - len(counts["fused"]) == 4 * layers, counts
    # the one slice left a layer is the convolution window's new state
    assert counts["fused"].count("slice") == layers
    assert counts["fused_norms"].count("slice") == 3 * layers


def test_capacity_overflow_leaves_the_state():
    """The in-place kernel is gated on the capacity check: a dispatch past capacity fails
    and the recurrent state (and the KV rows) are left as they were."""
    from backends.pages import StatefulInPlace
    from backends.webnn import OperationError
    from model.workload import Workload, preset, token_stream

    wl = Workload.build(preset("tiny"))
    cap = 6
    tokens = token_stream(wl.config, cap + 2)
    b, clean = (_prepared(StatefulInPlace, wl, cap, gdn="fused") for _ in range(2))
    try:
        launch = next(la for la in b.converted.graph._plan.launches
                      if getattr(la, "kernel", None) and la.kernel.name == "gated_delta")
        assert launch.slots[-1] == ("status",)
        for t in tokens[:cap - 1]:
            b.step(int(t))
            clean.step(int(t))
        b.position = cap
        with pytest.raises(OperationError):
            b.step(int(tokens[cap]))
        b.position = cap - 1
        assert np.array_equal(b.step(int(tokens[cap - 1])), clean.step(int(tokens[cap - 1])))
    finally:
        b.close()
        clean.close()
