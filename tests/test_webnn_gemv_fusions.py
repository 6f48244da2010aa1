"""The float-weight products' fusions on the GPU's plan (``gemv_norms``, ``gemv_epilogue``;
forced here on any adapter): RMSNorm computed by its readers from the partial sums the
residual product before it writes, SwiGLU written by the stacked gate/up launch. A layer in
small against float64 NumPy on fresh random inputs, and the same within rounding as the
plan with the norms and the activation launched."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder

#: float32 rows, float32 sums in another order than NumPy's: relative to the largest output
_TOL = 2e-5


def _norm(b, x, g):
    """RMSNorm of one row as the preset spells it: x / sqrt(mean(x·x) + eps) · g."""
    eps = b.constant(data_type="float32", shape=[], value=np.array(1e-5, np.float32))
    ms = b.reduce_mean(b.mul(x, x), axes=[1], keep_dimensions=True)
    return b.mul(b.div(x, b.sqrt(b.add(ms, eps))), g)


def _norm64(x, g):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g


def _layer(ctx, seed: int, K0: int, H: int, F: int, Nq: int, Nk: int, f16: bool,
           gate_out: bool = False) -> tuple[dict, dict, object]:
    """x = r + RMSNorm(v)·Wo (the first norm: of an input), h = SwiGLU(RMSNorm(x)·[Wg Wu]),
    x2 = x + h·Wd, q, k = RMSNorm(x2)·[Wq Wk]: a decoder layer's products, o and down
    with the residual, gate/up and q/k stacked, on weights of float16 values (``f16``) or
    float32 ones; ``gate_out``: the gate product a graph output too. Returns (outputs,
    their float64 oracle, the plan)."""
    rng = np.random.default_rng(seed)

    def weights(k: int, n: int) -> np.ndarray:
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        return w.astype(np.float16).astype(np.float32) if f16 else w

    Wo, Wg, Wu, Wd, Wq, Wk = (weights(*s) for s in ((K0, H), (H, F), (H, F), (F, H), (H, Nq),
                                                   (H, Nk)))
    g0, g1, g2 = (rng.uniform(0.5, 1.5, n).astype(np.float32) for n in (K0, H, H))
    v = rng.standard_normal((1, K0)).astype(np.float32)
    r = rng.standard_normal((1, H)).astype(np.float32)
    b = MLGraphBuilder(ctx)

    def c(a: np.ndarray):
        return b.constant(data_type="float32", shape=list(a.shape), value=a)

    vi = b.input("v", data_type="float32", shape=[1, K0])
    ri = b.input("r", data_type="float32", shape=[1, H])
    x = b.add(ri, b.matmul(_norm(b, vi, c(g0)), c(Wo)))
    n1 = _norm(b, x, c(g1))
    gate, up = b.matmul(n1, c(Wg)), b.matmul(n1, c(Wu))
    x2 = b.add(x, b.matmul(b.mul(b.mul(gate, b.sigmoid(gate)), up), c(Wd)))
    n2 = _norm(b, x2, c(g2))
    outs = {"q": b.matmul(n2, c(Wq)), "k": b.matmul(n2, c(Wk))}
    if gate_out:
        outs["g"] = gate
    graph = b.build(outs)
    feeds = {}
    for name, a in (("v", v), ("r", r)):
        feeds[name] = ctx.create_tensor(data_type="float32", shape=list(a.shape), writable=True)
        ctx.write_tensor(feeds[name], a)
    t_out = {n: ctx.create_tensor(data_type="float32", shape=o.shape, readable=True)
             for n, o in outs.items()}
    ctx.dispatch(graph, feeds, t_out)
    got = {n: np.asarray(ctx.read_tensor(t), np.float64).reshape(-1) for n, t in t_out.items()}
    d = lambda a: a.astype(np.float64)  # noqa: E731
    x64 = d(r) + _norm64(d(v), d(g0)) @ d(Wo)
    n164 = _norm64(x64, d(g1))
    gw, uw = n164 @ d(Wg), n164 @ d(Wu)
    n264 = _norm64(x64 + (gw / (1 + np.exp(-gw)) * uw) @ d(Wd), d(g2))
    want = {"q": n264 @ d(Wq), "k": n264 @ d(Wk), "g": gw}
    plan = graph._plan
    graph.destroy()
    return got, {n: want[n].reshape(-1) for n in got}, plan


def _forced(ctx_with, monkeypatch, subgroup_size, sub: bool, **knobs):
    """A context with the rows kernels and ``knobs``; ``sub``: its target a GPU's with the
    adapter's subgroup width (the sums by subgroupAdd), skipped where it has none fixed."""
    ctx = ctx_with(gemv="rows", **knobs)
    if sub:
        if not subgroup_size or subgroup_size & (subgroup_size - 1) or subgroup_size > 32:
            pytest.skip(f"no fixed power-of-two subgroup width to 32 ({subgroup_size})")
        monkeypatch.setattr(ctx, "_target", dataclasses.replace(
            ctx._target, cpu=False, subgroup=subgroup_size))
    return ctx


def _close(got: dict, want: dict) -> None:
    for n in want:
        err = np.abs(got[n] - want[n]).max() / np.abs(want[n]).max()
        assert err <= _TOL, (n, err)


