"""The decode step as ONNX, in two flavours, from the same weights (DESIGN §5).

`standard`: what a WebNN page can express. Opset 21, static shapes, only `STANDARD_OPS`, the
KV caches at a fixed capacity C updated by one ScatterND each (data = the graph input
`past_key_values.N.*`, output = the graph output `present.N.*`: the "append pair" the WebNN
stateful transform looks for), attention over all C rows with a mask built in-graph
(LessOrEqual of a constant arange(C) against the position), the GDN layers' causal conv
(Concat of the window and the new column, Mul + ReduceSum, SiLU; the next window a Slice) and
recurrence as plain ops.
Inputs: `input_ids` int64 [1,1], `position_ids` int64 [1,1], then every `cache_specs` input.

`ort`: as onnxruntime-genai's builder emits it. com.microsoft GroupQueryAttention (do_rotary=1,
cos/sin caches of length C, BNSH past/present with symbolic lengths `past_sequence_length` /
`total_sequence_length`, so one graph serves a growing past *and* the shared max-length buffer)
and, for the gated delta layers, what genai emits for Qwen3.5 and ORT's WebGPU EP runs on
the GPU: com.microsoft CausalConvWithState (the conv window, SiLU fused), LpNormalization of
q and k, LinearAttentionGate (decay and beta) and LinearAttention (gated_delta, K-major state
(1, Hv, Dk, Dv): ``state_layout``); SkipSimplifiedLayerNormalization for residual + RMSNorm.
(GatedDeltaNet, which the WebGPU EP does not run, stays in the speculative-decoding code's
own graphs.)
GQA's `seqlens_k` int32 [1] (= position) and `total_sequence_length` int32 [] (= position + 1)
are graph inputs (genai derives them from an attention mask in-graph; inputs keep every
integer op off the device): inputs are `input_ids`, `seqlens_k`, `total_sequence_length`, then
the caches.

A float16-cache model (`ModelConfig.kv_cache`, preset suffix `+f16kv`) has float16 cache
inputs and outputs in both flavours and computes in float32. The standard flavour casts each
new K/V row to float16 before its ScatterND, and casts the cache to float32 where attention
reads it. The ORT flavour runs GroupQueryAttention in float16 (one type for q, k, v, the
caches, cos/sin and the output): q, k and v are cast in and the output is cast back
(FINDINGS 19).

Both flavours reference one external weights file per (model, seed): `<name>-<hash>-s<seed>/
weights.bin` beside the graphs, written once (atomically) and reused by every capacity and
flavour. Only capacity-dependent constants (RoPE tables, the mask's arange) live inside the
`.onnx`. Each file (weights and graphs) carries a content checksum (`<file>.sum`,
`model.checksum`) and is rebuilt, with one line on stderr, when it no longer matches. A 4-bit
model's ORT flavour also comes at MatMulNBits accuracy_level 0 (`accuracy_level=0`,
`ort-c<C>-acc0.onnx`), the graph the CPU EP runs: built, sealed and checked as the others. With
tied embeddings the head is a stored transposed copy of `embed_tokens` (`lm_head`, (hidden,
vocab)), since Gemm(transB) is not in the standard op list.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from backends.webnn.rollback_names import MAX_TOKENS
from model import checksum
from model import export_deferred as D
from model import quantize as Q
from model.atomic import atomic_file
from model.rollback_feeds import cache_specs_deferred
from model.workload import (
    ATTENTION,
    K_MAJOR,
    V_MAJOR,
    ModelConfig,
    Workload,
    cache_specs,
    config_key,
    default_cache_dir,
    quantised_names,
    weight_shapes,
)

STANDARD = "standard"
ORT = "ort"
FLAVOURS = (STANDARD, ORT)
OPSET = 21
MS_DOMAIN = "com.microsoft"

#: the only ops the standard flavour may use (the ONNX→WebNN converter's list)
STANDARD_OPS = frozenset({
    "Gather", "MatMul", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Neg", "Sigmoid",
    "Softplus", "Softmax", "ReduceMean", "ReduceSum", "ReduceMax", "Reshape", "Transpose",
    "Concat", "Slice", "Expand", "Where", "ScatterND", "Cast", "LessOrEqual", "Unsqueeze",
    "Squeeze", "DequantizeLinear",
})

#: symbolic cache lengths of the ORT flavour
PAST_LEN = "past_sequence_length"
TOTAL_LEN = "total_sequence_length"

#: MatMulNBits' accuracy_level: int8 compute for A where the EP has it (ORT's quantizer and
#: onnxruntime-genai's q4 exports set 4)
Q4_ACCURACY_LEVEL = 4
#: the level at which A stays float32 (what the CPU EP's sessions run: backends/ort.py)
FLOAT_ACCURACY_LEVEL = 0
#: the levels MatMulNBits defines (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8)
MATMULNBITS_LEVELS = (0, 1, 2, 3, 4)

_ALIGN = 64
_NP = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32,
       TensorProto.BOOL: np.bool_}
#: a cache's data type (CacheSpec.dtype) -> its ONNX element type
_ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
_NP_OF = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _stored(cfg: ModelConfig) -> type:
    """The NumPy type the float (unquantised) weights and the 4-bit scales are stored as:
    the activations' (ModelConfig.dtype; float16 models' weights are float16 values)."""
    return np.float16 if cfg.dtype == "float16" else np.float32


def _own_level(workload: Workload, flavour: str, accuracy_level: int | None) -> int | None:
    """The MatMulNBits accuracy level that makes a graph of its own: None where the graph
    has no MatMulNBits (standard flavour, float weights) or the level is the exported one."""
    if accuracy_level is None or accuracy_level == Q4_ACCURACY_LEVEL:
        return None
    if accuracy_level not in MATMULNBITS_LEVELS:
        raise ValueError(f"accuracy_level {accuracy_level!r}; accepted: "
                         f"{', '.join(map(str, MATMULNBITS_LEVELS))}")
    if flavour != ORT or not quantised_names(workload.config):
        return None
    return accuracy_level


#: ``export``'s rollback forms (None: the ordinary graph)
ROLLBACKS = ("deferred",)


def _check_rollback(workload: Workload, flavour: str, tokens: int, rollback: str | None
                    ) -> str | None:
    """``rollback`` as given where the graph can take it, else ValueError."""
    if rollback is None:
        return None
    if rollback not in ROLLBACKS:
        raise ValueError(f"rollback {rollback!r}; accepted: {', '.join(ROLLBACKS)} (or None)")
    if flavour != STANDARD:
        raise ValueError(f"rollback {rollback!r} is a form of the standard flavour's graph")
    if not workload.config.gdn_layers:
        raise ValueError(f"rollback {rollback!r}: {workload.config.name} has no GDN layers "
                         "(its K-token graph's KV rows roll back by position as they are)")
    if not 1 <= tokens <= MAX_TOKENS:
        raise ValueError(f"rollback {rollback!r} takes 1..{MAX_TOKENS} tokens a step (the "
                         f"capsule's capacity), not {tokens}")
    return rollback


def _check_tokens(tokens: int) -> int:
    """``tokens`` (new tokens a dispatch takes) as an int >= 1, else ValueError."""
    if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 1:
        raise ValueError(f"tokens {tokens!r}: the new tokens a step takes, an integer >= 1")
    return int(tokens)


def graph_path(workload: Workload, flavour: str, capacity: int,
               cache_dir: str | os.PathLike | None = None, *,
               accuracy_level: int | None = None, tokens: int = 1,
               rollback: str | None = None) -> Path:
    """Where `export` puts (and finds) the graph of one flavour, capacity, MatMulNBits
    accuracy level, new tokens a step and rollback form (`export`; ``-k<tokens>`` only where
    tokens > 1, ``-<rollback>`` only where given, so the other graphs keep their names)."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}; accepted: {', '.join(FLAVOURS)}")
    tokens = _check_tokens(tokens)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    level = _own_level(workload, flavour, accuracy_level)
    suffix = "" if level is None else f"-acc{level}"
    if tokens > 1:
        suffix += f"-k{tokens}"
    if _check_rollback(workload, flavour, tokens, rollback) is not None:
        suffix += f"-{rollback}"
    return (root / config_key(workload.config, workload.seed)
            / f"{flavour}-c{capacity}{suffix}.onnx")


