"""What each kind of launch of a decode step costs on the GPU, without timestamps between
launches (``kernel_bench.py --launch-costs``), and what an empty launch costs.

Why: the in-pass profile (``kernel_bench.profile_launches``) writes a timestamp after every
launch, and those timestamps add several µs to each launch (docs/measuring.md, "GPU time"): a
small launch's in-pass share is mostly the timestamp. Here the step runs as one pass with a
timestamp only at its two ends, as the page runs it, and each kind of launch (a kernel at one
grid) is measured by what the step's GPU time loses when its launches are left out (``drop``: what
the step would save were they free, their barriers included) and gains when each is
dispatched twice (``twice``: a second run of the same launch, its weights still in L2). The
left-out or doubled launches compute wrong values: only the time is read, and the page is
closed after. An empty kernel dispatched N times in one pass (``empty_launch_cost``) gives a
launch's fixed cost: the slope over N, at a few grid sizes, each launch bound to one
read-write buffer so the barriers between launches are those of the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: launches of the empty kernel a pass, the slope's two ends
EMPTY_COUNTS = (8, 104)
#: the empty kernel's grids: one workgroup, a small product's, a large product's
EMPTY_GRIDS = (1, 128, 1024)

_EMPTY_WGSL = """
@group(0) @binding(0) var<storage, read_write> flag: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x == 0xffffffffu) { flag[0] = 1u; }
}
"""


def launch_items(ctx: Any, g: Any, bound: dict) -> list[tuple]:
    """(launch, pipeline, bind group) for each kernel launch of graph ``g``, or (launch,
    source buffer, destination buffer) for a buffer copy: the step as the page binds it.
    Uses the context's internals."""
    from backends.webnn.wgpu_impl.plan import CopyLaunch, KernelLaunch

    items = []
    for i, la in enumerate(g._plan.launches):
        if isinstance(la, KernelLaunch):
            pipe, layout, bg = g._items[i]
            if bg is None:
                bg = ctx._bind_group(g, layout, la.slots, bound, g._parity)
            items.append((la, pipe, bg))
        elif isinstance(la, CopyLaunch):
            items.append((la, ctx._resolve(g, la.src, bound, g._parity),
                          ctx._resolve(g, la.dst, bound, g._parity)))
    return items


def group_key(la: Any) -> str:
    """A kind of launch: its kernel's name and grid (one kernel's launch shapes apart)."""
    return f"{la.kernel.name} {la.kernel.groups}"


class PassTimer:
    """Passes of dispatches, each timed by timestamps at its two ends only, many passes in
    one submit (the GPU kept busy between them, so its clocks stay up)."""

    def __init__(self, dev: Any, passes: int) -> None:
        import wgpu

        self.dev, self.n = dev, passes
        self.qs = dev.create_query_set(type="timestamp", count=2 * passes)
        self.qb = dev.create_buffer(size=16 * passes, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                    | wgpu.BufferUsage.COPY_SRC)

    def run(self, passes: Sequence[Sequence[tuple[Any, Any, tuple]]]) -> np.ndarray:
        """GPU ms of each pass, each a list of (pipeline, bind group, grid) dispatches."""
        assert len(passes) <= self.n
        enc = self.dev.create_command_encoder()
        for j, dispatches in enumerate(passes):
            cp = enc.begin_compute_pass(timestamp_writes={
                "query_set": self.qs, "beginning_of_pass_write_index": 2 * j,
                "end_of_pass_write_index": 2 * j + 1})
            last = None
            for pipe, bg, grid in dispatches:
                if pipe is not last:
                    cp.set_pipeline(pipe)
                    last = pipe
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(*grid)
            cp.end()
        n = 2 * len(passes)
        enc.resolve_query_set(self.qs, 0, n, self.qb, 0)
        self.dev.queue.submit([enc.finish()])
        t = np.frombuffer(self.dev.queue.read_buffer(self.qb, 0, 8 * n), np.uint64)
        t = t.astype(np.int64).reshape(-1, 2)
        return (t[:, 1] - t[:, 0]) / 1e6


def _dispatches(items: list[tuple], repeat: Callable[[Any], int]) -> list[tuple]:
    """The step's dispatches, launch ``la`` dispatched ``repeat(la)`` times in place."""
    return [(pipe, bg, la.kernel.groups) for la, pipe, bg in items for _ in range(repeat(la))]


