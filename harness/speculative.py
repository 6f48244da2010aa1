"""Speculative decoding with compact state updates (DESIGN §8): strategies, bytes, time, checks.

A draft of K tokens is verified in one dispatch; m ≤ K are accepted; the state must end as if
only the m accepted tokens had been fed. Per layer kind:

GDN layers (recurrent state S [Hv, Dv, Dk], overwritten by every token):
- `snapshot_recompute`: copy S before verify; verify in place; when m < K, re-feed the m
  accepted tokens from the snapshot (m == 0: copy the snapshot back).
- `dense_checkpoints`: the verify pass writes the state after every token to a [K, ...]
  checkpoint buffer and leaves the live state alone; keep checkpoint m (one state copy).
- `compact_replay`: the verify pass reads S from one state row, writes its final state to the
  other (inactive) row and captures per-token (decay, key, delta) in a capsule (ORT
  GatedDeltaNet's `state_update`); m == K keeps the final row, m == 0 keeps the source row,
  otherwise `S *= decay_t; S += outer(key_t, delta_t)` is replayed for t < m from the source row
  into the inactive row (ORT GatedDeltaNetStateReplay). No whole-state copy at all.
  Engines: NumPy (float32), ORT's GatedDeltaNet on the CPU EP as the verify pass (its capsule
  replayed in NumPy), and the whole thing on ORT's WebGPU EP (GatedDeltaNet then
  GatedDeltaNetStateReplay), only where the WebGPU plugin EP finds a device.

Attention layers (KV rows, appended): the verify pass appends K rows after the valid length P;
the accepted rows are the first m of them, so checkpoints and compact capture roll back by
moving the valid length to P + m (no bytes); snapshot-and-recompute re-feeds the m tokens,
which rewrites their rows and re-reads the P + m valid rows.

Bytes are counted where they move, in `SpecBytes`, by the functions that move them
(`copy_state`, `gdn_verify`, `replay_numpy`, ...); tests check them against the closed forms.
Every final state is checked against a float64 oracle that feeds only the m accepted tokens
with `model.reference.gdn_step`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from model.errors import UserError
from model.reference import gdn_step, l2_normalize
from model.workload import ModelConfig

SCHEMA = "statebench-spec/1"
#: ORT GatedDeltaNet's `state_update_capacity` is in [0, 8]
MAX_DRAFT = 8
F32 = 4
#: float32 strategies against the float64 oracle: max |Δ| / max |oracle|
TOLERANCE = 1e-4
REPLAY_METADATA_BYTES = 11 * 8  # GatedDeltaNetStateReplay's int64[11] metadata, on the CPU
CAPTURE_COUNT_BYTES = 4  # GatedDeltaNet's capture_count int32 [batch=1]

GDN_STRATEGIES = ("snapshot_recompute", "dense_checkpoints", "compact_replay",
                  "compact_replay_ort_cpu", "compact_replay_ort_webgpu")
ATTENTION_STRATEGIES = ("snapshot_recompute", "dense_checkpoints", "compact_replay")


# -- byte counters --------------------------------------------------------------------------

@dataclass
class SpecBytes:
    """Bytes one speculative step moves, by category, added by the operation that moves them.

    If the state lived on a device: `state_*` and `capsule_*` are device memory traffic of
    kernels, `state_copied` device→device copies (counted once, as `ByteCounters.d2d`), `h2d`
    and `d2h` what crosses the host link (control inputs only: no strategy moves a state
    across it). `inputs_read` are the draft tokens' q/k/v/decay/beta a kernel reads.
    """

    state_read: int = 0
    state_written: int = 0
    state_copied: int = 0
    capsule_written: int = 0
    capsule_read: int = 0
    inputs_read: int = 0
    h2d: int = 0
    d2h: int = 0

    @property
    def traffic(self) -> int:
        """Device memory traffic: a copy reads and writes its bytes."""
        return (self.state_read + self.state_written + 2 * self.state_copied
                + self.capsule_written + self.capsule_read + self.inputs_read)

    def as_byte_counters(self) -> dict[str, int]:
        """The same bytes in `backends.base.ByteCounters`' categories."""
        return {"h2d": self.h2d, "d2h": self.d2h, "d2d": self.state_copied,
                "kernel": (self.state_read + self.state_written + self.capsule_written
                           + self.capsule_read + self.inputs_read)}

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "traffic": self.traffic}