def export(workload: Workload, flavour: str, capacity: int,
           cache_dir: str | os.PathLike | None = None, *, force: bool = False,
           accuracy_level: int | None = None, tokens: int = 1,
           rollback: str | None = None) -> Path:
    """The graph for (workload, flavour, capacity), exported unless already on disk.

    `accuracy_level` is the one its MatMulNBits nodes compute at (None: the exported
    Q4_ACCURACY_LEVEL); another level is a graph of its own (`-acc<level>` in its name),
    made and checked like every graph. A graph without MatMulNBits (the standard flavour,
    float weights) is the same graph at every level, so it is that one file.
    `tokens` (K) is the new tokens one dispatch takes at positions P .. P+K-1 (a verify
    step of speculative decoding, or a chunk of a prefill): K rows written to each KV
    cache, causal inside the K, logits for all K ([1, K, vocab]); K = 1 is the decode step.
    `rollback` "deferred" (standard flavour, a model with GDN layers, K <= 8): every GDN
    layer in deferred-commit form (``model.export_deferred``), so a speculative loop rolls
    the graph back to any m of its K tokens with no new API: an int64 input
    ``accepted_count`` [1] and each layer's capsule pair (``model.rollback_feeds``)."""
    path = graph_path(workload, flavour, capacity, cache_dir, accuracy_level=accuracy_level,
                      tokens=tokens, rollback=rollback)
    tokens = _check_tokens(tokens)
    level = _own_level(workload, flavour, accuracy_level)
    if not force:
        # the weights file the graph points to is checked (or rebuilt) on every reuse too:
        # a backend reads both, and a graph never changes when its weights file is rebuilt
        write_weights(workload, path.parent)
        if quantised_names(workload.config):
            write_q4_weights(workload, path.parent, flavour)
        if checksum.reusable(path, "graph") and _stamp_path(path).is_file() and \
                _stamp_path(path).read_text() == exporter_digest():
            return path
    if flavour == STANDARD:
        done = export_standard(workload, capacity, path, tokens=tokens, rollback=rollback)
    else:
        done = export_ort(workload, path, capacity,
                          accuracy_level=Q4_ACCURACY_LEVEL if level is None else level,
                          tokens=tokens)
    _atomic_write(_stamp_path(done), exporter_digest().encode())
    return done


#: the modules whose code decides a graph's bytes (``exporter_digest``)
_EXPORTER_MODULES = ("export.py", "export_deferred.py", "quantize.py", "rollback_feeds.py",
                     "workload.py")
_DIGEST: list[str] = []


def exporter_digest() -> str:
    """A digest of the exporter's own source: a cached graph is reused only when the code
    that wrote it is the code that would write it now (a graph is found by its name, which
    says the workload, not the exporter's version). The weights files are keyed by the
    workload alone and kept."""
    if not _DIGEST:
        h = hashlib.sha256()
        for name in _EXPORTER_MODULES:
            h.update((Path(__file__).parent / name).read_bytes())
        _DIGEST.append(h.hexdigest()[:16])
    return _DIGEST[0]


def _stamp_path(graph: Path) -> Path:
    """The file beside a cached graph naming the exporter digest that wrote it."""
    return graph.with_name(graph.name + ".exporter")


def export_standard(workload: Workload, capacity: int, path: str | os.PathLike, *,
                    tokens: int = 1, rollback: str | None = None) -> Path:
    """Write the standard-flavour step of `tokens` new tokens with a fixed cache capacity
    (in the `rollback` form, ``export``); returns the path."""
    b = _Builder(workload, Path(path))
    b.tokens = _check_tokens(tokens)
    b.rollback = _check_rollback(workload, STANDARD, b.tokens, rollback)
    _build(b, STANDARD, capacity)
    return b.save()


def export_ort(workload: Workload, path: str | os.PathLike, capacity: int | None = None, *,
               accuracy_level: int = Q4_ACCURACY_LEVEL, tokens: int = 1) -> Path:
    """Write the ORT-flavour step of `tokens` new tokens; `capacity` sizes the RoPE caches
    (default 4096), `accuracy_level` is its MatMulNBits nodes' (4-bit models)."""
    b = _Builder(workload, Path(path))
    b.accuracy_level = accuracy_level
    b.tokens = _check_tokens(tokens)
    _build(b, ORT, capacity or 4096)
    return b.save()


# ---------------------------------------------------------------------------------------------
# weights file


def _weights_layout(cfg: ModelConfig) -> list[tuple[str, str, tuple[int, ...]]]:
    """(stored name, workload name, stored shape) of the float weights; the tied head is
    stored transposed; 4-bit tensors live in their own file (``write_q4_weights``)."""
    quantised = set(quantised_names(cfg))
    out = [(n, n, s) for n, s in weight_shapes(cfg).items() if n not in quantised]
    if not cfg.separate_head:
        out.append(("lm_head", "embed_tokens.T", (cfg.hidden, cfg.vocab)))
    return out


