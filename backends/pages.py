"""The four ways a WebNN page carries decode state across steps, on the WebNN implementation.

Each mode is what a page would write: convert the standard-flavour ONNX once
(`backends.webnn.onnx_converter`), create MLTensors, then per token write the ids/position,
`dispatch`, and read the logits. They differ only in where the cache lives (DESIGN §1):

- `wgpu:stateless`  the page holds the caches on the host; every step uploads every past cache
  and downloads every present cache (persistent tensors and host arrays; the downloads and
  the logits awaited together, as `Promise.all` over `readTensor(tensor, outputData)` would
  be, in one device round trip: the best a page can do).
- `wgpu:reuse`      the caches live in MLTensors; since one tensor may not be both input and
  output of a dispatch, the page ping-pongs two per pair and the graph writes a full copy.
- `wgpu:stateful`   the proposal: `use_stateful=True` with the pairs listed from names; the
  caches leave the interface, the page binds ids, position and logits only.
- `wgpu:fallback`   the same page code as stateful on a context without state support:
  `is_stateful` comes back False and the page binds the pairs as `reuse` does (§2 rule 1).

Each mode runs on both WebGPU engines: `wgpu:*` on wgpu-native, `dawn:*` (the same classes,
`engine = "dawn"`) on Dawn, Chrome's engine (docs/dawn.md).

Bytes are never computed here: the context counts them where they move, and each backend
call adds the context's deltas to `self.counters`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from backends.base import Backend, BuildSource, DepthState, check_tokens, into_capacity, register
from backends.next_ids import NEXT_IDS, with_next_ids
from backends.webnn.adapter import wgpu_adapter
from backends.webnn.rollback_names import ACCEPTED
from model.errors import UserError
from model.workload import Workload

if TYPE_CHECKING:
    from backends.webnn.wgpu_impl.options import KernelOptions


#: the input of a deferred-commit K-token graph (a hybrid's GDN and conv state roll back
#: inside the next dispatch, backends/webnn/rollback.py): int64 [1], the tokens kept of
#: the previous dispatch (``_Page.accept``; 0 after a reset, K after a step not rolled back)
ACCEPTED_COUNT = ACCEPTED


def _webnn():
    """The WebNN module, imported late so a missing wgpu only marks these backends unavailable."""
    import backends.webnn as webnn

    return webnn


#: the inputs a page feeds besides the caches: the token, its position, the mask of the
#: rows written so far, and the tokens kept of the last dispatch (``_Page._feed``)
_FEEDS = frozenset({"input_ids", "position_ids", "attention_mask", "seqlens_k",
                    "total_sequence_length", ACCEPTED_COUNT})


class _Page(Backend):
    """What every mode shares: one context, the converted graph, ids/position/logits tensors."""

    #: create the context with state support (False: the fallback's backend)
    state_support = True
    #: build with use_stateful=True and the pairs listed from the graph's names
    request_state = False
    #: keep the caches in host arrays and copy them both ways every step
    host_cache = False
    #: wgpu-native's adapter: the harness asks for it in a child first (Backend.uses_wgpu_adapter)
    uses_wgpu_adapter = True
    #: the WebGPU engine of the context (backends.webnn.engines: "wgpu", "dawn")
    engine = "wgpu"
    #: a model file as given runs too, its growing caches made fixed-capacity
    runs_models = True

    @classmethod
    def create(cls, source: BuildSource, options: KernelOptions | None = None) -> _Page:
        return cls(onnx_path=source.model_path, pairs=source.hand_pairs or None, options=options)

    @classmethod
    def options_type(cls) -> type:
        from backends.webnn.wgpu_impl.options import KernelOptions

        return KernelOptions

    def __init__(self, onnx_path: str | os.PathLike | None = None, timing: bool = True,
                 options: KernelOptions | None = None, pairs: dict[str, str] | None = None,
                 tokens_per_step: int = 1) -> None:
        super().__init__()
        self.tokens_per_step = tokens_per_step  # K: the export's new tokens a dispatch
        self.onnx_path = onnx_path  # a user's export instead of model.export's
        self.hand_pairs = pairs  # past -> present named by hand (--pairs), for a user's model
        self.timing = timing
        self.options = options  # the context's kernel variants and modes (None: per adapter)
        self.context = None
        self.converted = None
        self.position = 0
        self._bound: dict[str, object] = {}  # ids, position, logits tensors
        self._cur: dict[str, object] = {}  # past name -> tensor read this step (page-owned)
        self._nxt: dict[str, object] = {}  # past name -> tensor written this step
        self._host: dict[str, np.ndarray] = {}  # stateless: past name -> host array
        self._inputs_host: dict[str, np.ndarray] = {}  # ids, position: refilled each step
        self._logits: np.ndarray | None = None  # the page's array the logits are read into
        self._pairs: list = []  # MLKVCachePair, past -> present
        self._t_written = 0  # perf_counter_ns when the last step's writes were done
        self._last_times: tuple | None = None  # the last step's boundaries (host_breakdown_ms)
        self._accepted = 0  # tokens kept of the last dispatch: the next one's accepted_count
        self._unsettled = False  # a dispatch `accept` may still roll back
        self._overwritten: list[str] | None = []  # pairs a token overwrites (None: unknown)
        #: set before ``prepare``: the graph also computes each logits row's argmax
        #: (``next_ids``) and ``step_ids`` reads those K ids, not the logits (which the page
        #: then never reads, so no copy of them leaves the device)
        self.read_ids = False
        self._ids: np.ndarray | None = None  # the page's array the ids are read into
        #: ``decode_chained``'s two ids tensors, each step's next_ids and the next's input_ids
        self._chain: tuple[object, object] | None = None
        #: set before ``prepare``: build the graph a speculative loop rolls back to any kept
        #: count (a hybrid's K-token graph: the deferred-commit export, ``model.export``'s
        #: rollback "deferred"; an attention-only graph rolls back by position as it is)
        self.speculative = False
        self._config = None  # the preset's ModelConfig (None: a model as given)
        #: a deferred-commit graph's state hand-over (``load``, ``committed``): statebench's
        #: export's (``rollback_feeds.ExportDeferred``) or a rewritten model's
        #: (``deferred_commit.DeferredGraph``); None for any other graph
        self._deferred_state = None
        self._deferred_refusal = ""  # why a model's K-token graph could not be made deferred

    # -- availability -----------------------------------------------------------------------

    @classmethod
    def available(cls) -> tuple[bool, str]:
        adapter, why = wgpu_adapter(cls.engine)
        if adapter is None:
            return False, why
        try:
            _webnn()
        except ImportError as exc:
            return False, f"the WebNN wgpu backend cannot be imported ({exc})"
        return True, ""

    @classmethod
    def runs_on(cls) -> str:
        from backends.webnn.engines import engine

        eng = engine(cls.engine)
        adapter, _ = wgpu_adapter(cls.engine)
        api = dict(adapter.info).get("backend_type", "?") if adapter is not None else "no adapter"
        return f"{eng.version()}, {api}"

    # -- counting ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        """Add what the context counted during the block to this backend's counters."""
        before = self.context.counters.snapshot()
        try:
            yield
        finally:
            self.counters.add(self.context.counters.since(before))

    # -- protocol ---------------------------------------------------------------------------

    def prepare(self, workload: Workload, capacity: int) -> None:
        webnn = _webnn()
        from backends.webnn.onnx_converter import ConversionError, convert, list_kv_pairs

        self.capacity = capacity
        from model.workload import cache_specs

        # the pairs that do not roll back by position (a GDN layer's conv window and state);
        # a model as given: not known
        self._config = None if workload is None or self.onnx_path is not None else workload.config
        self._overwritten = (None if self._config is None else
                             [s.input for s in cache_specs(self._config, 1)
                              if s.kind != "append"])
        path, base = self._graph(workload, capacity)
        if self.read_ids:
            path, base = self._with_ids(path, base)
        dims = None
        self.context = webnn.ml.create_context(state_support=self.state_support, timing=self.timing,
                                               options=self.options, engine=self.engine)
        self.details["engine"] = self.context.engine_info
        # what the point ran with: every knob, None where the adapter chose
        self.details["kernel_options"] = self.context.options.as_dict()
        reason = getattr(self.context, "gpu_time_reason", "")
        if reason:
            self.details["gpu_time_reason"] = reason
        with self._counted():
            try:
                if self.request_state:
                    self._pairs = list_kv_pairs(path, self.hand_pairs)
                    self.converted = convert(path, self.context, use_stateful=True,
                                             kv_cache_pairs=self._pairs, dims=dims, base=base)
                else:
                    self.converted = convert(path, self.context, dims=dims, base=base)
                    self._pairs = list_kv_pairs(path, self.hand_pairs)
            except ConversionError as exc:
                raise UserError(str(exc)) from None
        graph = self.converted.graph
        if self.onnx_path is not None:  # a model as given: the pairs no rewrite made
            # fixed-capacity are overwritten ones (the rewritten appends roll back by position)
            appended = set(self.details.get("fixed_capacity", {}))
            self._overwritten = [p.input for p in self._pairs if p.input not in appended]
        paired = {p.input for p in self._pairs}
        missing = [n for n in self.converted.inputs if n not in _FEEDS | paired]
        if missing:
            raise RuntimeError(f"{self.name} is unavailable for {self.onnx_path}: the WebNN pages "
                               f"feed {', '.join(sorted(_FEEDS))}, not {missing[0]!r}")
        self.details["is_stateful"] = bool(graph.is_stateful)
        if self.request_state:
            in_place = getattr(graph, "in_place", {}) or {}
            self.details["in_place"] = {p.input: bool(in_place.get(p.input, in_place.get(p.output, False)))
                                        for p in self._pairs} if graph.is_stateful else {}
        ctx = self.context
        ins, outs = self.converted.inputs, self.converted.outputs
        self._cache_names = {p.input for p in self._pairs} | {p.output for p in self._pairs}
        self._logits_name = next(n for n in outs if n not in self._cache_names | {NEXT_IDS})
        for name, d in ins.items():
            if name not in self._cache_names:
                self._bound[name] = ctx.create_tensor(data_type=d.data_type, shape=list(d.shape),
                                                      writable=True)
        for name, d in outs.items():
            if name not in self._cache_names:  # (the logits unread where the ids are read)
                self._bound[name] = ctx.create_tensor(
                    data_type=d.data_type, shape=list(d.shape),
                    readable=not (self.read_ids and name == self._logits_name))
        if self.read_ids:
            self._ids = np.empty(outs[NEXT_IDS].shape, outs[NEXT_IDS].host_dtype)
        # read into every step (readTensor(tensor, outputData)): a fresh array a step is
        # fresh memory the host faults in on the step's path (docs/measuring.md "Host time")
        self._logits = np.empty(outs[self._logits_name].shape,
                                outs[self._logits_name].host_dtype)
        if self._hidden:
            return
        for p in self._pairs:
            d = ins[p.input]
            if self.host_cache:
                self._host[p.input] = np.zeros(d.shape, d.host_dtype)
                self._cur[p.input] = ctx.create_tensor(data_type=d.data_type, shape=list(d.shape),
                                                       writable=True)
                self._nxt[p.input] = ctx.create_tensor(data_type=d.data_type, shape=list(d.shape),
                                                       readable=True)
            else:  # two device tensors, swapped after each step; the page writes them at depth
                for side in (self._cur, self._nxt):
                    side[p.input] = ctx.create_tensor(data_type=d.data_type, shape=list(d.shape),
                                                      writable=True)

    def _graph(self, workload: Workload | None, capacity: int) -> tuple[object, str | None]:
        """The graph to convert and the folder its external data is read from (None: the
        graph's own): statebench's standard-flavour export of ``workload``, or a user's file
        pinned for a decode step, its growing caches made fixed-capacity."""
        self._deferred_state, self._deferred_refusal = None, ""
        if self.onnx_path is None:
            from model.export import export

            k = self.tokens_per_step
            if self._deferred(k):
                from model.rollback_feeds import ExportDeferred

                self._deferred_state = ExportDeferred(self._config, k)
                return export(workload, "standard", capacity, tokens=k, rollback="deferred"), None
            return (export(workload, "standard", capacity, tokens=k) if k > 1
                    else export(workload, "standard", capacity)), None
        import onnx

        proto = onnx.load(str(self.onnx_path), load_external_data=False)
        proto = self._fixed_capacity(proto, capacity)
        if self.speculative and self.tokens_per_step > 1:
            # a model with GDN layers rewritten into deferred-commit form, so ``accept`` can
            # keep fewer than K; where it cannot be, left as it is and the refusal says why
            from backends.webnn.deferred_commit import try_deferred

            self._deferred_state, self._deferred_refusal = try_deferred(proto,
                                                                        self.tokens_per_step)
            if self._deferred_state is not None:
                self.details["deferred_commit"] = self._deferred_state.describe()
        return proto, os.path.dirname(os.fspath(self.onnx_path))

    def _with_ids(self, graph, base: str | None) -> tuple[object, str | None]:
        """The graph (a path or a proto) with ``next_ids`` added (``backends.next_ids``),
        and the folder its external data is read from."""
        import onnx

        if not isinstance(graph, onnx.ModelProto):
            base = os.path.dirname(os.fspath(graph))
            graph = onnx.load(os.fspath(graph), load_external_data=False)
        try:
            return with_next_ids(graph, "logits"), base
        except ValueError as exc:
            raise UserError(f"{self.name} cannot read ids: {exc}") from None

    def _deferred(self, k: int) -> bool:
        """Whether to build the deferred-commit export: asked for (``speculative``), a
        K-token graph of a model with GDN layers, K within the capsule's capacity."""
        from backends.webnn.rollback_names import MAX_TOKENS

        return bool(self.speculative and k > 1 and self._overwritten and k <= MAX_TOKENS)

    def _fixed_capacity(self, proto, capacity: int):
        """A user's model pinned and its growing caches made fixed-capacity
        (``backends.webnn.fixed_capacity``); what was done per pair goes in the details.
        RuntimeError (the point unavailable) where a pair cannot be rewritten safely."""
        from backends.webnn.fixed_capacity import FixedCapacityError, fixed_model
        from backends.webnn.onnx_converter import ConversionError

        try:
            _, done = fixed_model(proto, capacity, self.hand_pairs, self.tokens_per_step)
        except ConversionError as exc:
            raise UserError(str(exc)) from None
        except FixedCapacityError as exc:
            raise RuntimeError(f"{self.name} is unavailable for {self.onnx_path}: {exc}") from None
        if done:
            self.details["fixed_capacity"] = {r.input: r.how for r in done}
        return proto

    @property
    def _hidden(self) -> bool:
        """The graph keeps the cache (stateful and granted): nothing of it is bound."""
        return bool(self.converted is not None and self.converted.graph.is_stateful)

    def reach_depth(self, depth: DepthState) -> None:
        self.reset()  # accepted_count 0: what the page writes at depth is committed state
        if self._hidden:
            # a hidden cache is reached only by dispatching (DESIGN §5); logits are not read.
            # A K-token graph dispatches K at a time (a chunked prefill)
            k = self.tokens_per_step
            if k == 1:
                for tok in depth.tokens:
                    self._dispatch(int(tok))
                return
            if depth.depth % k:
                raise ValueError(f"depth {depth.depth} is not a multiple of the {k} tokens "
                                 "a step of this graph takes")
            for j in range(0, depth.depth, k):
                self._dispatch(np.asarray(depth.tokens[j:j + k], np.int64))
            return
        cache = depth.cache
        if self._deferred_state is not None:  # the deferred pairs' layout: the conv window,
            cache = self._deferred_state.load(cache)  # an empty capsule
        with self._counted():
            for p in self._pairs:
                # in the cache's own type (a float16 cache: float16 rows, as the page holds them)
                d = self.converted.inputs[p.input]
                arr = into_capacity(np.asarray(cache[p.input], d.host_dtype), tuple(d.shape))
                if self.host_cache:
                    self._host[p.input][...] = arr
                else:
                    self.context.write_tensor(self._cur[p.input], arr)
        self.position = depth.depth

    def step(self, token: int) -> np.ndarray:
        if self.tokens_per_step != 1:
            raise ValueError(f"{self.name} was built for {self.tokens_per_step} tokens a step "
                             "(step_tokens)")
        return self._step(token)

    def step_tokens(self, tokens: np.ndarray) -> np.ndarray:
        tokens = check_tokens(tokens, self.tokens_per_step)
        k = len(tokens)
        return self._step(int(tokens[0]) if k == 1 else tokens).reshape(k, -1)

    def step_ids(self, tokens: int | np.ndarray) -> np.ndarray:
        """One dispatch of the graph's K tokens and the argmax of each of its K logits rows,
        computed on the device and read back as K int64 ids (``read_ids``)."""
        if not self.read_ids:
            raise ValueError(f"{self.name} was not built to read ids (read_ids)")
        tokens = check_tokens(tokens, self.tokens_per_step)  # (an int: a one-token step's)
        return self._step(int(tokens[0]) if len(tokens) == 1 else tokens,
                          ids=True).astype(np.int64)

    def chain_refusal(self) -> str:
        """Why ``decode_chained`` cannot run on this page ("" where it can)."""
        if self.converted is None:
            return "the page is not prepared"
        if not self.read_ids:
            return ("it was built without read_ids: the graph has no next_ids output to "
                    "feed the next step")
        if self.tokens_per_step != 1:
            return (f"its graph takes {self.tokens_per_step} tokens a step; a chain feeds one "
                    "id a step")
        if self.host_cache:
            return ("it holds its caches on the host: a step's past is the previous step's "
                    "present read back, so no step can be dispatched before the previous "
                    "one is read")
        ins, outs = self.converted.inputs, self.converted.outputs
        if "input_ids" not in ins:
            return "its graph has no input_ids input"
        a, b = ins["input_ids"], outs[NEXT_IDS]
        if (a.data_type, list(a.shape)) != (b.data_type, list(b.shape)):
            return (f"its next_ids ({b.data_type}{list(b.shape)}) cannot be bound as its "
                    f"input_ids ({a.data_type}{list(a.shape)})")
        return ""

    def decode_chained(self, first: int, n: int) -> np.ndarray:
        """Greedy decoding of ``n`` tokens after ``first`` with the ids kept on the device
        (issue 32): step i's ``next_ids`` output tensor is bound as step i + 1's
        ``input_ids`` (two tensors used in turn, MLTensor reuse), and step i + 1 is
        dispatched before step i's id is read, so the queue holds the next step while the
        host reads: the device does not idle through the host's turnaround. The reads map
        each step's own read copy (the context keeps the last few), and in-place graphs
        read their capacity status with them (an overflow raises OperationError at the
        read of that step's id or a later one). Returns the n ids in order: each step's
        argmax, as ``step_ids`` gives them. ValueError where the page cannot chain
        (``chain_refusal``)."""
        why = self.chain_refusal()
        if why:
            raise ValueError(f"{self.name} cannot decode chained: {why}")
        chain = self._chain_tensors()
        got = np.empty(max(0, n), np.int64)
        if n <= 0:
            return got
        with self._counted():
            self.context.write_tensor(chain[0], np.full(self._ids.shape, first, self._ids.dtype))
        self._dispatch(first, chain=chain)  # step 0: chain[0] -> chain[1]
        for i in range(1, n + 1):
            if i < n:  # step i: chain[i % 2] (step i - 1's ids) -> chain[(i + 1) % 2]
                self._dispatch(first, chain=(chain[i % 2], chain[(i + 1) % 2]))
            try:
                got[i - 1] = self._read_id(chain[i % 2])
            except _webnn().OperationError:
                if i < n:  # step i is queued: its status (an overflow too) read and dropped,
                    self._drain(chain[(i + 1) % 2])  # so no later call reports it
                raise
        return got

    def _drain(self, tensor: object) -> None:
        """Read the last queued chain step's id after an earlier step failed, dropping its
        own OperationError (the caller raises the first)."""
        with contextlib.suppress(_webnn().OperationError):
            self._read_id(tensor)

    def _chain_tensors(self) -> tuple[object, object]:
        """The chain's two ids tensors (made once): written by the host for the first
        step, then each one step's output and the next step's input."""
        if self._chain is None:
            d = self.converted.inputs["input_ids"]
            self._chain = tuple(self.context.create_tensor(  # type: ignore[assignment]
                data_type=d.data_type, shape=list(d.shape), readable=True, writable=True)
                for _ in range(2))
        return self._chain  # type: ignore[return-value]

    def _read_id(self, tensor: object) -> int:
        """One step's id, read into the page's array."""
        with self._counted():
            self.context.read_tensors([tensor], [self._ids])
        return int(self._ids.reshape(-1)[0])

    def _step(self, tokens: int | np.ndarray, ids: bool = False) -> np.ndarray:
        """One dispatch of the graph's K tokens (an int where K = 1) and its logits, flat
        (``ids``: its next ids, read in their place)."""
        if self.read_ids and not ids:
            raise ValueError(f"{self.name} was built to read ids, not logits (step_ids)")
        t0 = time.perf_counter_ns()
        times0 = self.context.queue_counts.times_ns()
        self._dispatch(tokens)
        t_dispatched = time.perf_counter_ns()
        out, into = ((self._bound[NEXT_IDS], self._ids) if ids
                     else (self._bound[self._logits_name], self._logits))
        with self._counted():
            if self.host_cache:  # the logits and every present at once, into the page's
                # own arrays, as Promise.all over readTensor(tensor, outputData)
                self.context.read_tensors([out] + [self._nxt[p.input] for p in self._pairs],
                                          [into] + [self._host[p.input] for p in self._pairs])
            else:
                self.context.read_tensors([out], [into])
            logits = into
        t_read = time.perf_counter_ns()
        logits = logits.reshape(-1)  # in the graph's type, as readTensor gives a page
        self._last_times = (t0, self._t_written, t_dispatched, t_read, time.perf_counter_ns(),
                            times0, self.context.queue_counts.times_ns())
        return logits

    def host_breakdown_ms(self) -> dict[str, float] | None:
        """Where the last step's host time went (docs/measuring.md, "Host time"): the
        page's boundaries (writes, dispatch, read, after) split by the context's own
        timers (``QueueCounts``' ``*_ns``: encode, submit, record ahead, wait, copy)."""
        if self._last_times is None:
            return None
        t0, t_written, t_dispatched, t_read, t_end, before, after = self._last_times
        d = {k: after[k] - before[k] for k in after}
        ns = {"write": t_written - t0, "write_device": d["write"],
              "encode": d["encode"], "submit": d["submit"], "record_ahead": d["record"],
              "dispatch_other": t_dispatched - t_written - d["encode"] - d["submit"] - d["record"],
              "wait": d["wait"], "copy": d["copy"],
              "read_other": t_read - t_dispatched - d["wait"] - d["copy"],
              "after": t_end - t_read, "total": t_end - t0}
        return {k: v / 1e6 for k, v in ns.items()}

    def _dispatch(self, tokens: int | np.ndarray,
                  chain: tuple[object, object] | None = None) -> None:
        """Write this step's inputs and dispatch it; ``chain``: (its input_ids, its
        next_ids) tensors, bound instead of the page's own (the ids are not written)."""
        ctx = self.context
        with self._counted():
            ins = {}
            for name in self.converted.inputs:
                if chain is not None and name == "input_ids":
                    ins[name] = chain[0]
                elif name in self._bound:
                    ins[name] = self._bound[name]
                    ctx.write_tensor(ins[name], self._feed(name, tokens))
            outs = {self._logits_name: self._bound[self._logits_name]}
            if self.read_ids:
                outs[NEXT_IDS] = self._bound[NEXT_IDS] if chain is None else chain[1]
            if not self._hidden:
                for p in self._pairs:
                    if self.host_cache:
                        ctx.write_tensor(self._cur[p.input], self._host[p.input])
                    ins[p.input] = self._cur[p.input]
                    outs[p.output] = self._nxt[p.input]
            self._t_written = time.perf_counter_ns()
            ctx.dispatch(self.converted.graph, ins, outs)
            # after a dispatch: the plan is the one that ran (a graph may replan at its first)
            self.details["launches"] = int(getattr(self.converted.graph, "launches", 0))
            if not (self.host_cache or self._hidden):
                self._cur, self._nxt = self._nxt, self._cur
        self.position += self.tokens_per_step
        self._accepted, self._unsettled = self.tokens_per_step, True

    # -- speculative decoding -----------------------------------------------------------------

    @property
    def commits_by_count(self) -> bool:
        """The graph commits its last dispatch's kept tokens itself (``accepted_count``)."""
        return self.converted is not None and ACCEPTED_COUNT in self.converted.inputs

    def rollback_refusal(self) -> str:
        """Why ``accept`` cannot keep fewer than K tokens of a step here ("" where it
        can): every pair rolls back by position (KV rows), or the graph commits the rest
        itself from ``accepted_count`` (a deferred commit)."""
        if self.commits_by_count:
            return ""
        if self._deferred_refusal:
            return self._deferred_refusal
        if self._overwritten is None:
            return ("a model as given: its pairs' kinds (positional KV rows or overwritten "
                    "state) are not known")
        if self._overwritten:
            return (f"{len(self._overwritten)} pairs ({', '.join(self._overwritten[:2])}"
                    f"{', ...' if len(self._overwritten) > 2 else ''}) are overwritten by every token "
                    f"(GDN conv window and recurrent state), not positional rows: they cannot roll "
                    f"back by position, and this K-token graph has no {ACCEPTED_COUNT!r} input "
                    "(the deferred-commit export, built where `speculative` is set and K <= "
                    "8)")
        return ""

    def accept(self, kept: int) -> None:
        """Keep the first ``kept`` of the last dispatch's K tokens (``Backend.accept``), by
        position, the proposal's way with no new API: the next dispatch writes its rows
        at P + ``kept`` and its queries see rows up to their own position only
        (``position_ids``, ``attention_mask``), so the dropped rows are never read and are
        overwritten; a deferred-commit graph is told ``kept`` as its ``accepted_count``.
        No bytes move. Every page mode alike: the rows the page holds (stateless), the
        tensors it ping-pongs (reuse) and the graph's hidden state (stateful)."""
        k = self.tokens_per_step
        self.kept_of(kept)
        if not self._unsettled:
            raise ValueError(f"{self.name}: no step to keep tokens of (accept follows one "
                             "step_tokens, once)")
        kept = int(kept)
        if kept < k:
            why = self.rollback_refusal()
            if why:
                raise NotImplementedError(f"{self.name} cannot roll back: {why}")
        self.position -= k - kept
        self._accepted, self._unsettled = kept, False

    def state_snapshot(self, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The state the next dispatch starts from, by past name (``names``: those pairs
        only), host copies (checks and tests: a page never reads the state back; a
        stateful page's hidden state through the context's test peek). A deferred-commit
        graph's pairs with their commit made (its hand-over's ``committed``: the
        reference's layout, float64); any other's as they are, in the cache's type.
        Counts no bytes."""
        if self._deferred_state is None:
            return self._read_pairs(names)
        pairs = self._deferred_state.committed(self._read_pairs(None), self._accepted)
        return {n: a for n, a in pairs.items() if names is None or n in names}

    def _read_pairs(self, only: list[str] | None) -> dict[str, np.ndarray]:
        """The pairs' contents as they are (``only``: those)."""
        ctx = self.context
        names = [p.input for p in self._pairs if only is None or p.input in only]
        if not names:
            return {}
        before = ctx.counters.snapshot()
        try:
            if self._hidden:
                return {n: np.array(ctx._peek_state(self.converted.graph, n)) for n in names}
            if self.host_cache:
                return {n: self._host[n].copy() for n in names}
            got = ctx._read_tensors([self._cur[n] for n in names], None)
            return {n: np.array(a).reshape(self.converted.inputs[n].shape)
                    for n, a in zip(names, got, strict=True)}
        finally:
            for field in ("h2d", "d2h", "d2d", "kernel"):
                setattr(ctx.counters, field, getattr(before, field))

    def _feed(self, name: str, tokens: int | np.ndarray) -> np.ndarray:
        """What the page writes to a non-cache input this step (``_FEEDS``) for its K
        tokens (an int where K = 1) at positions P .. P+K-1, in its own array for that
        input (``_written``)."""
        arr = self._written(name)
        k = self.tokens_per_step
        if name == "input_ids":
            arr[...] = tokens
        elif name == ACCEPTED_COUNT:
            arr.fill(self._accepted)
        elif name == "attention_mask":  # ones up to and including the last position
            arr.fill(0)
            arr[..., :self.position + k] = 1
        elif name == "total_sequence_length":
            arr.fill(self.position + k)
        elif name == "seqlens_k":
            arr.fill(self.position + k - 1)
        elif k == 1:  # position_ids: [1, 1], or Qwen's multimodal [3, 1, 1]
            arr.fill(self.position)
        else:
            arr[...] = np.arange(self.position, self.position + k)
        return arr

    def _written(self, name: str) -> np.ndarray:
        """The page's host array for input ``name`` (ids, position), made once and refilled
        every step: a page writes from the same typed array, no allocation per token."""
        arr = self._inputs_host.get(name)
        if arr is None:
            d = self.converted.inputs[name]
            arr = self._inputs_host[name] = np.zeros(d.shape, d.host_dtype)
        return arr

    def reset(self) -> None:
        if self.context is None:
            return
        with self._counted():
            if self._hidden:
                self.context.reset_kv_cache(self.converted.graph)
            else:
                for p in self._pairs:
                    if self.host_cache:
                        self._host[p.input][...] = 0
                    else:
                        self.context.write_tensor(self._cur[p.input], np.zeros(
                            self.converted.inputs[p.input].shape, np.float32))
        self.position = 0
        self._accepted, self._unsettled = 0, False

    def gpu_time_ms(self) -> float | None:
        if self.context is None or not self.timing:
            return None
        ns = self.context.gpu_time_ns  # timestamp queries around the last dispatch
        return None if ns is None else ns / 1e6

    def device_bytes(self) -> int | None:
        """The graph's own buffers (weights, temporaries, hidden state) plus the page's tensors."""
        if self.converted is None:
            return None
        tensors = [*self._bound.values(), *self._cur.values(), *self._nxt.values(),
                   *(self._chain or ())]
        page = sum(int(np.prod(t.shape)) * t._dtype.itemsize for t in tensors)
        return int(getattr(self.converted.graph, "device_bytes", 0)) + page

    def close(self) -> None:
        if self.context is not None:
            self.context.destroy()
            self.context = None


@register
class StatelessCopy(_Page):
    """The page keeps every cache on the host and copies it both ways each step."""

    name = "wgpu:stateless"
    host_cache = True


@register
class TensorReuse(_Page):
    """Caches in MLTensors, ping-ponged; the graph writes a full present copy each step."""

    name = "wgpu:reuse"


@register
class StatefulInPlace(_Page):
    """The proposal: the graph owns the cache; the page binds ids, position and logits."""

    name = "wgpu:stateful"
    hidden_state = True
    request_state = True


@register
class StatefulFallback(_Page):
    """The stateful page on a backend without state: `is_stateful` is False, pairs are bound."""

    name = "wgpu:fallback"
    request_state = True
    state_support = False


#: the same four pages on Dawn: one class each, the engine the only difference
DAWN_PAGES: dict[str, type[_Page]] = {}
for _page in (StatelessCopy, TensorReuse, StatefulInPlace, StatefulFallback):
    _cls = type(f"Dawn{_page.__name__}", (_page,), {
        "name": _page.name.replace("wgpu:", "dawn:"), "engine": "dawn", "uses_wgpu_adapter": False,
        "__module__": __name__, "__doc__": f"{(_page.__doc__ or '').strip()} On Dawn.",
    })
    DAWN_PAGES[_cls.name] = register(_cls)
