"""The launches of one decode step, listed and counted per layer, for a preset or a model file.

Why: issue 32 asks for five launches a layer or fewer, and issue 30 for the real export to reach
the preset's path; both need the launch list of a step, by kernel and by the op that emitted
it, on the GPU's plan, without a GPU. The page's own ``prepare`` runs on a context without a
device (as ``scripts/snapshot_kernels.py`` does) and the captured graph is compiled for a
target as a real adapter reports it (``--target nvidia``: the H200's plan), so the list is
the one the GPU would run.

A layer is the run of launches between two layers' attention launches (a decoder whose
layers all attend, each the same launches); the launches left when every layer's are taken
out (the embedding, the positions, the first norm, the head) are counted apart. Usage::

    .venv/bin/python scripts/launch_census.py --preset tiny+q4f16 --attention-layers 2
    .venv/bin/python scripts/launch_census.py --model tests/models/genai-q4f16-llama/model.onnx
    .venv/bin/python scripts/launch_census.py --model M --option q4_norms=off --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: the kernel a layer run starts at (the attention pass of each layer)
LAYER_START = "attention_"


def targets() -> dict[str, Any]:
    from backends.webnn.wgpu_impl.target import Target

    return {
        "nvidia": Target(cpu=False, subgroup=32, vendor="NVIDIA", max_storage=1 << 20,
                         shared_bytes=49152, f16=True, device_barrier=True),
        "llvmpipe": Target(cpu=True, subgroup=None, vendor="llvmpipe", max_storage=48,
                           shared_bytes=32768, f16=True, device_barrier=True),
    }


class _Captured(Exception):
    """Raised from the device-less context's build with the graph it was handed."""

    def __init__(self, graph: Any, stateful: bool) -> None:
        super().__init__("captured")
        self.graph, self.stateful = graph, stateful


def capture(mode: str, workload: Any, capacity: int, onnx_path: str | None,
            options: Any, tokens: int = 1) -> tuple[Any, bool]:
    """(the ir.Graph the page builds, whether stateful): its ``prepare`` on a context that
    compiles nothing; ``tokens``: the K-token graph (a verify's)."""
    from backends import pages, webnn
    from backends.webnn._classes import MLContext
    from backends.webnn.engines import engine as engine_named
    from backends.webnn.wgpu_impl.context import WgpuContext

    cls = next((c for c in vars(pages).values()
                if isinstance(c, type) and getattr(c, "name", None) == mode), None)
    if cls is None:
        raise SystemExit(f"launch_census: no page {mode!r}")

    class Bare(WgpuContext):
        def __init__(self, *, state_support: bool = True, timing: bool = False,
                     power_preference: str = "high-performance", options: Any = None,
                     engine: str = "wgpu") -> None:
            MLContext.__init__(self)
            self.engine = engine_named(engine)
            self.options = options
            self.state_support = state_support
            self._f16 = True
            self._max_binding = 1 << 27
            self._max_buffer = 2147483647
            self._target = targets()["llvmpipe"]
            self.features_lacking: list[str] = []
            self._timing_reason = ""
            self._adapter = type("Adapter", (), {"info": {"device": "census",
                                                          "backend_type": "none"}})()

        def _build(self, graph: Any, use_stateful: bool) -> Any:
            raise _Captured(graph, bool(use_stateful) and self.state_support)

    saved = webnn.ml.create_context
    webnn.ml.create_context = lambda **kw: Bare(**kw)
    try:
        page = cls(onnx_path=onnx_path, options=options)
        page.tokens_per_step = tokens
        if tokens > 1 and hasattr(page, "speculative"):  # the graph a verify runs (deferred)
            page.speculative = True
        page.prepare(workload, capacity)
    except _Captured as c:
        return c.graph, c.stateful
    finally:
        webnn.ml.create_context = saved
    raise SystemExit("launch_census: the page prepared without building a graph")


