"""MLContext, MLTensor and MLGraph on wgpu-py.

Everything a dispatch needs is created at build time: pipelines (cached by WGSL source),
intermediate and constant buffers, bind groups of static bindings. Bind groups that touch
the page's tensors are cached per set of bound tensors (a page that ping-pongs two
tensors creates two, once). Dispatching is ``dispatch.Dispatch``'s (recording ahead,
command buffers cut every ``SUBMIT_EVERY`` launches); reading back is
``readback.Readback``'s (a dispatch's readable outputs copied to staging at its end);
staging buffers are ``staging``'s.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
import wgpu

from .. import shapes as S
from .._classes import MLContext, MLGraph, MLTensor
from ..dtypes import DType
from ..engines import engine as engine_named
from ..errors import NotSupportedError
from ..ir import Graph
from ..kernels.common import module_source
from .compiler import compile_graph
from .dispatch import Dispatch
from .options import KernelOptions
from .passes import F16_OPS
from .plan import Deferred, KernelLaunch, Plan
from .readback import RECENT_MAX, STATUS_RING, Dispatched, Readback, ReadCopy
from .staging import ARENA_MAX, MapHow, QueueCounts, StagedReads, StagedWrites
from .target import target_of

_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
#: kernel launches per command buffer on GPU adapters: a dispatch submits its first
#: launches while it encodes the rest, so CPU encoding (~5-10 µs a launch in wgpu-py)
#: overlaps GPU execution instead of preceding it. 0: one submit per dispatch (CPU
#: adapters, where encoder and "GPU" share the same cores).
SUBMIT_EVERY = {"gpu": 48, "cpu": 0}
#: writes of at least this many bytes are staged and batched (``staging.StagedWrites``)
STAGED_WRITE_MIN = 1 << 20


def _nbytes(nbytes: int) -> int:
    """Device size of ``nbytes`` of elements, rounded to 16 so vec4 loads stay in bounds."""
    return max(16, -(-nbytes // 16) * 16)




def _passes(launches: list[Any], every: int) -> tuple[list[tuple[int, int]], set[int]]:
    """Runs of kernel launches between copies as ``(first, end)`` launch indices, cut every
    ``every`` launches (0: never), and the indices of the runs after which a command buffer
    ends (a cut; the last run ends one anyway)."""
    passes: list[tuple[int, int]] = []
    cuts: set[int] = set()
    start = None
    for i, la in enumerate([*launches, None]):
        if isinstance(la, KernelLaunch):
            start = i if start is None else start
            if every and i + 1 - start == every:
                cuts.add(len(passes))
                passes.append((start, i + 1))
                start = None
        elif start is not None:
            passes.append((start, i))
            start = None
    cuts.discard(len(passes) - 1)
    return passes, cuts


class WgpuTensor(MLTensor):
    def __init__(self, context: WgpuContext, dt: DType, shape: tuple[int, ...],
                 readable: bool, writable: bool) -> None:
        super().__init__(context, dt, shape, readable, writable)
        # WebGPU zero-initialises buffers: create_tensor zero-fills as the spec asks
        self._buffer = context._device.create_buffer(size=_nbytes(S.size(shape) * dt.itemsize),
                                                     usage=_STORAGE)

    def destroy(self) -> None:
        if not self._destroyed:
            self._context._staged.drop(self._buffer)  # type: ignore[attr-defined]
            self._buffer.destroy()
        super().destroy()


class WgpuGraph(MLGraph):
    """A compiled plan plus its device objects."""

    def __init__(self, context: WgpuContext) -> None:
        super().__init__(context)
        self._plan: Plan | None = None
        self._buffers: dict[tuple, Any] = {}
        self._state: list[list[Any]] = []  # per pair: [buffer] or [buffer, buffer]
        self._parity = 0
        self._items: list[Any] = []  # per launch: (pipeline, static bind group | None)
        self._bind_cache: list[dict[tuple, Any]] = []
        #: per (bound tensors, parity) key, per pass range: the pass's launches as the C
        #: calls take them (``dispatch._pass_commands``)
        self._commands: dict[tuple, dict[tuple[int, int], list[tuple]]] = {}
        self._kernel_bytes = 0
        self._copy_bytes = 0
        self._passes: list[tuple[int, int]] = []
        self._submit_after: set[int] = set()  # pass indices that end a command buffer
        self._whole_passes: list[tuple[int, int]] = []  # the passes without the cuts
        #: (key, command buffers, the read copy they end with, their status slot)
        self._recorded: tuple[tuple, list[Any], ReadCopy | None, int] | None = None
        #: staging for the capacity status word, one per dispatch in turn: a dispatch's
        #: status may stay unread while later ones run (``Dispatch._settle_before``)
        self._status_ring: list[Any] = []
        self._status_next = 0
        self._read_copies: dict[tuple, ReadCopy] = {}  # by readable output tensors
        self._last_bound: dict[str, dict[str, MLTensor]] | None = None
        self.device_bytes = 0  # statebench extension: bytes of buffers the graph owns

    @property
    def launches(self) -> int:
        """statebench extension: the launches one dispatch runs (kernels and buffer copies;
        a page's decode step is one dispatch: a point's ``details["launches"]``)."""
        return len(self._plan.launches) if self._plan is not None else 0

    def destroy(self) -> None:
        if not self._destroyed:
            # its unread statuses are moot, its copies' staging goes below
            self._context._forget_copies(self)  # type: ignore[attr-defined]
            for rc in self._read_copies.values():
                rc.staging.destroy()
            self._read_copies.clear()
            for b in {id(b): b for b in self._buffers.values()}.values():
                b.destroy()
            for bufs in self._state:
                for b in bufs:
                    b.destroy()
            for b in self._status_ring:
                b.destroy()
            self._status_ring.clear()
            self._bind_cache.clear()
            self._commands.clear()
            self._recorded = self._last_bound = None
        super().destroy()


class WgpuContext(Dispatch, Readback, MLContext):
    """The wgpu implementation of MLContext.

    ``state_support=False`` makes it a backend without state support (PROPOSAL behaviour
    1: ``use_stateful`` is then never granted). ``timing=True`` records the GPU time of
    each dispatch with a timestamp query pair when the adapter has 'timestamp-query'.
    ``options`` (``KernelOptions``, statebench extension): the kernel variants and modes
    every graph built on this context is compiled and dispatched with.
    """

    def __init__(self, *, state_support: bool = True, timing: bool = False,
                 power_preference: str = "high-performance",
                 options: KernelOptions | None = None, engine: str = "wgpu") -> None:
        super().__init__()
        self.engine = engine_named(engine)
        if options is not None and not isinstance(options, KernelOptions):
            raise TypeError(f"options must be a KernelOptions, not {type(options).__name__}")
        #: the knobs every graph of this context is compiled with (statebench extension)
        self.options = options or KernelOptions()
        adapter = self.engine.request_adapter(power_preference)
        if adapter is None:
            raise NotSupportedError(f"no WebGPU adapter ({self.engine.implementation})")
        self._adapter = adapter
        feats = self._features(adapter, timing)
        #: float16 tensors (WGSL ``f16`` storage) need 'shader-f16'; without it the context
        #: turns float16 down (``_unsupported``), as a browser without it would
        self._f16 = "shader-f16" in feats
        lim = adapter.limits
        want = {k: lim[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                    "max-storage-buffers-per-shader-stage",
                                    "max-compute-workgroup-storage-size") if k in lim}
        #: statebench extension: the features this context asked for that the adapter lacks
        #: (by the engine's names), so a run says per point what it ran without
        wanted = ["shader-f16", self.engine.subgroup_feature]
        if timing:
            wanted += ["timestamp-query", self.engine.inside_passes_feature]
        self.features_lacking = [f for f in wanted if f not in adapter.features]
        self._device = self.engine.request_device(adapter, feats, want)
        self._queue = self._device.queue
        # (``Dispatch._encode``)
        self._pass_calls = self.engine.pass_calls(self.options.pass_calls != "wgpu-py")
        # submit, small writes, the spinning wait's poll (``engines.Engine.queue_calls``)
        self._queue_calls = self.engine.queue_calls(self.options.queue_calls != "wgpu-py",
                                                    self.options.queue_calls == "direct_maps")
        self._max_binding = int(self._device.limits["max-storage-buffer-binding-size"])
        self._target = target_of(adapter, self.engine.subgroup_feature in feats, self._f16,
                                 self.engine.device_barrier)
        self.state_support = state_support
        self.submit_every = SUBMIT_EVERY["cpu" if self._target.cpu else "gpu"]
        self._dispatch_modes()
        #: submits and maps of this context's queue (statebench extension: counted per step)
        self.queue_counts = QueueCounts()
        #: the last dispatches (their read copies, for ``_read_tensors``)
        self._recent: deque[Dispatched] = deque(maxlen=RECENT_MAX)
        #: checked dispatches whose capacity status is not read yet, oldest first
        self._pending: deque[Dispatched] = deque()
        self._dispatches = 0  # numbers the dispatches (``Dispatched.number``)
        self._pipelines: dict[str, tuple[Any, Any]] = {}
        max_buffer = int(self._device.limits["max-buffer-size"])
        self._max_buffer = max_buffer
        self._reads = StagedReads(self._device, max_buffer, self.queue_counts, self._map_how)
        self._staged = StagedWrites(self._device, min(ARENA_MAX, max_buffer), self.queue_counts)
        self._timing = "timestamp-query" in feats
        self._gpu_time_ns: int | None = None
        self._time_pending = False
        if self._timing:
            self._query_set = self._device.create_query_set(type="timestamp", count=2)
            self._query_buf = self._device.create_buffer(
                size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
            self._time_staging = self._device.create_buffer(
                size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def _features(self, adapter: Any, timing: bool) -> list[str]:
        """The features to request of ``adapter`` (timestamps where ``timing`` asks for them,
        subgroups, 'shader-f16'); sets why GPU time is not measured, if it is not."""
        feats = []
        self._timing_reason = ""
        if timing:
            if "timestamp-query" in adapter.features:
                feats.append("timestamp-query")
                if self.engine.inside_passes_feature in adapter.features:
                    feats.append(self.engine.inside_passes_feature)  # per-launch profiles
            else:
                self._timing_reason = "adapter has no 'timestamp-query'"
        else:
            self._timing_reason = "timing not requested (create_context(timing=True))"
        if self.engine.subgroup_feature in adapter.features:
            feats.append(self.engine.subgroup_feature)  # subgroup reductions in GPU kernels
        if "shader-f16" in adapter.features:
            feats.append("shader-f16")
        return feats

    def _dispatch_modes(self) -> None:
        """How dispatches record, submit, copy and map (``KernelOptions``, else per adapter)."""
        #: encode the next dispatch's command buffers during this one (``_record_ahead``)
        mode = self.options.record_ahead or ""
        self.record_ahead = {"on": True, "pieces": True, "off": False}.get(
            mode, not self._target.cpu)
        self._piecewise = mode == "pieces"  # recorded command buffers submitted one by one
        #: copy readable outputs at the end of each dispatch (``_read_copy_for``); maps
        #: without wgpu-py's empty submit (``staging.map_read``) unless "separate_sync"
        copy_mode = self.options.read_copy or "dispatch"
        self.read_copy = copy_mode == "dispatch"
        # (an engine whose map_sync submits nothing maps as "separate" does); where the
        # engine's wait is a poll thread's, the caller polls (``staging.MapHow``)
        wait = self.options.map_wait or ("caller" if self._target.cpu else "spin")
        # (Dawn's own wait is in the caller already: only its spin polls)
        poll = (self._queue_calls.poll(self._device)
                if wait == "spin" or (wait == "caller" and self.engine.poll_thread) else None)
        sync = copy_mode == "separate_sync" and self.engine.submits_before_map
        # C maps where the caller spins (the other waits, and map_sync, are wgpu-py's)
        c_maps = wait == "spin" and not sync and self._queue_calls.map_spin is not None
        self._map_how = MapHow(sync, poll, wait == "spin", self._queue_calls.mapped,
                               self._queue_calls.map_spin if c_maps else None,
                               self._queue_calls.unmap if c_maps else None)

    # -- info ---------------------------------------------------------------------------
    @property
    def adapter_info(self) -> dict:
        return dict(self._adapter.info)

    @property
    def engine_info(self) -> dict:
        """statebench extension: which WebGPU engine runs this context, its version, the
        native API under it and the features it lacks (recorded per point)."""
        return {"engine": self.engine.name, "version": self.engine.version(),
                "backend_api": str(self.adapter_info.get("backend_type", "")),
                "features_lacking": list(self.features_lacking)}

    @property
    def gpu_time_reason(self) -> str:
        return self._timing_reason

    def _unsupported(self, dt: DType) -> str:
        if dt.wgsl == "f16" and not self._f16:
            info = self._adapter.info
            why = self.engine.withholds("shader-f16", info)
            return (f"data type float16 is not supported by this context: the adapter "
                    f"({info.get('device', '?')}) has no 'shader-f16'"
                    + (f": {why}" if why else ""))
        return ""

    def _max_tensor_bytes(self) -> int:
        return self._max_buffer  # a tensor is one buffer

    def _widens(self, op: str) -> bool:
        # ops without float16 kernels (matmul, softmax, reductions, ...) accumulate in
        # float32: the builder casts their float16 operands in and the result back
        return op not in F16_OPS

    # -- pipelines ------------------------------------------------------------------------
    def _pipeline(self, wgsl: str, bindings: list[str]) -> tuple[Any, Any]:
        hit = self._pipelines.get(wgsl)
        if hit is None:
            layout = self._device.create_bind_group_layout(entries=[
                {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                 "buffer": {"type": "read-only-storage" if a == "read" else "storage"}}
                for i, a in enumerate(bindings)])
            # float16 storage or arithmetic (WGSL 'f16') needs the extension enabled
            code = module_source(wgsl, self.engine.enable_subgroups)
            module = self._device.create_shader_module(code=code)
            pipe = self._device.create_compute_pipeline(
                layout=self._device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": "main"})
            hit = self._pipelines[wgsl] = (pipe, layout)
        return hit

    # -- tensors ----------------------------------------------------------------------
    def _create_tensor(self, dt: DType, shape: tuple[int, ...], readable: bool,
                       writable: bool) -> MLTensor:
        return WgpuTensor(self, dt, shape, readable, writable)

    def _write_tensor(self, tensor: MLTensor, data: np.ndarray) -> None:
        """Small writes through ``queue.write_buffer`` (after any staged ones, keeping the
        queue's order); large ones staged (``staging.StagedWrites``: one map and one submit
        of copies for all the writes between two dispatches)."""
        n = data.nbytes
        self._forget_written(tensor._serial)  # no copy holds what a read must return
        if n % 4:  # an odd number of float16 values: copies move whole 4-byte words
            data = np.concatenate([data.reshape(-1).view(np.uint8), np.zeros(4 - n % 4, np.uint8)])
        t0 = time.perf_counter_ns()
        if n < STAGED_WRITE_MIN:
            self._staged.flush()
            self._queue_calls.write(self._queue, tensor._buffer, np.ascontiguousarray(data))
        else:
            self._staged.write(tensor._buffer, data)
        self.counters.h2d += n
        self.queue_counts.write_ns += time.perf_counter_ns() - t0

    # -- build ------------------------------------------------------------------------
    def _build(self, graph: Graph, use_stateful: bool) -> MLGraph:
        g = WgpuGraph(self)
        stateful = use_stateful and self.state_support
        g._is_stateful = stateful
        pairs = g.pairs = list(graph.pairs)
        hidden_in = {p.input for p in pairs} if stateful else set()
        hidden_out = {p.output for p in pairs} if stateful else set()
        g.inputs = {n: (o.dtype.name, o.shape) for n, o in graph.inputs.items()
                    if n not in hidden_in}
        g.outputs = {n: (o.dtype.name, o.shape) for n, o in graph.outputs.items()
                     if n not in hidden_out}
        plan = compile_graph(graph, stateful, self._max_binding, target=self._target,
                             options=self.options)
        g._plan = plan
        dev = self._device
        for slot, buf in self._temp_buffers(plan).items():
            g._buffers[slot] = buf
        for slot, arr in plan.consts.items():
            nbytes = arr.nbytes if isinstance(arr, np.ndarray) else 4 * arr.size  # Deferred: words
            buf = dev.create_buffer(size=_nbytes(nbytes), usage=_STORAGE)
            data = np.ascontiguousarray(arr.make() if isinstance(arr, Deferred) else arr)
            if data.nbytes % 4:  # an odd count of float16: writes go in 4-byte units
                data = np.concatenate([data.reshape(-1).view(np.uint8),
                                       np.zeros(4 - data.nbytes % 4, np.uint8)])
            self._queue.write_buffer(buf, 0, data)
            g._buffers[slot] = buf
            del data
        plan.consts.clear()  # uploaded: the host keeps no copy of the weights
        if plan.has_check:
            g._buffers[("status",)] = dev.create_buffer(size=16, usage=_STORAGE)
            g._status_ring = [dev.create_buffer(
                size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
                for _ in range(STATUS_RING)]
        for pp in plan.pairs:
            n = _nbytes(S.size(pp.past.shape) * pp.past.dtype.itemsize)
            g._state.append([dev.create_buffer(size=n, usage=_STORAGE)
                             for _ in range(1 if pp.in_place else 2)])
            g.in_place[pp.pair.input] = pp.in_place
        g._double = any(len(b) == 2 for b in g._state)
        unique = {id(b): b for b in g._buffers.values()}
        g.device_bytes = sum(b.size for b in unique.values()) + sum(
            b.size for bufs in g._state for b in bufs)
        # items and static bind groups
        for la in plan.launches:
            if isinstance(la, KernelLaunch):
                pipe, layout = self._pipeline(la.kernel.wgsl, la.kernel.bindings)
                static = all(self._static(g, s) for s in la.slots)
                bg = self._bind_group(g, layout, la.slots, {}, 0) if static else None
                g._items.append((pipe, layout, bg))
                g._kernel_bytes += la.kernel.bytes
            else:
                g._items.append(None)
                g._copy_bytes += la.nbytes
            g._bind_cache.append({})
        # passes: runs of kernel launches between copies, cut every `every` launches into
        # separately submitted command buffers; whole: the same runs uncut (a recording
        # submitted at once gains nothing from the cuts: ``Dispatch._record_ahead``)
        g._passes, g._submit_after = _passes(plan.launches, self.submit_every)
        g._whole_passes, _ = _passes(plan.launches, 0)
        return g

    def _temp_buffers(self, plan: Plan) -> dict[tuple, Any]:
        """Intermediate buffers, reused once their last reader has run (same size only).
        A buffer freed by launch i is reused from launch i + 1 on, never within launch i
        (a dispatch may not bind one buffer read-only and writable)."""
        first: dict[tuple, int] = {}
        last: dict[tuple, int] = {}
        for i, la in enumerate(plan.launches):
            slots = la.slots if isinstance(la, KernelLaunch) else [la.src, la.dst]
            for sl in (s[1] if s[0] == "range" else s for s in slots):
                if sl in plan.temps:
                    first.setdefault(sl, i)
                    last[sl] = i
        free: dict[int, list[Any]] = {}
        out: dict[tuple, Any] = {}
        by_first: dict[int, list[tuple]] = {}
        by_last: dict[int, list[tuple]] = {}
        for sl in first:
            by_first.setdefault(first[sl], []).append(sl)
            by_last.setdefault(last[sl], []).append(sl)
        for i in range(len(plan.launches)):
            for sl in by_first.get(i, []):
                n = _nbytes(4 * plan.temps[sl])
                pool = free.get(n)
                out[sl] = pool.pop() if pool else self._device.create_buffer(size=n,
                                                                            usage=_STORAGE)
            for sl in by_last.get(i, []):
                free.setdefault(_nbytes(4 * plan.temps[sl]), []).append(out[sl])
        return out

    def destroy(self) -> None:
        if not self._destroyed:
            self._pipelines.clear()
            self._device.destroy()
        super().destroy()
