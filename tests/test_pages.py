"""The four wgpu page modes on the tiny preset: same function as the oracle, bytes as counted.

Byte checks compare the context's counters with closed forms written here from the modes'
definitions (DESIGN §7: counted where they move, checked against the formula).
"""

from __future__ import annotations

import numpy as np
import pytest
from at_depth import at_depth

from backends.base import DepthState
from backends.pages import (
    DAWN_PAGES,
    StatefulFallback,
    StatefulInPlace,
    StatelessCopy,
    TensorReuse,
)
from backends.webnn.wgpu_impl.options import KernelOptions
from harness.metrics import logits_tolerance
from model.reference import Reference
from model.workload import Workload, cache_specs, preset, token_stream

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

MODES = {cls.name: cls for cls in (StatelessCopy, TensorReuse, StatefulInPlace, StatefulFallback)}
TINY = Workload.build(preset("tiny"))
STEPS = 4
DEPTHS = (16, 64)
CAPACITY = max(DEPTHS) + STEPS
TOKENS = token_stream(TINY.config, CAPACITY + 8)
ELEMENT = 4  # device bytes per element (int64 ids are stored as i32 on the wgpu backend)


def depth_state(depth: int, capacity: int) -> tuple[DepthState, Reference]:
    ref = Reference(TINY.config, TINY.weights, capacity)
    if depth:
        ref.prefill(TOKENS[:depth])
    return DepthState(tokens=TOKENS[:depth].copy(), cache=ref.cache_arrays()), ref


def prepared(cls, capacity: int, **knobs):
    """A page of ``cls`` prepared on tiny, its context created with ``knobs`` (KernelOptions)."""
    b = cls(options=KernelOptions(**knobs))
    b.prepare(TINY, capacity)
    return b


@pytest.fixture(scope="module", params=list(MODES))
def backend(request):
    b = prepared(MODES[request.param], CAPACITY)
    yield b
    b.close()


def assert_close(got: np.ndarray, want: np.ndarray, where: str) -> None:
    got = np.asarray(got, np.float64)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel < 1e-4, f"{where}: max|d|/max|ref| = {rel:.2e}"
    assert got.argmax() == want.argmax(), where


@pytest.mark.parametrize("depth", DEPTHS)
def test_matches_reference_after_depth(backend, depth):
    state, ref = depth_state(depth, CAPACITY)
    backend.reach_depth(state)
    for i in range(STEPS):
        tok = int(TOKENS[depth + i])
        assert_close(backend.step(tok), ref.step(tok), f"{backend.name} depth {depth} step {i}")


def assert_steps_match(b, where: str, depth: int = 16, steps: int = 2) -> None:
    """Reach ``depth`` and compare ``steps`` steps' logits with the reference."""
    state, ref = depth_state(depth, CAPACITY)
    b.reach_depth(state)
    for i in range(steps):
        tok = int(TOKENS[depth + i])
        assert_close(b.step(tok), ref.step(tok), f"{where} step {i}")


@pytest.mark.parametrize("name", list(MODES))
def test_gpu_dispatch_path_matches_reference(name, monkeypatch):
    """GPU adapters submit a dispatch as several command buffers (SUBMIT_EVERY launches
    each) and record each dispatch's successor ahead; forced here (3 launches a buffer),
    every mode still computes the reference's logits over steps that submit what was
    recorded (from the second step for fixed tensors, the fourth for ping-pong; one
    command buffer, not cut), and the GPU time still spans the whole dispatch."""
    from backends.webnn.wgpu_impl import context

    monkeypatch.setitem(context.SUBMIT_EVERY, "cpu", 3)
    monkeypatch.setitem(context.SUBMIT_EVERY, "gpu", 3)
    b = prepared(MODES[name], CAPACITY, record_ahead="on")
    try:
        assert len(b.converted.graph._submit_after) > 3 and b.context.record_ahead
        assert_steps_match(b, f"{name} chunked", steps=5)
        # what is recorded ahead is submitted at once: one command buffer, passes uncut
        recorded = b.converted.graph._recorded
        assert (recorded is None and name != "wgpu:stateful") or len(recorded[1]) == 1
    finally:
        b.close()


@pytest.mark.parametrize("name", ["wgpu:stateful", "wgpu:stateless"])
def test_gpu_gemv_variant_with_stacked_projections(name):
    """The GPU matrix-vector kernel (forced here on any adapter) runs q/k/v and gate/up
    projections as stacked launches, adds the residual stream in the o and down
    projections and computes RMSNorm's tail and SwiGLU as the projections' prologue; the
    model still computes the reference's logits."""
    b = prepared(MODES[name], CAPACITY, gemv="rows_sh", gemv_prologue="full")
    try:
        plan = b.converted.graph._plan
        sizes = sorted(len(g) for g in plan.stacked.values())
        assert sizes and sizes[-1] >= 3, sizes  # at least one q/k/v group
        assert len(plan.epilogue) >= 2 * len(TINY.config.layers)  # after mixer and MLP
        assert {p.group.ops[-1].op for p in plan.prologue.values()} >= {"mul"}  # norm, SwiGLU
        # RMSNorm's mean of squares computed by the projections' workgroups too
        assert any(p.reduce_op is not None for p in plan.prologue.values())
        names = [la.kernel.name for la in plan.launches if hasattr(la, "kernel")]
        assert "reduce_mean" not in names
        assert_steps_match(b, f"{name} stacked")
    finally:
        b.close()


