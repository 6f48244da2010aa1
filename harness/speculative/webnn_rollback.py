"""Rollback on the proposal's stateful graph on the WebNN library (issue 31 items 3 and 5):
per way (``backends.webnn.rollback.WAYS``), K and acceptance m, what one speculative step
(verify of K tokens, then accepting m) moves, counted by the library's byte counters
(kernel bytes, device copies, host to device written, device to host read back), the
launches it issues, and its median wall time. Bytes and launches are the evidence; times
only as ratios between ways on one machine. ``cpu_replay`` (genai's ``ReplayStateUpdates``)
is timed with its read back, its NumPy replay and its write (each part's median also in
``host_ms``; the write's device copy is submitted before the next dispatch, so each step
carries the previous step's); ``device replay speedup`` = cpu_replay time / deferred time
at the same K and m (whole steps, a ratio of medians).

The replays alone are timed on a context with ``KernelOptions.gdn_replay`` "launch", where
the replay keeps a launch of its own; by default the verify's capture computes it (one
launch a layer fewer), so the step rows' deferred way has no replay launch to time.

``replay_only`` (issue 31 item 5's target: the device-side replay >= 10x faster than the CPU
round trip at hybrid-1b's shapes, at 0 < m < K; ``replays_alone``) times the two replays
directly, each alone, at the same K and m, on a context of its own made with
``timing=True``: the device replay is the deferred way's own replay launches (the capsule
masked by m, then ``S = decay S + outer(delta, key)`` in place on the pre-verify state: the
graph's pipelines and bindings, ``Session.encode_replay``; the conv window has no replay,
it rolls back by position), in a submit of their own, timed by GPU timestamps around their
compute pass (median of the trials), else by the wall-time slope of 1 against
``SLOPE_N`` replays in one pass (submit and sync cancel); the extension way's (the same
launches on its own buffers) beside it. The host round trip is cpu_replay's read back,
NumPy replay and write, its copy waited for, after an untimed verify (median; the parts in
``host.parts``). ``speedup`` = host round trip / device replay; where the device replay is
below the method's resolution no time and no ratio is given, the resolution and ``reason``
instead. ``method`` says how each was timed. (Before, ``replay_only`` was a difference of
whole-step medians, which went negative where the replay cost less than the step noise.)

``python -m harness.speculative.webnn_rollback --preset hybrid-1b --k 4 [--out FILE] [--slope]``
(``--slope``: the device replay by the wall-time slope even where timestamps exist)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from model.workload import preset


def layer_of(name: str, capacity: int):
    """The preset's first hybrid layer shapes (one attention head group's KV width)."""
    from backends.webnn.rollback import Layer

    c = preset(name)
    conv = 2 * c.gdn_qk_heads * c.gdn_qk_dim + c.gdn_v_heads * c.gdn_v_dim
    return Layer(c.gdn_qk_heads, c.gdn_v_heads, c.gdn_qk_dim, c.gdn_v_dim, conv,
                 c.gdn_conv_kernel or 4, c.kv_heads * c.head_dim, capacity)


def random_draft(rng, sh, k: int) -> dict[str, np.ndarray]:
    """Fresh random inputs of K tokens at layer shapes ``sh`` (none zero; decays negative:
    log space)."""
    f = np.float32
    return {"query": rng.standard_normal((k, sh.hk, sh.dk)).astype(f),
            "key": rng.standard_normal((k, sh.hk, sh.dk)).astype(f),
            "value": rng.standard_normal((k, sh.hv, sh.dv)).astype(f),
            "decay": -rng.uniform(0.01, 1.0, (k, sh.hv)).astype(f),
            "beta": rng.uniform(0.1, 0.9, (k, sh.hv)).astype(f),
            "conv_x": rng.standard_normal((k, sh.conv_dim)).astype(f),
            "new_k": rng.standard_normal((k, sh.kv_width)).astype(f),
            "new_v": rng.standard_normal((k, sh.kv_width)).astype(f),
            "attn_q": rng.standard_normal((k, sh.kv_width)).astype(f)}


def measure(ctx, sh, k: int, reps: int = 5, seed: int = 0, warm: int = 2, alone_ctx=None,
            timestamps: bool = True) -> list[dict]:
    """Rows {way, k, m, bytes (h2d, d2h, d2d, kernel), launches, copies, ms}; cpu_replay's
    rows add ``host_ms`` (median read / replay / write of a host replay, or None),
    ``device_replay_speedup`` (its ms / deferred's ms at the same K and m) and, at
    0 < m < K, ``replay_only`` (``replays_alone``, timed on ``alone_ctx``, default ``ctx``:
    a context made with ``timing=True`` has GPU timestamps where the adapter does)."""
    from backends.webnn.rollback import WAYS, Session

    rng = np.random.default_rng(seed)
    rows = []
    for way in WAYS:
        s = Session(ctx, sh, k, way)
        per = sum(1 for la in s.graph._plan.launches if hasattr(la, "kernel"))
        for _ in range(warm):  # untimed: every path of the way once (a CPU adapter's first
            for m in sorted({0, k // 2, k}):  # steps run ~2-5x slow)
                s.verify(random_draft(rng, sh, k))
                s.accept(m)
            s.reset()
        for m in sorted({0, k // 2, k}):
            times, spent, splits = [], None, []
            for i in range(reps + 1):  # the first warms the pipelines
                if s.position + 2 * k >= sh.capacity:
                    s.reset()
                x = random_draft(rng, sh, k)
                s.split = None
                before = ctx.counters.snapshot()
                t0 = time.perf_counter()
                s.verify(x)
                s.accept(m)
                times.append((time.perf_counter() - t0) * 1e3)
                spent = ctx.counters.since(before)
                if i and s.split is not None:
                    splits.append(s.split)
            dispatches = 1 + (way == "snapshot" and 0 < m < k)
            copies = int(way == "snapshot") * (2 if m < k else 1)  # snapshot (+ restore)
            row = {"way": way, "k": k, "m": m, "bytes": spent.as_dict(),
                   "launches": per * dispatches, "copies": copies,
                   "ms": float(np.median(times[1:]))}
            if way == "cpu_replay":
                row["host_ms"] = ({p: float(np.median([d[p] for d in splits])) for p in splits[0]}
                                  if splits else None)
            rows.append(row)
        s.graph.destroy()
    ms = {(r["way"], r["m"]): r["ms"] for r in rows}
    for r in rows:
        if r["way"] == "cpu_replay" and ("deferred", r["m"]) in ms:
            r["device_replay_speedup"] = r["ms"] / ms[("deferred", r["m"])]
    alone = replays_alone(alone_ctx or ctx, sh, k, reps, seed, timestamps=timestamps)
    for r in rows:
        if r["way"] == "cpu_replay" and r["m"] in alone:
            r["replay_only"] = alone[r["m"]]
    return rows


#: the wall-time slope (no timestamps): replays in the long submit against one
SLOPE_N = 16


class _Queue:
    """Waiting for a context's queue: a 16-byte copy into mapped-read staging, mapped as the
    context maps (``read_small``); the copy's source also takes two resolved timestamps."""

    def __init__(self, ctx) -> None:
        import wgpu

        self.ctx, dev = ctx, ctx._device
        self.src = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                     | wgpu.BufferUsage.COPY_SRC)
        self.stage = dev.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ
                                       | wgpu.BufferUsage.COPY_DST)

    def submit_wait(self, enc=None) -> tuple[bytes, int]:
        """Submit ``enc`` (or nothing but the copy) ending with the copy into staging, and
        wait for it: (the 16 bytes, wall ns of the submit and the wait)."""
        from backends.webnn.wgpu_impl.staging import read_small

        ctx = self.ctx
        enc = enc or ctx._device.create_command_encoder()
        enc.copy_buffer_to_buffer(self.src, 0, self.stage, 0, 16)
        cb = enc.finish()
        t0 = time.perf_counter_ns()
        ctx._submit([cb])
        raw = read_small(self.stage, 16, ctx.queue_counts, ctx._map_how)
        return raw, time.perf_counter_ns() - t0

    def destroy(self) -> None:
        self.src.destroy()
        self.stage.destroy()