# -- shapes and drafts ----------------------------------------------------------------------

@dataclass(frozen=True)
class GdnShape:
    """One GDN layer's head geometry (ORT GatedDeltaNet: state [Hv, Dv, Dk], keys at Hk)."""

    hk: int
    hv: int
    dk: int
    dv: int

    @property
    def state_bytes(self) -> int:
        return self.hv * self.dv * self.dk * F32

    @property
    def capsule_row_floats(self) -> int:
        """Floats one captured transition takes: decay [Hv], key [Hk, Dk], delta [Hv, Dv]."""
        return self.hv + self.hk * self.dk + self.hv * self.dv

    @property
    def token_input_bytes(self) -> int:
        """q, k [Hk, Dk], v [Hv, Dv], decay and beta [Hv] of one token."""
        return (2 * self.hk * self.dk + self.hv * self.dv + 2 * self.hv) * F32

    def label(self) -> str:
        return f"Hk={self.hk} Hv={self.hv} Dk={self.dk} Dv={self.dv}"


@dataclass(frozen=True)
class AttentionShape:
    kv_heads: int
    head_dim: int

    @property
    def row_bytes(self) -> int:
        """One token's K and V rows."""
        return 2 * self.kv_heads * self.head_dim * F32

    def label(self) -> str:
        return f"kv_heads={self.kv_heads} head_dim={self.head_dim}"


def layer_shapes(cfg: ModelConfig) -> tuple[dict[GdnShape, list[int]], dict[AttentionShape, list[int]]]:
    """The distinct GDN and attention shapes of a preset, with the layers that have each."""
    gdn: dict[GdnShape, list[int]] = {}
    attn: dict[AttentionShape, list[int]] = {}
    for i in cfg.gdn_layers:
        gdn.setdefault(GdnShape(cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim,
                                cfg.gdn_v_dim), []).append(i)
    for i in cfg.attention_layers:
        attn.setdefault(AttentionShape(cfg.kv_heads, cfg.head_dim), []).append(i)
    return gdn, attn


@dataclass(frozen=True)
class Draft:
    """K draft tokens' GDN inputs and the pre-verify state (float32, batch dim dropped).

    q, k raw (the kernels L2-normalise; `qn`, `kn` are the normalised float32 copies the NumPy
    kernels use); g is the log-space decay (ORT gate_activation 'none'), beta the effective
    update rate (beta_activation 'none').
    """

    shape: GdnShape
    q: np.ndarray  # [K, Hk, Dk]
    k: np.ndarray  # [K, Hk, Dk]
    v: np.ndarray  # [K, Hv, Dv]
    g: np.ndarray  # [K, Hv]
    beta: np.ndarray  # [K, Hv]
    state0: np.ndarray  # [Hv, Dv, Dk]
    qn: np.ndarray = field(repr=False, default=None)
    kn: np.ndarray = field(repr=False, default=None)

    @property
    def draft_len(self) -> int:
        return len(self.q)


def make_draft(shape: GdnShape, k: int, seed: int = 0) -> Draft:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((k, shape.hk, shape.dk), dtype=np.float32)
    kk = rng.standard_normal((k, shape.hk, shape.dk), dtype=np.float32)
    v = rng.standard_normal((k, shape.hv, shape.dv), dtype=np.float32)
    g = -rng.uniform(0.01, 1.0, (k, shape.hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (k, shape.hv)).astype(np.float32)
    # a state as a prefix would leave it: O(1) rows, not zeros (zeros would hide decay errors)
    state0 = (0.3 * rng.standard_normal((shape.hv, shape.dv, shape.dk))).astype(np.float32)
    qn = l2_normalize(q.astype(np.float64)).astype(np.float32)
    kn = l2_normalize(kk.astype(np.float64)).astype(np.float32)
    return Draft(shape, q, kk, v, g, beta, state0, qn, kn)


def oracle_state(d: Draft, m: int) -> np.ndarray:
    """float64: the state after feeding only the first m draft tokens (`reference.gdn_step`)."""
    s = d.state0.astype(np.float64)
    q = l2_normalize(d.q.astype(np.float64))
    k = l2_normalize(d.k.astype(np.float64))
    for t in range(m):
        _, s = gdn_step(s, q[t], k[t], d.v[t].astype(np.float64), d.g[t].astype(np.float64),
                        d.beta[t].astype(np.float64), 1.0 / np.sqrt(d.shape.dk))
    return s


def rel_err(state: np.ndarray, oracle: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(oracle))), 1e-30)
    return float(np.max(np.abs(state.astype(np.float64) - oracle))) / scale