def decode_steps(b, depth: int, steps: int, calls: dict[str, int]) -> tuple[list, tuple]:
    """Reach ``depth``, then ``steps`` steps as the sweep's worker runs them (step, then the
    GPU time); the logits, checked against the reference, and the submits and maps per
    step, from the context's counts and from wgpu-py's calls (which must agree)."""
    state, ref = depth_state(depth, CAPACITY)
    b.reach_depth(state)
    b.step(int(TOKENS[depth]))  # the recording ahead starts here on a GPU adapter
    ref.step(int(TOKENS[depth]))
    q = b.context.queue_counts
    before = (q.submits, q.maps)
    calls.update(submits=0, maps=0)
    out = []
    for i in range(1, steps + 1):
        tok = int(TOKENS[depth + i])
        logits = b.step(tok)
        b.gpu_time_ms()
        assert_close(logits, ref.step(tok), f"{b.name} step {i}")
        out.append(logits.copy())  # the page reads into one array every step
    per_step = ((q.submits - before[0]) / steps, (q.maps - before[1]) / steps)
    assert per_step == (calls["submits"] / steps, calls["maps"] / steps)
    return out, per_step


@pytest.mark.parametrize("gpu_path", [False, True])
def test_read_copy_one_submit_one_map_per_stateful_step(gpu_path, monkeypatch, queue_calls):
    """The stateful page's step on tiny (dispatch, read the logits, the GPU time) submits
    once and maps once with the read copy (KernelOptions.read_copy None); a read that copies
    for itself costs a submit and the GPU time a map of their own ("separate"), and
    wgpu-py's default map a submit before each of those maps ("separate_sync", the path
    before the read copy). The logits are the same bits every way and the reference's;
    ``gpu_path``: command buffers of 3 launches, recorded ahead."""
    from backends.webnn.wgpu_impl import context

    if gpu_path:
        monkeypatch.setitem(context.SUBMIT_EVERY, "cpu", 3)
    calls = queue_calls()
    got, counts = {}, {}
    for how in (None, "separate", "separate_sync"):
        # the oracle counts wgpu-py's submits: the queue called through them
        b = prepared(StatefulInPlace, CAPACITY, read_copy=how,
                     record_ahead="on" if gpu_path else None, queue_calls="wgpu-py")
        try:
            assert b.context.record_ahead == gpu_path
            got[how], counts[how] = decode_steps(b, 16, 4, calls)
        finally:
            b.close()
    assert counts == {None: (1, 1), "separate": (2, 2), "separate_sync": (4, 2)}
    for how in ("separate", "separate_sync"):
        for i, (a, s) in enumerate(zip(got[None], got[how], strict=True)):
            np.testing.assert_array_equal(a, s, err_msg=f"{how} step {i}")


@pytest.mark.parametrize("name", ["wgpu:reuse", "wgpu:stateless", "wgpu:fallback"])
def test_read_copy_in_the_other_pages(name, monkeypatch, queue_calls):
    """The other pages read after each dispatch too: the reuse and fallback pages their
    logits (their ping-ponged caches are not readable, so one staging serves both sets),
    the stateless page the logits and every present cache at once. On tiny (caches below
    STAGED_WRITE_MIN, written without a staged submit) each step submits once and maps
    once, and the logits are the reference's."""
    b = prepared(MODES[name], CAPACITY, queue_calls="wgpu-py")  # as the oracle counts
    try:
        _, per_step = decode_steps(b, 16, 4, queue_calls())
        assert per_step == (1, 1)
        assert len(b.converted.graph._read_copies) == 1
    finally:
        b.close()


@pytest.mark.parametrize("name", ["wgpu:stateful", "wgpu:stateless"])
def test_logits_read_without_fresh_memory_a_step(name):
    """The page reads its logits into one array of its own (``readTensor(tensor,
    outputData)``), so a step faults in no fresh host memory for them, under the sweep's
    worker's pattern (each step's logits copied and kept, the last one still held while the
    next step runs). A fresh array a step (hybrid-1b's vocabulary: 148 pages) was fresh
    heap every step, page faults on the step's path (docs/measuring.md "Host time").
    Minor faults of the stepping thread, counted by the kernel; the logits still the
    reference's."""
    import dataclasses
    import resource

    cfg = dataclasses.replace(TINY.config, vocab=preset("hybrid-1b").vocab)
    wl = Workload.build(cfg)
    b = MODES[name]()
    b.prepare(wl, 32)
    try:
        ref = Reference(cfg, wl.weights, 32)
        want = [ref.step(int(t)) for t in TOKENS[:12]]
        kept, faults, out = [], [], None
        for i in range(12):
            f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            out = b.step(int(TOKENS[i]))
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0)
            kept.append(np.array(out, np.float32, copy=True))
        for i, (got, w) in enumerate(zip(kept, want, strict=True)):
            assert_close(got, w, f"{name} step {i}")
        pages = cfg.vocab * 4 // 4096
        assert np.median(faults[4:]) < pages // 8, (faults, pages)
    finally:
        b.close()


@pytest.mark.parametrize("how, kernel", [(None, "copy_vec4"), ("identity", "identity"),
                                         ("buffer", None)])
def test_cache_copy_variants_match_reference(how, kernel):
    """The reuse graph's copy of the unchanged cache as a vec4 kernel (the default), the
    element-wise identity or copy_buffer_to_buffer (KernelOptions.cache_copy, FINDINGS 18):
    every attention cache goes through it, and the logits are the reference's."""
    from backends.webnn.wgpu_impl.plan import CopyLaunch

    b = prepared(MODES["wgpu:reuse"], CAPACITY, cache_copy=how)
    try:
        launches = b.converted.graph._plan.launches
        names = [getattr(la, "kernel", None) and la.kernel.name for la in launches]
        copies = names.count(kernel) if kernel else sum(
            isinstance(la, CopyLaunch) for la in launches)
        assert copies == 2 * len(TINY.config.attention_layers)
        assert not ({"identity", "copy_vec4"} - {kernel}) & set(names)
        assert_steps_match(b, f"reuse, cache copy {how}", steps=3)
    finally:
        b.close()