def census(graph: Any, stateful: bool, target: Any, options: Any) -> list[dict]:
    """Every launch of the step: its kernel, grid, bytes and the op node that emitted it."""
    from backends.webnn.wgpu_impl import compiler, lowering
    from backends.webnn.wgpu_impl.plan import KernelLaunch

    emitted: list[tuple[int, Any]] = []  # (launches before the node's, node)
    real = lowering.lowering_of

    def traced(plan: Any, node: Any) -> Any:
        fn = real(plan, node)

        def run(site: Any) -> None:
            emitted.append((len(plan.launches), node))
            fn(site)
        return run

    lowering.lowering_of = traced
    try:
        plan = compiler.compile_graph(graph, stateful, 1 << 27, target=target, options=options)
    finally:
        lowering.lowering_of = real
    origin: dict[int, Any] = {}
    for start, node in emitted:
        origin.setdefault(start, node)
    out, node = [], None
    for i, la in enumerate(plan.launches):
        node = origin.get(i, node if i not in origin else origin[i])
        kernel = isinstance(la, KernelLaunch)
        out.append({"i": i, "kernel": la.kernel.name if kernel else "copy_buffer_to_buffer",
                    "groups": list(la.kernel.groups) if kernel else None,
                    "bytes": la.kernel.bytes if kernel else 2 * la.nbytes,
                    "op": f"{node.op} {list(node.shape)}" if node is not None else "check"})
    return out


def layers(launches: list[dict]) -> tuple[list[dict], int, Counter]:
    """(one layer's launches, the layers, the launches outside them by kernel): the layers'
    attention launches are one period apart, so a layer is the period between the last two
    (listed from its attention launch on); what is left over when every layer's multiset of
    kernels is taken out of the step's (the embedding, positions, first norm, head) is
    outside them. No two attention launches: no layers, everything outside."""
    starts = [la["i"] for la in launches if la["kernel"].startswith(LAYER_START)
              and not la["kernel"].startswith("attention_combine")]
    every = Counter(la["kernel"] for la in launches)
    if len(starts) < 2:
        return [], 0, every
    gaps = {b - a for a, b in zip(starts, starts[1:], strict=False)}
    if len(gaps) != 1:
        raise SystemExit(f"launch_census: layers of {sorted(gaps)} launches: not one period")
    one = launches[starts[-2]:starts[-1]]
    per = Counter(la["kernel"] for la in one)
    rest = every - Counter({k: v * len(starts) for k, v in per.items()})
    return one, len(starts), rest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a preset name (model/workload.py)")
    src.add_argument("--model", help="an ONNX decoder (run as `statebench run --model` runs it)")
    ap.add_argument("--attention-layers", type=int, default=0,
                    help="the preset with this many layers, every one an attention layer "
                         "(llama-1b's layer on a tiny preset's shapes)")
    ap.add_argument("--mode", default="wgpu:stateful")
    ap.add_argument("--capacity", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1,
                    help="new tokens a step: the K-token graph of a speculative verify")
    ap.add_argument("--target", default="nvidia", choices=sorted(targets()))
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", action="store_true", help="the list and counts as JSON")
    args = ap.parse_args(argv)

    from backends.webnn.wgpu_impl.options import KernelOptions
    from model.errors import UserError
    from model.workload import ATTENTION, Workload, preset

    try:
        options = KernelOptions.parse(args.option)
        workload = None
        if args.preset:
            cfg = preset(args.preset)
            if args.attention_layers:
                cfg = replace(cfg, layers=(ATTENTION,) * args.attention_layers)
            workload = Workload.build(cfg)
    except UserError as exc:
        print(f"launch_census: {exc}", file=sys.stderr)
        return 2
    graph, stateful = capture(args.mode, workload, args.capacity, args.model, options,
                              args.tokens)
    launches = census(graph, stateful, targets()[args.target], options)
    one, count, rest = layers(launches)
    if args.json:
        print(json.dumps({"launches": launches, "layer": [la["kernel"] for la in one],
                          "layers": count, "outside_layers": dict(rest),
                          "total": len(launches)}, indent=1))
        return 0
    for la in launches:
        print(f"{la['i']:4d} {la['kernel']:32s} {str(la['groups']):16s} {la['bytes']:>10d}  "
              f"{la['op']}")
    print(f"total {len(launches)} launches: {count} layers of {len(one)}, "
          f"{sum(rest.values())} outside them ({', '.join(f'{k} {v}' for k, v in rest.items())})")
    if one:
        print("one layer: " + ", ".join(la["kernel"] for la in one))
    return 0


if __name__ == "__main__":
    sys.exit(main())