# -- operations that move bytes (each counts its own) ----------------------------------------

def copy_state(src: np.ndarray, b: SpecBytes) -> np.ndarray:
    """A device→device copy of a whole state (snapshot, restore, keep a checkpoint)."""
    out = src.copy()
    b.state_copied += out.nbytes
    return out


def gdn_verify(state: np.ndarray, d: Draft, n: int, b: SpecBytes, checkpoints: bool = False,
               capture: bool = False) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Feed draft tokens 0..n-1 in one dispatch (float32 NumPy, the GDN recurrence).

    Reads `state` once and the n tokens' inputs; writes the final state, or with
    `checkpoints` the state after every token into a [n, Hv, Dv, Dk] buffer (the last is the
    final state); with `capture` also the compact capsule (capacity n, ORT's layout).
    Returns (final state, checkpoints or None, capsule or None); `state` is not modified.
    """
    sh = d.shape
    rep = sh.hv // sh.hk
    b.state_read += state.nbytes
    b.inputs_read += n * sh.token_input_bytes
    s = state.copy()  # registers of the kernel: not traffic
    ckpt = np.empty((n,) + state.shape, np.float32) if checkpoints else None
    capsule = np.zeros(n * sh.capsule_row_floats, np.float32) if capture else None
    decay_c, key_c, delta_c = capsule_views(capsule, sh, n) if capture else (None, None, None)
    for t in range(n):
        kk = np.repeat(d.kn[t], rep, axis=0)  # [Hv, Dk]
        decay = np.exp(d.g[t])
        s *= decay[:, None, None]
        delta = d.beta[t][:, None] * (d.v[t] - np.einsum("hvk,hk->hv", s, kk))
        s += delta[:, :, None] * kk[:, None, :]
        if checkpoints:
            ckpt[t] = s
        if capture:
            decay_c[t], key_c[t], delta_c[t] = decay, d.kn[t], delta
    if checkpoints:
        b.state_written += ckpt.nbytes
    else:
        b.state_written += s.nbytes
    if capture:
        b.capsule_written += capsule.nbytes
        b.h2d += CAPTURE_COUNT_BYTES
    return s, ckpt, capsule


def capsule_views(capsule: np.ndarray, sh: GdnShape, capacity: int):
    """decay [C, Hv], key [C, Hk, Dk], delta [C, Hv, Dv] views of one struct-of-arrays row."""
    a = capacity * sh.hv
    b = a + capacity * sh.hk * sh.dk
    return (capsule[:a].reshape(capacity, sh.hv), capsule[a:b].reshape(capacity, sh.hk, sh.dk),
            capsule[b:b + capacity * sh.hv * sh.dv].reshape(capacity, sh.hv, sh.dv))


def replay_numpy(source: np.ndarray, capsule: np.ndarray, sh: GdnShape, capacity: int,
                 kept: int, b: SpecBytes) -> np.ndarray:
    """GatedDeltaNetStateReplay's contract in NumPy: from the pre-verify `source` [Hv, Dv, Dk],
    `S *= decay[t, h]; S[h, v, i] += key[t, hk, i] * delta[t, h, v]` for t < kept, hk =
    h * Hk // Hv, into a new (destination) state. Reads the source and `kept` capsule rows
    (never the unused tail), writes the destination.
    """
    decay, key, delta = capsule_views(capsule, sh, capacity)
    hk_of = np.arange(sh.hv) * sh.hk // sh.hv
    s = source.copy()
    b.state_read += source.nbytes
    for t in range(kept):
        s *= decay[t][:, None, None]
        s += delta[t][:, :, None] * key[t][hk_of][:, None, :]
    b.capsule_read += kept * sh.capsule_row_floats * F32
    b.state_written += s.nbytes
    b.h2d += REPLAY_METADATA_BYTES  # kept_count and offsets, the only host input
    return s


# -- ORT: GatedDeltaNet (verify + capture) and GatedDeltaNetStateReplay ----------------------

def _ort():
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - the venv always has it
        return None
    return ort


def verify_model(sh: GdnShape, capacity: int) -> bytes:
    """One com.microsoft GatedDeltaNet node: log-space decay, effective beta, qk_l2_norm=1,
    V-major state, compact capture of `capture_count` ≤ `state_update_capacity` tokens."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    node = helper.make_node(
        "GatedDeltaNet",
        ["query", "key", "value", "", "decay", "beta", "initial_state", "", "", "capture_count"],
        ["output", "final_state", "state_update"], domain="com.microsoft",
        state_update_capacity=capacity, gate_activation="none", beta_activation="none",
        qk_l2_norm=1)
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node], "gdn_verify",
        [vi("query", f, ["T", sh.hk, sh.dk]), vi("key", f, ["T", sh.hk, sh.dk]),
         vi("value", f, ["T", sh.hv, sh.dv]), vi("decay", f, ["T", sh.hv]),
         vi("beta", f, ["T", sh.hv]), vi("initial_state", f, [1, sh.hv, sh.dv, sh.dk]),
         vi("capture_count", TensorProto.INT32, [1])],
        [vi("output", f, ["T", sh.hv, sh.dv]), vi("final_state", f, [1, sh.hv, sh.dv, sh.dk]),
         vi("state_update", f, [1, capacity * sh.capsule_row_floats])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def replay_model() -> bytes:
    """One com.microsoft GatedDeltaNetStateReplay node over rank-1 FP32 backings."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    node = helper.make_node(
        "GatedDeltaNetStateReplay",
        ["source_backing", "capsule_backing", "destination_backing", "metadata"],
        ["destination_out"], domain="com.microsoft")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node], "gdn_replay",
        [vi("source_backing", f, ["N"]), vi("capsule_backing", f, ["M"]),
         vi("destination_backing", f, ["N"]), vi("metadata", TensorProto.INT64, [11])],
        [vi("destination_out", f, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def replay_metadata(sh: GdnShape, capacity: int, kept: int) -> np.ndarray:
    """source, destination, decay, key, delta offsets (FP32 elements), Hv, Dv, Dk, Hk, C, kept.
    Source and destination are separate backings at offset 0; the capsule is its own backing."""
    key_off = capacity * sh.hv
    delta_off = key_off + capacity * sh.hk * sh.dk
    return np.array([0, 0, 0, key_off, delta_off, sh.hv, sh.dv, sh.dk, sh.hk, capacity, kept],
                    np.int64)


class OrtVerify:
    """ORT's GatedDeltaNet as the verify pass: final state and compact capsule in one dispatch."""

    def __init__(self, sh: GdnShape, capacity: int, provider: str = "cpu") -> None:
        ort = _ort()
        if ort is None:
            raise RuntimeError("onnxruntime is not installed")
        self.sh, self.capacity = sh, capacity
        so = ort.SessionOptions()
        so.log_severity_level = 4  # failures are reported as reasons
        if provider == "webgpu":
            devices, why = webgpu_devices()
            if not devices:
                raise RuntimeError(why)
            so.add_provider_for_devices(devices, {})
            self.session = ort.InferenceSession(verify_model(sh, capacity), so)
        else:
            self.session = ort.InferenceSession(verify_model(sh, capacity), so,
                                                providers=["CPUExecutionProvider"])

    def run(self, state: np.ndarray, d: Draft, n: int, b: SpecBytes) -> tuple[np.ndarray, np.ndarray]:
        """(final state [Hv, Dv, Dk], capsule [C * row]) after feeding draft tokens 0..n-1."""
        feeds = {"query": d.q[:n], "key": d.k[:n], "value": d.v[:n], "decay": d.g[:n],
                 "beta": d.beta[:n], "initial_state": state[None],
                 "capture_count": np.array([n], np.int32)}
        _, final, capsule = self.session.run(["output", "final_state", "state_update"], feeds)
        sh = self.sh
        b.state_read += state.nbytes
        b.inputs_read += n * sh.token_input_bytes
        b.state_written += final.nbytes
        b.capsule_written += capsule.nbytes
        b.h2d += CAPTURE_COUNT_BYTES
        return final[0], capsule[0]


_webgpu: dict[str, object] = {}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "(not installed)"


def webgpu_devices() -> tuple[list, str]:
    """ORT's WebGPU plugin EP devices (registered once, by `backends.ort`), or why none."""
    if "result" not in _webgpu:
        try:
            from backends.ort import _webgpu_devices
            _webgpu["result"] = _webgpu_devices()
        except Exception as exc:  # noqa: BLE001 - any failure is a reason, not a crash
            _webgpu["result"] = ([], f"WebGPU EP probe failed: {type(exc).__name__}: {exc}")
    return _webgpu["result"]  # type: ignore[return-value]


class WebGpuReplay:
    """GatedDeltaNetStateReplay on ORT's WebGPU EP: source and capsule are read-only device
    backings; the destination is one device value bound as both `destination_backing` and the
    prebound `destination_out` (the op's contract); metadata stays on the CPU."""

    def __init__(self, sh: GdnShape, capacity: int) -> None:
        ort = _ort()
        devices, why = webgpu_devices()
        if not devices:
            raise RuntimeError(why)
        so = ort.SessionOptions()
        so.log_severity_level = 4  # failures are reported as reasons
        so.add_provider_for_devices(devices, {})
        self.ort, self.sh, self.capacity = ort, sh, capacity
        try:
            self.session = ort.InferenceSession(replay_model(), so)
        except Exception as exc:
            if "Provider type for GatedDeltaNetStateReplay" in str(exc):
                # seen with onnxruntime-ep-webgpu 0.4.0: the plugin has no kernel for the op
                raise RuntimeError(
                    "no execution provider here implements GatedDeltaNetStateReplay (the WebGPU "
                    f"plugin EP {_version('onnxruntime-ep-webgpu')} has no kernel for it)") from None
            raise

    def run(self, source: np.ndarray, capsule: np.ndarray, kept: int, b: SpecBytes) -> np.ndarray:
        ort, sh = self.ort, self.sh
        # the uploads stand in for buffers a device-resident pipeline already has: not counted
        src = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(source.ravel()), "webgpu", 0)
        cap = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(capsule), "webgpu", 0)
        dst = ort.OrtValue.ortvalue_from_numpy(np.zeros(source.size, np.float32), "webgpu", 0)
        io = self.session.io_binding()
        io.bind_ortvalue_input("source_backing", src)
        io.bind_ortvalue_input("capsule_backing", cap)
        io.bind_ortvalue_input("destination_backing", dst)
        io.bind_cpu_input("metadata", replay_metadata(sh, self.capacity, kept))
        io.bind_ortvalue_output("destination_out", dst)
        self.session.run_with_iobinding(io)
        b.state_read += source.nbytes
        b.capsule_read += kept * sh.capsule_row_floats * F32
        b.state_written += source.nbytes
        b.h2d += REPLAY_METADATA_BYTES
        return dst.numpy().reshape(source.shape)