def step_launch_costs(ctx: Any, g: Any, bound: dict, rounds: int = 24) -> dict:
    """Per kind of launch of the step (``group_key``): its count, the whole step's GPU ms
    (``step_ms``, one pass, no timestamps within), and the median of what the step saves
    with those launches left out (``drop_ms``) and costs more with each dispatched twice
    (``twice_ms``), each against a step timed beside it in the same submit; per launch
    (``drop_us_each``, ``twice_us_each``). The step's kinds are sorted by what dropping
    them saves."""
    from backends.webnn.wgpu_impl.plan import CopyLaunch

    items = launch_items(ctx, g, bound)
    if any(isinstance(it[0], CopyLaunch) for it in items):
        raise ValueError("launch costs time kernel launches in one pass: this plan has "
                         "buffer copies (cache_copy=buffer); use --profile")
    keys = sorted({group_key(la) for la, _, _ in items})
    count = {k: sum(group_key(la) == k for la, _, _ in items) for k in keys}
    base = _dispatches(items, lambda la: 1)
    variants = {(k, how): _dispatches(items, lambda la, k=k, n=n: n if group_key(la) == k else 1)
                for k in keys for how, n in (("drop", 0), ("twice", 2))}
    per_round = [base] + [p for v in variants.values() for p in (v, base)]
    timer = PassTimer(ctx._device, len(per_round))
    timer.run(per_round)  # pipelines warm, clocks up
    samples = np.stack([timer.run(per_round) for _ in range(rounds)])  # (rounds, passes)
    step = samples[:, 0]
    out: dict[str, Any] = {"_method": "one pass a step, timestamps at its ends; a kind of "
                                      "launch left out or doubled, against the step beside it",
                           "_rounds": rounds, "step_ms": round(float(np.median(step)), 4),
                           "step_ms_min": round(float(np.min(step)), 4), "kinds": {}}
    for j, (k, how) in enumerate(variants):
        var, ref = samples[:, 1 + 2 * j], samples[:, 2 + 2 * j]
        delta = float(np.median(ref - var if how == "drop" else var - ref))
        e = out["kinds"].setdefault(k, {"n": count[k]})
        e[f"{how}_ms"] = round(delta, 4)
        e[f"{how}_us_each"] = round(1e3 * delta / count[k], 2)
    out["kinds"] = dict(sorted(out["kinds"].items(), key=lambda kv: -kv[1]["drop_ms"]))
    out["drop_sum_ms"] = round(sum(e["drop_ms"] for e in out["kinds"].values()), 4)
    grids = {group_key(la): (int(np.prod(la.kernel.groups)), int(la.kernel.bytes))
             for la, _, _ in items}
    out["read_twins"] = read_twin_costs(ctx._device, grids, rounds)
    return out


def empty_launch_cost(dev: Any, counts: Sequence[int] = EMPTY_COUNTS,
                      grids: Sequence[int] = EMPTY_GRIDS, rounds: int = 24) -> dict:
    """A launch's fixed cost: GPU ms of passes of ``counts`` empty launches (each bound to
    one read-write buffer, so each waits for the last, as the step's do) at each grid of
    ``grids`` workgroups of 256; the slope in µs a launch."""
    import wgpu

    buf = dev.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE)
    layout = dev.create_bind_group_layout(entries=[{
        "binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
        "buffer": {"type": wgpu.BufferBindingType.storage}}])
    pipe = dev.create_compute_pipeline(
        layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
        compute={"module": dev.create_shader_module(code=_EMPTY_WGSL), "entry_point": "main"})
    bg = dev.create_bind_group(layout=layout, entries=[
        {"binding": 0, "resource": {"buffer": buf, "offset": 0, "size": 16}}])
    passes = [[(pipe, bg, (x, 1, 1))] * n for x in grids for n in counts]
    timer = PassTimer(dev, len(passes))
    timer.run(passes)
    med = np.median(np.stack([timer.run(passes) for _ in range(rounds)]), axis=0)
    out: dict[str, Any] = {"counts": list(counts), "_rounds": rounds}
    lo, hi = counts[0], counts[-1]
    for i, x in enumerate(grids):
        ms = med[i * len(counts):(i + 1) * len(counts)]
        out[f"grid {x}"] = {"pass_ms": [round(float(v), 4) for v in ms],
                            "us_a_launch": round(1e3 * float(ms[-1] - ms[0]) / (hi - lo), 3)}
    return out


#: kinds of launch whose bytes a read twin streams: from (smaller: bound by the launch) to
#: (larger: the LM head, beyond one binding of the twins' buffer)
TWIN_MIN_BYTES, TWIN_MAX_BYTES = 32 << 10, 40 << 20
#: launches of a twin a timed pass, each on its own region of the buffer
TWIN_LAUNCHES = 4
#: the twins' extra grids: one and two workgroups of 256 a multiprocessor of an H100 (132)
TWIN_GRIDS = (132, 264)
#: 16-byte loads an invocation issues before it uses any (more: a loop of such batches)
TWIN_BATCH = 16


