"""Compact capture and replay in WGSL (issue 31 item 2): ``kernels/gdn_capsule.py`` against
ONNX Runtime's own CPU kernel of com.microsoft GatedDeltaNet with ``state_update_capacity``
(the oracle: a one-node model per case, no code shared), on the cases ORT's change tests
(ragged capacity 7 with zero, partial and full capture counts, the inactive case, a float16
Qwen-like case) and fresh random inputs at hybrid-1b's shapes; the replay against a float64
NumPy replay written here and against ORT's non-speculative state after m of K tokens;
every kernel compiled by naga and Tint; the converter's decomposition of both ops
(``convert_gdn``) through the WebNN library against ORT too."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from backends.webnn.kernels import gdn_capsule as GC

ort = pytest.importorskip("onnxruntime")
wgpu = pytest.importorskip("wgpu")

RNG = np.random.default_rng(20260531)


# ---------------------------------------------------------------- the oracle: ORT's CPU EP

def gdn_model(t: int, hk: int, hv: int, dk: int, dv: int, capacity: int, *, f16: bool = False,
              ragged: int = 0, active: bool = False, batch: int = 1, softplus: bool = False,
              l2: bool = True) -> bytes:
    """One GatedDeltaNet node (rank-3 packed layout; ``ragged``: that many requests through
    cu_seqlens; ``active``: the state_update_active input given)."""
    ft = TensorProto.FLOAT16 if f16 else TensorProto.FLOAT
    f = TensorProto.FLOAT
    ins = ["query", "key", "value", "cu_seqlens" if ragged else "", "decay", "beta",
           "initial_state", "a_log" if softplus else "", "dt_bias" if softplus else ""]
    attrs = dict(gate_activation="softplus" if softplus else "none",
                 beta_activation="sigmoid" if softplus else "none", qk_l2_norm=int(l2))
    if capacity:
        ins.append("capture_count")
        attrs["state_update_capacity"] = capacity
        if active:
            ins.append("state_update_active")
    outs = ["output", "final_state"] + (["state_update"] if capacity else [])
    node = helper.make_node("GatedDeltaNet", ins, outs, domain="com.microsoft", **attrs)
    b = ragged or batch
    vi = helper.make_tensor_value_info
    inputs = [vi("query", ft, [t, hk, dk]), vi("key", ft, [t, hk, dk]), vi("value", ft, [t, hv, dv]),
              vi("decay", ft, [t, hv]), vi("beta", ft, [t, hv]), vi("initial_state", f, [b, hv, dv, dk])]
    if ragged:
        inputs.append(vi("cu_seqlens", TensorProto.INT32, [b + 1]))
    if softplus:
        inputs += [vi("a_log", f, [hv]), vi("dt_bias", f, [hv])]
    if capacity:
        inputs.append(vi("capture_count", TensorProto.INT32, [b]))
        if active:
            inputs.append(vi("state_update_active", TensorProto.INT32, [1]))
    outputs = [vi("output", ft, [t, hv, dv]), vi("final_state", f, [b, hv, dv, dk])]
    if capacity:
        outputs.append(vi("state_update", f, [b, GC.capsule_floats(hv, hk, dk, dv, capacity)]))
    graph = helper.make_graph([node], "gdn", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def ort_run(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    return s.run(None, {n: feeds[n] for n in names})


def inputs(t: int, hk: int, hv: int, dk: int, dv: int, batch: int = 1, f16: bool = False) -> dict:
    """Fresh random inputs, none zero: raw q and k (the op normalises), log-space decays in
    [-1, -0.01), beta in (0.1, 0.9), an O(1) state (zeros would hide decay errors)."""
    ft = np.float16 if f16 else np.float32
    return {"query": RNG.standard_normal((t, hk, dk)).astype(ft),
            "key": RNG.standard_normal((t, hk, dk)).astype(ft),
            "value": RNG.standard_normal((t, hv, dv)).astype(ft),
            "decay": (-RNG.uniform(0.01, 1.0, (t, hv))).astype(ft),
            "beta": RNG.uniform(0.1, 0.9, (t, hv)).astype(ft),
            "initial_state": (0.3 * RNG.standard_normal((batch, hv, dv, dk))).astype(np.float32)}


# ---------------------------------------------------------------- the kernels on a device

@pytest.fixture(scope="module")
def device():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        pytest.skip("no WebGPU adapter")
    return adapter.request_device_sync()


def compiled_by_both(kernel) -> None:
    """naga and Tint accept the kernel (each where its compiler exists here)."""
    from wgsl_compilers import compiler_device, rejection

    checked = 0
    for engine in ("wgpu", "dawn"):
        if compiler_device(engine)[0] is None:
            continue
        assert rejection(engine, kernel.wgsl) == "", (engine, rejection(engine, kernel.wgsl))
        checked += 1
    assert checked, "neither naga nor Tint can compile here"


def launch(device, kernel, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Bind ``arrays`` in binding order (rw ones are given with their initial contents),
    dispatch once, return the rw buffers' contents (as the arrays' dtypes)."""
    from backends.webnn.kernels.common import module_source

    compiled_by_both(kernel)
    usage = wgpu.BufferUsage
    bufs = []
    for a in arrays:
        data = np.ascontiguousarray(a)
        size = max(16, -(-data.nbytes // 4) * 4)
        buf = device.create_buffer(size=size, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)
        device.queue.write_buffer(buf, 0, data.tobytes())
        bufs.append(buf)
    pipe = device.create_compute_pipeline(layout="auto", compute={
        "module": device.create_shader_module(code=module_source(kernel.wgsl, False)),
        "entry_point": "main"})
    bg = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs)])
    enc = device.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(*kernel.groups)
    cp.end()
    device.queue.submit([enc.finish()])
    out = []
    for a, buf, access in zip(arrays, bufs, kernel.bindings, strict=True):
        if access == "rw":
            raw = device.queue.read_buffer(buf)
            out.append(np.frombuffer(raw, a.dtype)[:a.size].reshape(a.shape).copy())
    return out


