"""ONNX Runtime backends: the ways ORT users carry the decode state (DESIGN §1, §5).

Names are `ort-<provider>:<mode>`, provider `cpu` (CPU EP) or `webgpu` (the WebGPU plugin EP of
`onnxruntime-ep-webgpu`, registered with `register_execution_provider_library`):

- `copy`: plain `run()` with host numpy arrays, ORT flavour; the cache grows one row per step
  (present of length P+1 is fed back as the next past).
- `iobinding`: IOBinding; presents stay in ORT-owned device values (`bind_output(name,
  device)`) and are bound as the next step's pasts (`bind_ortvalue_input`); logits to host.
- `shared`: one capacity-sized device value bound as both past and present of each
  GroupQueryAttention (its shared buffer) and as the past and present of each
  LinearAttention and CausalConvWithState (aliased); only ids and logits cross the
  interface.
- `standard`: the standard flavour with host arrays at a fixed capacity: what a stateless
  WebNN page would hand ORT.
- `captured` (WebGPU only): `shared` with the EP's graph capture (`enableGraphCapture`):
  the first run records the session's GPU commands and later runs replay them, so ORT's
  per-node host work drops out of the step, as `wgpu:stateful`'s recorded dispatches drop
  encoding. Every input is then a device value at a fixed address, written in place
  (`update_inplace`) each step.

Byte counters (`ByteCounters`), counted where the bytes move:
- `h2d`: bytes of host arrays handed to `run()` or bound with `bind_cpu_input`, plus
  `update_inplace` uploads (token ids, GQA lengths and, in `copy`/`standard`, every cache).
- `d2h`: bytes copied back to host: outputs `run()` returns (presents in `copy`/`standard`)
  and the logits always.
- `d2d`: copies this backend makes between device values: none in any mode (ORT's own copy
  of the past into a new present is kernel traffic, not counted here).
- `kernel`: the bytes every node reads plus writes, from the graph's shapes (value_info
  written by `model.export`), computed once at prepare as `a + b * depth`: whole inputs and
  outputs, except Gather (and GQA's cos/sin caches) read only the rows they gather,
  Reshape/Squeeze/Unsqueeze are views (0), and caches count valid rows: a growing past counts
  its P rows and its present P+1; a shared buffer counts P rows read and 1 row written.
4-bit graphs (`+q4` presets) on the CPU EP compute with float32 activations: ORT's CPU
MatMulNBits at accuracy_level 4 (the exported value, as real exports) quantises activations to
int8 per block, about 0.7 % of the logits on tiny+q4, which no float tolerance admits; so a
CPU session reads the model layer's level-0 export of the graph (`export(...,
accuracy_level=FLOAT_ACCURACY_LEVEL)`, checksummed like every cached graph) and turns the
DequantizeLinear→MatMul fusion's level to 0 (`session.qdq_matmulnbits_accuracy_level`). The
WebGPU EP keeps the exported graph.
On the CPU EP host and device memory are the same: there `h2d`/`d2h` mean bytes crossing the
session interface (copied into or out of ORT's tensors), not bytes crossing a bus.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from backends.base import Backend, BuildSource, DepthState, check_tokens, into_capacity, register
from backends.webnn.dims import default_dims, past_head_sizes, pin
from backends.webnn.onnx_converter import list_kv_pairs
from backends.webnn.rollback_names import ACCEPTED, MAX_TOKENS
from model.export import (
    FLOAT_ACCURACY_LEVEL,
    ORT,
    PAST_LEN,
    STANDARD,
    TOTAL_LEN,
    export,
    state_layout,
)
from model.rollback_feeds import ExportDeferred, cache_specs_deferred
from model.workload import CacheSpec, Workload, cache_specs, in_layout

try:
    import onnxruntime as ort
except ImportError:  # pragma: no cover - the venv always has it
    ort = None

WEBGPU_EP = "WebGpuExecutionProvider"
_VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze"})
_webgpu_state: dict[str, object] = {}


def webgpu_devices() -> tuple[list, str]:
    """The WebGPU plugin EP's devices, registering the plugin library once; (devices, why not)."""
    if ort is None:
        return [], "onnxruntime is not installed"
    if "error" not in _webgpu_state and "registered" not in _webgpu_state:
        try:
            import onnxruntime_ep_webgpu
        except ImportError:
            _webgpu_state["error"] = "onnxruntime-ep-webgpu is not installed"
        else:
            try:
                ort.register_execution_provider_library(
                    "WebGPU", onnxruntime_ep_webgpu.get_library_path())
                _webgpu_state["registered"] = True
            except Exception as exc:  # noqa: BLE001 - ORT raises plain RuntimeError/Fail
                if "already" in str(exc).lower():
                    _webgpu_state["registered"] = True
                else:
                    _webgpu_state["error"] = f"registering the WebGPU plugin EP failed: {exc}"
    if "error" in _webgpu_state:
        return [], str(_webgpu_state["error"])
    devices = ort.get_ep_devices()
    gpu = [d for d in devices if "webgpu" in d.ep_name.lower()]
    if not gpu:
        listed = ", ".join(sorted({d.ep_name for d in devices})) or "nothing"
        return [], f"the WebGPU plugin EP found no device (ort.get_ep_devices lists only {listed})"
    return gpu, ""


def _cpu_devices() -> tuple[list, str]:
    """The CPU EP needs no device of its own: one placeholder, where onnxruntime is installed."""
    return (["cpu"], "") if ort is not None else ([], "onnxruntime is not installed")


@dataclass(frozen=True)
class Provider:
    """What differs between ORT's execution providers, as data: the backends ask this record,
    never the provider's name."""

    #: the backend names' ``ort-<key>``
    key: str
    #: what `statebench backends` says runs it
    ep: str
    #: the device name of its OrtValues
    device: str
    #: the EP's devices where a plugin library provides it (``add_provider_for_devices``),
    #: (devices, why not); the CPU EP's is a placeholder
    devices: Callable[[], tuple[list, str]]
    #: the EP as ``providers=[...]`` names it, where it is built in (None: a plugin's devices)
    builtin: str | None
    #: it computes on the host's CPU (``Backend.on_cpu``)
    on_cpu: bool
    #: MatMulNBits accuracy level of the graph it reads (module docstring; None: as exported)
    accuracy_level: int | None
    #: session config entries it runs with
    session_config: dict[str, str] = field(default_factory=dict)
    #: the EP writes the logits straight into the page's host array (no device copy to read)
    logits_on_host: bool = False
    #: record which nodes the EP did not take (``_assignment``)
    records_assignment: bool = False
    #: it can replay a captured graph (the `captured` mode)
    graph_capture: bool = False