def write_weights(workload: Workload, directory: Path) -> dict[str, tuple[int, int]]:
    """Write `weights.bin` (+ `weights.json`) in `directory` once; returns name -> (offset, len).

    An existing file with the same layout and an intact content checksum (`model.checksum`)
    is reused; a new one is written to a temporary name and renamed, so a concurrent or
    interrupted export never leaves a half-written file.
    """
    cfg = workload.config
    layout = _weights_layout(cfg)
    manifest: dict[str, list[int]] = {}
    offset = 0
    item = np.dtype(_stored(cfg)).itemsize
    for stored, _, shape in layout:
        n = int(np.prod(shape)) * item
        manifest[stored] = [offset, n]
        offset += (n + _ALIGN - 1) // _ALIGN * _ALIGN
    meta = {"model": config_key(cfg, workload.seed), "size": offset, "tensors": manifest,
            "fingerprint": {n: _fingerprint(workload.weights[n]) for n in workload.weights}}
    bin_path, json_path = directory / "weights.bin", directory / "weights.json"
    try:
        same = json.loads(json_path.read_text()) == meta
    except (OSError, ValueError):
        same = False
    if same and checksum.reusable(bin_path, "weights", size=offset):
        return {k: (v[0], v[1]) for k, v in manifest.items()}
    with atomic_file(bin_path) as f:
        for stored, source, _ in layout:
            if source.endswith(".T"):
                arr = np.ascontiguousarray(workload.weights[source[:-2]].T)
            else:
                arr = workload.weights[source]
            f.seek(manifest[stored][0])
            f.write(np.ascontiguousarray(arr, dtype=_stored(cfg)).tobytes())
        f.truncate(offset)
    checksum.seal(bin_path)
    _atomic_write(json_path, json.dumps(meta).encode())
    return {k: (v[0], v[1]) for k, v in manifest.items()}


def _atomic_write(path: Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


def _fingerprint(arr: np.ndarray) -> str:
    """A cheap content check (head, tail and a strided sample) so a changed generator or seed
    never silently reuses stale weights."""
    flat = np.ascontiguousarray(arr, np.float32).reshape(-1)
    step = max(1, flat.size // 4096)
    sample = np.concatenate([flat[:64], flat[::step], flat[-64:]])
    return hashlib.sha256(sample.tobytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# graph builder


class _Builder:
    """Collects nodes, initializers and the shape of every value (written out as value_info)."""

    def __init__(self, workload: Workload, path: Path) -> None:
        self.workload, self.cfg, self.path = workload, workload.config, path
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.shapes: dict[str, tuple[list, int]] = {}  # name -> (dims, elem type)
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._consts: dict[bytes, str] = {}
        self._n = 0
        self.flavour = STANDARD  # set by _build
        self.tokens = 1  # K, the new tokens a step takes (``export``)
        self.rollback: str | None = None  # the rollback form (``export``)
        #: what the deferred form's GDN layers share (``export_deferred.declare``)
        self.deferred: dict[str, str] | None = None
        self.accuracy_level = Q4_ACCURACY_LEVEL  # MatMulNBits' (ORT flavour, 4-bit weights)
        self.quantised = set(quantised_names(self.cfg))
        self.q4_manifest: dict[str, tuple[int, int]] | None = None  # written on first use
        #: the activations' element type (ModelConfig.dtype); ``in_float32`` sets it to
        #: FLOAT around the parts a float16 model computes in float32 (the gated delta net)
        self.act = _ELEM[self.cfg.dtype]
        self.store = _ELEM[self.cfg.dtype]  # the float weights' stored element type
        path.parent.mkdir(parents=True, exist_ok=True)
        self.manifest = write_weights(workload, path.parent)

    # values -----------------------------------------------------------------------------
    def weight(self, name: str) -> str:
        """An initializer backed by the shared weights file (added once), cast to the
        activations' type where it is stored in another (a float16 model's float32 part)."""
        if name not in self.shapes:
            shape = dict((s, sh) for s, _, sh in _weights_layout(self.cfg))[name]
            self.external(name, self.store, list(shape), "weights.bin",
                          self.manifest[name])
        if self.act != self.store:
            wide = f"{name}.as{self.act}"
            if wide not in self.shapes:
                self.op("Cast", [name], self.shape_of(name), self.act, out=wide, to=self.act)
            return wide
        return name

    def const(self, value, dtype=None, name: str | None = None) -> str:
        """A small inline initializer (deduplicated by content); float values default to
        the activations' type."""
        arr = np.asarray(value, dtype=_NP_OF[self.act] if dtype is None else dtype)
        key = arr.dtype.str.encode() + str(arr.shape).encode() + arr.tobytes()
        if key in self._consts:
            return self._consts[key]
        name = name or f"const_{len(self._consts)}"
        self.inits.append(numpy_helper.from_array(arr, name))
        self.shapes[name] = (list(arr.shape), helper.np_dtype_to_tensor_dtype(arr.dtype))
        self._consts[key] = name
        return name

    def shape_of(self, name: str) -> list:
        return self.shapes[name][0]

    def input(self, name: str, elem: int, dims: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, dims))
        self.shapes[name] = (list(dims), elem)
        return name

    def output(self, name: str) -> None:
        dims, elem = self.shapes[name]
        self.outputs.append(helper.make_tensor_value_info(name, elem, dims))

    def op(self, op_type: str, inputs: list[str], shape: list, elem: int | None = None,
           *, out: str | None = None, outputs: list[tuple[str, list, int]] | None = None,
           domain: str = "", **attrs) -> str:
        """Add one node; `shape`/`elem` describe its (first) output (elem None: the
        activations' type)."""
        elem = self.act if elem is None else elem
        self._n += 1
        name = out or f"{op_type.lower()}_{self._n}"
        extra = outputs or []
        outs = [name] + [o[0] for o in extra]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"n{self._n}_{op_type}",
                                           domain=domain or None, **attrs))
        self.shapes[name] = (list(shape), elem)
        for o, s, e in extra:
            if o:
                self.shapes[o] = (list(s), e)
        return name

    # composite helpers -------------------------------------------------------------------
    def reshape(self, x: str, shape: list[int], out: str | None = None) -> str:
        return self.op("Reshape", [x, self.const(shape, np.int64)], shape, self.shapes[x][1],
                       out=out)

    def project(self, x: str, weight: str, out: str | None = None) -> str:
        """``x @ weight`` for a stored (K, N) matrix: a MatMul, or for a 4-bit one the
        flavour's quantised form (``_q4_project``)."""
        if weight in self.quantised:
            return _q4_project(self, x, weight, out)
        w = self.weight(weight)
        return self.op("MatMul", [x, w], self.shape_of(x)[:-1] + [self.shape_of(w)[-1]],
                       out=out)

    def external(self, name: str, elem: int, dims: list[int], file: str,
                 span: tuple[int, int]) -> str:
        """An initializer stored in ``file`` beside the graph at (offset, length)."""
        t = TensorProto(name=name, data_type=elem, dims=list(dims))
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", file), ("offset", str(span[0])), ("length", str(span[1]))):
            t.external_data.add(key=k, value=v)
        self.inits.append(t)
        self.shapes[name] = (list(dims), elem)
        return name

    def matmul(self, x: str, w: str) -> str:
        xs, ws = self.shape_of(x), self.shape_of(w)
        return self.op("MatMul", [x, w], xs[:-1] + [ws[-1]])

    def binary(self, op: str, a: str, b: str) -> str:
        sa, sb = self.shape_of(a), self.shape_of(b)
        n = max(len(sa), len(sb))
        sa, sb = [1] * (n - len(sa)) + sa, [1] * (n - len(sb)) + sb
        return self.op(op, [a, b], [x if y == 1 else y for x, y in zip(sa, sb, strict=True)],
                       self.shapes[a][1])

    def unary(self, op: str, x: str) -> str:
        return self.op(op, [x], self.shape_of(x), self.shapes[x][1])

    def cast(self, x: str, elem: int, out: str | None = None) -> str:
        return self.op("Cast", [x], self.shape_of(x), elem, out=out, to=elem)

    def in_float32(self, build, x: str) -> str:
        """``build(x)`` with float32 activations (a float16 model's gated delta net, whose
        state stays float32): ``x`` cast in, the result cast back."""
        if self.act == TensorProto.FLOAT:
            return build(x)
        self.act = TensorProto.FLOAT
        try:
            out = build(self.cast(x, TensorProto.FLOAT))
        finally:
            self.act = self.store
        return self.cast(out, self.act)

    def save(self) -> Path:
        g = helper.make_graph(self.nodes, self.cfg.name, self.inputs, self.outputs, self.inits)
        io = {v.name for v in self.inputs} | {v.name for v in self.outputs}
        io |= {t.name for t in self.inits}
        g.value_info.extend(helper.make_tensor_value_info(n, e, d)
                            for n, (d, e) in self.shapes.items() if n not in io)
        opsets = [helper.make_opsetid("", OPSET)]
        if any(n.domain == MS_DOMAIN for n in self.nodes):
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        model = helper.make_model(g, opset_imports=opsets, producer_name="statebench")
        model.ir_version = 10
        _atomic_write(self.path, model.SerializeToString())
        checksum.seal(self.path)
        return self.path


