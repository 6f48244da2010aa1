"""Snapshot what the exporter writes and what the WebNN compiler emits, to diff two trees.

A refactor that claims "WGSL and plans byte-identical" (issue 28) is checked by running this
in the tree before and the tree after and diffing the two files (``--diff A B``). For every
preset graph (both flavours' ONNX bytes and weights files) and every wgpu page mode
(stateless, reuse, stateful, fallback), the graph is converted exactly as ``backends.pages``
converts it (``_Page.prepare`` itself runs, on a context without a device) and compiled for a
few targets (llvmpipe as this box reports it, an NVIDIA GPU as the H200 reports it, a GPU
without subgroups or 'shader-f16'), storage binding limits (the device's and a small one, so
the split paths run) and kernel options; per plan it records every launch's WGSL (as handed to
the device, ``module_source``), bindings, grid, bytes and slots (temp/const ids renumbered by
first use: ids are process-wide serials), the constants' bytes, temps, pairs and check.

Usage: a worktree of each commit (``git worktree add /tmp/old <commit>``), this script run
on each tree's python path (it adapts to ``compile_graph``'s signature before and after
2f39e6f), a cache of each tree's own (a shared one hands the second tree the first's
exports)::

    STATEBENCH_CACHE=/tmp/c-old PYTHONPATH=/tmp/old .venv/bin/python scripts/snapshot_kernels.py old.json.gz
    STATEBENCH_CACHE=/tmp/c-new PYTHONPATH=/tmp/new .venv/bin/python scripts/snapshot_kernels.py new.json.gz
    .venv/bin/python scripts/snapshot_kernels.py --diff old.json.gz new.json.gz

The default sets take about 25 minutes a tree on two cores (``--quick``: a few); the two
trees can run at once. A difference is printed with its first differing launch; a build one
tree refuses is recorded as its error, so a new refusal shows as a difference too.

``--sets``: presets (tiny, small and their variants), models (tests/models through the
converter); ``--quick``: tiny and one test model. No GPU is needed: the compiler is a pure
function of the graph, target, limit and options (the llvmpipe plans equal those a real
lavapipe context compiles, checked when this was written).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

MODES = ("wgpu:stateless", "wgpu:reuse", "wgpu:stateful", "wgpu:fallback")
SUFFIXES = ("", "+f16", "+q4", "+q4f16", "+f16kv", "+f16+f16kv", "+q4+f16kv")
CAPACITIES = (16, 64, 4096)
#: where the option variants are compiled (each on the GPU target, the device's limit)
OPTION_CAPACITY = 64
SMALL_BINDING = 1 << 14
#: a limit the caches of SPLIT_CAPACITIES pass but their rows do not: the splits succeed
MID_BINDING = 1 << 17
OPTION_VARIANTS = (
    "attention=flash1", "attention=unfused", "attention=generic", "attention=lanes",
    "attention=lanes1_u2", "attention_splits=4", "gemv=cols", "gemv=legacy", "gemv=rows16_sh",
    "gemv=rows_w", "gemv_prologue=off", "gemv_prologue=full", "gemv_prologue=vector",
    "q4_prologue=vector", "q4_prologue=full", "q4_epilogue=off", "q4_gemv=fused",
    "q4_gemv=multi", "q4_gemv=multi2_u2_h", "q4_gemv=wide2_h", "q4_gemv=quad_h",
    "q4_gemv=generic", "gdn=generic", "gdn=fused_sh_norms", "cache_copy=identity",
    "cache_copy=buffer", "gemv_weights=f32", "gemv_weights=f16", "f16_loads=vec4",
    "row_vector=loop", "row_writes=separate",
)
#: compiled under the small binding limit too: element-wise kernels over whole caches, which
#: split into row ranges past the limit (2c9f8b4)
SPLIT_VARIANTS = ("cache_copy=identity", "attention=generic", "attention=unfused", "gdn=generic")
SPLIT_CAPACITIES = (64, 4096)


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:20]


def _targets() -> dict[str, Any]:
    from backends.webnn.wgpu_impl.target import Target

    return {
        "llvmpipe": Target(cpu=True, subgroup=None, vendor="llvmpipe", max_storage=48,
                           shared_bytes=32768, f16=True),
        "nvidia": Target(cpu=False, subgroup=32, vendor="NVIDIA", max_storage=1 << 20,
                         shared_bytes=49152, f16=True),
        "gpu-plain": Target(cpu=False, subgroup=None, vendor="", max_storage=8,
                            shared_bytes=16384, f16=False),
    }


class _Canon:
    """Temp and const slots renumbered in order of first use (their keys hold serials)."""

    def __init__(self) -> None:
        self.seen: dict[tuple, int] = {}
        self.count = {"temp": 0, "const": 0}

    def __call__(self, slot: tuple) -> list:
        if slot[0] == "range":
            return ["range", self(slot[1]), *slot[2:]]
        if slot[0] in ("temp", "const"):
            n = self.seen.get(slot)
            if n is None:
                n = self.seen[slot] = self.count[slot[0]]
                self.count[slot[0]] += 1
            tags = [x for x in (slot[1] if isinstance(slot[1], tuple) else ()) if isinstance(x, str)]
            return [slot[0], n, *tags]
        return [str(x) for x in slot]


def _node_desc(o: Any) -> list:
    """dtype, shape and op of an operand (before: MLOperand's fields; after: ir.Node)."""
    if o is None:
        return []
    dt = getattr(o, "dtype", None) or o._dtype
    shape = getattr(o, "shape", None)
    shape = o._shape if shape is None or callable(shape) else shape
    op = getattr(o, "op", None)
    op = getattr(o, "_op", "") if op is None or callable(op) else op
    return [dt.name, list(shape), op]


_HASHED: dict[str, tuple[str, str]] = {}  # kernel WGSL -> (its module's hash, the module)


def describe_plan(plan: Any, source: Any) -> tuple[dict, dict[str, str]]:
    """A plan as JSON-ready lists (WGSL as hashes) and the WGSL sources by hash."""
    canon = _Canon()
    launches, sources = [], {}
    for la in plan.launches:
        if type(la).__name__ == "KernelLaunch":
            k = la.kernel
            if k.wgsl not in _HASHED:
                text = source(k.wgsl)
                _HASHED[k.wgsl] = (_sha(text), text)
            h, text = _HASHED[k.wgsl]
            sources[h] = text
            launches.append(["kernel", k.name, h, list(k.bindings), list(k.groups), k.bytes,
                             [canon(s) for s in la.slots]])
        else:
            launches.append(["copy", canon(la.src), canon(la.dst), la.nbytes])
    consts = []
    for slot in sorted(plan.consts, key=lambda s: canon(s)[1]):
        arr = plan.consts[slot]
        data = np.ascontiguousarray(arr.make() if type(arr).__name__ == "Deferred" else arr)
        consts.append([canon(slot), str(data.dtype), list(data.shape), _sha(data.tobytes())])
    temps = sorted([canon(s), w] for s, w in plan.temps.items())
    pairs = [[pp.index, pp.pair.input, pp.pair.output, pp.append, pp.alias_input, pp.in_place,
              _node_desc(pp.past), _node_desc(pp.writer)] for pp in plan.pairs]
    desc = {"launches": launches, "consts": consts, "temps": temps, "pairs": pairs,
            "has_check": plan.has_check}
    desc["hash"] = _sha(json.dumps(desc, sort_keys=True))
    return desc, sources


class _Captured(Exception):
    """Raised from ``_build`` once the plans are recorded: nothing is uploaded."""


def _snap_context(record: dict, sources: dict, variants: list[tuple[str, str, int, Any]]):
    """A WgpuContext without a device whose ``_build`` compiles ``variants`` and records them."""
    from backends.webnn._classes import MLContext
    from backends.webnn.engines import engine as engine_named
    from backends.webnn.kernels.common import module_source
    from backends.webnn.wgpu_impl import compiler
    from backends.webnn.wgpu_impl.context import WgpuContext
    from backends.webnn.wgpu_impl.options import KernelOptions

    targets = _targets()

    class SnapContext(WgpuContext):
        def __init__(self, *, state_support: bool = True, timing: bool = False,
                     power_preference: str = "high-performance",
                     options: KernelOptions | None = None, engine: str = "wgpu") -> None:
            MLContext.__init__(self)
            self.engine = engine_named(engine)
            self.options = options or KernelOptions()
            self.state_support = state_support
            self._f16 = True
            self._max_binding = 1 << 27
            self._max_buffer = 2147483647
            self._target = targets["llvmpipe"]
            self.features_lacking: list[str] = []
            self._timing_reason = ""
            self._adapter = type("Adapter", (), {"info": {"device": "snapshot",
                                                          "backend_type": "none"}})()

        def _build(self, *args: Any) -> Any:
            stateful = bool(args[-1]) and self.state_support
            first = next(iter(inspect.signature(compiler.compile_graph).parameters))
            if first == "graph":  # after 2f39e6f: compile_graph(graph, stateful, ...)
                graph = args[0]

                def compile_(mb, t, o):
                    return compiler.compile_graph(graph, stateful, mb, target=t, options=o)
                ins, outs, pairs = graph.inputs, graph.outputs, graph.pairs
            else:  # compile_graph(outputs, pairs, stateful, inputs, ...)
                outs, ins, pairs = args[0], args[1], args[2]

                def compile_(mb, t, o):
                    return compiler.compile_graph(outs, pairs, stateful, ins, mb, target=t,
                                                  options=o)
            record["io"] = {"stateful": stateful, "pairs": [[p.input, p.output] for p in pairs],
                            "inputs": {n: _node_desc(o)[:2] for n, o in ins.items()},
                            "outputs": {n: _node_desc(o)[:2] for n, o in outs.items()}}

            def source(wgsl: str) -> str:
                return module_source(wgsl, self.engine.enable_subgroups)
            first_hash = None
            for key, tname, mb, opts in variants:
                try:
                    desc, srcs = describe_plan(compile_(mb, targets[tname], opts), source)
                    sources.update(srcs)
                except Exception as exc:  # noqa: BLE001 -- a refusal is recorded: it must match too
                    desc = {"error": f"{type(exc).__name__}: {exc}", "hash": "error"}
                record[key] = desc
                first_hash = first_hash or desc["hash"]
            # the compiler must not change the graph it reads: the first plan again
            key, tname, mb, opts = variants[0]
            again, _ = describe_plan(compile_(mb, targets[tname], opts), source)
            if again["hash"] != first_hash:
                record["nondeterministic"] = [first_hash, again["hash"]]
            raise _Captured

    return SnapContext


def _variants(capacity: int, options: bool) -> list[tuple[str, str, int, Any]]:
    from backends.webnn.wgpu_impl.options import KernelOptions

    out = []
    for t in _targets():
        for mb in (1 << 27, SMALL_BINDING):
            out.append((f"{t}/b{mb}/default", t, mb, KernelOptions()))
    if options:
        for v in OPTION_VARIANTS:
            out.append((f"nvidia/b{1 << 27}/{v}", "nvidia", 1 << 27, KernelOptions.parse([v])))
    if capacity in SPLIT_CAPACITIES:  # element-wise ops over whole caches: their split
        for mb in (SMALL_BINDING, MID_BINDING):
            for v in SPLIT_VARIANTS + (("default",) if mb == MID_BINDING else ()):
                out.append((f"nvidia/b{mb}/{v}", "nvidia", mb,
                            KernelOptions.parse([] if v == "default" else [v])))
    return out


def page_plans(page_cls: type, workload: Any, capacity: int, onnx_path: str | None,
               variants: list, sources: dict) -> dict:
    """Run the page's own ``prepare`` on a device-less context; the plans its build makes."""
    from backends import webnn

    record: dict = {}
    ctx_cls = _snap_context(record, sources, variants)
    saved = webnn.ml.create_context
    webnn.ml.create_context = lambda **kw: ctx_cls(**kw)
    try:
        page = page_cls(onnx_path=onnx_path)
        page.prepare(workload, capacity)
        record["error"] = "prepare finished without building"
    except _Captured:
        pass
    except Exception as exc:  # noqa: BLE001 -- a refusal is a result: the same in both trees, or not
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        webnn.ml.create_context = saved
    return record


def _files(directory: Path) -> dict[str, str]:
    return {p.name: _sha(p.read_bytes()) for p in sorted(directory.iterdir()) if p.is_file()}


def snapshot(sets: set[str], quick: bool, log: Any) -> dict:
    """Every export's bytes and every page's plans, keyed by what made them."""
    from backends import pages
    from model.export import export
    from model.workload import Workload, preset, quantised_names

    modes = {m: next(c for c in vars(pages).values()
                     if isinstance(c, type) and getattr(c, "name", None) == m) for m in MODES}
    out: dict[str, Any] = {"exports": {}, "plans": {}, "wgsl": {}}
    jobs: list[tuple[str, tuple[int, ...], bool]] = []
    for base in (("tiny",) if quick else ("tiny", "small")) if "presets" in sets else ():
        jobs += [(base + s, CAPACITIES, True) for s in SUFFIXES]
    for name, caps, options in jobs:
        wl = Workload.build(preset(name))
        q4 = bool(quantised_names(wl.config))
        for cap in caps:
            t0 = time.perf_counter()
            paths = {f: export(wl, f, cap) for f in ("standard", "ort")}
            if q4:
                paths["ort-acc0"] = export(wl, "ort", cap, accuracy_level=0)
            for f, p in paths.items():
                out["exports"][f"{name}/{f}/c{cap}"] = _sha(Path(p).read_bytes())
            out["exports"][f"{name}/files"] = _files(Path(paths["standard"]).parent)
            var = _variants(cap, options and cap == OPTION_CAPACITY)
            for mode, cls in modes.items():
                out["plans"][f"{name}/standard/c{cap}/{mode}"] = page_plans(
                    cls, wl, cap, None, var, out["wgsl"])
            # the ORT flavour as a user's model (the page's fixed-capacity path)
            for mode in ("wgpu:reuse", "wgpu:stateful"):
                out["plans"][f"{name}/ort/c{cap}/{mode}"] = page_plans(
                    modes[mode], wl, cap, str(paths["ort"]), var[:6], out["wgsl"])
            log(f"{name} c{cap}: {time.perf_counter() - t0:.1f} s")
    # the test models of the tree on the python path (this script may live in another tree)
    models = Path(sys.modules["backends"].__file__).resolve().parent.parent / "tests" / "models"
    for d in sorted(p for p in models.iterdir() if (p / "model.onnx").is_file()):
        if "models" not in sets or quick and d.name != "genai-llama":
            continue
        for cap in (16, 64):
            t0 = time.perf_counter()
            var = _variants(cap, cap == OPTION_CAPACITY)
            for mode, cls in modes.items():
                out["plans"][f"models/{d.name}/c{cap}/{mode}"] = page_plans(
                    cls, None, cap, str(d / "model.onnx"), var, out["wgsl"])
            log(f"models/{d.name} c{cap}: {time.perf_counter() - t0:.1f} s")
    return out


def _load(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def diff(a_path: str, b_path: str, show: int) -> int:
    """Print every export and plan that differs (the first differing launch of each)."""
    a, b = _load(a_path), _load(b_path)
    n_diff = 0
    for part in ("exports", "plans"):
        only = set(a[part]) ^ set(b[part])
        if only:
            print(f"{len(only)} {part} keys in one snapshot only (not compared), "
                  f"e.g. {sorted(only)[0]}")
    for key in sorted(set(a["exports"]) & set(b["exports"])):
        x, y = a["exports"][key], b["exports"][key]
        if x != y:
            n_diff += 1
            print(f"export {key}: {x} -> {y}")
    compared = kernels = 0
    for key in sorted(set(a["plans"]) & set(b["plans"])):
        x, y = a["plans"][key], b["plans"][key]
        # variants one snapshot lacks (an older script) are skipped; a failed build is not
        subs = (set(x) & set(y) | (set(x) | set(y)) & {"error", "nondeterministic"}) - {"io"}
        for sub in sorted(subs):
            px, py = x.get(sub), y.get(sub)
            compared += 1
            if isinstance(px, dict) and "launches" in px:
                kernels += sum(la[0] == "kernel" for la in px["launches"])
            if px == py:
                continue
            n_diff += 1
            print(f"plan {key} {sub}:")
            if not (isinstance(px, dict) and isinstance(py, dict)) or "error" in px or "error" in py:
                print(f"    {str(px)[:300]}\n -> {str(py)[:300]}")
                continue
            la, lb = px["launches"], py["launches"]
            if len(la) != len(lb):
                print(f"    launches {len(la)} -> {len(lb)}")
            for i, (u, v) in enumerate(zip(la, lb, strict=False)):
                if u != v:
                    print(f"    launch {i}: {json.dumps(u)[:show]}\n           -> {json.dumps(v)[:show]}")
                    break
            for part in ("consts", "temps", "pairs", "has_check"):
                if px[part] != py[part]:
                    print(f"    {part} differ")
        if x.get("io") != y.get("io"):
            print(f"plan {key} io: {x.get('io')} -> {y.get('io')}")
            n_diff += 1
    shared = len(set(a["exports"]) & set(b["exports"]))
    print(f"{shared} export hashes, {compared} plans ({kernels} kernel launches, "
          f"{len(a['wgsl'])} distinct WGSL sources before, {len(b['wgsl'])} after); "
          f"{n_diff} differences")
    return 1 if n_diff else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="the snapshot to write (.json.gz)")
    ap.add_argument("--quick", action="store_true", help="tiny and one test model only")
    ap.add_argument("--sets", default="presets,models",
                    help="comma-separated: presets, models (default both)")
    ap.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two snapshots")
    ap.add_argument("--show", type=int, default=400, help="characters of a differing launch")
    args = ap.parse_args(argv)
    if args.diff:
        missing = [p for p in args.diff if not os.path.isfile(p)]
        if missing:
            print(f"snapshot_kernels: no snapshot at {missing[0]}", file=sys.stderr)
            return 2
        return diff(*args.diff, args.show)
    if not args.out:
        print("snapshot_kernels: give OUT or --diff BEFORE AFTER", file=sys.stderr)
        return 2
    if "STATEBENCH_CACHE" not in os.environ:
        print("snapshot_kernels: set STATEBENCH_CACHE to a folder of this tree's own "
              "(a shared cache hands the second tree the first one's exports)", file=sys.stderr)
        return 2
    sets = set(args.sets.split(","))
    if not sets or sets - {"presets", "models"}:
        print(f"snapshot_kernels: unknown set in --sets {args.sets!r}", file=sys.stderr)
        return 2
    snap = snapshot(sets, args.quick, lambda m: print(m, file=sys.stderr, flush=True))
    with gzip.open(args.out, "wt") as f:
        json.dump(snap, f, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