@pytest.mark.parametrize("K0,H,F,Nq,Nk,f16,sub", [
    (48, 64, 96, 64, 32, True, False),  # float16 weights
    (48, 64, 96, 64, 32, True, True),
    (40, 75, 34, 37, 13, False, False),  # odd N and K: float32 weights, scalar loads
    (36, 76, 46, 37, 13, False, True),  # float32 weights that are not float16 values
    (64, 128, 258, 99, 21, True, False),  # a ragged last workgroup of gate/up pairs
])
def test_norms_from_partials_and_a_gated_pair(ctx_with, monkeypatch, subgroup_size,
                                              K0, H, F, Nq, Nk, f16, sub):
    """With ``gemv_norms=partials`` and ``gemv_epilogue=gated`` the layer is one norm launch
    (the first: of an input, which no product writes) and four products: o and down each
    write their workgroups' partial sums of squares of the residual stream, gate/up and
    q/k (stacked) sum them where they read the norm, gate/up writes SwiGLU of its pair
    (its weight rows paired); against float64 NumPy on fresh random inputs, and within
    rounding of the plan with the norms and SwiGLU launched (both knobs off)."""
    seed = int(np.random.default_rng().integers(1 << 31))
    on = _forced(ctx_with, monkeypatch, subgroup_size, sub, gemv_norms="partials",
                 gemv_epilogue="gated")
    got, want, plan = _layer(on, seed, K0, H, F, Nq, Nk, f16)
    _close(got, want)
    launches = [la.kernel for la in plan.launches]
    assert [k.name for k in launches] == ["fused_vector"] + ["matmul_gemv"] * 4, launches
    o, gate_up, down, qk = (k.wgsl for k in launches[1:])
    assert ["pt[" in w for w in (o, gate_up, down, qk)] == [True, False, True, False]
    assert ["pt_in[" in w for w in (o, gate_up, down, qk)] == [False, True, False, True]
    assert "pair_sh" in gate_up and len(plan.gated) == 1 and len(plan.norm_stats) == 2
    assert ("subgroupAdd" in qk) == sub
    halves = ["unpack2x16float" in w for w in (o, gate_up, down, qk)]
    assert halves == [f16 and k % 4 == 0 for k in (K0, H, F, H)], halves
    off = _forced(ctx_with, monkeypatch, subgroup_size, sub, gemv_norms="off",
                  gemv_epilogue="off")
    got_off, _, plan_off = _layer(off, seed, K0, H, F, Nq, Nk, f16)
    names = [la.kernel.name for la in plan_off.launches]
    assert names.count("fused_vector") == 3 and "fused:sigmoid+mul+mul" in names, names
    assert not plan_off.gated and not plan_off.norm_stats
    _close(got, got_off)


@pytest.mark.parametrize("F,gate_out", [(47, False), (48, True)])
def test_a_pair_that_cannot_gate_writes_both_products(ctx_with, monkeypatch, subgroup_size,
                                                      F, gate_out):
    """No gated write where the pair's rows cannot pair up (an odd length) or the gate is
    read outside the activation (a graph output): both products written, SwiGLU
    launched, the norms still from partial sums; the outputs float64 NumPy's."""
    seed = int(np.random.default_rng().integers(1 << 31))
    ctx = _forced(ctx_with, monkeypatch, subgroup_size, False, gemv_norms="partials",
                  gemv_epilogue="gated")
    got, want, plan = _layer(ctx, seed, 48, 64, F, 37, 13, True, gate_out=gate_out)
    _close(got, want)
    names = [la.kernel.name for la in plan.launches]
    assert not plan.gated and "fused:sigmoid+mul+mul" in names, names
    assert names.count("fused_vector") == 1 and len(plan.norm_stats) == 2, names


def test_a_reader_in_chunks_sums_the_partials_in_each(ctx_with, monkeypatch, subgroup_size):
    """Where q's weights exceed the binding limit (lowered here) its launches each take a
    chunk of its rows and each computes the norm from the partial sums down wrote (as
    llama-1b's LM head does): the outputs float64 NumPy's."""
    ctx = _forced(ctx_with, monkeypatch, subgroup_size, False, gemv_norms="partials",
                  gemv_epilogue="gated")
    # q (K = 64) 96 rows a launch; gate/up and q/k no longer stacked; o and down one launch
    monkeypatch.setattr(ctx, "_max_binding", 4 * 64 * 96)
    seed = int(np.random.default_rng().integers(1 << 31))
    got, want, plan = _layer(ctx, seed, 48, 64, 96, 150, 13, True)
    _close(got, want)
    kernels = [la.kernel for la in plan.launches]
    assert [k.name for k in kernels].count("fused_vector") == 1, kernels
    assert sum("pt_in[" in k.wgsl for k in kernels) == 5  # gate, up, q twice, k
    assert len(plan.norm_stats) == 2 and not plan.gated


def test_a_cpu_adapter_keeps_its_plan(ctx_with):
    """Left to the adapter (None), a CPU adapter's rows kernels launch their norms and
    SwiGLU as before (the fusions are GPU defaults, PERFORMANCE.md "Knobs")."""
    ctx = ctx_with(gemv="rows")
    if not ctx._target.cpu:
        pytest.skip("a GPU adapter: the fusions are its default")
    got, want, plan = _layer(ctx, 7, 48, 64, 96, 37, 13, True)
    _close(got, want)
    assert not plan.gated and not plan.norm_stats