# -- GDN strategies: (final state for acceptance m, bytes) ----------------------------------

Outcome = tuple[np.ndarray, SpecBytes]


def snapshot_recompute(d: Draft, m: int) -> Outcome:
    b = SpecBytes()
    k = d.draft_len
    snapshot = copy_state(d.state0, b)
    live, _, _ = gdn_verify(d.state0, d, k, b)  # in place on the live state
    if m == k:
        return live, b
    if m == 0:
        return copy_state(snapshot, b), b
    live, _, _ = gdn_verify(snapshot, d, m, b)  # re-feed from the snapshot into the live row
    return live, b


def dense_checkpoints(d: Draft, m: int) -> Outcome:
    b = SpecBytes()
    _, ckpt, _ = gdn_verify(d.state0, d, d.draft_len, b, checkpoints=True)
    if m == 0:
        return d.state0, b  # the live state was never written
    return copy_state(ckpt[m - 1], b), b


def compact_replay(d: Draft, m: int) -> Outcome:
    b = SpecBytes()
    k = d.draft_len
    final, _, capsule = gdn_verify(d.state0, d, k, b, capture=True)  # into the inactive row
    return _accept_compact(d, m, final, capsule, b, lambda s, c, n: replay_numpy(s, c, d.shape, k, n, b))