def test_gpu_gemv_norms_in_one_launch_each():
    """By default (GPU kernels forced here) each norm is one launch computing its row
    reductions and its tail (``fused_vector``), not two: every RMSNorm, and the per-head L2
    norms of q and k in a gated delta net layer; the model still computes the reference's
    logits."""
    # gdn: the GDN layer's own ops (a GPU adapter's default folds q's and k's norms into the
    # fused gated-delta kernel, tests/test_webnn_gdn.py)
    b = prepared(StatefulInPlace, CAPACITY, gemv="rows_sh", gdn="generic")
    try:
        # the point records every knob its context ran with, None where the adapter chose
        knobs = ("gemv", "attention", "attention_rows", "gemv_prologue", "row_vector", "row_writes",
                 "attention_splits",
                 "record_ahead", "cache_copy", "gemv_weights", "gdn", "f16_loads", "read_copy",
                 "q4_gemv", "pass_calls", "map_wait", "queue_calls", "q4_prologue", "q4_epilogue",
                 "q4_norms", "attention_writes", "q4_rows", "attention_q_rows", "gdn_replay",
                 "gemv_epilogue", "gemv_norms", "tile_pv", "attention_sync",
                 "attention_combine", "attention_loads")
        assert b.details["kernel_options"] == {**dict.fromkeys(knobs), "gemv": "rows_sh",
                                               "gdn": "generic"}
        plan = b.converted.graph._plan
        assert not plan.prologue
        names = [la.kernel.name for la in plan.launches if hasattr(la, "kernel")]
        # RMSNorm before the mixer and the MLP of every layer and before the LM head; q and
        # k of every GDN layer
        want = 2 * len(TINY.config.layers) + 1 + 2 * len(TINY.config.gdn_layers)
        assert names.count("fused_vector") == want, names
        # no norm leaves a reduction behind; a GDN layer's conv sums over its taps
        # (model/export.py ``_causal_conv``) inside its activation's launch (a short
        # reduction read per row: fusion._inlinable_reductions)
        assert "reduce_mean" not in names and "reduce_sum" not in names, names
        conv = [n for n in names if "reduce_sum" in n]
        assert len(conv) == len(TINY.config.gdn_layers) and all(
            n.endswith("reduce_sum+sigmoid+mul") for n in conv), names
        assert_steps_match(b, "stateful, norms in one launch")
    finally:
        b.close()


DAWN_OK, DAWN_WHY = DAWN_PAGES["dawn:stateless"].available()


@pytest.mark.skipif(not DAWN_OK, reason=f"no Dawn adapter: {DAWN_WHY}")
@pytest.mark.parametrize("name", list(DAWN_PAGES))
def test_dawn_pages_match_reference_and_record_the_engine(name):
    """The same four pages on Dawn (docs/dawn.md) compute the reference's logits after a
    written (or dispatched) depth, keep the same byte counts as on wgpu-native, and record
    their engine per point."""
    counts = {}
    for cls in (DAWN_PAGES[name], MODES[name.replace("dawn:", "wgpu:")]):
        b = prepared(cls, CAPACITY)
        try:
            assert_steps_match(b, cls.name)
            counts[cls.engine] = b.counters.snapshot()
            eng = b.details["engine"]
            assert eng["engine"] == cls.engine and eng["version"] and eng["backend_api"]
            assert isinstance(eng["features_lacking"], list)
        finally:
            b.close()
    assert counts["dawn"] == counts["wgpu"]


def test_stateful_details(backend):
    if backend.name == "wgpu:stateful":
        assert backend.details["is_stateful"] is True
        assert set(backend.details["in_place"]) == {s.input for s in cache_specs(TINY.config, CAPACITY)}
    elif backend.name == "wgpu:fallback":
        assert backend.details["is_stateful"] is False
        assert backend.hidden_state is False
    else:
        assert backend.details["is_stateful"] is False


def test_device_bytes_hold_weights_and_caches(backend):
    # float32 weights (the tied head is stored twice: embedding and transposed LM head)
    assert backend.device_bytes() >= TINY.weights_bytes


def test_gpu_time_or_reason(backend):
    backend.reset()
    backend.step(int(TOKENS[0]))
    ms = backend.gpu_time_ms()
    if ms is None:
        assert backend.details["gpu_time_reason"]
    else:
        assert ms > 0


# --- bytes per step -----------------------------------------------------------------------------

# one split of the attention kernel each (kernels/attention.py): its partial sums stay
# constant, so every count is linear in capacity
CAPACITIES = (32, 64, 128)


def _cache_bytes(capacity: int) -> int:
    return sum(s.nbytes for s in cache_specs(TINY.config, capacity))


IDS_POS = 2 * ELEMENT  # input_ids + position_ids, one element each
LOGITS = TINY.config.vocab * ELEMENT


@pytest.fixture(scope="module")
def per_step() -> dict[str, dict[int, dict[str, int]]]:
    """Counters of one step at depth 8, per mode and capacity."""
    out: dict[str, dict[int, dict[str, int]]] = {}
    for name, cls in MODES.items():
        out[name] = {}
        for cap in CAPACITIES:
            b = prepared(cls, cap)
            try:
                state, _ = depth_state(8, cap)
                b.reach_depth(state)
                b.step(int(TOKENS[8]))  # warm-up: first-dispatch effects stay out of the count
                b.counters.reset()
                b.step(int(TOKENS[9]))
                out[name][cap] = b.counters.as_dict()
            finally:
                b.close()
    return out


def _linear(values: dict[int, int]) -> tuple[float, float]:
    """(intercept, slope) of an exactly linear function of capacity; asserts it is linear."""
    c0, c1, c2 = CAPACITIES
    slope = (values[c1] - values[c0]) / (c1 - c0)
    assert values[c2] - values[c1] == slope * (c2 - c1), values
    return values[c0] - slope * c0, slope


def test_stateful_moves_no_cache_bytes(per_step):
    for cap, c in per_step["wgpu:stateful"].items():
        assert c["h2d"] == IDS_POS, cap
        # logits, plus the 4-byte capacity status the dispatch reads back (webnn/stateful.py)
        assert c["d2h"] == LOGITS + 4, cap
        assert c["d2d"] == 0, cap