# ---------------------------------------------------------------------------------------------
# the decoder


def rope_tables(cfg: ModelConfig, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of pos * theta^(-2i/d), (capacity, head_dim/2), computed in float64."""
    d = cfg.head_dim
    inv = cfg.rope_theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(capacity, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def state_layout(flavour: str) -> str:
    """The flavour's recurrent state layout (``workload.cache_specs``): the standard
    flavour's V-major, LinearAttention's K-major."""
    return K_MAJOR if flavour == ORT else V_MAJOR


def _build(b: _Builder, flavour: str, capacity: int) -> None:
    cfg = b.cfg
    b.flavour = flavour
    h, t = cfg.hidden, b.tokens
    ids = b.input("input_ids", TensorProto.INT64, [1, t])
    ctx: dict[str, str] = {}
    if flavour == STANDARD:
        pos = b.input("position_ids", TensorProto.INT64, [1, t])
        ctx["pos"] = pos
        if b.rollback is not None:
            b.deferred = D.declare(b)
    else:
        ctx["seqlens_k"] = b.input("seqlens_k", TensorProto.INT32, [1])
        ctx["total"] = b.input("total_sequence_length", TensorProto.INT32, [])
    specs = (cache_specs(cfg, capacity, state_layout(flavour)) if b.rollback is None
             else cache_specs_deferred(cfg, capacity, t))
    for s in specs:
        dims = list(s.shape)
        if flavour == ORT and s.kind == "append":
            dims[2] = PAST_LEN
        b.input(s.input, _ELEM[s.dtype], dims)

    if cfg.attention_layers:
        cos, sin = rope_tables(cfg, capacity)
        if b.act == TensorProto.FLOAT16 or (flavour == ORT and cfg.kv_cache == "float16"):
            # GroupQueryAttention's cos/sin caches share its type T with the cache; a
            # float16 model's RoPE runs in float16
            cos, sin = cos.astype(np.float16), sin.astype(np.float16)
        ctx["cos"], ctx["sin"] = (b.const(cos, cos.dtype, name="rope_cos"),
                                  b.const(sin, sin.dtype, name="rope_sin"))
        if flavour == STANDARD:
            _standard_position_constants(b, ctx, capacity)

    x = b.op("Gather", [b.weight("embed_tokens"), ids], [1, t, h], axis=0)
    residual: str | None = None  # ORT flavour: the pending add, fused into the next norm
    for i, kind in enumerate(cfg.layers):
        p = f"layers.{i}."
        xn, x = _norm(b, flavour, x, residual, p + "input_norm")
        residual = None
        if kind == ATTENTION:
            mixed = _attention(b, flavour, ctx, i, xn, capacity)
        else:
            mixed = b.in_float32(lambda x, i=i: _gdn(b, flavour, i, x), xn)
        if flavour == STANDARD:
            x = b.binary("Add", x, mixed)
        else:
            residual = mixed
        xn, x = _norm(b, flavour, x, residual, p + "post_norm")
        residual = None
        gate = b.project(xn, p + "gate_proj")
        act = b.binary("Mul", gate, b.unary("Sigmoid", gate))
        up = b.project(xn, p + "up_proj")
        mlp = b.project(b.binary("Mul", act, up), p + "down_proj")
        if flavour == STANDARD:
            x = b.binary("Add", x, mlp)
        else:
            residual = mlp
    xn, _ = _norm(b, flavour, x, residual, "final_norm")
    if b.act == TensorProto.FLOAT:
        b.project(xn, "lm_head", out="logits")
    else:
        # float16 logits cast to float32: every backend hands the harness float32 logits
        b.cast(b.project(xn, "lm_head"), TensorProto.FLOAT, out="logits")
    b.output("logits")
    for s in specs:
        b.output(s.output)


def _norm(b: _Builder, flavour: str, x: str, skip: str | None, weight: str) -> tuple[str, str]:
    """RMSNorm of x (+ skip); returns (normalised, the residual stream after the add)."""
    eps = b.cfg.rms_eps
    shape = b.shape_of(x)
    if flavour == ORT:
        if skip is None:
            y = b.op("SimplifiedLayerNormalization", [x, b.weight(weight)], shape,
                     epsilon=eps, axis=-1, stash_type=1)
            return y, x
        y = b.op("SkipSimplifiedLayerNormalization", [x, skip, b.weight(weight)], shape,
                 domain=MS_DOMAIN, epsilon=eps,
                 outputs=[("", [], 0), ("", [], 0), (f"resid_{b._n + 1}", shape, b.act)])
        summed = b.nodes[-1].output[3]
        return y, summed
    ms = b.op("ReduceMean", [b.binary("Mul", x, x), b.const([-1], np.int64)],
              shape[:-1] + [1], keepdims=1)
    rms = b.unary("Sqrt", b.binary("Add", ms, b.const(eps)))
    return b.binary("Mul", b.binary("Div", x, rms), b.weight(weight)), x


def _standard_position_constants(b: _Builder, ctx: dict[str, str], capacity: int) -> None:
    """Shared by all attention layers: RoPE rows, the mask and the ScatterND indices."""
    if b.tokens > 1:
        _standard_positions_k(b, ctx, capacity)
        return
    cfg = b.cfg
    half = cfg.head_dim // 2
    pos = ctx["pos"]
    for k in ("cos", "sin"):
        row = b.op("Gather", [ctx[k], pos], [1, 1, half], axis=0)
        ctx[k + "_row"] = b.reshape(row, [1, 1, 1, half])  # broadcasts over (B, N, S=1)
    arange = b.const(np.arange(capacity), np.int64, name="cache_positions")
    pos4 = b.reshape(pos, [1, 1, 1, 1])
    ctx["mask"] = b.op("LessOrEqual", [arange, pos4], [1, 1, 1, capacity], TensorProto.BOOL)
    # indices (0, head, position) for every kv head: [1, kv_heads, 1, 3]
    hk = cfg.kv_heads
    bh = np.zeros((1, hk, 1, 2), np.int64)
    bh[0, :, 0, 1] = np.arange(hk)
    pos_exp = b.op("Expand", [pos4, b.const([1, hk, 1, 1], np.int64)], [1, hk, 1, 1],
                   TensorProto.INT64)
    ctx["scatter_idx"] = b.op("Concat", [b.const(bh, np.int64), pos_exp], [1, hk, 1, 3],
                              TensorProto.INT64, axis=-1)


def _standard_positions_k(b: _Builder, ctx: dict[str, str], capacity: int) -> None:
    """``_standard_position_constants`` for K > 1 new tokens at positions P .. P+K-1
    (``position_ids`` [1, K]): RoPE rows for q as (1, K, Hkv, rep, D) and k as
    (1, K, Hkv, D); the mask (1, 1, K*rep, C) of score row j*rep + r (query j of kv head
    group r) seeing cache rows <= P+j, so causal inside the K; ScatterND indices
    (0, head, P+j) as [1, Hkv, K, 3]."""
    cfg, t = b.cfg, b.tokens
    hk, rep, half = cfg.kv_heads, cfg.q_heads // cfg.kv_heads, cfg.head_dim // 2
    pos = ctx["pos"]
    for k in ("cos", "sin"):
        row = b.op("Gather", [ctx[k], pos], [1, t, half], axis=0)
        ctx[k + "_q"] = b.reshape(row, [1, t, 1, 1, half])
        ctx[k + "_k"] = b.reshape(row, [1, t, 1, half])
    arange = b.const(np.arange(capacity), np.int64, name="cache_positions")
    pos4 = b.reshape(pos, [1, 1, t, 1])
    rows = b.op("Expand", [pos4, b.const([1, 1, t, rep], np.int64)], [1, 1, t, rep],
                TensorProto.INT64)
    ctx["mask"] = b.op("LessOrEqual", [arange, b.reshape(rows, [1, 1, t * rep, 1])],
                       [1, 1, t * rep, capacity], TensorProto.BOOL)
    bh = np.zeros((1, hk, t, 2), np.int64)
    bh[0, :, :, 1] = np.arange(hk)[:, None]
    pos_exp = b.op("Expand", [pos4, b.const([1, hk, t, 1], np.int64)], [1, hk, t, 1],
                   TensorProto.INT64)
    ctx["scatter_idx"] = b.op("Concat", [b.const(bh, np.int64), pos_exp], [1, hk, t, 3],
                              TensorProto.INT64, axis=-1)


def _rope(b: _Builder, x: str, cos: str, sin: str) -> str:
    """Rotate-half RoPE on (..., D) with (1,1,1,D/2) cos/sin rows."""
    d = b.shape_of(x)[-1]
    half = d // 2
    axis = b.const([-1], np.int64)
    x1 = b.op("Slice", [x, b.const([0], np.int64), b.const([half], np.int64), axis],
              b.shape_of(x)[:-1] + [half])
    x2 = b.op("Slice", [x, b.const([half], np.int64), b.const([d], np.int64), axis],
              b.shape_of(x)[:-1] + [half])
    r1 = b.binary("Sub", b.binary("Mul", x1, cos), b.binary("Mul", x2, sin))
    r2 = b.binary("Add", b.binary("Mul", x2, cos), b.binary("Mul", x1, sin))
    return b.op("Concat", [r1, r2], b.shape_of(x), axis=-1)


def _attention(b: _Builder, flavour: str, ctx: dict[str, str], i: int, xn: str,
               capacity: int) -> str:
    cfg, p = b.cfg, f"layers.{i}."
    hq, hk, d = cfg.q_heads, cfg.kv_heads, cfg.head_dim
    q = b.project(xn, p + "q_proj")
    k = b.project(xn, p + "k_proj")
    v = b.project(xn, p + "v_proj")
    past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
    pres_k, pres_v = f"present.{i}.key", f"present.{i}.value"
    # a float16 cache under float32 activations: casts where the cache is written and read
    half = cfg.kv_cache == "float16" and b.act == TensorProto.FLOAT
    elem = _ELEM[cfg.kv_cache]
    if flavour == ORT:
        present = [1, hk, TOTAL_LEN, d]
        if half:
            # GroupQueryAttention has one type T for q, k, v, the caches, cos/sin and its
            # output: a float16 cache makes its q/k/v (and RoPE tables) float16 too. This
            # rounds q and k before RoPE, which the standard flavour does not (FINDINGS 19)
            q, k, v = (b.cast(t, TensorProto.FLOAT16) for t in (q, k, v))
        out = b.op("GroupQueryAttention",
                   [q, k, v, past_k, past_v, ctx["seqlens_k"], ctx["total"], ctx["cos"],
                    ctx["sin"]],
                   [1, b.tokens, hq * d], elem, domain=MS_DOMAIN,
                   outputs=[(pres_k, present, elem), (pres_v, present, elem)],
                   num_heads=hq, kv_num_heads=hk, do_rotary=1, rotary_interleaved=0)
        if half:
            out = b.cast(out, TensorProto.FLOAT)
        return b.project(out, p + "o_proj")
    if b.tokens > 1:
        return _attention_k(b, ctx, i, q, k, v, capacity)
    # S = 1, so BSNH -> BNSH is a reshape
    q = _rope(b, b.reshape(q, [1, hk, hq // hk, d]), ctx["cos_row"], ctx["sin_row"])
    k = _rope(b, b.reshape(k, [1, hk, 1, d]), ctx["cos_row"], ctx["sin_row"])
    v = b.reshape(v, [1, hk, 1, d])
    cache = [1, hk, capacity, d]
    if half:
        # the cache is float16, compute float32: the new rows are cast to float16 as they
        # are written, the cache cast to float32 where attention reads it
        k, v = (b.cast(t, TensorProto.FLOAT16) for t in (k, v))
    kc = b.op("ScatterND", [past_k, ctx["scatter_idx"], k], cache, elem, out=pres_k)
    vc = b.op("ScatterND", [past_v, ctx["scatter_idx"], v], cache, elem, out=pres_v)
    if half:
        kc, vc = (b.cast(t, TensorProto.FLOAT) for t in (kc, vc))
    kt = b.op("Transpose", [kc], [1, hk, d, capacity], perm=[0, 1, 3, 2])
    scores = b.binary("Mul", b.matmul(q, kt), b.const(1.0 / np.sqrt(d)))
    neg = b.const(np.finfo(_NP_OF[b.act]).min)
    scores = b.op("Where", [ctx["mask"], scores, neg], b.shape_of(scores))
    probs = b.op("Softmax", [scores], b.shape_of(scores), axis=-1)
    out = b.reshape(b.matmul(probs, vc), [1, 1, hq * d])
    return b.project(out, p + "o_proj")


def _attention_k(b: _Builder, ctx: dict[str, str], i: int, q: str, k: str, v: str,
                 capacity: int) -> str:
    """The standard flavour's attention of K > 1 new tokens (``_standard_positions_k``):
    q (1, K, Hq*D) roped as (1, K, Hkv, rep, D) and laid out (1, Hkv, K*rep, D), so each kv
    head's K*rep query rows are one block (the WebNN kernels' q rows, ``match_attention``);
    the K new key and value rows (1, Hkv, K, D) written by one ScatterND each; the output
    back to (1, K, Hq*D) by a transpose."""
    cfg, p = b.cfg, f"layers.{i}."
    hq, hk, d, t = cfg.q_heads, cfg.kv_heads, cfg.head_dim, b.tokens
    rep = hq // hk
    past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
    half = cfg.kv_cache == "float16" and b.act == TensorProto.FLOAT
    elem = _ELEM[cfg.kv_cache]
    q = _rope(b, b.reshape(q, [1, t, hk, rep, d]), ctx["cos_q"], ctx["sin_q"])
    q = b.reshape(b.op("Transpose", [q], [1, hk, t, rep, d], perm=[0, 2, 1, 3, 4]),
                  [1, hk, t * rep, d])
    k = _rope(b, b.reshape(k, [1, t, hk, d]), ctx["cos_k"], ctx["sin_k"])
    k = b.op("Transpose", [k], [1, hk, t, d], perm=[0, 2, 1, 3])
    v = b.op("Transpose", [b.reshape(v, [1, t, hk, d])], [1, hk, t, d], perm=[0, 2, 1, 3])
    cache = [1, hk, capacity, d]
    if half:
        k, v = (b.cast(x, TensorProto.FLOAT16) for x in (k, v))
    kc = b.op("ScatterND", [past_k, ctx["scatter_idx"], k], cache, elem, out=f"present.{i}.key")
    vc = b.op("ScatterND", [past_v, ctx["scatter_idx"], v], cache, elem,
              out=f"present.{i}.value")
    if half:
        kc, vc = (b.cast(x, TensorProto.FLOAT) for x in (kc, vc))
    kt = b.op("Transpose", [kc], [1, hk, d, capacity], perm=[0, 1, 3, 2])
    scores = b.binary("Mul", b.matmul(q, kt), b.const(1.0 / np.sqrt(d)))
    neg = b.const(np.finfo(_NP_OF[b.act]).min)
    scores = b.op("Where", [ctx["mask"], scores, neg], b.shape_of(scores))
    probs = b.op("Softmax", [scores], b.shape_of(scores), axis=-1)
    out = b.reshape(b.matmul(probs, vc), [1, hk, t, rep, d])
    out = b.op("Transpose", [out], [1, t, hk, rep, d], perm=[0, 2, 1, 3, 4])
    return b.project(b.reshape(out, [1, t, hq * d]), p + "o_proj")


def _gdn_inputs(b: _Builder, flavour: str, i: int, xn: str) -> tuple[str, str, str]:
    """q, k, v of a GDN layer: the projections, through the layer's causal conv (SiLU
    after it) over their concatenation when the model has one (``_causal_conv``)."""
    cfg, p = b.cfg, f"layers.{i}."
    q, k, v = (b.project(xn, p + n) for n in ("q_proj", "k_proj", "v_proj"))
    if not cfg.gdn_conv_kernel:
        return q, k, v
    c, t = cfg.gdn_conv_dim, b.tokens
    qkv = b.op("Concat", [q, k, v], [1, t, c], axis=-1)
    if t == 1:
        qkv = _causal_conv(b, flavour, i, b.reshape(qkv, [1, c, 1]))
        qkv = b.reshape(qkv, [1, 1, c])
    else:  # the conv's (1, C, K) columns, channels first, and back
        cols = b.op("Transpose", [qkv], [1, c, t], perm=[0, 2, 1])
        qkv = b.op("Transpose", [_causal_conv(b, flavour, i, cols)], [1, t, c], perm=[0, 2, 1])
    qk = cfg.gdn_qk_heads * cfg.gdn_qk_dim
    axis = b.const([-1], np.int64)
    return tuple(b.op("Slice", [qkv, b.const([lo], np.int64), b.const([hi], np.int64), axis],
                      [1, t, hi - lo])
                 for lo, hi in ((0, qk), (qk, 2 * qk), (2 * qk, c)))


def _causal_conv(b: _Builder, flavour: str, i: int, x: str) -> str:
    """silu(depthwise causal conv) of the new columns x (1, C, T) (T = 1: a decode step),
    its window the pair ``past_conv_state.i`` -> ``present_conv_state.i`` (1, C, K-1).
    ORT flavour: one CausalConvWithState, its taps the stored (C, K) rows read as (C, 1, K);
    standard: the window with x appended (Concat), multiplied by the taps and summed over
    the window (Mul, ReduceSum; T > 1: ``_causal_conv_columns``), SiLU as x * sigmoid(x),
    the next window a Slice of it (shifted by T)."""
    cfg, taps = b.cfg, f"layers.{i}.conv1d"
    c, kernel = cfg.gdn_conv_dim, cfg.gdn_conv_kernel
    past, present = f"past_conv_state.{i}", f"present_conv_state.{i}"
    window = [1, c, kernel - 1]
    if flavour == ORT:
        weight = taps + ".c1k"
        if weight not in b.shapes:
            b.external(weight, b.store, [c, 1, kernel], "weights.bin", b.manifest[taps])
        if b.act != b.store:  # a float16 model's float32 gated delta part (in_float32)
            weight = b.cast(weight, b.act)
        return b.op("CausalConvWithState", [x, weight, "", past], b.shape_of(x),
                    domain=MS_DOMAIN, outputs=[(present, window, TensorProto.FLOAT)],
                    activation="silu")
    if b.shape_of(x)[-1] > 1:
        return _causal_conv_columns(b, taps, past, present, x)
    full = b.op("Concat", [past, x], [1, c, kernel], axis=2)
    b.op("Slice", [full, b.const([1], np.int64), b.const([kernel], np.int64),
                   b.const([2], np.int64)], window, out=present)
    y = b.op("ReduceSum", [b.binary("Mul", full, b.weight(taps)), b.const([-1], np.int64)],
             [1, c], keepdims=0)
    return b.binary("Mul", y, b.unary("Sigmoid", y))


def _causal_conv_columns(b: _Builder, taps: str, past: str, present: str, x: str) -> str:
    """The standard flavour's causal conv of T > 1 columns x (1, C, T): the window with x
    appended (1, C, K-1+T), output column t the taps' sum over its columns t .. t+K-1 (per
    tap j, the window's columns j .. j+T-1 times tap j: Slice, Mul, Add), SiLU after it;
    the next window the last K-1 columns."""
    cfg = b.cfg
    c, kernel, t = cfg.gdn_conv_dim, cfg.gdn_conv_kernel, b.shape_of(x)[-1]
    full = b.op("Concat", [past, x], [1, c, kernel - 1 + t], axis=2)
    last = b.const([2], np.int64)
    b.op("Slice", [full, b.const([t], np.int64), b.const([t + kernel - 1], np.int64), last],
         [1, c, kernel - 1], out=present)
    y = None
    for j in range(kernel):
        tap = b.op("Slice", [b.weight(taps), b.const([j], np.int64), b.const([j + 1], np.int64),
                             b.const([1], np.int64)], [c, 1])
        cols = b.op("Slice", [full, b.const([j], np.int64), b.const([j + t], np.int64), last],
                    [1, c, t])
        term = b.binary("Mul", cols, tap)
        y = term if y is None else b.binary("Add", y, term)
    return b.binary("Mul", y, b.unary("Sigmoid", y))


def _gdn(b: _Builder, flavour: str, i: int, xn: str) -> str:
    if b.deferred is not None:  # the rollback form (``export``)
        return D.gdn_layer(b, b.deferred, i, xn)
    cfg, p = b.cfg, f"layers.{i}."
    hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim
    rep = hv // hk
    q, k, v = _gdn_inputs(b, flavour, i, xn)
    a = b.project(xn, p + "a_proj")
    bb = b.project(xn, p + "b_proj")
    past, present = f"past_state.{i}", f"present_state.{i}"
    if flavour == ORT:
        return _linear_attention(b, i, q, k, v, a, bb)
    if b.tokens > 1:
        return _gdn_tokens(b, i, q, k, v, a, bb)
    state = [1, hv, dv, dk]
    eps = b.const(1e-6)

    def l2(t: str) -> str:
        t = b.reshape(t, [1, hk, dk])
        ss = b.op("ReduceSum", [b.binary("Mul", t, t), b.const([-1], np.int64)], [1, hk, 1],
                  keepdims=1)
        return b.binary("Div", t, b.unary("Sqrt", b.binary("Add", ss, eps)))

    qn, kn = l2(q), l2(k)
    neg_a = b.unary("Neg", b.unary("Exp", b.weight(p + "A_log")))
    g = b.binary("Mul", neg_a, b.unary("Softplus", b.binary("Add", a, b.weight(p + "dt_bias"))))
    decay = b.reshape(b.unary("Exp", g), [1, hk, rep, 1, 1])
    beta = b.reshape(b.unary("Sigmoid", bb), [1, hk, rep, 1, 1])
    # value head h = j * rep + r reads qk head j: group the state instead of repeating q/k
    s = b.binary("Mul", b.reshape(past, [1, hk, rep, dv, dk]), decay)
    retrieved = b.matmul(s, b.reshape(kn, [1, hk, 1, dk, 1]))  # (1, hk, rep, dv, 1)
    delta = b.binary("Mul", b.binary("Sub", b.reshape(v, [1, hk, rep, dv, 1]), retrieved), beta)
    new = b.binary("Add", s, b.binary("Mul", delta, b.reshape(kn, [1, hk, 1, 1, dk])))
    b.reshape(new, state, out=present)
    o = b.matmul(new, b.reshape(qn, [1, hk, 1, dk, 1]))  # (1, hk, rep, dv, 1)
    o = b.binary("Mul", o, b.const(1.0 / np.sqrt(dk)))
    return b.project(b.reshape(o, [1, 1, hv * dv]), p + "o_proj")


def _gdn_tokens(b: _Builder, i: int, q: str, k: str, v: str, a: str, bb: str) -> str:
    """The standard flavour's gated delta rule over K > 1 tokens, in order, in the op shape
    ``backends/webnn/convert_gdn`` builds ORT's GatedDeltaNet (and ``export_deferred`` its
    verify), so a WebNN page runs the K tokens in one launch (``match_gdn_capsule``'s
    capture, no capsule): q and k (K, Hk, Dk) L2-normalised (eps inside the square root),
    v (K, Hv, Dv), the decay exp(g) and beta (K, Hv); the state viewed (Hk, rep, Dv, Dk) so
    value head j * rep + r reads key head j, and token by token ``s = decay s; r = s k;
    d = beta (v - r); s += d k^T; o = scale s q``; the outputs concatenated (K, Hv, Dv),
    the last state ``present_state.i``."""
    cfg, p, t = b.cfg, f"layers.{i}.", b.tokens
    hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim
    rep = hv // hk
    eps = b.const(1e-6)
    first = b.const([0], np.int64)

    def l2(x: str) -> str:
        x = b.reshape(x, [t, hk, dk])
        ss = b.op("ReduceSum", [b.binary("Mul", x, x), b.const([-1], np.int64)], [t, hk, 1],
                  keepdims=1)
        return b.binary("Div", x, b.unary("Sqrt", b.binary("Add", ss, eps)))

    def token(x: str, j: int, shape: list[int]) -> str:
        one = b.op("Slice", [x, b.const([j], np.int64), b.const([j + 1], np.int64), first],
                   [1, *b.shape_of(x)[1:]], b.shapes[x][1])
        return b.reshape(one, shape)

    qn, kn = l2(q), l2(k)
    v = b.reshape(v, [t, hv, dv])
    neg_a = b.unary("Neg", b.unary("Exp", b.weight(p + "A_log")))
    g = b.binary("Mul", neg_a, b.unary("Softplus", b.binary("Add", a, b.weight(p + "dt_bias"))))
    decay = b.unary("Exp", b.reshape(g, [t, hv]))
    beta = b.reshape(b.unary("Sigmoid", bb), [t, hv])
    s = b.reshape(f"past_state.{i}", [hk, rep, dv, dk])
    scale = b.const(1.0 / np.sqrt(dk))
    outs = []
    for j in range(t):
        kj = token(kn, j, [hk, 1, 1, dk])
        s = b.binary("Mul", s, token(decay, j, [hk, rep, 1, 1]))
        retrieved = b.matmul(s, b.reshape(kj, [hk, 1, dk, 1]))  # (Hk, rep, Dv, 1)
        delta = b.binary("Mul", b.binary("Sub", token(v, j, [hk, rep, dv, 1]), retrieved),
                         token(beta, j, [hk, rep, 1, 1]))
        s = b.binary("Add", s, b.binary("Mul", delta, kj))
        o = b.binary("Mul", b.matmul(s, token(qn, j, [hk, 1, dk, 1])), scale)
        outs.append(b.reshape(o, [1, hv, dv]))
    b.reshape(s, [1, hv, dv, dk], out=f"present_state.{i}")
    y = b.op("Concat", outs, [t, hv, dv], axis=0)
    return b.project(b.reshape(y, [1, t, hv * dv]), p + "o_proj")


def _linear_attention(b: _Builder, i: int, q: str, k: str, v: str, a: str, bb: str) -> str:
    """The ORT flavour's gated delta step as onnxruntime-genai exports Qwen3.5, from ops
    ORT's WebGPU EP runs: q and k L2-normalised per head (LpNormalization, no epsilon),
    LinearAttentionGate for the decay (-exp(A_log) softplus(a + dt_bias)) and beta
    (sigmoid(b)), then LinearAttention (gated_delta) with q's heads (the qk heads) fewer
    than its kv heads (the v heads; k is read per q head, head h // (Hv/Hk)), scale
    1/sqrt(Dk), its state K-major (1, Hv, Dk, Dv)."""
    cfg, p = b.cfg, f"layers.{i}."
    hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim

    t = b.tokens

    def l2(x: str) -> str:
        shape = [1, hk, dk] if t == 1 else [1, t, hk, dk]
        n = b.op("LpNormalization", [b.reshape(x, shape)], shape, axis=-1, p=2)
        return b.reshape(n, [1, t, hk * dk])

    scale = b.unary("Neg", b.unary("Exp", b.weight(p + "A_log")))  # folded by ORT at load
    decay = b.op("LinearAttentionGate", [a, b.weight(p + "dt_bias"), scale, bb], [1, t, hv],
                 domain=MS_DOMAIN, outputs=[(f"beta_{i}", [1, t, hv], TensorProto.FLOAT)])
    out = b.op("LinearAttention", [l2(q), l2(k), v, f"past_state.{i}", decay, f"beta_{i}"],
               [1, t, hv * dv], domain=MS_DOMAIN,
               outputs=[(f"present_state.{i}", [1, hv, dk, dv], TensorProto.FLOAT)],
               q_num_heads=hk, kv_num_heads=hv, update_rule="gated_delta",
               scale=float(1.0 / np.sqrt(dk)))
    return b.project(out, p + "o_proj")


# ---------------------------------------------------------------------------------------------
# 4-bit weights (ModelConfig.weights "q4"; model.quantize)

#: columns (MatMulNBits) or rows (int4) packed at a time: a 128k-vocab head stays a few
#: hundred MB of temporaries
_Q4_CHUNK = 8192


def _q4_file(flavour: str) -> str:
    return f"weights-q4-{flavour}.bin"


def _q4_parts(workload: Workload, name: str, flavour: str):
    """(suffix, bytes) pieces of one 4-bit tensor in the flavour's packing, in file order:
    MatMulNBits' B then scales, or the int4 tensor then scales. ValueError when the
    workload's weights are not 4-bit values (``quantize.recover``)."""
    w = workload.weights[name]
    k, n = w.shape
    if flavour == ORT:
        packed, scales = [], []
        for c in range(0, n, _Q4_CHUNK):
            b, s = Q.pack_matmulnbits(*Q.recover(w[:, c:c + _Q4_CHUNK], name))
            packed.append(b.tobytes())
            scales.append(s.astype(_stored(workload.config)).tobytes())
        return [(".q4", b"".join(packed)), (".scales", b"".join(scales))]
    packed, scales = [], []
    rows = _Q4_CHUNK // Q.Q4_BLOCK * Q.Q4_BLOCK
    for r in range(0, k, rows):
        q, s = Q.recover(w[r:r + rows], name)
        packed.append(Q.pack_int4(q).tobytes())
        scales.append(s.astype(_stored(workload.config)).tobytes())
    return [(".q4", b"".join(packed)), (".scales", b"".join(scales))]


def write_q4_weights(workload: Workload, directory: Path, flavour: str) -> dict[str, tuple[int, int]]:
    """Write the flavour's 4-bit tensors (``weights-q4-<flavour>.bin`` + ``.json``) once;
    returns stored name -> (offset, length). Reused while the model key and the float
    weights' fingerprints match and its checksum holds (``model.checksum``); written
    atomically and sealed as ``write_weights``."""
    cfg = workload.config
    names = quantised_names(cfg)
    bin_path = directory / _q4_file(flavour)
    json_path = bin_path.with_suffix(".json")
    fingerprint = {n: _fingerprint(workload.weights[n]) for n in names}
    try:
        meta = json.loads(json_path.read_text())
        if (meta["model"] == config_key(cfg, workload.seed) and meta["fingerprint"] == fingerprint
                and checksum.reusable(bin_path, "weights", size=meta["size"])):
            return {k: (v[0], v[1]) for k, v in meta["tensors"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    manifest: dict[str, list[int]] = {}
    offset = 0
    with atomic_file(bin_path) as f:
        for name in names:
            for suffix, data in _q4_parts(workload, name, flavour):
                manifest[name + suffix] = [offset, len(data)]
                f.seek(offset)
                f.write(data)
                offset += (len(data) + _ALIGN - 1) // _ALIGN * _ALIGN
        f.truncate(offset)
    checksum.seal(bin_path)
    meta = {"model": config_key(cfg, workload.seed), "size": offset, "tensors": manifest,
            "fingerprint": fingerprint}
    _atomic_write(json_path, json.dumps(meta).encode())
    return {k: (v[0], v[1]) for k, v in manifest.items()}


def _q4_project(b: _Builder, x: str, name: str, out: str | None) -> str:
    """``x @ W`` for a 4-bit (K, N) matrix W: ORT flavour MatMulNBits (bits 4, block 32,
    accuracy_level 4); standard flavour DequantizeLinear (int4, block_size 32 on axis 0)
    feeding MatMul, which a WebNN page builds as dequantizeLinear then matmul."""
    if b.q4_manifest is None:
        b.q4_manifest = write_q4_weights(b.workload, b.path.parent, b.flavour)
    k, n = b.workload.weights[name].shape
    blocks = k // Q.Q4_BLOCK
    file = _q4_file(b.flavour)
    shape = b.shape_of(x)[:-1] + [n]
    if name + ".q4" not in b.shapes:
        if b.flavour == ORT:
            b.external(name + ".q4", TensorProto.UINT8, [n, blocks, Q.Q4_BLOCK // 2], file,
                       b.q4_manifest[name + ".q4"])
            # flat (N * K/32), as ORT's MatMulNBitsQuantizer writes them
            b.external(name + ".scales", b.store, [n * blocks], file,
                       b.q4_manifest[name + ".scales"])
        else:
            b.external(name + ".q4", TensorProto.INT4, [k, n], file, b.q4_manifest[name + ".q4"])
            b.external(name + ".scales", b.store, [blocks, n], file,
                       b.q4_manifest[name + ".scales"])
    if b.flavour == ORT:
        # MatMulNBits' scales share its type T: a float16 model's float32 part (in_float32)
        # casts them (an initializer's cast, folded when ORT loads the graph)
        scales = name + ".scales"
        if b.act != b.store:
            scales = b.cast(scales, b.act)
        return b.op("MatMulNBits", [x, name + ".q4", scales], shape, out=out,
                    domain=MS_DOMAIN, K=k, N=n, bits=4, block_size=Q.Q4_BLOCK,
                    accuracy_level=b.accuracy_level)
    w = b.op("DequantizeLinear", [name + ".q4", name + ".scales"], [k, n], b.store, axis=0,
             block_size=Q.Q4_BLOCK)
    if b.act != b.store:
        w = b.cast(w, b.act)
    return b.op("MatMul", [x, w], shape, out=out)