def _accept_compact(d: Draft, m: int, final, capsule, b: SpecBytes, replay) -> Outcome:
    """m == K: the inactive row (verify's final state) becomes live; m == 0: the source row
    stays live; otherwise replay m transitions from the source into the inactive row."""
    if m == d.draft_len:
        return final, b
    if m == 0:
        return d.state0, b
    return replay(d.state0, capsule, m), b


def compact_replay_ort(verify: OrtVerify, replayer: WebGpuReplay | None = None):
    """The compact strategy with ORT's GatedDeltaNet as the verify pass; the replay in NumPy
    (CPU EP) or with GatedDeltaNetStateReplay (`replayer`, WebGPU EP)."""

    def strategy(d: Draft, m: int) -> Outcome:
        b = SpecBytes()
        k = d.draft_len
        final, capsule = verify.run(d.state0, d, k, b)
        if replayer is None:
            return _accept_compact(d, m, final, capsule, b,
                                   lambda s, c, n: replay_numpy(s, c, d.shape, k, n, b))
        return _accept_compact(d, m, final, capsule, b, lambda s, c, n: replayer.run(s, c, n, b))

    return strategy


# -- attention layers: KV rows appended after the valid length ------------------------------

@dataclass
class KVCache:
    """K and V rows [kv_heads, capacity, head_dim] and the valid length."""

    k: np.ndarray
    v: np.ndarray
    length: int

    def append(self, k_rows: np.ndarray, v_rows: np.ndarray, b: SpecBytes) -> None:
        """Attention for the new tokens: writes their rows, reads every valid row (P + n)."""
        n = k_rows.shape[1]
        b.inputs_read += k_rows.nbytes + v_rows.nbytes
        self.k[:, self.length:self.length + n] = k_rows
        self.v[:, self.length:self.length + n] = v_rows
        self.length += n
        b.state_written += k_rows.nbytes + v_rows.nbytes
        b.state_read += self.k[:, :self.length].nbytes + self.v[:, :self.length].nbytes

    def truncate(self, length: int) -> None:
        """Rollback: the rows stay where they are; only the valid length moves (no bytes)."""
        self.length = length