def test_stateless_copies_every_cache_both_ways(per_step):
    for cap, c in per_step["wgpu:stateless"].items():
        assert c["h2d"] == _cache_bytes(cap) + IDS_POS, cap
        assert c["d2h"] == _cache_bytes(cap) + LOGITS, cap
    _, slope = _linear({cap: c["h2d"] for cap, c in per_step["wgpu:stateless"].items()})
    assert slope > 0


def _append_bytes(capacity: int) -> int:
    return sum(s.nbytes for s in cache_specs(TINY.config, capacity) if s.kind == "append")


def test_reuse_copies_on_the_device_only(per_step):
    """Each step the graph writes a full present: the unchanged rows are copied by a kernel
    in the step's compute pass (read + write, counted as kernel bytes); h2d stays ids +
    position, and nothing crosses to the host but the logits."""
    for cap, c in per_step["wgpu:reuse"].items():
        assert c["h2d"] == IDS_POS, cap
        assert c["d2h"] == LOGITS, cap
        assert c["d2d"] == 0, cap
    _, slope = _linear({cap: c["kernel"] + c["d2d"] for cap, c in per_step["wgpu:reuse"].items()})
    assert slope > 0


def test_stateful_writes_only_new_rows(per_step):
    """Kernel bytes grow with capacity in every mode (attention reads every row); the
    stateful graph adds nothing that grows with capacity: no copy, and kernels that write
    the state write the new rows only, so its slope is the reuse graph's less the copy
    kernel's (each append cache read once and written once)."""
    _, reuse = _linear({cap: c["kernel"] + c["d2d"] for cap, c in per_step["wgpu:reuse"].items()})
    _, stateful = _linear({cap: c["kernel"] + c["d2d"] for cap, c in per_step["wgpu:stateful"].items()})
    assert all(c["d2d"] == 0 for c in per_step["wgpu:stateful"].values())
    assert reuse - stateful == 2 * _append_bytes(1)


def test_fallback_binds_pairs_like_reuse(per_step):
    assert per_step["wgpu:fallback"] == per_step["wgpu:reuse"]


# --- the proposal, at model level -----------------------------------------------------------

def test_reset_reproduces_a_fresh_graph_bit_for_bit():
    b = prepared(StatefulInPlace, 16)
    try:
        first = [b.step(int(t)).copy() for t in TOKENS[:6]]
        b.reset()
        again = [b.step(int(t)).copy() for t in TOKENS[:6]]
    finally:
        b.close()
    fresh = prepared(StatefulInPlace, 16)
    try:
        other = [fresh.step(int(t)).copy() for t in TOKENS[:6]]
    finally:
        fresh.close()
    for a, r, f in zip(first, again, other, strict=True):
        assert np.array_equal(a, r)
        assert np.array_equal(a, f)


def test_dispatch_past_capacity_fails_and_leaves_the_cache():
    from backends.webnn import OperationError

    cap = 8
    b = prepared(StatefulInPlace, cap)
    clean = prepared(StatefulInPlace, cap)
    try:
        for t in TOKENS[:cap - 1]:
            b.step(int(t))
            clean.step(int(t))
        b.position = cap  # the row after the last one: the cache has no room for it
        with pytest.raises(OperationError):
            b.step(int(TOKENS[cap]))
        b.position = cap - 1
        # the failed dispatch left every pair (KV rows and the recurrent state) as it was
        assert np.array_equal(b.step(int(TOKENS[cap - 1])), clean.step(int(TOKENS[cap - 1])))
    finally:
        b.close()
        clean.close()


def test_many_pairs_share_one_capacity_check_binding():
    """40 append pairs reading one index tensor: the capacity check binds it once (not 41
    storage buffers, beyond lavapipe's 32) and the deep model still matches the reference."""
    import dataclasses

    from model.workload import ATTENTION

    cfg = dataclasses.replace(preset("tiny"), name="tiny-deep", layers=(ATTENTION,) * 20)
    wl = Workload.build(cfg)
    b = StatefulInPlace()
    b.prepare(wl, 24)
    try:
        check = next(la.kernel for la in b.converted.graph._plan.launches
                     if getattr(la, "kernel", None) and la.kernel.name == "capacity_check")
        assert len(check.bindings) == 2
        tokens = token_stream(cfg, 12)
        ref = Reference(cfg, wl.weights, 24)
        ref.prefill(tokens[:8])
        b.reach_depth(DepthState(tokens=tokens[:8].copy(), cache=ref.cache_arrays()))
        assert_close(b.step(int(tokens[8])), ref.step(int(tokens[8])), "tiny-deep step")
    finally:
        b.close()


def test_float16_valued_weights_stream_as_float16():
    """On a preset with float16-valued weights ('+f16') the GPU matrix-vector kernels keep
    every constant weight matrix as float16 (lossless, chosen by the implementation), the
    model still computes the reference's logits, and the kernel bytes drop by the weights'
    half; the floor counts 2 bytes a parameter."""
    wl = Workload.build(preset("tiny+f16"))
    assert wl.weights_bytes * 2 == TINY.weights_bytes
    per_step = {}
    for w in (TINY, wl):
        b = StatefulInPlace(options=KernelOptions(gemv="rows"))
        b.prepare(w, 24)
        try:
            gemvs = [la.kernel for la in b.converted.graph._plan.launches
                     if hasattr(la, "kernel") and la.kernel.name == "matmul_gemv"]
            assert gemvs and all(("unpack2x16float" in k.wgsl) == (w is wl) for k in gemvs)
            ref = Reference(w.config, w.weights, 24)
            tokens = token_stream(w.config, 6)
            b.reset()
            for tok in tokens:
                b.counters.reset()
                assert_close(b.step(int(tok)), ref.step(int(tok)), f"{w.config.name} stateful")
            per_step[w.config.name] = b.counters.kernel
        finally:
            b.close()
    saved = per_step["tiny"] - per_step["tiny+f16"]
    assert 0.4 * TINY.weights_bytes < saved <= 0.5 * TINY.weights_bytes


