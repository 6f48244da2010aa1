"""Where a WebNN page's decode step spends host time: wall minus GPU, part by part.

Prints one JSON object: per preset × page (wgpu:stateful by default, on wgpu-native and
Dawn), the median wall and GPU time of the timed steps, their difference, and the page's
host-time breakdown (`host_breakdown_ms`, docs/measuring.md "Host time": writes, encoding,
submit, record ahead, the wait for the device, the copy out of mapped memory, Python
around them), and the CPU time of encoding one dispatch on its own (`encode_ms`); with
`--cprofile`, the functions the timed steps spent host time in (a second
run of the steps under cProfile, so the timed figures are not inflated by it).

    .venv/bin/python scripts/host_profile.py                                  # lavapipe
    .venv/bin/python scripts/host_profile.py --points llama-1b:512 --pages wgpu:stateful \
        --variant pass_calls=wgpu-py,map_wait=thread --variant map_wait=caller --variant '' \
        --steps 64 --cprofile 25 --out host.json                             # an A/B on a GPU
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import sys
import time
import traceback
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backends.base import registry  # noqa: E402
from backends.webnn.wgpu_impl.options import KernelOptions  # noqa: E402
from harness.calibrate import provenance  # noqa: E402
from harness.worker import host_breakdown  # noqa: E402
from model.errors import UserError  # noqa: E402
from model.workload import Workload, preset  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_bench import host_profile  # noqa: E402


def encode_ms(be: Any, reps: int) -> dict[str, float]:
    """Encoding one dispatch of the page's graph for the tensors it last bound, ``reps``
    times (command buffers dropped, never submitted): min and median ms, and the min per
    launch. CPU work of this thread only, so its min holds on a loaded machine where the
    steps' wall times do not."""
    from backends.webnn.wgpu_impl.dispatch import _bound_key

    ctx, g = be.context, be.converted.graph
    bound = g._last_bound
    key = (_bound_key(bound), g._parity)
    copy = ctx._read_copy_for(g, bound)
    times = []
    for _ in range(max(1, reps)):
        cbs: list[Any] = []
        t0 = time.perf_counter_ns()
        ctx._encode(g, bound, key, cbs.append, copy,  # as a recording ahead would
                    whole=ctx.record_ahead and not ctx._piecewise)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return {"min": round(min(times), 4), "median": round(float(np.median(times)), 4),
            "min_per_launch_us": round(1e3 * min(times) / len(g._plan.launches), 3)}