def packed(x: dict) -> tuple[np.ndarray, GC.TokenViews]:
    """q, k and v of each token in one row, in another order and between poisoned
    elements (as slices of a projection's output along its last axis), and where each lies."""
    t, hk, dk = x["query"].shape
    hv, dv = x["value"].shape[1:]
    qn, vn = hk * dk, hv * dv
    width = 3 + qn + vn + qn + 5
    row = np.full((t, width), np.nan, np.float32)
    row[:, 3:3 + qn] = x["query"].reshape(t, -1)
    row[:, 3 + qn:3 + qn + vn] = x["value"].reshape(t, -1)
    row[:, 3 + qn + vn:3 + 2 * qn + vn] = x["key"].reshape(t, -1)
    return row, GC.TokenViews(q=(width, 3), k=(width, 3 + qn + vn), v=(width, 3 + qn))


def wgsl_capture(device, x: dict, capacity: int, count: int, active: int = 1,
                 l2_eps: float = 1e-12, views: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(output, final state, capsule) of one request through the capture kernel, its
    inputs as the converter hands them (float32); ``views``: q, k and v read from one
    packed buffer (``packed``)."""
    f = lambda n: x[n].astype(np.float32)  # noqa: E731
    t, hk, dk = x["query"].shape
    hv, dv = x["value"].shape[1:]
    row, tv = packed(x) if views else (None, None)
    k = GC.capture(t, hk, hv, dk, dv, capacity, scale=1.0 / np.sqrt(dk), l2_eps=l2_eps,
                   views=tv)
    state = x["initial_state"][0]
    qkv = [row] * 3 if views else [f("query"), f("key"), f("value")]
    arrays = [*qkv, f("decay"), f("beta"), state]
    if capacity:
        arrays.append(np.array([count, active], np.int32))
    # the outputs start as NaN: every element must be written
    arrays += [np.full_like(state, np.nan), np.full((t, hv, dv), np.nan, np.float32)]
    if capacity:
        arrays.append(np.full(GC.capsule_floats(hv, hk, dk, dv, capacity), np.nan, np.float32))
    got = launch(device, k, arrays)
    return got[1], got[0], (got[2] if capacity else None)


def captured(capsule: np.ndarray, hk: int, hv: int, dk: int, dv: int, capacity: int, n: int):
    """The first n transitions' decay, key and delta sections of a capsule row."""
    a, b = capacity * hv, capacity * (hv + hk * dk)
    return (capsule[:a].reshape(capacity, hv)[:n], capsule[a:b].reshape(capacity, hk, dk)[:n],
            capsule[b:].reshape(capacity, hv, dv)[:n])


def max_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0


def check_request(got, want, n: int, shape: tuple[int, int, int, int, int], tol: float) -> dict:
    """Output, final state and the captured prefix against ORT's; the entries past the
    prefix are zeros (this kernel's choice where ORT leaves them unspecified)."""
    (gy, gs, gc), (y, s, c) = got, want
    hk, hv, dk, dv, capacity = shape
    errs = {"output": max_err(gy, y), "state": max_err(gs, s)}
    if capacity:
        for name, a, b in zip(("decay", "key", "delta"), captured(gc, *shape, n),
                              captured(c, *shape, n), strict=True):
            errs[name] = max_err(a, b)
        tail = [x for x in (gc[:capacity * hv].reshape(capacity, hv)[n:],) if x.size]
        assert all(np.all(x == 0) for x in tail)
        assert np.all(np.concatenate([s_[n:].ravel() for s_ in captured(gc, *shape, capacity)]) == 0)
    assert all(np.isfinite(v) and v <= tol for v in errs.values()), errs
    return errs


# ORT's ragged compact-capture case at capacity 7: three requests of one packed call with
# zero, partial and full capture counts (and a count past the request's tokens: clamped)
RAGGED = [(4, 0), (6, 3), (8, 7), (5, 9)]


def test_ragged_capacity_7_zero_partial_full(device):
    hk, hv, dk, dv, cap = 2, 4, 16, 8, 7
    lens = [t for t, _ in RAGGED]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = inputs(int(cu[-1]), hk, hv, dk, dv, batch=len(lens))
    x["cu_seqlens"] = cu
    x["capture_count"] = np.array([c for _, c in RAGGED], np.int32)
    y, s, c = ort_run(gdn_model(int(cu[-1]), hk, hv, dk, dv, cap, ragged=len(lens)), x)
    for b, (t, count) in enumerate(RAGGED):
        one = {n: x[n][cu[b]:cu[b + 1]] for n in ("query", "key", "value", "decay", "beta")}
        one["initial_state"] = x["initial_state"][b:b + 1]
        got = wgsl_capture(device, one, cap, count)
        check_request(got, (y[cu[b]:cu[b + 1]], s[b], c[b]), min(count, cap, t),
                      (hk, hv, dk, dv, cap), 2e-5)


@pytest.mark.parametrize("count", [2, 4])
def test_q_k_v_read_where_they_lie(device, count):
    """q, k and v as three slices of one row a token (``TokenViews``), around and between
    NaNs: the same output, state and capsule as ORT's GatedDeltaNet on the three tensors."""
    hk, hv, dk, dv, cap = 2, 6, 16, 8, 4
    x = inputs(4, hk, hv, dk, dv)
    x["capture_count"] = np.array([count], np.int32)
    y, s, c = ort_run(gdn_model(4, hk, hv, dk, dv, cap), x)
    got = wgsl_capture(device, x, cap, count, views=True)
    check_request(got, (y, s[0], c[0]), count, (hk, hv, dk, dv, cap), 2e-5)


@pytest.mark.parametrize("count", [0, 2])
def test_inactive_capture_zero_fills(device, count):
    """state_update_active = 0: the counts ignored, the capsule all zeros, output and state
    as ever (ORT's geometry: 4 tokens, 1 key head, 2 value heads, Dk 64, Dv 32)."""
    hk, hv, dk, dv, cap = 1, 2, 64, 32, 4
    x = inputs(4, hk, hv, dk, dv)
    x["capture_count"] = np.array([count], np.int32)
    x["state_update_active"] = np.array([0], np.int32)
    y, s, c = ort_run(gdn_model(4, hk, hv, dk, dv, cap, active=True), x)
    assert np.all(c == 0)
    got = wgsl_capture(device, x, cap, count, active=0)
    assert np.all(got[2] == 0)
    check_request(got, (y, s[0], c[0]), 0, (hk, hv, dk, dv, cap), 2e-5)


def test_float16_qwen_like(device):
    """float16 q, k, v, decay and beta (ORT widens them to float32, as the converter
    does), 2 key heads for 6 value heads, head sizes 128, 5 tokens, 4 captured of 7."""
    hk, hv, dk, dv, cap, t = 2, 6, 128, 128, 7, 5
    x = inputs(t, hk, hv, dk, dv, f16=True)
    x["capture_count"] = np.array([4], np.int32)
    y, s, c = ort_run(gdn_model(t, hk, hv, dk, dv, cap, f16=True), x)
    gy, gs, gc = wgsl_capture(device, x, cap, 4)
    # the output leaves in float16, as ORT's; the state and capsule stay float32
    errs = check_request((gy.astype(np.float16), gs, gc), (y, s[0], c[0]), 4,
                         (hk, hv, dk, dv, cap), 2e-3)
    assert errs["state"] <= 2e-5 and errs["delta"] <= 2e-5, errs


HYBRID_1B = (16, 32, 128, 128)  # model.workload's hybrid-1b: Hk, Hv, Dk, Dv


@pytest.fixture(scope="module")
def hybrid_draft(device):
    """4 draft tokens at hybrid-1b's shapes, verified with a full capture (capacity 8)."""
    hk, hv, dk, dv = HYBRID_1B
    x = inputs(4, hk, hv, dk, dv)
    got = wgsl_capture(device, x, 8, 4)
    return x, got


@pytest.mark.parametrize("k", [1, 2, 4])
def test_hybrid_1b_k_tokens_one_launch(device, hybrid_draft, k):
    """K = 1, 2, 4 tokens in one launch at hybrid-1b's shapes, the capsule full (K of 8)."""
    hk, hv, dk, dv = HYBRID_1B
    x4, got4 = hybrid_draft
    x = {n: (a[:k] if n != "initial_state" else a) for n, a in x4.items()}
    x["capture_count"] = np.array([k], np.int32)
    want = ort_run(gdn_model(k, hk, hv, dk, dv, 8), x)
    got = got4 if k == 4 else wgsl_capture(device, x, 8, k)
    check_request(got, (want[0], want[1][0], want[2][0]), k, (hk, hv, dk, dv, 8), 5e-5)


def replay64(source, capsule, hv, hk, dk, dv, cap, kept):
    """float64 NumPy replay of a capsule row: per t < kept, S = decay S + outer(key, delta)."""
    dec, key, dl = captured(capsule.astype(np.float64), hk, hv, dk, dv, cap, kept)
    s = source.astype(np.float64).reshape(hv, dv, dk).copy()
    kh = np.arange(hv) * hk // hv
    for t in range(kept):
        s = dec[t][:, None, None] * s + dl[t][:, :, None] * key[t][kh][:, None, :]
    return s


def run_replay(device, source, capsule, hv, hk, dk, dv, cap, kept, src_off=3, dst_off=5):
    """The replay kernel from backings with offsets (the source at ``src_off`` of a longer
    backing, the capsule after 7 floats of another row, the destination at ``dst_off`` of a
    backing poisoned with -931.25): (replayed state, the whole destination backing)."""
    n = hv * dv * dk
    src = np.concatenate([RNG.standard_normal(src_off), source.ravel(),
                          RNG.standard_normal(11)]).astype(np.float32)
    capb = np.concatenate([np.full(7, np.nan), capsule]).astype(np.float32)
    dst = np.full(n + dst_off + 17, -931.25, np.float32)
    row = GC.capsule_floats(hv, hk, dk, dv, cap)
    key0, delta0 = 7 + cap * hv, 7 + cap * (hv + hk * dk)
    assert row == len(capsule)
    meta = np.array([src_off, dst_off, 7, key0, delta0, hv, dv, dk, hk, cap, kept], np.uint32)
    (out,) = launch(device, GC.replay(hv, hk, dk, dv, cap), [src, capb, meta, dst])
    others = np.concatenate([out[:dst_off], out[dst_off + n:]])
    assert np.all(others == -931.25), "the replay wrote outside its destination range"
    return out[dst_off:dst_off + n].reshape(hv, dv, dk)


@pytest.mark.parametrize("cap", [1, 4, 8])
def test_replay_every_prefix_uneven_heads_poisoned_tail(device, cap):
    """ORT's replay case: Hv 5, Dv 7, Dk 11, Hk 3 (key head h * 3 // 5), every kept count,
    the capsule's unused tail NaN (never read)."""
    hv, dv, dk, hk = 5, 7, 11, 3
    source = RNG.standard_normal((hv, dv, dk)).astype(np.float32)
    for kept in range(1, cap + 1):
        capsule = np.full(GC.capsule_floats(hv, hk, dk, dv, cap), np.nan, np.float32)
        dec, key, dl = (x for x in (capsule[:cap * hv].reshape(cap, hv),
                                    capsule[cap * hv:cap * (hv + hk * dk)].reshape(cap, hk, dk),
                                    capsule[cap * (hv + hk * dk):].reshape(cap, hv, dv)))
        dec[:kept] = RNG.uniform(0.6, 0.99, (kept, hv))
        key[:kept] = RNG.standard_normal((kept, hk, dk)) / np.sqrt(dk)
        dl[:kept] = RNG.standard_normal((kept, hv, dv))
        got = run_replay(device, source, capsule, hv, hk, dk, dv, cap, kept)
        want = replay64(source, capsule, hv, hk, dk, dv, cap, kept)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)