def test_stateless_page_through_staged_writes(monkeypatch):
    """With every cache write staged (the threshold lowered to 64 bytes), the stateless
    page's uploads are batched into the arena and flushed by the dispatch: the logits are
    the reference's and each step's bytes are the caches both ways, as before."""
    from backends.webnn.wgpu_impl import context

    monkeypatch.setattr(context, "STAGED_WRITE_MIN", 64)
    b = prepared(StatelessCopy, CAPACITY)
    try:
        assert_steps_match(b, "stateless, staged writes", steps=3)
        assert any(a is not None for a in b.context._staged._arenas)
        b.counters.reset()
        b.step(int(TOKENS[0]))
        cache = sum(s.nbytes for s in cache_specs(TINY.config, CAPACITY))
        assert b.counters.h2d >= cache and b.counters.d2h >= cache
    finally:
        b.close()


# --- float16 KV caches ('+f16kv': the cache dtype is part of the model) ----------------------

#: below the gap between the float16-cache reference and one that keeps its rows unrounded
#: (~7e-5 on tiny and small): a page or kernel that skipped the rounding would fail
F16KV_TOL = 1e-5
F16KV_CASES = [("tiny+f16kv", m) for m in MODES] + [
    ("small+f16kv", m) for m in ("wgpu:stateless", "wgpu:reuse", "wgpu:stateful")]
_F16KV: dict[str, Workload] = {}


def f16kv(name: str) -> Workload:
    if name not in _F16KV:
        _F16KV[name] = Workload.build(preset(name))
    return _F16KV[name]


def _three_steps_match(b, wl: Workload, cap: int, tol: float, where: str,
                       depth: int = 16) -> Reference:
    """Page ``b`` brought to ``depth`` of ``wl``, then three steps each within ``tol`` of
    the float64 reference's logits, argmax included; returns the reference, 3 deeper."""
    tokens, ref = at_depth(b, wl, cap, depth)
    for i in range(3):
        tok = int(tokens[depth + i])
        got, want = np.asarray(b.step(tok), np.float64), ref.step(tok)
        rel = np.abs(got - want).max() / np.abs(want).max()
        assert rel < tol, f"{where} step {i}: {rel:.2e} (tolerance {tol:.1e})"
        assert got.argmax() == want.argmax()
    return ref


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("name,mode", F16KV_CASES)
def test_f16kv_matches_the_rounding_reference(name, mode):
    """Whole decode steps of a float16-cache model: every page mode computes the float64
    reference's logits (rows rounded to float16 as they are written); the page's caches
    are float16 tensors, and the stateless page's host copy holds the reference's rows."""
    wl, cap = f16kv(name), 24
    b = MODES[mode]()
    b.prepare(wl, cap)
    try:
        ref = _three_steps_match(b, wl, cap, F16KV_TOL, f"{name} {mode}")
        specs = cache_specs(wl.config, cap)
        kv = [s for s in specs if s.kind == "append"]
        assert kv and all(s.dtype == "float16" for s in kv)
        if b._hidden:
            return
        assert all(b._cur[s.input].data_type == s.dtype for s in specs)
        if mode == "wgpu:stateless":
            want = ref.cache_arrays()
            for s in kv:
                got = b._host[s.input]
                assert got.dtype == np.float16
                # rows computed in float32 and rounded: at most one float16 step apart
                step = np.spacing(np.abs(want[s.input])).astype(np.float32)
                assert np.all(np.abs(got.astype(np.float32) - want[s.input]) <= step)
    finally:
        b.close()


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("mode", list(MODES))
def test_q4f16_matches_the_reference_under_the_float16_tolerance(mode):
    """'+q4f16' (4-bit weights, float16 activations and caches): every page mode converts the
    float16 standard-flavour graph and computes the float64 reference's logits within the
    derived float16 tolerance, argmax included; every 4-bit product runs the fused gemv
    (no dequantizeLinear launch writes weights), and the caches are float16 tensors."""
    wl, cap = f16kv("tiny+q4f16"), 24
    b = MODES[mode]()
    b.prepare(wl, cap)
    try:
        _three_steps_match(b, wl, cap, logits_tolerance(wl.config), f"tiny+q4f16 {mode}")
        names = [la.kernel.name for la in b.converted.graph._plan.launches
                 if hasattr(la, "kernel")]
        assert "gemv_q4" in names and not any("dequantize" in n for n in names), names
        if not b._hidden:
            kv = [s for s in cache_specs(wl.config, cap) if s.kind == "append"]
            assert all(b._cur[s.input].data_type == "float16" for s in kv)
    finally:
        b.close()


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("name,mode,how", [
    *((n, m, "flash1") for n in ("tiny+f16kv", "tiny+q4f16")
      for m in ("wgpu:stateful", "wgpu:stateless")),
    ("tiny+q4f16", "wgpu:stateful", "lanes")])
def test_one_launch_attention_pages_match_the_reference(name, mode, how):
    """KernelOptions.attention = "flash1" (decode attention in one launch, the combine
    folded in), "lanes" (lane-groups, an online softmax) on float16 caches:
    the pages compute the reference's logits within the preset's tolerance, every
    attention layer in the variant's launches."""
    wl, cap = f16kv(name), 24
    b = MODES[mode](options=KernelOptions(attention=how))
    b.prepare(wl, cap)
    try:
        tol = F16KV_TOL if name == "tiny+f16kv" else logits_tolerance(wl.config)
        _three_steps_match(b, wl, cap, tol, f"{name} {mode} attention={how}")
        names = [la.kernel.name for la in b.converted.graph._plan.launches
                 if hasattr(la, "kernel")]
        assert f"attention_{how}" in names, names
        assert ("attention_combine_rows" in names) == (how == "lanes"), names
        assert "attention_combine" not in names, names
    finally:
        b.close()


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("q4,pro,epi", [(None, None, None), ("fused", None, None),
                                        ("wide2_h", None, None), ("quad_h", None, None),
                                        (None, "full", None), (None, None, "gated"),
                                        ("quad_h", "full", "gated"), ("quad_k4_i8", None, None)])