def _twin_wgsl(words: int, threads: int) -> str:
    """WGSL: ``threads`` invocations of 256 a workgroup read ``words`` 16-byte words of
    ``src`` (coalesced: load i of invocation t is word i · threads + t), each batch of up
    to ``TWIN_BATCH`` loads issued before any is used, xor-ed into one value that is
    written only if it is a value no random word reaches (so nothing is written)."""
    per = -(-words // threads)
    batch = min(per, TWIN_BATCH)
    rounds = -(-per // batch)
    loads = "".join(f"    let w{i} = src[min(base + {i * threads}u, {words - 1}u)];\n"
                    for i in range(batch))
    xor = " ^ ".join(f"w{i}" for i in range(batch))
    return f"""
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> flag: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
  var x = vec4<u32>(0u);
  for (var r = 0u; r < {rounds}u; r = r + 1u) {{
    let base = r * {batch * threads}u + g.x;
{loads}    x = x ^ {xor};
  }}
  if (all(x == vec4<u32>(0x9e3779b9u))) {{ flag[0] = x.x; }}
}}
"""


def read_twin_costs(dev: Any, kinds: dict[str, tuple[int, int]], rounds: int = 24) -> dict:
    """What a launch that only reads costs, for each kind of launch ``kinds`` (key: its
    workgroups, the bytes it moves): a pure-read kernel at the kind's grid and at
    ``TWIN_GRIDS``, streaming the kind's bytes from DRAM. Why: whether a product is bound
    by its bytes at its grid (its twin as slow as it) or by its own work (the twin much
    faster). A timed pass is ``TWIN_LAUNCHES`` twins on distinct regions of a buffer, each
    waiting for the last as the step's do, after an untimed pass that reads 64 MiB
    elsewhere (the regions not left in L2); µs a launch and the bytes' TB/s."""
    import wgpu

    todo = {k: v for k, v in kinds.items() if TWIN_MIN_BYTES <= v[1] <= TWIN_MAX_BYTES and v[0] <= 65535}
    if not todo:
        return {}
    region = -(-max(b for _, b in todo.values()) // 256) * 256
    flush = 64 << 20
    size = TWIN_LAUNCHES * region + flush
    src = dev.create_buffer(size=size, usage=wgpu.BufferUsage.STORAGE)
    flag = dev.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE)
    layout = dev.create_bind_group_layout(entries=[
        {"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
         "buffer": {"type": wgpu.BufferBindingType.read_only_storage}},
        {"binding": 1, "visibility": wgpu.ShaderStage.COMPUTE,
         "buffer": {"type": wgpu.BufferBindingType.storage}}])
    playout = dev.create_pipeline_layout(bind_group_layouts=[layout])

    def bind(offset: int, nbytes: int) -> Any:
        return dev.create_bind_group(layout=layout, entries=[
            {"binding": 0, "resource": {"buffer": src, "offset": offset, "size": nbytes}},
            {"binding": 1, "resource": {"buffer": flag, "offset": 0, "size": 16}}])

    def pipe(words: int, groups: int) -> Any:
        return dev.create_compute_pipeline(layout=playout, compute={
            "module": dev.create_shader_module(code=_twin_wgsl(words, 256 * groups)),
            "entry_point": "main"})

    flush_words = flush // 16
    flush_pass = [(pipe(flush_words, 1024), bind(TWIN_LAUNCHES * region, flush), (1024, 1, 1))]
    cases = []
    for key, (groups, nbytes) in todo.items():
        words = -(-nbytes // 16)
        binds = [bind(i * region, 16 * words) for i in range(TWIN_LAUNCHES)]
        for grid in dict.fromkeys((groups, *TWIN_GRIDS)):
            p = pipe(words, grid)
            cases.append((key, grid, nbytes, [(p, b, (grid, 1, 1)) for b in binds]))
    passes = [x for _, _, _, d in cases for x in (flush_pass, d)]
    timer = PassTimer(dev, len(passes))
    timer.run(passes)
    med = np.median(np.stack([timer.run(passes) for _ in range(rounds)]), axis=0)[1::2]
    out: dict[str, Any] = {"_method": f"{TWIN_LAUNCHES} pure-read launches a pass on distinct "
                                      "regions, after a 64 MiB read elsewhere",
                           "_rounds": rounds, "kinds": {}}
    for (key, grid, nbytes, _), ms in zip(cases, med, strict=True):
        us = 1e3 * float(ms) / TWIN_LAUNCHES
        e = out["kinds"].setdefault(key, {"bytes": nbytes, "grid": todo[key][0]})
        e[f"us_at_{grid}"] = round(us, 2)
        e[f"TBps_at_{grid}"] = round(nbytes / us / 1e6, 3)
    return out
