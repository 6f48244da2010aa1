"""MLContext, MLTensor and MLGraph on wgpu-py.

Everything a dispatch needs is created at build time: pipelines (cached by WGSL source),
intermediate and constant buffers, bind groups of static bindings. Bind groups that touch
the page's tensors are cached per set of bound tensors (a page that ping-pongs two
tensors creates two, once). On GPU adapters each dispatch records its successor's command
buffers while the device runs it (``_record_ahead``), so a step in a decode loop only
submits; a dispatch that finds nothing recorded for its tensors encodes in command buffers
of ``SUBMIT_EVERY`` launches, submitted as they are finished, so the GPU starts while the
rest is encoded. A dispatch's readable outputs (and its capacity status) are copied into
staging at the end of its own last command buffer (``_read_copy_for``), so the page's read
of its logits right after only maps; anything that may change them first makes the read
copy them itself, as before. CPU adapters (lavapipe) neither record ahead nor cut: there
the encoder and the "GPU" share the same cores, and recording during the run made the run
itself slower for no wall-time gain (tiny:256 on 2 cores: GPU time 6.6-6.9 ms without,
7.5-7.7 with; wall 9.1-10.2 vs 9.7-9.9 ms; results/lavapipe/kernels-record-ahead-tiny256.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import wgpu

from .. import shapes as S
from .._classes import MLContext, MLGraph, MLKVCachePair, MLOperand, MLTensor
from ..dtypes import DType, from_device
from ..engines import engine as engine_named
from ..errors import NotSupportedError, OperationError
from ..kernels.common import module_source
from .compiler import OPTIONS, CopyLaunch, Deferred, KernelLaunch, Plan, compile_graph
from .staging import ARENA_MAX, QueueCounts, ReadStaging, StagedReads, StagedWrites, map_read
from .target import target_of

_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
_BIND_CACHE_MAX = 16  # per launch; bounds memory for pages that bind fresh tensors
#: kernel launches per command buffer on GPU adapters: a dispatch submits its first
#: launches while it encodes the rest, so CPU encoding (~5-10 µs a launch in wgpu-py)
#: overlaps GPU execution instead of preceding it. 0: one submit per dispatch (CPU
#: adapters, where encoder and "GPU" share the same cores).
SUBMIT_EVERY = {"gpu": 48, "cpu": 0}
#: writes of at least this many bytes are staged and batched (``staging.StagedWrites``)
STAGED_WRITE_MIN = 1 << 20


def _bound_key(bound: dict[str, dict[str, MLTensor]]) -> tuple:
    """Which tensors a dispatch binds, by serial (a destroyed tensor's never returns)."""
    return tuple(tuple(sorted((n, t._serial) for n, t in bound[k].items()))
                 for k in ("input", "output"))


def _nbytes(nbytes: int) -> int:
    """Device size of ``nbytes`` of elements, rounded to 16 so vec4 loads stay in bounds."""
    return max(16, -(-nbytes // 16) * 16)


def _span_ns(raw: np.ndarray) -> int | None:
    """A dispatch's GPU time from its two resolved timestamps (bytes as mapped), or None
    where the end reads before the beginning (a driver that does not order them)."""
    t = raw.view(np.uint64)
    return int(t[1] - t[0]) if t[1] >= t[0] else None


@dataclass
class _ReadCopy:
    """A dispatch's readable outputs (and its capacity status and timestamps) as copied into
    ``staging`` by the end of the dispatch's last command buffer."""

    graph: WgpuGraph
    staging: ReadStaging
    index: dict[int, int]  # tensor serial -> source index in staging
    status: int | None  # source index of the capacity status word
    time: int | None  # source index of the resolved timestamps


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
        self._kernel_bytes = 0
        self._copy_bytes = 0
        self._passes: list[tuple[int, int]] = []
        self._submit_after: set[int] = set()  # pass indices that end a command buffer
        #: (key, command buffers, the read copy they end with)
        self._recorded: tuple[tuple, list[Any], _ReadCopy | None] | None = None
        self._read_copies: dict[tuple, _ReadCopy] = {}  # by readable output tensors
        self._last_bound: dict[str, dict[str, MLTensor]] | None = None
        self.device_bytes = 0  # statebench extension: bytes of buffers the graph owns

    def destroy(self) -> None:
        if not self._destroyed:
            ctx = self._context
            if ctx._unsettled is self:  # type: ignore[attr-defined]
                ctx._unsettled = None  # type: ignore[attr-defined]  # moot once it is gone
            copied = ctx._copied  # type: ignore[attr-defined]
            if copied is not None and copied.graph is self:
                ctx._copied = None  # type: ignore[attr-defined]  # its staging goes below
            for rc in self._read_copies.values():
                rc.staging.destroy()
            self._read_copies.clear()
            for b in {id(b): b for b in self._buffers.values()}.values():
                b.destroy()
            for bufs in self._state:
                for b in bufs:
                    b.destroy()
            self._bind_cache.clear()
            self._recorded = self._last_bound = None
        super().destroy()


class WgpuContext(MLContext):
    """The wgpu implementation of MLContext.

    ``state_support=False`` makes it a backend without state support (PROPOSAL behaviour
    1: ``use_stateful`` is then never granted). ``timing=True`` records the GPU time of
    each dispatch with a timestamp query pair when the adapter has 'timestamp-query'.
    """

    def __init__(self, *, state_support: bool = True, timing: bool = False,
                 power_preference: str = "high-performance", engine: str = "wgpu") -> None:
        super().__init__()
        self.engine = engine_named(engine)
        adapter = self.engine.request_adapter(power_preference)
        if adapter is None:
            raise NotSupportedError(f"no WebGPU adapter ({self.engine.implementation})")
        self._adapter = adapter
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
        #: float16 tensors (WGSL ``f16`` storage) need 'shader-f16'; without it the context
        #: turns float16 down (``_unsupported``), as a browser without it would
        self._f16 = "shader-f16" in adapter.features
        if self._f16:
            feats.append("shader-f16")
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
        self._max_binding = int(self._device.limits["max-storage-buffer-binding-size"])
        self._target = target_of(adapter, self.engine.subgroup_feature in feats)
        self.state_support = state_support
        self.submit_every = SUBMIT_EVERY["cpu" if self._target.cpu else "gpu"]
        #: encode the next dispatch's command buffers during this one (``_record_ahead``)
        mode = OPTIONS.get("record_ahead") or ""
        self.record_ahead = {"on": True, "pieces": True, "off": False}.get(
            mode, not self._target.cpu)
        self._piecewise = mode == "pieces"  # recorded command buffers submitted one by one
        #: copy readable outputs at the end of each dispatch (``_read_copy_for``); maps
        #: without wgpu-py's empty submit (``staging.map_read``) unless "separate_sync"
        copy_mode = OPTIONS.get("read_copy") or "dispatch"
        if copy_mode not in ("dispatch", "separate", "separate_sync"):
            raise ValueError(f"OPTIONS['read_copy'] = {copy_mode!r}; accepted: None "
                             "('dispatch'), 'separate', 'separate_sync'")
        self.read_copy = copy_mode == "dispatch"
        # (an engine whose map_sync submits nothing maps as "separate" does)
        self._sync_maps = copy_mode == "separate_sync" and self.engine.submits_before_map
        #: submits and maps of this context's queue (statebench extension: counted per step)
        self.queue_counts = QueueCounts()
        #: the last dispatch's read copy while its outputs are unchanged (``_read_tensors``)
        self._copied: _ReadCopy | None = None
        self._pipelines: dict[str, tuple[Any, Any]] = {}
        max_buffer = int(self._device.limits["max-buffer-size"])
        self._max_buffer = max_buffer
        self._reads = StagedReads(self._device, max_buffer, self.queue_counts, self._sync_maps)
        self._staged = StagedWrites(self._device, min(ARENA_MAX, max_buffer), self.queue_counts)
        self._status_staging = self._device.create_buffer(
            size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        self._unsettled: WgpuGraph | None = None  # dispatched, capacity status not yet read
        self._timing = "timestamp-query" in feats
        self._gpu_time_ns: int | None = None
        self._time_pending = False
        if self._timing:
            self._query_set = self._device.create_query_set(type="timestamp", count=2)
            self._query_buf = self._device.create_buffer(
                size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
            self._time_staging = self._device.create_buffer(
                size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

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
    def gpu_time_ns(self) -> int | None:
        """GPU time of the last dispatch (first pass begin to last pass end), or None
        (``gpu_time_reason`` says why). Resolved timestamps are taken as nanoseconds:
        the WebGPU spec defines them so and wgpu-native exposes no period to apply."""
        if self._time_pending:
            map_read(self._time_staging, 0, 16, self.queue_counts, self._sync_maps)
            raw = np.frombuffer(self._time_staging.read_mapped(0, 16), dtype=np.uint8)
            self._gpu_time_ns = _span_ns(raw)
            self._time_staging.unmap()
            self._time_pending = False
        return self._gpu_time_ns

    @property
    def gpu_time_reason(self) -> str:
        return self._timing_reason

    def _unsupported(self, dt: DType) -> str:
        if dt.wgsl == "f16" and not self._f16:
            return (f"data type float16 is not supported by this context: the adapter "
                    f"({self._adapter.info.get('device', '?')}) has no 'shader-f16'")
        return ""

    # -- pipelines ------------------------------------------------------------------------
    def _pipeline(self, wgsl: str, bindings: list[str]) -> tuple[Any, Any]:
        hit = self._pipelines.get(wgsl)
        if hit is None:
            layout = self._device.create_bind_group_layout(entries=[
                {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                 "buffer": {"type": "read-only-storage" if a == "read" else "storage"}}
                for i, a in enumerate(bindings)])
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
        copied = self._copied
        if copied is not None and tensor._serial in copied.index:
            self._copied = None  # the copy no longer holds what a read must return
        if n % 4:  # an odd number of float16 values: copies move whole 4-byte words
            data = np.concatenate([data.reshape(-1).view(np.uint8), np.zeros(4 - n % 4, np.uint8)])
        if n < STAGED_WRITE_MIN:
            self._staged.flush()
            self._queue.write_buffer(tensor._buffer, 0, data)
        else:
            self._staged.write(tensor._buffer, data)
        self.counters.h2d += n

    def _read_tensors(self, tensors: list[MLTensor],
                      outputs: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Every tensor read back in one device round trip and copied out once (into
        ``outputs`` where given); the last checked dispatch's capacity status rides in the
        same round trip (``_settle``). Where the last dispatch already copied every one of
        them into staging and nothing has changed them since (``_copied``), the round trip
        is a map; otherwise the copies are submitted now (``staging.StagedReads``)."""
        sizes = [S.size(t._shape) * t._dtype.itemsize for t in tensors]
        out: list[np.ndarray | None] = [None] * len(tensors)

        def take(i: int, raw: np.ndarray) -> None:
            dt = tensors[i]._dtype
            values = raw[:sizes[i]].view(dt.device_np)
            if outputs is None:
                out[i] = from_device(values.copy(), dt, tensors[i]._shape)
            else:
                outputs[i].reshape(-1)[...] = values  # the page's array, no allocation
                out[i] = outputs[i]

        copied = self._copied
        slots = [None] * len(tensors) if copied is None else [
            copied.index.get(t._serial) for t in tensors]
        if None in slots:
            status = self._read_separately(tensors, sizes, take)
        else:
            status = self._read_copied(copied, slots, sizes, take)  # type: ignore[arg-type]
        self.counters.d2h += sum(sizes)
        self._settle(status=status)
        return out  # type: ignore[return-value]

    def _read_separately(self, tensors: list[MLTensor], sizes: list[int],
                         take: Any) -> int | None:
        """Copy the tensors (and the unsettled status) into staging in a submit of their
        own, map once: the read path of any read the last dispatch did not copy for."""
        self._staged.flush()
        # copies move whole 4-byte words (an odd number of float16 values: one pad value)
        sources = [(t._buffer, -(-n // 4) * 4) for t, n in zip(tensors, sizes, strict=True)]
        if self._unsettled is not None:
            sources.append((self._unsettled._buffers[("status",)], 4))
        status: list[int] = []

        def consume(i: int, raw: np.ndarray) -> None:
            if i == len(tensors):
                status.append(int(raw.view(np.uint32)[0]))
            else:
                take(i, raw)

        self._reads.read(sources, consume)
        return status[0] if status else None

    def _read_copied(self, copied: _ReadCopy, slots: list[int], sizes: list[int],
                     take: Any) -> int | None:
        """Map what the last dispatch copied: the tensors, its status if still unsettled,
        its timestamps if not yet read (so ``gpu_time_ns`` needs no map of its own)."""
        want: dict[int, int] = {}
        readers: dict[int, list[int]] = {}  # source -> positions (a tensor may be read twice)
        for i, (src, n) in enumerate(zip(slots, sizes, strict=True)):
            want[src] = -(-n // 4) * 4
            readers.setdefault(src, []).append(i)
        if self._unsettled is copied.graph and copied.status is not None:
            want[copied.status] = 4
        if self._time_pending and copied.time is not None:
            want[copied.time] = 16
        status: list[int] = []

        def consume(src: int, raw: np.ndarray) -> None:
            if src == copied.status:
                status.append(int(raw.view(np.uint32)[0]))
            elif src == copied.time:
                self._gpu_time_ns = _span_ns(raw)
                self._time_pending = False
            else:
                for i in readers[src]:
                    take(i, raw)

        copied.staging.read(want, consume, self.queue_counts, self._sync_maps)
        return status[0] if status else None

    # -- build ------------------------------------------------------------------------
    def _build(self, outputs: dict[str, MLOperand], inputs: dict[str, MLOperand],
               pairs: list[MLKVCachePair], use_stateful: bool) -> MLGraph:
        g = WgpuGraph(self)
        stateful = use_stateful and self.state_support
        g._is_stateful = stateful
        g.pairs = list(pairs)
        hidden_in = {p.input for p in pairs} if stateful else set()
        hidden_out = {p.output for p in pairs} if stateful else set()
        g.inputs = {n: (o.data_type, o._shape) for n, o in inputs.items() if n not in hidden_in}
        g.outputs = {n: (o.data_type, o._shape) for n, o in outputs.items()
                     if n not in hidden_out}
        plan = compile_graph(outputs, pairs, stateful, inputs, self._max_binding,
                             target=self._target)
        g._plan = plan
        dev = self._device
        for slot, buf in self._temp_buffers(plan).items():
            g._buffers[slot] = buf
        for slot, arr in plan.consts.items():
            nbytes = arr.nbytes if isinstance(arr, np.ndarray) else 4 * arr.size  # Deferred: words
            buf = dev.create_buffer(size=_nbytes(nbytes), usage=_STORAGE)
            data = arr.make() if isinstance(arr, Deferred) else arr
            self._queue.write_buffer(buf, 0, np.ascontiguousarray(data))
            g._buffers[slot] = buf
            del data
        plan.consts.clear()  # uploaded: the host keeps no copy of the weights
        if plan.has_check:
            g._buffers[("status",)] = dev.create_buffer(size=16, usage=_STORAGE)
        for pp in plan.pairs:
            n = _nbytes(S.size(pp.past._shape) * pp.past._dtype.itemsize)
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
        # separately submitted command buffers
        every = self.submit_every
        start = None
        for i, la in enumerate(plan.launches + [None]):
            if isinstance(la, KernelLaunch):
                start = i if start is None else start
                if every and i + 1 - start == every:
                    g._submit_after.add(len(g._passes))
                    g._passes.append((start, i + 1))
                    start = None
            elif start is not None:
                g._passes.append((start, i))
                start = None
        g._submit_after.discard(len(g._passes) - 1)  # the last one is submitted anyway
        return g

    def _temp_buffers(self, plan: Plan) -> dict[tuple, Any]:
        """Intermediate buffers, reused once their last reader has run (same size only).
        A buffer freed by launch i is reused from launch i + 1 on, never within launch i
        (a dispatch may not bind one buffer read-only and writable)."""
        first: dict[tuple, int] = {}
        last: dict[tuple, int] = {}
        for i, la in enumerate(plan.launches):
            slots = la.slots if isinstance(la, KernelLaunch) else [la.src, la.dst]
            for sl in slots:
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

    def _static(self, g: WgpuGraph, slot: tuple) -> bool:
        if slot[0] in ("input", "output"):
            return False
        if slot[0] == "state":
            return len(g._state[slot[1]]) == 1
        return True

    def _resolve(self, g: WgpuGraph, slot: tuple, bound: dict[str, dict[str, MLTensor]],
                 parity: int) -> Any:
        kind = slot[0]
        if kind in ("input", "output"):
            return bound[kind][slot[1]]._buffer
        if kind == "state":
            bufs = g._state[slot[1]]
            if len(bufs) == 1:
                return bufs[0]
            return bufs[(parity + (slot[2] == "next")) % 2]
        return g._buffers[slot]

    def _bind_group(self, g: WgpuGraph, layout: Any, slots: list[tuple],
                    bound: dict[str, dict[str, MLTensor]], parity: int) -> Any:
        entries = []
        for i, s in enumerate(slots):
            buf = self._resolve(g, s, bound, parity)
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": 0,
                                                       "size": buf.size}})
        return self._device.create_bind_group(layout=layout, entries=entries)

    # -- dispatch ---------------------------------------------------------------------
    def _dispatch(self, graph: MLGraph, inputs: dict[str, MLTensor],
                  outputs: dict[str, MLTensor]) -> None:
        """Submit the graph's command buffers: the ones recorded ahead at the previous
        dispatch when they were recorded for these tensors and this parity, else encoded
        now (submitted in pieces as they are encoded). Then, unless that recording missed,
        record the next dispatch's while the GPU runs this one (``_record_ahead``)."""
        g: WgpuGraph = graph  # type: ignore[assignment]
        self._copied = None  # this dispatch may write what the last one copied
        self._settle()
        self._staged.flush()
        bound = {"input": inputs, "output": outputs}
        key = (_bound_key(bound), g._parity)
        ready, g._recorded = g._recorded, None
        if ready is not None and ready[0] == key:
            # recorded for these very tensors: its read copy is this dispatch's
            copy = ready[2]
            if self._piecewise:
                for cb in ready[1]:
                    self._submit([cb])
            else:  # one submit: 3.18 vs 3.28 ms one by one (PERFORMANCE.md item 9)
                self._submit(ready[1])
            missed = False
        else:
            copy = self._read_copy_for(g, bound)
            self._encode(g, bound, key, lambda cb: self._submit([cb]), copy)
            missed = ready is not None
        self._copied = copy
        self.counters.kernel += g._kernel_bytes
        self.counters.d2d += g._copy_bytes
        self._time_pending = self._timing and len(g._passes) > 0
        if g._double:
            g._parity ^= 1  # undone by _settle if the capacity check failed
        if g._plan.has_check:
            self._unsettled = g
        earlier, g._last_bound = g._last_bound, bound
        if self.record_ahead and not missed:
            self._record_ahead(g, earlier or bound)

    def _record_ahead(self, g: WgpuGraph, bound: dict[str, dict[str, MLTensor]]) -> None:
        """Encode the next dispatch now, while the device runs this one, so that dispatch
        only submits (wgpu-py encodes ~5-10 µs a launch: with ~200 launches that is most
        of a step's host time). The next dispatch's tensors are guessed as the previous
        dispatch's: right for a page that binds the same tensors every step and for one
        that ping-pongs two sets. A command buffer holds no data (inputs are read when it
        runs), so it is valid for any contents of the tensors it binds."""
        key = (_bound_key(bound), g._parity)
        cbs: list[Any] = []
        copy = self._read_copy_for(g, bound)
        self._encode(g, bound, key, cbs.append, copy)
        g._recorded = (key, cbs, copy)

    def _submit(self, cbs: list[Any]) -> None:
        self._queue.submit(cbs)
        self.queue_counts.submits += 1

    def _read_copy_for(self, g: WgpuGraph,
                       bound: dict[str, dict[str, MLTensor]]) -> _ReadCopy | None:
        """Staging for the readable outputs of a dispatch binding ``bound`` (with the
        status and timestamps), made once per set of output tensors; None when
        ``read_copy`` is off or nothing bound is readable. Which tensors the page will read
        is not known at dispatch; a page reads the outputs it made readable, and an unread
        copy costs the device a copy of those bytes (the logits: 0.5 MB for llama-1b).
        A recorded-ahead dispatch ends with the same copy, into the same staging: it is
        recorded only for the very tensors it binds (``_bound_key``)."""
        if not self.read_copy:
            return None
        readable = [t for _, t in sorted(bound["output"].items()) if t._readable]
        if not readable:
            return None
        key = tuple(t._serial for t in readable)
        rc = g._read_copies.get(key)
        if rc is None:
            if len(g._read_copies) >= _BIND_CACHE_MAX:
                # dropped, not destroyed: a command buffer recorded ahead may copy into it
                g._read_copies.pop(next(iter(g._read_copies)))
            sources = [t._buffer for t in readable]
            status = time = None
            if g._plan.has_check:
                status = len(sources)
                sources.append(g._buffers[("status",)])
            if self._timing and g._passes:
                time = len(sources)
                sources.append(self._query_buf)
            rc = g._read_copies[key] = _ReadCopy(
                g, ReadStaging(self._device, sources, self._max_buffer),
                {t._serial: i for i, t in enumerate(readable)}, status, time)
        return rc

    def _encode(self, g: WgpuGraph, bound: dict[str, dict[str, MLTensor]], key: tuple,
                emit: Any, copy: _ReadCopy | None = None) -> None:
        """Encode one dispatch for ``bound`` and parity ``key[1]``, handing each finished
        command buffer to ``emit`` (a cut every ``submit_every`` launches); the last one
        ends with ``copy``'s copies into its staging."""
        parity = key[1]
        plan = g._plan
        enc = self._device.create_command_encoder()
        launches = plan.launches
        npasses = len(g._passes)
        for pi, (a, b) in enumerate(g._passes):
            # copies before this pass
            prev_end = g._passes[pi - 1][1] if pi else 0
            self._copies(enc, g, launches[prev_end:a], bound, parity)
            tw = None
            if self._timing and (pi == 0 or pi == npasses - 1):
                tw = {"query_set": self._query_set}
                if pi == 0:
                    tw["beginning_of_pass_write_index"] = 0
                if pi == npasses - 1:
                    tw["end_of_pass_write_index"] = 1
            cp = enc.begin_compute_pass(timestamp_writes=tw)
            for i in range(a, b):
                pipe, layout, bg = g._items[i]
                if bg is None:
                    cache = g._bind_cache[i]
                    bg = cache.get(key)
                    if bg is None:
                        if len(cache) >= _BIND_CACHE_MAX:
                            cache.pop(next(iter(cache)))
                        bg = cache[key] = self._bind_group(g, layout, launches[i].slots,
                                                           bound, parity)
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(*launches[i].kernel.groups)
            cp.end()
            if pi in g._submit_after:
                emit(enc.finish())
                enc = self._device.create_command_encoder()
        self._copies(enc, g, launches[g._passes[-1][1] if g._passes else 0:], bound, parity)
        if plan.has_check:
            enc.copy_buffer_to_buffer(g._buffers[("status",)], 0, self._status_staging, 0, 4)
        if self._timing and npasses:
            enc.resolve_query_set(self._query_set, 0, 2, self._query_buf, 0)
            enc.copy_buffer_to_buffer(self._query_buf, 0, self._time_staging, 0, 16)
        if copy is not None:
            copy.staging.encode(enc)
        emit(enc.finish())

    def _settle(self, report: bool = True, status: int | None = None) -> None:
        """PROPOSAL behaviour 4, without a sync of its own: the last checked dispatch's
        capacity status (4 bytes, counted d2h) is read where the context waits for the
        device anyway (the next read_tensor, in the same round trip as its read: ``status``;
        the next dispatch, before it encodes, from the copy the dispatch made). On overflow
        the graph's double buffers are swapped back (its in-place writes were gated on the
        device) and ``OperationError`` is raised (``report``)."""
        g, self._unsettled = self._unsettled, None
        if g is None:
            return
        if status is None:
            map_read(self._status_staging, 0, 16, self.queue_counts, self._sync_maps)
            status = int(np.frombuffer(self._status_staging.read_mapped(0, 4), dtype=np.uint32)[0])
            self._status_staging.unmap()
        self.counters.d2h += 4
        if not status:
            return
        if g._double:
            g._parity ^= 1
        if report:
            p = [pp for pp in g._plan.pairs if pp.append][status - 1]
            raise OperationError(
                f"KV-cache capacity exceeded for pair {p.pair.input!r} -> "
                f"{p.pair.output!r} (capacity shape {list(p.past._shape)}); "
                "the cache is unchanged")

    def _copies(self, enc: Any, g: WgpuGraph, items: list[Any],
                bound: dict[str, dict[str, MLTensor]], parity: int) -> None:
        for la in items:
            if isinstance(la, CopyLaunch):
                enc.copy_buffer_to_buffer(self._resolve(g, la.src, bound, parity), 0,
                                          self._resolve(g, la.dst, bound, parity), 0, la.nbytes)

    def _peek_state(self, graph: MLGraph, input_name: str) -> np.ndarray:
        """Tests only (PROPOSAL behaviour 5: no public API reads the cache): the current
        contents of a pair's hidden state, without touching the byte counters."""
        g: WgpuGraph = graph  # type: ignore[assignment]
        pp = next(p for p in g._plan.pairs if p.pair.input == input_name)
        buf = self._resolve(g, ("state", pp.index, "cur"), {}, g._parity)
        saved = self.counters.snapshot()
        fake = MLTensor(self, pp.past._dtype, pp.past._shape, True, False)
        fake._buffer = buf  # type: ignore[attr-defined]
        out = self._read_tensors([fake])[0]
        self.counters.d2h = saved.d2h
        return out

    def _reset(self, graph: MLGraph) -> None:
        g: WgpuGraph = graph  # type: ignore[assignment]
        if self._unsettled is g:
            self._settle(report=False)  # the cache is emptied: its overflow is moot
        self._staged.flush()
        enc = self._device.create_command_encoder()
        for bufs in g._state:
            for b in bufs:
                enc.clear_buffer(b)
        self._submit([enc.finish()])
        g._parity = 0

    def destroy(self) -> None:
        if not self._destroyed:
            self._pipelines.clear()
            self._device.destroy()
        super().destroy()

