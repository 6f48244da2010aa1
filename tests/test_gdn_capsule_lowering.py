"""The wgpu compiler maps what ``convert_gdn`` builds for ORT's GatedDeltaNet (compact
capture) and GatedDeltaNetStateReplay onto the one-launch kernels of
``kernels/gdn_capsule.py`` (``wgpu_impl/match_gdn_capsule``): the converted graphs give
ORT CPU's results (the replay: float64 NumPy's, ORT having no CPU kernel of it) in one
launch per op, where the generic ops (``gdn=generic``) take dozens; a graph in which an op
inside the pattern is also read outside keeps its generic launches and stays correct."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from test_webnn_gdn_capsule import (
    check_request,
    gdn_model,
    inputs,
    ort_run,
    replay64,
    replay_model_const,
)

from backends.webnn.kernels import gdn_capsule as GC

pytest.importorskip("onnxruntime")
pytest.importorskip("wgpu")

RNG = np.random.default_rng(20261202)


def run(ctx, model: bytes, feeds: dict) -> tuple[dict[str, np.ndarray], list[str]]:
    """Convert, dispatch once, read every output; with the kernel names launched
    ("copy" for a buffer copy)."""
    from backends.webnn.onnx_converter import convert

    cg = convert(onnx.load_from_string(model), ctx)
    ins, outs = {}, {}
    for name, (dt, shape) in cg.graph.inputs.items():
        ins[name] = ctx.create_tensor(data_type=dt, shape=list(shape), writable=True)
        ctx.write_tensor(ins[name], feeds[name])
    for name, (dt, shape) in cg.graph.outputs.items():
        outs[name] = ctx.create_tensor(data_type=dt, shape=list(shape), readable=True)
    ctx.dispatch(cg.graph, ins, outs)
    got = {n: np.asarray(ctx.read_tensor(t)).reshape(cg.graph.outputs[n][1]) for n, t in outs.items()}
    names = [la.kernel.name if hasattr(la, "kernel") else "copy" for la in cg.graph._plan.launches]
    return got, names


@pytest.fixture(scope="module")
def generic(ctx_with):
    return ctx_with(gdn="generic")


@pytest.mark.parametrize("count", [0, 3, 7])
def test_capture_capacity_7_one_launch(ctx, generic, count):
    """8 tokens, capacity 7, zero, partial and full counts: ORT's output, state and capsule
    from the one capture launch; the generic ops give the same in many launches."""
    hk, hv, dk, dv, cap, t = 2, 4, 16, 8, 7, 8
    x = inputs(t, hk, hv, dk, dv)
    x["capture_count"] = np.array([count], np.int32)
    model = gdn_model(t, hk, hv, dk, dv, cap)
    y, s, c = ort_run(model, x)
    got, names = run(ctx, model, x)
    assert names == ["gdn_capture"], names
    check_request((got["output"], got["final_state"][0], got["state_update"][0]),
                  (y, s[0], c[0]), count, (hk, hv, dk, dv, cap), 2e-5)
    if count == 3:
        got_g, names_g = run(generic, model, x)
        assert "gdn_capture" not in names_g and len(names_g) > 4 * t, names_g
        check_request((got_g["output"], got_g["final_state"][0], got_g["state_update"][0]),
                      (y, s[0], c[0]), count, (hk, hv, dk, dv, cap), 2e-5)


@pytest.mark.parametrize("t,cap,active", [(1, 0, None), (2, 4, 0), (3, 2, 1)])
def test_capture_no_capsule_inactive_short(ctx, t, cap, active):
    """No capsule (plain GatedDeltaNet), the inactive flag (all zeros), fewer tokens than
    the capacity (zero rows after them) and more (the count clamped): one launch each."""
    hk, hv, dk, dv = 1, 2, 64, 32
    x = inputs(t, hk, hv, dk, dv)
    if cap:
        x["capture_count"] = np.array([5], np.int32)
    if active is not None:
        x["state_update_active"] = np.array([active], np.int32)
    model = gdn_model(t, hk, hv, dk, dv, cap, active=active is not None)
    want = ort_run(model, x)
    got, names = run(ctx, model, x)
    assert names == ["gdn_capture"], names
    n = min(5, cap, t) * (active != 0)
    check_request((got["output"], got["final_state"][0], got["state_update"][0] if cap else None),
                  (want[0], want[1][0], want[2][0] if cap else None), n, (hk, hv, dk, dv, cap), 2e-5)


def test_capture_float16_qwen_gates(ctx):
    """float16 q, k, v with softplus gates and sigmoid beta (Hq 2, Hv 6, 128): the capture
    is one launch; the widening casts, the gates' two fused launches and the output's
    narrowing cast stay their own."""
    hk, hv, dk, dv, cap, t = 2, 6, 128, 128, 7, 5
    x = inputs(t, hk, hv, dk, dv, f16=True)
    x["decay"] = RNG.standard_normal((t, hv)).astype(np.float16)
    x["beta"] = RNG.standard_normal((t, hv)).astype(np.float16)
    x["a_log"] = RNG.uniform(-1, 0.5, hv).astype(np.float32)
    x["dt_bias"] = RNG.uniform(-1, 1, hv).astype(np.float32)
    x["capture_count"] = np.array([4], np.int32)
    x["state_update_active"] = np.array([1], np.int32)
    model = gdn_model(t, hk, hv, dk, dv, cap, f16=True, active=True, softplus=True)
    y, s, c = ort_run(model, x)
    got, names = run(ctx, model, x)
    assert names.count("gdn_capture") == 1 and len(names) == 7, names
    errs = check_request((got["output"], got["final_state"][0], got["state_update"][0]),
                         (y, s[0], c[0]), 4, (hk, hv, dk, dv, cap), 2e-3)
    assert errs["state"] <= 2e-5, errs


def test_pattern_read_outside_is_not_matched(ctx, monkeypatch):
    """An op inside the pattern that must also be kept (pinned: an output, a state writer)
    or is read by an op outside it: nothing matched, so the generic ops stay."""
    from backends.webnn.ir import Node
    from backends.webnn.wgpu_impl import context as C
    from backends.webnn.wgpu_impl.match_gdn_capsule import match_capsules
    from backends.webnn.wgpu_impl.passes import reachable

    seen = []
    real = C.compile_graph
    monkeypatch.setattr(C, "compile_graph", lambda g, *a, **k: seen.append(g) or real(g, *a, **k))
    x = inputs(2, 1, 2, 8, 4)
    x["capture_count"] = np.array([2], np.int32)
    run(ctx, gdn_model(2, 1, 2, 8, 4, 2), x)
    nodes = reachable(list(seen[0].outputs.values()))
    (m,) = match_capsules(nodes, set(), 48).values()
    inner = [o for o in m.ops if o.op in ("sub", "matmul", "where")]
    assert {o.op for o in inner} == {"sub", "matmul", "where"}
    for o in inner:
        assert match_capsules(nodes, {o.id}, 48) == {}, o
    # a pinned norm is not folded: the kernel reads the normalised q and k instead
    div = next(o for o in m.ops if o.op == "div")
    (unfolded,) = match_capsules(nodes, {div.id}, 48).values()
    assert unfolded.l2_eps is None and div in unfolded.leaves
    extra = Node(10**9, "op", inner[0].dtype, inner[0].shape, "neg", (inner[0],))
    assert match_capsules(nodes + [extra], set(), 48) == {}
    need = len(m.leaves) + len(m.written) + 3  # + output, active flag, status
    assert len(match_capsules(nodes, set(), need)) == 1
    assert match_capsules(nodes, set(), need - 1) == {}  # past the binding limit


@pytest.mark.parametrize("kept,offsets", [(1, (4, 2, 9)), (3, (4, 2, 9)), (4, (3, 0, 5)),
                                          (2, (0, 7, 0))])
def test_replay_one_launch(ctx, generic, kept, offsets):
    """The converted replay (uneven heads: key head h * 3 // 5) with offsets in every
    backing: one replay launch after a copy of the destination it keeps; against float64
    NumPy, the destination's other elements kept."""
    src_off, dst_off, dst_extra = offsets
    hv, dv, dk, hk, cap = 5, 3, 6, 3, 4
    n, row = hv * dv * dk, GC.capsule_floats(hv, hk, dk, dv, cap)
    src = RNG.standard_normal(n + src_off).astype(np.float32)
    capb = RNG.uniform(0.5, 1.0, row + 2).astype(np.float32)
    dst = RNG.standard_normal(n + dst_off + dst_extra).astype(np.float32)
    md = np.array([src_off, dst_off, 2, 2 + cap * hv, 2 + cap * (hv + hk * dk), hv, dv, dk, hk, cap,
                   kept])
    model = replay_model_const((len(src), len(capb), len(dst)), md)
    feeds = {"src": src, "cap": capb, "dst": dst}
    got, names = run(ctx, model, feeds)
    assert names == ["copy", "gdn_replay"], names
    want = replay64(src[src_off:src_off + n], capb[2:], hv, hk, dk, dv, cap, kept)
    np.testing.assert_allclose(got["out"][dst_off:dst_off + n].reshape(hv, dv, dk), want,
                               rtol=2e-5, atol=1e-5)
    keep = np.r_[0:dst_off, dst_off + n:len(dst)]
    assert np.array_equal(got["out"][keep], dst[keep])
    if kept == 3:
        _, names_g = run(generic, model, feeds)
        assert "gdn_replay" not in names_g and len(names_g) > 2 * kept, names_g
