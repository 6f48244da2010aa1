"""Fixtures shared by the WebNN test modules, and the `adapter_feature` marker.

``STATEBENCH_ENGINE=dawn`` runs the WebNN tests' contexts on Dawn instead of wgpu-native
(CI runs them on both: .ci/run). Whatever the engine, every kernel a test compiles is also
compiled by the other engine's compiler (``_kernels_compile_on_both_engines``).

`@pytest.mark.adapter_feature("shader-f16")` (or "subgroup": the engine's subgroup feature,
"timestamp-query", several at once): the test needs those features of the engine's adapter,
and is skipped with the reason on an adapter without them (wgpu on OpenGL has neither
'shader-f16' nor 'subgroup') or where there is no adapter.
"""

import functools
import os

import pytest

#: lavapipe's JIT for the suite (set before any Vulkan driver loads, inherited by the
#: workers and the CLI children): 4-wide vectors and no LLVM optimisation passes. With a cold
#: Mesa shader cache (a fresh box) LLVM's time on the wide unrolled kernels dominated the
#: suite; these leave what a kernel computes to the WGSL, not to the JIT (docs/measuring.md).
#: Benchmarks do not set them. Set either variable to keep your own value. 4-wide vectors
#: make lavapipe's subgroups 4 lanes wide, so the subgroup paths that need 8 or more run
#: in .ci/run's pass at LP_NATIVE_VECTOR_WIDTH=256.
for _name, _value in (("LP_NATIVE_VECTOR_WIDTH", "128"), ("GALLIVM_PERF", "nopt")):
    os.environ.setdefault(_name, _value)

#: the engine of the WebNN tests' contexts ("wgpu" or "dawn")
ENGINE = os.environ.get("STATEBENCH_ENGINE", "wgpu")


#: modules of the slow tier (``-m slow``): the end-to-end sweeps in fresh processes (faults,
#: signals, user models, genai, the GPU scripts), the attention kernels at thousands of
#: rows and every kernel through naga and Tint (its compiles, about a minute of the 2-core
#: box's suite). ``./statebench.sh test`` leaves them out; ``.ci/run`` runs them after it
#: (README, "The two commands")
SLOW_MODULES = frozenset({
    "test_nothing_lost", "test_kernel_bench", "test_gpu_sweep_script", "test_real_exports",
    "test_run_model", "test_genai", "test_webnn_attention", "test_generate", "test_rollback",
    "test_rollback_export_wgpu", "test_spec_e2e", "test_ktoken_gdn_variants",
    "test_prefill_command", "test_wgsl_engines",
})


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: the slow tier (SLOW_MODULES, and cases marked so); "
                                       "run with -m slow")
    config.addinivalue_line(
        "markers", "adapter_feature(*names): needs these wgpu adapter features; skipped with "
                   "the reason on an adapter without them")


@functools.cache
def _adapter() -> tuple[frozenset[str] | None, str]:
    """(the features of the tests' engine's adapter, its summary), or (None, why there is
    no adapter)."""
    from backends.webnn.adapter import wgpu_adapter

    adapter, why = wgpu_adapter(ENGINE)
    if adapter is None:
        return None, why
    return frozenset(adapter.features), adapter.summary


def missing_adapter_features(*names: str) -> str:
    """Why a test needing these adapter features cannot run here ("" when it can)."""
    from backends.webnn.engines import ENGINES

    features, about = _adapter()
    if features is None:
        return f"no WebGPU adapter: {about}"
    subgroup = ENGINES[ENGINE].subgroup_feature  # "subgroup" (wgpu-native) or "subgroups"
    lacking = [n for n in (subgroup if n in ("subgroup", "subgroups") else n for n in names)
               if n not in features]
    if lacking:
        return f"the adapter ({about}) has no {', '.join(repr(n) for n in lacking)}"
    return ""


def pytest_runtest_setup(item) -> None:
    for mark in item.iter_markers("adapter_feature"):
        why = missing_adapter_features(*mark.args)
        if why:
            pytest.skip(why)


@pytest.fixture(scope="module")
def ctx():
    """One WebNN context per test module; skipped with the reason where the engine has no
    adapter."""
    from backends.webnn import ml

    try:
        c = ml.create_context(engine=ENGINE)
    except Exception as e:  # noqa: BLE001 - any driver failure means "no adapter here"
        pytest.skip(f"no WebGPU adapter ({ENGINE}): {e}")
    c.record_ahead = True  # the GPU's dispatch path (a CPU adapter's default is off)
    yield c
    c.destroy()