def recurrence64(x: dict, m: int) -> np.ndarray:
    """float64: the state after feeding only the first m tokens, non-speculatively
    (DESIGN §5's recurrence, V-major, q/k L2-normalised)."""
    s = x["initial_state"][0].astype(np.float64)
    hv = s.shape[0]
    hk = x["key"].shape[1]
    for t in range(m):
        k = x["key"][t].astype(np.float64)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-12)
        for h in range(hv):
            kh = k[h * hk // hv]
            dec = np.exp(float(x["decay"][t, h]))
            sd = dec * s[h]
            delta = float(x["beta"][t, h]) * (x["value"][t, h].astype(np.float64) - sd @ kh)
            s[h] = sd + np.outer(delta, kh)
    return s


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_replay_equals_m_accepted_tokens(device, hybrid_draft, m):
    """Rollback to m of K = 4 accepted tokens at hybrid-1b's shapes: the replay of the
    verify pass's capsule from the pre-verify state equals the state of feeding only the m
    tokens: float64 NumPy's and ORT's (GatedDeltaNet over m tokens, no capture)."""
    hk, hv, dk, dv = HYBRID_1B
    x, (_, final, capsule) = hybrid_draft
    got = run_replay(device, x["initial_state"][0], capsule, hv, hk, dk, dv, 8, m)
    want = recurrence64(x, m)
    scale = np.max(np.abs(want))
    assert max_err(got, want) <= 2e-5 * scale, max_err(got, want)
    xm = {n: (a[:m] if n != "initial_state" else a) for n, a in x.items()}
    _, s_ort = ort_run(gdn_model(m, hk, hv, dk, dv, 0), xm)
    assert max_err(got, s_ort[0]) <= 2e-5 * scale
    if m == 4:  # all accepted: the replay is the verify pass's own final state
        assert max_err(got, final) <= 2e-5 * scale


# ---------------------------------------------------------------- the converter's WebNN ops

@pytest.fixture(scope="module")
def context():
    from backends.webnn import ml

    ctx = ml.create_context(state_support=True)
    yield ctx
    ctx.destroy()


_CONVERTED: dict[bytes, object] = {}


def converted_run(context, model: bytes, feeds: dict) -> dict[str, np.ndarray]:
    """Convert the ONNX model to a WebNN graph (once per model: the count and the active
    flag are inputs of one graph), dispatch once, read every output."""
    import onnx

    from backends.webnn.onnx_converter import convert

    if model not in _CONVERTED:
        _CONVERTED[model] = convert(onnx.load_from_string(model), context)
    cg = _CONVERTED[model]
    ins, outs = {}, {}
    for name, d in cg.inputs.items():
        ins[name] = context.create_tensor(data_type=d.data_type, shape=list(d.shape), writable=True)
        context.write_tensor(ins[name], feeds[name])
    for name, d in cg.outputs.items():
        outs[name] = context.create_tensor(data_type=d.data_type, shape=list(d.shape), readable=True)
    context.dispatch(cg.graph, ins, outs)
    return {n: np.asarray(context.read_tensor(t)).reshape(cg.outputs[n].shape) for n, t in outs.items()}


@pytest.mark.parametrize("count", [0, 3, 7])
def test_converted_capacity_7_zero_partial_full(context, count):
    """The converted graph (standard WebNN ops) against ORT: 8 tokens, capacity 7."""
    hk, hv, dk, dv, cap, t = 2, 4, 16, 8, 7, 8
    x = inputs(t, hk, hv, dk, dv)
    x["capture_count"] = np.array([count], np.int32)
    model = gdn_model(t, hk, hv, dk, dv, cap)
    y, s, c = ort_run(model, x)
    got = converted_run(context, model, x)
    check_request((got["output"], got["final_state"][0], got["state_update"][0]),
                  (y, s[0], c[0]), count, (hk, hv, dk, dv, cap), 2e-5)


def test_converted_inactive_and_qwen_gates(context):
    """softplus gates and sigmoid beta (a_log, dt_bias), float16 inputs, the capture off."""
    hk, hv, dk, dv, cap, t = 2, 6, 32, 16, 4, 3
    x = inputs(t, hk, hv, dk, dv, f16=True)
    x["decay"] = RNG.standard_normal((t, hv)).astype(np.float16)
    x["beta"] = RNG.standard_normal((t, hv)).astype(np.float16)
    x["a_log"] = RNG.uniform(-1, 0.5, hv).astype(np.float32)
    x["dt_bias"] = RNG.uniform(-1, 1, hv).astype(np.float32)
    x["capture_count"] = np.array([2], np.int32)
    for active in (0, 1):
        x["state_update_active"] = np.array([active], np.int32)
        model = gdn_model(t, hk, hv, dk, dv, cap, f16=True, active=True, softplus=True)
        y, s, c = ort_run(model, x)
        got = converted_run(context, model, x)
        errs = check_request((got["output"], got["final_state"][0], got["state_update"][0]),
                             (y, s[0], c[0]), 2 * active, (hk, hv, dk, dv, cap), 2e-3)
        assert errs["state"] <= 2e-5, errs


def test_converter_refuses_ragged_packing(context):
    import onnx

    from backends.webnn.onnx_converter import ConversionError, convert

    with pytest.raises(ConversionError, match="cu_seqlens"):
        convert(onnx.load_from_string(gdn_model(6, 1, 2, 8, 4, 4, ragged=2)), context)


def replay_model_const(sizes: tuple[int, int, int], md: np.ndarray) -> bytes:
    f = TensorProto.FLOAT
    node = helper.make_node("GatedDeltaNetStateReplay", ["src", "cap", "dst", "md"], ["out"],
                            domain="com.microsoft")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([node], "replay", [vi("src", f, [sizes[0]]), vi("cap", f, [sizes[1]]),
                                                 vi("dst", f, [sizes[2]])],
                              [vi("out", f, [sizes[2]])],
                              [helper.make_tensor("md", TensorProto.INT64, [11], md.tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


@pytest.mark.parametrize("kept", [1, 3])
def test_converted_replay(context, kept):
    """The converted replay against float64 NumPy (uneven heads, offsets in every backing,
    the destination's other elements kept)."""
    hv, dv, dk, hk, cap = 5, 3, 6, 3, 4
    n, row = hv * dv * dk, GC.capsule_floats(hv, hk, dk, dv, cap)
    src = RNG.standard_normal(n + 4).astype(np.float32)
    capb = RNG.uniform(0.5, 1.0, row + 2).astype(np.float32)
    dst = RNG.standard_normal(n + 9).astype(np.float32)
    md = np.array([4, 2, 2, 2 + cap * hv, 2 + cap * (hv + hk * dk), hv, dv, dk, hk, cap, kept])
    got = converted_run(context, replay_model_const((n + 4, row + 2, n + 9), md),
                        {"src": src, "cap": capb, "dst": dst})["out"]
    want = replay64(src[4:4 + n], capb[2:], hv, hk, dk, dv, cap, kept)
    np.testing.assert_allclose(got[2:2 + n].reshape(hv, dv, dk), want, rtol=2e-5, atol=1e-5)
    assert np.array_equal(got[:2], dst[:2]) and np.array_equal(got[2 + n:], dst[2 + n:])
