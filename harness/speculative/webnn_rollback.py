"""Rollback on the proposal's stateful graph on the WebNN library (issue 31 items 3 and 5):
per way (``backends.webnn.rollback.WAYS``), K and acceptance m, what one speculative step
(verify of K tokens, then accepting m) moves, counted by the library's byte counters
(kernel bytes, device copies, host to device written, device to host read back), the
launches it issues, and its median wall time. Bytes and launches are the evidence; times
only as ratios between ways on one machine. ``cpu_replay`` (genai's ``ReplayStateUpdates``)
is timed with its read back, its NumPy replay and its write (each part's median also in
``host_ms``; the write's device copy is submitted before the next dispatch, so each step
carries the previous step's); ``device replay speedup`` = cpu_replay time / deferred time
at the same K and m (issue 31 item 5's target: >= 10 at hybrid-1b's shapes, at 0 < m < K);
``replay_only`` the same for the replays alone, each step less cpu_replay's m = K step (the
same capture verify with nothing to replay): the host round trip over the device replay.

``python -m harness.speculative.webnn_rollback --preset hybrid-1b --k 4 [--out FILE]``
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


def _draft(rng, sh, k: int) -> dict[str, np.ndarray]:
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


def measure(ctx, sh, k: int, reps: int = 5, seed: int = 0, warm: int = 2) -> list[dict]:
    """Rows {way, k, m, bytes (h2d, d2h, d2d, kernel), launches, copies, ms}; cpu_replay's
    rows add ``host_ms`` (median read / replay / write of a host replay, or None) and
    ``device_replay_speedup`` (its ms / deferred's ms at the same K and m)."""
    from backends.webnn.rollback import WAYS, Session

    rng = np.random.default_rng(seed)
    rows = []
    for way in WAYS:
        s = Session(ctx, sh, k, way)
        per = sum(1 for la in s.graph._plan.launches if hasattr(la, "kernel"))
        for _ in range(warm):  # untimed: every path of the way once (a CPU adapter's first
            for m in sorted({0, k // 2, k}):  # steps run ~2-5x slow)
                s.verify(_draft(rng, sh, k))
                s.accept(m)
            s.reset()
        for m in sorted({0, k // 2, k}):
            times, spent, splits = [], None, []
            for i in range(reps + 1):  # the first warms the pipelines
                if s.position + 2 * k >= sh.capacity:
                    s.reset()
                x = _draft(rng, sh, k)
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
        if r["way"] != "cpu_replay" or ("deferred", r["m"]) not in ms:
            continue
        r["device_replay_speedup"] = r["ms"] / ms[("deferred", r["m"])]
        if 0 < r["m"] < k:  # the replays alone, over cpu_replay's m = K step (the same
            # capture verify, no replay): a ratio of differences of medians
            base = ms[("cpu_replay", k)]
            dev = ms[("deferred", r["m"])] - base
            r["replay_only"] = {"host_round_trip_ms": r["ms"] - base, "device_replay_ms": dev,
                                "speedup": (r["ms"] - base) / dev if dev > 0 else None}
    return rows


def main(argv: list[str] | None = None) -> int:
    from backends.webnn import ml

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="hybrid-1b")
    p.add_argument("--k", type=int, nargs="+", default=[2, 4])
    p.add_argument("--capacity", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if any(not 1 <= k <= 8 for k in a.k):
        print(f"--k {a.k}: each must be in 1..8 (the capsule's capacity)", file=sys.stderr)
        return 2
    ctx = ml.create_context(state_support=True)
    sh = layer_of(a.preset, a.capacity)
    rows = [r for k in a.k for r in measure(ctx, sh, k, a.reps)]
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
            sp = "n/a" if ro["speedup"] is None else f"{ro['speedup']:.2f}x"
            print(f"replays alone, K={r['k']} m={r['m']}: host round trip {ro['host_round_trip_ms']:.3f} ms, "
                  f"device replay {ro['device_replay_ms']:.3f} ms: device replay speedup {sp}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"preset": a.preset, "layer": sh.__dict__, "adapter": str(ctx._target),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
