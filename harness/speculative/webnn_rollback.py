"""Rollback on the proposal's stateful graph on the WebNN library (issue 31 item 3): per way
(``backends.webnn.rollback.WAYS``), K and acceptance m, what one speculative step (verify
of K tokens, then accepting m) moves, counted by the library's byte counters, the launches
it issues, and its median wall time. Bytes and launches are the evidence; times only as
ratios between ways on one machine.

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


def measure(ctx, sh, k: int, reps: int = 5, seed: int = 0) -> list[dict]:
    """Rows {way, k, m, bytes (h2d, d2h, d2d, kernel), launches, ms}."""
    from backends.webnn.rollback import WAYS, Session

    rng = np.random.default_rng(seed)
    rows = []
    for way in WAYS:
        s = Session(ctx, sh, k, way)
        per = sum(1 for la in s.graph._plan.launches if hasattr(la, "kernel"))
        for m in sorted({0, k // 2, k}):
            times, spent = [], None
            for _ in range(reps + 1):  # the first warms the pipelines
                if s.position + 2 * k >= sh.capacity:
                    ctx.reset_kv_cache(s.graph)
                    s.position = 0
                x = _draft(rng, sh, k)
                before = ctx.counters.snapshot()
                t0 = time.perf_counter()
                s.verify(x)
                s.accept(m)
                times.append((time.perf_counter() - t0) * 1e3)
                spent = ctx.counters.since(before)
            dispatches = 1 + (way == "snapshot" and 0 < m < k)
            copies = int(way == "snapshot") * (2 if m < k else 1)  # snapshot (+ restore)
            rows.append({"way": way, "k": k, "m": m, "bytes": spent.as_dict(),
                         "launches": per * dispatches, "copies": copies,
                         "ms": float(np.median(times[1:]))})
        s.graph.destroy()
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
    for r in rows:
        b = r["bytes"]
        print(f"{r['way']:10} K={r['k']} m={r['m']}  kernel {b['kernel']:>10}  d2d {b['d2d']:>9}  "
              f"h2d {b['h2d']:>8}  d2h {b['d2h']:>7}  launches {r['launches']:>3}+{r['copies']} copies"
              f"  {r['ms']:.3f} ms")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"preset": a.preset, "layer": sh.__dict__, "adapter": str(ctx._target),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
