"""Micro-benchmarks of the WebNN wgpu kernels (backends/webnn/PERFORMANCE.md).

Prints one JSON object: per gemv shape (llama-1b's) and per kernel variant, GPU time
(timestamp queries) and wall time per dispatch, and GB/s over the bytes a kernel must
move; the same for llama-1b's 4-bit products (``--gemv-q4``, per ``--q4-variants``)
and for decode attention over a (1, 8, C, 64) cache; and one full decode step
of a preset through the wgpu:stateful backend.

    .venv/bin/python scripts/kernel_bench.py                      # lavapipe-sized
    .venv/bin/python scripts/kernel_bench.py --gemv-variants auto,legacy,cols,rows \
        --attn 512,2048,8192,16384 --step small,llama-1b:8192
    .venv/bin/python scripts/kernel_bench.py --gemv none --attn none --gemv-q4 all \
        --q4-variants multi,multi_h,wide2,wide2_h,quad,quad_h --step none  # 4-bit A/B
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backends.webnn import MLGraphBuilder, ml  # noqa: E402
from backends.webnn.wgpu_impl.options import KernelOptions  # noqa: E402
from harness.calibrate import provenance  # noqa: E402
from harness.gc_window import GcWindow, freeze_setup, setup_frozen, thaw  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch_costs import empty_launch_cost, launch_items, step_launch_costs  # noqa: E402

GEMV_SHAPES = [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 128256)]
#: llama-1b's 4-bit launches (K, N): q/k/v stacked, o, gate/up stacked, down, the head
GEMV_Q4_SHAPES = [(2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048), (2048, 128256)]


def _timed(ctx, run, reps: int, budget_s: float) -> dict:
    run()  # warm: pipelines, bind groups
    _ = ctx.gpu_time_ns
    gpu, wall = [], []
    t_end = time.perf_counter() + budget_s
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        ns = ctx.gpu_time_ns  # waits for the submission (maps the timestamp buffer)
        wall.append(time.perf_counter() - t0)
        if ns is not None:
            gpu.append(ns / 1e9)
        if time.perf_counter() > t_end and len(wall) >= 3:
            break
    out = {"wall_ms": 1e3 * float(np.median(wall)), "reps": len(wall)}
    if gpu:
        out["gpu_ms"] = 1e3 * float(np.median(gpu))
        out["gpu_ms_min"] = 1e3 * float(np.min(gpu))
    return out


def _sig(rate: float) -> float:
    """A rate to 4 significant figures: a slow adapter's tiny kernel moves a few MB/s, which
    two decimals of GB/s would round to a rate of zero."""
    return float(f"{rate:.4g}")


def _rate(res: dict, nbytes: int) -> dict:
    res["bytes"] = nbytes
    t = res.get("gpu_ms_min", res["wall_ms"])
    res["GBps"] = _sig(nbytes / (t * 1e-3) / 1e9)
    return res


def bench_gemv(ctx, K: int, N: int, reps: int, budget: float) -> dict:
    rng = np.random.default_rng(K * 7 + N)
    w = rng.standard_normal((K, N), dtype=np.float32) / np.sqrt(K)
    x = rng.standard_normal((1, K), dtype=np.float32)
    b = MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=[1, K])
    y = b.matmul(xi, b.constant(data_type="float32", shape=[K, N], value=w))
    g = b.build({"y": y})
    tx = ctx.create_tensor(data_type="float32", shape=[1, K], writable=True)
    ty = ctx.create_tensor(data_type="float32", shape=[1, N], readable=True)
    ctx.write_tensor(tx, x)
    ctx.dispatch(g, {"x": tx}, {"y": ty})
    got = ctx.read_tensor(ty)
    want = x.astype(np.float64) @ w.astype(np.float64)
    err = float(np.max(np.abs(got - want)))
    res = _timed(ctx, lambda: ctx.dispatch(g, {"x": tx}, {"y": ty}), reps, budget)
    res["max_abs_err"] = err
    res["launches"] = len(g._plan.launches)
    res["kernel"] = sorted({la.kernel.name for la in g._plan.launches if hasattr(la, "kernel")})
    t0 = time.perf_counter()
    for _ in range(3):
        _ = x @ w
    res["numpy_ms"] = 1e3 * (time.perf_counter() - t0) / 3
    g.destroy()
    tx.destroy()
    ty.destroy()
    return _rate(res, 4 * (K * N + K + N))


def q4_floor_bytes(K: int, N: int) -> int:
    """What a 4-bit one-row product must move: half a byte a code, a float16 scale per block
    of 32 (the model's), the float32 row in and out; alike for every variant."""
    return N * K // 2 + 2 * N * (K // 32) + 4 * (K + N)


@functools.lru_cache(maxsize=1)
def q4_case(K: int, N: int, M: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(packed int4 codes (K, N) row-major, low nibble first; float16-valued scales of blocks
    of 32; the row; its float64 product), made once a shape for every variant. The oracle
    is computed a column chunk at a time: the head's dequantised weights whole would be
    2 GB of float64."""
    rng = np.random.default_rng(K * 13 + N)
    packed = rng.integers(0, 256, size=K * N // 2, dtype=np.uint8)
    scale = (rng.uniform(0.5, 1.5, size=(K // 32, N)) / np.sqrt(K) / 4).astype(
        np.float16).astype(np.float32)
    x = rng.standard_normal((M, K), dtype=np.float32)
    rows = packed.reshape(K, N // 2) if N % 2 == 0 else None
    want = np.empty((M, N))
    for c in range(0, N, 8192):
        hi = min(N, c + 8192)
        if rows is not None and c % 2 == 0 and hi % 2 == 0:
            part = rows[:, c // 2:hi // 2]
            nib = np.stack([part & 0xF, part >> 4], axis=2).reshape(K, hi - c)
        else:  # an odd N: nibbles of the whole row-major array
            flat = np.stack([packed & 0xF, packed >> 4], axis=1).reshape(K, N)
            nib = flat[:, c:hi]
        codes = (nib.astype(np.int8) ^ 8) - 8
        want[:, c:hi] = x.astype(np.float64) @ (
            codes * np.repeat(scale[:, c:hi].astype(np.float64), 32, axis=0))
    return packed, scale, x, want


def bench_gemv_q4(ctx, K: int, N: int, reps: int, budget: float, M: int = 1,
                  weights: str = "float16") -> dict:
    """One-row product with int4 weights (block 32, symmetric, float16-valued scales as a
    +q4f16 model has them) through the context's 4-bit kernel, or ``M`` rows (a K-token
    verify's: ``gemm_q4_rows``, ``gemm_q4_cols``); checked against float64. ``weights``:
    the dequantised weights' type, "float16" (float16 scales, the weights widened for the
    float32 row as a +q4f16 model's product reads them: the ``_h`` variants, q4_gemv's and
    q4_rows', multiply in float16) or "float32" (float32 scales: ``_h`` dropped, the
    kernels multiply in float32; the other variants' kernels are the same either way).
    GB/s over the one-row floor: the weights streamed once, whatever M."""
    packed, scale, x, want = q4_case(K, N, M)
    b = MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=[1, M, K] if M > 1 else [1, K])
    w = b.dequantize_linear(
        b.constant(data_type="int4", shape=[K, N], value=packed),
        b.constant(data_type=weights, shape=[K // 32, N], value=scale.astype(weights)),
        b.constant(data_type="int4", shape=[K // 32, N],
                   value=np.zeros(-(-(K // 32) * N // 2), np.uint8)))
    if weights == "float16":  # as the builder widens a float16 model's (``_widened``)
        w = b.cast(w, "float32")
    g = b.build({"y": b.matmul(xi, w)})
    lead = [1, M] if M > 1 else [1]
    tx = ctx.create_tensor(data_type="float32", shape=[*lead, K], writable=True)
    ty = ctx.create_tensor(data_type="float32", shape=[*lead, N], readable=True)
    ctx.write_tensor(tx, x.reshape(*lead, K))
    ctx.dispatch(g, {"x": tx}, {"y": ty})
    got = ctx.read_tensor(ty).reshape(M, N)
    res = _timed(ctx, lambda: ctx.dispatch(g, {"x": tx}, {"y": ty}), reps, budget)
    res["max_rel_err"] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    kernels = [la.kernel for la in g._plan.launches if hasattr(la, "kernel")]
    res["launches"] = len(g._plan.launches)
    res["kernel"] = sorted({k.name for k in kernels})
    res["groups"] = [k.groups[0] for k in kernels]
    res["rows"] = M
    res["weights"] = weights
    res["half_products"] = any("hq(" in k.wgsl for k in kernels)  # float16 code pairs
    res["kernel_bytes"] = sum(k.bytes for k in kernels)
    g.destroy()
    tx.destroy()
    ty.destroy()
    return _rate(res, q4_floor_bytes(K, N))


def bench_attention(ctx, C: int, reps: int, budget: float, kv: int = 8, rep: int = 4,
                    d: int = 64, cache: str = "float32") -> dict:
    """The standard flavour's attention subgraph (model/export.py `_attention`); ``cache``
    "float16": the caches are float16 inputs cast to float32 where read (as the +f16kv and
    +q4f16 exports spell it), checked against float64 NumPy over the float16 values."""
    rng = np.random.default_rng(C)
    b = MLGraphBuilder(ctx)
    q = b.input("q", data_type="float32", shape=[1, kv, rep, d])
    kc = b.input("k", data_type=cache, shape=[1, kv, C, d])
    vc = b.input("v", data_type=cache, shape=[1, kv, C, d])
    if cache != "float32":
        kc, vc = b.cast(kc, "float32"), b.cast(vc, "float32")
    pos = b.input("pos", data_type="int64", shape=[1, 1])
    ar = b.constant(data_type="int64", shape=[C], value=np.arange(C))
    mask = b.lesser_or_equal(ar, b.reshape(pos, [1, 1, 1, 1]))
    s = b.mul(b.matmul(q, b.transpose(kc, [0, 1, 3, 2])),
              b.constant(data_type="float32", shape=[], value=np.float32(1 / np.sqrt(d))))
    s = b.where(mask, s, b.constant(data_type="float32", shape=[],
                                    value=np.finfo(np.float32).min))
    o = b.matmul(b.softmax(s, 3), vc)
    g = b.build({"o": o})
    arrs = {"q": rng.standard_normal((1, kv, rep, d), dtype=np.float32),
            "k": rng.standard_normal((1, kv, C, d), dtype=np.float32).astype(cache),
            "v": rng.standard_normal((1, kv, C, d), dtype=np.float32).astype(cache),
            "pos": np.array([[C - C // 4 - 3]], np.int64)}
    ts = {}
    for n, a in arrs.items():
        ts[n] = ctx.create_tensor(data_type="int64" if n == "pos" else str(a.dtype),
                                  shape=list(a.shape), writable=True)
        ctx.write_tensor(ts[n], a)
    to = ctx.create_tensor(data_type="float32", shape=[1, kv, rep, d], readable=True)
    ctx.dispatch(g, ts, {"o": to})
    got = ctx.read_tensor(to)
    qq, kk, vv = (arrs[n].astype(np.float64) for n in "qkv")
    sc = qq @ kk.transpose(0, 1, 3, 2) / np.sqrt(d)
    sc[..., arrs["pos"][0, 0] + 1:] = -np.inf
    p = np.exp(sc - sc.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vv
    res = _timed(ctx, lambda: ctx.dispatch(g, ts, {"o": to}), reps, budget)
    res["max_abs_err"] = float(np.max(np.abs(got - want)))
    res["launches"] = len(g._plan.launches)
    res["kernels"] = [la.kernel.name for la in g._plan.launches if hasattr(la, "kernel")]
    g.destroy()
    res["cache"] = cache
    return _rate(res, np.dtype(cache).itemsize * 2 * kv * C * d)


#: the profile's name for a plan's buffer-to-buffer copies (`cache_copy=buffer`)
COPY_NAME = "copy_buffer_to_buffer"


def profile_launches(ctx, g, bound: dict) -> dict:
    """GPU time of each launch of a graph (kernels and buffer copies), summed by name: where a step's
    time goes. With 'timestamp-query-inside-passes' the whole step runs as one pass with a
    timestamp between launches (in situ: real clocks, caches and barriers); otherwise each
    launch runs alone in its own pass (best of two). Uses the context's internals."""
    import wgpu
    from wgpu.backends.wgpu_native.extras import write_timestamp

    from backends.webnn.wgpu_impl.plan import CopyLaunch

    dev = ctx._device
    items = launch_items(ctx, g, bound)
    by: dict[str, list] = {}
    by_grid: dict[str, list] = {}  # name and workgroup grid: one kernel's launch shapes apart

    def add(la, ms: float) -> None:
        copy = isinstance(la, CopyLaunch)
        name = COPY_NAME if copy else la.kernel.name
        nbytes = 2 * la.nbytes if copy else la.kernel.bytes  # a copy reads and writes
        keys = ((by, name), (by_grid, name if copy else f"{name} {la.kernel.groups}"))
        for table, key in keys:
            e = table.setdefault(key, [0, 0.0, 0])
            e[0] += 1
            e[1] += ms
            e[2] += nbytes

    in_pass = "timestamp-query-inside-passes" in dev.features
    if in_pass:
        n = len(items) + 1
        qs = dev.create_query_set(type="timestamp", count=n)
        qb = dev.create_buffer(size=8 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        best = None
        for _ in range(3):
            enc = dev.create_command_encoder()
            cp = enc.begin_compute_pass()
            write_timestamp(cp, qs, 0)
            for j, (la, a, b) in enumerate(items):
                if isinstance(la, CopyLaunch):
                    # a copy cannot sit in a pass: its end is the next pass's first timestamp
                    cp.end()
                    enc.copy_buffer_to_buffer(a, 0, b, 0, la.nbytes)
                    cp = enc.begin_compute_pass(timestamp_writes={
                        "query_set": qs, "beginning_of_pass_write_index": j + 1})
                    continue
                cp.set_pipeline(a)
                cp.set_bind_group(0, b)
                cp.dispatch_workgroups(*la.kernel.groups)
                write_timestamp(cp, qs, j + 1)
            cp.end()
            enc.resolve_query_set(qs, 0, n, qb, 0)
            dev.queue.submit([enc.finish()])
            t = np.frombuffer(dev.queue.read_buffer(qb), np.uint64).astype(np.int64)
            d = np.diff(t) / 1e6
            best = d if best is None or d.sum() < best.sum() else best
        for (la, _, _), ms in zip(items, best, strict=True):
            add(la, float(ms))
    else:
        qs = dev.create_query_set(type="timestamp", count=2)
        qb = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        for la, a, b in items:
            best = None
            for _ in range(2):
                enc = dev.create_command_encoder()
                if isinstance(la, CopyLaunch):  # between two empty passes' timestamps
                    enc.begin_compute_pass(timestamp_writes={
                        "query_set": qs, "end_of_pass_write_index": 0}).end()
                    enc.copy_buffer_to_buffer(a, 0, b, 0, la.nbytes)
                    enc.begin_compute_pass(timestamp_writes={
                        "query_set": qs, "beginning_of_pass_write_index": 1}).end()
                else:
                    cp = enc.begin_compute_pass(timestamp_writes={
                        "query_set": qs, "beginning_of_pass_write_index": 0,
                        "end_of_pass_write_index": 1})
                    cp.set_pipeline(a)
                    cp.set_bind_group(0, b)
                    cp.dispatch_workgroups(*la.kernel.groups)
                    cp.end()
                enc.resolve_query_set(qs, 0, 2, qb, 0)
                dev.queue.submit([enc.finish()])
                t = np.frombuffer(dev.queue.read_buffer(qb), np.uint64)
                dt = int(t[1] - t[0]) / 1e6
                best = dt if best is None else min(best, dt)
            add(la, best)
    def table(t: dict[str, list]) -> dict:
        return {k: {"n": v[0], "ms": round(v[1], 3), "bytes": v[2],
                    "GBps": _sig(v[2] / (v[1] * 1e-3) / 1e9) if v[1] else None}
                for k, v in sorted(t.items(), key=lambda kv: -kv[1][1])}

    out = table(by)
    out["_by_grid"] = table(by_grid)
    out["_method"] = "in-pass timestamps" if in_pass else "one pass per launch"
    return out


def host_profile(prof: cProfile.Profile, steps: int, top: int = 30) -> list[dict]:
    """The functions the host spent the timed steps in (ms per step), most time first: where a
    step's wall time goes outside the GPU (waits, copies into and out of mapped memory)."""
    st = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{os.path.basename(file)}:{line}:{fn}", "calls_per_step": nc / steps,
                     "self_ms": round(1e3 * tt / steps, 3), "cumulative_ms": round(1e3 * ct / steps, 3)})
    by_self = sorted(rows, key=lambda r: -r["self_ms"])[:top]
    by_cum = sorted(rows, key=lambda r: -r["cumulative_ms"])[:top]
    seen = {r["function"] for r in by_self}
    return by_self + [r for r in by_cum if r["function"] not in seen]


def reach_random_depth(be: Any, wl: Any, capacity: int, depth: int, warm_s: float) -> int:
    """Bring the page to `depth` as a sweep does (a page-owned cache written, here with fresh
    random values; a hidden one walked with random tokens), then load the GPU for `warm_s`
    as the sweep's worker does (heater.heat); returns the steps the walk took.

    Why: without it the timed steps run at positions 1..100 over caches that are zeros past
    the rows written, which is not what a sweep's step at `depth` reads and writes."""
    from backends.base import DepthState
    from harness.heater import heat
    from model.workload import cache_specs

    rng = np.random.default_rng()
    cache = {s.input: (0.5 * rng.standard_normal(s.shape)).astype(np.float32)
             for s in cache_specs(wl.config, capacity)}
    state = DepthState(tokens=rng.integers(1, wl.config.vocab, depth), cache=cache)
    be.reach_depth(state)
    heat(warm_s)
    return depth if be.hidden_state else 0


def bench_step(name: str, capacity: int, steps: int, profile: bool = False,
               warm_s: float = 0.0, mode: str = "wgpu:stateful", host: bool = False,
               depth: int = 0, options: KernelOptions | None = None, tokens: int = 1,
               read: str = "logits", costs: int = 0) -> dict:
    """Time ``steps`` steps of ``mode`` on preset ``name`` (or the ONNX decoder at path
    ``name``, ``*.onnx``: a real export, as ``statebench run --model`` runs it); ``read``:
    what a step reads back ("logits", "ids"), or "chain": the "ids" steps, then ``steps``
    tokens of the page's chained decode (``chained_decode``); ``costs``: rounds of
    ``launch_costs``, 0: none."""
    from backends.base import registry
    from model.workload import Workload, preset

    chain = read == "chain"
    if chain and tokens != 1:
        raise ValueError("--read chain decodes one token a step (--tokens 1)")
    read_ids = read in ("ids", "chain")
    # the chain's tokens (and its untimed first two) come after the timed steps
    reserve = steps * tokens + (steps + CHAIN_WARM if chain else 0)
    if depth and capacity < depth + reserve + 1:
        raise ValueError(f"--depth {depth} + {reserve} steps does not fit capacity {capacity}")
    t0 = time.perf_counter()
    model = name.endswith(".onnx")
    if model and depth:
        raise ValueError("--depth walks a preset's reference; a model steps from empty caches")
    wl = None if model else Workload.build(preset(name))
    be = registry()[mode](onnx_path=name, options=options) if model else registry()[mode](
        options=options)
    be.tokens_per_step = tokens  # K > 1: a speculative verify's graph, stepped K tokens a time
    if tokens > 1 and hasattr(be, "speculative"):
        be.speculative = True
    be.read_ids = read_ids  # the page reads the rows' argmax ids, not the logits
    be.prepare(wl, capacity)

    def step(t: int) -> np.ndarray:
        ids = np.arange(t, t + tokens, dtype=np.int64) % 100 + 1
        if tokens == 1:
            return be.step_ids(ids) if read_ids else be.step(int(ids[0]))
        out = be.step_ids(ids) if read_ids else be.step_tokens(ids)
        be.accept(tokens)
        return out

    prep = time.perf_counter() - t0
    plan = be.converted.graph._plan
    names: dict[str, int] = {}
    for la in plan.launches:
        k = getattr(la, "kernel", None)
        nm = k.name if k is not None else COPY_NAME
        names[nm] = names.get(nm, 0) + 1
    if depth:
        warm = reach_random_depth(be, wl, capacity, depth, warm_s)
    else:
        # steps before timing, so the GPU clocks ramp as in a sweep's depth walk (within the
        # capacity: the timed steps must still fit); the caches stay zeros past the rows
        # written
        t_warm, warm = time.perf_counter() + warm_s, 0
        while time.perf_counter() < t_warm and warm + tokens < capacity - reserve - 1:
            step(warm)
            warm += tokens
    wall, gpu = [], []
    hprof = cProfile.Profile() if host else None
    queue = be.context.queue_counts
    submits, maps = queue.submits, queue.maps
    freeze_setup()  # as the sweep's worker: setup's objects out of the collector
    collector = GcWindow.start()
    for t in range(steps):
        t1 = time.perf_counter()
        if hprof is not None:
            hprof.enable()
        logits = step(t)
        if hprof is not None:
            hprof.disable()
        wall.append(time.perf_counter() - t1)
        g = be.gpu_time_ms()
        if g is not None:
            gpu.append(g)
    gc_timed = collector.stop()
    thaw()
    # counted over the steps and their GPU-time reads, as the sweep's worker makes them
    per_step = {"submits_per_step": (queue.submits - submits) / steps,
                "maps_per_step": (queue.maps - maps) / steps, "gc_timed": gc_timed}
    chained = chained_decode(be, steps, int(np.asarray(logits).reshape(-1)[0])) if chain else None
    from model.workload import cache_specs

    weights = None if wl is None else wl.weights_bytes  # a model's: statebench run reports them
    cache = None if wl is None else sum(s.nbytes for s in cache_specs(wl.config, capacity))
    kbytes = be.counters.kernel / max(1, steps)
    prof = launch_cost = None
    if profile or costs:
        g = be.converted.graph
        bound = {"input": {n: t for n, t in be._bound.items() if n in g.inputs},
                 "output": {n: t for n, t in be._bound.items() if n in g.outputs}}
        for p in be._pairs:  # a page that binds its caches (stateless, reuse)
            if p.input in g.inputs:
                bound["input"][p.input] = be._cur[p.input]
                bound["output"][p.output] = be._nxt[p.input]
        if costs:  # before the in-pass profile: both leave the page's values wrong
            launch_cost = step_launch_costs(be.context, g, bound, costs)
            launch_cost["empty_launch"] = empty_launch_cost(be.context._device, rounds=costs)
        if profile:
            prof = profile_launches(be.context, g, bound)
    be.close()
    res = {"preset": name, "mode": mode, "capacity": capacity, "depth": depth, "tokens": tokens,
           "prepare_s": round(prep, 2), "warm_steps": warm,
           "wall_ms": 1e3 * float(np.median(wall[1:] or wall)),
           "launches": len(plan.launches), "kernels": names, **per_step,
           "weights_bytes": weights, "cache_bytes": cache, "kernel_bytes_counted": kbytes,
           "read": read,
           "logits_finite": None if read_ids else bool(np.isfinite(logits).all())}
    if prof is not None:
        res["profile"] = prof
    if launch_cost is not None:
        res["launch_costs"] = launch_cost
    if hprof is not None:
        res["host_profile"] = host_profile(hprof, steps)
    if gpu:
        res["gpu_ms"] = float(np.median(gpu[1:] or gpu))
        res["gpu_ms_min"] = float(np.min(gpu))
        if weights is not None:
            res["GBps_weights_cache"] = _sig((weights + cache) / (res["gpu_ms_min"] * 1e-3)
                                             / 1e9)
    if chained is not None:
        unchained = res.get("gpu_ms")
        chained["gpu_ms_unchained_ids"] = unchained
        chained["wall_minus_unchained_gpu_ms"] = (
            None if unchained is None else chained["wall_ms_per_token"] - unchained)
        res["chain"] = chained
    return res


#: untimed chained tokens before the timed chain (its tensors made, its two alternating
#: bindings recorded ahead)
CHAIN_WARM = 2


def chained_decode(be: Any, steps: int, first: int) -> dict:
    """``steps`` tokens of the page's chained greedy decode (``_Page.decode_chained``: each
    step's next_ids tensor bound as the next step's input_ids, step i + 1 dispatched before
    step i's id is read), timed as a whole after ``CHAIN_WARM`` untimed ones: the wall time
    per token. GPU time is not read per step: reading it waits for the step, which is what
    the chain avoids. Its dispatches still write their timestamps (the context was made
    with timing), so the GPU runs the same work as in the un-chained steps, whose GPU time
    (the same graph, this process) ``bench_step`` puts beside it."""
    queue = be.context.queue_counts
    vocab = be.converted.outputs[be._logits_name].shape[-1]
    be.decode_chained(first, CHAIN_WARM)
    submits, maps = queue.submits, queue.maps
    with setup_frozen():  # as the timed steps: setup's objects out of the collector
        collector = GcWindow.start()
        t0 = time.perf_counter()
        ids = be.decode_chained(first, steps)
        wall = time.perf_counter() - t0
        gc_timed = collector.stop()
    return {"tokens": steps, "wall_ms_per_token": 1e3 * wall / steps,
            "submits_per_token": (queue.submits - submits) / steps,
            "maps_per_token": (queue.maps - maps) / steps, "gc_timed": gc_timed,
            "ids_in_vocab": bool(((ids >= 0) & (ids < vocab)).all()),
            "gpu_ms": None,
            "gpu_ms_why": "not read per step in a chain (a read waits for the step); "
                          "gpu_ms_unchained_ids is the un-chained ids steps' median GPU time "
                          "of the same graph in this process (timestamps still written)"}


def _attempt(bench: Callable[..., dict], args: tuple, **labels: Any) -> dict:
    """``bench(*args)`` with its labels, or its error (recorded, and the others go on);
    printed to stderr as it completes."""
    try:
        r = bench(*args)
    except Exception as exc:  # noqa: BLE001 - record and go on
        r = {"error": repr(exc), "trace": traceback.format_exc()[-800:]}
    r.update(labels)
    print(json.dumps(r), file=sys.stderr)
    return r


def _attention_variant(chosen: KernelOptions, var: str) -> KernelOptions:
    """``--attn-variants``' ``var`` over the ``--option`` choices: "auto" (as chosen), "sN"
    (flash-decoding aiming at N splits per head), an attention knob value, or "VALUE:sN"
    (both)."""
    if var == "auto":
        return chosen
    if var.startswith("s") and var[1:].isdigit():
        return chosen.replace(attention_splits=int(var[1:]))
    kind, _, splits = var.partition(":s")
    if splits:
        if not splits.isdigit():
            raise ValueError(f"--attn-variants {var!r}: splits after ':s' must be a count")
        return chosen.replace(attention=kind, attention_splits=int(splits))
    return chosen.replace(attention=var)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemv", default="all", help="'all', 'none' or KxN,KxN")
    ap.add_argument("--gemv-variants", default="auto")
    ap.add_argument("--gemv-q4", default="none",
                    help="4-bit one-row products: 'all' (llama-1b's launches), 'none' or KxN,...")
    ap.add_argument("--q4-variants", default="fused,multi",
                    help="q4_gemv values to time them with, comma list ('auto': as --option): "
                         "fused, multi[ROWS][_lLANES][_gGROUPS][_uUNROLL][_h], "
                         "wide[ROWS][_kLOADS][_h], quad[_kLOADS][_h], generic")
    ap.add_argument("--attn", default="512,2048,8192,16384")
    ap.add_argument("--attn-variants", default="auto",
                    help="auto, or an attention knob value (flash, flash1, lanes, lanes1, "
                         "unfused, generic), or sN (flash-decoding aiming at N splits per "
                         "head); VALUE:sN combines both (flash:s16, lanes:s32, lanes1:s128)")
    ap.add_argument("--attn-cache", default="float32",
                    help="the attention benchmark's cache types, comma list: float32, float16")
    ap.add_argument("--step", default="small:512", help="preset:capacity,... or none")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1,
                    help="new tokens a step (--step): a speculative verify's K-token graph")
    ap.add_argument("--read", choices=("logits", "ids", "chain"), default="logits",
                    help="what the page reads back a step (--step): the logits, or the argmax "
                         "ids the graph computes of them (backends/next_ids.py); chain: the "
                         "ids steps, then as many tokens of the chained decode (each step's "
                         "ids fed to the next on the device; wall per token, GPU time from "
                         "the ids steps)")
    ap.add_argument("--q4-rows", type=int, default=1,
                    help="rows of the --gemv-q4 products (a K-token verify's: gemm_q4_rows)")
    ap.add_argument("--q4-weights", choices=("float16", "float32"), default="float16",
                    help="the --gemv-q4 products' dequantised weights: float16 (a +q4f16 "
                         "model's; the _h variants multiply in float16) or float32 (as "
                         "before this flag: _h dropped)")
    ap.add_argument("--depth", type=int, default=0,
                    help="time the steps at this depth, reached as a sweep does with random "
                         "cache values (a stateful page walks), after --warm seconds of GPU "
                         "load; 0: from position 0 over zero caches, after --warm seconds of "
                         "steps (the older kernel-bench files)")
    ap.add_argument("--mode", default="wgpu:stateful",
                    help="the wgpu page whose step is timed: wgpu:stateful, wgpu:reuse, ...")
    ap.add_argument("--warm", type=float, default=3.0,
                    help="seconds of steps before the timed ones (GPU clocks ramp), 0: none")
    ap.add_argument("--profile", action="store_true", help="per-kernel GPU time of the step")
    ap.add_argument("--launch-costs", type=int, default=0, metavar="ROUNDS",
                    help="what each kind of launch costs the step, timed without timestamps "
                         "between launches (left out, doubled), and an empty launch's cost, "
                         "medians of ROUNDS submits (scripts/launch_costs.py); 0: not")
    ap.add_argument("--host-profile", action="store_true",
                    help="cProfile of the timed steps (the host's share of the wall time)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a KernelOptions knob for every benchmark (e.g. gemv_prologue=off; "
                         "an empty value is None); repeatable")
    ap.add_argument("--submit-every", default="default",
                    help="launches per command buffer for the step, comma list: 0 = one "
                         "submit (GPU time without encoding gaps), 'default' = the context's")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds per measurement")
    a = ap.parse_args()
    out: dict = {"gemv": [], "gemv_q4": [], "attention": [], "step": [],
                 "provenance": {**provenance(), "argv": sys.argv[1:]}}
    try:  # every variant's options checked before anything runs
        chosen = KernelOptions.parse(a.option)
        gemv_runs = [(var, chosen if var == "auto" else chosen.replace(gemv=var))
                     for var in a.gemv_variants.split(",")]
        q4_runs = [(var, chosen if var == "auto" else chosen.replace(q4_gemv=var))
                   for var in a.q4_variants.split(",")]
        attn_runs = [(var, _attention_variant(chosen, var)) for var in a.attn_variants.split(",")]
        if not set(a.attn_cache.split(",")) <= {"float32", "float16"}:
            raise ValueError(f"--attn-cache {a.attn_cache!r}: float32 and/or float16")
    except ValueError as exc:
        print(f"kernel_bench: {exc}", file=sys.stderr)
        sys.exit(2)
    contexts: dict[KernelOptions, Any] = {}  # one per set of options (a context keeps its own)

    def context(options: KernelOptions) -> Any:
        if options not in contexts:
            contexts[options] = ml.create_context(timing=True, options=options)
        return contexts[options]

    out["adapter"] = {k: v for k, v in context(chosen).adapter_info.items()
                      if isinstance(v, (str, int))}
    shapes = GEMV_SHAPES if a.gemv == "all" else (
        [] if a.gemv == "none" else [tuple(map(int, s.split("x"))) for s in a.gemv.split(",")])
    for var, options in gemv_runs:
        for K, N in shapes:
            out["gemv"].append(_attempt(bench_gemv, (context(options), K, N, a.reps, a.budget),
                                        shape=f"{K}x{N}", variant=var))
    q4_shapes = GEMV_Q4_SHAPES if a.gemv_q4 == "all" else (
        [] if a.gemv_q4 == "none" else [tuple(map(int, s.split("x"))) for s in a.gemv_q4.split(",")])
    for K, N in q4_shapes:  # a shape's weights made once for its variants (q4_case)
        for var, options in q4_runs:
            out["gemv_q4"].append(_attempt(bench_gemv_q4, (context(options), K, N, a.reps,
                                                           a.budget, a.q4_rows, a.q4_weights),
                                           shape=f"{K}x{N}", variant=var))
    if a.attn != "none":
        for var, options in attn_runs:
            for cache in a.attn_cache.split(","):
                for C in map(int, a.attn.split(",")):
                    out["attention"].append(_attempt(
                        bench_attention, (context(options), C, a.reps, a.budget, 8, 4, 64, cache),
                        C=C, variant=var))
    for ctx in contexts.values():
        ctx.destroy()
    if a.step != "none":
        from backends.webnn.wgpu_impl import context as wctx

        default_every = dict(wctx.SUBMIT_EVERY)
        for spec in a.step.split(","):
            name, _, cap = spec.partition(":")
            for every in a.submit_every.split(","):
                wctx.SUBMIT_EVERY.update(default_every)
                if every != "default":
                    wctx.SUBMIT_EVERY.update(cpu=int(every), gpu=int(every))
                out["step"].append(_attempt(
                    bench_step, (name, int(cap or 512), a.steps, a.profile, a.warm, a.mode,
                                 a.host_profile, a.depth, chosen, a.tokens, a.read,
                                 a.launch_costs),
                    preset=name, submit_every=every, options=chosen.as_dict()))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