def test_q4f16_gpu_plan_launches_as_q4(monkeypatch, q4, pro, epi):
    """On a GPU target tiny+q4f16 plans as tiny+q4 but for one launch: q/k/v and gate/up
    stack, the norms are one launch each, the residual adds are the 4-bit kernel's float16
    epilogue (no launch rounds a product or adds), attention is the flash kernel, and the
    steps still match the reference under the float16 tolerance; with each 4-bit kernel
    (``q4``: the q4_gemv knob; unset: "quad_k4_h" on a GPU target; "wide2_h", "quad_h":
    float16 products, within the same tolerance; ``pro``: the q4_prologue knob, the norms
    and SwiGLU computed by the 4-bit kernel where it reads them; ``epi``: the q4_epilogue
    knob, SwiGLU written by the gate/up launch; "quad_k4_i8": the input as two int8 parts,
    the GPU's norms from partial sums and SwiGLU written by gate/up with it)."""
    _gpu_target(monkeypatch)
    launches = {}
    for name in ("tiny+q4", "tiny+q4f16"):
        wl = f16kv(name)
        b = StatefulInPlace(options=KernelOptions(q4_gemv=q4, q4_prologue=pro,
                                                  q4_epilogue=epi))
        b.prepare(wl, 24)
        try:
            launches[name] = [la.kernel.name for la in b.converted.graph._plan.launches
                              if hasattr(la, "kernel")]
            ints = sum("dot4I8Packed" in la.kernel.wgsl
                       for la in b.converted.graph._plan.launches if hasattr(la, "kernel"))
            # int8 parts only on float16 weights, on every one of their 4-bit launches
            assert ints == (launches[name].count("gemv_q4_quad")
                            if q4 == "quad_k4_i8" and name == "tiny+q4f16" else 0), ints
            _three_steps_match(b, wl, 24, logits_tolerance(wl.config), name)
        finally:
            b.close()
    half = launches["tiny+q4f16"]
    assert len(half) <= len(launches["tiny+q4"]) + 1, half
    kernel = {"fused": "gemv_q4", "wide2_h": "gemv_q4_wide", "quad_h": "gemv_q4_quad",
              "quad": "gemv_q4_quad", "quad_k4_i8": "gemv_q4_quad"}.get(
        q4 or "quad", "gemv_q4_multi")
    assert half.count(kernel) == launches["tiny+q4"].count(kernel) > 0
    assert "attention_flash" in half and not any("add" in n and "cast" in n for n in half)
    if pro == "full" or epi == "gated":  # SwiGLU: no launch of its own
        assert "fused:sigmoid+mul+mul" not in half, half
    if pro == "full":  # nor the layers' norms
        assert half.count("fused_vector") == launches["tiny+q4"].count("fused_vector") <= 3, half


def _gpu_target(monkeypatch, max_storage: int = 10) -> None:
    """Contexts created from here on plan for a GPU adapter (this one's limits, a GPU's
    defaults: the rows kernels and their fusions) while running on this adapter;
    ``max_storage``: storage buffers a kernel may bind (an NVIDIA adapter's are many)."""
    import dataclasses

    from backends.webnn.wgpu_impl import context

    real = context.target_of
    monkeypatch.setattr(context, "target_of", lambda *args: dataclasses.replace(
        real(*args), cpu=False, max_storage=max_storage, shared_bytes=32768))


def test_f16_gpu_plan_computes_norms_from_partials_and_gates_swiglu(monkeypatch):
    """On a GPU target tiny+f16 (float16-valued weights on the rows kernels) computes each
    norm between two products from the partial sums the residual product before it writes,
    and writes SwiGLU from the gate/up launch (``gemv_norms``, ``gemv_epilogue``: the GPU
    defaults): every RMSNorm but the first layer's (of the embedding row) and every SwiGLU
    without a launch of its own, as with both knobs off they have. Both plans' steps at
    depth 16 match the float64 reference, argmax included."""
    _gpu_target(monkeypatch)
    wl = f16kv("tiny+f16")
    layers = len(wl.config.layers)
    names = {}
    for knobs in ({}, {"gemv_norms": "off", "gemv_epilogue": "off"}):
        b = StatefulInPlace(options=KernelOptions(**knobs))
        b.prepare(wl, 24)
        try:
            plan = b.converted.graph._plan
            names[bool(knobs)] = [la.kernel.name for la in plan.launches
                                  if hasattr(la, "kernel")]
            assert (len(plan.gated), len(plan.norm_stats)) == (
                (0, 0) if knobs else (layers, 2 * layers))
            _three_steps_match(b, wl, 24, 1e-4, f"tiny+f16 GPU plan {knobs}")
        finally:
            b.close()
    fused, off = names[False], names[True]
    assert len(off) - len(fused) == 3 * layers, (fused, off)
    assert off.count("fused_vector") - fused.count("fused_vector") == 2 * layers, fused
    assert off.count("fused:sigmoid+mul+mul") == layers, off
    assert "fused:sigmoid+mul+mul" not in fused, fused


@pytest.fixture(scope="module")
def per_step_f16kv() -> dict[str, dict[int, dict[str, int]]]:
    """Counters of one step at depth 8 of 'tiny+f16kv', per mode and capacity."""
    wl = f16kv("tiny+f16kv")
    tokens = token_stream(wl.config, 16)
    out: dict[str, dict[int, dict[str, int]]] = {}
    for name in ("wgpu:stateless", "wgpu:reuse", "wgpu:stateful"):
        out[name] = {}
        for cap in CAPACITIES:
            b = MODES[name]()
            b.prepare(wl, cap)
            try:
                ref = Reference(wl.config, wl.weights, cap)
                ref.prefill(tokens[:8])
                b.reach_depth(DepthState(tokens=tokens[:8].copy(), cache=ref.cache_arrays()))
                b.step(int(tokens[8]))
                b.counters.reset()
                b.step(int(tokens[9]))
                out[name][cap] = b.counters.as_dict()
            finally:
                b.close()
    return out