@pytest.fixture(scope="module")
def ctx_with(ctx):
    """``ctx_with(**knobs)``: a context created with those kernel options (``KernelOptions``
    fields), one per set of options per module (``ctx`` itself for the defaults), on the
    GPU's dispatch path as ``ctx`` is unless the options pick ``record_ahead``."""
    from backends.webnn import ml
    from backends.webnn.wgpu_impl.options import KernelOptions

    made = {}

    def make(**knobs):
        options = KernelOptions(**knobs)
        if options == ctx.options:
            return ctx
        if options not in made:
            c = made[options] = ml.create_context(options=options)
            if options.record_ahead is None:
                c.record_ahead = ctx.record_ahead
        return made[options]

    yield make
    for c in made.values():
        c.destroy()


@pytest.fixture(scope="module")
def subgroup_size(ctx) -> int | None:
    """The adapter's subgroup width as a kernel sees it (None: no 'subgroup' feature): the
    subgroupAdd paths are taken only where it is one fixed width, and lavapipe reports only
    a range (4..128), so the tests probe it with a kernel that writes its own width."""
    import numpy as np
    import wgpu

    dev = ctx._device
    if ctx.engine.subgroup_feature not in dev.features:
        return None
    src = ("@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n"
           "@compute @workgroup_size(64)\n"
           "fn main(@builtin(local_invocation_index) lid: u32, "
           "@builtin(subgroup_size) sz: u32) { out[lid] = sz; }\n")
    if ctx.engine.enable_subgroups:
        src = "enable subgroups;\n" + src
    pipe = dev.create_compute_pipeline(
        layout="auto", compute={"module": dev.create_shader_module(code=src), "entry_point": "main"})
    buf = dev.create_buffer(size=256, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0),
                               entries=[{"binding": 0, "resource": {"buffer": buf}}])
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(1)
    cp.end()
    dev.queue.submit([enc.finish()])
    sizes = set(np.frombuffer(dev.queue.read_buffer(buf), np.uint32).tolist())
    return sizes.pop() if len(sizes) == 1 else None


@pytest.fixture
def queue_calls(monkeypatch):
    """Call it to start counting every queue submit and buffer map wgpu-py makes (its own
    empty submits before read maps included); returns the live counts. An oracle for a
    context's ``queue_counts`` that shares no code with it."""
    from wgpu.backends.wgpu_native import _api

    def start() -> dict[str, int]:
        n = {"submits": 0, "maps": 0}
        submit, map_async = _api.GPUQueue.submit, _api.GPUBuffer.map_async

        def counted_submit(self, *a, **k):
            n["submits"] += 1
            return submit(self, *a, **k)

        def counted_map(self, *a, **k):
            n["maps"] += 1
            return map_async(self, *a, **k)

        monkeypatch.setattr(_api.GPUQueue, "submit", counted_submit)
        monkeypatch.setattr(_api.GPUBuffer, "map_async", counted_map)
        return n

    return start


@pytest.fixture(autouse=True)
def _kernels_compile_on_both_engines(monkeypatch):
    """Every kernel a test's graphs compile on one engine is also compiled by the other
    engine's compiler (Tint for wgpu-native contexts, naga for Dawn's), so a kernel only one
    engine accepts fails the test that built it. Where the other compiler is missing here
    this check is off, and test_wgsl_engines.py skips with the reason."""
    try:
        from backends.webnn.wgpu_impl.context import WgpuContext
    except ImportError:
        return
    from wgsl_compilers import compiler_device, rejection

    from backends.webnn.engines import ENGINES

    own = WgpuContext._pipeline

    def checked(self, wgsl: str, bindings: list[str]):
        if wgsl not in self._pipelines:
            other = "dawn" if self.engine.name == "wgpu" else "wgpu"
            if compiler_device(other)[0] is not None:
                err = rejection(other, wgsl)
                eng = ENGINES[other]
                assert not err, f"{eng.compiler} ({eng.implementation}) rejects a kernel: {err}"
        return own(self, wgsl, bindings)

    monkeypatch.setattr(WgpuContext, "_pipeline", checked)