def profile_point(name: str, capacity: int, page: str, steps: int, warm_steps: int,
                  top: int, options: KernelOptions | None, encode_reps: int = 50
                  ) -> dict[str, Any]:
    """Time ``steps`` steps of ``page`` on preset ``name`` after ``warm_steps`` untimed
    ones (pipelines, bind groups and the first recording made; GPU clocks up)."""
    if capacity < warm_steps + 2 * steps + 1:
        raise ValueError(f"capacity {capacity} is too small for {warm_steps} warm-up and "
                         f"2 x {steps} steps")
    wl = Workload.build(preset(name))
    be = registry()[page](options=options)
    t0 = time.perf_counter()
    be.prepare(wl, capacity)
    prepare_s = time.perf_counter() - t0
    try:
        tok = 0
        for _ in range(warm_steps):
            be.step(tok % 100 + 1)
            tok += 1
        queue = be.context.queue_counts
        submits, maps = queue.submits, queue.maps
        wall, gpu, host = [], [], []
        kept = []  # each step's logits copied and kept, as the sweep's worker keeps them
        faults = 0
        for _ in range(steps):
            f1 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            t1 = time.perf_counter_ns()
            logits = be.step(tok % 100 + 1)
            wall.append((time.perf_counter_ns() - t1) / 1e6)
            faults += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f1
            kept.append(np.array(logits, np.float32, copy=True))
            tok += 1
            g = be.gpu_time_ms()
            if g is not None:
                gpu.append(g)
            host.append(be.host_breakdown_ms())
        res: dict[str, Any] = {
            "preset": name, "page": page, "capacity": capacity, "steps": steps,
            "prepare_s": round(prepare_s, 2),
            "launches": len(be.converted.graph._plan.launches),
            "submits_per_step": (queue.submits - submits) / steps,
            "maps_per_step": (queue.maps - maps) / steps,
            # minor page faults of the stepping thread inside step() (fresh host memory
            # touched on the step's path): docs/measuring.md "Host time"
            "minor_faults_per_step": faults / steps,
            "wall_ms": round(float(np.median(wall)), 4),
            "host_breakdown_ms": host_breakdown(host, wall, gpu),
            "logits_finite": bool(np.isfinite(logits).all()),
            "options": be.context.options.as_dict(),
            "engine": be.context.engine_info,
        }
        if gpu:
            res["gpu_ms"] = round(float(np.median(gpu)), 4)
        res["encode_ms"] = encode_ms(be, encode_reps)
        if top:
            prof = cProfile.Profile()
            for _ in range(steps):
                prof.enable()
                be.step(tok % 100 + 1)
                prof.disable()
                tok += 1
                be.gpu_time_ms()
            res["cprofile"] = host_profile(prof, steps, top)
        return res
    finally:
        be.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="tiny:512,small:512",
                    help="preset:capacity,... (capacity default 512)")
    ap.add_argument("--pages", default="wgpu:stateful,dawn:stateful",
                    help="WebNN pages to time, comma list (wgpu:*, dawn:*)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warm-steps", type=int, default=8)
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="also cProfile the steps and list the top N functions (0: no)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a KernelOptions knob for every run (e.g. record_ahead=off); repeatable")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE,...",
                    help="run every point again with these knobs over --option's (an A/B: "
                         "'' is --option's alone); repeatable; default: one run")
    ap.add_argument("--encode-reps", type=int, default=50,
                    help="times one dispatch is encoded on its own (encode_ms)")
    ap.add_argument("--out", default="", help="also write the JSON here, after every point")
    a = ap.parse_args()
    try:
        base = KernelOptions.parse(a.option)
        variants = [KernelOptions.parse([kv for kv in v.split(",") if kv], base)
                    for v in (a.variant or [""])]
        points = [(n, int(c or 512)) for n, _, c in (p.partition(":") for p in a.points.split(","))]
        pages = a.pages.split(",")
        unknown = [p for p in pages if p not in registry()]
        if unknown:
            raise ValueError(f"unknown page(s) {', '.join(unknown)}")
        for n, _ in points:
            preset(n)
    except (ValueError, KeyError, UserError) as exc:
        print(f"host_profile: {exc}", file=sys.stderr)
        sys.exit(2)
    out: list[dict] = []
    prov = {**provenance(), "argv": sys.argv[1:]}
    for name, cap in points:
        for page in pages:
            for options in variants:
                try:
                    r = profile_point(name, cap, page, a.steps, a.warm_steps, a.cprofile,
                                      options, a.encode_reps)
                except Exception as exc:  # noqa: BLE001 - record and go on
                    r = {"preset": name, "page": page, "capacity": cap,
                         "options": options.as_dict(), "error": repr(exc),
                         "trace": traceback.format_exc()[-800:]}
                print(json.dumps({k: v for k, v in r.items() if k != "cprofile"}),
                      file=sys.stderr, flush=True)
                out.append(r)
                if a.out:  # a timeout keeps the points done
                    with open(a.out, "w") as f:
                        json.dump({"points": out, "provenance": prov}, f, indent=1)
    for r in out:  # one line a point, last, for a reader of the log's tail
        h = r.get("host_breakdown_ms", {})
        knobs = ",".join(f"{k}={v}" for k, v in r.get("options", {}).items() if v is not None)
        parts = " ".join(f"{k} {h[k]:.3f}" for k in ("write", "encode", "submit", "record_ahead",
                                                      "dispatch_other", "wait", "copy",
                                                      "read_other", "after") if k in h)
        print(f"{r['preset']}:{r['capacity']} {r['page']} [{knobs or 'defaults'}] "
              + (f"error {r['error']}" if "error" in r else
                 f"wall {r['wall_ms']:.3f} GPU {r.get('gpu_ms', float('nan')):.3f} "
                 f"wall-GPU {h.get('wall_minus_gpu', float('nan')):.3f} | {parts} | encode "
                 f"{r['encode_ms']['min_per_launch_us']:.2f} us/launch"), file=sys.stderr)
    print(json.dumps({"points": out, "provenance": prov}, indent=1))


if __name__ == "__main__":
    main()