@dataclass(frozen=True)
class AttentionDraft:
    shape: AttentionShape
    prefix_k: np.ndarray  # [kv_heads, P, head_dim]
    prefix_v: np.ndarray
    k: np.ndarray  # [kv_heads, K, head_dim]
    v: np.ndarray

    @property
    def draft_len(self) -> int:
        return self.k.shape[1]

    def fresh_cache(self) -> KVCache:
        kvh, p, hd = self.prefix_k.shape
        cap = p + self.draft_len
        c = KVCache(np.zeros((kvh, cap, hd), np.float32), np.zeros((kvh, cap, hd), np.float32), p)
        c.k[:, :p], c.v[:, :p] = self.prefix_k, self.prefix_v
        return c


def make_attention_draft(shape: AttentionShape, k: int, depth: int, seed: int = 0) -> AttentionDraft:
    rng = np.random.default_rng(seed)

    def rows(n):
        return rng.standard_normal((shape.kv_heads, n, shape.head_dim), dtype=np.float32)

    return AttentionDraft(shape, rows(depth), rows(depth), rows(k), rows(k))


def attention_oracle(d: AttentionDraft, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The valid K and V rows after feeding the prefix and only the first m draft tokens."""
    return (np.concatenate([d.prefix_k, d.k[:, :m]], axis=1),
            np.concatenate([d.prefix_v, d.v[:, :m]], axis=1))


def attention_strategy(name: str) -> Callable[[AttentionDraft, int], tuple[KVCache, SpecBytes]]:
    def run(d: AttentionDraft, m: int) -> tuple[KVCache, SpecBytes]:
        b = SpecBytes()
        c = d.fresh_cache()
        p = c.length
        c.append(d.k, d.v, b)  # verify: K rows after the valid length
        if name == "snapshot_recompute":
            if m == d.draft_len:
                return c, b
            # the "snapshot" of an append cache is its valid length: rows < P are never written
            c.truncate(p)
            if m:
                c.append(d.k[:, :m], d.v[:, :m], b)  # re-feed the accepted tokens
        else:  # checkpoints and compact capture: the K new rows are their own checkpoints
            c.truncate(p + m)
        return c, b

    return run


# -- the measurement ------------------------------------------------------------------------

@dataclass
class Cell:
    """One strategy at one acceptance m."""

    status: str = "ok"  # ok | unavailable | failed
    reason: str = ""
    bytes: dict[str, int] | None = None
    time_ms: float | None = None
    max_rel_err: float | None = None
    ok: bool | None = None


@dataclass
class LayerResult:
    kind: str  # gdn | attention
    shape: dict
    layers: list[int]
    draft_len: int
    rows: list[dict] = field(default_factory=list)  # {"m": m, "strategies": {name: Cell}}
    closed_form: dict = field(default_factory=dict)


def _median_ms(fn: Callable[[], object], reps: int, clock: Callable[[], float]) -> float:
    times = []
    for _ in range(reps):
        t0 = clock()
        fn()
        times.append((clock() - t0) * 1e3)
    return float(np.median(times))


def gdn_strategies(sh: GdnShape, k: int) -> dict[str, tuple[Callable | None, str]]:
    """name -> (strategy, why unavailable)."""
    out: dict[str, tuple[Callable | None, str]] = {
        "snapshot_recompute": (snapshot_recompute, ""),
        "dense_checkpoints": (dense_checkpoints, ""),
        "compact_replay": (compact_replay, ""),
    }
    try:
        out["compact_replay_ort_cpu"] = (compact_replay_ort(OrtVerify(sh, k)), "")
    except Exception as exc:  # noqa: BLE001 - an EP that cannot build is a reason
        out["compact_replay_ort_cpu"] = (None, f"ORT CPU GatedDeltaNet: {type(exc).__name__}: {exc}")
    devices, why = webgpu_devices()
    if not devices:
        out["compact_replay_ort_webgpu"] = (None, why)
    else:
        try:
            out["compact_replay_ort_webgpu"] = (
                compact_replay_ort(OrtVerify(sh, k, "webgpu"), WebGpuReplay(sh, k)), "")
        except Exception as exc:  # noqa: BLE001
            out["compact_replay_ort_webgpu"] = (None, f"{type(exc).__name__}: {exc}")
    return out


def measure_gdn(sh: GdnShape, layers: list[int], k: int, reps: int = 5, seed: int = 0,
                clock: Callable[[], float] = time.perf_counter) -> LayerResult:
    d = make_draft(sh, k, seed)
    res = LayerResult("gdn", asdict(sh), layers, k, closed_form={
        "state_bytes": sh.state_bytes, "capsule_row_bytes": sh.capsule_row_floats * F32,
        "capsule_bytes": k * sh.capsule_row_floats * F32, "checkpoint_bytes": k * sh.state_bytes})
    strategies = gdn_strategies(sh, k)
    for m in range(k + 1):
        oracle = oracle_state(d, m)
        row: dict[str, Cell] = {}
        for name, (fn, why) in strategies.items():
            if fn is None:
                row[name] = Cell(status="unavailable", reason=why)
                continue
            try:
                state, b = fn(d, m)
                err = rel_err(state, oracle)
                t = _median_ms(lambda fn=fn, m=m: fn(d, m), reps, clock)
                row[name] = Cell(bytes=b.to_dict(), time_ms=t, max_rel_err=err, ok=err <= TOLERANCE)
            except Exception as exc:  # noqa: BLE001 - a failing engine is reported, others go on
                row[name] = Cell(status="failed", reason=f"{type(exc).__name__}: {exc}")
        res.rows.append({"m": m, "strategies": row})
    return res


def measure_attention(sh: AttentionShape, layers: list[int], k: int, depth: int, reps: int = 5,
                      seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> LayerResult:
    d = make_attention_draft(sh, k, depth, seed)
    res = LayerResult("attention", {**asdict(sh), "depth": depth}, layers, k,
                      closed_form={"row_bytes": sh.row_bytes})
    for m in range(k + 1):
        ok_k, ok_v = attention_oracle(d, m)
        row: dict[str, Cell] = {}
        for name in ATTENTION_STRATEGIES:
            fn = attention_strategy(name)
            c, b = fn(d, m)
            ok = (c.length == depth + m and np.array_equal(c.k[:, :c.length], ok_k)
                  and np.array_equal(c.v[:, :c.length], ok_v))
            t = _median_ms(lambda fn=fn, m=m: fn(d, m), reps, clock)
            row[name] = Cell(bytes=b.to_dict(), time_ms=t, max_rel_err=0.0 if ok else float("inf"),
                             ok=ok)
        res.rows.append({"m": m, "strategies": row})
    return res


def check_args(preset_name: str, k: int, reps: int, depth: int) -> ModelConfig:
    from model.workload import preset

    cfg = preset(preset_name)
    if not 1 <= k <= MAX_DRAFT:
        raise UserError(f"--k {k}: draft length must be in 1..{MAX_DRAFT} "
                        f"(ORT GatedDeltaNet's state_update_capacity is at most {MAX_DRAFT})")
    if reps < 1:
        raise UserError(f"--reps {reps}: must be at least 1")
    if depth < 1:
        raise UserError(f"--depth {depth}: must be at least 1")
    return cfg


def measure(preset_name: str, k: int = 4, reps: int = 5, depth: int = 256, seed: int = 0,
            clock: Callable[[], float] = time.perf_counter) -> dict:
    """The whole `statebench spec` measurement as plain data (schema statebench-spec/1)."""
    cfg = check_args(preset_name, k, reps, depth)
    gdn, attn = layer_shapes(cfg)
    layers = [measure_gdn(sh, ls, k, reps, seed, clock) for sh, ls in gdn.items()]
    layers += [measure_attention(sh, ls, k, depth, reps, seed, clock) for sh, ls in attn.items()]
    return {"schema": SCHEMA, "preset": cfg.name, "k": k, "reps": reps, "depth": depth,
            "seed": seed, "tolerance": TOLERANCE,
            "layers": [_jsonable_layer(lr) for lr in layers]}


def _jsonable_layer(lr: LayerResult) -> dict:
    d = asdict(lr)
    d["rows"] = [{"m": r["m"], "strategies": {n: asdict(c) for n, c in r["strategies"].items()}}
                 for r in lr.rows]
    for r in d["rows"]:
        for c in r["strategies"].values():
            if c["max_rel_err"] is not None and not np.isfinite(c["max_rel_err"]):
                c["max_rel_err"] = None
    return d


# -- rendering: renderables, never printed here ----------------------------------------------

SHORT = {"snapshot_recompute": "snapshot+recompute", "dense_checkpoints": "dense checkpoints",
         "compact_replay": "compact replay", "compact_replay_ort_cpu": "compact (ORT CPU verify)",
         "compact_replay_ort_webgpu": "compact (ORT WebGPU)"}


def fmt_bytes(n: float, short: bool = False) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}{unit[0] if short else ' ' + unit}"
    return f"{int(n)}" if short else f"{int(n)} B"


def tables(data: dict) -> list:
    """One rich Table per layer shape: rows m, per strategy bytes moved, time and ✓/✗."""
    from rich.table import Table

    out = []
    for layer in data["layers"]:
        sh = layer["shape"]
        if layer["kind"] == "gdn":
            title = (f"GDN layers {layer['layers']} (Hk={sh['hk']} Hv={sh['hv']} Dk={sh['dk']} "
                     f"Dv={sh['dv']}): state {fmt_bytes(layer['closed_form']['state_bytes'])}, "
                     f"capsule {fmt_bytes(layer['closed_form']['capsule_row_bytes'])}/token, "
                     f"K={layer['draft_len']}")
        else:
            title = (f"attention layers {layer['layers']} (kv_heads={sh['kv_heads']} "
                     f"head_dim={sh['head_dim']}, depth {sh['depth']}): "
                     f"{fmt_bytes(layer['closed_form']['row_bytes'])} K+V per token")
        t = Table(title=title, title_justify="left", show_lines=True)
        t.add_column("m", justify="right")
        names = list(layer["rows"][0]["strategies"])
        for n in names:
            t.add_column(SHORT.get(n, n) + "\nstate r/w/copy +capsule\nms", justify="right")
        for r in layer["rows"]:
            cells = [str(r["m"])]
            for n in names:
                c = r["strategies"][n]
                if c["status"] != "ok":
                    cells.append(f"[dim]{c['status']}[/]")
                    continue
                b = c["bytes"]
                mark = "[green]✓[/]" if c["ok"] else "[red]✗[/]"
                cap = b["capsule_written"] + b["capsule_read"]
                cells.append(f"{fmt_bytes(b['state_read'], True)}/"
                             f"{fmt_bytes(b['state_written'], True)}/"
                             f"{fmt_bytes(b['state_copied'], True)} +{fmt_bytes(cap, True)}\n"
                             f"{c['time_ms']:.3f} {mark}")
            t.add_row(*cells)
        out.append(t)
    return out


def notes(data: dict) -> list[str]:
    """Unavailable strategies with their reasons, and failures (one line each)."""
    seen, lines = set(), []
    for layer in data["layers"]:
        for r in layer["rows"]:
            for n, c in r["strategies"].items():
                if c["status"] != "ok" and (n, c["reason"]) not in seen:
                    seen.add((n, c["reason"]))
                    lines.append(f"{SHORT.get(n, n)}: {c['status']}: {c['reason']}")
                elif c["status"] == "ok" and not c["ok"]:
                    lines.append(f"✗ {SHORT.get(n, n)} at m={r['m']}: max rel err "
                                 f"{c['max_rel_err']} > {data['tolerance']}")
    return lines