@pytest.mark.adapter_feature("shader-f16")
def test_f16kv_stateless_page_moves_half_the_kv_bytes(per_step_f16kv):
    """Two bytes a cache element cross the link each way: the KV caches' share of the
    stateless step is half the float32 model's (the GDN state stays float32)."""
    cfg = f16kv("tiny+f16kv").config
    for cap, c in per_step_f16kv["wgpu:stateless"].items():
        specs = cache_specs(cfg, cap)
        caches = sum(s.nbytes for s in specs)
        kv32 = sum(s.nbytes for s in cache_specs(TINY.config, cap) if s.kind == "append")
        assert caches == _cache_bytes(cap) - kv32 // 2
        assert c["h2d"] == caches + IDS_POS, cap
        assert c["d2h"] == caches + LOGITS, cap


@pytest.mark.adapter_feature("shader-f16")
def test_f16kv_reuse_copies_two_bytes_an_element(per_step_f16kv):
    """The reuse graph's copy of each float16 cache is counted at two bytes an element read
    and written; the stateful graph, writing only the new rows, saves exactly that."""
    cfg = f16kv("tiny+f16kv").config
    for c in per_step_f16kv["wgpu:reuse"].values():
        assert c["h2d"] == IDS_POS and c["d2h"] == LOGITS and c["d2d"] == 0
    _, reuse = _linear({cap: c["kernel"] for cap, c in per_step_f16kv["wgpu:reuse"].items()})
    _, stateful = _linear({cap: c["kernel"] for cap, c in per_step_f16kv["wgpu:stateful"].items()})
    row = sum(s.nbytes for s in cache_specs(cfg, 1) if s.kind == "append")
    assert row == sum(s.nbytes for s in cache_specs(TINY.config, 1) if s.kind == "append") // 2
    assert reuse - stateful == 2 * row


@pytest.mark.parametrize("name", ["tiny+f16kv", "tiny+q4f16"])
def test_f16_on_an_adapter_without_shader_f16_fails_in_one_line(monkeypatch, name):
    """A context without 'shader-f16' turns the float16 cache down at conversion: one
    TypeError naming the adapter and the missing feature (the worker records it as the
    point's reason), not a shader-compilation traceback."""
    from backends.webnn.wgpu_impl import context

    init = context.WgpuContext.__init__

    def without_f16(self, **kw):
        init(self, **kw)
        self._f16 = False

    monkeypatch.setattr(context.WgpuContext, "__init__", without_f16)
    b = StatelessCopy()
    try:
        with pytest.raises(TypeError, match=r"^data type float16 is not supported by this "
                                            r"context: the adapter \(.*\) has no 'shader-f16'$"):
            b.prepare(f16kv(name), 16)
    finally:
        b.close()


HOST_PATHS = [{"pass_calls": "wgpu-py", "map_wait": "thread", "queue_calls": "wgpu-py"},
              {"pass_calls": "direct", "map_wait": "caller"},
              {"map_wait": "spin", "record_ahead": "on"},
              {"map_wait": "spin", "record_ahead": "on", "queue_calls": "wgpu-py"},
              {"map_wait": "spin", "record_ahead": "on", "queue_calls": "direct_maps"}]


@pytest.mark.parametrize("knobs", HOST_PATHS, ids=lambda k: ",".join(f"{a}={v}" for a, v in k.items()))
@pytest.mark.parametrize("cls", [StatefulInPlace, StatelessCopy, DAWN_PAGES["dawn:stateful"]],
                         ids=lambda c: c.name)
def test_host_paths_compute_the_reference(cls, knobs):
    """However a pass is encoded and the queue is called (the engine's C functions or
    wgpu-py's methods) and however a read map waits (spinning, blocking in the caller,
    wgpu-py's poll thread), the pages compute the reference's logits, on both engines (on
    Dawn only "spin" is its own)."""
    if cls.engine == "dawn" and not DAWN_OK:
        pytest.skip(f"no Dawn adapter: {DAWN_WHY}")
    b = prepared(cls, CAPACITY, **knobs)
    try:
        assert_steps_match(b, f"{cls.name} {knobs}", steps=3)
    finally:
        b.close()


@pytest.mark.parametrize("record_ahead", ["on", "off"])
def test_host_breakdown_adds_up(record_ahead):
    """The page's host-time breakdown of a step (docs/measuring.md, "Host time") splits
    the page's own wall time of it: its parts add up to its total, the context's timers
    are never negative, the read waited for the device and copied the logits, and the
    dispatch's encoding is on the step's path (encode) or ahead of it (record_ahead),
    as the knob says."""
    b = prepared(StatefulInPlace, CAPACITY, record_ahead=record_ahead)
    try:
        assert b.host_breakdown_ms() is None  # no step yet
        b.reach_depth(depth_state(16, CAPACITY)[0])
        for i in range(3):
            b.step(int(TOKENS[16 + i]))
        h = b.host_breakdown_ms()
        parts = ("write", "encode", "submit", "record_ahead", "dispatch_other", "wait", "copy",
                 "read_other", "after")
        assert sum(h[k] for k in parts) == pytest.approx(h["total"], abs=1e-6)
        device = ("write_device", "encode", "submit", "record_ahead", "wait", "copy")
        assert all(h[k] >= 0 for k in device), h
        assert h["wait"] > 0 and h["copy"] > 0 and h["submit"] > 0 and h["write_device"] > 0
        assert h["write"] >= h["write_device"]
        if record_ahead == "on":
            assert h["encode"] == 0 and h["record_ahead"] > 0
        else:
            assert h["encode"] > 0 and h["record_ahead"] == 0
    finally:
        b.close()