PROVIDERS = {
    "cpu": Provider("cpu", "CPU EP", "cpu", _cpu_devices, "CPUExecutionProvider", on_cpu=True,
                    accuracy_level=FLOAT_ACCURACY_LEVEL,
                    session_config={"session.qdq_matmulnbits_accuracy_level":
                                    str(FLOAT_ACCURACY_LEVEL)},
                    logits_on_host=True),
    "webgpu": Provider("webgpu", "WebGPU EP (on Dawn, built into the plugin)", "webgpu",
                       webgpu_devices, None, on_cpu=False, accuracy_level=None,
                       session_config={"session.record_ep_graph_assignment_info": "1"},
                       records_assignment=True, graph_capture=True),
}


class _KernelBytes:
    """Per-step kernel bytes as `base + per_token * depth`, from the exported value_info."""

    def __init__(self, path: Path, shared: bool) -> None:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        g = model.graph
        info: dict[str, list] = {}
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            info[vi.name] = [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            info[vi.name].append(vi.type.tensor_type.elem_type)
        for t in g.initializer:
            info[t.name] = list(t.dims) + [t.data_type]
        self.nodes = [(n.op_type, list(n.input), list(n.output)) for n in g.node]
        self.info, self.shared = info, shared
        self.base = self._total(0)
        self.per_token = self._total(1) - self.base

    def _nbytes(self, name: str, depth: int) -> int:
        import onnx

        *dims, elem = self.info[name]
        size = {PAST_LEN: depth, TOTAL_LEN: 1 if self.shared else depth + 1}
        n = 1
        for d in dims:
            n *= size[d] if isinstance(d, str) else d
        if elem in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            return -(-n // 2)  # two a byte (NumPy's int4 type takes one)
        return n * onnx.helper.tensor_dtype_to_np_dtype(elem).itemsize

    def _total(self, depth: int) -> int:
        total = 0
        for op, ins, outs in self.nodes:
            if op in _VIEW_OPS:
                continue
            outb = sum(self._nbytes(o, depth) for o in outs if o)
            inb = [self._nbytes(i, depth) if i else 0 for i in ins]
            if op == "Gather":
                inb[0] = outb  # reads the gathered rows only
            elif op == "GroupQueryAttention":
                for j in (7, 8):  # cos/sin caches: one row each for one token
                    if j < len(ins) and ins[j]:
                        inb[j] = self._nbytes(ins[j], depth) // self.info[ins[j]][0]
            total += sum(inb) + outb
        return total

    def at(self, depth: int) -> int:
        return self.base + self.per_token * depth


class _ModelKernelBytes(_KernelBytes):
    """`_KernelBytes` for a model statebench did not export: its symbolic dims pinned
    (``dims.default_dims``) at a depth and its shapes inferred (real exports carry little
    value_info), so the count needs no dim of statebench's own graph. A tensor whose shape
    inference leaves unknown counts 0 bytes and is named in ``unsized``."""

    def __init__(self, model: onnx.ModelProto, last_dims: dict[str, int] | None = None) -> None:
        g = model.graph
        self.nodes = [(n.op_type, list(n.input), list(n.output)) for n in g.node]
        self.shared, self.unsized = False, set()
        self.last_dims = dict(last_dims or {})  # caches' head sizes no symbol gives
        self.infos = {d: self._info_at(model, d) for d in (1, 2)}
        t1, t2 = self._total(1), self._total(2)
        self.per_token = t2 - t1
        self.base = t1 - self.per_token

    def _info_at(self, model: onnx.ModelProto, depth: int) -> dict[str, list]:
        pinned = pin(model, {k: d.value for k, d in default_dims(model, depth).items()})
        for vi in [*pinned.graph.input, *pinned.graph.output]:
            if vi.name in self.last_dims:
                vi.type.tensor_type.shape.dim[-1].dim_value = self.last_dims[vi.name]
        try:
            pinned = onnx.shape_inference.infer_shapes(pinned)
        except Exception:  # noqa: BLE001 - inference is best effort; unknowns count 0
            pass
        g, info = pinned.graph, {}
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                info[vi.name] = [d.dim_value for d in dims] + [vi.type.tensor_type.elem_type]
        for t in g.initializer:
            info[t.name] = list(t.dims) + [t.data_type]
        return info

    def _nbytes(self, name: str, depth: int) -> int:
        self.info = self.infos[depth]
        if name not in self.info:
            self.unsized.add(name)
            return 0
        return super()._nbytes(name, depth)


#: the element type of an ONNX tensor as NumPy's
def _np_type(elem: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))


class _GraphFeeds:
    """How the session's graph is fed: its pasts at a depth and its other inputs at a
    position. statebench's own export (`_ExportFeeds`) and a model as given (`_ModelFeeds`)
    differ here, and only here."""

    #: a deferred-commit graph's ``accepted_count``: the tokens of the last dispatch its
    #: next dispatch commits (unused by every other graph)
    accepted = 0

    def __init__(self, specs: list[CacheSpec], state=None) -> None:
        self.specs = specs
        #: a deferred-commit graph's state hand-over (``load``, ``committed``): statebench's
        #: export's (``rollback_feeds.ExportDeferred``) or a rewritten model's
        #: (``deferred_commit.DeferredGraph``); None for any other graph
        self.state = state

    @property
    def deferred(self) -> bool:
        return self.state is not None

    def _cache(self, depth: DepthState) -> dict[str, np.ndarray]:
        """A depth's state as the pairs take it (a deferred graph's: laid into its pairs)."""
        return depth.cache if self.state is None else self.state.load(depth.cache)

    def check(self, depth: DepthState) -> None:
        """ValueError where ``depth``'s cache does not fit the graph."""

    def pasts(self, depth: DepthState | None, growing: bool) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def feeds(self, token: int, position: int) -> dict[str, np.ndarray]:
        raise NotImplementedError


class _ExportFeeds(_GraphFeeds):
    """statebench's export (``model.export``) in its flavour: the reference's cache layouts,
    the ids and lengths its flavour names."""

    def __init__(self, specs: list[CacheSpec], flavour: str, state=None) -> None:
        super().__init__(specs, state)
        self.flavour = flavour

    def check(self, depth: DepthState) -> None:
        cache = self._cache(depth)
        for s in self.specs:
            got = in_layout(s, cache[s.input]).shape
            if tuple(got) != tuple(s.shape):
                raise ValueError(f"{s.input}: cache shape {got}, expected {s.shape}")

    def pasts(self, depth: DepthState | None, growing: bool) -> dict[str, np.ndarray]:
        """A growing past (ORT flavour, no buffer sharing) holds exactly the valid rows; a
        fixed one the whole capacity."""
        n = 0 if depth is None else depth.depth
        cache = None if depth is None else self._cache(depth)
        out = {}
        for s in self.specs:
            rows = n if growing and s.kind == "append" else None
            if depth is None:
                shape = list(s.shape)
                if rows is not None:
                    shape[2] = rows
                out[s.input] = np.zeros(shape, s.dtype)
            else:
                arr = in_layout(s, cache[s.input])
                out[s.input] = np.ascontiguousarray(arr if rows is None else arr[:, :, :rows],
                                                    s.dtype)
        return out

    def feeds(self, token: int | np.ndarray, position: int) -> dict[str, np.ndarray]:
        """The ids of the step's K tokens (an int where K = 1) at positions P .. P+K-1."""
        ids = np.asarray(token, np.int64).reshape(1, -1)
        k = ids.shape[1]
        feeds = {"input_ids": ids}
        if self.flavour == STANDARD:
            feeds["position_ids"] = np.arange(position, position + k, dtype=np.int64)[None]
        else:
            feeds["seqlens_k"] = np.array([position + k - 1], np.int32)
            feeds["total_sequence_length"] = np.array(position + k, np.int32)
        if self.deferred:
            feeds[ACCEPTED] = np.array([self.accepted], np.int64)
        return feeds


class _ModelFeeds(_GraphFeeds):
    """A model statebench did not export: its growing caches on their own axes, its other
    inputs fed by name (``_MODEL_FEEDS``) in their declared types. ``mask_columns``: where
    set, the attention_mask has that many columns every step (ones over the positions so
    far, zeros after), as onnxruntime-genai's static mask under graph capture; else it grows
    one column a step."""

    def __init__(self, specs: list[CacheSpec], axes: dict[str, int | None],
                 feed_inputs: dict[str, onnx.ValueInfoProto],
                 mask_columns: int | None = None, state=None) -> None:
        super().__init__(specs, state)
        self.axes, self.feed_inputs, self.mask_columns = axes, feed_inputs, mask_columns

    def check(self, depth: DepthState) -> None:
        """Its growing shapes are checked by `pasts`."""

    def pasts(self, depth: DepthState | None, growing: bool) -> dict[str, np.ndarray]:
        """A growing past holds the depth's rows on its axis, as the reference's presents
        hold them (``harness.sources.OrtReferenceWalk``), whichever the mode."""
        n = 0 if depth is None else depth.depth
        cache = None if depth is None else self._cache(depth)
        out = {}
        for s in self.specs:
            shape = list(s.shape)
            if self.axes[s.input] is not None:
                shape[self.axes[s.input]] = n
            if depth is None:
                out[s.input] = np.zeros(shape, s.dtype)
                continue
            arr = cache[s.input]
            if tuple(arr.shape) != tuple(shape):
                raise ValueError(f"{s.input}: cache shape {arr.shape} at depth {n}, "
                                 f"expected {tuple(shape)}")
            out[s.input] = np.ascontiguousarray(arr, s.dtype)
        return out

    def feeds(self, token: int | np.ndarray, position: int) -> dict[str, np.ndarray]:
        """The inputs of one run of K tokens (an int: one) at positions P .. P+K-1."""
        ids = np.asarray(token, np.int64).reshape(1, -1)
        feeds = {}
        for name, vi in self.feed_inputs.items():
            tt = vi.type.tensor_type
            declared = [d.dim_value if d.HasField("dim_value") else
                        int(d.dim_param) if d.dim_param.strip().isdigit() else None
                        for d in tt.shape.dim]  # transformers writes '4' for 4
            if name == "attention_mask" and self.mask_columns is not None:
                arr = np.zeros((1, self.mask_columns))
                arr[:, :position + ids.shape[1]] = 1
            else:
                arr = _MODEL_FEEDS[name](ids, position, declared)
            feeds[name] = arr.astype(_np_type(tt.elem_type))
        if self.deferred:
            feeds[ACCEPTED] = np.array([self.accepted], np.int64)
        return feeds


class _OrtBackend(Backend):
    """Shared machinery: session, feeds of ids, logits, counters. Subclasses carry the cache."""

    ep: Provider = PROVIDERS["cpu"]
    provider = "cpu"  # ep.key
    mode = ""
    flavour = ORT
    host_cache = False  # whether the cache crosses the host link every step
    shared_buffer = False  # whether each cache is one buffer bound as past and present
    runs_models = True
    #: the mode replays a captured graph: registered only for EPs that can (``Provider``)
    needs_capture = False
    #: a model's attention_mask is fed capacity-sized, its shape the same every step
    #: (``_ModelFeeds.mask_columns``)
    static_mask = False
    cache_dir: str | os.PathLike | None = None  # None: model.workload.default_cache_dir()

    @classmethod
    def create(cls, source: BuildSource, options: None = None) -> _OrtBackend:
        return cls(model=source.model_path, pairs=source.hand_pairs or None)

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if ort is None:
            return False, "onnxruntime is not installed"
        devices, why = cls.ep.devices()
        return bool(devices), why

    @classmethod
    def runs_on(cls) -> str:
        if ort is None:
            return ""
        return f"ONNX Runtime {ort.__version__}, {cls.ep.ep}"

    def __init__(self, model: str | os.PathLike | None = None,
                 pairs: dict[str, str] | None = None, tokens_per_step: int = 1) -> None:
        super().__init__()
        self.tokens_per_step = tokens_per_step  # K: the export's new tokens a run
        self.model = None if model is None else Path(model)  # a user's .onnx, not an export
        self.hand_pairs = pairs  # past -> present named by hand (--pairs), for a user's model
        self.session = None
        self._deferred_refusal = ""  # why a model's K-token graph could not be made deferred
        self._rewritten_dir = None  # where that rewritten graph was written (a temp dir)
        self.graph: _GraphFeeds | None = None  # how the session is fed (``prepare``)
        self.position = 0
        self._logits_host: np.ndarray | None = None  # the page's logits array (_logits_array)
        #: a model's growing axis per past (None: overwritten); statebench's exports grow on 2
        self.axes: dict[str, int | None] = {}

    #: set before ``prepare``: build the graph a speculative loop rolls back to any kept
    #: count (a hybrid's K-token graph as the deferred-commit export; ``_deferred_commit``)
    speculative = False

    def _deferred_commit(self) -> bool:
        """Whether ``prepare`` builds the deferred-commit export: asked for
        (``speculative``), the standard flavour (the export's form of it), a K-token graph of
        a model whose state is overwritten (GDN layers), K within the capsule's capacity;
        the pages' rule (``backends.pages``), so both roll the same graph back."""
        k = self.tokens_per_step
        return bool(self.speculative and self.flavour == STANDARD and 1 < k <= MAX_TOKENS
                    and any(s.kind != "append" for s in cache_specs(self.cfg, 1)))

    #: why a mode cannot run a model statebench did not export ("" where it can)
    model_unavailable = ""

    @classmethod
    def model_refusal(cls, proto: onnx.ModelProto, hand_pairs: dict[str, str] | None = None) -> str:
        """Why this mode cannot run ``proto`` ("" where it may): ``model_unavailable`` here;
        `shared` looks at the graph."""
        return cls.model_unavailable

    # --- preparation -------------------------------------------------------------------
    def prepare(self, workload: Workload, capacity: int) -> None:
        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        if self.model is not None:
            self._prepare_model(capacity)
            return
        self.workload, self.cfg, self.capacity = workload, workload.config, capacity
        self.vocab = self.cfg.vocab
        # the recurrent states in the flavour's layout; a depth's cache (the reference's
        # layout) is converted as it is handed in (``in_layout``)
        self.specs = cache_specs(self.cfg, capacity, state_layout(self.flavour))
        k, deferred = self.tokens_per_step, self._deferred_commit()
        if deferred:
            self.specs = cache_specs_deferred(self.cfg, capacity, k)
            self.details["rollback"] = "deferred commit (accepted_count)"
        # the CPU EP's graph computes MatMulNBits on float32 activations (module docstring)
        self.path = export(workload, self.flavour, capacity, self.cache_dir,
                           accuracy_level=self.ep.accuracy_level, tokens=k,
                           rollback="deferred" if deferred else None)
        self._open(self.path)
        self.kernel = _KernelBytes(self.path, shared=self.shared_buffer)
        self.details.update(provider=self.session.get_providers()[0], flavour=self.flavour,
                            mode=self.mode, model=str(self.path), host_cache=self.host_cache,
                            kernel_bytes_base=self.kernel.base,
                            kernel_bytes_per_token=self.kernel.per_token)
        if self.ep.records_assignment:
            self.details.update(self._assignment())
        self.graph = _ExportFeeds(self.specs, self.flavour,
                                  ExportDeferred(self.cfg, k) if deferred else None)
        self._allocate()
        self.reset()

    def _prepare_model(self, capacity: int) -> None:
        """Open a model statebench did not export: its pasts paired by name, each past's
        dims pinned from the model's own shapes (batch 1; a growing axis starts empty), the
        other inputs fed from their names (``_model_feeds``)."""
        proto = onnx.load(str(self.model), load_external_data=False)
        why = self.model_refusal(proto, self.hand_pairs)
        if why:
            raise RuntimeError(f"{self.name} is unavailable for {self.model}: {why}")
        self.capacity = capacity
        session_path, deferred = self.model, None
        if self.speculative and self.rolls_back_models and self.tokens_per_step > 1:
            proto, deferred, session_path = self._deferred_model(proto)
        pairs = list_kv_pairs(proto, self.hand_pairs)
        dims = {k: d.value for k, d in default_dims(proto, capacity).items()}
        inits = {t.name for t in proto.graph.initializer}
        inputs = {i.name: i for i in proto.graph.input if i.name not in inits}
        self.axes = {}
        self.specs = []
        heads = past_head_sizes(proto)  # per layer, where a symbol names them all alike
        for p in pairs:
            tt = inputs[p.input].type.tensor_type
            shape = []
            last = len(tt.shape.dim) - 1
            for i, d in enumerate(tt.shape.dim):
                if i == p.axis:
                    shape.append(capacity)
                elif d.HasField("dim_value"):
                    shape.append(d.dim_value)
                elif i == last and p.input in heads:
                    shape.append(heads[p.input])
                elif d.dim_param in dims:
                    shape.append(dims[d.dim_param])
                else:
                    raise RuntimeError(f"{self.model}: {p.input} has a dim "
                                       f"{d.dim_param or '(unnamed)'!r} no rule pins")
            self.specs.append(CacheSpec(p.input, p.output, tuple(shape), p.kind, -1,
                                        _np_type(tt.elem_type).name))
            self.axes[p.input] = p.axis if p.kind == "append" else None
        paired = {p.input for p in pairs} | ({ACCEPTED} if deferred else set())
        self.feed_inputs = {n: vi for n, vi in inputs.items() if n not in paired}
        unknown = [n for n in self.feed_inputs if n not in _MODEL_FEEDS]
        if unknown:
            raise RuntimeError(f"{self.model}: statebench does not know what to feed input "
                               f"{unknown[0]!r} (it feeds {', '.join(_MODEL_FEEDS)})")
        if "input_ids" not in self.feed_inputs:
            raise RuntimeError(f"{self.model}: the graph has no input_ids input")
        self.present_of = {p.input: p.output for p in pairs}
        self.session = self._session(session_path)
        self.output_names = [o.name for o in self.session.get_outputs()]
        if "logits" not in self.output_names:
            raise RuntimeError(f"{self.model}: the graph has no logits output")
        self.kernel = _ModelKernelBytes(proto, {**heads, **{
            self.present_of[k]: v for k, v in heads.items() if k in self.present_of}})
        self.vocab = (self.kernel.infos[1].get("logits") or [0, 0])[-2]  # dims, then the type
        self.details.update(provider=self.session.get_providers()[0], mode=self.mode,
                            model=str(self.model), host_cache=self.host_cache,
                            pairs={p.input: p.output for p in pairs},
                            kernel_bytes_base=self.kernel.base,
                            kernel_bytes_per_token=self.kernel.per_token,
                            kernel_bytes_unsized=sorted(self.kernel.unsized)[:50])
        if self.ep.records_assignment:  # a model's nodes may fall back as a preset's may
            self.details.update(self._assignment())
        self.graph = _ModelFeeds(self.specs, self.axes, self.feed_inputs,
                                 capacity if self.static_mask else None, deferred)
        if deferred is not None:
            self.details["rollback"] = "deferred commit (accepted_count)"
            self.details["deferred_commit"] = deferred.describe()
        self._allocate()
        self.reset()

    #: a mode whose ``accept`` rolls a model as given back (host arrays), so a speculative
    #: loop's K-token graph of a hybrid export is made deferred-commit
    rolls_back_models = False

    def _deferred_model(self, proto: onnx.ModelProto):
        """A model as given pinned at batch 1 and K new tokens, rewritten into
        deferred-commit form (``backends.webnn.deferred_commit``; its growing caches left
        growing) and written where the session can read it, its external data linked
        beside it: (the proto, the ``DeferredGraph`` or None where nothing was rewritten,
        the session's path). Where the rewrite refuses, the model as it is and the reason
        kept for ``rollback_refusal``."""
        import tempfile

        from backends.webnn.deferred_commit import try_deferred
        from backends.webnn.dims import batch_dims, new_token_dims

        k = self.tokens_per_step
        dims = {d: 1 for d in batch_dims(proto)}
        dims.update({d: k for d in new_token_dims(proto) if isinstance(d, str)})
        pinned = pin(proto, dims)
        done, self._deferred_refusal = try_deferred(pinned, k)
        if done is None:
            return proto, None, self.model
        if any(r.dtype != onnx.TensorProto.FLOAT for r in done.recurrent):
            # the pages run it (float16 state, every m); ORT's CPU EP on the rewritten graph
            # gives a state far from its own one-token decode's, at full acceptance too
            self._deferred_refusal = ("the deferred-commit rewrite of a float16 state: ORT's "
                                      "CPU EP does not reproduce its one-token decode on it "
                                      "(docs/speculative.md)")
            return proto, None, self.model
        self._rewritten_dir = tempfile.TemporaryDirectory(prefix="statebench-deferred-")
        where = Path(self._rewritten_dir.name)
        for t in pinned.graph.initializer:  # the weights stay where they are: linked
            for e in t.external_data:
                if e.key == "location" and not (where / e.value).exists():
                    (where / e.value).parent.mkdir(parents=True, exist_ok=True)
                    (where / e.value).symlink_to(self.model.parent.resolve() / e.value)
        path = where / self.model.name
        onnx.save(pinned, str(path))
        return pinned, done, path

    def _empty_pasts(self, growing: bool) -> dict[str, np.ndarray]:
        """Every cache at depth 0: zeros, a growing one with no rows on its axis."""
        return self._page_pasts(None, growing=growing)

    def _open(self, path: Path) -> None:
        """The session on ``path`` and, by name (``list_kv_pairs``' rules), the output each
        cache's next past comes from: exporters order presents differently from pasts
        (genai key-major), so pairing by position would silently cross keys and values."""
        pairs = {p.input: p.output for p in list_kv_pairs(path)}
        missing = [s.input for s in self.specs if s.input not in pairs]
        if missing:
            raise RuntimeError(f"{path}: no present pairs with {', '.join(missing)}")
        self.present_of = {s.input: pairs[s.input] for s in self.specs}
        self.session = self._session(path)
        self.output_names = [o.name for o in self.session.get_outputs()]

    #: WebGPU EP options (``add_provider_for_devices``)
    ep_options: dict[str, str] = {}

    def _session(self, path: Path):
        so = ort.SessionOptions()
        so.log_severity_level = 4  # a failure is the point's reason, said once in one line
        for key, value in self.ep.session_config.items():
            so.add_session_config_entry(key, value)
        if self.ep.builtin is not None:
            return ort.InferenceSession(str(path), sess_options=so, providers=[self.ep.builtin])
        devices, why = self.ep.devices()
        if not devices:
            raise RuntimeError(why)
        so.add_provider_for_devices(devices[:1], dict(self.ep_options))
        return ort.InferenceSession(str(path), sess_options=so)

    def _assignment(self) -> dict[str, object]:
        """Which nodes the WebGPU EP did not take (they fell back to the CPU EP)."""
        try:
            subgraphs = self.session.get_provider_graph_assignment_info()
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            return {"cpu_fallback": f"unknown ({exc})"}
        fallback = [f"{n.op_type}:{n.name}" for sg in subgraphs if sg.ep_name != WEBGPU_EP
                    for n in sg.get_nodes()] if subgraphs else []
        return {"cpu_fallback": bool(fallback), "cpu_fallback_nodes": fallback[:50]}

    @property
    def _device(self) -> str:
        return self.ep.device

    def _new_value(self, shape: list[int], dtype: np.dtype):
        """An uninitialised OrtValue on the EP's device: a plugin EP's from its session (its
        allocator), a built-in one's from ORT's."""
        if self.ep.builtin is None:
            return self.session.create_ortvalue_from_shape_and_type(shape, dtype, self.ep.device, 0)
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.ep.device, 0)

    def _device_value(self, host: np.ndarray):
        """A device OrtValue holding a copy of `host` (counted as h2d)."""
        if not host.size:  # an empty past holds no bytes anywhere; keep it off the device
            return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(host))
        value = self._new_value(list(host.shape), host.dtype)
        value.update_inplace(np.ascontiguousarray(host))
        self.counters.h2d += host.nbytes
        return value

    def _allocate(self) -> None:
        """Allocate long-lived buffers (shared mode)."""

    # --- per step helpers ---------------------------------------------------------------
    def _check_depth(self, depth: DepthState) -> None:
        if depth.depth >= self.capacity:
            raise ValueError(f"depth {depth.depth} leaves no room in capacity {self.capacity}")
        self.graph.check(depth)

    def _page_pasts(self, depth: DepthState | None, growing: bool) -> dict[str, np.ndarray]:
        """The pasts a page hands the session at `depth` (None: an empty cache)
        (``_GraphFeeds.pasts``)."""
        return self.graph.pasts(depth, growing)

    def _id_feeds(self, token: int | np.ndarray) -> dict[str, np.ndarray]:
        last = self.position + self.tokens_per_step - 1  # a K-token step writes K rows
        if last >= self.capacity:
            raise ValueError(f"capacity {self.capacity} exceeded at position {last}")
        return self.graph.feeds(token, self.position)

    def step(self, token: int) -> np.ndarray:
        if self.tokens_per_step != 1:
            raise ValueError(f"{self.name} was built for {self.tokens_per_step} tokens a step "
                             "(step_tokens)")
        return self._step(token)

    def step_tokens(self, tokens: np.ndarray) -> np.ndarray:
        tokens = check_tokens(tokens, self.tokens_per_step)
        k = len(tokens)
        return self._step(int(tokens[0]) if k == 1 else tokens).reshape(k, -1)

    def _count_kernel(self) -> None:
        self.counters.kernel += self.kernel.at(self.position)

    def _logits_array(self) -> tuple[np.ndarray, ort.OrtValue]:
        """One host array for the logits, reused every step, and a CPU OrtValue over its
        memory: as the WebNN pages read theirs (``readTensor(tensor, outputData)``), since a
        fresh array a step is fresh heap the copy faults in (docs/measuring.md, "Host
        time")."""
        if self._logits_host is None:
            self._logits_host = np.empty((1, self.tokens_per_step, self.vocab),
                                         self._logits_dtype())
            self._logits_host_value = ort.OrtValue.ortvalue_from_numpy(self._logits_host)
        return self._logits_host, self._logits_host_value

    def _logits_dtype(self) -> np.dtype:
        """The logits' type as the session declares it (a genai q4f16 export's are
        float16): a bound output must be exactly that type, or ORT refuses the run."""
        declared = {o.name: o.type for o in self.session.get_outputs()}.get("logits")
        return np.dtype(np.float16 if declared == "tensor(float16)" else np.float32)

    @property
    def commits_by_count(self) -> bool:
        """The session's graph is a deferred-commit one, fed ``accepted_count``."""
        return self.graph is not None and self.graph.deferred

    def _dropped(self, kept: int) -> int:
        """The tokens ``accept(kept)`` drops of the last step's K (0: nothing to do), refused
        in one line where this mode cannot roll them back (``rollback_refusal``)."""
        dropped = self.tokens_per_step - self.kept_of(kept)
        why = self.rollback_refusal() if dropped else ""
        if why:
            raise NotImplementedError(f"{self.name} cannot roll back: {why}")
        return dropped

    def _read_logits(self, value: ort.OrtValue | None = None) -> np.ndarray:
        """The step's logits, flat, in the graph's type: the page's host array, which the
        EP wrote (``value`` None) or a device ``value`` is copied into
        (``onnxruntime.copy_tensors``); where ORT has no such copy for the device,
        ``numpy()`` (a fresh array a step). Which one ran: details["logits_read"]."""
        host, host_value = self._logits_array()
        if value is None:
            return host.reshape(-1)
        if self.details.get("logits_read") != "numpy()":
            try:
                ort.copy_tensors([value], [host_value])
                self.details["logits_read"] = "copy_tensors into one host array"
                return host.reshape(-1)
            except (AttributeError, RuntimeError) as exc:
                self.details["logits_read"] = "numpy()"
                self.details["logits_read_reason"] = str(exc).splitlines()[0][:200]
        return value.numpy().reshape(-1)

    def close(self) -> None:
        self.session = None
        if self._rewritten_dir is not None:
            self._rewritten_dir.cleanup()
            self._rewritten_dir = None