def device_replay(ctx, s, trials: int, timestamps: bool = True, n: int = SLOPE_N) -> dict:
    """The deferred (or extension) way's replay alone, after the session's last ``accept``:
    its own launches (``Session.replay_launches``, the graph's pipelines and bindings, in
    place on the session's state: ``encode_replay``) in a submit of their own. Timed by
    GPU timestamps where the device has 'timestamp-query' (``timestamps``): a compute pass
    of one replay, begin to end, median of ``trials``; a trial whose interval is not
    positive or exceeds its own wall time is dropped. Else (or where every trial was
    dropped) by the wall-time slope of one replay against ``n`` in one pass, each submit
    and wait timed: (median t(n) - median t(1)) / (n - 1), submit and sync cancelling;
    below the slope's resolution (the spread of t(1) over n - 1) no time is given.
    Returns {ms (None below resolution), min_ms, method, trials, launches, runs (replays
    run, warm-ups included: the state was replayed that many times), and resolution_ms and
    reason where ms is None or the timestamps were not used}."""
    q = _Queue(ctx)
    s.begin_replay()
    out: dict = {"launches": len(s.replay_launches()), "trials": trials, "runs": 0}

    def run(k: int, tw: dict | None = None) -> tuple[bytes, int]:
        enc = ctx._device.create_command_encoder()
        s.encode_replay(enc, k, tw)
        if tw is not None:
            enc.resolve_query_set(tw["query_set"], 0, 2, q.src, 0)
        out["runs"] += k
        return q.submit_wait(enc)

    why = ""
    if not timestamps:
        why = "timestamps not asked for"
    elif "timestamp-query" not in ctx._device.features:
        why = "the device has no 'timestamp-query' (a context made without timing=True?)"
    else:
        qs = ctx._device.create_query_set(type="timestamp", count=2)
        tw = {"query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
        run(1, tw)  # warm
        good = []
        for _ in range(trials):
            raw, wall = run(1, tw)
            t = np.frombuffer(raw, np.uint64)
            gpu = int(t[1]) - int(t[0])
            if gpu <= 0:
                why = f"timestamps did not advance ({gpu} ns): below their resolution"
            elif gpu > wall * 1.01:
                why = f"timestamp interval {gpu} ns over the submit's wall time {wall} ns"
            else:
                good.append(gpu)
        qs.destroy()
        if good:
            q.destroy()
            out.update(ms=float(np.median(good)) / 1e6, min_ms=min(good) / 1e6,
                       method=f"GPU timestamps: a pass of one replay ({out['launches']} "
                              f"launches), begin to end, median of {len(good)} trials")
            if len(good) < trials:
                out["reason"] = f"{trials - len(good)} trials dropped: {why}"
            return out
    run(1)  # warm
    one, many = [], []
    for _ in range(trials):
        one.append(run(1)[1])
        many.append(run(n)[1])
    q.destroy()
    slope = (float(np.median(many)) - float(np.median(one))) / (n - 1) / 1e6
    res = (max(one) - min(one)) / (n - 1) / 1e6
    method = (f"wall-time slope: (t({n}) - t(1)) / {n - 1}, replays of {out['launches']} "
              f"launches in one pass, one submit and wait each, medians of {trials} trials")
    out.update(method=method, resolution_ms=res, min_ms=None)
    if why:
        out["reason"] = why
    if slope <= res:
        out["ms"] = None
        out["reason"] = (f"{why}; " if why else "") + (
            f"slope {slope * 1e3:.1f} us below its resolution {res * 1e3:.1f} us "
            "(the spread of t(1) over n - 1)")
    else:
        out["ms"] = slope
        best = (min(many) - min(one)) / (n - 1) / 1e6
        out["min_ms"] = best if best > 0 else None
    return out


def host_round_trip(ctx, sh, k: int, m: int, trials: int, rng, warm: int = 2) -> dict:
    """cpu_replay's replay alone (genai's ``ReplayStateUpdates``): after an untimed verify,
    ``accept(m)``'s read back (state and capsule), NumPy replay and write of the state
    (``Session.replay_state_updates``), then the write's staged copy submitted and waited
    for, so the state is back on the device. Median wall time of ``trials`` (each part's
    median in ``parts``: read, replay, write, land)."""
    from backends.webnn.rollback import Session

    s = Session(ctx, sh, k, "cpu_replay")
    q = _Queue(ctx)
    totals, parts = [], []
    for i in range(warm + trials):
        if s.position + 2 * k >= sh.capacity:
            s.reset()
        s.verify(random_draft(rng, sh, k))
        t0 = time.perf_counter()
        s.accept(m)
        t1 = time.perf_counter()
        ctx._staged.flush()
        q.submit_wait()
        t2 = time.perf_counter()
        if i >= warm:
            totals.append((t2 - t0) * 1e3)
            parts.append({**s.split, "land": (t2 - t1) * 1e3})
    q.destroy()
    s.graph.destroy()
    return {"ms": float(np.median(totals)), "min_ms": min(totals), "trials": trials,
            "parts": {p: float(np.median([d[p] for d in parts])) for p in parts[0]},
            "method": ("wall, alone: read back (state, capsule), NumPy replay, write, the "
                       f"write's copy submitted and waited for; median of {trials} trials")}


def replays_alone(ctx, sh, k: int, trials: int = 5, seed: int = 0,
                  timestamps: bool = True) -> dict[int, dict]:
    """Per acceptance 0 < m < K (K/2, as the step rows): the host round trip
    (``host_round_trip``) over the device replay (``device_replay``, the deferred way's;
    the extension way's, the same launches bound to its own buffers, beside it), each
    timed alone on ``ctx``: {k, m, host_round_trip_ms, host, device_replay_ms, device
    {deferred, extension}, method, speedup (host / device, None where the device replay is
    below resolution: ``reason``)}."""
    from backends.webnn.rollback import Session

    rng = np.random.default_rng(seed + 1)
    out = {}
    for m in sorted({k // 2} - {0, k}):
        dev = {}
        for way in ("deferred", "extension"):
            s = Session(ctx, sh, k, way)
            for _ in range(3):  # warm steps; the last one's capsule is replayed
                s.verify(random_draft(rng, sh, k))
                s.accept(m)
            dev[way] = device_replay(ctx, s, trials, timestamps)
            s.graph.destroy()
        host = host_round_trip(ctx, sh, k, m, trials, rng)
        d = dev["deferred"]["ms"]
        row = {"k": k, "m": m, "host_round_trip_ms": host["ms"], "host": host,
               "device_replay_ms": d, "device": dev,
               "method": f"device: {dev['deferred']['method']}; host: {host['method']}",
               "speedup": host["ms"] / d if d else None}
        if d is None:
            row["reason"] = (f"device replay below resolution "
                             f"({dev['deferred'].get('resolution_ms', 0) * 1e3:.1f} us): "
                             f"{dev['deferred'].get('reason', '')}")
        out[m] = row
    return out


def main(argv: list[str] | None = None) -> int:
    from backends.webnn import ml
    from backends.webnn.wgpu_impl.options import KernelOptions

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="hybrid-1b")
    p.add_argument("--k", type=int, nargs="+", default=[2, 4])
    p.add_argument("--capacity", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--slope", action="store_true",
                   help="time the device replay alone by wall-time slope, not timestamps")
    a = p.parse_args(argv)
    if any(not 1 <= k <= 8 for k in a.k):
        print(f"--k {a.k}: each must be in 1..8 (the capsule's capacity)", file=sys.stderr)
        return 2
    ctx = ml.create_context(state_support=True)
    # the replays alone on a context of their own with GPU timestamps (where the adapter
    # has them), so the step rows run on a context as before; there the replay keeps a
    # launch of its own (by default the verify's capture computes it: gdn_replay "fused")
    tctx = ml.create_context(state_support=True, timing=True,
                             options=KernelOptions(gdn_replay="launch"))
    sh = layer_of(a.preset, a.capacity)
    rows = [r for k in a.k for r in measure(ctx, sh, k, a.reps, alone_ctx=tctx,
                                            timestamps=not a.slope)]
    print(f"{'way':10} {'K':>2} {'m':>2}  {'kernel B':>10}  {'d2d B':>9}  {'h2d B':>8}  "
          f"{'d2h B':>8}  launches  {'ms':>8}  device replay speedup (cpu_replay ms / deferred ms)")
    for r in rows:
        b = r["bytes"]
        sp = r.get("device_replay_speedup")
        host = r.get("host_ms")
        tail = "" if sp is None else f"  {sp:.2f}x"
        if host:
            tail += (f"  (host: read {host['read']:.3f} replay {host['replay']:.3f} "
                     f"write {host['write']:.3f} ms)")
        print(f"{r['way']:10} {r['k']:>2} {r['m']:>2}  {b['kernel']:>10}  {b['d2d']:>9}  {b['h2d']:>8}  "
              f"{b['d2h']:>8}  {r['launches']:>3}+{r['copies']} cp  {r['ms']:8.3f}{tail}")
    for r in rows:
        ro = r.get("replay_only")
        if ro:
            h, dev = ro["host"]["parts"], ro["device"]
            tail = ", ".join(f"{w} {d['ms']:.4f} ms" if d["ms"] else f"{w} n/a"
                             for w, d in dev.items())
            if ro["speedup"] is None:
                sp = f"n/a ({ro['reason']})"
            else:
                sp = f"{ro['speedup']:.1f}x"
            how = "timestamps" if dev["deferred"]["method"].startswith("GPU") else "slope"
            print(f"replays alone, K={r['k']} m={r['m']}: host round trip "
                  f"{ro['host_round_trip_ms']:.3f} ms (read {h['read']:.3f} replay {h['replay']:.3f} "
                  f"write {h['write']:.3f} land {h['land']:.3f}), device replay ({how}, "
                  f"{dev['deferred']['launches']} launches) {tail}: device replay speedup {sp}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"preset": a.preset, "layer": sh.__dict__, "adapter": str(ctx._target),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