@pytest.mark.skipif(not DAWN_OK, reason=f"no Dawn adapter: {DAWN_WHY}")
def test_dawn_stateful_requests_shader_f16_and_matches_q4f16():
    """Where Dawn's adapter lists 'shader-f16' (lavapipe; not NVIDIA under Vulkan, where
    Dawn withholds it: docs/dawn.md), the context asks for it at device creation, records
    nothing lacking for it, and dawn:stateful runs '+q4f16' (float16 activations and caches)
    within the float16 tolerance of the reference."""
    from backends.webnn.adapter import wgpu_adapter

    adapter, _ = wgpu_adapter("dawn")
    if "shader-f16" not in adapter.features:
        pytest.skip(f"Dawn's adapter ({adapter.summary}) lists no 'shader-f16'")
    wl, cap = f16kv("tiny+q4f16"), 24
    b = DAWN_PAGES["dawn:stateful"]()
    b.prepare(wl, cap)
    try:
        assert "shader-f16" in b.context._device.features
        assert "shader-f16" not in b.details["engine"]["features_lacking"]
        _three_steps_match(b, wl, cap, logits_tolerance(wl.config), "tiny+q4f16 dawn:stateful")
    finally:
        b.close()


@pytest.mark.adapter_feature("shader-f16")
@pytest.mark.parametrize("cls", [StatefulInPlace, TensorReuse, StatelessCopy],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("k", [1, 4])
def test_pages_read_next_ids_computed_on_the_device(cls, k):
    """``read_ids``: the graph also takes each logits row's argmax (``backends.next_ids``) and
    ``step_ids`` reads those K ids, which are the float64 reference's greedy tokens; the
    logits are never read back (the step's device-to-host bytes are the ids', not a
    vocabulary row's)."""
    cfg = preset("tiny+q4f16")
    wl = Workload.build(cfg)
    cap, depth = 32, 8
    b = cls(tokens_per_step=k)
    b.read_ids = True
    b.prepare(wl, cap)
    try:
        tokens, ref = at_depth(b, wl, cap, depth)
        for j in range(2):
            ids = tokens[depth + j * k:depth + (j + 1) * k]
            b.counters.reset()
            got = b.step_ids(ids)
            want = ref.step_tokens(ids).argmax(-1) if k > 1 else [ref.step(int(ids[0])).argmax()]
            np.testing.assert_array_equal(got, want)
            if cls is not StatelessCopy:  # (that page reads its caches back too)
                assert b.counters.d2h < 4 * cfg.vocab, b.counters.d2h
        with pytest.raises(ValueError, match="step_ids"):  # its logits are never read
            b.step_tokens(ids) if k > 1 else b.step(int(ids[0]))
        if k > 1:  # one token is not a K-token step's
            with pytest.raises(ValueError, match=f"1 tokens given to a step of {k}"):
                b.step_ids(int(ids[0]))
    finally:
        b.close()


def _greedy(first: int, n: int, step) -> list[int]:
    """``n`` greedy ids after ``first``, each the next step's token (``step(token) -> id``)."""
    out, tok = [], first
    for _ in range(n):
        tok = int(step(tok))
        out.append(tok)
    return out


@pytest.mark.parametrize("cls", [StatefulInPlace, TensorReuse, StatefulFallback],
                         ids=lambda c: c.name)
def test_chained_decode_is_the_greedy_decode(cls):
    """``decode_chained`` (each step's next_ids tensor bound as the next step's input_ids,
    step i + 1 dispatched before step i's id is read) gives the float64 reference's greedy
    tokens and ``step_ids``' own, moves the same bytes back (one id and its status a step)
    and fewer up (no id written after the first); position as ``step`` keeps it. A page
    that cannot chain says why."""
    cap, depth, n = 24, 6, 5
    b = cls()
    b.read_ids = True
    b.prepare(TINY, cap)
    try:
        tokens, ref = at_depth(b, TINY, cap, depth)
        first = int(tokens[depth])
        want = _greedy(first, n, lambda t: ref.step(t).argmax())
        b.counters.reset()
        got = b.decode_chained(first, n)
        chained = b.counters.snapshot()
        assert got.tolist() == want and b.position == depth + n
        at_depth(b, TINY, cap, depth)
        b.counters.reset()
        assert _greedy(first, n, lambda t: b.step_ids(t)[0]) == want
        assert chained.d2h == b.counters.d2h and chained.h2d < b.counters.h2d
        assert b.decode_chained(first, 0).tolist() == []
        b.read_ids = False
        with pytest.raises(ValueError, match="read_ids"):
            b.decode_chained(first, 2)
        b.read_ids, b.host_cache = True, True
        with pytest.raises(ValueError, match="on the host"):
            b.decode_chained(first, 2)
    finally:
        b.close()


def test_chained_decode_past_capacity_raises_and_leaves_the_cache():
    """An in-place stateful graph's dispatch does not wait for the previous one's status:
    a chain running past the capacity raises OperationError at the read of the first step
    that did not fit (the next step, already queued, is drained), and the hidden state is
    what the steps that fit left."""
    from backends.webnn import OperationError

    cap, depth = 12, 8
    b = StatefulInPlace()
    b.read_ids = True
    b.prepare(TINY, cap)
    try:
        assert not b.converted.graph._double  # every pair in place: no wait at dispatch
        tokens, _ = at_depth(b, TINY, cap, depth)
        first = int(tokens[depth])
        fit = b.decode_chained(first, cap - depth)
        state = b.state_snapshot()
        at_depth(b, TINY, cap, depth)
        with pytest.raises(OperationError, match="capacity"):
            b.decode_chained(first, cap - depth + 3)
        after = b.state_snapshot()  # nothing left unread: no error here
        for name, arr in state.items():
            np.testing.assert_array_equal(after[name], arr, err_msg=name)
        at_depth(b, TINY, cap, depth)
        assert b.decode_chained(first, cap - depth).tolist() == fit.tolist()
    finally:
        b.close()