def _positions(ids: np.ndarray, position: int, shape: list[int | None]) -> np.ndarray:
    """position_ids of the K = ``ids.shape[1]`` tokens: [1, K], or Qwen's multimodal
    [R, 1, K] (text: the same in every row): genai's three rotary sections, transformers'
    Qwen3.5 a text row and three sections (4)."""
    row = np.arange(position, position + ids.shape[1])
    return np.tile(row, ((shape[0] or 3), 1, 1)) if len(shape) == 3 else row[None]


#: a model's own inputs statebench feeds, by name: (ids [1, K], position of the first,
#: declared shape) -> array
_MODEL_FEEDS = {
    "input_ids": lambda ids, position, shape: ids,
    "attention_mask": lambda ids, position, shape: np.ones((1, position + ids.shape[1])),
    "position_ids": _positions,
    "seqlens_k": lambda ids, position, shape: np.array([position + ids.shape[1] - 1]),
    "total_sequence_length": lambda ids, position, shape: np.array(position + ids.shape[1]),
}


class _HostArrays(_OrtBackend):
    """`copy` and `standard`: every cache is a host array handed to `run()` and returned."""

    @classmethod
    def model_refusal(cls, proto: onnx.ModelProto, hand_pairs: dict[str, str] | None = None) -> str:
        return ("" if cls.flavour == ORT else "the standard mode runs statebench's own "
                "standard-flavour export at a fixed capacity, not a model as given")

    host_cache = True  # its floor includes the cache both ways over the host link
    rolls_back_models = True

    def reset(self) -> None:
        self.position = 0
        self.past = self._empty_pasts(growing=self.flavour == ORT)
        self.graph.accepted = 0  # a deferred commit: nothing of a last dispatch to commit

    def reach_depth(self, depth: DepthState) -> None:
        self._check_depth(depth)
        self.past = self._page_pasts(depth, growing=self.flavour == ORT)
        self.position = depth.depth
        self.graph.accepted = 0  # the state handed in is committed

    def _step(self, token: int | np.ndarray) -> np.ndarray:
        return self._run(self._id_feeds(token), self.tokens_per_step)

    def _run(self, feeds: dict[str, np.ndarray], k: int) -> np.ndarray:
        """One run of ``k`` tokens fed with the pasts; the logits, flat, in the graph's type."""
        feeds.update(self.past)
        self.counters.h2d += sum(a.nbytes for a in feeds.values())
        outs = self.session.run(None, feeds)
        self.counters.d2h += sum(o.nbytes for o in outs)
        self._count_kernel()
        by_name = dict(zip(self.output_names, outs, strict=True))
        self.past = {s.input: by_name[self.present_of[s.input]] for s in self.specs}
        self.position += k
        self.graph.accepted = k  # unless ``accept`` keeps fewer
        return by_name["logits"].reshape(-1)

    def prefill(self, tokens: np.ndarray) -> np.ndarray:
        """Feed ``tokens`` in one run (a prompt chunk), whatever ``tokens_per_step`` is, on a
        model as given whose input_ids and growing pasts take any count of new tokens
        (``harness.model_run.takes_token_chunks``); return the last token's logits. The
        reference's way to a depth (``harness.sources.OrtReferenceWalk``): one run of 256
        tokens, not 256 runs each copying the whole cache in and out."""
        ids = np.asarray(tokens, np.int64).reshape(-1)
        if self.model is None or self.flavour != ORT:
            raise ValueError(f"{self.name}: prefill runs a model as given")
        if self.position + len(ids) > self.capacity:
            raise ValueError(f"capacity {self.capacity} exceeded at position "
                             f"{self.position + len(ids) - 1}")
        logits = self._run(self.graph.feeds(ids, self.position), len(ids))
        return logits[-(logits.size // len(ids)):]

    # -- speculative decoding (issue 31 item 4, docs/speculative.md) ---------------------
    def rollback_refusal(self) -> str:
        """Why ``accept`` cannot keep fewer than K tokens here ("" where it can): KV rows
        roll back, an overwritten pair (a GDN state) does not."""
        if self.graph.deferred:
            return ""
        if self._deferred_refusal:
            return self._deferred_refusal
        kept = [s.input for s in self.specs if s.kind != "append"]
        return f"{', '.join(kept[:2])} are overwritten by every token" if kept else ""

    def accept(self, kept: int) -> None:
        """Keep the first ``kept`` of the last step's K tokens: the next step at P + kept,
        a growing past (copy mode) cut to its P + kept valid rows, a fixed one (standard)
        masked past them by position; a deferred-commit graph (a hybrid's, standard) is told
        ``kept`` as its next dispatch's ``accepted_count`` and commits its GDN state and conv
        window itself, as the pages' (no bytes move)."""
        dropped = self._dropped(kept)
        if not dropped:
            return
        self.position -= dropped
        self.graph.accepted = self.tokens_per_step - dropped
        if self.flavour == ORT:  # each growing past cut on its own axis (a model's may differ)
            for s in self.specs:
                if s.kind == "append":
                    cut = [slice(None)] * self.past[s.input].ndim
                    axis = self.axes.get(s.input)
                    cut[2 if axis is None else axis] = slice(0, self.position)
                    self.past[s.input] = np.ascontiguousarray(self.past[s.input][tuple(cut)])

    def state_snapshot(self, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The pasts the next step is fed, copies (checks and tests); a deferred-commit
        graph's with their commit made (its hand-over's ``committed``: the reference's
        layout, float64), as the pages give theirs."""
        pasts = self.past
        if self.graph.deferred:
            pasts = self.graph.state.committed(pasts, self.graph.accepted)
        return {n: a.copy() for n, a in pasts.items() if names is None or n in names}


class _IOBinding(_OrtBackend):
    """`iobinding`: presents stay in ORT-allocated device values and are fed back."""

    mode = "iobinding"

    def reset(self) -> None:
        self.position = 0
        self.values = {k: self._device_value(a)
                       for k, a in self._empty_pasts(growing=True).items()}

    def device_bytes(self) -> int | None:
        return sum(v.tensor_size_in_bytes() for v in self.values.values())

    def reach_depth(self, depth: DepthState) -> None:
        self._check_depth(depth)
        self.values = {k: self._device_value(a)
                       for k, a in self._page_pasts(depth, growing=True).items()}
        self.position = depth.depth

    def _step(self, token: int | np.ndarray) -> np.ndarray:
        io = self.session.io_binding()
        for name, arr in self._id_feeds(token).items():
            io.bind_cpu_input(name, arr)
            self.counters.h2d += arr.nbytes
        for s in self.specs:
            io.bind_ortvalue_input(s.input, self.values[s.input])
        bound = ["logits"] + [self.present_of[s.input] for s in self.specs]
        # the CPU EP writes the logits into the page's array, where their width is known
        on_host = self.ep.logits_on_host and self.vocab >= 1
        if on_host:
            io.bind_ortvalue_output("logits", self._logits_array()[1])
        for name in bound[on_host:]:
            io.bind_output(name, self._device)
        self.session.run_with_iobinding(io)
        by_name = dict(zip(bound, io.get_outputs(), strict=True))  # in binding order
        logits = self._read_logits(None if on_host else by_name["logits"])
        self.counters.d2h += logits.nbytes
        self._count_kernel()
        self.values = {s.input: by_name[self.present_of[s.input]] for s in self.specs}
        self.position += self.tokens_per_step
        return logits


#: the inputs that give GroupQueryAttention its lengths without an attention_mask
_GQA_LENGTHS = frozenset({"seqlens_k", "total_sequence_length"})


class _Shared(_OrtBackend):
    """`shared`: one capacity-sized value per cache bound as both past and present."""

    mode = "shared"
    shared_buffer = True

    @classmethod
    def model_refusal(cls, proto: onnx.ModelProto, hand_pairs: dict[str, str] | None = None) -> str:
        """A growing cache can share one buffer with its present only as GroupQueryAttention's
        past_key/past_value, its length from an attention_mask (ORT's shared-buffer GQA, as
        genai's past_present_share_buffer) or from seqlens_k and total_sequence_length fed as
        inputs (statebench's own export): any other growing cache is refused, naming it."""
        gqa = {n.input[j] for n in proto.graph.node if n.op_type == "GroupQueryAttention"
               for j in (3, 4) if j < len(n.input)}
        feeds = {i.name for i in proto.graph.input}
        for p in list_kv_pairs(proto, hand_pairs):
            if p.kind != "append":
                continue
            if p.input not in gqa:
                # the op that writes its present grows it (a Shape may read the past first)
                op = next((n.op_type for n in proto.graph.node if p.output in n.output),
                          next((n.op_type for n in proto.graph.node if p.input in n.input),
                               "nothing"))
                return (f"its cache {p.input} grows through {op}, not GroupQueryAttention: one "
                        "buffer bound as past and present needs GQA's shared-buffer mode")
            if "attention_mask" not in feeds and not feeds >= _GQA_LENGTHS:
                return ("its GroupQueryAttention's lengths come from no input (attention_mask, "
                        "or seqlens_k and total_sequence_length): with one buffer as past and "
                        "present, ORT would take the buffer's length for the sequence's")
        return ""

    def _allocate(self) -> None:
        if self.vocab < 1:
            raise RuntimeError(f"{self.model}: the width of its logits is not known from its "
                               "shapes, which a bound logits buffer needs")
        self.values = {s.input: self._new_value(list(s.shape), np.dtype(s.dtype))
                       for s in self.specs}
        # an EP that writes the logits straight into the page's host array binds that
        self.logits = (self._logits_array()[1] if self.ep.logits_on_host
                       else self._new_value([1, self.tokens_per_step, self.vocab],
                                            self._logits_dtype()))
        self.io = self.session.io_binding()
        for s in self.specs:
            self.io.bind_ortvalue_input(s.input, self.values[s.input])
            self.io.bind_ortvalue_output(self.present_of[s.input], self.values[s.input])
        self.io.bind_ortvalue_output("logits", self.logits)
        self.details["in_place"] = {s.input: True for s in self.specs}

    def device_bytes(self) -> int | None:
        return (sum(s.nbytes for s in self.specs)
                + self.tokens_per_step * self.vocab * self._logits_dtype().itemsize)

    def _upload(self, cache: dict[str, np.ndarray]) -> None:
        for s in self.specs:
            arr = into_capacity(np.ascontiguousarray(in_layout(s, cache[s.input]), s.dtype), s.shape)
            self.values[s.input].update_inplace(arr)
            self.counters.h2d += arr.nbytes

    def reset(self) -> None:
        self.position = 0
        self._upload({s.input: np.zeros(s.shape, s.dtype) for s in self.specs})

    def reach_depth(self, depth: DepthState) -> None:
        self._check_depth(depth)
        self._upload(depth.cache)
        self.position = depth.depth

    def _feed(self, name: str, arr: np.ndarray) -> None:
        """Hand one id/length input to the session (bound from the host each step)."""
        self.io.bind_cpu_input(name, arr)

    def state_snapshot(self, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The buffers the next step reads, copied to the host (checks and tests): each
        cache's capacity rows, in the layout the step feeds, as the host-array modes give
        theirs."""
        return {s.input: np.array(self.values[s.input].numpy()) for s in self.specs
                if names is None or s.input in names}

    def rollback_refusal(self) -> str:
        """Why ``accept`` cannot keep fewer than K tokens here ("" where it can): the KV rows
        roll back by position; a state every token overwrites (a hybrid's) does not, since
        this mode runs no deferred-commit graph."""
        kept = [s.input for s in self.specs if s.kind != "append"]
        return (f"{', '.join(kept[:2])} are overwritten by every token (the deferred-commit "
                "rewrite runs in the host-array modes only)" if kept else "")

    def accept(self, kept: int) -> None:
        """Keep the first ``kept`` of the last step's K tokens by position, the proposal's
        way: the one buffer each cache shares with its present holds capacity rows, and the
        lengths (attention_mask, or seqlens_k and total_sequence_length) are fed from the
        position each step, so the next step writes its rows at P + kept and no query reads
        the dropped rows. No bytes move."""
        self.position -= self._dropped(kept)

    def _step(self, token: int | np.ndarray) -> np.ndarray:
        for name, arr in self._id_feeds(token).items():
            self._feed(name, arr)
            self.counters.h2d += arr.nbytes
        self.session.run_with_iobinding(self.io)
        logits = self._read_logits(None if self.ep.logits_on_host else self.logits)
        self.counters.d2h += logits.nbytes
        self._count_kernel()
        self.position += self.tokens_per_step
        return logits


class _Captured(_Shared):
    """`captured`: `shared` under the WebGPU EP's graph capture. Replays need every input
    at the address and shape it was captured with, so the ids, positions and GQA lengths are
    device values too, written in place each step; a model's attention_mask is
    capacity-sized (ones over the positions so far, zeros after), as onnxruntime-genai feeds
    its static mask of max_length under graph capture (``DefaultPositionInputs``' static
    mask handling). What the EP cannot capture, ORT refuses, in its own words, when the
    session is made or run."""

    mode = "captured"
    ep_options = {"enableGraphCapture": "1"}
    static_mask = True

    #: the EP must replay a captured graph (``Provider.graph_capture``)
    needs_capture = True

    def _allocate(self) -> None:
        super()._allocate()
        self.feeds = {}
        k = self.tokens_per_step
        for name, arr in self._id_feeds(0 if k == 1 else np.zeros(k, np.int64)).items():
            v = self._new_value(list(arr.shape), arr.dtype)
            self.io.bind_ortvalue_input(name, v)
            self.feeds[name] = v
        self.details["graph_capture"] = dict(self.ep_options) if self.ep.graph_capture else {}
        self.details["static_feeds"] = {name: list(v.shape()) for name, v in self.feeds.items()}

    def _feed(self, name: str, arr: np.ndarray) -> None:
        self.feeds[name].update_inplace(arr)  # the address the capture recorded stays


_MODES: dict[str, tuple[type[_OrtBackend], str]] = {
    "copy": (_HostArrays, ORT),
    "iobinding": (_IOBinding, ORT),
    "shared": (_Shared, ORT),
    "standard": (_HostArrays, STANDARD),
    "captured": (_Captured, ORT),
}

def backend_class(ep: Provider, mode: str) -> type[_OrtBackend]:
    """The class of ``mode`` (``copy``, ``iobinding``, ``shared``, ``standard``,
    ``captured``) on provider ``ep``, named ``ort-<ep.key>:<mode>``: what the registry holds
    for each of ``PROVIDERS``. Tests build one for a provider record of their own (the CPU EP
    with its logits in a device value, as the WebGPU EP's), so the code paths a GPU runs
    are run here; on a provider without graph capture (``ep.graph_capture`` False)
    `captured` runs its fixed-shape, fixed-address feeds with nothing captured."""
    base, flavour = _MODES[mode]
    return type(f"Ort{ep.key.capitalize()}{mode.capitalize()}", (base,), {
        "name": f"ort-{ep.key}:{mode}", "ep": ep, "provider": ep.key, "mode": mode,
        "flavour": flavour, "on_cpu": ep.on_cpu, "__module__": __name__,
        "__doc__": f"ONNX Runtime, {ep.key} EP, {mode} mode ({flavour} flavour).",
    })


#: the registered classes, by name (one per provider x mode the provider can run)
BACKENDS: dict[str, type[_OrtBackend]] = {}
for _ep in PROVIDERS.values():
    for _mode, (_base, _flavour) in _MODES.items():
        if _base.needs_capture and not _ep.graph_capture:
            continue
        _cls = backend_class(_ep, _mode)
        BACKENDS[_cls.name] = register(_cls)


def cpu_session_error(path: str | os.PathLike) -> str:
    """Why an InferenceSession on the CPU EP does not load the graph at ``path`` (ORT's
    reason, one line), or "" when it loads: what `statebench inspect` reports for ORT."""
    if ort is None:
        return "onnxruntime is not installed"
    so = ort.SessionOptions()
    so.log_severity_level = 4  # ORT's reason is returned, not logged as well
    try:
        ort.InferenceSession(os.fspath(path), sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT's own reason is the answer
        return " ".join(str(exc).split())
    return ""
